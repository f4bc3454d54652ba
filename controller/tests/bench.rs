//! Benchmarks (ignored by default; they print figures). Run them optimised:
//!
//! ```text
//! cargo test -p nfsprov-controller --release --test bench -- --ignored --nocapture --test-threads=1
//! ```
//!
//! Both start the API simulator in this process and the real `nfsprov-controller` binary as
//! a child process, so the controller's RSS is measured on its own.
//! - `memory`: controller RSS with N PVCs and N PVs (N = 10,000 unless
//!   `NFSPROV_BENCH_OBJECTS` says otherwise) in its caches.
//! - `throughput`: claims provisioned per second when M claims (1,000 unless
//!   `NFSPROV_BENCH_CLAIMS`) are created at once, with the real agent on a temp dir. It
//!   counts PVs created by the controller, not claims Bound (the simulator's binder is
//!   not what is measured here); `nfsprov-provision-bench` counts claims Bound.

use std::collections::HashSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use nfsprov_test_harness::{Harness, HarnessOptions, SimOptions};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn env_count(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts the controller binary against the simulator; kills it when dropped.
struct ControllerProcess {
    child: Child,
    port: u16,
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl ControllerProcess {
    fn start(kubeconfig: &Path, agents_dir: &Path) -> Self {
        let port = free_port();
        let child = Command::new(env!("CARGO_BIN_EXE_nfsprov-controller"))
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--agents-dir={}", agents_dir.display()))
            .arg(format!("--http-addr=127.0.0.1:{port}"))
            .arg("--leader-elect=false")
            .args(
                std::env::var("NFSPROV_BENCH_CONTROLLER_ARGS")
                    .ok()
                    .iter()
                    .flat_map(|a| a.split_whitespace().map(str::to_owned).collect::<Vec<_>>()),
            )
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .spawn()
            .expect("start controller");
        Self { child, port }
    }

    async fn status(&self, path: &str) -> Option<String> {
        let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port))
            .await
            .ok()?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut response = String::new();
        stream.read_to_string(&mut response).await.ok()?;
        Some(response)
    }

    /// Polls /readyz (a benchmark may poll; tests never do).
    async fn wait_ready(&self) -> Duration {
        let started = Instant::now();
        loop {
            if let Some(response) = self.status("/readyz").await
                && response.starts_with("HTTP/1.0 200")
            {
                return started.elapsed();
            }
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "controller never became ready"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// (current RSS, peak RSS) in MiB.
    fn rss_mib(&self) -> (f64, f64) {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
                .unwrap_or(0.0)
                / 1024.0
        };
        (field("VmRSS:"), field("VmHWM:"))
    }
}

async fn create_all<K>(api: &Api<K>, objects: Vec<K>)
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    futures::stream::iter(objects)
        .map(|o| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &o).await }
        })
        .buffer_unordered(64)
        .try_for_each(|_| async { Ok(()) })
        .await
        .unwrap();
}

