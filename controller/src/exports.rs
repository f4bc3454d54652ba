//! Who may mount each volume, from the controller's side: the export a new volume is made
//! with ([`for_new_volume`]), and keeping every export in step with its class ([`run`]):
//! those of `nodes` and `pods` classes as Nodes and Pods come and go, and any export
//! found missing or changed behind the controller's back (a volume made before its agent
//! had an export manager, an edit on the NFS server).
//!
//! A `pods` export gains a node as soon as a pod using the claim is bound to it (before
//! its kubelet can mount) and loses it only once the pod object is gone, so a node that
//! may still have the volume mounted is never cut off.

use std::collections::hash_map::DefaultHasher;
use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt, future};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use kube::runtime::{WatchStreamExt, watcher as watch_of};
use nfsprov_api_types::{ExportAccess, ExportClient, ExportRequest, VolumePath};
use nfsprov_vocabulary::exports::{export_request, fixed_clients, needs_export_manager, read_only};
use nfsprov_vocabulary::params::{ClassParams, ExportClients};
use tokio::sync::watch;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::agents::{Agent, request_id};
use crate::backoff::Backoff;
use crate::context::{Context, Error, stopped};
use crate::mounters::{MountingPod, NodeAddresses};
use crate::objects::{CachedVolume, VolumeClaimRef, bound_claim_of, class_name, is_ours, phase};

pub(crate) const REASON_EXPORT_UPDATED: &str = "ExportUpdated";
pub(crate) const REASON_EXPORT_FAILED: &str = "ExportUpdateFailed";
const ACTION: &str = "UpdateExport";

/// Most agent requests in flight at once. An agent groups the export changes it has in
/// hand into one call to its NFS server, so the more in flight, the fewer calls a node
/// joining costs for thousands of exports; 64 stays well below what an agent serves at
/// once (`max_concurrent_requests`, 256 by default), leaving room for provisioning.
pub(crate) const CONCURRENT_REQUESTS: usize = 64;

/// How often the volumes are looked at without a change of Nodes or Pods: a volume whose
/// PV appeared just after its pod was bound is caught up within this time. A look with
/// nothing to change costs a hash lookup per volume.
const RECHECK: Duration = Duration::from_secs(5);

/// The shortest pause between two looks, and how long the Nodes' addresses must hold
/// still before a look follows them: a burst of Nodes joining and leaving is taken in one
/// pass over the `nodes` exports, not one per change.
const MIN_WAIT: Duration = Duration::from_millis(50);

/// The longest a look waits for the Nodes' addresses to hold still: a cluster whose
/// Nodes change without a pause still has its exports follow every so often.
const SETTLE_AT_MOST: Duration = Duration::from_secs(2);

/// Longer client lists are counted in events, not listed (a `nodes` export of a large
/// cluster would not fit a note).
const LISTED_CLIENTS: usize = 8;

/// Why a new volume cannot be given its export yet. Retried: the agent may be given a
/// manager, and the Node and Pod lists complete.
pub(crate) struct Refusal {
    pub(crate) message: String,
    pub(crate) error: Option<Error>,
}

/// The export to create or clone a volume with: `None` for an agent without a
/// per-volume manager (the share exported by hand decides), refused there when the
/// class asks for something only a manager can give.
pub(crate) async fn for_new_volume(
    ctx: &Context,
    agent: &Agent,
    pvc: &PersistentVolumeClaim,
    params: &ClassParams,
    class_name: &str,
    request_id: &str,
) -> Result<Option<ExportRequest>, Refusal> {
    let capabilities = agent.capabilities(request_id).await.map_err(|e| Refusal {
        message: format!(
            "failed to provision volume with StorageClass {class_name:?}: agent {} did not report its capabilities: {e}",
            agent.name()
        ),
        error: Some(Error::AgentInfo {
            agent: agent.name().to_owned(),
            source: e,
        }),
    })?;
    if !capabilities.exports.per_volume() {
        return match needs_export_manager(params) {
            None => Ok(None),
            Some(asked) => Err(Refusal {
                message: format!(
                    "StorageClass {class_name:?} asks for {asked}, but agent {} does not export volumes one by one (export manager: {}); no directory was created. Set an export manager on the agent, or use a class without exportClients and squash",
                    agent.name(),
                    capabilities.exports
                ),
                error: None,
            }),
        };
    }
    let which = params.export_clients.clone().unwrap_or_default();
    let clients = match fixed_clients(Some(&which)) {
        Some(clients) => clients,
        None if !ctx.mounters.ready() => {
            return Err(Refusal {
                message: format!(
                    "StorageClass {class_name:?} exports to {}: the list of Nodes and Pods is not complete yet",
                    which.as_str()
                ),
                error: None,
            });
        }
        None => ctx.mounters.clients_of(
            &which,
            &pvc.namespace().unwrap_or_default(),
            &pvc.name_any(),
        ),
    };
    let modes = pvc
        .spec
        .as_ref()
        .and_then(|spec| spec.access_modes.as_deref())
        .unwrap_or_default();
    let mut request = export_request(params, read_only(modes), clients);
    // An agent that can serves the new volume at a path naming neither its namespace nor
    // its claim; the PV mounts the path it answers.
    request.opaque_path = capabilities.opaque_export_paths;
    Ok(Some(request))
}

