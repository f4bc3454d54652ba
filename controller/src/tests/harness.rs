//! One way to start a scenario on either tier: the in-repo API simulator, or the real API
//! server of `E2E_KUBECONFIG` (the real-API tier, `tests/real-api`), with mock agents and
//! the whole controller (`controller::run`) running in this process.
//!
//! The API part (the tier, a namespace and provisioner name of the scenario's own on a real
//! server, the removal of what it made) is the integration tests' `Cluster` of
//! `tests/harness`; what is here is what only this crate's tests have: the mock agents and
//! this build of the controller (see that crate's doc for why it cannot run this one).
//! Scenarios that need the simulator's fault injection or its in-process state ask for
//! [`Tier::Simulator`] and are named `*_sim_only`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use nfsprov_api_types::client::AgentConnectionConfig;
use nfsprov_test_harness::{Cluster, ClusterOptions};

use crate::agents::AgentRegistry;
use crate::controller::{self, RunConfig};
use crate::metrics::Metrics;
use crate::tests::builders::PROVISIONER;
use crate::tests::mock_agent::MockAgent;

pub use nfsprov_test_harness::Tier;

/// How long the controller may take to stop (its in-flight reconciles finish first).
const STOP: Duration = Duration::from_secs(60);

pub struct HarnessOptions {
    pub tier: Tier,
    /// Mock agents by name; the first is the default agent.
    pub agents: Vec<&'static str>,
    /// Whether the agents take snapshots.
    pub snapshots: bool,
    /// The usage and health poll's interval and its threshold for agents out of reach;
    /// `None`: no poll.
    pub usage_poll: Option<(Duration, Duration)>,
}

impl Default for HarnessOptions {
    fn default() -> Self {
        Self {
            tier: Tier::FromEnvironment,
            agents: vec!["nfs1"],
            snapshots: false,
            usage_poll: None,
        }
    }
}

/// A running scenario: the API (client as the admin), the agents, the controller.
/// Dereferences to its [`Cluster`] (client, namespace, provisioner, names).
pub struct Harness {
    cluster: Cluster,
    pub agents: Vec<MockAgent>,
    pub metrics: Arc<Metrics>,
    usage_poll: Option<(Duration, Duration)>,
    running: Option<(
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl std::ops::Deref for Harness {
    type Target = Cluster;

    fn deref(&self) -> &Cluster {
        &self.cluster
    }
}

impl Harness {
    /// Starts the API of `options.tier`, the agents and the controller.
    pub async fn start(options: HarnessOptions) -> Self {
        let cluster = Cluster::start(ClusterOptions {
            tier: options.tier,
            provisioner: PROVISIONER.to_owned(),
            ..ClusterOptions::default()
        })
        .await;
        let mut agents = Vec::new();
        for name in &options.agents {
            let agent = MockAgent::start(name).await;
            agent.take_snapshots(options.snapshots);
            agents.push(agent);
        }
        let mut harness = Self {
            cluster,
            agents,
            metrics: Arc::new(Metrics::new()),
            usage_poll: options.usage_poll,
            running: None,
        };
        harness.start_controller();
        harness
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
            self.cluster.controller_client.clone(),
            self.registry(),
            self.metrics.clone(),
            self.run_config(),
            Arc::new(AtomicBool::new(false)),
            stopped,
        ));
        self.running = Some((stop, running));
    }

    fn run_config(&self) -> RunConfig {
        let mut config = RunConfig::reconcilers_only(
            self.cluster.provisioner.as_str(),
            crate::tests::mock_api::test_reporter(),
        );
        if let Some((every, unreachable)) = self.usage_poll {
            config.usage_interval = Some(every);
            config.agent_unreachable = unreachable;
        }
        config
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
        self.cluster.finish().await;
    }
}
