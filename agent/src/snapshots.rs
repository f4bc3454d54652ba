//! Snapshots and restores in flight. A snapshot or restore that copies a tree can take
//! far longer than any request may, so each runs as a job of its own, as a clone does
//! (see `clones`): the request that starts it, and every repeat of it, waits a bounded
//! time and answers `202 Accepted` when it is not done. Jobs share the clone jobs' slots,
//! since each holds as many descriptors as a clone's copy.
//!
//! A snapshot job holds the locks of its snapshot name and of its source volume; a
//! restore job those of its snapshot name and of its target path, the name's always
//! first, or, from an archive, those of the path the archive was made of (which archive
//! deletion takes) and of its target path, in path order. So a snapshot or an archive is
//! never deleted while a restore reads it, and a source never changes hands while it is
//! snapshotted. A repeat that finds no job (it ended, or the
//! agent restarted) runs it again, which finds the finished snapshot or volume, or starts
//! over from nothing: an unfinished one is never visible.
//!
//! Deleting a snapshot still being made stops its job from keeping it: the job ends
//! its copy (which cannot be interrupted part way without leaving it to the next start),
//! then removes what it made instead of recording it. Such a delete is answered at once
//! only while the job makes a snapshot it found unrecorded, so that nothing of it is on
//! disk to outlive a power cut; before (it may find the snapshot recorded) or after (it
//! records it), the delete waits for the job and removes what it left, durably.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfsprov_api_types::{
    ApiError, CloneMethod, CreateSnapshotRequest, ErrorCode, RestoreProgress, RestoreSource,
    RestoreVolumeRequest, Snapshot, SnapshotName, Volume, VolumePath,
};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::{Semaphore, watch};

use crate::jobs::{JobQueue, Ticket};
use crate::metrics::{RestoreLabels, SnapshotLabels, SnapshotMetrics};
use crate::store::snapshot::{Stage, deleted_while_taken};
use crate::store::{Created, Deleted, PathGuard, StoreError, VolumeStore};

/// How a snapshot job ended: the snapshot and whether this job took it, or why not.
pub type SnapshotOutcome = Result<(Snapshot, Created), ApiError>;
/// How a restore job ended: the volume and whether this job made it, or why not.
pub type RestoreOutcome = Result<(Volume, Created), ApiError>;

/// What a snapshot request comes to.
#[derive(Debug)]
pub enum SnapshotAnswer {
    Done(SnapshotOutcome),
    /// Still being made: the snapshot as it will be, `ready` false.
    Running(Snapshot),
}

/// What a restore request comes to.
// One per request, never held in bulk, so the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum RestoreAnswer {
    Done(RestoreOutcome),
    Running(RestoreProgress),
}

/// How many snapshot jobs, and restore jobs, may wait for a slot.
#[derive(Debug)]
pub struct Queues {
    pub snapshots: JobQueue,
    pub restores: JobQueue,
}

/// The snapshot and restore jobs of one agent.
#[derive(Debug)]
pub struct Snapshots {
    store: Arc<VolumeStore>,
    metrics: SnapshotMetrics,
    slots: Arc<Semaphore>,
    making: JobMap<SnapshotName, CreateSnapshotRequest, SnapshotOutcome, Snapshot>,
    restoring: JobMap<VolumePath, RestoreVolumeRequest, RestoreOutcome, ()>,
}

impl Snapshots {
    /// Jobs on `store`, running in `slots` (the clone jobs'), waiting in `queues`.
    pub fn new(
        store: Arc<VolumeStore>,
        metrics: SnapshotMetrics,
        slots: Arc<Semaphore>,
        queues: Queues,
    ) -> Self {
        Self {
            store,
            metrics,
            slots,
            making: JobMap::new(queues.snapshots),
            restoring: JobMap::new(queues.restores),
        }
    }