/// A request in a form compared cheaply: clients as a set, then every option. Two requests
/// with the same fingerprint ask for the same export (up to a 64-bit hash collision, which
/// a resync's fresh look at the agent would still correct).
fn fingerprint(request: &ExportRequest) -> u64 {
    let mut clients = request.clients.clone();
    clients.sort_unstable();
    clients.dedup();
    let mut hasher = DefaultHasher::new();
    (
        clients,
        request.access,
        request.squash,
        request.anon_uid,
        request.anon_gid,
        &request.sec,
    )
        .hash(&mut hasher);
    hasher.finish()
}

/// The export an agent was last seen serving for a volume.
#[derive(Debug, Clone, Copy)]
struct Served {
    fingerprint: u64,
    /// Kept from the agent's report: a claim's access modes never change, so the export's
    /// access is read once, not from the claim cache (which drops bound claims).
    read_only: bool,
}

/// A list of clients in a form compared cheaply (lists of the cluster come sorted).
fn list_fingerprint(clients: &[ExportClient]) -> u64 {
    let mut hasher = DefaultHasher::new();
    clients.hash(&mut hasher);
    hasher.finish()
}

/// What the reconciler remembers, by PV name.
#[derive(Debug, Default)]
struct Known {
    served: HashMap<Box<str>, Served>,
    /// Volumes whose last attempt failed, and when to try again.
    failing: HashMap<Box<str>, Instant>,
    /// The Nodes' addresses the last look after a change of the cluster started from.
    looked_nodes: Option<u64>,
}

/// The `nodes` list a look gives the exports it has not reached yet, once the Nodes
/// changed after it started.
#[derive(Default)]
struct LatestNodes {
    /// The count of Node changes the list reflects.
    changes: u64,
    /// `None` while the Nodes are those the look started from.
    clients: Option<Arc<[ExportClient]>>,
    /// The fingerprint of each class's request with `clients`, by class (its parameters)
    /// and access.
    wanted: HashMap<(usize, bool), u64>,
}

/// One volume whose export follows the cluster, with the clients it should admit now.
struct Target {
    volume: Arc<CachedVolume>,
    agent: Arc<Agent>,
    params: Arc<ClassParams>,
    clients: Arc<[ExportClient]>,
}

impl Target {
    fn pv_name(&self) -> &str {
        self.volume.metadata.name.as_deref().unwrap_or_default()
    }

    fn claim(&self) -> &VolumeClaimRef {
        bound_claim_of(&self.volume).expect("a target names its claim")
    }

    /// Whether changes are told on the claim. Not for `nodes` classes: a node joining
    /// changes every such export at once, and an event per claim would flood the API
    /// server for what one metric says.
    fn announced(&self) -> bool {
        !self.follows_nodes()
    }

    /// Whether it admits every Node, and so changes with any of them.
    fn follows_nodes(&self) -> bool {
        matches!(self.params.export_clients, Some(ExportClients::Nodes))
    }

    /// What identifies the request it makes, up to its clients and access, within a look:
    /// its class's parameters (shared by every volume of the class).
    fn class_key(&self) -> usize {
        Arc::as_ptr(&self.params) as usize
    }

    fn request(&self, read_only: bool) -> ExportRequest {
        export_request(&self.params, read_only, self.clients.to_vec())
    }
}

pub(crate) struct Reconciler<'a> {
    ctx: &'a Context,
    known: Mutex<Known>,
    backoff: Backoff,
    /// Changes of the Nodes seen by the watch, counted once the cache holds each.
    node_changes: AtomicU64,
}

