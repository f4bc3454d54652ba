//! Wiring only: the watches and their caches, the kube-runtime controllers handed
//! the entry points of `crate::reconcile`, the periodic resync, the usage poll and the
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
use tracing::{debug, info, warn};

use crate::agents::AgentRegistry;
use crate::config::OrphanSettings;
use crate::context::{Context, stopped};
use crate::metrics::Metrics;
use crate::objects::{CachedClaim, CachedVolume, Provisioners, claim_class, claim_is_bound};
use crate::reconcile::{
    claim_error_policy, reconcile_claim, reconcile_schedule, reconcile_snapshot, reconcile_volume,
    schedule_error_policy, snapshot_error_policy, volume_error_policy,
};
use crate::{agent_secrets, cache, orphans, usage};
use nfsprov_vocabulary::snapshots::{Snapshot, SnapshotSchedule};

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
    /// Whether this replica leads. Until it turns true the caches fill and follow the
    /// API like a leader's, but nothing acts (no reconcile, usage poll or orphan check),
    /// so a standby is ready to take over without listing anything. `None`: no leader
    /// election, this replica acts from the start.
    pub leading: Option<watch::Receiver<bool>>,
}

impl RunConfig {
    /// The reconcilers alone, for `provisioner`, with events reported as `reporter`: no
    /// usage poll, no orphan check, agents from connection files and no leader election;
    /// everything reconciled again every 10 minutes, at most 16 reconciles of a kind at
    /// once (the command line's defaults).
    pub fn reconcilers_only(provisioner: impl Into<Provisioners>, reporter: Reporter) -> Self {
        RunConfig {
            provisioner: provisioner.into(),
            resync: Duration::from_secs(600),
            reporter,
            concurrency: 16,
            usage_interval: None,
            orphan_check: None,
            agent_secrets: None,
            leading: None,
        }
    }
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
/// they stop at once). `ready` turns true once all three caches hold a complete list, the
/// volumes' first (a claim whose PV is listed is never held, see [`cache::ClaimFilter`]).
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
    let mut ctx = Context::new(
        client.clone(),
        config.provisioner.clone(),
        agents,
        classes.clone(),
        volumes.clone(),
        metrics,
        config.reporter.clone(),
    );
    if let Some(leading) = config.leading.clone() {
        ctx.leading = leading;
    }
    let ctx = Arc::new(ctx);
    let claim_filter = cache::ClaimFilter::new(config.provisioner.clone(), volumes.clone());
    // Claims the volume watch takes out of the claim cache, or brings back, merged into
    // the claim watch so that the store has one writer. Bounded: a take-out dropped when
    // it is full leaves a claim held, which costs memory, never correctness.
    let (claim_changes, claim_changes_rx) =
        tokio::sync::mpsc::channel::<watcher::Event<CachedClaim>>(1024);
    let (reread, reread_rx) = tokio::sync::mpsc::unbounded_channel::<(String, String, String)>();

