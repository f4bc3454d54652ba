//! One way to start a scenario on either tier: the in-repo API simulator, or the real API
//! server of `E2E_KUBECONFIG` (the real-API tier, `tests/real-api`), with mock agents and
//! the whole controller (`controller::run`) running in this process.
//!
//! On a real server every name a scenario makes is its own: a namespace per harness, a
//! provisioner name per harness (so no other test's controller takes its claims), and
//! class names prefixed with the namespace; all of it is deleted by [`Harness::finish`]
//! (or, when a scenario panics, by `Drop`). Scenarios that need the simulator's fault
//! injection or its in-process state ask for [`Tier::Simulator`] and are named `*_sim_only`.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, PostParams};
use nfsprov_api_types::client::AgentConnectionConfig;
use nfsprov_kube_sim::{SimOptions, Simulator};
use serde_json::{Value, json};

use crate::agents::AgentRegistry;
use crate::controller::{self, RunConfig};
use crate::metrics::Metrics;
use crate::tests::builders::PROVISIONER;
use crate::tests::mock_agent::MockAgent;

/// How long the controller may take to stop (its in-flight reconciles finish first).
const STOP: Duration = Duration::from_secs(60);

/// Where a scenario runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The real API server of `E2E_KUBECONFIG` when set, else the simulator.
    FromEnvironment,
    /// The simulator always: the scenario needs what only it offers (its fault
    /// injection, watch cuts or compaction). No scenario of these suites does yet.
    #[allow(dead_code)]
    Simulator,
}

pub struct HarnessOptions {
    pub tier: Tier,
    /// Mock agents by name; the first is the default agent.
    pub agents: Vec<&'static str>,
    /// Whether the agents take snapshots.
    pub snapshots: bool,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            tier: Tier::FromEnvironment,
            agents: vec!["nfs1"],
            snapshots: false,
        }
    }
}

/// A running scenario: the API (client as the admin), the agents, the controller.
pub struct Harness {
    /// The simulator, when the scenario runs on it.
    pub sim: Option<Simulator>,
    /// The admin's client, which the scenario acts with.
    pub client: Client,
    /// The controller's client: on a real server the ServiceAccount of `deploy/` when
    /// `E2E_CONTROLLER_KUBECONFIG` is set, so a verb missing from its RBAC fails.
    controller_client: Client,
    pub agents: Vec<MockAgent>,
    pub metrics: Arc<Metrics>,
    /// The namespace the scenario's objects live in.
    pub namespace: String,
    /// The provisioner name the controller answers to and the classes name.
    pub provisioner: String,
    kubeconfig: Option<PathBuf>,
    /// Cluster-scoped objects to remove at the end, by kubectl kind and name.
    cluster_scoped: std::sync::Mutex<Vec<(String, String)>>,
    running: Option<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
}

async fn client_of(path: &PathBuf) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A suffix no other harness of this or another test process uses.
fn unique() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or_default();
    format!(
        "{}-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed),
        nanos % 100_000
    )
}

