//! Provisioning benchmark of the whole system: N claims created at once against the API
//! under test (the simulator, or the cluster of `E2E_KUBECONFIG`), with the real
//! controller and agent processes. It counts claims the API reports **Bound** (not PVs
//! created) and PVs gone after their claims are deleted, and reads the controller's
//! memory when all are Bound, again after `--settle-seconds`, and at its peak. With
//! `--baseline` it first measures the control plane alone in the same run: N claims
//! bound by the PV binder to N pre-made PVs, no provisioner involved. Prints figures;
//! asserts nothing.
//!
//! With `--restart-at-peak` the controller is killed (SIGKILL, as an out-of-memory kill)
//! once every claim is created, when the most claims are pending, and started again: the
//! time until it answers `/readyz` and its memory after are printed. `--sample-seconds`
//! prints the controller's RSS and peak through the whole run; `--wait-for provisioned`
//! stops waiting once every claim has its PV (the binder may take far longer to bind
//! tens of thousands), and `--keep` leaves the claims for the control plane's wipe.
//!
//! On the real API server (its rate limits raised, release binaries):
//!   tests/real-api --bench --claims 500 --baseline
//!   tests/real-api --bench --claims 50000 --restart-at-peak --sample-seconds 10 \
//!     --wait-for provisioned --keep
//! On the simulator:
//!   cargo build --release --locked --workspace --bins &&
//!     target/release/nfsprov-provision-bench --claims 1000

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use nfsprov_e2e::system::System;
use serde_json::json;

#[derive(Debug, Parser)]
#[command(
    about = "Measure claims Bound per second, PVs deleted per second and the controller's memory through the whole system"
)]
struct Args {
    /// Claims created at once.
    #[arg(long, default_value_t = 500)]
    claims: usize,
    /// API requests the benchmark itself keeps in flight while creating and deleting.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Give up waiting after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_seconds: u64,
    /// First measure the control plane alone: as many claims bound to pre-made PVs.
    #[arg(long)]
    baseline: bool,
    /// Seconds to let the controller run (usage measuring included) after all claims
    /// are Bound before reading its memory again.
    #[arg(long, default_value_t = 0)]
    settle_seconds: u64,
    /// What "done" is: every claim Bound, or every claim with its PV.
    #[arg(long, value_enum, default_value_t = WaitFor::Bound)]
    wait_for: WaitFor,
    /// Kill and restart the controller once all claims are created.
    #[arg(long)]
    restart_at_peak: bool,
    /// Print the controller's RSS this often (0: never).
    #[arg(long, default_value_t = 0)]
    sample_seconds: u64,
    /// Leave the claims and PVs in place (no deletion phase).
    #[arg(long)]
    keep: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum WaitFor {
    Bound,
    Provisioned,
}

const MIB: f64 = 1024.0 * 1024.0;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let limit = Duration::from_secs(args.timeout_seconds);
    let mut system = System::start(&["bench"], 1, &["--leader-elect=false"]).await?;
    println!(
        "API server: {}",
        if system.api.is_shared() {
            "real (E2E_KUBECONFIG)"
        } else {
            "simulator"
        }
    );
    println!("claims: {}", args.claims);

    if args.baseline {
        let seconds = bare_binding(&system, &args, limit).await?;
        println!(
            "control plane alone (pre-made PVs, no provisioner): all Bound after {seconds:.2}s, {:.1} claims/s",
            args.claims as f64 / seconds
        );
    }

