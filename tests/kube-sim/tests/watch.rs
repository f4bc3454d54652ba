//! Watches as kube-runtime drives them: resume after a dropped connection without losing
//! or repeating events, 410 Gone leading to a relist, bookmarks, streaming lists and
//! selector transitions.

mod common;

use std::collections::HashMap;
use std::time::Duration;

use common::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, DeleteParams, Patch, PatchParams, WatchEvent, WatchParams};
use kube::runtime::reflector;
use kube::runtime::watcher::{self, Event};
use nfsprov_kube_sim::SimOptions;
use serde_json::json;
use tokio::sync::mpsc;

fn opts() -> SimOptions {
    SimOptions {
        binder: false,
        ..SimOptions::default()
    }
}

/// What the watcher reported, flattened for assertions.
#[derive(Debug, Clone, PartialEq)]
enum Seen {
    Init,
    InitDone,
    Apply(String, String),
    Delete(String),
    Err(String),
}

fn spawn_watcher(
    api: Api<PersistentVolumeClaim>,
    cfg: watcher::Config,
) -> mpsc::UnboundedReceiver<Seen> {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut s = watcher::watcher(api, cfg).boxed();
        while let Some(ev) = s.next().await {
            let seen = match ev {
                Ok(Event::Init) => Seen::Init,
                Ok(Event::InitDone) => Seen::InitDone,
                Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) => Seen::Apply(
                    o.metadata.name.unwrap_or_default(),
                    o.metadata.resource_version.unwrap_or_default(),
                ),
                Ok(Event::Delete(o)) => Seen::Delete(o.metadata.name.unwrap_or_default()),
                Err(e) => Seen::Err(e.to_string()),
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    rx
}

/// Collect events until `done` says the log is complete (bounded in time).
async fn collect_until(
    rx: &mut mpsc::UnboundedReceiver<Seen>,
    log: &mut Vec<Seen>,
    done: impl Fn(&[Seen]) -> bool,
) {
    tokio::time::timeout(WAIT, async {
        while !done(log) {
            match rx.recv().await {
                Some(s) => log.push(s),
                None => panic!("watcher ended"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out; events so far: {log:#?}"));
}

fn applies(log: &[Seen], name: &str) -> Vec<String> {
    log.iter()
        .filter_map(|s| match s {
            Seen::Apply(n, rv) if n == name => Some(rv.clone()),
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn watcher_resumes_after_dropped_connection_without_loss_or_duplicates() {
    let (sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let mut rx = spawn_watcher(pvcs.clone(), watcher::Config::default());
    let mut log = Vec::new();
    collect_until(&mut rx, &mut log, |l| l.contains(&Seen::InitDone)).await;
    for i in 0..3 {
        create(&pvcs, &pvc(&format!("before-{i}"), None, "1Gi")).await;
    }
    collect_until(&mut rx, &mut log, |l| !applies(l, "before-2").is_empty()).await;

    // Cut the watch, then change things behind its back (directly, no HTTP, no await: on
    // this single-threaded test runtime the client cannot reconnect before these are
    // done). They must arrive through the resumed watch's catch-up, not a relist.
    sim.faults().drop_watches();
    let api = sim.api();
    for i in 0..3 {
        api.create(
            nfsprov_kube_sim::resources::Kind::PersistentVolumeClaim,
            "default",
            serde_json::to_value(pvc(&format!("during-{i}"), None, "1Gi")).unwrap(),
            false,
        )
        .unwrap();
    }
    api.delete(
        nfsprov_kube_sim::resources::Kind::PersistentVolumeClaim,
        "default",
        "before-0",
        &Default::default(),
    )
    .unwrap();
    collect_until(&mut rx, &mut log, |l| {
        !applies(l, "during-2").is_empty() && l.contains(&Seen::Delete("before-0".into()))
    })
    .await;
    pvcs.patch(
        "before-1",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();
    collect_until(&mut rx, &mut log, |l| applies(l, "before-1").len() == 2).await;

    assert_eq!(
        log.iter().filter(|s| **s == Seen::Init).count(),
        1,
        "no relist: {log:#?}"
    );
    for name in ["before-0", "before-2", "during-0", "during-1", "during-2"] {
        assert_eq!(applies(&log, name).len(), 1, "{name} seen once: {log:#?}");
    }
    let rvs = applies(&log, "before-1");
    assert_ne!(rvs[0], rvs[1]);
}

#[tokio::test]
async fn compacted_history_gives_410_and_the_watcher_relists() {
    let (sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    create(&pvcs, &pvc("old", None, "1Gi")).await;
    let (reader, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher::watcher(pvcs.clone(), watcher::Config::default()),
    );
    let (tx, mut rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut s = stream.boxed();
        while let Some(ev) = s.next().await {
            let seen = match ev {
                Ok(Event::Init) => Seen::Init,
                Ok(Event::InitDone) => Seen::InitDone,
                Ok(_) => continue,
                Err(e) => Seen::Err(e.to_string()),
            };
            if tx.send(seen).is_err() {
                return;
            }
        }
    });
    let mut log = Vec::new();
    collect_until(&mut rx, &mut log, |l| l.contains(&Seen::InitDone)).await;

    // As above, no await between the drop and the compaction.
    sim.faults().drop_watches();
    let api = sim.api();
    api.create(
        nfsprov_kube_sim::resources::Kind::PersistentVolumeClaim,
        "default",
        serde_json::to_value(pvc("new", None, "1Gi")).unwrap(),
        false,
    )
    .unwrap();
    api.delete(
        nfsprov_kube_sim::resources::Kind::PersistentVolumeClaim,
        "default",
        "old",
        &Default::default(),
    )
    .unwrap();
    sim.compact();

    collect_until(&mut rx, &mut log, |l| {
        l.iter().filter(|s| **s == Seen::InitDone).count() == 2
    })
    .await;
    let err = log.iter().find_map(|s| match s {
        Seen::Err(e) => Some(e.clone()),
        _ => None,
    });
    assert!(
        err.as_deref()
            .is_some_and(|e| e.contains("too old resource version")),
        "{log:#?}"
    );
    let names: Vec<String> = reader
        .state()
        .iter()
        .map(|p| p.metadata.name.clone().unwrap())
        .collect();
    assert_eq!(names, ["new"]);
}

#[tokio::test]
async fn bookmarks_and_streaming_lists() {
    let (sim, client) = start_with(SimOptions {
        bookmark_interval: Duration::from_millis(200),
        ..opts()
    })
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let made = create(&pvcs, &pvc("a", None, "1Gi")).await;
    let rv = made.metadata.resource_version.unwrap();
    let mut raw = pvcs
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();
    let bookmark = tokio::time::timeout(WAIT, async {
        match raw.try_next().await.unwrap() {
            Some(WatchEvent::Bookmark(b)) => b,
            Some(other) => panic!("unexpected {other:?}"),
            None => panic!("watch ended"),
        }
    })
    .await
    .unwrap();
    assert!(
        bookmark.metadata.resource_version.parse::<u64>().unwrap() >= rv.parse::<u64>().unwrap()
    );
    drop(raw);

    // kube-runtime's streaming-list mode: initial state as ADDED events ended by a bookmark
    // annotated k8s.io/initial-events-end.
    let mut rx = spawn_watcher(pvcs.clone(), watcher::Config::default().streaming_lists());
    let mut log = Vec::new();
    collect_until(&mut rx, &mut log, |l| l.contains(&Seen::InitDone)).await;
    assert_eq!(applies(&log, "a").len(), 1, "{log:#?}");
    drop(sim);
}

#[tokio::test]
async fn label_selector_watch_sees_objects_leave_and_enter() {
    let (_sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let mut c = pvc("sel", None, "1Gi");
    c.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
    create(&pvcs, &c).await;
    let mut rx = spawn_watcher(pvcs.clone(), watcher::Config::default().labels("team=a"));
    let mut log = Vec::new();
    collect_until(&mut rx, &mut log, |l| l.contains(&Seen::InitDone)).await;
    pvcs.patch(
        "sel",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "b"}}})),
    )
    .await
    .unwrap();
    collect_until(&mut rx, &mut log, |l| {
        l.contains(&Seen::Delete("sel".into()))
    })
    .await;
    pvcs.patch(
        "sel",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"team": "a"}}})),
    )
    .await
    .unwrap();
    collect_until(&mut rx, &mut log, |l| applies(l, "sel").len() == 2).await;
    pvcs.delete("sel", &DeleteParams::default()).await.unwrap();
    collect_until(&mut rx, &mut log, |l| {
        l.iter()
            .filter(|s| **s == Seen::Delete("sel".into()))
            .count()
            == 2
    })
    .await;
}

#[tokio::test]
async fn unserved_resources_are_404() {
    let (_sim, client) = start_with(opts()).await;
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    let e = status(cms.list(&Default::default()).await);
    assert_eq!(e.code, 404);
    let _: HashMap<(), ()> = HashMap::new();
}

#[tokio::test]
async fn server_ends_watches_at_their_timeout() {
    let (_sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let made = create(&pvcs, &pvc("t", None, "1Gi")).await;
    let rv = made.metadata.resource_version.unwrap();
    let mut raw = pvcs
        .watch(&WatchParams::default().timeout(1).disable_bookmarks(), &rv)
        .await
        .unwrap()
        .boxed();
    let end = tokio::time::timeout(WAIT, raw.try_next())
        .await
        .expect("server closed the watch");
    assert!(matches!(end, Ok(None)), "{end:?}");
}

#[tokio::test]
async fn deleting_a_namespace_removes_its_content() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::PostParams;
    use kube::runtime::wait::conditions::is_deleted;
    let (_sim, client) = start_with(opts()).await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let ns = nss
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "scratch"}})).unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(ns.status.unwrap().phase.as_deref(), Some("Active"));
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "scratch");
    // A finalizer on the content keeps the namespace Terminating until it is removed.
    let mut held = pvc("inside", None, "1Gi");
    held.metadata.finalizers = Some(vec!["example.com/keep".into()]);
    create(&pvcs, &held).await;
    let terminating = nss
        .delete("scratch", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        terminating.status.unwrap().phase.as_deref(),
        Some("Terminating")
    );
    let inside = wait_for(
        pvcs.clone(),
        "inside",
        |c: Option<&PersistentVolumeClaim>| {
            c.is_some_and(|c| c.metadata.deletion_timestamp.is_some())
        },
    )
    .await;
    assert!(inside.metadata.deletion_timestamp.is_some());
    let e = status(
        pvcs.create(&PostParams::default(), &pvc("late", None, "1Gi"))
            .await,
    );
    assert_eq!(e.code, 403);
    pvcs.patch(
        "inside",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    let uid = ns.metadata.uid.unwrap();
    tokio::time::timeout(
        WAIT,
        kube::runtime::wait::await_condition(nss.clone(), "scratch", is_deleted(&uid)),
    )
    .await
    .unwrap()
    .unwrap();
    assert!(status(pvcs.get("inside").await).is_not_found());
}
