//! Who could mount a volume: the Nodes' addresses and the scheduled Pods' claims, watched
//! for the classes whose `exportClients` follow the cluster (`nodes`, `pods`). Both are
//! decoded into forms that keep only what decides an export, since a cluster may have
//! tens of thousands of pods: a name, a node, the claims a pod uses.

use std::borrow::Cow;
use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use kube::core::{ClusterResourceScope, NamespaceResourceScope};
use kube::runtime::reflector::{self, Store, store::Writer};
use nfsprov_api_types::ExportClient;
use nfsprov_vocabulary::params::ExportClients;
use serde::{Deserialize, Deserializer};
use tokio::sync::Notify;

/// The node address kind that NFS traffic from a node comes from: the one the cluster
/// itself uses between nodes. External addresses would be NAT'd anyway.
const INTERNAL_IP: &str = "InternalIP";

/// The metadata the watches need to resume and the stores to key by.
fn slim_meta<'de, D: Deserializer<'de>>(deserializer: D) -> Result<ObjectMeta, D::Error> {
    #[derive(Deserialize, Default)]
    #[serde(rename_all = "camelCase", default)]
    struct Meta {
        name: Option<String>,
        namespace: Option<String>,
        resource_version: Option<String>,
        uid: Option<String>,
    }
    let meta = Meta::deserialize(deserializer)?;
    Ok(ObjectMeta {
        name: meta.name,
        namespace: meta.namespace,
        resource_version: meta.resource_version,
        uid: meta.uid,
        ..ObjectMeta::default()
    })
}

/// A Node reduced to its name and InternalIP addresses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "DecodedNode")]
pub(crate) struct NodeAddresses {
    pub(crate) metadata: ObjectMeta,
    pub(crate) addresses: Vec<IpAddr>,
}

#[derive(Deserialize)]
struct DecodedNode {
    #[serde(default, deserialize_with = "slim_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    status: Option<DecodedNodeStatus>,
}

#[derive(Deserialize, Default)]
#[serde(default)]
struct DecodedNodeStatus {
    addresses: Vec<DecodedAddress>,
}

#[derive(Deserialize)]
struct DecodedAddress {
    #[serde(rename = "type")]
    kind: String,
    address: String,
}

impl From<DecodedNode> for NodeAddresses {
    fn from(node: DecodedNode) -> Self {
        let mut addresses: Vec<IpAddr> = node
            .status
            .unwrap_or_default()
            .addresses
            .into_iter()
            .filter(|a| a.kind == INTERNAL_IP)
            // A malformed address admits nobody rather than failing the whole watch.
            .filter_map(|a| a.address.parse().ok())
            .collect();
        addresses.sort_unstable();
        addresses.dedup();
        Self {
            metadata: node.metadata,
            addresses,
        }
    }
}

/// A Pod reduced to its node and the claims it mounts.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "DecodedPod")]
pub(crate) struct MountingPod {
    pub(crate) metadata: ObjectMeta,
    /// `spec.nodeName`: set once the pod is bound to a node, never changed after.
    pub(crate) node: Option<Box<str>>,
    /// The claims of its `persistentVolumeClaim` volumes and of its generic ephemeral
    /// volumes (whose claim is named `<pod>-<volume>`).
    pub(crate) claims: Box<[Box<str>]>,
}

