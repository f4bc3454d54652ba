//! Access to the Kubernetes API: the connection from a kubeconfig, and reads that turn a
//! refusal into the RBAC rule that would allow them.

use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::ListParams;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};
use nfsprov_vocabulary::names::ANN_PROVISIONED_BY;
use serde::de::DeserializeOwned;

/// A client from `kubeconfig` (or `$KUBECONFIG`, then `~/.kube/config`), using `context`
/// when given, the file's current context otherwise.
pub(crate) async fn connect(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> anyhow::Result<Client> {
    let options = KubeConfigOptions {
        context: context.map(str::to_owned),
        ..KubeConfigOptions::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let file = Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read the kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(file, &options).await
        }
        None => Config::from_kubeconfig(&options).await,
    }
    .context("cannot load the kubeconfig")?;
    Client::try_from(config).context("cannot build the Kubernetes client")
}

/// One kind of API access, named as an RBAC rule names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Access<'a> {
    pub verb: &'a str,
    /// API group; empty for the core group.
    pub group: &'a str,
    pub resource: &'a str,
    /// `None` for cluster-scoped resources and for lists across all namespaces.
    pub namespace: Option<&'a str>,
}

impl Access<'_> {
    /// What to tell someone the API refused: the verb and resource it refused, and the
    /// rule that grants them.
    pub(crate) fn forbidden_message(&self, server_message: &str) -> String {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        let (scope, binding) = match self.namespace {
            Some(ns) => (
                format!(" in namespace {ns}"),
                format!("a Role in namespace {ns} (with a RoleBinding)"),
            ),
            None => (
                String::new(),
                "a ClusterRole (with a ClusterRoleBinding)".to_owned(),
            ),
        };
        format!(
            "forbidden: cannot {verb} {resource}{group}{scope} ({server_message}); add this rule to {binding} for your user: \
             {{apiGroups: [\"{g}\"], resources: [\"{resource}\"], verbs: [\"{verb}\"]}}",
            verb = self.verb,
            resource = self.resource,
            g = self.group,
        )
    }

    fn describe(&self) -> String {
        let group = if self.group.is_empty() {
            String::new()
        } else {
            format!(".{}", self.group)
        };
        match self.namespace {
            Some(ns) => format!("{} {}{group} in namespace {ns}", self.verb, self.resource),
            None => format!("{} {}{group}", self.verb, self.resource),
        }
    }

    /// The error to report for a failed call.
    pub(crate) fn error(&self, error: kube::Error) -> anyhow::Error {
        match &error {
            kube::Error::Api(status) if status.code == 403 => {
                anyhow::anyhow!(self.forbidden_message(&status.message))
            }
            _ => anyhow::Error::new(error).context(format!("cannot {}", self.describe())),
        }
    }
}

/// PVs per page where only a little of each is kept.
pub const PV_PAGE: u32 = 500;

/// Lists everything of a kind, refusals explained.
pub(crate) async fn list<K>(
    api: &Api<K>,
    params: &ListParams,
    access: Access<'_>,
) -> anyhow::Result<Vec<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    api.list(params)
        .await
        .map(|list| list.items)
        .map_err(|e| access.error(e))
}

/// Reads one object, `None` when it does not exist.
pub(crate) async fn get_opt<K>(
    api: &Api<K>,
    name: &str,
    access: Access<'_>,
) -> anyhow::Result<Option<K>>
where
    K: Clone + DeserializeOwned + std::fmt::Debug,
{
    match api.get(name).await {
        Ok(object) => Ok(Some(object)),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
        Err(e) => Err(access.error(e)),
    }
}

/// Where the controller runs and which provisioner it answers for.
#[derive(Clone)]
pub struct Target {
    pub client: Client,
    pub namespace: String,
    pub provisioner: String,
    pub deployment: String,
    pub lease: String,
}

impl Target {
    /// The controller's Deployment, `None` when it is not there.
    pub async fn deployment(&self) -> anyhow::Result<Option<Deployment>> {
        let api = Api::<Deployment>::namespaced(self.client.clone(), &self.namespace);
        get_opt(
            &api,
            &self.deployment,
            Access {
                verb: "get",
                group: "apps",
                resource: "deployments",
                namespace: Some(&self.namespace),
            },
        )
        .await
    }

    /// The leader-election Lease, `None` when no replica has taken it yet.
    pub async fn lease(&self) -> anyhow::Result<Option<Lease>> {
        let api = Api::<Lease>::namespaced(self.client.clone(), &self.namespace);
        get_opt(
            &api,
            &self.lease,
            Access {
                verb: "get",
                group: "coordination.k8s.io",
                resource: "leases",
                namespace: Some(&self.namespace),
            },
        )
        .await
    }

