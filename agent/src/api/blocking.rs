//! Work a handler hands off: store work to the blocking pool, so that no async worker
//! waits on the filesystem, a tool or a lock (see the development guide), and a clone,
//! snapshot or restore to its job, awaited for a while.

use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::{ErrorCode, VolumePath};

use super::failure::{ApiResult, Failure};
use super::state::AppState;
use crate::store::VolumeStore;

/// Runs `work` on the blocking pool and answers with its result; a task that panicked
/// is an internal error.
pub(super) async fn off_workers<T, E, F>(work: F) -> ApiResult<T>
where
    T: Send + 'static,
    E: Send + 'static,
    Failure: From<E>,
    F: FnOnce() -> Result<T, E> + Send + 'static,
{
    match tokio::task::spawn_blocking(work).await {
        Ok(result) => result.map_err(Failure::from),
        Err(e) => Err(Failure::new(
            ErrorCode::Internal,
            format!("filesystem task failed: {e}"),
        )),
    }
}

/// Runs filesystem work on the blocking pool while holding the path's lock. The lock
/// guard travels into the blocking task, so a request that times out keeps the path
/// locked until its work has really finished.
pub(super) async fn with_path_lock<T, E, F>(
    state: &Arc<AppState>,
    path: &VolumePath,
    work: F,
) -> ApiResult<T>
where
    T: Send + 'static,
    E: Send + 'static,
    Failure: From<E>,
    F: FnOnce(&VolumeStore) -> Result<T, E> + Send + 'static,
{
    let guard = state.store.lock(path).await;
    let store = state.store.clone();
    let result = off_workers(move || {
        let result = work(&store);
        drop(guard);
        result
    })
    .await;
    // Whatever the mutation did, an earlier usage figure no longer describes the path.
    state.usage.forget(path);
    // Nor may a volume deleted or archived be reported missing.
    state.conditions.forget(path);
    result
}

/// How long a clone request waits for its job before answering `202 Accepted`: well
/// inside the agent's own request time limit and the controller's.
pub(super) fn clone_answer_wait(request_timeout: Duration) -> Duration {
    (request_timeout / 4).min(Duration::from_secs(10))
}
