//! Fault injection and restarts, through the library API and the HTTP admin endpoint.

mod common;

use std::time::{Duration, Instant};

use common::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};
use nfsprov_kube_sim::{InjectedError, SimOptions};
use tokio::sync::mpsc;

fn opts() -> SimOptions {
    SimOptions {
        binder: false,
        ..SimOptions::default()
    }
}

#[tokio::test]
async fn error_rate_fails_some_calls_and_clear_restores() {
    let (sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    create(&pvcs, &pvc("x", None, "1Gi")).await;

    sim.faults().set_error_rate(1.0, InjectedError::Internal);
    let e = status(pvcs.get("x").await);
    assert_eq!((e.code, e.reason.as_str()), (500, "InternalError"));

    sim.faults().set_error_rate(0.5, InjectedError::Internal);
    let mut ok = 0;
    let mut failed = 0;
    for _ in 0..40 {
        match pvcs.get("x").await {
            Ok(_) => ok += 1,
            Err(kube::Error::Api(s)) if s.code == 500 => failed += 1,
            Err(e) => panic!("unexpected {e:?}"),
        }
    }
    assert!(ok > 0 && failed > 0, "ok={ok} failed={failed}");

    // 429 with Retry-After: kube's default client retries, so calls still succeed.
    sim.faults().set_error_rate(
        0.3,
        InjectedError::TooManyRequests {
            retry_after_secs: 1,
        },
    );
    // Calls go on until a 429 has been served (a fixed count of calls at a rate of 0.3
    // would see none now and then); each one must still succeed through the retry.
    let before = sim.faults().injected_errors();
    let mut calls = 0;
    while sim.faults().injected_errors() == before {
        pvcs.get("x").await.expect("retried through 429");
        calls += 1;
        assert!(
            calls < 200,
            "no 429 served in {calls} calls at a rate of 0.3"
        );
    }

    sim.faults().clear();
    for _ in 0..20 {
        pvcs.get("x").await.expect("no faults after clear");
    }
}

#[tokio::test]
async fn latency_delays_requests() {
    let (sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    sim.faults().set_latency(Duration::from_millis(300));
    let t = Instant::now();
    pvcs.list(&ListParams::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    sim.faults().clear();
}

#[tokio::test]
async fn admin_endpoint_switches_faults() {
    let (_sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let req = http::Request::post("/_sim/faults")
        .header("content-type", "application/json")
        .body(br#"{"error_rate": 1.0, "error_code": 500}"#.to_vec())
        .unwrap();
    client.request_text(req).await.unwrap();
    assert_eq!(status(pvcs.list(&ListParams::default()).await).code, 500);
    let req = http::Request::delete("/_sim/faults")
        .body(Vec::new())
        .unwrap();
    client.request_text(req).await.unwrap();
    pvcs.list(&ListParams::default()).await.unwrap();
}

#[tokio::test]
async fn restart_keeps_state_and_watchers_resume() {
    let (mut sim, client) = start_with(opts()).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let a = create(&pvcs, &pvc("a", None, "1Gi")).await;

    let (tx, mut rx) = mpsc::unbounded_channel();
    let w = pvcs.clone();
    tokio::spawn(async move {
        let mut s = watcher::watcher(w, watcher::Config::default()).boxed();
        while let Some(ev) = s.next().await {
            let _ = tx.send(ev.map_err(|e| e.to_string()));
        }
    });
    let mut inits = 0;
    seen(&mut rx, &mut inits, "a").await;

    let url = sim.url();
    sim.restart().await;
    assert_eq!(sim.url(), url, "same address after restart");
    let again = pvcs.get("a").await.expect("state kept");
    assert_eq!(again.metadata.uid, a.metadata.uid);
    let b = create(&pvcs, &pvc("b", None, "1Gi")).await;
    let rv = |o: &PersistentVolumeClaim| {
        o.metadata
            .resource_version
            .clone()
            .unwrap()
            .parse::<u64>()
            .unwrap()
    };
    assert!(rv(&b) > rv(&a), "resourceVersions keep increasing");
    seen(&mut rx, &mut inits, "b").await;
    assert_eq!(inits, 1, "resumed from its resourceVersion, no relist");
    sim.shutdown().await;
}

type Events = mpsc::UnboundedReceiver<Result<Event<PersistentVolumeClaim>, String>>;

/// Wait until the watcher reports `name`, counting relists (Init) on the way.
async fn seen(rx: &mut Events, inits: &mut usize, name: &str) {
    let fut = async {
        while let Some(ev) = rx.recv().await {
            match ev {
                Ok(Event::Init) => *inits += 1,
                Ok(Event::Apply(o) | Event::InitApply(o))
                    if o.metadata.name.as_deref() == Some(name) =>
                {
                    return;
                }
                _ => {}
            }
        }
        panic!("watcher ended");
    };
    tokio::time::timeout(WAIT, fut)
        .await
        .unwrap_or_else(|_| panic!("watcher never reported {name}"));
}
