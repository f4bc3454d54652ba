//! Wiring: the shared [`Context`], per-object backoff, the reconcile entry points handed to
//! kube-runtime, and [`run`], which starts the watches, both controllers and the usage poll.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use nfsprov_api_types::client::ClientError;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::agents::AgentRegistry;
use crate::backoff::Backoff;
use crate::cache::CachedVolume as PersistentVolume;
use crate::events::EventRecorder;
use crate::metrics::Metrics;
use crate::{cache, delete, expand, provision, pv, usage};

/// Longest event note the API accepts is 1 kB; keep a margin for UTF-8 boundaries.
const MAX_NOTE_BYTES: usize = 1000;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("agent {agent}: {source}")]
    Agent {
        agent: String,
        #[source]
        source: ClientError,
    },
    /// Provisioning, expansion or deletion failed for a reason already reported in an event.
    #[error("{0}")]
    Reported(String),
}

/// Everything a reconcile needs.
pub struct Context {
    pub client: Client,
    /// The provisioner name classes and PVs carry (`nfsprov.dev/nfs` by default).
    pub provisioner: String,
    pub agents: AgentRegistry,
    pub classes: Store<StorageClass>,
    pub volumes: Store<PersistentVolume>,
    pub recorder: EventRecorder,
    pub metrics: Arc<Metrics>,
    pub backoff: Backoff,
}

impl Context {
    pub fn new(
        client: Client,
        provisioner: String,
        agents: AgentRegistry,
        classes: Store<StorageClass>,
        volumes: Store<PersistentVolume>,
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
        }
    }

    pub fn class(&self, name: &str) -> Option<Arc<StorageClass>> {
        self.classes.get(&ObjectRef::new(name))
    }

    /// Publishes an event; a failure to do so is logged, never fatal to the reconcile.
    pub async fn event(
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
            note: Some(truncate(note, MAX_NOTE_BYTES)),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, regarding).await {
            warn!(error = %e, reason, "could not publish event");
        }
    }
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

fn claim_key(pvc: &PersistentVolumeClaim) -> String {
    format!(
        "pvc/{}/{}",
        pvc.namespace().unwrap_or_default(),
        pvc.name_any()
    )
}

fn volume_key(pv: &PersistentVolume) -> String {
    format!("pv/{}", pv.name_any())
}

/// Reconciles one claim: provisions it when it is ours and unbound, expands its volume when
/// it is bound to one of ours and asks for more.
pub async fn reconcile_claim(
    pvc: Arc<PersistentVolumeClaim>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let result = if pv::claim_is_bound(&pvc) {
        expand::reconcile(&pvc, &ctx).await
    } else {
        provision::reconcile(&pvc, &ctx).await
    };
    if result.is_ok() {
        ctx.backoff.succeeded(&claim_key(&pvc));
    }
    result
}

pub fn claim_error_policy(
    pvc: Arc<PersistentVolumeClaim>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.backoff.failed(&claim_key(&pvc));
    let work = if pv::claim_is_bound(&pvc) {
        "expansion"
    } else {
        "provisioning"
    };
    warn!(claim = %claim_key(&pvc), %error, retry_in = ?delay, "{work} failed");
    Action::requeue(delay)
}

/// Reconciles one volume: deletes released PVs of ours whose reclaimPolicy is Delete.
pub async fn reconcile_volume(
    pv: Arc<PersistentVolume>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    let result = delete::reconcile(&pv, &ctx).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&volume_key(&pv));
    }
    result
}

pub fn volume_error_policy(pv: Arc<PersistentVolume>, error: &Error, ctx: Arc<Context>) -> Action {
    let delay = ctx.backoff.failed(&volume_key(&pv));
    warn!(volume = %pv.name_any(), %error, retry_in = ?delay, "deletion failed");
    Action::requeue(delay)
}

/// Settings of [`run`].
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub provisioner: String,
    /// Every object is reconciled again this often, whatever happened.
    pub resync: Duration,
    /// Reporter for events (controller name, pod name).
    pub reporter: Reporter,
    /// Most reconciles of one kind running at once; 0 means no limit. A bound on
    /// parallelism, not a rate: it keeps the first full sync of a large cluster from
    /// holding tens of thousands of reconciles in memory at once.
    pub concurrency: u16,
    /// How often every bound volume's usage is measured; `None` turns measuring off.
    pub usage_interval: Option<Duration>,
}