fn class(name: &str) -> StorageClass {
    serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name},
        "provisioner": "nfsprov.dev/nfs",
        "reclaimPolicy": "Delete",
        "parameters": {"onDelete": "delete"},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn memory() {
    let n = env_count("NFSPROV_BENCH_OBJECTS", 10_000);
    let harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        ..HarnessOptions::simulator(SimOptions {
            binder: false,
            watch_history: n * 3,
            ..SimOptions::default()
        })
    })
    .await;
    let client = harness.client.clone();

    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class("nfs"))
        .await
        .unwrap();
    let claims: Vec<PersistentVolumeClaim> = (0..n)
        .map(|i| {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {
                    "name": format!("data-{i}"), "namespace": "default",
                    "labels": {"app": "bench", "app.kubernetes.io/instance": format!("db-{i}")},
                    "annotations": {
                        "volume.kubernetes.io/storage-provisioner": "nfsprov.dev/nfs",
                        "pv.kubernetes.io/bind-completed": "yes",
                    },
                },
                "spec": {
                    "accessModes": ["ReadWriteMany"], "storageClassName": "nfs",
                    "resources": {"requests": {"storage": "1Gi"}},
                    "volumeName": format!("pvc-bench-{i}"),
                },
            }))
            .unwrap()
        })
        .collect();
    let volumes: Vec<PersistentVolume> = (0..n)
        .map(|i| {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {
                    "name": format!("pvc-bench-{i}"),
                    "annotations": {
                        "pv.kubernetes.io/provisioned-by": "nfsprov.dev/nfs",
                        "nfsprov.dev/agent": "test",
                        "nfsprov.dev/path": format!("default-data-{i}-pvc-bench-{i}"),
                        "nfsprov.dev/on-delete": "delete",
                    },
                    "finalizers": ["external-provisioner.volume.kubernetes.io/finalizer"],
                },
                "spec": {
                    "accessModes": ["ReadWriteMany"], "capacity": {"storage": "1Gi"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                        "namespace": "default", "name": format!("data-{i}"), "uid": format!("uid-{i}")},
                    "nfs": {"server": "nfs1.example", "path": format!("/srv/nfs/default-data-{i}-pvc-bench-{i}")},
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "nfs",
                },
            }))
            .unwrap()
        })
        .collect();
    let started = Instant::now();
    create_all(&Api::namespaced(client.clone(), "default"), claims).await;
    create_all(&Api::all(client.clone()), volumes).await;
    println!("created {n} PVCs and {n} PVs in {:.1?}", started.elapsed());

    let controller = ControllerProcess::start(&harness.kubeconfig(), &harness.agents_dir());
    let took = controller.wait_ready().await;
    let mut peak: f64 = 0.0;
    let mut current = 0.0;
    // Let the first full reconcile of every object run, sampling as it goes.
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let (rss, hwm) = controller.rss_mib();
        current = rss;
        peak = peak.max(hwm);
    }
    println!(
        "BENCH memory: {n} PVCs + {n} PVs cached; ready after {took:.1?}; RSS {current:.1} MiB, peak {peak:.1} MiB (target <= 64 MiB)"
    );
    drop(controller);
    harness.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark"]
async fn throughput() {
    let m = env_count("NFSPROV_BENCH_CLAIMS", 1_000);
    let harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        ..HarnessOptions::simulator(SimOptions {
            watch_history: m * 20,
            ..SimOptions::default()
        })
    })
    .await;
    let client = harness.client.clone();
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class("nfs"))
        .await
        .unwrap();
    let controller = ControllerProcess::start(&harness.kubeconfig(), &harness.agents_dir());
    controller.wait_ready().await;

    // Count PVs as they appear (a watch: no polling).
    let pv_api: Api<PersistentVolume> = Api::all(client.clone());
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel();
    let counter = tokio::spawn(async move {
        let mut names = HashSet::new();
        let mut stream = watcher(pv_api, watcher::Config::default())
            .applied_objects()
            .boxed();
        while let Some(Ok(pv)) = stream.next().await {
            if let Some(name) = pv.metadata.name
                && names.insert(name)
            {
                let _ = seen_tx.send(names.len());
            }
        }
    });
    let claims: Vec<PersistentVolumeClaim> = (0..m)
        .map(|i| {
            serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": format!("claim-{i}"), "namespace": "default"},
                "spec": {
                    "accessModes": ["ReadWriteMany"], "storageClassName": "nfs",
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }))
            .unwrap()
        })
        .collect();
    let started = Instant::now();
    create_all(&Api::namespaced(client.clone(), "default"), claims).await;
    let created = started.elapsed();
    let deadline = Duration::from_secs(600);
    loop {
        let count = tokio::time::timeout(deadline, seen_rx.recv())
            .await
            .expect("PVs keep appearing")
            .expect("watch open");
        if count >= m {
            break;
        }
    }
    let took = started.elapsed();
    counter.abort();
    let dirs = std::fs::read_dir(harness.agents[0].root())
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("default-claim-"))
        })
        .count();
    let (rss, hwm) = controller.rss_mib();
    println!(
        "BENCH throughput: {m} claims created in {created:.2?}, all {m} PVs created after {took:.2?}: {:.0} PVs created/s (target >= 100); {dirs} directories on disk; controller RSS {rss:.1} MiB, peak {hwm:.1} MiB",
        m as f64 / took.as_secs_f64()
    );
    assert_eq!(dirs, m);
    drop(controller);
    harness.finish().await;
}
