//! Where volumes are used: Node objects for the "nodes" a scenario plays (each with a
//! loopback address of its own as its InternalIP) and Pod objects bound to them. No
//! kubelet or scheduler runs, in the simulator or on the real API server this suite
//! uses: the objects themselves are what the controller watches.

use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{DeleteParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Resource};
use serde_json::json;

use crate::system::System;

const WAIT: Duration = Duration::from_secs(60);

impl System {
    /// Creates the Node the scenario calls `name`, its InternalIP `address`; returns the
    /// name it has in this run (Nodes are cluster-scoped).
    pub async fn node(&self, name: &str, address: Ipv4Addr) -> anyhow::Result<String> {
        let name = self.names.cluster_scoped(name);
        // The API server keeps the status a Node is created with (kubelets register
        // their addresses that way), so no status write follows.
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": name, "labels": self.names.run_labels()},
            "status": {"addresses": [
                {"type": "InternalIP", "address": address.to_string()},
                {"type": "Hostname", "address": name},
            ]},
        }))?;
        self.placed.store(true, Ordering::Relaxed);
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await?;
        Ok(name)
    }

    /// Deletes Node `name` (as [`System::node`] returned it) and waits until it is gone.
    pub async fn remove_node(&self, name: &str) -> anyhow::Result<()> {
        let nodes = Api::<Node>::all(self.client.clone());
        delete_and_wait(nodes, name, DeleteParams::default()).await
    }

    /// Creates Pod `name` in the scenario's namespace, bound to Node `node` (as a
    /// scheduler binds it) and using claim `claim`.
    pub async fn pod(&self, name: &str, claim: &str, node: &str) -> anyhow::Result<()> {
        if self.api.is_shared() {
            // The API server admits a pod only once the namespace's default
            // ServiceAccount exists, which the controller manager makes shortly after
            // the namespace.
            let accounts =
                Api::<ServiceAccount>::namespaced(self.client.clone(), &self.names.namespace);
            tokio::time::timeout(
                WAIT,
                await_condition(accounts, "default", |a: Option<&ServiceAccount>| {
                    a.is_some()
                }),
            )
            .await
            .map_err(|_| anyhow::anyhow!("no default ServiceAccount within {WAIT:?}"))??;
        }
        let pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.names.namespace},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "busybox"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}],
            },
        }))?;
        self.placed.store(true, Ordering::Relaxed);
        self.pods().create(&PostParams::default(), &pod).await?;
        Ok(())
    }

    /// Deletes Pod `name` at once and waits until it is gone: with no kubelet to confirm a
    /// graceful deletion, only a forced one removes a bound pod.
    pub async fn remove_pod(&self, name: &str) -> anyhow::Result<()> {
        delete_and_wait(self.pods(), name, DeleteParams::default().grace_period(0)).await
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.names.namespace)
    }
}

async fn delete_and_wait<K>(api: Api<K>, name: &str, params: DeleteParams) -> anyhow::Result<()>
where
    K: Resource
        + Clone
        + std::fmt::Debug
        + k8s_openapi::serde::de::DeserializeOwned
        + Send
        + 'static,
{
    let uid = api.get(name).await?.meta().uid.clone().unwrap_or_default();
    api.delete(name, &params).await?;
    tokio::time::timeout(
        WAIT,
        await_condition(api, name, conditions::is_deleted(&uid)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("{name} not deleted within {WAIT:?}"))??;
    Ok(())
}
