//! The Kubernetes API of a test, on either tier: the in-repo API simulator in this
//! process, or the real API server of `E2E_KUBECONFIG` (the real-API tier,
//! `tests/real-api`).
//!
//! On a real server every name a scenario makes is its own: a namespace per cluster, a
//! provisioner name per cluster (so no other test's controller takes its claims), and
//! class names prefixed with the namespace; all of it is deleted by [`Cluster::finish`]
//! (or, when a scenario panics, by `Drop`). Tests that need the simulator's fault
//! injection, its in-process state or its PV binder switched off ask for
//! [`Tier::Simulator`].

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::api::{Api, PostParams};
use nfsprov_kube_sim::{SimOptions, Simulator};
use nfsprov_vocabulary::names::DEFAULT_PROVISIONER;
use serde_json::{Value, json};

/// How long the custom objects of a finished scenario may take to go on a real server.
const REMOVAL: Duration = Duration::from_secs(60);

/// Where a test runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tier {
    /// The real API server of `E2E_KUBECONFIG` when set, else the simulator.
    FromEnvironment,
    /// The simulator always: the test needs what only it offers.
    Simulator,
}

/// How to start a [`Cluster`].
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    pub tier: Tier,
    /// The simulator's settings, when the test runs on it.
    pub simulator: SimOptions,
    /// The provisioner name on the simulator; a real server gets one of the cluster's own.
    pub provisioner: String,
}

impl Default for ClusterOptions {
    /// The simulator as configured by default (its PV binder on), for the default
    /// provisioner name.
    fn default() -> Self {
        Self {
            tier: Tier::Simulator,
            simulator: SimOptions::default(),
            provisioner: DEFAULT_PROVISIONER.to_owned(),
        }
    }
}

/// A running API: the simulator or a real server, the clients to it and the names a test
/// uses in it.
pub struct Cluster {
    /// The simulator, when the test runs on it.
    pub sim: Option<Simulator>,
    /// The admin's client, which the test acts with.
    pub client: Client,
    /// The controller's client: on a real server the ServiceAccount of `deploy/` when
    /// `E2E_CONTROLLER_KUBECONFIG` is set, so a verb missing from its RBAC fails.
    pub controller_client: Client,
    /// The namespace the test's objects live in.
    pub namespace: String,
    /// The provisioner name the controller answers to and the classes name.
    pub provisioner: String,
    /// The real server's admin kubeconfig, until its objects are removed.
    real_kubeconfig: Option<PathBuf>,
    /// Cluster-scoped objects to remove at the end, by kubectl kind and name.
    cluster_scoped: Mutex<Vec<(String, String)>>,
}

async fn client_of(path: &Path) -> Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(path).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .expect("kubeconfig");
    Client::try_from(config).expect("client")
}

/// A suffix no other cluster of this or another test process uses.
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

impl Cluster {
    /// Starts the simulator, or makes a namespace of its own on the real server.
    pub async fn start(options: ClusterOptions) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let real = match options.tier {
            Tier::FromEnvironment => std::env::var_os("E2E_KUBECONFIG").map(PathBuf::from),
            Tier::Simulator => None,
        };
        let Some(path) = real else {
            let sim = Simulator::start(options.simulator)
                .await
                .expect("the simulator starts");
            let client = sim.client().await;
            return Self {
                sim: Some(sim),
                controller_client: client.clone(),
                client,
                namespace: "default".to_owned(),
                provisioner: options.provisioner,
                real_kubeconfig: None,
                cluster_scoped: Mutex::new(Vec::new()),
            };
        };
        let client = client_of(&path).await;
        let controller_client = match std::env::var_os("E2E_CONTROLLER_KUBECONFIG") {
            Some(path) => client_of(Path::new(&path)).await,
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
        Self {
            sim: None,
            client,
            controller_client,
            namespace,
            provisioner: format!("scenario-{id}.nfsprov.dev/nfs"),
            real_kubeconfig: Some(path),
            cluster_scoped: Mutex::new(Vec::new()),
        }
    }

    /// Whether the test runs on a real API server.
    pub fn is_real(&self) -> bool {
        self.sim.is_none()
    }

    /// The simulator; panics on a real server (a test that needs it asks for
    /// [`Tier::Simulator`]).
    pub fn simulator(&self) -> &Simulator {
        self.sim
            .as_ref()
            .expect("a test on the simulator tier runs on the simulator")
    }

    /// Writes a kubeconfig for the admin to `path`, for a process under test (a
    /// controller binary, the kubectl plugin).
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        match (&self.sim, &self.real_kubeconfig) {
            (Some(sim), _) => sim.write_kubeconfig(path),
            (None, Some(real)) => std::fs::copy(real, path).map(|_| ()),
            (None, None) => Err(std::io::Error::other("the cluster was removed")),
        }
    }

    /// The name of the class a test calls `name`: its own on a real server, where
    /// classes are cluster-scoped and shared by every test.
    pub fn class_name(&self, name: &str) -> String {
        self.scoped_name(name)
    }

    /// The name of a cluster-scoped object (a class, a namespace) a test calls `name`:
    /// prefixed with the cluster's namespace on a real server.
    pub fn scoped_name(&self, name: &str) -> String {
        if self.is_real() {
            format!("{}-{name}", self.namespace)
        } else {
            name.to_owned()
        }
    }

    /// Creates the class the test calls `name`, of this cluster's provisioner.
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

    /// Takes a cluster-scoped object the test made itself (`kind` as kubectl names it)
    /// for removal with the rest.
    pub fn adopt(&self, kind: &str, name: &str) {
        self.cluster_scoped
            .lock()
            .unwrap()
            .push((kind.to_owned(), name.to_owned()));
    }

    /// Stops the simulator, or removes what the test made on a real server. Whatever
    /// runs against the API (a controller) is stopped first.
    pub async fn finish(mut self) {
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await;
            return;
        }
        self.remove_namespace();
    }

    /// Deletes the namespace with what is in it, finalizers and all (the controller that
    /// would remove them is stopped), and the volumes of this cluster's provisioner.
    fn remove_namespace(&mut self) {
        let Some(kubeconfig) = self.real_kubeconfig.take() else {
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
        let output = |args: &[&str]| {
            std::process::Command::new("kubectl")
                .arg("--kubeconfig")
                .arg(&kubeconfig)
                .args(args)
                .output()
                .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
                .unwrap_or_default()
        };
        let ns = self.namespace.as_str();
        let names = |kind: &str| output(&["-n", ns, "get", kind, "-o", "name"]);
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
        let deadline = std::time::Instant::now() + REMOVAL;
        while !names(custom).trim().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        kubectl(&["delete", "namespace", ns, "--wait=false"]);
        for volume in output(&["get", "pv", "-o", "name"]).lines() {
            let provisioned_by = output(&[
                "get",
                volume,
                "-o",
                r#"jsonpath={.metadata.annotations.pv\.kubernetes\.io/provisioned-by}"#,
            ]);
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

impl Drop for Cluster {
    /// A test that panicked leaves nothing on a shared server either.
    fn drop(&mut self) {
        self.remove_namespace();
    }
}