    /// The StorageClasses naming this provisioner, by name.
    pub async fn classes(&self) -> anyhow::Result<Vec<StorageClass>> {
        let api = Api::<StorageClass>::all(self.client.clone());
        let access = Access {
            verb: "list",
            group: "storage.k8s.io",
            resource: "storageclasses",
            namespace: None,
        };
        let mut classes: Vec<StorageClass> = list(&api, &ListParams::default(), access)
            .await?
            .into_iter()
            .filter(|c| c.provisioner == self.provisioner)
            .collect();
        classes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(classes)
    }

    /// The PVs this provisioner made, by name.
    pub async fn volumes(&self) -> anyhow::Result<Vec<PersistentVolume>> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let access = Access {
            verb: "list",
            group: "",
            resource: "persistentvolumes",
            namespace: None,
        };
        let mut volumes: Vec<PersistentVolume> = list(&api, &ListParams::default(), access)
            .await?
            .into_iter()
            .filter(|pv| provisioned_by(pv) == Some(self.provisioner.as_str()))
            .collect();
        volumes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(volumes)
    }

    /// The PVs this provisioner made, handed to `each` a page of [`PV_PAGE`] at a time
    /// in the API's order, so a caller keeping little of each holds one page, not every
    /// PV of the cluster.
    pub async fn for_each_volume_page(
        &self,
        mut each: impl FnMut(Vec<PersistentVolume>),
    ) -> anyhow::Result<()> {
        let api = Api::<PersistentVolume>::all(self.client.clone());
        let access = Access {
            verb: "list",
            group: "",
            resource: "persistentvolumes",
            namespace: None,
        };
        let mut params = ListParams::default().limit(PV_PAGE);
        loop {
            let page = api.list(&params).await.map_err(|e| access.error(e))?;
            each(
                page.items
                    .into_iter()
                    .filter(|pv| provisioned_by(pv) == Some(self.provisioner.as_str()))
                    .collect(),
            );
            match page.metadata.continue_.filter(|c| !c.is_empty()) {
                Some(next) => params = params.continue_token(&next),
                None => return Ok(()),
            }
        }
    }

    /// Claims in every namespace.
    pub async fn claims(&self) -> anyhow::Result<Vec<PersistentVolumeClaim>> {
        let api = Api::<PersistentVolumeClaim>::all(self.client.clone());
        let access = Access {
            verb: "list",
            group: "",
            resource: "persistentvolumeclaims",
            namespace: None,
        };
        list(&api, &ListParams::default(), access).await
    }

    /// Events with one of `reasons`, in every namespace (those about PVs are in
    /// `default`, those about claims in the claim's namespace).
    pub async fn events(&self, reasons: &[&str]) -> anyhow::Result<Vec<Event>> {
        let api = Api::<Event>::all(self.client.clone());
        let access = Access {
            verb: "list",
            group: "",
            resource: "events",
            namespace: None,
        };
        Ok(list(&api, &ListParams::default(), access)
            .await?
            .into_iter()
            .filter(|e| e.reason.as_deref().is_some_and(|r| reasons.contains(&r)))
            .collect())
    }
}

/// The provisioner that made a PV.
pub(crate) fn provisioned_by(pv: &PersistentVolume) -> Option<&str> {
    annotation(&pv.metadata, ANN_PROVISIONED_BY)
}

pub(crate) fn annotation<'a>(
    meta: &'a k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
    key: &str,
) -> Option<&'a str> {
    meta.annotations.as_ref()?.get(key).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_verb_resource_and_rule() {
        let namespaced = Access {
            verb: "list",
            group: "",
            resource: "secrets",
            namespace: Some("nfsprov"),
        };
        let text = namespaced.forbidden_message("secrets is forbidden: User \"bob\" cannot list");
        assert!(
            text.starts_with("forbidden: cannot list secrets in namespace nfsprov"),
            "{text}"
        );
        assert!(text.contains("a Role in namespace nfsprov"), "{text}");
        assert!(
            text.contains(r#"{apiGroups: [""], resources: ["secrets"], verbs: ["list"]}"#),
            "{text}"
        );
        let cluster = Access {
            verb: "list",
            group: "storage.k8s.io",
            resource: "storageclasses",
            namespace: None,
        };
        let text = cluster.forbidden_message("no");
        assert!(
            text.starts_with("forbidden: cannot list storageclasses.storage.k8s.io (no)"),
            "{text}"
        );
        assert!(text.contains("a ClusterRole"), "{text}");
        assert!(text.contains(r#"apiGroups: ["storage.k8s.io"]"#), "{text}");
    }
}
