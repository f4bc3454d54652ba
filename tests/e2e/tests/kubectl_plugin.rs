//! `kubectl nfsprov` against a running installation: the simulator, a real agent and the
//! controller, with the plugin binary run as a user runs it.
//!
//! The simulator serves no Secrets and no Deployments, so the plugin reaches it through a
//! small proxy that answers for the controller's Deployment (`deploy/deployment.yaml`,
//! its agents volume naming the agent's Secret) and the agent's Secret (built from what
//! `nfsprov-agent init` printed), and forwards everything else to the simulator.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, Secret};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nfsprov_api_types::{CreateVolumeRequest, VolumePath};
use nfsprov_e2e::api_proxy;
use nfsprov_e2e::binaries::binary;
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::system::System;
use serde_json::{Value, json};

const NAMESPACE: &str = "nfsprov";
const SECRET: &str = "nfsprov-agent-nfs1";
const BIND: Duration = Duration::from_secs(60);

/// What the proxy answers itself: the objects the simulator does not serve.
struct Fixtures {
    deployment: Value,
    secrets: BTreeMap<String, Value>,
    /// Answer 403 to every Secret request, as a cluster without the RBAC rule does.
    forbid_secrets: AtomicBool,
}

fn status(code: u16, reason: &str, message: &str) -> (u16, String) {
    let body = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": message, "reason": reason, "code": code,
    });
    (code, body.to_string())
}

impl Fixtures {
    /// The answer for `path`, or `None` when the simulator should answer.
    fn answer(&self, method: &str, path: &str) -> Option<(u16, String)> {
        let secrets = format!("/api/v1/namespaces/{NAMESPACE}/secrets");
        let deployments = "/apis/apps/v1/";
        if !path.starts_with(&secrets) && !path.starts_with(deployments) {
            return None;
        }
        if method != "GET" {
            return Some(status(405, "MethodNotAllowed", "read-only fixture"));
        }
        if path.starts_with(&secrets) {
            if self.forbid_secrets.load(Ordering::SeqCst) {
                let name = path.trim_start_matches(&secrets).trim_start_matches('/');
                return Some(status(
                    403,
                    "Forbidden",
                    &format!(
                        "secrets \"{name}\" is forbidden: User \"alice\" cannot get resource \"secrets\" in API group \"\" in the namespace \"{NAMESPACE}\""
                    ),
                ));
            }
            return Some(match path.strip_prefix(&format!("{secrets}/")) {
                Some(name) => match self.secrets.get(name) {
                    Some(secret) => (200, secret.to_string()),
                    None => status(404, "NotFound", &format!("secrets \"{name}\" not found")),
                },
                None => (
                    200,
                    json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {},
                           "items": self.secrets.values().collect::<Vec<_>>()})
                    .to_string(),
                ),
            });
        }
        let ours = format!("/apis/apps/v1/namespaces/{NAMESPACE}/deployments/nfsprov-controller");
        Some(if path == ours {
            (200, self.deployment.to_string())
        } else {
            status(404, "NotFound", "deployments not found")
        })
    }
}

/// The agent's Secret as `nfsprov-agent init` printed it, in the shape the API returns
/// (`data`, base64), with the labels of `deploy/examples/secret.example.yaml`.
fn agent_secret(system: &System, dir: &Path) -> anyhow::Result<Value> {
    system.agents[0].process.write_secret_files(dir)?;
    let mut data = BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        data.insert(
            entry.file_name().to_string_lossy().into_owned(),
            ByteString(std::fs::read(entry.path())?),
        );
    }
    anyhow::ensure!(
        data.contains_key("nfs1.toml"),
        "init printed {:?}",
        data.keys()
    );
    let mut secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": SECRET, "namespace": NAMESPACE, "labels": {
            "app.kubernetes.io/name": "nfsprov",
            "app.kubernetes.io/component": "agent-credentials",
            "nfsprov.dev/agent": "nfs1",
        }},
        "type": "Opaque",
    }))?;
    secret.data = Some(data);
    Ok(serde_json::to_value(&secret)?)
}

