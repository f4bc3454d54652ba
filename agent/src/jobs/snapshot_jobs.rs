//! Snapshot jobs. A snapshot job holds the locks of its snapshot name and of its source
//! volume, so a source never changes hands while it is snapshotted; a restore from the
//! snapshot (see `restore_jobs`) takes the name's lock too, so a snapshot is never deleted
//! while a restore reads it. A repeat that finds no job (it ended, or the agent
//! restarted) runs it again, which finds the finished snapshot, or starts over from
//! nothing: an unfinished one is never visible.
//!
//! Deleting a snapshot still being made stops its job from keeping it: the job ends
//! its copy (which cannot be interrupted part way without leaving it to the next start),
//! then removes what it made instead of recording it. Such a delete is answered at once
//! only while the job makes a snapshot it found unrecorded, so that nothing of it is on
//! disk to outlive a power cut; before (it may find the snapshot recorded) or after (it
//! records it), the delete waits for the job and removes what it left, durably.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::{
    ApiError, CreateSnapshotRequest, RestoreSource, RestoreVolumeRequest, Snapshot, SnapshotName,
    VolumePath,
};

use super::map::Fate;
use super::queue::JobKind;
use super::restore_jobs::{RestoreAnswer, Restores};
use super::runner::{Counters, JobRunner, JobTask, Jobs};
use super::shares::JobShare;
use crate::metrics::{SnapshotLabels, SnapshotMetrics};
use crate::store::snapshot::deleted_while_taken;
use crate::store::{Created, Deleted, PathGuard, StoreError, VolumeStore};

/// How a snapshot job ended: the snapshot and whether this job took it, or why not.
pub(super) type SnapshotOutcome = Result<(Snapshot, Created), ApiError>;

/// What a snapshot request comes to.
#[derive(Debug)]
pub(crate) enum SnapshotAnswer {
    Done(SnapshotOutcome),
    /// Still being made: the snapshot as it will be, `ready` false.
    Running(Snapshot),
}

/// The snapshot jobs of one agent, by name, and the restores, which must not read a
/// snapshot still being taken.
#[derive(Debug)]
pub(crate) struct Snapshots {
    store: Arc<VolumeStore>,
    metrics: SnapshotMetrics,
    jobs: Jobs<SnapshotName, CreateSnapshotRequest, (Snapshot, Created), Snapshot>,
    restores: Restores,
}

impl Snapshots {
    /// Snapshot and restore jobs on `store`, run by `runner`, counted in `metrics`.
    pub(crate) fn new(
        store: Arc<VolumeStore>,
        metrics: SnapshotMetrics,
        runner: &JobRunner,
    ) -> Self {
        let counters = Counters {
            in_progress: metrics.in_progress.clone(),
            failed: metrics.failed.clone(),
            slot_waits: None,
        };
        Self {
            jobs: runner.jobs(JobKind::Snapshot, counters),
            restores: Restores::new(store.clone(), metrics.clone(), runner),
            store,
            metrics,
        }
    }

    /// Starts the snapshot `name` of `request.source`, or joins the job already taking
    /// it, and waits at most `wait` for it to end. A job taking `name` of another source
    /// is a conflict; a new job when the snapshot queue is full is refused.
    pub(crate) async fn create(
        &self,
        name: &SnapshotName,
        request: CreateSnapshotRequest,
        wait: Duration,
        share: Option<&JobShare>,
    ) -> SnapshotAnswer {
        // Only for the answer while it runs: the job itself reads the source under its
        // lock.
        let restore_size = {
            let store = self.store.clone();
            let source = request.source.clone();
            tokio::task::spawn_blocking(move || store.get(&source).map(|v| v.capacity_bytes))
                .await
                .ok()
                .and_then(Result::ok)
                .unwrap_or(0)
        };
        let pending = Snapshot {
            name: name.clone(),
            source: request.source.clone(),
            method: self.store.copy_snapshot_method(),
            ready: false,
            created_at: time::OffsetDateTime::now_utc()
                .format(&time::format_description::well_known::Rfc3339)
                .unwrap_or_default(),
            restore_size_bytes: restore_size,
            size_bytes: None,
            exclusive_bytes: None,
        };
        let joined = self
            .jobs
            .join_or_start(name, &request, pending, share, || SnapshotJob {
                store: self.store.clone(),
                metrics: self.metrics.clone(),
                name: name.clone(),
                source: request.source.clone(),
            });
        let mut joined = match joined {
            Ok(joined) => joined,
            Err(refused) => {
                return SnapshotAnswer::Done(Err(refused.into_error(|other| {
                    format!("snapshot {name} of {} is being taken", other.source)
                })));
            }
        };
        match joined.outcome(wait, "the job").await {
            Some(outcome) => SnapshotAnswer::Done(outcome),
            None => SnapshotAnswer::Running(joined.info),
        }
    }

