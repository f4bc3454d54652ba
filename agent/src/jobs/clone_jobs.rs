//! Clone jobs. A clone job holds the locks of its target and source paths until it ends,
//! whether or not anyone still waits; a repeat that finds no job (it ended, or the agent
//! restarted) runs the clone again, which confirms a finished clone or starts over from
//! nothing, since an unfinished one never reaches its path.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::{ApiError, CloneProgress, CloneVolumeRequest, Volume, VolumePath};

use super::map::Fate;
use super::queue::JobKind;
use super::runner::{Counters, JobRunner, JobTask, Jobs};
use super::shares::JobShare;
use super::slots::SlotWaits;
use crate::holds;
use crate::metrics::{CloneLabels, CloneMetrics};
use crate::store::{Created, PathGuard, StoreError, VolumeStore};

/// How a clone ended: the volume and whether this job made it, or why it failed.
pub(super) type CloneOutcome = Result<(Volume, Created), ApiError>;

/// What a clone request comes to.
// One per request, never held in bulk, so the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum CloneAnswer {
    Done(CloneOutcome),
    Running(CloneProgress),
}

/// The clone jobs of one agent, by target path.
#[derive(Debug)]
pub(crate) struct Clones {
    store: Arc<VolumeStore>,
    metrics: CloneMetrics,
    jobs: Jobs<VolumePath, CloneVolumeRequest, (Volume, Created), ()>,
}

impl Clones {
    /// Clone jobs on `store`, run by `runner`, counted in `metrics`.
    pub(crate) fn new(store: Arc<VolumeStore>, metrics: CloneMetrics, runner: &JobRunner) -> Self {
        let counters = Counters {
            in_progress: metrics.in_progress.clone(),
            failed: metrics.failed.clone(),
            slot_waits: Some(SlotWaits {
                waited: metrics.waited.clone(),
                waiting: metrics.queued.clone(),
            }),
        };
        Self {
            jobs: runner.jobs(JobKind::Clone, counters),
            store,
            metrics,
        }
    }

    /// Starts the clone of `request` at `path`, or joins the job already making it, and
    /// waits at most `wait` for it to end. A job making something else at `path` is a
    /// conflict; a new job when the clone queue or the caller's `share` is full is
    /// refused.
    pub(crate) async fn clone_volume(
        &self,
        path: &VolumePath,
        request: CloneVolumeRequest,
        wait: Duration,
        share: Option<&JobShare>,
    ) -> CloneAnswer {
        let joined = self
            .jobs
            .join_or_start(path, &request, (), share, || CloneJob {
                store: self.store.clone(),
                metrics: self.metrics.clone(),
                path: path.clone(),
                request: request.clone(),
            });
        let mut joined = match joined {
            Ok(joined) => joined,
            Err(refused) => {
                return CloneAnswer::Done(Err(refused.into_error(|other| {
                    format!(
                        "{path}: a clone of {} with other settings is being made there",
                        other.source
                    )
                })));
            }
        };
        match joined
            .outcome(wait, &format!("{path}: the clone job"))
            .await
        {
            Some(outcome) => CloneAnswer::Done(outcome),
            None => CloneAnswer::Running(CloneProgress {
                source: request.source,
                running_seconds: joined.started.elapsed().as_secs(),
            }),
        }
    }
}

/// One clone: `request` made at `path`.
struct CloneJob {
    store: Arc<VolumeStore>,
    metrics: CloneMetrics,
    path: VolumePath,
    request: CloneVolumeRequest,
}

impl fmt::Display for CloneJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: the clone task", self.path)
    }
}

impl JobTask for CloneJob {
    type Made = (Volume, Created);

    /// Both paths, in one order for every job, so two jobs never wait on each other.
    async fn lock(&self) -> Vec<PathGuard> {
        let (path, source) = (&self.path, &self.request.source);
        let (first, second) = if path <= source {
            (path, source)
        } else {
            (source, path)
        };
        let mut locks = vec![self.store.lock(first).await];
        // A clone onto its own source (refused by the store) holds its one lock.
        if first != second {
            locks.push(self.store.lock(second).await);
        }
        locks
    }

    fn run(&self, _: &Fate) -> Result<Self::Made, StoreError> {
        let made = self
            .store
            .clone_volume(&self.path, &self.request, &self.metrics.copy);
        holds::wait_if_asked(holds::CLONES);
        made
    }

    fn warn(&self, error: &StoreError) {
        tracing::warn!(path = %self.path, source = %self.request.source, %error, "clone failed");
    }

    fn made(&self, (volume, created): &Self::Made) {
        if *created == Created::New
            && let Some(origin) = &volume.clone
        {
            self.metrics
                .made
                .get_or_create(&CloneLabels {
                    method: origin.method.as_str(),
                })
                .inc();
            tracing::info!(path = %self.path, source = %origin.source, method = %origin.method, "cloned a volume");
        }
    }
}