    /// Starts the snapshot `name` of `request.source`, or joins the job already taking
    /// it, and waits at most `wait` for it to end. A job taking `name` of another source
    /// is a conflict; a new job when the snapshot queue is full is refused.
    pub async fn create(
        &self,
        name: &SnapshotName,
        request: CreateSnapshotRequest,
        wait: Duration,
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
            .making
            .join_or_start(name, &request, pending, |end, fate, ticket| {
                self.start_snapshot(name.clone(), request.clone(), end, fate, ticket);
            });
        let (done, _, running) = match joined {
            Ok(joined) => joined,
            Err(Refused::Full(full)) => return SnapshotAnswer::Done(Err(full)),
            Err(Refused::Other(other)) => {
                return SnapshotAnswer::Done(Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!("snapshot {name} of {} is being taken", other.source),
                )));
            }
        };
        match wait_for(done, wait).await {
            Some(outcome) => SnapshotAnswer::Done(outcome),
            None => SnapshotAnswer::Running(running),
        }
    }

    /// The snapshot `name` while a job is still taking it.
    pub fn pending(&self, name: &SnapshotName) -> Option<Snapshot> {
        self.making.info(name)
    }

    /// Stops the job taking snapshot `name`, if any, from keeping it. Whether that
    /// settles a delete of `name`: the job makes a snapshot it found unrecorded, and now
    /// records nothing. Otherwise the delete is to wait for the job (its lock) and remove
    /// whatever it left.
    pub fn cancel(&self, name: &SnapshotName) -> bool {
        self.making.cancel(name)
    }

    fn start_snapshot(
        &self,
        name: SnapshotName,
        request: CreateSnapshotRequest,
        end: JobEnd<SnapshotName, CreateSnapshotRequest, SnapshotOutcome, Snapshot>,
        fate: Arc<Fate>,
        mut ticket: Ticket,
    ) {
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let slots = self.slots.clone();
        tokio::spawn(async move {
            // The slot first and the locks after, as clone jobs do.
            let slot = slots
                .acquire_owned()
                .await
                .expect("the job slots are never closed");
            ticket.run();
            let name_guard = store.lock_snapshot(&name).await;
            let source_guard = store.lock(&request.source).await;
            metrics.in_progress.inc();
            let work = {
                let store = store.clone();
                let name = name.clone();
                let source = request.source.clone();
                let progress = metrics.copy.clone();
                let fate = fate.clone();
                tokio::task::spawn_blocking(move || {
                    let taken =
                        store.take_snapshot(&name, &source, &progress, &|stage| fate.reach(stage));
                    if fate.cancelled() && taken.is_ok() {
                        // Deleted before it found the snapshot recorded already: it goes
                        // now, for whoever waits on this job; the delete, which waits for
                        // this job, makes sure of it.
                        return match store.delete_snapshot(&name) {
                            Ok(Deleted::Removed | Deleted::WasAbsent) => {
                                Err(deleted_while_taken(&name))
                            }
                            Err(e) => Err(e),
                        };
                    }
                    taken
                })
            };
            let outcome = job_outcome(
                work.await,
                fate.cancelled(),
                &metrics.failed,
                format_args!("snapshot {name}: the snapshot task"),
                |e| tracing::warn!(snapshot = %name, source = %request.source, error = %e, "snapshot failed"),
            );
            if let Ok((snapshot, Created::New)) = &outcome {
                metrics
                    .made
                    .get_or_create(&SnapshotLabels {
                        method: snapshot.method.as_str(),
                    })
                    .inc();
                metrics.bytes.inc_by(snapshot.size_bytes.unwrap_or(0));
                tracing::info!(snapshot = %name, source = %snapshot.source, method = %snapshot.method, "took a snapshot");
            }
            metrics.in_progress.dec();
            drop(source_guard);
            drop(name_guard);
            drop(slot);
            drop(ticket);
            end.finish(outcome);
        });
    }

    /// Starts the restore of `request` (from `source`, its source) at `path`, or joins
    /// the job already making it, and waits at most `wait` for it to end. A job making
    /// something else at `path` is a conflict; a new job when the restore queue is full is
    /// refused.
    pub async fn restore(
        &self,
        path: &VolumePath,
        source: &RestoreSource,
        request: RestoreVolumeRequest,
        wait: Duration,
    ) -> RestoreAnswer {
        if let RestoreSource::Snapshot(name) = source
            && self.making.info(name).is_some()
        {
            return RestoreAnswer::Done(Err(ApiError::new(
                ErrorCode::NotReady,
                format!(
                    "{path}: snapshot {name} is still being taken; restore from it once it is ready"
                ),
            )));
        }
        let joined = self
            .restoring
            .join_or_start(path, &request, (), |end, _, ticket| {
                self.start_restore(path.clone(), source.clone(), request.clone(), end, ticket);
            });
        let (done, started, ()) = match joined {
            Ok(joined) => joined,
            Err(Refused::Full(full)) => return RestoreAnswer::Done(Err(full)),
            Err(Refused::Other(other)) => {
                return RestoreAnswer::Done(Err(ApiError::new(
                    ErrorCode::Conflict,
                    format!(
                        "{path}: a restore from {} with other settings is being made there",
                        other
                            .source()
                            .map_or_else(|e| e.to_owned(), |source| source.to_string())
                    ),
                )));
            }
        };
        match wait_for(done, wait).await {
            Some(outcome) => RestoreAnswer::Done(outcome),
            None => RestoreAnswer::Running(RestoreProgress {
                source: source.clone(),
                running_seconds: started.elapsed().as_secs(),
            }),
        }
    }

    fn start_restore(
        &self,
        path: VolumePath,
        source: RestoreSource,
        request: RestoreVolumeRequest,
        end: JobEnd<VolumePath, RestoreVolumeRequest, RestoreOutcome, ()>,
        mut ticket: Ticket,
    ) {
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let slots = self.slots.clone();
        tokio::spawn(async move {
            let slot = slots
                .acquire_owned()
                .await
                .expect("the job slots are never closed");
            ticket.run();
            let guards = lock_restore(&store, &path, &source).await;
            metrics.in_progress.inc();
            let work = {
                let store = store.clone();
                let path = path.clone();
                let source = source.clone();
                let request = request.clone();
                let progress = metrics.copy.clone();
                tokio::task::spawn_blocking(move || {
                    store.restore_volume(&path, &source, &request, &progress)
                })
            };
            let outcome = job_outcome(
                work.await,
                // Restores are never cancelled: nothing deletes a volume being made.
                false,
                &metrics.restores_failed,
                format_args!("{path}: the restore task"),
                |e| tracing::warn!(%path, %source, error = %e, "restore failed"),
            );
            if let Ok((volume, Created::New)) = &outcome
                && let Some(origin) = &volume.restore
            {
                metrics
                    .restored
                    .get_or_create(&RestoreLabels {
                        source: source_label(&origin.source),
                        method: method_label(origin.method),
                    })
                    .inc();
                tracing::info!(%path, source = %origin.source, method = %origin.method, "restored a volume");
            }
            metrics.in_progress.dec();
            drop(guards);
            drop(slot);
            drop(ticket);
            end.finish(outcome);
        });
    }
}

