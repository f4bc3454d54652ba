//! Clones in flight. A clone that copies a large tree can take far longer than any
//! request may, so each runs as a job of its own: the request that starts it, and every
//! repeat of it, waits a bounded time for the job and answers `202 Accepted` when it is
//! not done. A job holds the locks of its target and source paths until it ends, whether
//! or not anyone still waits; a repeat that finds no job (it ended, or the agent
//! restarted) runs the clone again, which confirms a finished clone or starts over from
//! nothing, since an unfinished one never reaches its path.
//!
//! Jobs outlive their requests, so the request limits do not bound them: a number of
//! slots does. A job waits for a slot before it takes any lock or descriptor, and the
//! request that started it still gets its `202 Accepted` meanwhile. There are
//! `limits.max_clone_jobs` slots, or fewer when the process's descriptor limit cannot
//! hold that many copies at their deepest (each takes at most
//! [`COPY_DESCRIPTORS`]) beside what connections, requests
//! and usage walks may hold; never fewer than one.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfsprov_api_types::{
    ApiError, CloneProgress, CloneVolumeRequest, ErrorCode, Volume, VolumePath,
};
use tokio::sync::{Semaphore, watch};

use crate::config::AgentConfig;
use crate::holds;
use crate::jobs::{JobKind, JobQueue, Ticket};
use crate::metrics::{CloneLabels, CloneMetrics, JobMetrics};
use crate::store::{COPY_DESCRIPTORS, Created, MAX_USAGE_DEPTH, VolumeStore};

/// How a clone ended: the volume and whether this job made it, or why it failed.
pub type CloneOutcome = Result<(Volume, Created), ApiError>;

/// What a clone request comes to.
// One per request, never held in bulk, so the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum CloneAnswer {
    Done(CloneOutcome),
    Running(CloneProgress),
}

#[derive(Debug)]
struct Job {
    request: CloneVolumeRequest,
    started: Instant,
    done: watch::Receiver<Option<CloneOutcome>>,
}

/// The clone jobs of one agent, by target path.
#[derive(Debug)]
pub struct Clones {
    store: Arc<VolumeStore>,
    metrics: CloneMetrics,
    running: Arc<Mutex<HashMap<VolumePath, Job>>>,
    slots: Arc<Semaphore>,
    queue: JobQueue,
}

/// Usage walks at once: two for volumes and one for archives.
const USAGE_WALKS: usize = 3;
/// Most descriptors one request holds: a deletion's threads emptying directories, with
/// the parents walked to reach the volume.
const REQUEST_DESCRIPTORS: usize = 24;
/// The agent's own: listener, logs, records, certificates, the export root and its areas.
const BASE_DESCRIPTORS: u64 = 64;
/// What a clone job opens besides its copy: the source, staging and parent directories.
const JOB_DESCRIPTORS: usize = 32;

impl Clones {
    pub fn new(
        store: Arc<VolumeStore>,
        metrics: CloneMetrics,
        jobs: &JobMetrics,
        config: &AgentConfig,
    ) -> Self {
        let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let slots = slots(
            config.max_clone_jobs,
            // Every connection the admission budgets allow at once holds a descriptor.
            config.max_connections
                + config.max_tls_handshakes
                + config.max_unauthenticated_connections
                + config.max_concurrent_requests * REQUEST_DESCRIPTORS,
            descriptors,
        );
        metrics.slots.set(i64::try_from(slots).unwrap_or(i64::MAX));
        Self {
            store,
            metrics,
            running: Arc::default(),
            slots: Arc::new(Semaphore::new(slots)),
            queue: JobQueue::new(JobKind::Clone, config.max_queued_jobs, jobs),
        }
    }

    /// The slots jobs that copy trees run in: clones', snapshots' and restores'.
    pub fn slots(&self) -> Arc<Semaphore> {
        self.slots.clone()
    }

