//! What every reconciler shares: the [`Context`] (client, caches, agents, events,
//! metrics, backoff), the [`Error`] a reconcile ends with, and event publishing.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Client;
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use nfsprov_api_types::client::ClientError;
use tokio::sync::watch;
use tracing::warn;

use crate::agents::{AgentRegistry, InfoError};
use crate::backoff::Backoff;
use crate::events::{EventRecorder, note_text};
use crate::metrics::Metrics;
use crate::mounters::Mounters;
use crate::objects::{CachedVolume, Provisioners};
use crate::reported::ReportedFailures;

#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("agent {agent}: {source}")]
    Agent {
        agent: String,
        #[source]
        source: ClientError,
    },
    #[error("agent {agent}: {source}")]
    AgentInfo {
        agent: String,
        #[source]
        source: InfoError,
    },
    /// Provisioning, expansion or deletion failed for a reason already reported in an event.
    #[error("{0}")]
    Reported(String),
}

/// Everything a reconcile needs.
pub(crate) struct Context {
    pub(crate) client: Client,
    /// The provisioner names classes and PVs carry (`nfsprov.dev/nfs` by default, plus
    /// any additional names).
    pub(crate) provisioner: Provisioners,
    pub(crate) agents: AgentRegistry,
    pub(crate) classes: Store<StorageClass>,
    pub(crate) volumes: Store<CachedVolume>,
    pub(crate) recorder: EventRecorder,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) backoff: Backoff,
    /// Permanent provisioning failures already reported, so resyncs do not repeat them.
    pub(crate) reported: ReportedFailures,
    /// Whether this replica leads (always, without leader election): nothing acts before.
    pub(crate) leading: watch::Receiver<bool>,
    /// Nodes and scheduled Pods, for the exports that follow them.
    pub(crate) mounters: Mounters,
}

impl Context {
    pub(crate) fn new(
        client: Client,
        provisioner: Provisioners,
        agents: AgentRegistry,
        classes: Store<StorageClass>,
        volumes: Store<CachedVolume>,
        metrics: Arc<Metrics>,
        reporter: Reporter,
    ) -> Self {
        Self {
            recorder: EventRecorder::new(client.clone(), reporter),
            client,
            provisioner,
            agents,
            classes,
            volumes,
            metrics,
            backoff: Backoff::default(),
            reported: ReportedFailures::default(),
            leading: watch::channel(true).1,
            mounters: Mounters::default(),
        }
    }

    /// Returns once this replica leads. A standby's reconciles wait here; its controllers
    /// are dropped, not shut down gracefully, should it stop before leading.
    pub(crate) async fn leading(&self) {
        let mut leading = self.leading.clone();
        if leading.wait_for(|leader| *leader).await.is_err() {
            // The election is over without this replica leading: it never acts.
            std::future::pending::<()>().await;
        }
    }

    /// Returns true once this replica leads, false if `shutdown` comes first.
    pub(crate) async fn leading_or(&self, shutdown: &watch::Receiver<bool>) -> bool {
        tokio::select! {
            () = self.leading() => true,
            () = stopped(shutdown.clone()) => false,
        }
    }

    pub(crate) fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    /// Publishes an event; a failure to do so is logged, never fatal to the reconcile.
    pub(crate) async fn event(
        &self,
        regarding: &ObjectReference,
        type_: EventType,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note_text(note)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            warn!(error = %e, reason, "could not publish event");
        }
    }
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub(crate) async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}