/// What a job's waiters are told of its blocking task. A failure is counted in `failed`
/// and logged by `warn`, with the job's own fields, unless the job was `cancelled`: then
/// what it made was deleted, which is no failure. A task that died (it panicked) is
/// counted too, and named by `task` in the answer.
fn job_outcome<T>(
    joined: Result<Result<T, StoreError>, tokio::task::JoinError>,
    cancelled: bool,
    failed: &Counter,
    task: std::fmt::Arguments<'_>,
    warn: impl FnOnce(&StoreError),
) -> Result<T, ApiError> {
    match joined {
        Ok(Ok(made)) => Ok(made),
        Ok(Err(e)) if cancelled => Err(e.to_api_error()),
        Ok(Err(e)) => {
            failed.inc();
            warn(&e);
            Err(e.to_api_error())
        }
        Err(e) => {
            failed.inc();
            Err(ApiError::new(
                ErrorCode::Internal,
                format!("{task} failed: {e}"),
            ))
        }
    }
}

/// The locks a restore from `source` to `path` holds: a snapshot's name first, then
/// the path; for an archive, the path it was made of (which its deletion takes) and
/// `path`, in one order for every job, as clone jobs take theirs.
async fn lock_restore(
    store: &VolumeStore,
    path: &VolumePath,
    source: &RestoreSource,
) -> Vec<PathGuard> {
    match source {
        RestoreSource::Snapshot(name) => {
            vec![store.lock_snapshot(name).await, store.lock(path).await]
        }
        RestoreSource::Archive(id) => {
            let archived = id.volume();
            if archived == path {
                return vec![store.lock(path).await];
            }
            let (first, second) = if path < archived {
                (path, archived)
            } else {
                (archived, path)
            };
            vec![store.lock(first).await, store.lock(second).await]
        }
    }
}

