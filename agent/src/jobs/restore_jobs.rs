//! Restore jobs: volumes made from a snapshot or from an archive. A restore job holds the
//! locks of its snapshot name and of its target path, the name's always first, or, from
//! an archive, those of the path the archive was made of (which archive deletion takes)
//! and of its target path, in path order. So a snapshot or an archive is never deleted
//! while a restore reads it. A repeat that finds no job (it ended, or the agent
//! restarted) runs it again, which finds the finished volume or starts over from nothing:
//! an unfinished one is never visible.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::{
    ApiError, CloneMethod, ErrorCode, RestoreProgress, RestoreSource, RestoreVolumeRequest,
    SnapshotName, Volume, VolumePath,
};

use super::map::Fate;
use super::queue::JobKind;
use super::runner::{Counters, JobRunner, JobTask, Jobs};
use super::shares::JobShare;
use crate::metrics::{RestoreLabels, SnapshotMetrics};
use crate::store::{Created, PathGuard, StoreError, VolumeStore};

/// How a restore job ended: the volume and whether this job made it, or why not.
pub(super) type RestoreOutcome = Result<(Volume, Created), ApiError>;

/// What a restore request comes to.
// One per request, never held in bulk, so the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub(crate) enum RestoreAnswer {
    Done(RestoreOutcome),
    Running(RestoreProgress),
}

/// The restore jobs of one agent, by target path.
#[derive(Debug)]
pub(super) struct Restores {
    store: Arc<VolumeStore>,
    metrics: SnapshotMetrics,
    jobs: Jobs<VolumePath, RestoreVolumeRequest, (Volume, Created), ()>,
}

impl Restores {
    /// Restore jobs on `store`, run by `runner`, counted in `metrics` (beside snapshots).
    pub(super) fn new(
        store: Arc<VolumeStore>,
        metrics: SnapshotMetrics,
        runner: &JobRunner,
    ) -> Self {
        let counters = Counters {
            in_progress: metrics.in_progress.clone(),
            failed: metrics.restores_failed.clone(),
            slot_waits: None,
        };
        Self {
            jobs: runner.jobs(JobKind::Restore, counters),
            store,
            metrics,
        }
    }

    /// Starts the restore of `request` (from `source`, its source) at `path`, or joins
    /// the job already making it, and waits at most `wait` for it to end. A snapshot
    /// still `being_taken` is not ready to restore from; a job making something else at
    /// `path` is a conflict; a new job when the restore queue is full is refused.
    pub(super) async fn restore(
        &self,
        path: &VolumePath,
        source: &RestoreSource,
        request: RestoreVolumeRequest,
        wait: Duration,
        share: Option<&JobShare>,
        being_taken: impl FnOnce(&SnapshotName) -> bool,
    ) -> RestoreAnswer {
        if let RestoreSource::Snapshot(name) = source
            && being_taken(name)
        {
            return RestoreAnswer::Done(Err(ApiError::new(
                ErrorCode::NotReady,
                format!(
                    "{path}: snapshot {name} is still being taken; restore from it once it is ready"
                ),
            )));
        }
        let joined = self
            .jobs
            .join_or_start(path, &request, (), share, || RestoreJob {
                store: self.store.clone(),
                metrics: self.metrics.clone(),
                path: path.clone(),
                source: source.clone(),
                request: request.clone(),
            });
        let mut joined = match joined {
            Ok(joined) => joined,
            Err(refused) => {
                return RestoreAnswer::Done(Err(refused.into_error(|other| {
                    format!(
                        "{path}: a restore from {} with other settings is being made there",
                        other
                            .source()
                            .map_or_else(|e| e.to_owned(), |source| source.to_string())
                    )
                })));
            }
        };
        match joined.outcome(wait, "the job").await {
            Some(outcome) => RestoreAnswer::Done(outcome),
            None => RestoreAnswer::Running(RestoreProgress {
                source: source.clone(),
                running_seconds: joined.started.elapsed().as_secs(),
            }),
        }
    }
}

/// One restore: `request`, from `source`, made at `path`.
struct RestoreJob {
    store: Arc<VolumeStore>,
    metrics: SnapshotMetrics,
    path: VolumePath,
    source: RestoreSource,
    request: RestoreVolumeRequest,
}

impl fmt::Display for RestoreJob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: the restore task", self.path)
    }
}

impl JobTask for RestoreJob {
    type Made = (Volume, Created);

    /// A snapshot's name first, then the path; for an archive, the path it was made of
    /// (which its deletion takes) and the path, in one order for every job, as clone
    /// jobs take theirs.
    async fn lock(&self) -> Vec<PathGuard> {
        let (store, path) = (&self.store, &self.path);
        match &self.source {
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

    /// Restores are never cancelled: nothing deletes a volume being made.
    fn run(&self, _: &Fate) -> Result<Self::Made, StoreError> {
        self.store
            .restore_volume(&self.path, &self.source, &self.request, &self.metrics.copy)
    }

    fn warn(&self, error: &StoreError) {
        tracing::warn!(path = %self.path, source = %self.source, %error, "restore failed");
    }

    fn made(&self, (volume, created): &Self::Made) {
        if *created == Created::New
            && let Some(origin) = &volume.restore
        {
            self.metrics
                .restored
                .get_or_create(&RestoreLabels {
                    source: source_label(&origin.source),
                    method: method_label(origin.method),
                })
                .inc();
            tracing::info!(path = %self.path, source = %origin.source, method = %origin.method, "restored a volume");
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
