//! kube-lease-manager (the controller's leader election) against the simulator: it must
//! work at all (creates, server-side apply, strategic patches) and hand over leadership.

mod common;

use common::*;
use kube_lease_manager::LeaseManagerBuilder;
use nfsprov_kube_sim::SimOptions;
use tokio::sync::watch;

async fn until_leader(rx: &mut watch::Receiver<bool>) {
    tokio::time::timeout(WAIT, rx.wait_for(|l| *l))
        .await
        .expect("became leader in time")
        .expect("lease manager running");
}

#[tokio::test]
async fn one_leader_at_a_time_and_handover() {
    let (_sim, client) = start_with(SimOptions {
        binder: false,
        ..SimOptions::default()
    })
    .await;
    let manager = |id: &str| {
        LeaseManagerBuilder::new(client.clone(), "nfsprov-leader")
            .with_namespace("default")
            .with_identity(id)
            .with_duration(3)
            .with_grace(1)
            .build()
    };
    let (mut a, a_task) = manager("a").await.unwrap().watch().await;
    until_leader(&mut a).await;
    let (mut b, b_task) = manager("b").await.unwrap().watch().await;
    // b keeps trying while a renews; over more than a lease duration it must not get it.
    let b_leads = tokio::time::timeout(std::time::Duration::from_secs(4), b.wait_for(|l| *l))
        .await
        .is_ok();
    assert!(!b_leads, "b took the lease while a held it");
    assert!(*a.borrow(), "a still leads");

    // a stops (its channel closes, it releases); b takes over.
    drop(a);
    let _ = a_task.await;
    until_leader(&mut b).await;
    drop(b);
    let _ = b_task.await;
}