/// The kind of source a restore was made from, as the restore metrics label it.
fn source_label(source: &RestoreSource) -> &'static str {
    match source {
        RestoreSource::Snapshot(_) => "snapshot",
        RestoreSource::Archive(_) => "archive",
    }
}

fn method_label(method: CloneMethod) -> &'static str {
    method.as_str()
}

/// The outcome of the job behind `done`, when it ends within `wait`.
async fn wait_for<O: Clone>(
    mut done: watch::Receiver<Option<Result<O, ApiError>>>,
    wait: Duration,
) -> Option<Result<O, ApiError>> {
    match tokio::time::timeout(wait, done.wait_for(Option::is_some)).await {
        Ok(Ok(outcome)) => Some(outcome.clone().unwrap_or_else(|| {
            Err(ApiError::new(
                ErrorCode::Internal,
                "the job ended without an outcome",
            ))
        })),
        // The job died without an outcome (it panicked); it is already forgotten, so
        // the next request starts over.
        Ok(Err(_)) => Some(Err(ApiError::new(
            ErrorCode::Internal,
            "the job ended without an outcome; retry",
        ))),
        Err(_) => None,
    }
}

#[derive(Debug)]
struct Job<R, O, I> {
    id: u64,
    request: R,
    started: Instant,
    /// What is said of the job while it runs.
    info: I,
    done: watch::Receiver<Option<O>>,
    fate: Arc<Fate>,
}

type Running<K, R, O, I> = Arc<Mutex<HashMap<K, Job<R, O, I>>>>;

/// Jobs by what they make, at most one per key; new ones admitted by their queue.
#[derive(Debug)]
struct JobMap<K, R, O, I> {
    running: Running<K, R, O, I>,
    ids: AtomicU64,
    queue: JobQueue,
}

/// Why a request started no job and joined none.
#[derive(Debug)]
enum Refused<R> {
    /// A job runs another request at the key: this one.
    Other(R),
    /// The queue is full: why, for the answer.
    Full(ApiError),
}

impl<K, R, O, I> JobMap<K, R, O, I> {
    fn new(queue: JobQueue) -> Self {
        Self {
            running: Arc::default(),
            ids: AtomicU64::new(0),
            queue,
        }
    }
}

impl<K, R, O, I> JobMap<K, R, O, I>
where
    K: Hash + Eq + Clone,
    R: PartialEq + Clone,
    I: Clone,
{
    /// Joins the job making `key` when it runs `request`, or starts one with `start`
    /// (given the job's end, its fate and its place in the queue) when the queue admits
    /// it. The job's receiver, start time and info; refused with the other request when a
    /// job runs another one at `key`, or when the queue is full.
    #[allow(clippy::type_complexity)]
    fn join_or_start(
        &self,
        key: &K,
        request: &R,
        info: I,
        start: impl FnOnce(JobEnd<K, R, O, I>, Arc<Fate>, Ticket),
    ) -> Result<(watch::Receiver<Option<O>>, Instant, I), Refused<R>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(key) {
            Some(job) if job.request == *request => {
                Ok((job.done.clone(), job.started, job.info.clone()))
            }
            Some(job) => Err(Refused::Other(job.request.clone())),
            None => {
                let ticket = self.queue.admit().map_err(Refused::Full)?;
                let (tell, done) = watch::channel(None);
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                let fate = Arc::new(Fate::default());
                let started = Instant::now();
                running.insert(
                    key.clone(),
                    Job {
                        id,
                        request: request.clone(),
                        started,
                        info: info.clone(),
                        done: done.clone(),
                        fate: fate.clone(),
                    },
                );
                start(
                    JobEnd {
                        running: self.running.clone(),
                        key: key.clone(),
                        id,
                        tell,
                    },
                    fate,
                    ticket,
                );
                Ok((done, started, info))
            }
        }
    }

    fn info(&self, key: &K) -> Option<I> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|job| job.info.clone())
    }

    /// Cancels the job making `key` (see [`Fate::cancel`]) and forgets it, so a new
    /// request for `key` starts afresh (and waits for the old job's locks). Whether the
    /// cancel settled what the job makes; false without a job.
    fn cancel(&self, key: &K) -> bool {
        let job = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        job.is_some_and(|job| job.fate.cancel())
    }
}