#[derive(Deserialize)]
struct DecodedPod {
    #[serde(default, deserialize_with = "slim_meta")]
    metadata: ObjectMeta,
    #[serde(default)]
    spec: Option<DecodedPodSpec>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
struct DecodedPodSpec {
    node_name: Option<String>,
    volumes: Vec<DecodedPodVolume>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DecodedPodVolume {
    #[serde(default)]
    name: String,
    #[serde(default)]
    persistent_volume_claim: Option<DecodedClaimSource>,
    #[serde(default)]
    ephemeral: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DecodedClaimSource {
    claim_name: String,
}

impl From<DecodedPod> for MountingPod {
    fn from(pod: DecodedPod) -> Self {
        let spec = pod.spec.unwrap_or_default();
        let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
        let claims = spec
            .volumes
            .into_iter()
            .filter_map(
                |volume| match (volume.persistent_volume_claim, volume.ephemeral) {
                    (Some(source), _) => Some(source.claim_name.into_boxed_str()),
                    (None, Some(_)) => Some(format!("{pod_name}-{}", volume.name).into_boxed_str()),
                    (None, None) => None,
                },
            )
            .collect();
        Self {
            node: spec
                .node_name
                .filter(|n| !n.is_empty())
                .map(String::into_boxed_str),
            claims,
            metadata: pod.metadata,
        }
    }
}

impl MountingPod {
    /// Whether the pod mounts claim `namespace/name`.
    pub(crate) fn uses(&self, namespace: &str, name: &str) -> bool {
        self.metadata.namespace.as_deref() == Some(namespace)
            && self.claims.iter().any(|claim| &**claim == name)
    }
}

macro_rules! slim_resource {
    ($type:ty, $scope:ty, $kind:literal, $plural:literal) => {
        impl Resource for $type {
            type DynamicType = ();
            type Scope = $scope;

            fn kind(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($kind)
            }

            fn group(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("")
            }

            fn version(_: &()) -> Cow<'_, str> {
                Cow::Borrowed("v1")
            }

            fn plural(_: &()) -> Cow<'_, str> {
                Cow::Borrowed($plural)
            }

            fn meta(&self) -> &ObjectMeta {
                &self.metadata
            }

            fn meta_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

slim_resource!(NodeAddresses, ClusterResourceScope, "Node", "nodes");
slim_resource!(MountingPod, NamespaceResourceScope, "Pod", "pods");

/// The Node and Pod caches, shared by provisioning (the first export of a volume) and the
/// export reconciler (every later change). Their writers are taken by the watches once.
pub(crate) struct Mounters {
    nodes: Store<NodeAddresses>,
    pods: Store<MountingPod>,
    writers: Mutex<Option<(Writer<NodeAddresses>, Writer<MountingPod>)>>,
    /// Woken at every change of either cache.
    pub(crate) changed: Notify,
}

impl Default for Mounters {
    fn default() -> Self {
        let (nodes, node_writer) = reflector::store();
        let (pods, pod_writer) = reflector::store();
        Self {
            nodes,
            pods,
            writers: Mutex::new(Some((node_writer, pod_writer))),
            changed: Notify::new(),
        }
    }
}

impl std::fmt::Debug for Mounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mounters")
            .field("nodes", &self.nodes.len())
            .field("pods", &self.pods.len())
            .finish()
    }
}

impl Mounters {
    /// The writers of both caches, for the one task that watches; `None` after the first call.
    pub(crate) fn take_writers(&self) -> Option<(Writer<NodeAddresses>, Writer<MountingPod>)> {
        self.writers
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Whether both caches hold a complete list: before that, `nodes` would admit too few
    /// nodes and `pods` would miss pods already running.
    pub(crate) fn ready(&self) -> bool {
        self.nodes.wait_until_ready().now_or_never().is_some()
            && self.pods.wait_until_ready().now_or_never().is_some()
    }

    pub(crate) async fn wait_until_ready(&self) {
        let _ =
            futures::future::try_join(self.nodes.wait_until_ready(), self.pods.wait_until_ready())
                .await;
    }

    /// The cluster as it stands, indexed for many volumes at once.
    pub(crate) fn snapshot(&self) -> Snapshot {
        Snapshot::build(&self.nodes.state(), &self.pods.state())
    }

    /// The clients `which` admits for the one claim `namespace/name`, without indexing
    /// every pod's claims.
    pub(crate) fn clients_of(
        &self,
        which: &ExportClients,
        namespace: &str,
        name: &str,
    ) -> Vec<ExportClient> {
        let pods = match which {
            ExportClients::Pods => self.pods.state_filter(|pod| pod.uses(namespace, name)),
            _ => Vec::new(),
        };
        Snapshot::build(&self.nodes.state(), &pods).clients(which, namespace, name)
    }
}

/// A claim by namespace and name.
type ClaimKey = (Box<str>, Box<str>);

/// Node addresses by node name, and the nodes where each claim's pods are scheduled.
#[derive(Debug, Default)]
pub(crate) struct Snapshot {
    addresses: HashMap<Box<str>, Vec<IpAddr>>,
    claim_nodes: HashMap<ClaimKey, BTreeSet<Box<str>>>,
}

impl Snapshot {
    pub(crate) fn build(nodes: &[Arc<NodeAddresses>], pods: &[Arc<MountingPod>]) -> Self {
        let addresses = nodes
            .iter()
            .filter_map(|node| {
                let name = node.metadata.name.as_deref()?;
                Some((name.into(), node.addresses.clone()))
            })
            .collect();
        let mut claim_nodes: HashMap<ClaimKey, BTreeSet<Box<str>>> = HashMap::new();
        for pod in pods {
            let (Some(node), Some(namespace)) = (&pod.node, pod.metadata.namespace.as_deref())
            else {
                continue;
            };
            for claim in &pod.claims {
                claim_nodes
                    .entry((namespace.into(), claim.clone()))
                    .or_default()
                    .insert(node.clone());
            }
        }
        Self {
            addresses,
            claim_nodes,
        }
    }