impl<'a> Reconciler<'a> {
    pub(crate) fn new(ctx: &'a Context) -> Self {
        Self {
            ctx,
            known: Mutex::default(),
            backoff: Backoff::default(),
            node_changes: AtomicU64::new(0),
        }
    }

    fn known(&self) -> MutexGuard<'_, Known> {
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a change of the Nodes, once the cache holds it: a look under way gives the
    /// `nodes` exports it has not reached yet the Nodes as they are now.
    pub(crate) fn node_changed(&self) {
        self.node_changes.fetch_add(1, Ordering::Release);
    }

    /// Every Node's addresses, as a `nodes` class admits them.
    fn node_clients(&self) -> Arc<[ExportClient]> {
        self.ctx
            .mounters
            .clients_of(&ExportClients::Nodes, "", "")
            .into()
    }

    /// Waits while the Nodes' addresses keep changing, until they hold still for
    /// [`MIN_WAIT`] (at most [`SETTLE_AT_MOST`]): Nodes joining and leaving in a burst
    /// cost one pass over the `nodes` exports, not one per change. No wait when the
    /// addresses are those the last look started from (a change of Pods, or of a Node's
    /// other fields).
    async fn settle_nodes(&self) {
        let mut seen = list_fingerprint(&self.node_clients());
        if self.known().looked_nodes != Some(seen) {
            let give_up = Instant::now() + SETTLE_AT_MOST;
            loop {
                let now = Instant::now();
                if now >= give_up {
                    break;
                }
                tokio::time::sleep(MIN_WAIT.min(give_up - now)).await;
                let latest = list_fingerprint(&self.node_clients());
                if latest == seen {
                    break;
                }
                seen = latest;
            }
        }
        self.known().looked_nodes = Some(seen);
    }

    /// The volumes on agents with an export manager, with the clients each should admit.
    /// Volumes on their way out (released, failed) are left to deletion.
    ///
    /// Unless the cluster changed, volumes whose export was seen right and that are not
    /// waiting for a retry are left out: a look with nothing new costs a lookup per volume,
    /// not an index of every pod.
    async fn targets(&self, cluster_changed: bool) -> Vec<Target> {
        let ctx = self.ctx;
        let mut snapshot = None;
        let mut classes: HashMap<String, Option<Arc<ClassParams>>> = HashMap::new();
        let mut agents: HashMap<String, Option<Arc<Agent>>> = HashMap::new();
        let mut everyone: Option<Arc<[ExportClient]>> = None;
        let mut fixed: HashMap<String, Arc<[ExportClient]>> = HashMap::new();
        let mut found = Vec::new();
        for volume in ctx.volumes.state() {
            if !is_ours(&volume, &ctx.provisioner)
                || matches!(phase(&volume), "Released" | "Failed")
            {
                continue;
            }
            let (Some(agent_name), Some(_), Some(claim)) = (
                volume.recorded.agent.as_deref(),
                volume.recorded.path.as_deref(),
                bound_claim_of(&volume),
            ) else {
                continue;
            };
            let settled = {
                let known = self.known();
                let pv = volume.metadata.name.as_deref().unwrap_or_default();
                known.served.contains_key(pv) && !known.failing.contains_key(pv)
            };
            if settled && !cluster_changed {
                continue;
            }
            let class = class_name(&volume).to_owned();
            let params = match classes.get(&class) {
                Some(params) => params.clone(),
                None => {
                    let params = ctx
                        .class(&class)
                        .and_then(|c| ClassParams::parse(c.parameters.as_ref()).ok())
                        .map(Arc::new);
                    classes.insert(class, params.clone());
                    params
                }
            };
            let Some(params) = params else { continue };
            let agent = match agents.get(agent_name) {
                Some(agent) => agent.clone(),
                None => {
                    let agent = match ctx.agents.get(agent_name) {
                        Some(agent) => agent
                            .capabilities(&request_id(agent_name))
                            .await
                            .ok()
                            .filter(|c| c.exports.per_volume())
                            .map(|_| agent),
                        None => None,
                    };
                    agents.insert(agent_name.to_owned(), agent.clone());
                    agent
                }
            };
            let Some(agent) = agent else { continue };
            let which = params.export_clients.clone().unwrap_or_default();
            let which = &which;
            let clients = match which {
                // The same list for every volume of a class: made once per look.
                ExportClients::All | ExportClients::List(_) => fixed
                    .entry(class_name(&volume).to_owned())
                    .or_insert_with(|| fixed_clients(Some(which)).unwrap_or_default().into())
                    .clone(),
                ExportClients::Nodes => everyone
                    .get_or_insert_with(|| {
                        let snapshot = snapshot.get_or_insert_with(|| ctx.mounters.snapshot());
                        snapshot.clients(which, "", "").into()
                    })
                    .clone(),
                ExportClients::Pods => snapshot
                    .get_or_insert_with(|| ctx.mounters.snapshot())
                    .clients(
                        which,
                        claim.namespace.as_deref().unwrap_or_default(),
                        claim.name.as_deref().unwrap_or_default(),
                    )
                    .into(),
            };
            found.push(Target {
                volume,
                agent,
                params,
                clients,
            });
        }
        found
    }