    system
        .class("bench", json!({"agent": "bench", "onDelete": "delete"}))
        .await?;
    let claims = system.claims();
    let names: Vec<String> = (0..args.claims).map(|i| format!("bench-{i}")).collect();
    let class = system.names.class("bench");
    let pid = Arc::new(AtomicU32::new(system.controllers[0].pid().unwrap_or(0)));
    let sampler = (args.sample_seconds > 0).then(|| {
        tokio::spawn(sample(
            pid.clone(),
            Duration::from_secs(args.sample_seconds),
        ))
    });
    let started = Instant::now();
    create_all(
        &args,
        names.iter().cloned(),
        |name| {
            json!({
                "metadata": {"name": name, "namespace": system.names.namespace},
                "spec": {
                    "storageClassName": class,
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            })
        },
        &claims,
    )
    .await?;
    let created = started.elapsed();
    println!("provisioner: created in {:.2}s", created.as_secs_f64());
    let provisioner = system.names.provisioner.clone();
    let (pvs, bound) = progress(&system, &provisioner).await?;
    println!(
        "all claims created: {pvs} PVs, {} claims pending; controller RSS {:.1} MiB, peak {:.1} MiB",
        args.claims.saturating_sub(bound),
        system.controllers[0].rss_bytes().unwrap_or(0) as f64 / MIB,
        system.controllers[0].peak_rss_bytes().unwrap_or(0) as f64 / MIB
    );
    if args.restart_at_peak {
        let restarting = Instant::now();
        system
            .restart_controller(0, &["--leader-elect=false"], limit)
            .await?;
        let ready = restarting.elapsed();
        pid.store(system.controllers[0].pid().unwrap_or(0), Ordering::SeqCst);
        let controller = &system.controllers[0];
        println!(
            "restart (SIGKILL) at {pvs} PVs, {} claims pending: /readyz 200 after {:.2}s, RSS then {:.1} MiB, peak {:.1} MiB",
            args.claims.saturating_sub(bound),
            ready.as_secs_f64(),
            controller.rss_bytes().unwrap_or(0) as f64 / MIB,
            controller.peak_rss_bytes().unwrap_or(0) as f64 / MIB
        );
    }
    match args.wait_for {
        WaitFor::Bound => wait_until_bound(&claims, args.claims, limit).await?,
        WaitFor::Provisioned => {
            wait_until_provisioned(&system, &provisioner, args.claims, limit).await?
        }
    }
    let done = started.elapsed();
    let controller = &system.controllers[0];
    let rss_done = controller.rss_bytes().unwrap_or(0);
    let what = match args.wait_for {
        WaitFor::Bound => "all Bound",
        WaitFor::Provisioned => "every claim has its PV",
    };
    println!(
        "provisioner: {what} after {:.2}s, {:.1} claims/s",
        done.as_secs_f64(),
        args.claims as f64 / done.as_secs_f64()
    );
    println!(
        "controller RSS when {what}: {:.1} MiB",
        rss_done as f64 / MIB
    );
    if args.settle_seconds > 0 {
        // A measurement interval, not a synchronisation: the controller keeps working
        // (resync, usage poll) while nothing changes.
        tokio::time::sleep(Duration::from_secs(args.settle_seconds)).await;
        println!(
            "controller RSS {} s later: {:.1} MiB",
            args.settle_seconds,
            controller.rss_bytes().unwrap_or(0) as f64 / MIB
        );
    }
    println!(
        "controller peak RSS so far: {:.1} MiB",
        controller.peak_rss_bytes().unwrap_or(0) as f64 / MIB
    );
    if args.keep {
        if let Some(sampler) = sampler {
            sampler.abort();
        }
        // Not removed one by one (two requests per PV): the control plane is wiped whole.
        system.names.run = None;
        return Ok(());
    }

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
    wait_until(
        limit,
        poll_interval(args.claims),
        "all PVs gone",
        || async {
            let list = volumes.list(&ListParams::default()).await.ok()?;
            // On a shared cluster other PVs may exist: only this run's count.
            let ours = list.items.iter().filter(|pv| {
                pv.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
                    == Some(&provisioner)
            });
            (ours.count() == 0).then_some(())
        },
    )
    .await?;
    let gone = deleting.elapsed();
    println!(
        "provisioner: all PVs gone {:.2}s after the claims' deletion, {:.1} PVs/s",
        gone.as_secs_f64(),
        args.claims as f64 / gone.as_secs_f64()
    );
    println!(
        "controller peak RSS: {:.1} MiB",
        controller.peak_rss_bytes().unwrap_or(0) as f64 / MIB
    );
    if let Some(sampler) = sampler {
        sampler.abort();
    }
    Ok(())
}

/// Prints the RSS and peak of the process `pid` names every `every`, from the start.
async fn sample(pid: Arc<AtomicU32>, every: Duration) {
    let started = Instant::now();
    let mut interval = tokio::time::interval(every);
    loop {
        interval.tick().await;
        let pid = pid.load(Ordering::SeqCst);
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|kib| kib.parse::<f64>().ok())
                .map_or(0.0, |kib| kib / 1024.0)
        };
        println!(
            "[{:>5}s] controller {pid}: RSS {:.1} MiB, peak {:.1} MiB",
            started.elapsed().as_secs(),
            field("VmRSS:"),
            field("VmHWM:")
        );
    }
}

/// PVs of this run's provisioner and claims whose binding is complete, from metadata
/// lists in pages (whole lists of 50,000 objects are work for the API server too).
async fn progress(system: &System, provisioner: &str) -> anyhow::Result<(usize, usize)> {
    let ours = |meta: &ObjectMeta| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
            .is_some_and(|p| p == provisioner)
    };
    let bound = |meta: &ObjectMeta| {
        meta.annotations
            .as_ref()
            .and_then(|a| a.get("pv.kubernetes.io/bind-completed"))
            .is_some()
    };
    let pvs = count_metadata(&system.volumes(), ours).await?;
    let claims = count_metadata(&system.claims(), bound).await?;
    Ok((pvs, claims))
}