    /// Starts the clone of `request` at `path`, or joins the job already making it, and
    /// waits at most `wait` for it to end. A job making something else at `path` is a
    /// conflict; a new job when the clone queue is full is refused.
    pub async fn clone_volume(
        &self,
        path: &VolumePath,
        request: CloneVolumeRequest,
        wait: Duration,
    ) -> CloneAnswer {
        let (mut done, started) = {
            let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
            match running.get(path) {
                Some(job) if job.request == request => (job.done.clone(), job.started),
                Some(job) => {
                    return CloneAnswer::Done(Err(ApiError::new(
                        ErrorCode::Conflict,
                        format!(
                            "{path}: a clone of {} with other settings is being made there",
                            job.request.source
                        ),
                    )));
                }
                None => {
                    let ticket = match self.queue.admit() {
                        Ok(ticket) => ticket,
                        Err(full) => return CloneAnswer::Done(Err(full)),
                    };
                    let done = self.start(path.clone(), request.clone(), ticket);
                    let started = Instant::now();
                    running.insert(
                        path.clone(),
                        Job {
                            request: request.clone(),
                            started,
                            done: done.clone(),
                        },
                    );
                    (done, started)
                }
            }
        };
        match tokio::time::timeout(wait, done.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => CloneAnswer::Done(outcome.clone().unwrap_or_else(|| {
                Err(ApiError::new(
                    ErrorCode::Internal,
                    "clone job ended without an outcome",
                ))
            })),
            // The job died without an outcome (it panicked); it is already forgotten, so
            // the next request starts over.
            Ok(Err(_)) => CloneAnswer::Done(Err(ApiError::new(
                ErrorCode::Internal,
                format!("{path}: the clone job ended without an outcome; retry"),
            ))),
            Err(_) => CloneAnswer::Running(CloneProgress {
                source: request.source,
                running_seconds: started.elapsed().as_secs(),
            }),
        }
    }

    /// Spawns the job; it removes itself from the running jobs when it ends, however it
    /// ends.
    fn start(
        &self,
        path: VolumePath,
        request: CloneVolumeRequest,
        mut ticket: Ticket,
    ) -> watch::Receiver<Option<CloneOutcome>> {
        let (tell, done) = watch::channel(None);
        let store = self.store.clone();
        let metrics = self.metrics.clone();
        let slots = self.slots.clone();
        let end = JobEnd {
            running: self.running.clone(),
            path: path.clone(),
            tell,
        };
        tokio::spawn(async move {
            // The slot first and the locks after: a job holding a lock never waits for a
            // slot held by one that waits for that lock.
            let slot = match slots.clone().try_acquire_owned() {
                Ok(slot) => slot,
                Err(_) => {
                    metrics.waited.inc();
                    let _queued = Queued::new(&metrics);
                    tracing::debug!(%path, "clone job waits for a slot");
                    slots
                        .acquire_owned()
                        .await
                        .expect("the clone slots are never closed")
                }
            };
            ticket.run();
            // Both paths, in one order for every job, so two jobs never wait on each other.
            let (first, second) = if path <= request.source {
                (&path, &request.source)
            } else {
                (&request.source, &path)
            };
            let first_guard = store.lock(first).await;
            // A clone onto its own source (refused by the store) holds its one lock.
            let second_guard = if first == second {
                None
            } else {
                Some(store.lock(second).await)
            };
            metrics.in_progress.inc();
            let work = {
                let store = store.clone();
                let path = path.clone();
                let request = request.clone();
                let progress = metrics.copy.clone();
                tokio::task::spawn_blocking(move || {
                    let made = store.clone_volume(&path, &request, &progress);
                    holds::wait_if_asked(holds::CLONES);
                    made
                })
            };
            let outcome = match work.await {
                Ok(Ok((volume, created))) => {
                    if created == Created::New
                        && let Some(origin) = &volume.clone
                    {
                        metrics
                            .made
                            .get_or_create(&CloneLabels {
                                method: origin.method.as_str(),
                            })
                            .inc();
                        tracing::info!(%path, source = %origin.source, method = %origin.method, "cloned a volume");
                    }
                    Ok((volume, created))
                }
                Ok(Err(e)) => {
                    tracing::warn!(%path, source = %request.source, error = %e, "clone failed");
                    Err(e.to_api_error())
                }
                Err(e) => Err(ApiError::new(
                    ErrorCode::Internal,
                    format!("{path}: the clone task failed: {e}"),
                )),
            };
            metrics.in_progress.dec();
            drop(second_guard);
            drop(first_guard);
            drop(slot);
            drop(ticket);
            end.finish(outcome);
        });
        done
    }
}