    // Small list pages keep the transient cost of the first sync (whole objects decoded
    // before they are slimmed) low; the number of requests hardly matters.
    let list_config = || watcher::Config::default().page_size(100);
    let class_stream = watcher(Api::<StorageClass>::all(client.clone()), list_config())
        .default_backoff()
        .modify(cache::strip_meta)
        .reflect(class_writer)
        .applied_objects();
    // The claims are listed once the volumes are: a pending claim whose PV exists is then
    // never stored, which after a restart in a burst is most of them.
    // Told by the volume watch itself: a store's readiness wakes only one of the futures
    // waiting for it, and the volume controller and `ready` wait for it already.
    let (volumes_listed, mut volumes_listed_rx) = watch::channel(false);
    let claim_watch = {
        let client = client.clone();
        futures::stream::once(async move {
            let _ = volumes_listed_rx.wait_for(|listed| *listed).await;
        })
        .flat_map(move |()| {
            watcher(Api::<CachedClaim>::all(client.clone()), list_config()).default_backoff()
        })
    };
    let claim_stream = futures::stream::select(
        claim_watch,
        receiver_stream(claim_changes_rx).map(Ok::<_, watcher::Error>),
    )
    .try_filter_map({
        let filter = claim_filter.clone();
        move |event| future::ready(Ok(filter.event(event)))
    })
    .modify(cache::slim_claim)
    .reflect(claim_writer)
    .applied_objects();
    let provisioner = config.provisioner.clone();
    let claim_changes_for_reread = claim_changes.clone();
    let parking = {
        let claims = claims.clone();
        move |event: &watcher::Event<CachedVolume>| match event {
            watcher::Event::Apply(pv) | watcher::Event::InitApply(pv) => {
                if let Some(change) = claim_filter.parked(pv, &claims) {
                    let _ = claim_changes.try_send(change);
                }
            }
            watcher::Event::Delete(pv) => {
                if let Some(claim) = claim_filter.unparked(pv) {
                    let _ = reread.send(claim);
                }
            }
            watcher::Event::InitDone => {
                volumes_listed.send_replace(true);
            }
            watcher::Event::Init => {}
        }
    };
    let volume_stream = watcher(Api::<CachedVolume>::all(client.clone()), list_config())
        .default_backoff()
        .modify(move |pv| cache::slim_volume(pv, &provisioner))
        .reflect(volume_writer)
        .inspect_ok(parking)
        .applied_objects();
    let rereading = reread_claims(
        client.clone(),
        reread_rx,
        claim_changes_for_reread,
        shutdown.clone(),
    );

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
    // A Snapshot appearing or becoming ready re-checks the claims restored from it.
    let (snapshot_changes, snapshot_changes_rx) =
        tokio::sync::mpsc::unbounded_channel::<ObjectRef<CachedClaim>>();
    let restoring = {
        let claims = claims.clone();
        move |snapshot: &Snapshot| {
            let namespace = snapshot.namespace().unwrap_or_default();
            let name = snapshot.name_any();
            for pvc in claims.state() {
                // Most claims name no source: looked at without unpacking them.
                let names_it = pvc.spec.as_ref().is_some_and(|spec| {
                    let by_ref = spec.data_source_ref.as_ref().map(|r| &r.name);
                    let by_source = spec.data_source.as_ref().map(|s| &s.name);
                    by_ref.or(by_source) == Some(&name)
                });
                if names_it
                    && !claim_is_bound(&*pvc)
                    && pvc.metadata.namespace.as_deref() == Some(namespace.as_str())
                    && crate::datasource::restores_from(&pvc.to_claim(), &name)
                {
                    let _ = snapshot_changes.send(ObjectRef::from_obj(&*pvc));
                }
            }
        }
    };
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
        .reconcile_on(unbounded_receiver_stream(snapshot_changes_rx))
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
            if let Some(every) = config.usage_interval
                && ctx.leading_or(&shutdown).await
            {
                usage::run(ctx, every, shutdown).await;
            }
        }
    };
    let orphan_check = {
        let ctx = ctx.clone();
        let shutdown = shutdown.clone();
        async move {
            if let Some(settings) = config.orphan_check
                && ctx.leading_or(&shutdown).await
            {
                orphans::run(ctx, settings, shutdown).await;
            }
        }
    };
    let export_sync = crate::exports::run(ctx.clone(), config.resync, shutdown.clone());
    // Without the CRDs installed the watch fails and backs off; nothing else waits for it.
    let (snapshots, snapshot_writer) = reflector::store::<Snapshot>();
    let snapshot_stream = watcher(Api::<Snapshot>::all(client.clone()), list_config())
        .default_backoff()
        .reflect(snapshot_writer)
        .applied_objects()
        .inspect_ok(move |snapshot| restoring(snapshot));
    let snapshot_controller = Controller::for_stream(snapshot_stream, snapshots)
        .with_config(controller_config.clone())
        .reconcile_all_on(ticks(config.resync))
        .graceful_shutdown_on(stopped(shutdown.clone()))
        .run(reconcile_snapshot, snapshot_error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "snapshot controller");
            }
        });
    let (schedules, schedule_writer) = reflector::store::<SnapshotSchedule>();
    let schedule_stream = watcher(Api::<SnapshotSchedule>::all(client.clone()), list_config())
        .default_backoff()
        .reflect(schedule_writer)
        .applied_objects();
    let schedule_controller = Controller::for_stream(schedule_stream, schedules)
        .with_config(controller_config.clone())
        .graceful_shutdown_on(stopped(shutdown.clone()))
        .run(reconcile_schedule, schedule_error_policy, ctx.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                debug!(error = %e, "snapshot schedule controller");
            }
        });
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
        snapshot_controller,
        schedule_controller,
        readiness,
        usage_poll,
        orphan_check,
        secret_watch,
        rereading,
        export_sync
    );
}

/// The items of a channel, as a stream.
fn receiver_stream<T: Send + 'static>(
    receiver: tokio::sync::mpsc::Receiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
}

fn unbounded_receiver_stream<T: Send + 'static>(
    receiver: tokio::sync::mpsc::UnboundedReceiver<T>,
) -> impl futures::Stream<Item = T> + Send + 'static {
    futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|item| (item, receiver))
    })
}

/// Reads again each claim whose PV went before the binder bound it, and hands it to the
/// claim watch when it is still the same claim: the claim cache may have let it go
/// while its PV existed. A failed read is tried again a few times, then logged.
async fn reread_claims(
    client: Client,
    requests: tokio::sync::mpsc::UnboundedReceiver<(String, String, String)>,
    changes: tokio::sync::mpsc::Sender<watcher::Event<CachedClaim>>,
    shutdown: watch::Receiver<bool>,
) {
    let requests = futures::stream::unfold(requests, |mut requests| async move {
        requests.recv().await.map(|item| (item, requests))
    });
    requests
        .take_until(stopped(shutdown))
        .for_each(|(namespace, name, uid)| {
            let client = client.clone();
            let changes = changes.clone();
            async move {
                let api: Api<CachedClaim> = Api::namespaced(client, &namespace);
                let mut wait = Duration::from_secs(1);
                for attempt in 1..=5 {
                    match api.get_opt(&name).await {
                        Ok(Some(claim)) => {
                            if claim.metadata.uid.as_deref() == Some(uid.as_str()) {
                                let _ = changes.send(watcher::Event::Apply(claim)).await;
                            }
                            return;
                        }
                        Ok(None) => return,
                        Err(e) if attempt == 5 => {
                            warn!(claim = %format!("{namespace}/{name}"), error = %e,
                                "cannot read a claim whose volume was deleted before binding; it is provisioned again at the next restart");
                        }
                        Err(_) => {
                            tokio::time::sleep(wait).await;
                            wait *= 2;
                        }
                    }
                }
            }
        })
        .await;
}
