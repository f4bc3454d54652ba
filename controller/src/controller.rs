//! Wiring only: the watches and their caches, the two kube-runtime controllers handed
//! the entry points of [`crate::reconcile`], the periodic resync, the usage poll and the
//! orphan check.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, future};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::Controller;
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use tokio::sync::watch;
use tracing::{debug, info};

use crate::agents::AgentRegistry;
use crate::config::OrphanSettings;
use crate::context::{Context, stopped};
use crate::metrics::Metrics;
use crate::objects::{CachedClaim, CachedVolume, Provisioners, claim_class, claim_is_bound};
use crate::reconcile::{
    claim_error_policy, reconcile_claim, reconcile_volume, volume_error_policy,
};
use crate::{agent_secrets, cache, orphans, usage};

/// Settings of [`run`].
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub provisioner: Provisioners,
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
    /// The orphan check; `None` turns it off.
    pub orphan_check: Option<OrphanSettings>,
    /// The namespace whose agent Secrets are watched into the agents; `None` when the
    /// agents come from connection files.
    pub agent_secrets: Option<String>,
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
    let (claims, claim_writer) = reflector::store::<CachedClaim>();
    let (volumes, volume_writer) = reflector::store::<CachedVolume>();
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
    let claim_stream = watcher(Api::<CachedClaim>::all(client.clone()), list_config())
        .default_backoff()
        .try_filter_map(|event| future::ready(Ok(cache::claim_event(event))))
        .modify(cache::slim_claim)
        .reflect(claim_writer)
        .applied_objects();
    let provisioner = config.provisioner.clone();
    let volume_stream = watcher(Api::<CachedVolume>::all(client.clone()), list_config())
        .default_backoff()
        .modify(move |pv| cache::slim_volume(pv, &provisioner))
        .reflect(volume_writer)
        .applied_objects();

    // A class appearing (or changing) re-checks the claims waiting for it, and so does
    // any change of the agents (a Secret added, mended or removed).
    let waiting_claims = claims.clone();
    let waiting = {
        let claims = claims.clone();
        move || {
            claims
                .state()
                .into_iter()
                .filter(|pvc| !claim_is_bound(&**pvc))
                .map(|pvc| ObjectRef::from_obj(&*pvc))
                .collect::<Vec<_>>()
        }
    };
    let agent_changes = ctx
        .agents
        .changes()
        .flat_map(move |()| futures::stream::iter(waiting()));
    let secret_watch = {
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        async move {
            if let Some(namespace) = config.agent_secrets {
                agent_secrets::run(ctx, namespace, shutdown).await;
            }
        }
    };
    // No rate limit anywhere: the API server's own flow control is the only brake.
    let controller_config =
        kube::runtime::controller::Config::default().concurrency(config.concurrency);
    let claim_controller = Controller::for_stream(claim_stream, claims.clone())
        .with_config(controller_config.clone())
        .watches_stream(class_stream, move |class: StorageClass| {
            let name = class.name_any();
            waiting_claims
                .state()
                .into_iter()
                .filter(|pvc| claim_class(&**pvc) == Some(name.as_str()) && !claim_is_bound(&**pvc))
                .map(|pvc| ObjectRef::from_obj(&*pvc))
                .collect::<Vec<_>>()
        })
        .reconcile_on(agent_changes)
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
        let shutdown = shutdown.clone();
        async move {
            if let Some(every) = config.usage_interval {
                usage::run(ctx, every, shutdown).await;
            }
        }
    };
    let orphan_check = {
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        async move {
            if let Some(settings) = config.orphan_check {
                orphans::run(ctx, settings, shutdown).await;
            }
        }
    };
    let export_sync = crate::exports::run(ctx.clone(), config.resync, shutdown.clone());
    let agents = ctx.agents.clone();
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
            agents.ready().await;
            info!("caches synced");
            ready.store(true, Ordering::SeqCst);
        }
    };
    tokio::join!(
        claim_controller,
        volume_controller,
        readiness,
        usage_poll,
        orphan_check,
        secret_watch,
        export_sync
    );
}
