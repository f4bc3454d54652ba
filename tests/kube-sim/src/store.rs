//! In-memory object storage standing in for etcd: one global, monotonically increasing
//! resourceVersion, a sorted map per kind, and a bounded history per kind so watches can
//! resume from a recent version (older ones get `410 Gone`, like a compacted etcd).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

use crate::errors::ApiError;
use crate::resources::Kind;

/// Objects are keyed by (namespace, name); cluster-scoped kinds use an empty namespace.
/// BTreeMap order gives lists the stable name order the real API returns and makes
/// `continue` cursors cheap.
pub type Key = (String, String);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, serialised once and shared by every watcher.
#[derive(Debug)]
pub struct WatchEvent {
    pub rv: u64,
    pub event_type: EventType,
    pub object: Arc<Value>,
    /// The state before this change, so a watch with a selector can turn a change that
    /// leaves (or enters) the selection into DELETED (or ADDED), as the real watch cache does.
    pub previous: Option<Arc<Value>>,
    pub line: Bytes,
}

pub fn event_line(event_type: &str, object: &Value) -> Bytes {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        #[serde(rename = "type")]
        t: &'a str,
        object: &'a Value,
    }
    let mut v = serde_json::to_vec(&Line {
        t: event_type,
        object,
    })
    .unwrap_or_default();
    v.push(b'\n');
    Bytes::from(v)
}

struct KindStore {
    objects: BTreeMap<Key, Arc<Value>>,
    history: VecDeque<Arc<WatchEvent>>,
    /// Highest resourceVersion dropped from `history`; a watch from below it cannot be
    /// served without losing events.
    compacted: u64,
    tx: broadcast::Sender<Arc<WatchEvent>>,
}

pub struct Inner {
    rv: u64,
    kinds: HashMap<Kind, KindStore>,
}

/// What a mutation closure decided, applied atomically by [`Store::mutate`].
pub enum Mutation {
    Put(Value),
    /// Remove the object; the DELETED event carries the given final state (or the stored
    /// one), as when an update removes the last finalizer of an object being deleted.
    Delete(Option<Value>),
    /// Nothing changed: no new resourceVersion and no watch event, as the real API
    /// does for an update that changes nothing.
    Unchanged,
}

pub struct Store {
    inner: Mutex<Inner>,
    history_cap: usize,
}

/// Read access to other objects while a mutation holds the lock (e.g. "does the
/// namespace exist").
pub struct View<'a> {
    inner: &'a Inner,
}

impl View<'_> {
    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Arc<Value>> {
        self.inner
            .kinds
            .get(&kind)?
            .objects
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    pub fn iter(&self, kind: Kind) -> impl Iterator<Item = &Arc<Value>> {
        self.inner
            .kinds
            .get(&kind)
            .into_iter()
            .flat_map(|k| k.objects.values())
    }
}

/// Where a watch starts: the catch-up events and a live receiver taken under the same lock,
/// so no event falls between them.
pub struct WatchStart {
    pub backlog: Vec<Arc<WatchEvent>>,
    pub rx: broadcast::Receiver<Arc<WatchEvent>>,
    pub current_rv: u64,
}

