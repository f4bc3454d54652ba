//! Wiring only: the watches and their caches, one kube-runtime controller per reconciled
//! kind (each run the same way, through `reconciler`), the periodic resync, the
//! usage poll, the orphan check, the agent Secrets and the exports.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::{Stream, StreamExt, TryStreamExt, future};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;
use kube::runtime::controller::{self, Controller};
use kube::runtime::events::Reporter;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tracing::{debug, info, warn};

use crate::agents::AgentRegistry;
use crate::config::OrphanSettings;
use crate::context::{Context, stopped};
use crate::metrics::Metrics;
use crate::objects::{CachedClaim, CachedVolume, Provisioners, claim_class, claim_is_bound};
use crate::reconciler::{Reconciled, error_policy, reconcile};
use crate::{agent_secrets, cache, exports, orphans, usage};
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
    /// How often every bound volume's usage and health is asked from its agent; `None`
    /// turns the poll off.
    pub usage_interval: Option<Duration>,
    /// How long an agent fails every request of that poll before its claims are told it
    /// is out of reach.
    pub agent_unreachable: Duration,
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
            agent_unreachable: Duration::from_secs(120),
            orphan_check: None,
            agent_secrets: None,
            leading: None,
        }
    }
}

/// Watches classes, claims, volumes, Snapshots and their schedules and runs one controller
/// per reconciled kind (and the usage poll, the orphan check, the agent Secrets and the
/// exports) until `shutdown` turns true (then in-flight reconciles finish) or the future is
/// dropped (then they stop at once). `ready` turns true once the class, claim and volume
/// caches hold a complete list, the volumes' first (a claim whose PV is listed is never
/// held, see [`cache::ClaimFilter`]).
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
    let controllers = Controllers {
        ctx: ctx.clone(),
        // No rate limit anywhere: the API server's own flow control is the only brake.
        config: controller::Config::default().concurrency(config.concurrency),
        shutdown: shutdown.clone(),
    };
    let resync = || ticks(config.resync);

    let coupled = claim_and_volume_watches(
        &client,
        &config.provisioner,
        (claims.clone(), claim_writer),
        (volumes.clone(), volume_writer),
        shutdown.clone(),
    );
    let class_watch = watch_all(&client, class_writer, cache::strip_meta);
    // Without the CRDs installed these two watches fail and back off; nothing else waits
    // for them.
    let (snapshots, snapshot_writer) = reflector::store::<Snapshot>();
    let (restores, restores_rx) = tokio::sync::mpsc::unbounded_channel();
    let snapshot_watch = watch_all(&client, snapshot_writer, |_| {}).inspect_ok({
        let claims = claims.clone();
        move |snapshot| {
            for pvc in claims_restoring_from(&claims, snapshot) {
                let _ = restores.send(pvc);
            }
        }
    });
    let (schedules, schedule_writer) = reflector::store::<SnapshotSchedule>();
    let schedule_watch = watch_all(&client, schedule_writer, |_| {});
    // Any change of the agents (a Secret added, mended or removed) re-checks the claims
    // waiting, and so does their class appearing (or changing).
    let agent_changes = {
        let claims = claims.clone();
        ctx.agents
            .changes()
            .flat_map(move |()| futures::stream::iter(waiting_claims(&claims, None)))
    };
    let for_class = {
        let claims = claims.clone();
        move |class: StorageClass| waiting_claims(&claims, Some(&class.name_any()))
    };

    tokio::join!(
        // Claims: provisioned, or their volume expanded.
        controllers.run(
            Controller::for_stream(coupled.claims, claims.clone())
                .watches_stream(class_watch, for_class)
                .reconcile_on(agent_changes)
                .reconcile_on(unbounded_receiver_stream(restores_rx))
                .reconcile_all_on(resync()),
        ),
        // Volumes: deleted or archived once released.
        controllers.run(
            Controller::for_stream(coupled.volumes, volumes.clone()).reconcile_all_on(resync())
        ),
        controllers
            .run(Controller::for_stream(snapshot_watch, snapshots).reconcile_all_on(resync())),
        controllers.run(Controller::for_stream(schedule_watch, schedules)),
        coupled.rereading,
        readiness(&classes, &claims, &volumes, &ctx.agents, &ready),
        when_leading(&ctx, &shutdown, config.usage_interval, |every| {
            usage::run(
                ctx.clone(),
                every,
                config.agent_unreachable,
                shutdown.clone(),
            )
        }),
        when_leading(&ctx, &shutdown, config.orphan_check, |settings| {
            orphans::run(ctx.clone(), settings, shutdown.clone())
        }),
        async {
            if let Some(namespace) = config.agent_secrets {
                agent_secrets::run(ctx.clone(), namespace, shutdown.clone()).await;
            }
        },
        exports::run(ctx.clone(), config.resync, shutdown.clone()),
    );
}

/// What every controller shares, and the one way each is run.
struct Controllers {
    ctx: Arc<Context>,
    config: controller::Config,
    shutdown: watch::Receiver<bool>,
}

impl Controllers {
    /// Runs `controller` until shutdown, each object through [`reconcile`] and
    /// [`error_policy`] of its kind.
    fn run<K>(&self, controller: Controller<K>) -> impl Future<Output = ()> + use<K>
    where
        K: Reconciled + Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug,
    {
        controller
            .with_config(self.config.clone())
            .graceful_shutdown_on(stopped(self.shutdown.clone()))
            .run(reconcile::<K>, error_policy::<K>, self.ctx.clone())
            .for_each(|result| async move {
                if let Err(e) = result {
                    debug!(error = %e, "{}", K::CONTROLLER);
                }
            })
    }
}

