//! One way for nfsprov's tests to start what they run against: the Kubernetes API (the
//! in-repo simulator, or the real API server of the real-API tier), real agents on
//! temporary export roots, and, with the `controller` feature, the whole controller
//! (`controller::run`) in the test's process. Every integration test of the controller
//! and the kubectl plugin starts its API through [`Harness::start`]; the controller's
//! unit scenarios (`controller/src/tests/harness.rs`) start theirs through
//! [`Cluster::start`], the part they share.
//!
//! Why a crate of its own: the API part needs the simulator, the agents part the agent's
//! testkit, the controller part the controller. In the simulator's crate, the simulator
//! would depend on the agent and the controller; in the controller's crate, the kubectl
//! plugin's tests would link the controller (the plugin stays clear of it), and the
//! controller's integration tests could reach nothing compiled for its tests only. Here,
//! the controller is an optional dependency behind `controller`, and the controller's
//! dev-dependency on this crate is a cycle cargo allows: its integration tests link one
//! controller, the library they test. Its unit tests are compiled as another crate than
//! the one this crate links, so their controller types differ from this crate's: they use
//! [`Cluster`] (which names no controller type) and run their own controller, with mock
//! agents, in `controller/src/tests/harness.rs`.
//!
//! The end-to-end suite (`tests/e2e`) runs the project's binaries as processes and has
//! its own harness there (`nfsprov_e2e::cluster`, `nfsprov_e2e::system`); the
//! simulator's own tests start the [`nfsprov_kube_sim::Simulator`] they test directly.

pub mod agents;
pub mod cluster;

use std::ops::Deref;
use std::path::PathBuf;
#[cfg(feature = "controller")]
use std::sync::Arc;
#[cfg(feature = "controller")]
use std::sync::atomic::AtomicBool;
#[cfg(feature = "controller")]
use std::time::Duration;

pub use agents::Agent;
pub use cluster::{Cluster, ClusterOptions, Tier};
#[cfg(feature = "controller")]
use nfsprov_controller::{
    agents::AgentRegistry,
    controller::{self as reconcilers, RunConfig},
    metrics::Metrics,
};
pub use nfsprov_kube_sim::{SimOptions, Simulator};

/// How long the controller may take to stop (its in-flight reconciles finish first).
#[cfg(feature = "controller")]
const STOP: Duration = Duration::from_secs(60);

/// How to start a [`Harness`].
#[derive(Debug, Clone, Default)]
pub struct HarnessOptions {
    /// The API: its tier, the simulator's settings, the provisioner name.
    pub cluster: ClusterOptions,
    /// Real agents by name; the first is the default agent of a controller run here.
    pub agents: Vec<&'static str>,
    /// Whether the controller runs from the start ([`Harness::run_config`]); a test that
    /// runs it otherwise calls [`Harness::start_controller`] itself.
    #[cfg(feature = "controller")]
    pub controller: bool,
}

impl HarnessOptions {
    /// The simulator with `options`, nothing else.
    pub fn simulator(options: SimOptions) -> Self {
        Self {
            cluster: ClusterOptions {
                simulator: options,
                ..ClusterOptions::default()
            },
            ..Self::default()
        }
    }

    /// The simulator without its PV binder: claims and volumes are only what clients
    /// write, as when no kube-controller-manager runs.
    pub fn without_binder() -> Self {
        Self::simulator(SimOptions {
            binder: false,
            ..SimOptions::default()
        })
    }
}

