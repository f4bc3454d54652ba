//! Watch streams: newline-delimited JSON events as kube-apiserver writes them, resumable
//! from a resourceVersion, with bookmarks, server-side timeouts, selector transitions and
//! in-stream `410 Expired` errors.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

use crate::errors::ApiError;
use crate::meta;
use crate::resources::Kind;
use crate::selectors::Selectors;
use crate::store::{EventType, Store, WatchEvent, WatchStart, event_line};

pub struct WatchRequest {
    pub kind: Kind,
    /// Namespace the URL restricts to, if any.
    pub namespace: Option<String>,
    pub selectors: Selectors,
    pub resource_version: Option<String>,
    pub send_initial_events: bool,
    pub bookmarks: bool,
    pub timeout: Duration,
    pub bookmark_interval: Duration,
}

impl WatchRequest {
    /// events.k8s.io Events are stored as core Events and converted per watcher.
    fn storage_kind(&self) -> Kind {
        match self.kind {
            Kind::EventsV1Event => Kind::CoreEvent,
            k => k,
        }
    }

    fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && meta::namespace(obj) != ns
        {
            return false;
        }
        self.selectors.matches(obj)
    }
}

fn bookmark(kind: Kind, rv: u64, initial_end: bool) -> Bytes {
    let mut metadata = json!({ "resourceVersion": rv.to_string(), "creationTimestamp": null });
    if initial_end {
        metadata["annotations"] = json!({ "k8s.io/initial-events-end": "true" });
    }
    let obj = json!({
        "kind": kind.info().kind,
        "apiVersion": kind.api_version(),
        "metadata": metadata,
    });
    event_line("BOOKMARK", &obj)
}

/// The line (if any) this watcher gets for an event, applying the selector-transition rule.
fn line_for(req: &WatchRequest, ev: &WatchEvent) -> Option<Bytes> {
    if req.kind != req.storage_kind() {
        let obj = crate::api::present(req.kind, ev.object.clone());
        let now = req.matches(&obj);
        let before = ev
            .previous
            .as_ref()
            .is_some_and(|p| req.matches(&crate::api::present(req.kind, p.clone())));
        let t = match (ev.event_type, before, now) {
            (EventType::Added, _, true) => "ADDED",
            (EventType::Deleted, b, n) if b || n => "DELETED",
            (EventType::Modified, true, true) => "MODIFIED",
            (EventType::Modified, false, true) => "ADDED",
            (EventType::Modified, true, false) => "DELETED",
            _ => return None,
        };
        return Some(event_line(t, &obj));
    }
    let now = req.matches(&ev.object);
    if req.selectors.is_empty() {
        return now.then(|| ev.line.clone());
    }
    let before = ev.previous.as_deref().is_some_and(|p| req.matches(p));
    match ev.event_type {
        EventType::Added => now.then(|| ev.line.clone()),
        EventType::Deleted => (now || before).then(|| ev.line.clone()),
        EventType::Modified => match (before, now) {
            (true, true) => Some(ev.line.clone()),
            (false, true) => Some(event_line("ADDED", &ev.object)),
            (true, false) => Some(event_line("DELETED", &ev.object)),
            (false, false) => None,
        },
    }
}

/// Validate the request and build the streaming response body. Errors that the real API
/// reports before streaming come back as `Err`; a too-old resourceVersion is reported
/// in-stream, as the watch cache does.
pub fn start(
    store: Arc<Store>,
    drops: watch::Receiver<u64>,
    req: WatchRequest,
) -> Result<Body, ApiError> {
    if req.send_initial_events && !req.bookmarks {
        return Err(ApiError::unprocessable(
            "ListOptions.meta.k8s.io \"\" is invalid: allowWatchBookmarks: Required value: allowWatchBookmarks must be set to true when sendInitialEvents is set",
        ));
    }
    let rv_param = req.resource_version.clone().unwrap_or_default();
    let (initial, start, initial_end): (Vec<Arc<Value>>, Result<WatchStart, ApiError>, bool) =
        if req.send_initial_events || rv_param.is_empty() || rv_param == "0" {
            let (items, ws) = store.snapshot_and_subscribe(req.storage_kind());
            (items, Ok(ws), req.send_initial_events)
        } else {
            let from: u64 = rv_param.parse().map_err(|_| {
                ApiError::bad_request(format!("invalid resource version: {rv_param}"))
            })?;
            let current = store.current_rv();
            if from > current {
                return Err(ApiError::timeout(format!(
                    "Too large resource version: {from}, current: {current}"
                )));
            }
            (
                Vec::new(),
                store.watch_from(req.storage_kind(), from),
                false,
            )
        };
    let (tx, rx) = mpsc::channel::<Bytes>(256);
    tokio::spawn(run(store, drops, req, initial, start, initial_end, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|b| (Ok::<_, Infallible>(b), rx))
    });
    Ok(Body::from_stream(stream))
}

async fn run(
    store: Arc<Store>,
    mut drops: watch::Receiver<u64>,
    req: WatchRequest,
    initial: Vec<Arc<Value>>,
    start: Result<WatchStart, ApiError>,
    initial_end: bool,
    tx: mpsc::Sender<Bytes>,
) {
    let mut ws = match start {
        Ok(ws) => ws,
        Err(e) => {
            let _ = tx.send(event_line("ERROR", &e.to_status())).await;
            return;
        }
    };
    drops.mark_unchanged();
    let deadline = tokio::time::sleep(req.timeout);
    tokio::pin!(deadline);
    let mut last_sent = ws.current_rv;
    for obj in initial
        .into_iter()
        .map(|o| crate::api::present(req.kind, o))
        .filter(|o| req.matches(o))
    {
        if tx.send(event_line("ADDED", &obj)).await.is_err() {
            return;
        }
    }
    if initial_end
        && tx
            .send(bookmark(req.kind, ws.current_rv, true))
            .await
            .is_err()
    {
        return;
    }
    for ev in std::mem::take(&mut ws.backlog) {
        last_sent = last_sent.max(ev.rv);
        if let Some(line) = line_for(&req, &ev)
            && tx.send(line).await.is_err()
        {
            return;
        }
    }
    let mut ticker = tokio::time::interval(req.bookmark_interval);
    ticker.tick().await;
    loop {
        tokio::select! {
            ev = ws.rx.recv() => match ev {
                Ok(ev) => {
                    last_sent = last_sent.max(ev.rv);
                    if let Some(line) = line_for(&req, &ev)
                        && tx.send(line).await.is_err()
                    {
                        return;
                    }
                }
                // A watcher too slow to keep up is closed, as the real API closes it; the
                // client resumes from its last version (or relists after 410).
                Err(broadcast::error::RecvError::Lagged(_)) | Err(broadcast::error::RecvError::Closed) => return,
            },
            _ = ticker.tick(), if req.bookmarks => {
                // Deliver everything up to `cur` before claiming `cur` in a bookmark, so
                // the bookmark never lets a client skip an event.
                let cur = store.current_rv();
                loop {
                    match ws.rx.try_recv() {
                        Ok(ev) => {
                            last_sent = last_sent.max(ev.rv);
                            if let Some(line) = line_for(&req, &ev)
                                && tx.send(line).await.is_err()
                            {
                                return;
                            }
                        }
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                let rv = cur.max(last_sent);
                if tx.send(bookmark(req.kind, rv, false)).await.is_err() {
                    return;
                }
            }
            _ = &mut deadline => return,
            _ = drops.changed() => return,
            _ = tx.closed() => return,
        }
    }
}