/// The shipped Deployment, as `kubectl apply -k deploy/` makes it with one replica, and
/// with the status its ready pod would give it. It names no agent: the plugin, as the
/// controller, reads the labelled agent Secrets of the namespace.
fn shipped_deployment() -> anyhow::Result<Value> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/deployment.yaml");
    let mut deployment: Value = serde_yaml_ng::from_str(&std::fs::read_to_string(file)?)?;
    deployment["metadata"]["namespace"] = json!(NAMESPACE);
    deployment["spec"]["replicas"] = json!(1);
    deployment["status"] = json!({"replicas": 1, "readyReplicas": 1});
    Ok(deployment)
}

struct Plugin {
    bin: PathBuf,
    kubeconfig: PathBuf,
    /// Flags every run starts with (namespace, provisioner, Lease of the installation).
    scope: Vec<String>,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}\n{}", self.stdout, self.stderr))
    }
}

impl Plugin {
    async fn run(&self, args: &[&str]) -> anyhow::Result<Run> {
        let output = tokio::process::Command::new(&self.bin)
            .arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .args(&self.scope)
            .args(args)
            .output()
            .await?;
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        // The outputs, for a reader of the test log (and the README's examples).
        println!(
            "$ kubectl nfsprov {}\n{}{}",
            args.join(" "),
            run.stdout,
            run.stderr
        );
        Ok(run)
    }