    /// The snapshot `name` while a job is still taking it.
    pub(crate) fn pending(&self, name: &SnapshotName) -> Option<Snapshot> {
        self.jobs.info(name)
    }

    /// Stops the job taking snapshot `name`, if any, from keeping it. Whether that
    /// settles a delete of `name`: the job makes a snapshot it found unrecorded, and now
    /// records nothing. Otherwise the delete is to wait for the job (its lock) and remove
    /// whatever it left.
    pub(crate) fn cancel(&self, name: &SnapshotName) -> bool {
        self.jobs.cancel(name)
    }

    /// Starts the restore of `request` (from `source`, its source) at `path`, or joins
    /// the job already making it: see [`Restores::restore`]. A snapshot still being
    /// taken is not ready to restore from.
    pub(crate) async fn restore(
        &self,
        path: &VolumePath,
        source: &RestoreSource,
        request: RestoreVolumeRequest,
        wait: Duration,
        share: Option<&JobShare>,
    ) -> RestoreAnswer {
        self.restores
            .restore(path, source, request, wait, share, |name| {
                self.pending(name).is_some()
            })
            .await
    }
}

/// One snapshot: `name`, taken of `source`.
struct SnapshotJob {
    store: Arc<VolumeStore>,
    metrics: SnapshotMetrics,
    name: SnapshotName,
    source: VolumePath,
}

impl fmt::Display for SnapshotJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "snapshot {}: the snapshot task", self.name)
    }
}

impl JobTask for SnapshotJob {
    type Made = (Snapshot, Created);

    /// The name first, then the source.
    async fn lock(&self) -> Vec<PathGuard> {
        vec![
            self.store.lock_snapshot(&self.name).await,
            self.store.lock(&self.source).await,
        ]
    }

    fn run(&self, fate: &Fate) -> Result<Self::Made, StoreError> {
        let taken =
            self.store
                .take_snapshot(&self.name, &self.source, &self.metrics.copy, &|stage| {
                    fate.reach(stage)
                });
        if fate.cancelled() && taken.is_ok() {
            // Deleted before it found the snapshot recorded already: it goes now, for
            // whoever waits on this job; the delete, which waits for this job, makes
            // sure of it.
            return match self.store.delete_snapshot(&self.name) {
                Ok(Deleted::Removed | Deleted::WasAbsent) => Err(deleted_while_taken(&self.name)),
                Err(e) => Err(e),
            };
        }
        taken
    }

    fn warn(&self, error: &StoreError) {
        tracing::warn!(snapshot = %self.name, source = %self.source, %error, "snapshot failed");
    }

    fn made(&self, (snapshot, created): &Self::Made) {
        if *created == Created::New {
            self.metrics
                .made
                .get_or_create(&SnapshotLabels {
                    method: snapshot.method.as_str(),
                })
                .inc();
            self.metrics.bytes.inc_by(snapshot.size_bytes.unwrap_or(0));
            tracing::info!(snapshot = %self.name, source = %snapshot.source, method = %snapshot.method, "took a snapshot");
        }
    }
}
