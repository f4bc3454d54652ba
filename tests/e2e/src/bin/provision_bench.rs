//! Provisioning benchmark of the whole system: N claims created at once against the API
//! under test (the simulator, or the cluster of `E2E_KUBECONFIG`), with the real
//! controller and agent processes. Prints figures; asserts nothing.
//!
//! cargo build --release --locked --workspace --bins &&
//!   target/release/nfsprov-provision-bench --claims 1000

use std::time::{Duration, Instant};

use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{DeleteParams, ListParams, PostParams};
use nfsprov_e2e::system::{NAMESPACE, System};
use serde_json::json;

#[derive(Debug, Parser)]
#[command(about = "Measure claims bound per second and deletion time through the whole system")]
struct Args {
    /// Claims created at once.
    #[arg(long, default_value_t = 1000)]
    claims: usize,
    /// API requests the benchmark itself keeps in flight while creating and deleting.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 600)]
    timeout_seconds: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let limit = Duration::from_secs(args.timeout_seconds);
    let system = System::start(&["bench"], 1, &["--leader-elect=false"]).await?;
    system
        .class("bench", json!({"agent": "bench", "onDelete": "delete"}))
        .await?;
    let claims = system.claims();
    let names: Vec<String> = (0..args.claims).map(|i| format!("bench-{i}")).collect();

    let started = Instant::now();
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let claims = claims.clone();
            async move {
                let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                    "metadata": {"name": name, "namespace": NAMESPACE},
                    "spec": {
                        "storageClassName": "bench",
                        "accessModes": ["ReadWriteMany"],
                        "resources": {"requests": {"storage": "1Gi"}},
                    },
                }))?;
                claims.create(&PostParams::default(), &claim).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let created = started.elapsed();
    wait_until(limit, "all claims Bound", || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        (bound == args.claims).then_some(())
    })
    .await?;
    let bound = started.elapsed();

    let deleting = Instant::now();
    futures::stream::iter(names.iter().cloned())
        .map(|name| {
            let claims = claims.clone();
            async move {
                claims
                    .delete(&name, &DeleteParams::default())
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    let volumes = system.volumes();
    wait_until(limit, "all PVs gone", || async {
        let list = volumes.list(&ListParams::default()).await.ok()?;
        list.items.is_empty().then_some(())
    })
    .await?;
    let gone = deleting.elapsed();

    let rss = system.controllers[0].peak_rss_bytes().unwrap_or(0);
    println!("count: {}", args.claims);
    println!("created in: {:.2}s", created.as_secs_f64());
    println!("all Bound after: {:.2}s", bound.as_secs_f64());
    println!(
        "claims bound per second: {:.0}",
        args.claims as f64 / bound.as_secs_f64()
    );
    println!(
        "all PVs gone after deleting the claims: {:.2}s",
        gone.as_secs_f64()
    );
    println!(
        "controller peak RSS: {:.1} MiB",
        rss as f64 / (1024.0 * 1024.0)
    );
    Ok(())
}

/// Polls `check` every 100 ms until it yields a value or `limit` passes.
async fn wait_until<F, Fut>(limit: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + limit;
    while check().await.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}
