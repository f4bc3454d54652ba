//! The install as an operator follows it, on a real API server (`E2E_KUBECONFIG`, set by
//! `tests/real-api`): `nfsprov-agent init --name nfs1`, the Secret it printed applied with
//! kubectl, `kubectl apply -k deploy/`, the example classes, and the controller running as
//! deploy/'s ServiceAccount with no agents directory. Then the agents change while it
//! runs: a second agent added by applying only its Secret, a broken Secret, a Secret
//! deleted, and a rotated token.
//!
//! The commands are those of the install; what differs is only what a test on one
//! machine needs: `--dir` (not /etc/nfsprov), `--listen` on a free loopback port,
//! `--hostname localhost --ip 127.0.0.1` for the host the agent really runs on, and
//! `--shared-filesystem` for an export root that is a temporary directory, not the
//! filesystem of its own the install's first step makes.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::{Api, Client};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::binaries::binary;
use nfsprov_e2e::cluster::{ControllerProcess, KubeApi};
use serde_json::json;

/// The controller's namespace, as deploy/ and `init --namespace` have it.
const NAMESPACE: &str = "nfsprov";
/// How long a claim may take to be Bound once its agent is there.
const BIND: Duration = Duration::from_secs(60);

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// Runs kubectl as the cluster's admin; its output, or why it failed.
fn kubectl(kubeconfig: &Path, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()?;
    println!("$ kubectl {}", args.join(" "));
    anyhow::ensure!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// `nfsprov-agent init` as the install runs it, in `dir`; the port it listens on.
fn init(name: &str, export_root: &Path, dir: &Path) -> anyhow::Result<u16> {
    let port = nfsprov_e2e::free_port()?;
    let export_root = export_root.to_str().unwrap_or_default();
    let dir = dir.to_str().unwrap_or_default();
    let listen = format!("127.0.0.1:{port}");
    let args = [
        "init",
        "--export-root",
        export_root,
        "--hostname",
        "localhost",
        "--ip",
        "127.0.0.1",
        "--name",
        name,
        "--dir",
        dir,
        "--listen",
        &listen,
        "--shared-filesystem",
    ];
    println!("$ nfsprov-agent {}", args.join(" "));
    let output = Command::new(binary("nfsprov-agent")?).args(args).output()?;
    anyhow::ensure!(
        output.status.success(),
        "nfsprov-agent init: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(port)
}

/// Deletes what the test made in the shared cluster, also when it fails, so the agent
/// Secrets it applied never reach the next test reading the namespace.
struct Cleanup {
    kubeconfig: PathBuf,
    objects: Vec<Vec<String>>,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        for object in self.objects.iter().rev() {
            let mut args = vec!["delete", "--ignore-not-found", "--wait=false"];
            args.extend(object.iter().map(String::as_str));
            let _ = kubectl(&self.kubeconfig, &args);
        }
    }
}

async fn claim(client: &Client, namespace: &str, name: &str, class: &str) -> anyhow::Result<()> {
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "storageClassName": class,
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pvc)
        .await?;
    Ok(())
}

async fn bound(
    client: &Client,
    namespace: &str,
    name: &str,
    controller: &ControllerProcess,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let api = Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace);
    let is_bound = |pvc: Option<&PersistentVolumeClaim>| {
        pvc.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    };
    tokio::time::timeout(BIND, await_condition(api, name, is_bound))
        .await
        .map_err(|_| {
            anyhow::anyhow!(
                "claim {name} not Bound within {BIND:?}; controller log:\n{}",
                controller.log_text()
            )
        })??;
    Ok(started.elapsed())
}

/// (reason, note) of the events about `name` in `namespace`, oldest first.
async fn events(
    client: &Client,
    namespace: &str,
    name: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut found: Vec<Event> = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect();
    found.sort_by_key(|e| {
        e.event_time
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    });
    Ok(found
        .into_iter()
        .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
        .collect())
}