impl Harness {
    /// Starts the API of `options.tier`, the agents and the controller.
    pub async fn start(options: HarnessOptions) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let real = match options.tier {
            Tier::FromEnvironment => std::env::var_os("E2E_KUBECONFIG").map(PathBuf::from),
            Tier::Simulator => None,
        };
        let (sim, client, controller_client, namespace, provisioner) = match &real {
            None => {
                let sim = Simulator::start(SimOptions::default()).await.unwrap();
                let client = sim.client().await;
                (
                    Some(sim),
                    client.clone(),
                    client,
                    "default".to_owned(),
                    PROVISIONER.to_owned(),
                )
            }
            Some(path) => {
                let client = client_of(path).await;
                let controller_client = match std::env::var_os("E2E_CONTROLLER_KUBECONFIG") {
                    Some(path) => client_of(&PathBuf::from(path)).await,
                    None => client.clone(),
                };
                let id = unique();
                let namespace = format!("scenario-{id}");
                Api::<Namespace>::all(client.clone())
                    .create(
                        &PostParams::default(),
                        &serde_json::from_value(json!({"metadata": {"name": namespace}})).unwrap(),
                    )
                    .await
                    .unwrap();
                (
                    None,
                    client,
                    controller_client,
                    namespace,
                    format!("scenario-{id}.nfsprov.dev/nfs"),
                )
            }
        };
        let mut agents = Vec::new();
        for name in &options.agents {
            let agent = MockAgent::start(name).await;
            agent.take_snapshots(options.snapshots);
            agents.push(agent);
        }
        let mut harness = Self {
            sim,
            client,
            controller_client,
            agents,
            metrics: Arc::new(Metrics::new()),
            namespace,
            provisioner,
            kubeconfig: real,
            cluster_scoped: std::sync::Mutex::new(Vec::new()),
            running: None,
        };
        harness.start_controller();
        harness
    }

    /// Whether the scenario runs on a real API server.
    pub fn is_real(&self) -> bool {
        self.sim.is_none()
    }

    /// The name of the class a scenario calls `name`: its own on a real server, where
    /// classes are cluster-scoped and shared by every test.
    pub fn class_name(&self, name: &str) -> String {
        self.scoped_name(name)
    }

    /// The name of a cluster-scoped object (a class, a namespace) a scenario calls
    /// `name`: prefixed with the harness' namespace on a real server.
    pub fn scoped_name(&self, name: &str) -> String {
        if self.is_real() {
            format!("{}-{name}", self.namespace)
        } else {
            name.to_owned()
        }
    }

    /// Creates the class the scenario calls `name`, of this harness' provisioner.
    pub async fn create_class(&self, name: &str, parameters: Value) {
        let class_name = self.class_name(name);
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class_name},
            "provisioner": self.provisioner,
            "parameters": parameters,
        }))
        .unwrap();
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
        self.adopt("storageclass", &class_name);
    }

    /// Takes a cluster-scoped object the scenario made itself (`kind` as kubectl names
    /// it) for removal with the rest.
    pub fn adopt(&self, kind: &str, name: &str) {
        self.cluster_scoped
            .lock()
            .unwrap()
            .push((kind.to_owned(), name.to_owned()));
    }

    fn registry(&self) -> AgentRegistry {
        let configs: Vec<AgentConnectionConfig> = self
            .agents
            .iter()
            .enumerate()
            .map(|(at, agent)| AgentConnectionConfig {
                default: at == 0,
                ..agent.config.clone()
            })
            .collect();
        AgentRegistry::new(&configs, self.metrics.clone()).expect("registry")
    }

    pub fn start_controller(&mut self) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(controller::run(
            self.controller_client.clone(),
            self.registry(),
            self.metrics.clone(),
            RunConfig::reconcilers_only(
                self.provisioner.as_str(),
                crate::tests::mock_api::test_reporter(),
            ),
            Arc::new(AtomicBool::new(false)),
            stopped,
        ));
        self.running = Some((stop, running));
    }

    pub async fn stop_controller(&mut self) {
        if let Some((stop, running)) = self.running.take() {
            stop.send(true).unwrap();
            tokio::time::timeout(STOP, running)
                .await
                .expect("controller stopped")
                .unwrap();
        }
    }

    /// Stops the controller and the simulator, or removes what the scenario made on a
    /// real server.
    pub async fn finish(mut self) {
        self.stop_controller().await;
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
            return;
        }
        self.remove_namespace();
    }

    /// Deletes the namespace with what is in it, finalizers and all (the controller that
    /// would remove them is stopped), and the volumes of this harness' provisioner.
    fn remove_namespace(&mut self) {
        let Some(kubeconfig) = self.kubeconfig.take() else {
            return;
        };
        let kubectl = |args: &[&str]| {
            let _ = std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status();
        };
        let ns = self.namespace.as_str();
        let names = |kind: &str| {
            std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(["-n", ns, "get", kind, "-o", "name"])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        // The custom objects go first and for good: every controller watches them in the
        // whole cluster, and the next scenario's would take up one left to the namespace's
        // slow deletion, and ask its own agent of the same name to delete its snapshot.
        let custom = "snapshots.nfsprov.dev,snapshotschedules.nfsprov.dev";
        kubectl(&["-n", ns, "delete", custom, "--all", "--wait=false"]);
        for kind in [custom, "pvc"] {
            for object in names(kind).lines() {
                kubectl(&[
                    "-n",
                    ns,
                    "patch",
                    object,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
            }
        }
        let deadline = std::time::Instant::now() + STOP;
        while !names(custom).trim().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        kubectl(&["delete", "namespace", ns, "--wait=false"]);
        let volumes = std::process::Command::new("kubectl")
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["get", "pv", "-o", "name"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        for volume in volumes.lines() {
            let provisioned_by = std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args([
                    "get",
                    volume,
                    "-o",
                    r#"jsonpath={.metadata.annotations.pv\.kubernetes\.io/provisioned-by}"#,
                ])
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default();
            if provisioned_by == self.provisioner {
                kubectl(&[
                    "patch",
                    volume,
                    "--type=merge",
                    "-p",
                    r#"{"metadata":{"finalizers":null}}"#,
                ]);
                kubectl(&["delete", volume, "--wait=false"]);
            }
        }
        for (kind, name) in std::mem::take(&mut *self.cluster_scoped.lock().unwrap()) {
            kubectl(&["delete", &kind, &name, "--wait=false"]);
        }
    }
}

impl Drop for Harness {
    /// A scenario that panicked leaves nothing on a shared server either.
    fn drop(&mut self) {
        self.remove_namespace();
    }
}