/// A running test setup: the API, the agents and, when asked for, the controller.
/// Dereferences to its [`Cluster`] (client, namespace, provisioner, names).
pub struct Harness {
    cluster: Cluster,
    pub agents: Vec<Agent>,
    /// Files a process under test reads: the kubeconfig, the agents' connection files.
    work: tempfile::TempDir,
    #[cfg(feature = "controller")]
    pub metrics: Arc<Metrics>,
    /// Turns true once the controller's caches are synced.
    #[cfg(feature = "controller")]
    pub ready: Arc<AtomicBool>,
    #[cfg(feature = "controller")]
    running: Option<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Deref for Harness {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl Harness {
    /// Starts the API, the agents and, when `options.controller`, the controller.
    pub async fn start(options: HarnessOptions) -> Self {
        let cluster = Cluster::start(options.cluster).await;
        let mut agents = Vec::new();
        for name in &options.agents {
            agents.push(Agent::start(name).await);
        }
        #[cfg_attr(not(feature = "controller"), allow(unused_mut))]
        let mut harness = Self {
            cluster,
            agents,
            work: tempfile::tempdir().expect("a work directory"),
            #[cfg(feature = "controller")]
            metrics: Arc::new(Metrics::new()),
            #[cfg(feature = "controller")]
            ready: Arc::new(AtomicBool::new(false)),
            #[cfg(feature = "controller")]
            running: None,
        };
        #[cfg(feature = "controller")]
        if options.controller {
            harness.start_controller(harness.run_config());
        }
        harness
    }

    /// The agent called `name`.
    pub fn agent(&self, name: &str) -> &Agent {
        self.agents
            .iter()
            .find(|agent| agent.name == name)
            .unwrap_or_else(|| panic!("no agent {name} in this harness"))
    }

    /// A kubeconfig file of the admin, for a process under test.
    pub fn kubeconfig(&self) -> PathBuf {
        let path = self.work.path().join("kubeconfig");
        self.cluster
            .write_kubeconfig(&path)
            .expect("the kubeconfig is written");
        path
    }

    /// A directory with one connection file per agent, for a process under test.
    pub fn agents_dir(&self) -> PathBuf {
        agents::write_connection_files(&self.work.path().join("agents"), &self.agents)
            .expect("the agents' connection files are written")
    }

    /// Stops the controller, if it runs, then the agents (each must finish serving
    /// cleanly), then the API.
    pub async fn finish(mut self) {
        #[cfg(feature = "controller")]
        self.stop_controller().await;
        for agent in self.agents.drain(..) {
            let name = agent.name.clone();
            agent
                .stop()
                .await
                .unwrap_or_else(|e| panic!("agent {name} did not stop cleanly: {e}"));
        }
        self.cluster.finish().await;
    }
}

#[cfg(feature = "controller")]
impl Harness {
    /// Who the events of a controller run here come from.
    pub fn reporter() -> kube::runtime::events::Reporter {
        kube::runtime::events::Reporter {
            controller: "nfsprov-controller".to_owned(),
            instance: Some("test".to_owned()),
        }
    }

    /// The reconcilers alone, for this harness' provisioner: what a test adds to
    /// (an orphan check, a usage poll) before [`Harness::start_controller`].
    pub fn run_config(&self) -> RunConfig {
        RunConfig::reconcilers_only(self.provisioner.as_str(), Self::reporter())
    }

    /// The agents as the controller knows them; the first is the default.
    pub fn registry(&self) -> AgentRegistry {
        let configs: Vec<_> = self
            .agents
            .iter()
            .enumerate()
            .map(
                |(at, agent)| nfsprov_api_types::client::AgentConnectionConfig {
                    default: at == 0,
                    ..agent.connection()
                },
            )
            .collect();
        AgentRegistry::new(&configs, self.metrics.clone()).expect("registry")
    }

    /// Runs the whole controller with `config` as the controller's identity.
    pub fn start_controller(&mut self, config: RunConfig) {
        assert!(self.running.is_none(), "the controller runs already");
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let running = tokio::spawn(reconcilers::run(
            self.cluster.controller_client.clone(),
            self.registry(),
            self.metrics.clone(),
            config,
            self.ready.clone(),
            stopped,
        ));
        self.running = Some((stop, running));
    }

    /// Stops the controller and waits until its in-flight reconciles are done.
    pub async fn stop_controller(&mut self) {
        if let Some((stop, running)) = self.running.take() {
            stop.send(true).unwrap();
            tokio::time::timeout(STOP, running)
                .await
                .expect("the controller stops on shutdown")
                .unwrap();
        }
    }
}