    /// One look at every volume; returns when the earliest failed one may be retried.
    pub(crate) async fn sync(&self, cluster_changed: bool) -> Option<Instant> {
        // Counted before the caches are read: the targets reflect at least these changes.
        let node_changes = self.node_changes.load(Ordering::Acquire);
        let targets = self.targets(cluster_changed).await;
        let now = Instant::now();
        let due: Vec<Target> = {
            let mut known = self.known();
            // Every volume waiting for a retry is among the targets while it still needs
            // one; the others are gone, or no longer exported by a manager.
            let present: HashSet<&str> = targets.iter().map(Target::pv_name).collect();
            known.failing.retain(|pv, _| present.contains(&**pv));
            let volumes = &self.ctx.volumes;
            known
                .served
                .retain(|pv, _| volumes.get(&ObjectRef::new(pv)).is_some());
            let mut memo: HashMap<(usize, usize, bool), u64> = HashMap::new();
            targets
                .into_iter()
                .filter(|target| {
                    let pv = target.pv_name();
                    if known.failing.get(pv).is_some_and(|at| *at > now) {
                        return false;
                    }
                    let Some(served) = known.served.get(pv) else {
                        return true;
                    };
                    // Volumes of one class share their list (and so their request) under
                    // `nodes`: hashed once per look, not once per volume. Every `nodes`
                    // class shares the one list, so the class is part of the key.
                    let key = (
                        Arc::as_ptr(&target.clients) as *const () as usize,
                        target.class_key(),
                        served.read_only,
                    );
                    let wanted = *memo
                        .entry(key)
                        .or_insert_with(|| fingerprint(&target.request(served.read_only)));
                    wanted != served.fingerprint
                })
                .collect()
        };
        let latest = Mutex::new(LatestNodes {
            changes: node_changes,
            ..LatestNodes::default()
        });
        let latest = &latest;
        futures::stream::iter(due)
            .for_each_concurrent(CONCURRENT_REQUESTS, |target| async move {
                if let Some(target) = self.with_latest_nodes(target, latest) {
                    self.apply(&target).await;
                }
            })
            .await;
        self.known().failing.values().min().copied()
    }

    /// The target as the Nodes stand now, when they changed since the look started and
    /// its export admits every Node: a look that meets a burst of Node changes sends
    /// the rest of its `nodes` exports the latest list, not one the next look would
    /// replace at once. `None` when the agent was last seen serving just that. (A `pods`
    /// export, which also follows its pods, waits for the next look.)
    fn with_latest_nodes(&self, mut target: Target, latest: &Mutex<LatestNodes>) -> Option<Target> {
        if !target.follows_nodes() {
            return Some(target);
        }
        let mut latest = latest.lock().unwrap_or_else(|e| e.into_inner());
        // Counted before the cache is read, as in `sync`.
        let changes = self.node_changes.load(Ordering::Acquire);
        if changes != latest.changes {
            *latest = LatestNodes {
                changes,
                clients: Some(self.node_clients()),
                wanted: HashMap::new(),
            };
        }
        let Some(clients) = latest.clients.clone() else {
            return Some(target);
        };
        target.clients = clients;
        let Some(served) = self.known().served.get(target.pv_name()).copied() else {
            return Some(target);
        };
        let wanted = *latest
            .wanted
            .entry((target.class_key(), served.read_only))
            .or_insert_with(|| fingerprint(&target.request(served.read_only)));
        (wanted != served.fingerprint).then_some(target)
    }

