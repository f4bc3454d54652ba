//! Per-path locks: two requests on the same volume path are serialized, so two mutations
//! of one path never interleave; different paths proceed in parallel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedMutexGuard;

/// Serializes requests on the same volume path, so two mutations of one path never
/// interleave; different paths proceed in parallel.
#[derive(Debug, Default)]
pub(super) struct PathLocks {
    held: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds one path's lock; forgets the entry when nobody else waits for it.
pub struct PathGuard {
    locks: Arc<PathLocks>,
    key: String,
    mutex: Arc<tokio::sync::Mutex<()>>,
    guard: Option<OwnedMutexGuard<()>>,
}

impl PathLocks {
    pub(super) async fn lock(self: &Arc<Self>, key: &str) -> PathGuard {
        let mutex = self
            .held
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(key.to_owned())
            .or_default()
            .clone();
        let guard = mutex.clone().lock_owned().await;
        PathGuard {
            locks: self.clone(),
            key: key.to_owned(),
            mutex,
            guard: Some(guard),
        }
    }
}

impl Drop for PathGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut held = self.locks.held.lock().unwrap_or_else(|e| e.into_inner());
        // Only the map's reference and ours remain: nobody is waiting.
        if Arc::strong_count(&self.mutex) == 2 {
            held.remove(&self.key);
        }
    }
}