    /// The clients a `nodes` or `pods` class admits for claim `namespace/name`, sorted:
    /// every address of every node, or of the nodes where a pod using the claim is
    /// scheduled. A node whose Node object is gone (or has no InternalIP) adds nobody.
    /// Fixed lists are not the cluster's: they come back as they are.
    pub(crate) fn clients(
        &self,
        which: &ExportClients,
        namespace: &str,
        name: &str,
    ) -> Vec<ExportClient> {
        let mut addresses: Vec<IpAddr> = match which {
            ExportClients::Nodes => self.addresses.values().flatten().copied().collect(),
            ExportClients::Pods => self
                .claim_nodes
                .get(&(namespace.into(), name.into()))
                .into_iter()
                .flatten()
                .filter_map(|node| self.addresses.get(node))
                .flatten()
                .copied()
                .collect(),
            ExportClients::All => return vec![ExportClient::Everyone],
            ExportClients::List(list) => return list.clone(),
        };
        addresses.sort_unstable();
        addresses.dedup();
        addresses.into_iter().map(ExportClient::Host).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn node(name: &str, addresses: &[(&str, &str)]) -> Arc<NodeAddresses> {
        let addresses: Vec<_> = addresses
            .iter()
            .map(|(kind, address)| json!({"type": kind, "address": address}))
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "labels": {"a": "b"}, "managedFields": [{}]},
                "spec": {"podCIDR": "10.244.0.0/24"},
                "status": {"addresses": addresses, "capacity": {"cpu": "4"}},
            }))
            .unwrap(),
        )
    }

    fn pod(namespace: &str, name: &str, node: Option<&str>, claims: &[&str]) -> Arc<MountingPod> {
        let volumes: Vec<_> = claims
            .iter()
            .map(|claim| json!({"name": claim, "persistentVolumeClaim": {"claimName": claim}}))
            .chain([json!({"name": "config", "configMap": {"name": "x"}})])
            .collect();
        Arc::new(
            serde_json::from_value(json!({
                "metadata": {"name": name, "namespace": namespace, "annotations": {"x": "y"}},
                "spec": {
                    "nodeName": node,
                    "containers": [{"name": "app", "image": "busybox", "env": [{"name": "A", "value": "1"}]}],
                    "volumes": volumes,
                },
                "status": {"phase": "Running"},
            }))
            .unwrap(),
        )
    }

    fn hosts(addresses: &[&str]) -> Vec<ExportClient> {
        addresses.iter().map(|a| a.parse().unwrap()).collect()
    }

    #[test]
    fn a_node_keeps_its_name_and_internal_addresses_only() {
        let node = node(
            "node-a",
            &[
                ("InternalIP", "10.0.0.7"),
                ("ExternalIP", "203.0.113.7"),
                ("Hostname", "node-a"),
                ("InternalIP", "fd00::7"),
                ("InternalIP", "not-an-address"),
            ],
        );
        assert_eq!(node.metadata.name.as_deref(), Some("node-a"));
        assert_eq!(node.metadata.labels, None);
        assert_eq!(node.metadata.managed_fields, None);
        assert_eq!(
            node.addresses,
            vec![
                "10.0.0.7".parse::<IpAddr>().unwrap(),
                "fd00::7".parse().unwrap()
            ]
        );
    }

    #[test]
    fn a_pod_keeps_its_node_and_claims_only() {
        let pod = pod("team", "app-0", Some("node-a"), &["data", "logs"]);
        assert_eq!(pod.node.as_deref(), Some("node-a"));
        assert_eq!(&*pod.claims, &["data".into(), "logs".into()] as &[Box<str>]);
        assert_eq!(pod.metadata.annotations, None);
        assert!(pod.uses("team", "logs"));
        assert!(!pod.uses("other", "logs"));
        assert!(!pod.uses("team", "config"));
        let ephemeral: MountingPod = serde_json::from_value(json!({
            "metadata": {"name": "web-1", "namespace": "team"},
            "spec": {"nodeName": "", "volumes": [{"name": "scratch", "ephemeral": {"volumeClaimTemplate": {"spec": {}}}}]},
        }))
        .unwrap();
        assert_eq!(&*ephemeral.claims, &["web-1-scratch".into()] as &[Box<str>]);
        assert_eq!(ephemeral.node, None, "an empty nodeName is no node");
    }

    #[test]
    fn nodes_admit_every_node_and_pods_the_nodes_of_the_claims_pods() {
        let nodes = [
            node("node-a", &[("InternalIP", "10.0.0.2")]),
            node(
                "node-b",
                &[("InternalIP", "10.0.0.3"), ("InternalIP", "fd00::3")],
            ),
            node("node-c", &[("InternalIP", "10.0.0.4")]),
        ];
        let pods = [
            pod("team", "app-0", Some("node-b"), &["data"]),
            pod("team", "app-1", Some("node-a"), &["data"]),
            pod("team", "app-2", Some("node-a"), &["data"]),
            pod("team", "pending", None, &["data"]),
            pod("other", "app-0", Some("node-c"), &["data"]),
            pod("team", "gone-node", Some("node-z"), &["data"]),
        ];
        let snapshot = Snapshot::build(&nodes, &pods);
        assert_eq!(
            snapshot.clients(&ExportClients::Nodes, "team", "data"),
            hosts(&["10.0.0.2", "10.0.0.3", "10.0.0.4", "fd00::3"])
        );
        assert_eq!(
            snapshot.clients(&ExportClients::Pods, "team", "data"),
            hosts(&["10.0.0.2", "10.0.0.3", "fd00::3"])
        );
        assert_eq!(
            snapshot.clients(&ExportClients::Pods, "other", "data"),
            hosts(&["10.0.0.4"])
        );
        assert!(
            snapshot
                .clients(&ExportClients::Pods, "team", "logs")
                .is_empty()
        );
        assert_eq!(
            snapshot.clients(&ExportClients::All, "team", "data"),
            vec![ExportClient::Everyone]
        );
    }

    #[test]
    fn the_caches_are_ready_once_both_lists_are_complete() {
        use kube::runtime::watcher::Event;
        let mounters = Mounters::default();
        assert!(!mounters.ready());
        let (mut nodes, mut pods) = mounters.take_writers().unwrap();
        assert!(mounters.take_writers().is_none());
        for event in [
            Event::Init,
            Event::InitApply((*node("node-a", &[("InternalIP", "10.0.0.2")])).clone()),
            Event::InitDone,
        ] {
            nodes.apply_watcher_event(&event);
        }
        assert!(!mounters.ready());
        for event in [
            Event::Init,
            Event::InitApply((*pod("team", "app", Some("node-a"), &["data"])).clone()),
            Event::InitDone,
        ] {
            pods.apply_watcher_event(&event);
        }
        assert!(mounters.ready());
        assert_eq!(
            mounters.clients_of(&ExportClients::Pods, "team", "data"),
            hosts(&["10.0.0.2"])
        );
    }
}