    /// Brings one volume's export to what its class asks, asking the agent first when
    /// nothing is known of it.
    async fn apply(&self, target: &Target) {
        let pv = target.pv_name();
        let rid = request_id(pv);
        let Ok(path) =
            VolumePath::parse(target.volume.recorded.path.as_deref().unwrap_or_default())
        else {
            debug!(
                pv,
                "the recorded path is not a volume path; its export is not followed"
            );
            return;
        };
        let served = self.known().served.get(pv).copied();
        let read_only = match served {
            Some(served) => served.read_only,
            None => match target.agent.client().get_volume(&path, Some(&rid)).await {
                Err(e) => {
                    return self
                        .failed(target, &format!("could not read it: {e}"))
                        .await;
                }
                Ok(None) => {
                    // The orphan check reports a missing directory; asking again at every
                    // look would only repeat the question.
                    debug!(
                        pv,
                        agent = target.agent.name(),
                        "the agent has no such volume"
                    );
                    let retry = Instant::now() + self.backoff.failed(pv);
                    self.known().failing.insert(pv.into(), retry);
                    return;
                }
                Ok(Some(volume)) => match volume.export {
                    Some(export) => {
                        let read_only = export.access == ExportAccess::ReadOnly;
                        let wanted = target.request(read_only);
                        if export.matches(&wanted) {
                            self.served(target, &wanted, read_only);
                            return;
                        }
                        read_only
                    }
                    None => match self.claim_read_only(target.claim()).await {
                        Ok(read_only) => read_only,
                        Err(e) => {
                            let why = format!("could not read its claim: {e}");
                            return self.failed(target, &why).await;
                        }
                    },
                },
            },
        };
        let wanted = target.request(read_only);
        match target
            .agent
            .client()
            .set_volume_export(&path, &wanted, Some(&rid))
            .await
        {
            Ok(volume) if volume.export.as_ref().is_some_and(|e| e.matches(&wanted)) => {
                self.served(target, &wanted, read_only);
                self.ctx.metrics.export_updated(target.agent.name());
                let clients = describe(&wanted.clients);
                info!(pv, agent = target.agent.name(), %clients, "export updated");
                if !target.announced() {
                    return;
                }
                self.ctx
                    .event(
                        &target.claim().object_reference(),
                        EventType::Normal,
                        REASON_EXPORT_UPDATED,
                        ACTION,
                        &format!(
                            "The export of volume {pv} on agent {} now admits {clients}",
                            target.agent.name()
                        ),
                    )
                    .await;
            }
            Ok(_) => {
                let why = "it answered with an export other than the one asked for";
                self.failed(target, why).await;
            }
            Err(e) => self.failed(target, &format!("it refused: {e}")).await,
        }
    }

    fn served(&self, target: &Target, wanted: &ExportRequest, read_only: bool) {
        let pv: Box<str> = target.pv_name().into();
        self.backoff.succeeded(&pv);
        let mut known = self.known();
        known.failing.remove(&pv);
        known.served.insert(
            pv,
            Served {
                fingerprint: fingerprint(wanted),
                read_only,
            },
        );
    }

    /// Records a failed attempt; the first of a run of failures is an event on the claim.
    async fn failed(&self, target: &Target, why: &str) {
        let pv = target.pv_name();
        let agent = target.agent.name();
        self.ctx.metrics.export_update_failed(agent);
        let retry = Instant::now() + self.backoff.failed(pv);
        let first = self.known().failing.insert(pv.into(), retry).is_none();
        warn!(
            pv,
            agent,
            reason = why,
            "could not update the volume's export; retrying"
        );
        if first && target.announced() {
            self.ctx
                .event(
                    &target.claim().object_reference(),
                    EventType::Warning,
                    REASON_EXPORT_FAILED,
                    ACTION,
                    &format!(
                        "Could not update the export of volume {pv} on agent {agent}: {why}; retrying"
                    ),
                )
                .await;
        }
    }

    /// Whether the claim asks for read-only access alone; a claim that is gone asks
    /// for nothing more than the volume had.
    async fn claim_read_only(&self, claim: &VolumeClaimRef) -> Result<bool, kube::Error> {
        let api = Api::<PersistentVolumeClaim>::namespaced(
            self.ctx.client.clone(),
            claim.namespace.as_deref().unwrap_or_default(),
        );
        let claim = api
            .get_opt(claim.name.as_deref().unwrap_or_default())
            .await?;
        let modes = claim
            .and_then(|c| c.spec)
            .and_then(|s| s.access_modes)
            .unwrap_or_default();
        Ok(read_only(&modes))
    }
}

