//! The replicas being received, by name: a receive outlives the request that started
//! it, and the same request again waits for it instead of starting another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nfsprov_api_types::{ReceiveReplicaRequest, ReplicaOutcome, SnapshotName};
use tokio::sync::watch;

use super::pull::{Progress, receive};
use crate::store::error::StoreError;
use crate::store::{Created, VolumeStore};

/// The longest one request to the source may take, a file's whole content included.
const SOURCE_REQUEST_TIMEOUT: Duration = Duration::from_secs(3600);

/// How a receive ended, shared by every request waiting for it.
pub(crate) type Finished = Option<Arc<Result<(ReplicaOutcome, Created), StoreError>>>;

/// One receive under way.
pub(crate) struct ReplicaJob {
    /// Who it receives from: the same name asked of another source is a conflict.
    source: (String, SnapshotName),
    pub(crate) progress: Arc<Progress>,
    pub(crate) done: watch::Receiver<Finished>,
}

/// The receives under way, by replica name.
#[derive(Default)]
pub(crate) struct ReplicaJobs {
    running: Mutex<HashMap<SnapshotName, Arc<ReplicaJob>>>,
}

impl std::fmt::Debug for ReplicaJobs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let running = self.running.lock().map_or(0, |r| r.len());
        f.debug_struct("ReplicaJobs")
            .field("running", &running)
            .finish()
    }
}

impl ReplicaJobs {
    /// The job receiving `name` as `request` asks, started now when none is; a conflict
    /// when one receives it from another source.
    pub(crate) fn job(
        &self,
        store: &Arc<VolumeStore>,
        name: &SnapshotName,
        request: ReceiveReplicaRequest,
    ) -> Result<Arc<ReplicaJob>, StoreError> {
        let source = (request.source_url.clone(), request.grant.snapshot.clone());
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(job) = running.get(name) {
            if job.source != source {
                return Err(StoreError::Conflict(format!(
                    "replica {name} is being received from snapshot {} at {}",
                    job.source.1, job.source.0
                )));
            }
            return Ok(job.clone());
        }
        let (finish, done) = watch::channel(None);
        let progress = Arc::new(Progress::default());
        let job = Arc::new(ReplicaJob {
            source,
            progress: progress.clone(),
            done,
        });
        running.insert(name.clone(), job.clone());
        let store = store.clone();
        let name = name.clone();
        tokio::spawn(async move {
            let guard = store.lock_snapshot(&name).await;
            let result = receive(store, name, request, SOURCE_REQUEST_TIMEOUT, progress).await;
            drop(guard);
            let _ = finish.send(Some(Arc::new(result)));
        });
        Ok(job)
    }

    /// Forgets `job`, which ended and whose end was answered: the next request for the
    /// name starts afresh (and finds the replica, if it was made).
    pub(crate) fn forget(&self, name: &SnapshotName, job: &Arc<ReplicaJob>) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(name).is_some_and(|j| Arc::ptr_eq(j, job)) {
            running.remove(name);
        }
    }
}