/// The end of a job: dropped, also when the job panics, it takes the job out of the
/// running ones. Only the job itself does, so a waiter never removes a newer job that a
/// retry started at the same path.
struct JobEnd {
    running: Arc<Mutex<HashMap<VolumePath, Job>>>,
    path: VolumePath,
    tell: watch::Sender<Option<CloneOutcome>>,
}

impl JobEnd {
    /// Leaves the running jobs, then tells `outcome` to whoever waits, so a request after
    /// the outcome never joins the finished job.
    fn finish(self, outcome: CloneOutcome) {
        let tell = self.tell.clone();
        drop(self);
        let _ = tell.send(Some(outcome));
    }
}

impl Drop for JobEnd {
    fn drop(&mut self) {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.path);
    }
}

/// Counts a job as queued for as long as it waits for a slot, however the wait ends.
struct Queued<'a>(&'a CloneMetrics);

impl<'a> Queued<'a> {
    fn new(metrics: &'a CloneMetrics) -> Self {
        metrics.queued.inc();
        Self(metrics)
    }
}

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.queued.dec();
    }
}

/// How many clone jobs may run at once: `wanted`, less when the descriptor limit
/// (`None`: unlimited) cannot hold that many deep copies beside what connections and
/// requests may hold (`requests`), the usage walks and the agent's own.
fn slots(wanted: usize, requests: usize, descriptors: Option<u64>) -> usize {
    let wanted = wanted.max(1);
    let Some(limit) = descriptors else {
        return wanted;
    };
    let others = requests + USAGE_WALKS * (MAX_USAGE_DEPTH + 1);
    let reserved = BASE_DESCRIPTORS.saturating_add(others as u64);
    let per_job = (COPY_DESCRIPTORS + JOB_DESCRIPTORS) as u64;
    let fit = usize::try_from(limit.saturating_sub(reserved) / per_job).unwrap_or(usize::MAX);
    if fit >= wanted {
        return wanted;
    }
    let slots = fit.max(1);
    tracing::warn!(
        descriptor_limit = limit,
        max_clone_jobs = wanted,
        clone_jobs = slots,
        descriptors_per_clone = per_job,
        descriptors_reserved = reserved,
        "the descriptor limit (LimitNOFILE=) cannot hold limits.max_clone_jobs clones at once beside the connections and requests allowed; fewer run at once and the rest wait"
    );
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_setting_where_descriptors_allow() {
        // The shipped unit's LimitNOFILE= with the default limits.
        let requests = 4096 + 256 * REQUEST_DESCRIPTORS;
        assert_eq!(slots(2, requests, Some(65_536)), 2);
        assert_eq!(slots(2, requests, None), 2);
        assert_eq!(slots(0, requests, None), 1);
        // Room for three copies and a half beyond what everything else may take.
        let reserved = BASE_DESCRIPTORS as usize + requests + USAGE_WALKS * (MAX_USAGE_DEPTH + 1);
        let per_job = COPY_DESCRIPTORS + JOB_DESCRIPTORS;
        let limit = (reserved + 3 * per_job + per_job / 2) as u64;
        assert_eq!(slots(8, requests, Some(limit)), 3);
        // Not even one fits: one still runs, rather than none ever.
        assert_eq!(slots(2, requests, Some(1024)), 1);
    }
}