/// Clients in words, for events and logs.
fn describe(clients: &[ExportClient]) -> String {
    match clients.len() {
        0 => "no client (no pod using the claim is scheduled)".to_owned(),
        n if n > LISTED_CLIENTS => format!("{n} clients"),
        _ => clients
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// Pods without claims never matter here, and their volumes cannot change: they never
/// reach the cache.
fn pod_event(event: Event<MountingPod>) -> Option<Event<MountingPod>> {
    match event {
        Event::InitApply(pod) | Event::Apply(pod) if pod.claims.is_empty() => None,
        other => Some(other),
    }
}

/// Watches Nodes and scheduled Pods into [`Context::mounters`] and keeps the exports of
/// `nodes` and `pods` classes in step until `shutdown`. Everything the agent was seen
/// serving is looked at again every `resync`, so an export changed behind the
/// controller's back is put right.
pub(crate) async fn run(ctx: Arc<Context>, resync: Duration, shutdown: watch::Receiver<bool>) {
    let Some((node_writer, pod_writer)) = ctx.mounters.take_writers() else {
        return;
    };
    let reconciler = Reconciler::new(&ctx);
    let reconciler = &reconciler;
    let list_config = || watcher::Config::default().page_size(100);
    let nodes = watch_of(Api::<NodeAddresses>::all(ctx.client.clone()), list_config())
        .default_backoff()
        .reflect(node_writer)
        .for_each(|_| {
            reconciler.node_changed();
            ctx.mounters.changed.notify_one();
            future::ready(())
        });
    // Only pods bound to a node can mount anything; the API server filters the rest out.
    let pods = watch_of(
        Api::<MountingPod>::all(ctx.client.clone()),
        list_config().fields("spec.nodeName!="),
    )
    .default_backoff()
    .try_filter_map(|event| future::ready(Ok(pod_event(event))))
    .reflect(pod_writer)
    .for_each(|_| {
        ctx.mounters.changed.notify_one();
        future::ready(())
    });
    let reconcile = async {
        ctx.mounters.wait_until_ready().await;
        if ctx.volumes.wait_until_ready().await.is_err() {
            return;
        }
        let mut fresh_since = Instant::now();
        let mut cluster_changed = true;
        loop {
            if fresh_since.elapsed() >= resync {
                reconciler.known().served.clear();
                fresh_since = Instant::now();
            }
            if cluster_changed {
                reconciler.settle_nodes().await;
            }
            let retry = reconciler.sync(cluster_changed).await;
            let wait = retry
                .map_or(RECHECK, |at| {
                    at.saturating_duration_since(Instant::now()).min(RECHECK)
                })
                .max(MIN_WAIT);
            cluster_changed = tokio::select! {
                () = ctx.mounters.changed.notified() => true,
                () = tokio::time::sleep(wait) => false,
            };
        }
    };
    tokio::select! {
        () = stopped(shutdown) => {}
        _ = futures::future::join3(nodes, pods, reconcile) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fingerprints_compare_clients_as_sets_and_every_option() {
        let request = |clients: &[&str]| ExportRequest {
            clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
            ..ExportRequest::default()
        };
        let base = fingerprint(&request(&["10.0.0.2", "10.0.0.3"]));
        assert_eq!(
            base,
            fingerprint(&request(&["10.0.0.3", "10.0.0.2", "10.0.0.3"]))
        );
        assert_ne!(base, fingerprint(&request(&["10.0.0.2"])));
        let mut read_only = request(&["10.0.0.2", "10.0.0.3"]);
        read_only.access = ExportAccess::ReadOnly;
        assert_ne!(base, fingerprint(&read_only));
        let mut anon = request(&["10.0.0.2", "10.0.0.3"]);
        anon.anon_uid = Some(1000);
        assert_ne!(base, fingerprint(&anon));
    }

    #[test]
    fn long_client_lists_are_counted() {
        let few: Vec<ExportClient> = ["10.0.0.2", "10.0.0.0/24"]
            .iter()
            .map(|c| c.parse().unwrap())
            .collect();
        assert_eq!(describe(&few), "10.0.0.2, 10.0.0.0/24");
        let many: Vec<ExportClient> = (1..=20)
            .map(|i| format!("10.0.0.{i}").parse().unwrap())
            .collect();
        assert_eq!(describe(&many), "20 clients");
        assert!(describe(&[]).starts_with("no client"));
    }
}