impl Store {
    pub fn new(history_cap: usize) -> Self {
        let kinds = Kind::ALL
            .into_iter()
            .map(|k| {
                // Large enough for a 1,000-create burst to reach a slow watcher; a watcher
                // lagging beyond it is disconnected and resumes from history.
                let (tx, _) = broadcast::channel(16_384);
                (
                    k,
                    KindStore {
                        objects: BTreeMap::new(),
                        history: VecDeque::new(),
                        compacted: 0,
                        tx,
                    },
                )
            })
            .collect();
        Store {
            inner: Mutex::new(Inner { rv: 1, kinds }),
            history_cap: history_cap.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied mutation (all
        // changes are applied after the closure returns), so poisoning is ignored.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Option<Arc<Value>> {
        View {
            inner: &self.lock(),
        }
        .get(kind, ns, name)
    }

    /// A consistent snapshot of a kind (optionally one namespace) and the version it is at.
    pub fn snapshot(&self, kind: Kind, ns: Option<&str>) -> (Vec<Arc<Value>>, u64) {
        let inner = self.lock();
        let Some(ks) = inner.kinds.get(&kind) else {
            return (Vec::new(), inner.rv);
        };
        let items = match ns {
            Some(ns) => ks
                .objects
                .range((ns.to_string(), String::new())..)
                .take_while(|((n, _), _)| n == ns)
                .map(|(_, v)| v.clone())
                .collect(),
            None => ks.objects.values().cloned().collect(),
        };
        (items, inner.rv)
    }

    pub fn subscribe(&self, kind: Kind) -> broadcast::Receiver<Arc<WatchEvent>> {
        let inner = self.lock();
        match inner.kinds.get(&kind) {
            Some(k) => k.tx.subscribe(),
            None => broadcast::channel(1).1,
        }
    }

    /// Start a watch after `from` (exclusive). `Err` is the `410 Expired` answer.
    pub fn watch_from(&self, kind: Kind, from: u64) -> Result<WatchStart, ApiError> {
        let inner = self.lock();
        let ks = inner
            .kinds
            .get(&kind)
            .ok_or_else(|| ApiError::internal("unknown kind"))?;
        if from < ks.compacted {
            return Err(ApiError::expired(format!(
                "too old resource version: {from} ({})",
                ks.compacted
            )));
        }
        let backlog = ks.history.iter().filter(|e| e.rv > from).cloned().collect();
        Ok(WatchStart {
            backlog,
            rx: ks.tx.subscribe(),
            current_rv: inner.rv,
        })
    }

    /// A snapshot plus a live receiver taken atomically: for watches that begin with the
    /// current state (resourceVersion unset or "0").
    pub fn snapshot_and_subscribe(&self, kind: Kind) -> (Vec<Arc<Value>>, WatchStart) {
        let inner = self.lock();
        let (items, rx) = match inner.kinds.get(&kind) {
            Some(ks) => (ks.objects.values().cloned().collect(), ks.tx.subscribe()),
            None => (Vec::new(), broadcast::channel(1).1),
        };
        (
            items,
            WatchStart {
                backlog: Vec::new(),
                rx,
                current_rv: inner.rv,
            },
        )
    }

    /// Read-decide-write under one lock: `f` sees the current object (if any) and the rest of
    /// the store, and returns what to do. The store stamps the new resourceVersion, records
    /// history and notifies watchers. Returns the stored object (for a delete: its final
    /// state with the deletion's resourceVersion).
    pub fn mutate<F>(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        f: F,
    ) -> Result<(Option<Arc<Value>>, Option<EventType>), ApiError>
    where
        F: FnOnce(&View<'_>, Option<&Arc<Value>>) -> Result<Mutation, ApiError>,
    {
        let mut inner = self.lock();
        let key = (ns.to_string(), name.to_string());
        let current = inner
            .kinds
            .get(&kind)
            .and_then(|k| k.objects.get(&key))
            .cloned();
        let decision = f(&View { inner: &inner }, current.as_ref())?;
        let (event_type, new_obj) = match decision {
            Mutation::Unchanged => return Ok((current, None)),
            Mutation::Put(mut obj) => {
                let rv = inner.rv + 1;
                set_rv(&mut obj, rv);
                let t = if current.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                (t, obj)
            }
            Mutation::Delete(last) => {
                let Some(cur) = current.as_ref() else {
                    return Err(ApiError::not_found(kind, name));
                };
                let mut obj = last.unwrap_or_else(|| (**cur).clone());
                set_rv(&mut obj, inner.rv + 1);
                (EventType::Deleted, obj)
            }
        };
        inner.rv += 1;
        let rv = inner.rv;
        let cap = self.history_cap;
        let ks = inner
            .kinds
            .get_mut(&kind)
            .ok_or_else(|| ApiError::internal("unknown kind"))?;
        let obj = Arc::new(new_obj);
        if event_type == EventType::Deleted {
            ks.objects.remove(&key);
        } else {
            ks.objects.insert(key, obj.clone());
        }
        let ev = Arc::new(WatchEvent {
            rv,
            event_type,
            line: event_line(event_type.as_str(), &obj),
            object: obj.clone(),
            previous: current,
        });
        ks.history.push_back(ev.clone());
        while ks.history.len() > cap {
            if let Some(old) = ks.history.pop_front() {
                ks.compacted = old.rv;
            }
        }
        // No receivers is normal (nobody watching).
        let _ = ks.tx.send(ev);
        Ok((Some(obj), Some(event_type)))
    }

    /// Drop all watch history, as an etcd compaction would: every watch from an older
    /// version must relist. Used by tests to force `410 Gone`.
    pub fn compact(&self) {
        let mut inner = self.lock();
        let rv = inner.rv;
        for ks in inner.kinds.values_mut() {
            ks.history.clear();
            ks.compacted = rv;
        }
    }
}

pub fn set_rv(obj: &mut Value, rv: u64) {
    if let Some(meta) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}