/// Every object of kind `K` in the cluster, changed by `modify` before `writer` caches it.
fn watch_all<K>(
    client: &Client,
    writer: reflector::store::Writer<K>,
    modify: impl FnMut(&mut K) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    watcher(Api::<K>::all(client.clone()), list_config())
        .default_backoff()
        .modify(modify)
        .reflect(writer)
        .applied_objects()
}

/// Small list pages keep the transient cost of the first sync (whole objects decoded
/// before they are slimmed) low; the number of requests hardly matters.
fn list_config() -> watcher::Config {
    watcher::Config::default().page_size(100)
}

fn ticks(every: Duration) -> impl Stream<Item = ()> + Send + 'static {
    futures::stream::unfold(
        tokio::time::interval_at(tokio::time::Instant::now() + every, every),
        |mut interval| async move {
            interval.tick().await;
            Some(((), interval))
        },
    )
}

/// The claim and volume watches, which feed each other's cache, and the rereading of
/// claims that goes with them.
struct CoupledWatches<C, V, R> {
    claims: C,
    volumes: V,
    rereading: R,
}

/// The claims are listed once the volumes are: a pending claim whose PV exists is then
/// never stored, which after a restart in a burst is most of them. Claims the volume watch
/// takes out of the claim cache, or brings back, are merged into the claim watch so that
/// the store has one writer.
fn claim_and_volume_watches(
    client: &Client,
    provisioner: &Provisioners,
    (claims, claim_writer): (Store<CachedClaim>, reflector::store::Writer<CachedClaim>),
    (volumes, volume_writer): (Store<CachedVolume>, reflector::store::Writer<CachedVolume>),
    shutdown: watch::Receiver<bool>,
) -> CoupledWatches<
    impl Stream<Item = Result<CachedClaim, watcher::Error>> + Send + 'static,
    impl Stream<Item = Result<CachedVolume, watcher::Error>> + Send + 'static,
    impl Future<Output = ()> + Send + 'static,
> {
    let claim_filter = cache::ClaimFilter::new(provisioner.clone(), volumes);
    // Bounded: a take-out dropped when it is full leaves a claim held, which costs memory,
    // never correctness.
    let (claim_changes, claim_changes_rx) =
        tokio::sync::mpsc::channel::<watcher::Event<CachedClaim>>(1024);
    let (reread, reread_rx) = tokio::sync::mpsc::unbounded_channel::<(String, String, String)>();
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
    let rereading = reread_claims(client.clone(), reread_rx, claim_changes.clone(), shutdown);
    let parking = move |event: &watcher::Event<CachedVolume>| match event {
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
    };
    let provisioner = provisioner.clone();
    let volume_stream = watcher(Api::<CachedVolume>::all(client.clone()), list_config())
        .default_backoff()
        .modify(move |pv| cache::slim_volume(pv, &provisioner))
        .reflect(volume_writer)
        .inspect_ok(parking)
        .applied_objects();
    CoupledWatches {
        claims: claim_stream,
        volumes: volume_stream,
        rereading,
    }
}

/// The unbound claims in the cache, of `class` when one is named.
fn waiting_claims(claims: &Store<CachedClaim>, class: Option<&str>) -> Vec<ObjectRef<CachedClaim>> {
    claims
        .state()
        .into_iter()
        .filter(|pvc| class.is_none_or(|class| claim_class(&**pvc) == Some(class)))
        .filter(|pvc| !claim_is_bound(&**pvc))
        .map(|pvc| ObjectRef::from_obj(&*pvc))
        .collect()
}

/// The unbound claims restored from `snapshot`: its appearing or becoming ready re-checks
/// them.
fn claims_restoring_from(
    claims: &Store<CachedClaim>,
    snapshot: &Snapshot,
) -> Vec<ObjectRef<CachedClaim>> {
    let namespace = snapshot.namespace().unwrap_or_default();
    let name = snapshot.name_any();
    claims
        .state()
        .into_iter()
        .filter(|pvc| {
            // Most claims name no source: looked at without unpacking them.
            let names_it = pvc.spec.as_ref().is_some_and(|spec| {
                let by_ref = spec.data_source_ref.as_ref().map(|r| &r.name);
                let by_source = spec.data_source.as_ref().map(|s| &s.name);
                by_ref.or(by_source) == Some(&name)
            });
            names_it
                && !claim_is_bound(&**pvc)
                && pvc.metadata.namespace.as_deref() == Some(namespace.as_str())
                && crate::datasource::restores_from(&pvc.to_claim(), &name)
        })
        .map(|pvc| ObjectRef::from_obj(&*pvc))
        .collect()
}

/// Turns `ready` true once the class, claim and volume caches are synced and the agents
/// read.
async fn readiness(
    classes: &Store<StorageClass>,
    claims: &Store<CachedClaim>,
    volumes: &Store<CachedVolume>,
    agents: &AgentRegistry,
    ready: &AtomicBool,
) {
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
}

/// Runs the task `start` makes of `settings`, if there are any, once this replica leads
/// (unless `shutdown` comes first).
async fn when_leading<S, F: Future<Output = ()>>(
    ctx: &Context,
    shutdown: &watch::Receiver<bool>,
    settings: Option<S>,
    start: impl FnOnce(S) -> F,
) {
    if let Some(settings) = settings
        && ctx.leading_or(shutdown).await
    {
        start(settings).await;
    }
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