/// How far a job has come, as a delete of what it makes sees it.
#[derive(Debug, Default)]
struct Fate(AtomicU8);

impl Fate {
    /// It has not yet looked whether what it makes is there already.
    const LOOKING: u8 = 0;
    /// It found nothing and makes it: nothing of it is recorded, or ever will be once
    /// it is cancelled.
    const MAKING: u8 = 1;
    /// It records what it made; a cancel no longer stops it.
    const RECORDING: u8 = 2;
    const CANCELLED: u8 = 3;

    /// Moves the job on to `stage`; false once it is cancelled.
    fn reach(&self, stage: Stage) -> bool {
        let (from, to) = match stage {
            Stage::Making => (Self::LOOKING, Self::MAKING),
            Stage::Recording => (Self::MAKING, Self::RECORDING),
        };
        self.0
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Cancels the job unless it records already. Whether that settles it: it was
    /// making something it will now never record.
    fn cancel(&self) -> bool {
        let before = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now != Self::RECORDING).then_some(Self::CANCELLED)
            });
        before == Ok(Self::MAKING)
    }

    fn cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::CANCELLED
    }
}

/// The end of a job: dropped, also when the job panics, it takes the job out of the
/// running ones, unless a newer job runs at its key already (it was cancelled).
struct JobEnd<K: Hash + Eq, R, O, I> {
    running: Running<K, R, O, I>,
    key: K,
    id: u64,
    tell: watch::Sender<Option<O>>,
}

impl<K: Hash + Eq, R, O, I> JobEnd<K, R, O, I> {
    /// Leaves the running jobs, then tells `outcome` to whoever waits, so a request after
    /// the outcome never joins the finished job.
    fn finish(self, outcome: O) {
        let tell = self.tell.clone();
        drop(self);
        let _ = tell.send(Some(outcome));
    }
}

impl<K: Hash + Eq, R, O, I> Drop for JobEnd<K, R, O, I> {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(&self.key).is_some_and(|job| job.id == self.id) {
            running.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::JobKind;
    use crate::metrics::JobMetrics;

    fn queue(limit: usize) -> JobQueue {
        JobQueue::new(JobKind::Snapshot, limit, &JobMetrics::default())
    }

    #[test]
    fn a_full_queue_refuses_new_jobs_but_not_repeats_of_admitted_ones() {
        let jobs: JobMap<&str, u32, u32, ()> = JobMap::new(queue(1));
        let mut tickets = Vec::new();
        let mut ends = Vec::new();
        let first = jobs.join_or_start(&"a", &1, (), |end, _, ticket| {
            ends.push(end);
            tickets.push(ticket);
        });
        assert!(first.is_ok());
        // Another key is a new job: refused, and nothing of it is kept.
        match jobs.join_or_start(&"b", &1, (), |_, _, _| panic!("started past the limit")) {
            Err(Refused::Full(full)) => assert_eq!(full.code, ErrorCode::JobQueueFull),
            other => panic!("not refused as full: {other:?}"),
        }
        assert!(jobs.info(&"b").is_none());
        // A repeat of the admitted job joins it.
        assert!(
            jobs.join_or_start(&"a", &1, (), |_, _, _| panic!("a second job at a"))
                .is_ok()
        );
        // Once the first holds its slot, another may wait.
        tickets[0].run();
        let second = jobs.join_or_start(&"b", &1, (), |end, _, ticket| {
            ends.push(end);
            tickets.push(ticket);
        });
        assert!(second.is_ok());
    }