/// Resolves once `shutdown` turns true (or its sender is gone).
pub(crate) async fn stopped(mut shutdown: watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|stop| *stop).await;
}

fn ticks(every: Duration) -> impl futures::Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        tokio::time::interval_at(tokio::time::Instant::now() + every, every),
        |mut interval| async move {
            interval.tick().await;
            Some(((), interval))
        },
    )
}

/// Watches classes, claims and volumes and runs both controllers (and the usage poll) until
/// `shutdown` turns true (then in-flight reconciles finish) or the future is dropped (then
/// they stop at once). `ready` turns true once all three caches hold a complete list.
pub async fn run(
    client: Client,
    agents: AgentRegistry,
    metrics: Arc<Metrics>,
    config: RunConfig,
    ready: Arc<AtomicBool>,
    shutdown: watch::Receiver<bool>,
) {
    let (classes, class_writer) = reflector::store::<StorageClass>();
    let (claims, claim_writer) = reflector::store::<PersistentVolumeClaim>();
    let (volumes, volume_writer) = reflector::store::<PersistentVolume>();
    let ctx = Arc::new(Context::new(
        client.clone(),
        config.provisioner.clone(),
        agents,
        classes.clone(),
        volumes.clone(),
        metrics,
        config.reporter.clone(),
    ));

    // Small list pages keep the transient cost of the first sync (whole objects decoded
    // before they are slimmed) low; the number of requests hardly matters.
    let list_config = || watcher::Config::default().page_size(100);
    let class_stream = watcher(Api::<StorageClass>::all(client.clone()), list_config())
        .default_backoff()
        .modify(cache::strip_meta)
        .reflect(class_writer)
        .applied_objects();
    let claim_stream = watcher(
        Api::<PersistentVolumeClaim>::all(client.clone()),
        list_config(),
    )
    .default_backoff()
    .modify(cache::slim_claim)
    .reflect(claim_writer)
    .applied_objects();
    let provisioner = config.provisioner.clone();
    let volume_stream = watcher(Api::<PersistentVolume>::all(client.clone()), list_config())
        .default_backoff()
        .modify(move |pv| cache::slim_volume(pv, &provisioner))
        .reflect(volume_writer)
        .applied_objects();

    // A class appearing (or changing) re-checks the claims waiting for it.
    let waiting_claims = claims.clone();
    // No rate limit anywhere: the API server's own flow control is the only brake.
    let controller_config = ControllerConfig::default().concurrency(config.concurrency);
    let claim_controller = Controller::for_stream(claim_stream, claims.clone())
        .with_config(controller_config.clone())
        .watches_stream(class_stream, move |class: StorageClass| {
            let name = class.name_any();
            waiting_claims
                .state()
                .into_iter()
                .filter(|pvc| {
                    pv::claim_class(pvc) == Some(name.as_str())
                        && pvc
                            .spec
                            .as_ref()
                            .and_then(|s| s.volume_name.as_deref())
                            .unwrap_or("")
                            .is_empty()
                })
                .map(|pvc| ObjectRef::from_obj(&*pvc))
                .collect::<Vec<_>>()
        })
        .reconcile_all_on(ticks(config.resync))
        .graceful_shutdown_on(stopped(shutdown.clone()))
        .run(reconcile_claim, claim_error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "claim controller");
            }
        });
    let usage_poll = {
        let ctx = ctx.clone();
        let claims = claims.clone();
        let shutdown = shutdown.clone();
        async move {
            if let Some(every) = config.usage_interval {
                usage::run(ctx, claims, every, shutdown).await;
            }
        }
    };
    let volume_controller = Controller::for_stream(volume_stream, volumes.clone())
        .with_config(controller_config)
        .reconcile_all_on(ticks(config.resync))
        .graceful_shutdown_on(stopped(shutdown))
        .run(reconcile_volume, volume_error_policy, ctx)
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "volume controller");
            }
        });
    let readiness = async move {
        let synced = futures::future::try_join3(
            classes.wait_until_ready(),
            claims.wait_until_ready(),
            volumes.wait_until_ready(),
        )
        .await;
        if synced.is_ok() {
            info!("caches synced");
            ready.store(true, Ordering::SeqCst);
        }
    };
    tokio::join!(claim_controller, volume_controller, readiness, usage_poll);
}
