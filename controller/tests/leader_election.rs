//! Leader election against the in-repo Kubernetes API simulator: one leader at a time, a
//! leader shutting down releases the Lease, and the standby then takes over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use nfsprov_controller::leader::{LeaseSettings, run_as_leader, run_standing_by};
use nfsprov_test_harness::{Harness, HarnessOptions};
use tokio::sync::{mpsc, watch};

/// Short, so that the standby's next look at the Lease (kube-lease-manager checks a held
/// Lease again when it would expire) comes quickly.
const LEASE_SECONDS: u64 = 4;
const WAIT: Duration = Duration::from_secs(20);

fn settings(identity: &str) -> LeaseSettings {
    LeaseSettings {
        name: "nfsprov-controller".into(),
        namespace: "default".into(),
        identity: identity.into(),
        duration_seconds: LEASE_SECONDS,
    }
}

/// Runs one replica whose "work" reports when it starts and stops.
fn replica(
    client: kube::Client,
    identity: &'static str,
    events: mpsc::UnboundedSender<String>,
) -> (
    watch::Sender<bool>,
    tokio::task::JoinHandle<Result<(), String>>,
) {
    let (stop, stopped) = watch::channel(false);
    let mut work_stop = stopped.clone();
    let task = tokio::spawn(async move {
        run_as_leader(client, &settings(identity), stopped, move || async move {
            let _ = events.send(format!("{identity} leads"));
            let _ = work_stop.wait_for(|s| *s).await;
            let _ = events.send(format!("{identity} stops"));
        })
        .await
        .map_err(|e| e.to_string())
    });
    (stop, task)
}

async fn next(events: &mut mpsc::UnboundedReceiver<String>) -> String {
    tokio::time::timeout(WAIT, events.recv())
        .await
        .expect("event in time")
        .expect("channel open")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leader_and_handover_on_shutdown() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    let (events_tx, mut events) = mpsc::unbounded_channel();

    let (stop_a, task_a) = replica(client.clone(), "a", events_tx.clone());
    assert_eq!(next(&mut events).await, "a leads");
    let (stop_b, task_b) = replica(client.clone(), "b", events_tx.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("a")
    );

    // If b had taken over while a held the lease, "b leads" would come before "a stops".
    stop_a.send(true).unwrap();
    assert_eq!(next(&mut events).await, "a stops");
    tokio::time::timeout(WAIT, task_a)
        .await
        .expect("a finished")
        .unwrap()
        .unwrap();
    // a released the Lease on its way out (b may already hold it).
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_ne!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("a")
    );
    assert_eq!(next(&mut events).await, "b leads");

    stop_b.send(true).unwrap();
    assert_eq!(next(&mut events).await, "b stops");
    tokio::time::timeout(WAIT, task_b)
        .await
        .expect("b finished")
        .unwrap()
        .unwrap();
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
    harness.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_lease_stops_work_at_once() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let (_stop_a, task_a) = replica(client.clone(), "a", events_tx);
    assert_eq!(next(&mut events).await, "a leads");

    // Another holder takes the Lease behind a's back (as after a long pause of a).
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let now = k8s_openapi::jiff::Timestamp::now();
    leases
        .patch(
            "nfsprov-controller",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {
                "holderIdentity": "intruder",
                "leaseDurationSeconds": 600,
                "acquireTime": now.to_string(),
                "renewTime": now.to_string(),
            }})),
        )
        .await
        .unwrap();

    let result = tokio::time::timeout(WAIT, task_a)
        .await
        .expect("a noticed the loss")
        .unwrap();
    assert!(result.unwrap_err().contains("lost the lease"));
    // The work was dropped, not wound down: it never reported stopping.
    assert_eq!(events.recv().await, None);
    harness.finish().await;
}

/// A standby runs its work from the start (its caches fill) but is told it leads only once
/// it holds the lease; stopped while standing by, its work is dropped and it never leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_prepares_before_it_leads() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    let (events_tx, mut events) = mpsc::unbounded_channel();
    let standby = |identity: &'static str, events: mpsc::UnboundedSender<String>| {
        let client = client.clone();
        let (stop, stopped) = watch::channel(false);
        let mut work_stop = stopped.clone();
        let task = tokio::spawn(async move {
            run_standing_by(
                client,
                &settings(identity),
                stopped,
                move |mut leading| async move {
                    let _ = events.send(format!(
                        "{identity} prepares, leading: {}",
                        *leading.borrow()
                    ));
                    if leading.wait_for(|l| *l).await.is_ok() {
                        let _ = events.send(format!("{identity} leads"));
                        let _ = work_stop.wait_for(|s| *s).await;
                        let _ = events.send(format!("{identity} stops"));
                    }
                },
            )
            .await
            .map_err(|e| e.to_string())
        });
        (stop, task)
    };

    let (stop_a, task_a) = standby("a", events_tx.clone());
    // a finds the lease free, so it may already hold it when its work first looks: what
    // must hold is that its work starts, and is then told it leads.
    let first = next(&mut events).await;
    assert!(first.starts_with("a prepares, leading: "), "{first}");
    assert_eq!(next(&mut events).await, "a leads");
    let (stop_b, task_b) = standby("b", events_tx.clone());
    assert_eq!(next(&mut events).await, "b prepares, leading: false");
    // b stands by while a holds the lease, and stops without ever leading.
    stop_b.send(true).unwrap();
    tokio::time::timeout(WAIT, task_b)
        .await
        .expect("b finished")
        .unwrap()
        .unwrap();
    stop_a.send(true).unwrap();
    assert_eq!(next(&mut events).await, "a stops");
    tokio::time::timeout(WAIT, task_a)
        .await
        .expect("a finished")
        .unwrap()
        .unwrap();
    drop(events_tx);
    assert_eq!(events.recv().await, None, "b never led");
    harness.finish().await;
}
