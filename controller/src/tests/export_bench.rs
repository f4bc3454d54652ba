//! Benchmark (ignored by default; it prints figures): how long the controller takes to
//! bring N exports (10,000 unless `NFSPROV_BENCH_EXPORTS` says otherwise) of a `nodes`
//! class in step when a Node joins, against `MockAgent` (a mock agent over real HTTPS,
//! answering from memory: the figure is the controller's side, the agent's own is its
//! export manager's bench). Run it optimised:
//!
//! ```text
//! cargo test -p nfsprov-controller --release --lib export_bench -- --ignored --nocapture
//! ```

use std::time::Instant;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher::Event;
use nfsprov_api_types::{
    CreateVolumeRequest, ExportClient, ExportManager, ExportRequest, Mode, QuotaPolicy, VolumeOwner,
};
use serde_json::json;

use crate::exports::{CONCURRENT_REQUESTS, Reconciler};
use crate::mounters::{MountingPod, NodeAddresses};
use crate::objects::{ANN_AGENT, ANN_PATH, ANN_PROVISIONED_BY};
use crate::tests::builders::{PROVISIONER, class};
use crate::tests::mock_agent::MockAgent;
use crate::tests::mock_api::context_with_volume_writer;

fn node(name: &str, address: &str) -> NodeAddresses {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: prints figures"]
async fn export_bench_a_node_change_reaches_every_export() {
    let count: usize = std::env::var("NFSPROV_BENCH_EXPORTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000);
    let agent = MockAgent::start("nfs1").await;
    agent.manage_exports(ExportManager::Ganesha);
    let first: ExportClient = "10.0.0.2".parse().unwrap();
    let mut volumes = Vec::with_capacity(count);
    for i in 0..count {
        let path = format!("team/v{i}");
        agent.insert_volume(
            &path,
            CreateVolumeRequest {
                mode: Mode::DEFAULT,
                uid: None,
                gid: None,
                capacity_bytes: 1 << 30,
                owner: VolumeOwner::default(),
                quota: QuotaPolicy::Off,
                export: Some(ExportRequest {
                    clients: vec![first],
                    ..ExportRequest::default()
                }),
            },
        );
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": format!("pvc-{i}"), "annotations": {
                ANN_PROVISIONED_BY: PROVISIONER, ANN_AGENT: "nfs1", ANN_PATH: path,
            }},
            "spec": {
                "storageClassName": "nfs",
                "claimRef": {"namespace": "team", "name": format!("v{i}")},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap();
        volumes.push(pv);
    }
    let (ctx, _api, _volumes) = context_with_volume_writer(
        agent.registry(),
        vec![class("nfs", &[("exportClients", "nodes")])],
        volumes,
    );
    let (mut nodes, mut pods) = ctx.mounters.take_writers().unwrap();
    for event in [
        Event::Init,
        Event::InitApply(node("a", "10.0.0.2")),
        Event::InitDone,
    ] {
        nodes.apply_watcher_event(&event);
    }
    for event in [Event::<MountingPod>::Init, Event::InitDone] {
        pods.apply_watcher_event(&event);
    }
    let reconciler = Reconciler::new(&ctx);

    let started = Instant::now();
    reconciler.sync(true).await;
    let first_look = started.elapsed();
    let started = Instant::now();
    reconciler.sync(false).await;
    let idle_look = started.elapsed();
    let started = Instant::now();
    reconciler.sync(true).await;
    let unchanged_cluster = started.elapsed();
    assert!(
        !agent.calls().iter().any(|c| c.starts_with("PUT export")),
        "nothing to change yet"
    );

    nodes.apply_watcher_event(&Event::Apply(node("b", "10.0.0.3")));
    let started = Instant::now();
    reconciler.sync(true).await;
    let node_change = started.elapsed();
    let second: ExportClient = "10.0.0.3".parse().unwrap();
    let behind = (0..count)
        .filter(|i| {
            let clients = agent.export(&format!("team/v{i}")).unwrap().clients;
            !(clients.contains(&first) && clients.contains(&second))
        })
        .count();
    assert_eq!(behind, 0, "every export admits the new node after one look");

    let per_second = |took: std::time::Duration| count as f64 / took.as_secs_f64();
    println!("exports of a nodes class: {count}, agent requests {CONCURRENT_REQUESTS} at a time");
    println!(
        "first look (reads every export):     {:>8.3} s ({:.0} exports/s)",
        first_look.as_secs_f64(),
        per_second(first_look)
    );
    println!(
        "look with nothing new:               {:>8.3} ms",
        idle_look.as_secs_f64() * 1e3
    );
    println!(
        "look after a change that moves none: {:>8.3} ms",
        unchanged_cluster.as_secs_f64() * 1e3
    );
    println!(
        "a node joins, every export updated:  {:>8.3} s ({:.0} exports/s)",
        node_change.as_secs_f64(),
        per_second(node_change)
    );
}