    /// Runs until `done` holds for the answer, or fails after `limit` with the last one.
    async fn run_until(
        &self,
        args: &[&str],
        limit: Duration,
        done: impl Fn(&Run) -> bool,
    ) -> anyhow::Result<Run> {
        let deadline = Instant::now() + limit;
        loop {
            let run = self.run(args).await?;
            if done(&run) {
                return Ok(run);
            }
            // Status 2 is an error of the plugin itself, which waiting does not cure.
            anyhow::ensure!(
                run.code != 2,
                "kubectl nfsprov {args:?} failed: {}",
                run.stderr
            );
            if Instant::now() > deadline {
                anyhow::bail!(
                    "kubectl nfsprov {args:?} did not give the expected answer within {limit:?}; last: {}{}",
                    run.stdout,
                    run.stderr
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
}

/// A volume made through the agent's API that no PV points to: an orphan on purpose.
async fn make_stray(system: &System) -> anyhow::Result<VolumePath> {
    let stray = VolumePath::parse("stray")?;
    system.agents[0]
        .process
        .client()?
        .create_volume(
            &stray,
            &CreateVolumeRequest {
                capacity_bytes: 1 << 20,
                ..CreateVolumeRequest::default()
            },
            None,
        )
        .await?;
    Ok(stray)
}

#[tokio::test(flavor = "multi_thread")]
async fn status_agents_volumes_doctor_and_orphans() -> anyhow::Result<()> {
    let api = KubeApi::start().await?;
    let Some(sim) = api.simulator_url() else {
        nfsprov_test_skip::skip(
            "status_agents_volumes_doctor_and_orphans",
            "needs the simulator: the fixture proxy serves the Deployment and Secrets over plain HTTP",
        );
        return Ok(());
    };
    let admin = api.client().await?;
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": NAMESPACE}}))?;
    Api::<Namespace>::all(admin)
        .create(&PostParams::default(), &namespace)
        .await?;
    // Leader election on, with the Lease where the plugin looks for it by default.
    let mut system = System::start_on(
        api,
        &["nfs1"],
        1,
        &[&format!("--lease-namespace={NAMESPACE}")],
    )
    .await?;

    let work = tempfile::tempdir()?;
    let fixtures = Arc::new(Fixtures {
        deployment: shipped_deployment()?,
        secrets: BTreeMap::from([(
            SECRET.to_owned(),
            agent_secret(&system, &work.path().join("secret"))?,
        )]),
        forbid_secrets: AtomicBool::new(false),
    });
    let proxy = {
        let fixtures = fixtures.clone();
        api_proxy::start(sim, move |method, path| fixtures.answer(method, path)).await?
    };
    let kubeconfig = work.path().join("kubeconfig");
    let original = std::fs::read_to_string(system.api.kubeconfig())?;
    anyhow::ensure!(original.contains(&format!("http://{sim}")), "{original}");
    std::fs::write(
        &kubeconfig,
        original.replace(&format!("http://{sim}"), &format!("http://{proxy}")),
    )?;
    let plugin = Plugin {
        bin: binary("kubectl-nfsprov")?,
        kubeconfig,
        scope: Vec::new(),
    };

    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    system
        .claim("data", "e2e-delete", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("data", BIND).await?;
    let pv = volume.metadata.name.clone().unwrap_or_default();
    let directory = format!("e2e-data-{pv}");
    let agent_root = system.agents[0].root.clone();
    std::fs::write(agent_root.join(&directory).join("blob"), vec![7u8; 3 << 20])?;

    // status: replicas from the Deployment, the Lease holder, the class and its agent.
    let status = plugin
        .run_until(&["status", "-o", "json"], BIND, |r| {
            r.code == 0 && !r.json()["leader"]["holder"].is_null()
        })
        .await?
        .json();
    assert_eq!(status["provisioner"], "nfsprov.dev/nfs");
    assert_eq!(status["controller"]["found"], true);
    assert_eq!(status["controller"]["ready"], 1);
    assert_eq!(status["controller"]["desired"], 1);
    assert_eq!(status["agents"], json!(["nfs1"]));
    assert_eq!(status["classes"][0]["name"], "e2e-delete");
    assert_eq!(status["classes"][0]["agents"], json!(["nfs1"]));
    assert_eq!(status["classes"][0]["unknown_agents"], json!([]));
    assert_eq!(status["classes"][0]["on_delete"], "delete");
    let holder = status["leader"]["holder"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let table = plugin.run(&["status"]).await?;
    assert_eq!(table.code, 0, "{}", table.stderr);
    assert!(
        table
            .stdout
            .contains("Controller:   nfsprov/nfsprov-controller  1/1 ready"),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .contains(&format!("Leader:       {holder} (renewed ")),
        "{}",
        table.stdout
    );
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>()
                == ["e2e-delete", "nfs1", "delete", "bestEffort", "Delete", "no"]),
        "{}",
        table.stdout
    );

    // agents: asked over mTLS with the credentials of the Secret.
    let agents = plugin.run(&["agents", "-o", "json"]).await?;
    assert_eq!(agents.code, 0, "{}", agents.stderr);
    let agent = &agents.json()["agents"][0];
    assert_eq!(agent["name"], "nfs1");
    assert_eq!(agent["secret"], SECRET);
    assert_eq!(agent["health"], "ok");
    assert_eq!(agent["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(agent["quota"], "none");
    assert_eq!(agent["volumes"], 1);
    assert!(
        agent["available_bytes"].as_u64().unwrap_or(0) > 0,
        "{agent}"
    );
    // The one claim's 1Gi is what the agent has promised.
    assert_eq!(agent["provisioned_bytes"], 1u64 << 30, "{agent}");
    let total = agent["total_bytes"].as_f64().unwrap_or(0.0);
    let ratio = agent["overcommit_ratio"].as_f64().unwrap_or(-1.0);
    assert!(
        (ratio - (1u64 << 30) as f64 / total).abs() < 1e-6,
        "{agent}"
    );
    let table = plugin.run(&["agents"]).await?;
    let row: Vec<&str> = table
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        row[..4],
        ["nfs1", "ok", env!("CARGO_PKG_VERSION"), "none"],
        "{}",
        table.stdout
    );
    assert_eq!(row[5], "1", "{}", table.stdout);
    assert_eq!(
        row[6],
        format!(
            "1Gi({ratio:.2}x{})",
            if ratio > 1.0 { ",overcommitted" } else { "" }
        ),
        "{}",
        table.stdout
    );

    // volumes: claim, agent, path and the usage the agent measured.
    let volumes = plugin
        .run_until(&["volumes", "-o", "json"], Duration::from_secs(30), |r| {
            r.code == 0 && !r.json()["volumes"][0]["used_bytes"].is_null()
        })
        .await?
        .json();
    let row = &volumes["volumes"][0];
    assert_eq!(volumes["volumes"].as_array().map(Vec::len), Some(1));
    assert_eq!(row["claim"], "e2e/data");
    assert_eq!(row["pv"], pv.as_str());
    assert_eq!(row["agent"], "nfs1");
    assert_eq!(row["path"], directory.as_str());
    assert_eq!(row["capacity"], "1Gi");
    assert_eq!(row["capacity_bytes"], 1u64 << 30);
    assert_eq!(row["quota_enforced"], false);
    assert!(row["cloned_from"].is_null(), "{row}");
    let used = row["used_bytes"].as_u64().unwrap_or(0);
    assert!((3 << 20..4 << 20).contains(&used), "used {used}");
    let table = plugin.run(&["volumes"]).await?;
    let cells: Vec<&str> = table
        .stdout
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        cells,
        [
            "e2e/data",
            pv.as_str(),
            "Bound",
            "nfs1",
            directory.as_str(),
            "1Gi",
            "3Mi",
            "no",
            // No clients of its own (an agent without an export manager), normal, no
            // origin.
            "-",
            "normal",
            "-"
        ],
        "{}",
        table.stdout
    );

    // doctor on a healthy installation: nothing to say, exit status 0.
    let doctor = plugin.run(&["doctor"]).await?;
    assert_eq!(
        (doctor.code, doctor.stdout.as_str()),
        (0, "No problem found.\n"),
        "{}",
        doctor.stderr
    );

    // orphans: a volume made through the agent's API that no PV points to.
    let stray = make_stray(&system).await?;
    let orphans = plugin.run(&["orphans", "-o", "json"]).await?;
    assert_eq!(orphans.code, 1, "{}", orphans.stderr);
    assert_eq!(
        orphans.json()["orphans"],
        json!([{"kind": "noPv", "agent": "nfs1", "path": "stray", "pv": null, "claim": null}])
    );
    let table = plugin.run(&["orphans"]).await?;
    assert_eq!(
        table
            .stdout
            .lines()
            .nth(1)
            .map(|l| l.split_whitespace().collect::<Vec<_>>()),
        Some(vec!["no", "PV", "nfs1", "stray", "-", "-"]),
        "{}",
        table.stdout
    );

    // archives: the stray volume archived, listed, then deleted through the plugin.
    let empty = plugin.run(&["archives"]).await?;
    assert_eq!(
        (empty.code, empty.stdout.as_str()),
        (0, "No archive found.\n"),
        "{}",
        empty.stderr
    );
    let archived = system.agents[0]
        .process
        .client()?
        .archive_volume(&stray, Some(3), None)
        .await?;
    let listed = plugin.run(&["archives", "-o", "json"]).await?;
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let archives = listed.json()["archives"].clone();
    assert_eq!(archives.as_array().map(Vec::len), Some(1), "{archives}");
    assert_eq!(archives[0]["agent"], "nfs1");
    assert_eq!(archives[0]["path"], "stray");
    assert_eq!(archives[0]["archive_path"], archived.archive_path.as_str());
    assert_eq!(archives[0]["retention_days"], 3);
    let id = archives[0]["id"].as_str().unwrap_or_default().to_owned();
    let table = plugin.run(&["archives", "--agent", "nfs1"]).await?;
    let row: Vec<String> = table
        .stdout
        .lines()
        .nth(1)
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default();
    assert_eq!(
        row.first().map(String::as_str),
        Some("nfs1"),
        "{}",
        table.stdout
    );
    assert_eq!(row.get(1), Some(&id), "{}", table.stdout);
    // Three days, shown as kubectl shows ages: whole days, so 2d or 3d by the second.
    let expires = &row[row.len().saturating_sub(2)..];
    assert!(
        expires[0] == "in" && ["2d", "3d"].contains(&expires[1].as_str()),
        "expires in about three days: {}",
        table.stdout
    );
    let deleted = plugin.run(&["archives", "delete", "nfs1", &id]).await?;
    assert_eq!(deleted.code, 0, "{}", deleted.stderr);
    assert_eq!(
        deleted.stdout,
        format!("archive {id} deleted on agent nfs1\n")
    );
    let after = plugin.run(&["archives", "-o", "json"]).await?;
    assert_eq!(after.json()["archives"], json!([]), "{}", after.stderr);
    let unknown = plugin.run(&["archives", "--agent", "nfs9"]).await?;
    assert_eq!(unknown.code, 2, "{}", unknown.stdout);
    assert!(
        unknown.stderr.contains("not configured"),
        "{}",
        unknown.stderr
    );

    // Problems on purpose: a class naming an agent nobody configured, with a claim on it;
    // and a claim deleted while its agent is down, so its PV stays Released.
    system.class("e2e-typo", json!({"agent": "nfs9"})).await?;
    system
        .claim("typo", "e2e-typo", json!({}), json!({}))
        .await?;
    system.agents[0].process.kill();
    system
        .claims()
        .delete("data", &DeleteParams::default())
        .await?;
    let stuck = format!("pv/{pv}");
    let doctor = plugin
        .run_until(&["doctor", "-o", "json"], BIND, |r| {
            let findings = r.json()["findings"].clone();
            let has = |object: &str| {
                findings
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|f| f["object"] == object)
            };
            has(&stuck) && has("pvc/e2e/typo")
        })
        .await?;
    assert_eq!(doctor.code, 1);
    let findings = doctor.json()["findings"].clone();
    let finding = |object: &str| {
        findings
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["object"] == object)
            .cloned()
            .unwrap_or_else(|| panic!("no finding about {object}: {findings}"))
    };
    let pv_finding = finding(&stuck);
    let problem = pv_finding["problem"].as_str().unwrap_or_default();
    assert!(
        problem.starts_with("stuck Released (claim e2e/data is gone)"),
        "{problem}"
    );
    assert!(problem.contains("unreachable"), "{problem}");
    assert!(
        pv_finding["fix"]
            .as_str()
            .unwrap_or_default()
            .contains("make agent nfs1 reachable"),
        "{pv_finding}"
    );
    let agent_finding = finding("agent/nfs1");
    assert!(
        agent_finding["problem"]
            .as_str()
            .unwrap_or_default()
            .starts_with("unreachable: "),
        "{agent_finding}"
    );
    let class_finding = finding("storageclass/e2e-typo");
    assert!(
        class_finding["problem"]
            .as_str()
            .unwrap_or_default()
            .contains("\"nfs9\""),
        "{class_finding}"
    );
    assert!(
        finding("pvc/e2e/typo")["problem"]
            .as_str()
            .unwrap_or_default()
            .starts_with("Pending, provisioning failed: "),
        "{findings}"
    );
    let phase = system
        .volumes()
        .get(&pv)
        .await
        .map(|v: PersistentVolume| v.status.and_then(|s| s.phase))?;
    assert_eq!(phase.as_deref(), Some("Released"));
    let table = plugin.run(&["doctor"]).await?;
    assert_eq!(table.code, 1);
    // A header and one line per finding.
    assert_eq!(
        table.stdout.lines().count(),
        1 + findings.as_array().map_or(0, Vec::len),
        "{}",
        table.stdout
    );

    // A missing permission names the verb, the resource and the rule to add (the
    // labelled Secrets are listed, as the controller lists them).
    fixtures.forbid_secrets.store(true, Ordering::SeqCst);
    let refused = plugin.run(&["agents"]).await?;
    assert_eq!(refused.code, 2);
    assert!(
        refused
            .stderr
            .starts_with("error: forbidden: cannot list secrets in namespace nfsprov"),
        "{}",
        refused.stderr
    );
    assert!(
        refused
            .stderr
            .contains(r#"{apiGroups: [""], resources: ["secrets"], verbs: ["list"]}"#),
        "{}",
        refused.stderr
    );
    Ok(())
}

/// The plugin against a real kube-apiserver, where `kubectl apply -k deploy/` installed the
/// shipped Deployment (no nodes here, so none of its pods is ever ready) and the agent's
/// Secret is a real Secret: what an operator sees on a cluster with a broken controller
/// Deployment, a leader from elsewhere, a volume, an orphan, an archive, a stuck PV, and
/// a user whose RBAC lacks a rule.
#[tokio::test(flavor = "multi_thread")]
async fn on_a_real_api_server_with_the_shipped_deployment() -> anyhow::Result<()> {
    let api = KubeApi::start().await?;
    if !api.is_shared() {
        nfsprov_test_skip::skip(
            "on_a_real_api_server_with_the_shipped_deployment",
            "needs a real API server (E2E_KUBECONFIG); the simulator tier runs status_agents_volumes_doctor_and_orphans",
        );
        return Ok(());
    }
    let mut system = System::start_on(api, &["nfs1"], 1, &[]).await?;
    let run = system.names.run.clone().unwrap_or_default();
    let admin = system.client.clone();

    // The Secret the shipped Deployment mounts, holding this agent's credentials.
    let work = tempfile::tempdir()?;
    let mut secret: Secret =
        serde_json::from_value(agent_secret(&system, &work.path().join("secret"))?)?;
    secret.metadata.name = Some("nfsprov-agent-default".into());
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), NAMESPACE);
    let _ = secrets
        .delete("nfsprov-agent-default", &DeleteParams::default())
        .await;
    secrets.create(&PostParams::default(), &secret).await?;

    let lease = format!("nfsprov-e2e-{run}");
    let plugin = Plugin {
        bin: binary("kubectl-nfsprov")?,
        kubeconfig: system.api.kubeconfig().to_owned(),
        scope: [
            "-n",
            NAMESPACE,
            "--provisioner",
            &system.names.provisioner,
            "--lease",
            &lease,
        ]
        .map(str::to_owned)
        .to_vec(),
    };

    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    system
        .claim("data", "e2e-delete", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("data", BIND).await?;
    let pv = volume.metadata.name.clone().unwrap_or_default();

    // status: the shipped Deployment (none ready: no nodes), this run's leader, its class.
    let status = plugin.run(&["status", "-o", "json"]).await?;
    assert_eq!(status.code, 0, "{}", status.stderr);
    let status = status.json();
    assert_eq!(status["controller"]["found"], true, "{status}");
    assert_eq!(status["controller"]["desired"], 2, "{status}");
    assert_eq!(status["controller"]["ready"], 0, "{status}");
    assert!(!status["leader"]["holder"].is_null(), "{status}");
    assert_eq!(status["agents"], json!(["nfs1"]), "{status}");
    assert_eq!(
        status["classes"][0]["name"],
        system.names.class("e2e-delete").as_str()
    );

    // agents and volumes, through the real Secret and the real agent.
    let agents = plugin.run(&["agents", "-o", "json"]).await?;
    assert_eq!(agents.code, 0, "{}", agents.stderr);
    assert_eq!(agents.json()["agents"][0]["health"], "ok");
    assert_eq!(
        agents.json()["agents"][0]["secret"],
        "nfsprov-agent-default"
    );
    let volumes = plugin.run(&["volumes", "-o", "json"]).await?;
    assert_eq!(volumes.code, 0, "{}", volumes.stderr);
    assert_eq!(volumes.json()["volumes"][0]["pv"], pv.as_str());

    // An orphan and an archive made on purpose.
    let stray = make_stray(&system).await?;
    let orphans = plugin.run(&["orphans", "-o", "json"]).await?;
    assert_eq!(orphans.code, 1, "{}", orphans.stderr);
    assert_eq!(orphans.json()["orphans"][0]["path"], "stray");
    system.agents[0]
        .process
        .client()?
        .archive_volume(&stray, None, None)
        .await?;
    let archives = plugin.run(&["archives", "-o", "json"]).await?;
    assert_eq!(archives.json()["archives"][0]["path"], "stray");

    // A stuck PV: its claim deleted while the agent is down.
    system.agents[0].process.kill();
    system
        .claims()
        .delete("data", &DeleteParams::default())
        .await?;
    let stuck = format!("pv/{pv}");
    let deployment = format!("deployment/{NAMESPACE}/nfsprov-controller");
    let doctor = plugin
        .run_until(&["doctor", "-o", "json"], BIND, |r| {
            let findings = r.json()["findings"].clone();
            let has = |object: &str| {
                findings
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|f| f["object"] == object)
            };
            has(&stuck) && has(&deployment)
        })
        .await?;
    assert_eq!(doctor.code, 1);
    let findings = doctor.json()["findings"].clone();
    let problem_of = |object: &str| {
        findings
            .as_array()
            .into_iter()
            .flatten()
            .find(|f| f["object"] == object)
            .and_then(|f| f["problem"].as_str().map(str::to_owned))
            .unwrap_or_default()
    };
    assert_eq!(problem_of(&deployment), "0/2 controller replicas ready");
    assert!(
        problem_of(&stuck).starts_with("stuck Released"),
        "{findings}"
    );

    // The controller's own ServiceAccount may not read Deployments or Secrets: the
    // refusal names the rule to add.
    let limited = Plugin {
        kubeconfig: system.api.controller_kubeconfig().to_owned(),
        ..plugin
    };
    let refused = limited.run(&["agents"]).await?;
    assert_eq!(refused.code, 2, "{}", refused.stdout);
    assert!(
        refused
            .stderr
            .contains("forbidden: cannot get deployments.apps")
            && refused.stderr.contains("add this rule"),
        "{}",
        refused.stderr
    );
    system.agents[0].process.restart().await?;
    // A run that fails before this leaves the Secret; the next run replaces it.
    secrets
        .delete("nfsprov-agent-default", &DeleteParams::default())
        .await?;
    Ok(())
}

/// Every command that talks to agents, on a real kube-apiserver, with nothing but the
/// agent Secrets as the cluster holds them (no `--agents-dir`): `adopt` (dry run,
/// adoption, rerun), then `orphans` and `agents` with an unreadable Secret and with an
/// unreachable agent, which must be named, with exit status 1, never "all clear".
#[tokio::test(flavor = "multi_thread")]
async fn without_an_agents_directory_and_never_all_clear_unchecked() -> anyhow::Result<()> {
    let api = KubeApi::start().await?;
    if !api.is_shared() {
        nfsprov_test_skip::skip(
            "without_an_agents_directory_and_never_all_clear_unchecked",
            "needs a real API server (E2E_KUBECONFIG): the Secrets are read through the API",
        );
        return Ok(());
    }
    let mut system = System::start_on(api, &["nfs1"], 0, &[]).await?;
    let admin = system.client.clone();
    // The agents' Secrets live in this run's namespace, so nothing another test keeps in
    // nfsprov is read.
    let namespace = system.names.namespace.clone();
    let work = tempfile::tempdir()?;
    let mut secret: Secret =
        serde_json::from_value(agent_secret(&system, &work.path().join("secret"))?)?;
    secret.metadata.namespace = Some(namespace.clone());
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &namespace);
    secrets.create(&PostParams::default(), &secret).await?;
    let plugin = Plugin {
        bin: binary("kubectl-nfsprov")?,
        kubeconfig: system.api.kubeconfig().to_owned(),
        scope: ["-n", &namespace, "--provisioner", &system.names.provisioner]
            .map(str::to_owned)
            .to_vec(),
    };

