//! The jobs that outlive their requests: clones, snapshots and restores. Each copies a
//! tree, which can take far longer than any request may, so each runs as a job of its
//! own: the request that starts it, and every repeat of it, waits a bounded time for the
//! job and answers `202 Accepted` when it is not done. A job holds its locks until it
//! ends, whether or not anyone still waits.
//!
//! One runner (`runner`) serves every kind alike: a new job is admitted by its kind's
//! queue (`queue`, which refuses past `limits.max_queued_jobs`), kept by what it makes in
//! its kind's map (`map`, which a repeat joins and a delete cancels through), waits for
//! one of the slots all kinds share (`slots`), then takes its locks, works on the
//! blocking pool and tells its outcome to whoever waits, its failures counted in its
//! kind's metrics. What each kind locks, does and reports is its own: `clone_jobs`,
//! `snapshot_jobs` and `restore_jobs`.

mod clone_jobs;
mod map;
mod queue;
mod restore_jobs;
mod runner;
mod shares;
mod slots;
mod snapshot_jobs;

pub(crate) use clone_jobs::{CloneAnswer, Clones};
pub(crate) use queue::RETRY_AFTER;
pub(crate) use restore_jobs::RestoreAnswer;
pub(crate) use runner::JobRunner;
pub(crate) use shares::JobShares;
pub(crate) use snapshot_jobs::{SnapshotAnswer, Snapshots};
