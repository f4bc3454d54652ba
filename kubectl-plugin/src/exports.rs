//! The export a volume's class asks for, worked out from the cluster as the controller
//! sees it (the vocabulary's rules, the Nodes' InternalIPs, the scheduled Pods' claims),
//! for `doctor` to compare with what the agent serves.

use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, PersistentVolume, Pod};
use kube::Client;
use kube::api::{Api, ListParams};
use nfsprov_api_types::{ExportClient, ExportRequest};
use nfsprov_vocabulary::exports::{export_request, fixed_clients, read_only};
use nfsprov_vocabulary::params::{ClassParams, ExportClients};

use crate::cluster::{Access, list};

/// The Nodes and Pods, listed only when a class follows them.
#[derive(Debug, Default)]
pub(crate) struct Cluster {
    pub nodes: Vec<Node>,
    pub pods: Vec<Pod>,
}

impl Cluster {
    pub(crate) async fn list(client: &Client) -> anyhow::Result<Self> {
        let access = |resource| Access {
            verb: "list",
            group: "",
            resource,
            namespace: None,
        };
        let nodes = list(
            &Api::<Node>::all(client.clone()),
            &ListParams::default(),
            access("nodes"),
        )
        .await?;
        // Only pods bound to a node can mount anything, as for the controller.
        let pods = list(
            &Api::<Pod>::all(client.clone()),
            &ListParams::default().fields("spec.nodeName!="),
            access("pods"),
        )
        .await?;
        Ok(Self { nodes, pods })
    }
}

fn internal_addresses(node: &Node) -> impl Iterator<Item = IpAddr> + '_ {
    node.status
        .iter()
        .flat_map(|s| s.addresses.iter().flatten())
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse().ok())
}

/// Whether `pod` mounts claim `namespace/name`, directly or as a generic ephemeral volume.
fn uses(pod: &Pod, namespace: &str, name: &str) -> bool {
    let pod_name = pod.metadata.name.as_deref().unwrap_or_default();
    pod.metadata.namespace.as_deref() == Some(namespace)
        && pod
            .spec
            .iter()
            .flat_map(|s| s.volumes.iter().flatten())
            .any(|v| match (&v.persistent_volume_claim, &v.ephemeral) {
                (Some(source), _) => source.claim_name == name,
                (None, Some(_)) => format!("{pod_name}-{}", v.name) == name,
                (None, None) => false,
            })
}

/// The clients a class admits for claim `namespace/name`, sorted.
pub(crate) fn clients(
    which: Option<&ExportClients>,
    namespace: &str,
    name: &str,
    cluster: &Cluster,
) -> Vec<ExportClient> {
    if let Some(fixed) = fixed_clients(which) {
        return fixed;
    }
    let mut addresses: Vec<IpAddr> = match which {
        Some(ExportClients::Pods) => {
            let nodes: Vec<&str> = cluster
                .pods
                .iter()
                .filter(|pod| uses(pod, namespace, name))
                .filter_map(|pod| pod.spec.as_ref()?.node_name.as_deref())
                .collect();
            cluster
                .nodes
                .iter()
                .filter(|node| nodes.contains(&node.metadata.name.as_deref().unwrap_or_default()))
                .flat_map(internal_addresses)
                .collect()
        }
        _ => cluster.nodes.iter().flat_map(internal_addresses).collect(),
    };
    addresses.sort_unstable();
    addresses.dedup();
    addresses.into_iter().map(ExportClient::Host).collect()
}

/// The export the class asks for the volume `pv` now; its access from the PV's access
/// modes, which are the claim's.
pub(crate) fn wanted(
    params: &ClassParams,
    pv: &PersistentVolume,
    cluster: &Cluster,
) -> ExportRequest {
    let spec = pv.spec.as_ref();
    let claim = spec.and_then(|s| s.claim_ref.as_ref());
    let modes = spec
        .and_then(|s| s.access_modes.as_deref())
        .unwrap_or_default();
    let clients = clients(
        params.export_clients.as_ref(),
        claim
            .and_then(|c| c.namespace.as_deref())
            .unwrap_or_default(),
        claim.and_then(|c| c.name.as_deref()).unwrap_or_default(),
        cluster,
    );
    export_request(params, read_only(modes), clients)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nfsprov_api_types::{ExportAccess, Squash};
    use serde_json::json;

    use super::*;

    fn node(name: &str, address: &str) -> Node {
        serde_json::from_value(json!({
            "metadata": {"name": name},
            "status": {"addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "ExternalIP", "address": "203.0.113.9"},
            ]},
        }))
        .unwrap()
    }

    fn pod(name: &str, node: &str, claim: &str) -> Pod {
        serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "team"},
            "spec": {
                "nodeName": node,
                "containers": [],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }))
        .unwrap()
    }

    fn params(pairs: &[(&str, &str)]) -> ClassParams {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ClassParams::parse(Some(&map)).unwrap()
    }

    #[test]
    fn the_wanted_export_follows_the_class_the_pods_and_the_access_modes() {
        let cluster = Cluster {
            nodes: vec![node("a", "10.0.0.2"), node("b", "10.0.0.3")],
            pods: vec![pod("app", "b", "data"), pod("other", "a", "logs")],
        };
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {"name": "pvc-1"},
            "spec": {
                "accessModes": ["ReadOnlyMany"],
                "claimRef": {"namespace": "team", "name": "data"},
            },
        }))
        .unwrap();
        let wanted = wanted(
            &params(&[("exportClients", "pods"), ("squash", "all"), ("uid", "7")]),
            &pv,
            &cluster,
        );
        assert_eq!(wanted.clients, vec!["10.0.0.3".parse().unwrap()]);
        assert_eq!(wanted.access, ExportAccess::ReadOnly);
        assert_eq!((wanted.squash, wanted.anon_uid), (Squash::All, Some(7)));
        let nodes = super::wanted(&params(&[("exportClients", "nodes")]), &pv, &cluster);
        assert_eq!(
            nodes.clients,
            vec!["10.0.0.2".parse().unwrap(), "10.0.0.3".parse().unwrap()]
        );
        let everyone = super::wanted(&params(&[]), &pv, &cluster);
        assert_eq!(everyone.clients, vec![ExportClient::Everyone]);
    }
}
