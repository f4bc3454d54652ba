//! Per-volume (and per-archive) usage, measured on the server by walking the tree the way
//! `du -x` counts: the allocated blocks of every entry, hard-linked files once, never
//! crossing into another filesystem. Walks run on the blocking pool, a few at a time, and
//! their results are cached, so clients polling a huge volume never stall the API.

use std::collections::HashMap;
use std::fmt::Display;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use nfsprov_api_types::{ArchivePath, VolumePath, VolumeUsage};
use tokio::sync::Semaphore;

use crate::store::{self, VolumeStore};

/// What a cache measures: a volume by its path, or an archive by its id.
pub(crate) trait Measured: Clone + Eq + Hash + Display + Send + Sync + 'static {
    fn measure(&self, store: &VolumeStore) -> store::Result<VolumeUsage>;
}

impl Measured for VolumePath {
    fn measure(&self, store: &VolumeStore) -> store::Result<VolumeUsage> {
        store.measure(self)
    }
}

impl Measured for ArchivePath {
    fn measure(&self, store: &VolumeStore) -> store::Result<VolumeUsage> {
        store.measure_archive(self)
    }
}

type Measurement = Shared<BoxFuture<'static, Option<VolumeUsage>>>;

struct Entry {
    /// Tells this entry from a later one for the same path, so a walk of a volume that
    /// was deleted meanwhile never records its figure for the new volume.
    generation: u64,
    last: Option<(VolumeUsage, Instant)>,
    running: Option<Measurement>,
}

type Entries<K> = Arc<Mutex<HashMap<K, Entry>>>;

/// Cached usage per volume path (or archive id).
pub(crate) struct UsageCache<K: Measured = VolumePath> {
    entries: Entries<K>,
    generations: AtomicU64,
    walks: Arc<Semaphore>,
    fresh_for: Duration,
    first_wait: Duration,
}

impl<K: Measured> std::fmt::Debug for UsageCache<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UsageCache")
            .field("fresh_for", &self.fresh_for)
            .field("first_wait", &self.first_wait)
            .finish_non_exhaustive()
    }
}

impl<K: Measured> UsageCache<K> {
    /// `fresh_for`: how long a figure is served before it is measured again (in the
    /// background). `first_wait`: how long a request without any figure yet waits for
    /// the first walk before answering without one.
    pub(crate) fn new(fresh_for: Duration, first_wait: Duration, parallel_walks: usize) -> Self {
        Self {
            entries: Arc::default(),
            generations: AtomicU64::new(0),
            walks: Arc::new(Semaphore::new(parallel_walks.max(1))),
            fresh_for,
            first_wait,
        }
    }

    /// The latest figure for `path`, starting a new walk when it is stale.
    pub(crate) async fn get(&self, store: &Arc<VolumeStore>, path: &K) -> Option<VolumeUsage> {
        self.get_within(store, path, self.fresh_for).await
    }

    /// As [`Self::get`], with a figure stale once older than `fresh_for`.
    pub(crate) async fn get_within(
        &self,
        store: &Arc<VolumeStore>,
        path: &K,
        fresh_for: Duration,
    ) -> Option<VolumeUsage> {
        match self.current(store, path, fresh_for) {
            (Some(usage), _) => Some(usage),
            (None, Some(walk)) => tokio::time::timeout(self.first_wait, walk)
                .await
                .ok()
                .flatten(),
            (None, None) => None,
        }
    }

    /// The latest figure for `path` without waiting for one, starting a new walk when it
    /// is stale.
    pub(crate) fn latest(&self, store: &Arc<VolumeStore>, path: &K) -> Option<VolumeUsage> {
        self.current(store, path, self.fresh_for).0
    }

    fn current(
        &self,
        store: &Arc<VolumeStore>,
        path: &K,
        fresh_for: Duration,
    ) -> (Option<VolumeUsage>, Option<Measurement>) {
        let mut entries = self.entries.lock().unwrap_or_else(|e| e.into_inner());
        let entry = entries.entry(path.clone()).or_insert_with(|| Entry {
            generation: self.generations.fetch_add(1, Ordering::Relaxed),
            last: None,
            running: None,
        });
        let fresh = entry.last.is_some_and(|(_, at)| at.elapsed() < fresh_for);
        if !fresh && entry.running.is_none() {
            entry.running = Some(self.start(store.clone(), path.clone(), entry.generation));
        }
        (entry.last.map(|(usage, _)| usage), entry.running.clone())
    }

    /// The last figure for `path`, however old, without ever starting a walk: for
    /// checks that run on every volume and must stay cheap.
    pub(crate) fn peek(&self, path: &K) -> Option<VolumeUsage> {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(path)
            .and_then(|entry| entry.last.map(|(usage, _)| usage))
    }

    /// Drops what is known about `path` (after it was created, deleted or archived).
    pub(crate) fn forget(&self, path: &K) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(path);
    }

    /// Drops what is known about every key but those `keep` accepts (what no longer
    /// exists, found by a listing).
    pub(crate) fn retain(&self, keep: impl Fn(&K) -> bool) {
        self.entries
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| keep(key));
    }

    fn start(&self, store: Arc<VolumeStore>, path: K, generation: u64) -> Measurement {
        let walks = self.walks.clone();
        let entries = self.entries.clone();
        let walk = async move {
            let usage = match walks.acquire_owned().await {
                Ok(_permit) => {
                    let measured = {
                        let path = path.clone();
                        tokio::task::spawn_blocking(move || path.measure(&store)).await
                    };
                    match measured {
                        Ok(Ok(usage)) => Some(usage),
                        Ok(Err(e)) => {
                            tracing::debug!(%path, error = %e, "usage not measured");
                            None
                        }
                        Err(_) => None,
                    }
                }
                Err(_) => None,
            };
            let mut entries = entries.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(entry) = entries
                .get_mut(&path)
                .filter(|e| e.generation == generation)
            {
                entry.running = None;
                if let Some(usage) = usage {
                    entry.last = Some((usage, Instant::now()));
                }
            }
            usage
        }
        .boxed()
        .shared();
        // The walk runs to completion even when no request waits for it any more.
        let background = walk.clone();
        tokio::spawn(async move {
            background.await;
        });
        walk
    }
}