    // A volume nfs-subdir-external-provisioner made: its class, claim, directory and PV.
    let replaced = format!("{}-subdir", system.names.provisioner);
    system.legacy_class("e2e-subdir", &replaced).await?;
    let (pv_name, _) = system
        .legacy_volume(&replaced, "e2e-subdir", "legacy", BIND)
        .await?;
    let directory = format!("{namespace}-legacy-{pv_name}");

    let adopt = [
        "adopt", "--from", &replaced, "--agent", "nfs1", "-o", "json",
    ];
    let dry = plugin.run(&[&adopt[..], &["--dry-run"]].concat()).await?;
    assert_eq!(dry.code, 0, "{}", dry.stderr);
    assert_eq!(
        dry.json()["volumes"][0]["action"],
        "adopt",
        "{}",
        dry.stdout
    );
    let untouched = system.volumes().get(&pv_name).await?;
    assert!(
        !untouched
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("nfsprov.dev/agent")
    );
    let done = plugin.run(&adopt).await?;
    assert_eq!(done.code, 0, "{}", done.stderr);
    assert_eq!(
        done.json()["volumes"][0]["action"],
        "adopted",
        "{}",
        done.stdout
    );
    let adopted = system.volumes().get(&pv_name).await?;
    let annotations = adopted.metadata.annotations.unwrap_or_default();
    assert_eq!(
        annotations.get("nfsprov.dev/path").map(String::as_str),
        Some(directory.as_str())
    );
    let again = plugin.run(&adopt).await?;
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.json()["volumes"], json!([]), "{}", again.stdout);

    // Everything checked, nothing found: the only case that says so.
    let clear = plugin.run(&["orphans"]).await?;
    assert_eq!(
        (clear.code, clear.stdout.as_str()),
        (0, "No orphan found.\n"),
        "{}",
        clear.stderr
    );
    let agents = plugin.run(&["agents"]).await?;
    assert_eq!(agents.code, 0, "{}{}", agents.stdout, agents.stderr);

    // An unreadable Secret: its settings name a key it does not hold.
    let broken: Secret = serde_json::from_value(json!({
        "metadata": {"name": "nfsprov-agent-nfs2", "labels": {
            "app.kubernetes.io/component": "agent-credentials",
        }},
        "stringData": {"nfs2.toml": "name = \"nfs2\"\nurl = \"https://localhost:1\"\nca_file = \"nfs2-ca.pem\"\ntoken_file = \"nfs2-token\"\n"},
    }))?;
    secrets.create(&PostParams::default(), &broken).await?;
    let orphans = plugin.run(&["orphans"]).await?;
    assert_eq!(orphans.code, 1, "{}", orphans.stderr);
    assert!(
        !orphans.stdout.contains("No orphan found.\n")
            && orphans.stdout.contains(
                "agent nfs2 not checked: Secret nfsprov-agent-nfs2: key nfs2.toml: ca_file names key nfs2-ca.pem, which the Secret does not hold"
            ),
        "{}",
        orphans.stdout
    );
    let agents = plugin.run(&["agents", "-o", "json"]).await?;
    assert_eq!(agents.code, 1, "{}", agents.stderr);
    let rows = agents.json()["agents"].clone();
    assert_eq!(rows[0]["name"], "nfs1", "{rows}");
    assert_eq!(rows[0]["health"], "ok", "{rows}");
    assert_eq!(rows[1]["name"], "nfs2", "{rows}");
    assert_eq!(rows[1]["health"], "unreadable", "{rows}");
    let table = plugin.run(&["agents"]).await?;
    assert_eq!(table.code, 1);
    assert!(
        table
            .stdout
            .contains("agent nfs2 (unreadable, Secret nfsprov-agent-nfs2): Secret nfsprov-agent-nfs2: key nfs2.toml"),
        "{}",
        table.stdout
    );
    secrets
        .delete("nfsprov-agent-nfs2", &DeleteParams::default())
        .await?;

    // An unreachable agent.
    system.agents[0].process.kill();
    let orphans = plugin.run(&["orphans"]).await?;
    assert_eq!(orphans.code, 1, "{}", orphans.stderr);
    assert!(
        orphans.stdout.starts_with("No agent could be checked.\n")
            && orphans
                .stdout
                .contains("agent nfs1 not checked: agent unreachable: cannot connect to"),
        "{}",
        orphans.stdout
    );
    let agents = plugin.run(&["agents"]).await?;
    assert_eq!(agents.code, 1, "{}", agents.stderr);
    assert!(
        agents
            .stdout
            .contains("agent nfs1 (unreachable, Secret nfsprov-agent-nfs1): agent unreachable"),
        "{}",
        agents.stdout
    );
    Ok(())
}
