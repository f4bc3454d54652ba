//! Per-volume exports through the whole controller (`controller::run`) on either tier
//! (the in-repo API simulator, or the real API server; see `Harness`): Nodes and Pods are created, bound and deleted by the test as a
//! scheduler and kubelet would, and the agent is `MockAgent` (a mock, not the real
//! agent) reporting an export manager, whose export store shows what the NFS server
//! would serve.

use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_api_types::{
    ErrorCode, ExportAccess, ExportClient, ExportManager, ExportRequest, SecFlavor, Squash,
};
use serde_json::json;

use crate::tests::harness::{Harness, HarnessOptions};
use crate::tests::mock_agent::MockAgent;

const WAIT: Duration = Duration::from_secs(30);
/// How often a condition on the agent's in-memory state is looked at while awaited.
const POLL: Duration = Duration::from_millis(20);

/// A [`Harness`] (the simulator, or the real API server in the real-API tier) with one
/// mock agent managing exports as `manager` says, and a running controller.
struct Cluster {
    harness: Harness,
}

impl std::ops::Deref for Cluster {
    type Target = Harness;

    fn deref(&self) -> &Harness {
        &self.harness
    }
}

impl Cluster {
    async fn start(manager: ExportManager) -> Self {
        let harness = Harness::start(HarnessOptions::default()).await;
        harness.agents[0].manage_exports(manager);
        Self { harness }
    }

    fn agent(&self) -> &MockAgent {
        &self.agents[0]
    }

    async fn finish(self) {
        self.harness.finish().await;
    }

    /// `text` as it reads in this cluster's namespace (see the snapshot scenarios).
    fn in_ns(&self, text: &str) -> String {
        text.replace("default/", &format!("{}/", self.namespace))
    }

    async fn class(&self, parameters: serde_json::Value) {
        let mut parameters = parameters;
        parameters["pathPattern"] = json!("${.PVC.namespace}/${.PVC.name}");
        self.create_class("nfs", parameters).await;
    }