async fn count_metadata<K>(
    api: &Api<K>,
    keep: impl Fn(&ObjectMeta) -> bool,
) -> anyhow::Result<usize>
where
    K: kube::Resource + Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let mut params = ListParams::default().limit(5000);
    let mut count = 0;
    loop {
        let page = api.list_metadata(&params).await?;
        count += page.items.iter().filter(|o| keep(&o.metadata)).count();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(next) => params = params.continue_token(&next),
            None => return Ok(count),
        }
    }
}

/// Waits until `count` PVs of `provisioner` exist, printing the progress.
async fn wait_until_provisioned(
    system: &System,
    provisioner: &str,
    count: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    let started = Instant::now();
    wait_until(limit, poll_interval(count), "every claim's PV", || async {
        let (pvs, bound) = progress(system, provisioner).await.ok()?;
        println!(
            "[{:>5}s] {pvs} PVs, {bound} claims bound",
            started.elapsed().as_secs()
        );
        (pvs >= count).then_some(())
    })
    .await
}

/// The PV binder alone: PVs made for claims by name, then the claims; seconds until all
/// are Bound. Both are removed afterwards (the PVs keep their data: Retain).
async fn bare_binding(system: &System, args: &Args, limit: Duration) -> anyhow::Result<f64> {
    let namespace = system.names.namespace.clone();
    let run = system.names.run.clone().unwrap_or_else(|| "sim".into());
    let claims = system.claims();
    let volumes: Api<PersistentVolume> = system.volumes();
    let pv_names: Vec<String> = (0..args.claims)
        .map(|i| format!("bench-static-{run}-{i}"))
        .collect();
    let started = Instant::now();
    futures::stream::iter(pv_names.iter().enumerate())
        .map(|(i, name)| {
            let volumes = volumes.clone();
            let namespace = namespace.clone();
            async move {
                let volume: PersistentVolume = serde_json::from_value(json!({
                    "metadata": {"name": name},
                    "spec": {
                        "capacity": {"storage": "1Gi"},
                        "accessModes": ["ReadWriteMany"],
                        "persistentVolumeReclaimPolicy": "Retain",
                        "storageClassName": "",
                        "nfs": {"server": "127.0.0.1", "path": format!("/static/{i}")},
                        "claimRef": {"namespace": namespace, "name": format!("static-{i}")},
                    },
                }))?;
                volumes.create(&PostParams::default(), &volume).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    create_all(
        args,
        (0..args.claims).map(|i| format!("static-{i}")),
        |name| {
            json!({
                "metadata": {"name": name, "namespace": namespace},
                "spec": {
                    "storageClassName": "",
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            })
        },
        &claims,
    )
    .await?;
    wait_until_bound(&claims, args.claims, limit).await?;
    let seconds = started.elapsed().as_secs_f64();
    claims
        .delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    for name in &pv_names {
        volumes.delete(name, &DeleteParams::default()).await?;
    }
    // The provisioner's phase counts its own claims only: wait for these to be gone.
    wait_until(
        limit,
        poll_interval(args.claims),
        "the static claims gone",
        || async {
            let list = claims.list(&ListParams::default()).await.ok()?;
            list.items.is_empty().then_some(())
        },
    )
    .await?;
    Ok(seconds)
}

/// Creates one claim per name, `concurrency` at a time.
async fn create_all(
    args: &Args,
    names: impl Iterator<Item = String>,
    manifest: impl Fn(&str) -> serde_json::Value,
    claims: &Api<PersistentVolumeClaim>,
) -> anyhow::Result<()> {
    let manifests: Vec<serde_json::Value> = names.map(|n| manifest(&n)).collect();
    futures::stream::iter(manifests)
        .map(|manifest| {
            let claims = claims.clone();
            async move {
                let claim: PersistentVolumeClaim = serde_json::from_value(manifest)?;
                claims.create(&PostParams::default(), &claim).await?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(args.concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Waits until `count` claims of the namespace are Bound.
async fn wait_until_bound(
    claims: &Api<PersistentVolumeClaim>,
    count: usize,
    limit: Duration,
) -> anyhow::Result<()> {
    wait_until(limit, poll_interval(count), "all claims Bound", || async {
        let list = claims.list(&ListParams::default()).await.ok()?;
        let bound = list
            .items
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count();
        (bound == count).then_some(())
    })
    .await
}

/// Listing thousands of claims is work for the API server too: poll larger runs less often.
fn poll_interval(count: usize) -> Duration {
    Duration::from_millis((count as u64 / 5).clamp(100, 10_000))
}

/// Polls `check` every `every` until it yields a value or `limit` passes.
async fn wait_until<F, Fut>(
    limit: Duration,
    every: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<()>>,
{
    let deadline = Instant::now() + limit;
    while check().await.is_none() {
        anyhow::ensure!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(every).await;
    }
    Ok(())
}
