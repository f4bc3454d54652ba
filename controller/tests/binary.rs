//! The `nfsprov-controller` binary as deployed (leader election on) against the API
//! simulator and the real agent: it takes the Lease, provisions a claim, and on SIGTERM
//! exits cleanly and releases the Lease.

use std::process::{Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_test_harness::{Harness, HarnessOptions};
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Kills the child if the test fails before it exits by itself.
struct Running(Option<std::process::Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binary_leads_provisions_and_hands_back_the_lease_on_sigterm() {
    let harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        ..HarnessOptions::default()
    })
    .await;
    let client = harness.client.clone();
    let root = harness.agents[0].root();
    let (mut running, _) = replica_1(&harness);

    let claims = class_and_claim(&client).await;
    let bound = tokio::time::timeout(
        WAIT,
        await_condition(claims, "data", |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        }),
    )
    .await
    .expect("claim bound in time")
    .unwrap()
    .unwrap();
    let pv = bound.spec.unwrap().volume_name.unwrap();
    // The default pathPattern: namespace-claim-pv.
    assert!(root.join(format!("default-data-{pv}")).is_dir());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-1")
    );

    let mut child = running.0.take().unwrap();
    let pid = child.id().to_string();
    let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(status.success());
    let waited = tokio::time::timeout(
        WAIT,
        tokio::task::spawn_blocking(move || child.wait().unwrap()),
    )
    .await;
    let Ok(exit) = waited else {
        // The child now belongs to the blocked waiter: stop it by pid before failing.
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
        panic!("controller did not exit after SIGTERM");
    };
    let exit = exit.unwrap();
    assert!(exit.success(), "{exit:?}");
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None);
    harness.finish().await;
}

/// The binary as deployed, replica `replica-1` with its Lease in `default`, against the
/// harness' API and agents; its HTTP port.
fn replica_1(harness: &Harness) -> (Running, u16) {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new(env!("CARGO_BIN_EXE_nfsprov-controller"))
        .arg(format!("--kubeconfig={}", harness.kubeconfig().display()))
        .arg(format!("--agents-dir={}", harness.agents_dir().display()))
        .arg(format!("--http-addr=127.0.0.1:{port}"))
        .args(["--lease-namespace=default", "--identity=replica-1"])
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    (Running(Some(child)), port)
}

/// Runs the binary against `agents` until it exits by itself; its status and stderr.
fn run_until_exit(agents: &std::path::Path, extra: &[&str]) -> (bool, String) {
    let output = Command::new(env!("CARGO_BIN_EXE_nfsprov-controller"))
        .arg(format!("--agents-dir={}", agents.display()))
        .arg("--kubeconfig=/nonexistent/kubeconfig")
        .arg("--http-addr=127.0.0.1:0")
        .args(extra)
        .env_remove("NFSPROV_DEFAULT_AGENT")
        .output()
        .unwrap();
    (
        output.status.success(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn an_unclear_default_agent_stops_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("ca.pem"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("token"), "t\n").unwrap();
    let write = |name: &str, default: bool| {
        std::fs::write(
            dir.path().join(format!("{name}.toml")),
            format!(
                "name = \"{name}\"\nurl = \"https://127.0.0.1:1\"\nca_file = \"ca.pem\"\ntoken_file = \"token\"\ndefault = {default}\n"
            ),
        )
        .unwrap();
    };
    write("nfs1", true);
    write("nfs2", true);
    let (ok, stderr) = run_until_exit(dir.path(), &[]);
    assert!(!ok);
    assert!(
        stderr.contains("several agents are marked default = true (nfs1, nfs2)"),
        "{stderr}"
    );

    write("nfs2", false);
    let (ok, stderr) = run_until_exit(dir.path(), &["--default-agent=nfs3"]);
    assert!(!ok);
    assert!(
        stderr.contains("default agent \"nfs3\" is not configured; known agents: nfs1, nfs2"),
        "{stderr}"
    );
}

/// `GET path` on loopback: the status code, or `None` when nothing answers yet.
fn http_status(port: u16, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    response.split_whitespace().nth(1)?.parse().ok()
}

/// A replica that does not hold the Lease is ready once its caches are synced, acts on
/// nothing meanwhile, and provisions what is waiting as soon as it leads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_is_ready_with_synced_caches_and_acts_once_it_leads() {
    let harness = Harness::start(HarnessOptions {
        agents: vec!["test"],
        ..HarnessOptions::default()
    })
    .await;
    let client = harness.client.clone();
    let root = harness.agents[0].root();

    // Another replica leads: it renews its Lease until told to stop.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let lease = |renewed: &str| {
        serde_json::from_value::<Lease>(json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": "nfsprov-controller", "namespace": "default"},
            "spec": {"holderIdentity": "replica-0", "leaseDurationSeconds": 3,
                     "acquireTime": renewed, "renewTime": renewed},
        }))
        .unwrap()
    };
    let now = || k8s_openapi::jiff::Timestamp::now().to_string();
    leases
        .create(&PostParams::default(), &lease(&now()))
        .await
        .unwrap();
    let (stop_renewing, mut renewing_stopped) = tokio::sync::watch::channel(false);
    let renewer = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                let patch = json!({"spec": {"renewTime": now()}});
                let _ = leases
                    .patch(
                        "nfsprov-controller",
                        &kube::api::PatchParams::default(),
                        &kube::api::Patch::Merge(&patch),
                    )
                    .await;
                // The other replica's renewal period, well inside its 3 s Lease.
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                    _ = renewing_stopped.wait_for(|s| *s) => return,
                }
            }
        })
    };

    let claims = class_and_claim(&client).await;

    let (running, port) = replica_1(&harness);
    let deadline = std::time::Instant::now() + WAIT;
    while http_status(port, "/readyz") != Some(200) {
        assert!(
            std::time::Instant::now() < deadline,
            "the standby never became ready"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Ready while the other replica still leads, and nothing was acted on.
    let held = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(
        held.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-0")
    );
    let claim = claims.get("data").await.unwrap();
    assert_eq!(claim.spec.and_then(|s| s.volume_name), None);
    assert!(
        std::fs::read_dir(root)
            .unwrap()
            .all(|e| { e.unwrap().file_name().to_string_lossy().starts_with('.') })
    );

    // The other replica stops renewing: its Lease expires and this one takes over.
    stop_renewing.send(true).unwrap();
    renewer.await.unwrap();
    tokio::time::timeout(
        WAIT,
        await_condition(claims, "data", |c: Option<&PersistentVolumeClaim>| {
            c.and_then(|c| c.status.as_ref())
                .and_then(|s| s.phase.as_deref())
                == Some("Bound")
        }),
    )
    .await
    .expect("claim bound once the standby leads")
    .unwrap();
    let lease = leases.get("nfsprov-controller").await.unwrap();
    assert_eq!(
        lease.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("replica-1")
    );
    drop(running);
    harness.finish().await;
}

/// The class `nfs` of this provisioner and the claim `default/data` of 1Mi in it; the
/// claims of `default`, to wait on.
async fn class_and_claim(client: &kube::Client) -> Api<PersistentVolumeClaim> {
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
                "metadata": {"name": "nfs"}, "provisioner": "nfsprov.dev/nfs",
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    claims
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "data", "namespace": "default"},
                "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "nfs",
                         "resources": {"requests": {"storage": "1Mi"}}},
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    claims
}