    #[test]
    fn a_cancelled_job_leaves_a_newer_one_at_its_key() {
        let jobs: JobMap<&str, u32, u32, ()> = JobMap::new(queue(8));
        let mut ends = Vec::new();
        let mut fates = Vec::new();
        let first = jobs.join_or_start(&"a", &1, (), |end, fate, _| {
            fates.push(fate);
            ends.push(end);
        });
        assert!(first.is_ok());
        assert!(matches!(
            jobs.join_or_start(&"a", &2, (), |_, _, _| {}),
            Err(Refused::Other(1))
        ));
        // Still looking, so not settled by the cancel; forgotten all the same.
        assert!(!jobs.cancel(&"a"));
        assert!(jobs.info(&"a").is_none());
        assert!(!jobs.cancel(&"a"));
        jobs.join_or_start(&"a", &2, (), |end, fate, _| {
            fates.push(fate);
            ends.push(end);
        })
        .unwrap();
        assert!(fates[0].cancelled());
        assert!(!fates[1].cancelled());
        // The cancelled job ends: the newer one stays.
        ends.remove(0).finish(7);
        assert!(jobs.info(&"a").is_some());
        // Making what it found unrecorded, the newer one is settled by a cancel.
        assert!(fates[1].reach(Stage::Making));
        assert!(jobs.cancel(&"a"));
        ends.remove(0).finish(8);
        assert!(jobs.info(&"a").is_none());
    }

    #[test]
    fn a_cancel_settles_a_job_only_while_it_makes_what_it_found_unrecorded() {
        // Before it looks, the snapshot may be recorded: the delete must wait for the
        // job, which makes nothing more.
        let looking = Fate::default();
        assert!(!looking.cancel());
        assert!(looking.cancelled());
        assert!(!looking.reach(Stage::Making));

        let making = Fate::default();
        assert!(making.reach(Stage::Making));
        assert!(making.cancel());
        assert!(making.cancelled());
        assert!(!making.reach(Stage::Recording));

        // Recording, it cannot be stopped: the delete waits and removes the snapshot.
        let recording = Fate::default();
        assert!(recording.reach(Stage::Making));
        assert!(recording.reach(Stage::Recording));
        assert!(!recording.cancel());
        assert!(!recording.cancelled());
    }

    #[tokio::test]
    async fn a_job_counts_and_logs_its_failures_but_not_its_cancellation() {
        let failed = Counter::default();
        let mut warned = Vec::new();
        let failure = || Ok(Err::<(), _>(StoreError::NotFound("gone".into())));

        let made = job_outcome(Ok(Ok(7)), false, &failed, format_args!("t"), |_| {
            panic!("nothing failed")
        });
        assert_eq!(made.unwrap(), 7);

        let cancelled = job_outcome(failure(), true, &failed, format_args!("t"), |e| {
            warned.push(e.to_string())
        });
        assert_eq!(cancelled.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(failed.get(), 0);
        assert!(warned.is_empty());

        let refused = job_outcome(failure(), false, &failed, format_args!("t"), |e| {
            warned.push(e.to_string())
        });
        assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(failed.get(), 1);
        assert_eq!(warned.len(), 1);

        let died: Result<(), _> = tokio::spawn(async { panic!("the task dies") }).await;
        let died = job_outcome::<()>(
            died.map(Ok),
            false,
            &failed,
            format_args!("snapshot s: the snapshot task"),
            |_| panic!("a dead task is no refusal"),
        );
        let died = died.unwrap_err();
        assert_eq!(died.code, ErrorCode::Internal);
        assert!(
            died.message
                .starts_with("snapshot s: the snapshot task failed: "),
            "{}",
            died.message
        );
        assert_eq!(failed.get(), 2);
    }
}
