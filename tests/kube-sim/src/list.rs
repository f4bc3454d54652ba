//! Lists with `limit`/`continue`. The first page takes a snapshot of the matching objects
//! and later pages are served from it, so a paginated list is consistent at one
//! resourceVersion exactly like the real API's; the snapshots expire like continue tokens do.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::ser::{SerializeMap, Serializer};
use serde_json::Value;

use crate::errors::ApiError;

/// Live snapshots by id, and their ids oldest first (for eviction).
type Snapshots = (HashMap<u64, Arc<Snapshot>>, VecDeque<u64>);

struct Snapshot {
    items: Vec<Arc<Value>>,
    rv: u64,
    created: Instant,
}

/// Continue-token state; bounded in count and age so abandoned lists do not pile up.
pub struct ContinueCache {
    next_id: AtomicU64,
    snapshots: Mutex<Snapshots>,
    max: usize,
    ttl: Duration,
}

pub struct Page {
    pub items: Vec<Arc<Value>>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

const TOO_OLD: &str = "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.";

impl Default for ContinueCache {
    fn default() -> Self {
        ContinueCache {
            next_id: AtomicU64::new(1),
            snapshots: Mutex::new((HashMap::new(), VecDeque::new())),
            max: 256,
            // The real default etcd compaction interval.
            ttl: Duration::from_secs(300),
        }
    }
}

impl ContinueCache {
    /// First page of a (filtered) snapshot.
    pub fn first_page(&self, items: Vec<Arc<Value>>, rv: u64, limit: Option<usize>) -> Page {
        match limit {
            Some(l) if l > 0 && items.len() > l => {
                let id = self.next_id.fetch_add(1, Ordering::Relaxed);
                let snap = Arc::new(Snapshot {
                    items,
                    rv,
                    created: Instant::now(),
                });
                let page = page_of(&snap, id, 0, l);
                let mut g = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
                g.0.insert(id, snap);
                g.1.push_back(id);
                while g.1.len() > self.max {
                    if let Some(old) = g.1.pop_front() {
                        g.0.remove(&old);
                    }
                }
                page
            }
            _ => Page {
                items,
                rv,
                continue_token: None,
                remaining: None,
            },
        }
    }

    pub fn next_page(&self, token: &str, limit: Option<usize>) -> Result<Page, ApiError> {
        let invalid = || {
            ApiError::bad_request(
                "continue key is not valid: incorrect encoded start resourceVersion (version meta.k8s.io/v1)",
            )
        };
        let (id, offset) = token.split_once('-').ok_or_else(invalid)?;
        let id: u64 = id.parse().map_err(|_| invalid())?;
        let offset: usize = offset.parse().map_err(|_| invalid())?;
        let snap = {
            let g = self.snapshots.lock().unwrap_or_else(|p| p.into_inner());
            g.0.get(&id).cloned()
        };
        let snap = match snap {
            Some(s) if s.created.elapsed() < self.ttl => s,
            _ => return Err(ApiError::expired(TOO_OLD)),
        };
        if offset > snap.items.len() {
            return Err(invalid());
        }
        let l = limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
        Ok(page_of(&snap, id, offset, l))
    }
}

fn page_of(snap: &Snapshot, id: u64, offset: usize, limit: usize) -> Page {
    let end = offset.saturating_add(limit).min(snap.items.len());
    let items = snap.items[offset..end].to_vec();
    let more = end < snap.items.len();
    Page {
        items,
        rv: snap.rv,
        continue_token: more.then(|| format!("{id}-{end}")),
        remaining: more.then(|| snap.items.len() - end),
    }
}

/// Serialises an object without `apiVersion`/`kind`: list items of built-in types carry no
/// type meta in real API responses, and clients must not depend on it.
pub struct ListItem<'a>(pub &'a Value);

impl serde::Serialize for ListItem<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_object() {
            Some(o) => {
                let mut m = s.serialize_map(None)?;
                for (k, v) in o {
                    if k != "apiVersion" && k != "kind" {
                        m.serialize_entry(k, v)?;
                    }
                }
                m.end()
            }
            None => self.0.serialize(s),
        }
    }
}
