//! The whole program behind `main`: client, agents, probes, signals, leader election.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::Reporter;
use nfsprov_api_types::client::{AgentConnectionConfig, ClientError};
use tokio::sync::watch;
use tracing::{error, info};

use crate::agents::{AgentRegistry, AgentSource};
use crate::config::Args;
use crate::controller::{self, RunConfig};
use crate::http::{self, HttpState};
use crate::leader::{self, LeaderError, LeaseSettings};
use crate::metrics::Metrics;
use crate::objects::Provisioners;

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("Kubernetes client configuration: {0}")]
    KubeConfig(String),
    #[error("Kubernetes client: {0}")]
    Kube(#[from] kube::Error),
    #[error("agents: {0}")]
    Agents(#[from] ClientError),
    #[error("HTTP server on {addr}: {source}")]
    Http {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Leader(#[from] LeaderError),
}

async fn client(args: &Args) -> Result<Client, AppError> {
    let config = match &args.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|e| AppError::KubeConfig(e.to_string()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| AppError::KubeConfig(e.to_string()))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| AppError::KubeConfig(e.to_string()))?,
    };
    Ok(Client::try_from(config)?)
}

/// Turns SIGTERM or Ctrl-C into `true` on the returned channel.
fn shutdown_signal() -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        let terminate = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut signal) => {
                    signal.recv().await;
                }
                Err(e) => {
                    error!(error = %e, "cannot listen for SIGTERM");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            _ = terminate => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        info!("shutting down");
        let _ = tx.send(true);
    });
    rx
}

pub async fn run(args: Args) -> Result<(), AppError> {
    let metrics = Arc::new(Metrics::new());
    let max_in_flight = usize::from(args.max_reconciles_per_agent);
    // Connection files are read before anything else, so a mistake in them stops the
    // start with its own message.
    let from_files = match &args.agents_dir {
        Some(dir) => {
            let configs = AgentConnectionConfig::from_dir(dir)?;
            let mut agents =
                AgentRegistry::with_max_in_flight(&configs, metrics.clone(), max_in_flight)?;
            if let Some(name) = &args.default_agent {
                agents.set_default(name)?;
            }
            Some(agents)
        }
        None => None,
    };
    let client = client(&args).await?;
    let namespace = args
        .lease_namespace
        .clone()
        .unwrap_or_else(|| client.default_namespace().to_owned());
    let agents = match from_files {
        Some(agents) => agents,
        None => {
            let mut agents = AgentRegistry::empty(
                AgentSource::Secrets {
                    namespace: namespace.clone(),
                },
                metrics.clone(),
                max_in_flight,
            );
            if let Some(name) = &args.default_agent {
                agents.set_default(name)?;
            }
            agents
        }
    };
    let agent_secrets = match agents.source() {
        AgentSource::Secrets { namespace } => Some(namespace.clone()),
        AgentSource::Files => None,
    };
    match &agent_secrets {
        Some(namespace) => info!(
            agent_secrets = %namespace, default_agent = ?args.default_agent,
            provisioner = %args.provisioner_name, "starting"
        ),
        None => info!(
            agents = ?agents.names(), default_agent = ?agents.default_name(),
            provisioner = %args.provisioner_name, "starting"
        ),
    }
    let identity = args.identity.clone().unwrap_or_else(|| {
        std::env::var("HOSTNAME").unwrap_or_else(|_| "nfsprov-controller".to_owned())
    });
    let ready = Arc::new(AtomicBool::new(false));
    let shutdown = shutdown_signal();

    let listener = tokio::net::TcpListener::bind(args.http_addr)
        .await
        .map_err(|source| AppError::Http {
            addr: args.http_addr,
            source,
        })?;
    let app = http::router(HttpState {
        ready: ready.clone(),
        metrics: metrics.clone(),
    });
    let mut http_shutdown = shutdown.clone();
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(async move {
                let _ = http_shutdown.wait_for(|stop| *stop).await;
            })
            .await
    });

    let run_config = RunConfig {
        provisioner: Provisioners::new(
            args.provisioner_name.clone(),
            args.additional_provisioner_names.iter().cloned(),
        ),
        resync: Duration::from_secs(args.resync_seconds.max(1)),
        reporter: Reporter {
            controller: "nfsprov-controller".to_owned(),
            instance: Some(identity.clone()),
        },
        concurrency: args.max_concurrent_reconciles,
        usage_interval: args.usage_interval(),
        agent_unreachable: args.agent_unreachable(),
        orphan_check: args.orphan_check(),
        agent_secrets,
        leading: None,
    };
    let controllers = {
        let client = client.clone();
        let ready = ready.clone();
        let shutdown = shutdown.clone();
        move |leading| {
            controller::run(
                client,
                agents,
                metrics,
                RunConfig {
                    leading,
                    ..run_config
                },
                ready,
                shutdown,
            )
        }
    };
    // Ready means the caches are synced, for a standby too: it keeps them as the leader
    // does, so a rolling update that waits for it hands over to a replica that can act
    // at once instead of one that starts listing tens of thousands of objects.
    let result = if args.leader_elect {
        let settings = LeaseSettings {
            name: args.lease_name.clone(),
            namespace,
            identity,
            duration_seconds: args.lease_duration_seconds.max(3),
        };
        leader::run_standing_by(client, &settings, shutdown.clone(), |leading| {
            controllers(Some(leading))
        })
        .await
        .map_err(AppError::from)
    } else {
        controllers(None).await;
        Ok(())
    };
    if result.is_err() {
        // No shutdown signal is coming: stop serving probes so the process can exit and be
        // restarted.
        server.abort();
        return result;
    }
    match server.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => error!(error = %e, "HTTP server failed"),
        Err(e) => error!(error = %e, "HTTP server task failed"),
    }
    result
}