/// Waits for an event `reason` about `name` whose note holds `text`; all its events.
async fn event(
    client: &Client,
    namespace: &str,
    name: &str,
    reason: &str,
    text: &str,
    controller: &ControllerProcess,
) -> anyhow::Result<Vec<(String, String)>> {
    let deadline = Instant::now() + BIND;
    loop {
        let all = events(client, namespace, name).await?;
        if all.iter().any(|(r, n)| r == reason && n.contains(text)) {
            return Ok(all);
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "no {reason} event about {name} saying {text:?}; events: {all:?}; controller log:\n{}",
            controller.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the controller's metrics hold `line` (or, with `present` false, not).
/// Waits until the agent on `port` answers 401 to `token` (a token it no longer holds).
async fn refused(port: u16, ca: &Path, token: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    let url = format!("https://localhost:{port}/v1/info");
    let authorization = format!("Authorization: Bearer {token}");
    loop {
        let output = Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", "--cacert"])
            .arg(ca)
            .args(["-H", &authorization, &url])
            .output()?;
        let status = String::from_utf8_lossy(&output.stdout).into_owned();
        if status == "401" {
            return Ok(());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the agent still answers {status} to the replaced token after 30 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn metric(controller: &ControllerProcess, line: &str, present: bool) -> anyhow::Result<()> {
    nfsprov_e2e::eventually(line, BIND, || async {
        controller
            .metrics()
            .is_ok_and(|text| text.lines().any(|l| l == line) == present)
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}; controller log:\n{}", controller.log_text()))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_install_as_written_then_agents_added_broken_removed_and_rotated() -> anyhow::Result<()>
{
    let api = KubeApi::start().await?;
    if !api.is_shared() {
        nfsprov_test_skip::skip(
            "the_install_as_written_then_agents_added_broken_removed_and_rotated",
            "needs a real API server (E2E_KUBECONFIG): Secrets, RBAC and kubectl apply -k",
        );
        return Ok(());
    }
    let admin = api.kubeconfig().to_owned();
    let client = api.client().await?;
    let run = format!("{:x}", std::process::id());
    let work = tempfile::tempdir()?;
    let mut cleanup = Cleanup {
        kubeconfig: admin.clone(),
        objects: Vec::new(),
    };

    // On the NFS server: init, then the agent runs.
    let export1 = work.path().join("srv-nfs1");
    std::fs::create_dir(&export1)?;
    let etc1 = work.path().join("etc-nfs1");
    let port1 = init("nfs1", &export1, &etc1)?;
    let _agent1 = AgentProcess::start_initialised("nfs1", &etc1, port1).await?;

    // In the cluster: the namespace, the printed Secret, deploy/, the example classes.
    let secret1 = etc1.join("controller-secret.yaml");
    match kubectl(&admin, &["create", "namespace", NAMESPACE]) {
        Ok(_) => {}
        // tests/real-api applied deploy/ before any test: the namespace is there.
        Err(e) if e.to_string().contains("AlreadyExists") => {}
        Err(e) => return Err(e),
    }
    cleanup.objects.push(vec![
        "-n".into(),
        NAMESPACE.into(),
        "secret".into(),
        "nfsprov-agent-nfs1".into(),
    ]);
    kubectl(
        &admin,
        &["apply", "-f", secret1.to_str().unwrap_or_default()],
    )?;
    kubectl(
        &admin,
        &["apply", "-k", deploy_dir().to_str().unwrap_or_default()],
    )?;
    let classes = deploy_dir().join("examples/storageclasses.yaml");
    kubectl(
        &admin,
        &["apply", "-f", classes.to_str().unwrap_or_default()],
    )?;

    // The controller as deploy/'s ServiceAccount, with no agents directory; its own Lease
    // so that no earlier run's holder delays it.
    let lease = format!("--lease-name=nfsprov-install-{run}");
    let controller = ControllerProcess::start_with(&api, None, &[&lease]).await?;

    let namespace = format!("e2e-install-{run}");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": namespace}}))?;
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await?;
    cleanup
        .objects
        .push(vec!["namespace".into(), namespace.clone()]);
    claim(&client, &namespace, "first", "nfs-archive").await?;
    let took = bound(&client, &namespace, "first", &controller).await?;
    println!("claim of nfs-archive on agent nfs1 Bound after {took:?}");
    metric(
        &controller,
        "nfsprov_agent_configured{agent=\"nfs1\"} 1",
        true,
    )
    .await?;

    // A second agent: a class naming it waits for it, and its Secret alone brings it.
    let export2 = work.path().join("srv-nfs2");
    std::fs::create_dir(&export2)?;
    let etc2 = work.path().join("etc-nfs2");
    let port2 = init("nfs2", &export2, &etc2)?;
    let _agent2 = AgentProcess::start_initialised("nfs2", &etc2, port2).await?;
    let class2 = format!("nfs2-{run}");
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": class2},
        "provisioner": "nfsprov.dev/nfs",
        "reclaimPolicy": "Delete",
        "parameters": {"agent": "nfs2", "onDelete": "delete"},
    }))?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    cleanup
        .objects
        .push(vec!["storageclass".into(), class2.clone()]);
    claim(&client, &namespace, "second", &class2).await?;
    let seen = event(
        &client,
        &namespace,
        "second",
        "ProvisioningFailed",
        "agent \"nfs2\", which is not configured (no Secret labelled app.kubernetes.io/component=agent-credentials in namespace nfsprov configures it)",
        &controller,
    )
    .await?;
    // Provisioning first, as the library publishes it, also for a claim refused before
    // any agent is chosen (kube-controller-manager's own ExternalProvisioning aside).
    let ours: Vec<&str> = seen
        .iter()
        .map(|(reason, _)| reason.as_str())
        .filter(|reason| reason.starts_with("Provisioning"))
        .collect();
    assert_eq!(ours, ["Provisioning", "ProvisioningFailed"], "{seen:?}");
    cleanup.objects.push(vec![
        "-n".into(),
        NAMESPACE.into(),
        "secret".into(),
        "nfsprov-agent-nfs2".into(),
    ]);
    let secret2 = etc2.join("controller-secret.yaml");
    kubectl(
        &admin,
        &["apply", "-f", secret2.to_str().unwrap_or_default()],
    )?;
    let took = bound(&client, &namespace, "second", &controller).await?;
    println!("the waiting claim of agent nfs2 Bound {took:?} after its Secret was applied");
    assert!(
        std::fs::read_dir(&export2)?.count() > 0,
        "the volume is on nfs2's export"
    );

    // A broken Secret is named, and the others keep working.
    let broken = work.path().join("broken.yaml");
    std::fs::write(
        &broken,
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: nfsprov-agent-nfs3\n  namespace: nfsprov\n  labels:\n    app.kubernetes.io/component: agent-credentials\nstringData:\n  nfs3.toml: |\n    name = \"nfs3\"\n    url = \"https://localhost:1\"\n    ca_file = \"nfs3-ca.pem\"\n    token_file = \"nfs3-token\"\n",
    )?;
    cleanup.objects.push(vec![
        "-n".into(),
        NAMESPACE.into(),
        "secret".into(),
        "nfsprov-agent-nfs3".into(),
    ]);
    kubectl(
        &admin,
        &["apply", "-f", broken.to_str().unwrap_or_default()],
    )?;
    event(
        &client,
        NAMESPACE,
        "nfsprov-agent-nfs3",
        "AgentSecretInvalid",
        "key nfs3.toml: ca_file names key nfs3-ca.pem, which the Secret does not hold",
        &controller,
    )
    .await?;
    metric(
        &controller,
        "nfsprov_agent_secret_invalid{secret=\"nfsprov-agent-nfs3\"} 1",
        true,
    )
    .await?;
    claim(&client, &namespace, "third", "nfs-archive").await?;
    bound(&client, &namespace, "third", &controller).await?;
    kubectl(
        &admin,
        &["-n", NAMESPACE, "delete", "secret", "nfsprov-agent-nfs3"],
    )?;
    metric(
        &controller,
        "nfsprov_agent_secret_invalid{secret=\"nfsprov-agent-nfs3\"} 1",
        false,
    )
    .await?;

    // nfs2's Secret deleted: its class fails with an event that says why.
    kubectl(
        &admin,
        &["-n", NAMESPACE, "delete", "secret", "nfsprov-agent-nfs2"],
    )?;
    metric(
        &controller,
        "nfsprov_agent_configured{agent=\"nfs2\"} 1",
        false,
    )
    .await?;
    claim(&client, &namespace, "fourth", &class2).await?;
    event(
        &client,
        &namespace,
        "fourth",
        "ProvisioningFailed",
        "StorageClass names agent \"nfs2\", which is not configured (no Secret labelled app.kubernetes.io/component=agent-credentials in namespace nfsprov configures it); known agents: nfs1",
        &controller,
    )
    .await?;

    // A rotated token. The Secret init printed also holds a client certificate, which
    // the agent takes instead of a token; without it the token alone decides, so the
    // controller must use the Secret's current one.
    let printed = std::fs::read_to_string(&secret1)?;
    let old_token = std::fs::read_to_string(etc1.join("token"))?
        .trim()
        .to_owned();
    let token_only: String = printed
        .lines()
        .filter(|l| !l.contains("client_cert_file") && !l.contains("client_key_file"))
        .map(|l| format!("{l}\n"))
        .collect();
    let new_token = format!("{old_token:.32}rotated{}", "0".repeat(25));
    let staged = etc1.join("token.new");
    {
        use std::io::Write as _;
        use std::os::unix::fs::OpenOptionsExt as _;
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staged)?
            .write_all(format!("{new_token}\n").as_bytes())?;
    }
    std::fs::rename(&staged, etc1.join("token"))?;
    // The agent takes a changed token file within about a second; until it refuses the
    // old token, a Secret holding it would still be accepted.
    refused(port1, &etc1.join("ca.pem"), &old_token).await?;
    // The agent now wants the new token; a Secret with the old one is refused.
    let stale = work.path().join("stale.yaml");
    std::fs::write(&stale, &token_only)?;
    let loads = |n: u32| format!("nfsprov_agent_secret_loads_total{{agent=\"nfs1\"}} {n}");
    metric(&controller, &loads(1), true).await?;
    kubectl(&admin, &["apply", "-f", stale.to_str().unwrap_or_default()])?;
    metric(&controller, &loads(2), true).await?;
    claim(&client, &namespace, "fifth", "nfs-archive").await?;
    event(
        &client,
        &namespace,
        "fifth",
        "ProvisioningFailed",
        "401",
        &controller,
    )
    .await?;
    let rotated = work.path().join("rotated.yaml");
    std::fs::write(&rotated, token_only.replace(&old_token, &new_token))?;
    kubectl(
        &admin,
        &["apply", "-f", rotated.to_str().unwrap_or_default()],
    )?;
    metric(&controller, &loads(3), true).await?;
    let took = bound(&client, &namespace, "fifth", &controller).await?;
    println!("the claim refused with the old token Bound {took:?} after the rotated Secret");
    claim(&client, &namespace, "sixth", "nfs-archive").await?;
    bound(&client, &namespace, "sixth", &controller).await?;
    drop(cleanup);
    Ok(())
}
