//! Measures the simulator's own throughput, so it is known not to be the bottleneck of
//! controller benchmarks: a burst of creates at fixed concurrency through a stock kube
//! client, then lists at 20,000 objects (whole and in the watcher's 500-object pages).

use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, ListParams, PostParams};
use nfsprov_kube_sim::resources::Kind;
use nfsprov_kube_sim::{SimOptions, Simulator};
use serde_json::json;

const BURST: usize = 1_000;
const CONCURRENCY: usize = 32;
const TOTAL: usize = 20_000;

fn claim(name: &str) -> serde_json::Value {
    json!({
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name, "labels": {"bench": "yes"}},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": "nfs",
            "resources": {"requests": {"storage": "1Gi"}}
        }
    })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let sim = Simulator::start(SimOptions::default()).await?;
    let client = sim.client().await;
    // A class with an external provisioner, so the binder does its real per-claim work
    // (provisioner annotations and an ExternalProvisioning event) during the run.
    sim.api()
        .create(
            Kind::StorageClass,
            "",
            json!({
                "apiVersion": "storage.k8s.io/v1",
                "kind": "StorageClass",
                "metadata": {"name": "nfs"},
                "provisioner": "nfsprov.example.com/nfs"
            }),
            false,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");

    // A watcher running during the burst, as a controller's would be.
    let watch_api = pvcs.clone();
    let watching = tokio::spawn(async move {
        let mut s = kube::runtime::watcher(watch_api, Default::default()).boxed();
        let mut n = 0usize;
        while let Some(ev) = s.next().await {
            // Count claims the binder has annotated: the end of the pipeline.
            if let Ok(kube::runtime::watcher::Event::Apply(c)) = ev
                && c.metadata
                    .annotations
                    .as_ref()
                    .is_some_and(|a| a.contains_key("volume.kubernetes.io/storage-provisioner"))
            {
                n += 1;
                if n >= BURST {
                    return n;
                }
            }
        }
        n
    });

    let objects: Arc<Vec<PersistentVolumeClaim>> = Arc::new(
        (0..BURST)
            .map(|i| serde_json::from_value(claim(&format!("burst-{i:05}"))))
            .collect::<Result<_, _>>()?,
    );
    let t = Instant::now();
    let results: Vec<Result<PersistentVolumeClaim, kube::Error>> = futures::stream::iter(0..BURST)
        .map(|i| {
            let pvcs = pvcs.clone();
            let objects = objects.clone();
            async move { pvcs.create(&PostParams::default(), &objects[i]).await }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let burst = t.elapsed();
    let failed = results.iter().filter(|r| r.is_err()).count();
    anyhow::ensure!(failed == 0, "{failed} creates failed");
    let seen = tokio::time::timeout(std::time::Duration::from_secs(60), watching).await??;
    let watch_done = t.elapsed();
    println!(
        "burst: {BURST} creates at concurrency {CONCURRENCY} in {:.3} s = {:.0} creates/s; a watcher saw all {seen} annotated by the binder after {:.3} s",
        burst.as_secs_f64(),
        BURST as f64 / burst.as_secs_f64(),
        watch_done.as_secs_f64()
    );

    // Fill up to 20,000 directly (the HTTP path was measured above).
    let api = sim.api();
    let t = Instant::now();
    for i in BURST..TOTAL {
        api.create(
            Kind::PersistentVolumeClaim,
            "default",
            claim(&format!("fill-{i:05}")),
            false,
        )
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    println!(
        "fill: {} in-process creates in {:.3} s",
        TOTAL - BURST,
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let all = pvcs.list(&ListParams::default()).await?;
    println!(
        "list: {} objects in one response in {:.3} s",
        all.items.len(),
        t.elapsed().as_secs_f64()
    );
    anyhow::ensure!(
        all.items.len() == TOTAL,
        "list returned {}",
        all.items.len()
    );

    let t = Instant::now();
    let mut count = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = pvcs.list(&lp).await?;
        count += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    println!(
        "paged list: {count} objects in pages of 500 in {:.3} s",
        t.elapsed().as_secs_f64()
    );

    let t = Instant::now();
    let sel = pvcs
        .list(&ListParams::default().fields("metadata.name=fill-19999"))
        .await?;
    println!(
        "field-selected list over {TOTAL}: {} object in {:.3} s",
        sel.items.len(),
        t.elapsed().as_secs_f64()
    );
    sim.shutdown().await;
    Ok(())
}