    async fn claim(&self, name: &str, mode: &str) {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "accessModes": [mode],
                "storageClassName": self.class_name("nfs"),
                "resources": {"requests": {"storage": "1Gi"}},
            },
        }))
        .unwrap();
        self.claims()
            .create(&PostParams::default(), &claim)
            .await
            .unwrap();
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn bound(&self, name: &str) {
        tokio::time::timeout(
            WAIT,
            await_condition(self.claims(), name, |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Bound")
            }),
        )
        .await
        .expect("claim bound in time")
        .unwrap();
    }

    /// The PV bound to the claim `name`.
    async fn volume_of(&self, name: &str) -> PersistentVolume {
        let claim = self.claims().get(name).await.unwrap();
        let pv = claim
            .spec
            .and_then(|spec| spec.volume_name)
            .expect("a bound claim names its PV");
        Api::<PersistentVolume>::all(self.client.clone())
            .get(&pv)
            .await
            .unwrap()
    }

    /// The `spec.nfs.path` of the PV bound to the claim `name`.
    async fn mounted_path(&self, name: &str) -> String {
        self.volume_of(name)
            .await
            .spec
            .and_then(|spec| spec.nfs)
            .map(|nfs| nfs.path)
            .expect("an NFS PV")
    }

    async fn node(&self, name: &str, address: &str) {
        let name = self.node_name(name);
        self.adopt("node", &name);
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "Hostname", "address": name},
            ]},
        }))
        .unwrap();
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .unwrap();
    }

    /// The name of the node a scenario calls `name`: its own on a real server.
    fn node_name(&self, name: &str) -> String {
        self.scoped_name(name)
    }

    /// A pod using `claim`, bound to `node` when given (as the scheduler binds it).
    async fn pod(&self, name: &str, claim: &str, node: Option<&str>) {
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "nodeName": node.map(|node| self.node_name(node)),
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }))
        .unwrap();
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .unwrap();
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// Awaits the agent's export of `path` admitting exactly `clients` (in any order).
    async fn admits(&self, path: &str, clients: &[&str]) -> ExportRequest {
        let mut wanted: Vec<ExportClient> = clients.iter().map(|c| c.parse().unwrap()).collect();
        wanted.sort_unstable();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let export = self.agent().export(path);
            let mut served = export
                .as_ref()
                .map(|e| e.clients.clone())
                .unwrap_or_default();
            served.sort_unstable();
            if let Some(export) = export.as_ref().filter(|_| served == wanted) {
                return export.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{path}: the agent serves {export:?}, not {clients:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Awaits the counter `series` (a name and its labels) reaching at least `least`.
    async fn counter_reaches(&self, series: &str, least: u64) {
        let deadline = tokio::time::Instant::now() + WAIT;
        let prefix = format!("{series} ");
        loop {
            let metrics = self.metrics.encode().unwrap();
            let value = metrics
                .lines()
                .find_map(|l| l.strip_prefix(&prefix))
                .and_then(|v| v.trim().parse::<u64>().ok());
            if value.is_some_and(|v| v >= least) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{series} never reached {least} in {metrics}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// The reasons and notes of the events about claims in `default`.
    async fn events(&self) -> Vec<(String, String)> {
        Api::<Event>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Awaits an event of `reason` whose note contains `text`.
    async fn event(&self, reason: &str, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let events = self.events().await;
            if let Some((_, note)) = events.iter().find(|(r, n)| r == reason && n.contains(text)) {
                return note.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {reason} event with {text:?} in {events:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

/// Deletes a pod at once: with no kubelet to confirm a graceful end, a real server would
/// keep the pod object (and its node admitted) for good.
fn no_grace() -> DeleteParams {
    DeleteParams {
        grace_period_seconds: Some(0),
        ..DeleteParams::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pods_claim_admits_the_nodes_of_its_pods_and_follows_a_moved_pod() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster.node("node-a", "127.0.0.2").await;
    cluster.node("node-b", "127.0.0.3").await;
    cluster.class(json!({"exportClients": "pods"})).await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster.bound("data").await;
    // No pod yet: an export nobody may mount.
    cluster.admits(&cluster.in_ns("default/data"), &[]).await;

    // Pending, then bound to node-a: the node is admitted once the pod names it.
    cluster.pod("app-1", "data", None).await;
    // Bound as the scheduler binds: nodeName is set only through the binding.
    let binding = json!({
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "app-1"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": cluster.node_name("node-a")},
    });
    cluster
        .pods()
        .create_subresource::<_, serde_json::Value>(
            "binding",
            "app-1",
            &PostParams::default(),
            &binding,
        )
        .await
        .unwrap();
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.2"])
        .await;
    cluster.event("ExportUpdated", "now admits 127.0.0.2").await;

    // The pod moves: its replacement on node-b is admitted while the old pod object
    // still exists, and node-a stays until that object is gone.
    cluster.pod("app-2", "data", Some("node-b")).await;
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.2", "127.0.0.3"])
        .await;
    cluster.pods().delete("app-1", &no_grace()).await.unwrap();
    let export = cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.3"])
        .await;
    assert_eq!(export.access, ExportAccess::ReadWrite);
    assert_eq!(export.squash, Squash::Root);

    // A pod of another claim changes nothing here.
    cluster.pod("other", "logs", Some("node-a")).await;
    cluster.pods().delete("app-2", &no_grace()).await.unwrap();
    cluster.admits(&cluster.in_ns("default/data"), &[]).await;
    let puts: Vec<String> = cluster
        .agent()
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("PUT export"))
        .collect();
    assert_eq!(
        puts,
        [
            "PUT export default/data [127.0.0.2]",
            "PUT export default/data [127.0.0.2,127.0.0.3]",
            "PUT export default/data [127.0.0.3]",
            "PUT export default/data []",
        ]
        .map(|call| cluster.in_ns(call)),
        "one change per change of the pods, none repeated"
    );
    // The agent's answer reaches the controller a moment after the store changed.
    cluster
        .counter_reaches("nfsprov_exports_updated_total{agent=\"nfs1\"}", 4)
        .await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_claim_follows_nodes_added_and_removed() {
    let cluster = Cluster::start(ExportManager::Knfsd).await;
    cluster.node("node-a", "127.0.0.2").await;
    cluster.class(json!({"exportClients": "nodes"})).await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster.bound("data").await;
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.2"])
        .await;

    // The agent refuses for a while: counted, and retried until it goes through.
    cluster
        .agent()
        .fail_calls(Some(("PUT export", ErrorCode::Internal)));
    cluster.node("node-b", "127.0.0.3").await;
    cluster
        .counter_reaches("nfsprov_export_update_failures_total{agent=\"nfs1\"}", 1)
        .await;
    cluster.agent().fail_calls(None);
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.2", "127.0.0.3"])
        .await;
    Api::<Node>::all(cluster.client.clone())
        .delete(&cluster.node_name("node-a"), &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.3"])
        .await;
    // A node change reaches every export of such classes at once: told by the metrics,
    // not by an event per claim.
    let reasons: Vec<String> = cluster.events().await.into_iter().map(|(r, _)| r).collect();
    assert!(
        !reasons.iter().any(|r| r.starts_with("Export")),
        "{reasons:?}"
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_change_is_told_on_the_claim_once_and_retried() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster.node("node-a", "127.0.0.2").await;
    cluster.class(json!({"exportClients": "pods"})).await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster.bound("data").await;
    cluster.admits(&cluster.in_ns("default/data"), &[]).await;
    cluster
        .agent()
        .fail_calls(Some(("PUT export", ErrorCode::Internal)));
    cluster.pod("app", "data", Some("node-a")).await;
    cluster
        .event(
            "ExportUpdateFailed",
            "Could not update the export of volume",
        )
        .await;
    cluster.agent().fail_calls(None);
    cluster
        .admits(&cluster.in_ns("default/data"), &["127.0.0.2"])
        .await;
    cluster.event("ExportUpdated", "now admits 127.0.0.2").await;
    let failures = cluster
        .events()
        .await
        .into_iter()
        .filter(|(reason, _)| reason == "ExportUpdateFailed")
        .count();
    assert_eq!(failures, 1, "one event for the whole run of failures");
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn squash_and_read_only_many_make_the_request() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster
        .class(json!({
            "exportClients": "10.0.0.0/8, 192.0.2.7",
            "squash": "all",
            "uid": "1000",
            "gid": "2000",
        }))
        .await;
    cluster.claim("shared", "ReadOnlyMany").await;
    cluster.bound("shared").await;
    assert_eq!(
        cluster.agent().export(&cluster.in_ns("default/shared")),
        Some(ExportRequest {
            clients: vec!["10.0.0.0/8".parse().unwrap(), "192.0.2.7".parse().unwrap()],
            access: ExportAccess::ReadOnly,
            squash: Squash::All,
            anon_uid: Some(1000),
            anon_gid: Some(2000),
            sec: vec![SecFlavor::Sys],
            opaque_path: false,
        })
    );
    cluster.claim("data", "ReadWriteOnce").await;
    cluster.bound("data").await;
    let export = cluster
        .agent()
        .export(&cluster.in_ns("default/data"))
        .unwrap();
    assert_eq!(export.access, ExportAccess::ReadWrite);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_exported_at_an_opaque_path_is_mounted_by_the_path_the_agent_reported() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster.agent().serve_opaque_paths();
    cluster.class(json!({"exportClients": "10.0.0.0/8"})).await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster.bound("data").await;
    let path = cluster.in_ns("default/data");
    let reported = cluster
        .agent()
        .export_path(&path)
        .expect("the volume is exported");
    assert_ne!(reported, format!("/srv/nfs/{path}"), "an opaque path");
    assert!(
        !reported.contains(cluster.namespace.as_str()) && !reported.contains("data"),
        "{reported} names the claim"
    );
    assert_eq!(cluster.mounted_path("data").await, reported);
    // Where the data lies stays in the annotation everything acting on the volume reads.
    let pv = cluster.volume_of("data").await;
    assert_eq!(
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("nfsprov.dev/path")),
        Some(&path)
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_without_opaque_paths_is_not_asked_for_one_and_its_pv_mounts_the_volume_path() {
    // The mock refuses `opaque_path` unless it reports the capability, as an older
    // agent refuses a field it does not know: the claim binds only if it is not sent.
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster.class(json!({"exportClients": "10.0.0.0/8"})).await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster.bound("data").await;
    let path = cluster.in_ns("default/data");
    assert!(!cluster.agent().export(&path).unwrap().opaque_path);
    assert_eq!(
        cluster.mounted_path("data").await,
        format!("/srv/nfs/{path}")
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_asking_for_exports_fails_on_an_agent_without_a_manager() {
    let cluster = Cluster::start(ExportManager::None).await;
    cluster
        .class(json!({"exportClients": "pods", "squash": "root"}))
        .await;
    cluster.claim("data", "ReadWriteMany").await;
    let note = cluster
        .event(
            "ProvisioningFailed",
            "asks for exportClients=pods, squash=root",
        )
        .await;
    assert!(note.contains("agent nfs1"), "{note}");
    assert!(note.contains("export manager: none"), "{note}");
    assert!(!cluster.agent().has_volume(&cluster.in_ns("default/data")));
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_on_an_agent_without_a_manager_is_todays_share() {
    let cluster = Cluster::start(ExportManager::None).await;
    cluster.class(json!({"exportClients": "all"})).await;
    cluster.claim("data", "ReadOnlyMany").await;
    cluster.bound("data").await;
    let volume = cluster
        .agent()
        .volume(&cluster.in_ns("default/data"))
        .unwrap();
    assert_eq!(volume.export, None);
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_client_list_fails_the_claim_saying_why() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    cluster
        .class(json!({"exportClients": "10.0.0.0/8,10.1.2.3/24"}))
        .await;
    cluster.claim("data", "ReadWriteMany").await;
    cluster
        .event(
            "ProvisioningFailed",
            "host bits set; the network is 10.1.2.0/24",
        )
        .await;
    assert!(!cluster.agent().has_volume(&cluster.in_ns("default/data")));
    cluster.finish().await;
}

/// How many volumes of a `nodes` class the storm of Node changes reaches.
const STORM_VOLUMES: usize = 200;
/// How often a Node joins or leaves in the storm: 50 changes over about a second.
const STORM_PACE: Duration = Duration::from_millis(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_node_changes_ends_in_the_final_nodes_without_a_look_per_change() {
    let cluster = Cluster::start(ExportManager::Ganesha).await;
    let address = |i: usize| format!("10.1.0.{}", i + 1);
    let addresses = |range: std::ops::Range<usize>| -> Vec<String> { range.map(address).collect() };
    for i in 0..30 {
        cluster.node(&format!("node-{i}"), &address(i)).await;
    }
    cluster.class(json!({"exportClients": "nodes"})).await;
    let names: Vec<String> = (0..STORM_VOLUMES).map(|i| format!("data-{i}")).collect();
    for name in &names {
        cluster.claim(name, "ReadWriteMany").await;
    }
    for name in &names {
        cluster.bound(name).await;
    }
    let paths: Vec<String> = names
        .iter()
        .map(|name| cluster.in_ns(&format!("default/{name}")))
        .collect();
    let first = addresses(0..30);
    let first: Vec<&str> = first.iter().map(String::as_str).collect();
    for path in &paths {
        cluster.admits(path, &first).await;
    }
    let puts = || {
        cluster
            .agent()
            .calls()
            .iter()
            .filter(|c| c.starts_with("PUT export"))
            .count()
    };
    let before = puts();

    // 25 Nodes join (30-54) while 25 leave (0-24), one change every 20 ms: far more
    // often than a look over every export can run.
    let nodes = Api::<Node>::all(cluster.client.clone());
    let mut pace = tokio::time::interval(STORM_PACE);
    for i in 0..25 {
        pace.tick().await;
        cluster
            .node(&format!("node-{}", i + 30), &address(i + 30))
            .await;
        pace.tick().await;
        nodes
            .delete(
                &cluster.node_name(&format!("node-{i}")),
                &DeleteParams::default(),
            )
            .await
            .unwrap();
    }
    let last = addresses(25..55);
    let last: Vec<&str> = last.iter().map(String::as_str).collect();
    for path in &paths {
        cluster.admits(path, &last).await;
    }
    // Each look sends at most one request per export. A look follows the Nodes once
    // their addresses have held still for 50 ms (or 2 s after they began to change), so
    // this storm, 20 ms a change for a second, makes one look after it: 200 requests.
    // Where this test's own requests stall for 50 ms (a loaded machine), a look may
    // start within the storm; it sends the exports it has not reached yet the Nodes as
    // they are by then, and only those it had sent are sent again: at most 200 more per
    // stall. The bound allows two stalls; a look per change would send up to 50 × 200.
    let sent = puts() - before;
    println!("{sent} export changes for {STORM_VOLUMES} volumes and 50 Node changes");
    assert!(
        sent <= 3 * STORM_VOLUMES,
        "{sent} export changes for {STORM_VOLUMES} volumes and 50 Node changes"
    );
    cluster.finish().await;
}
