//! The agents' connection settings, read from the same Secrets the controller reads.
//!
//! The controller reads the labelled agent Secrets of its namespace through the API (or,
//! given `--agents-dir`, the Secrets its Deployment projects there); here the same
//! Secrets are read with the same [`agents_in_secret`] of api-types, so both sides agree
//! on every setting, and the clients hold what they need in memory.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::ListParams;
use nfsprov_api_types::client::{AGENT_SECRET_SELECTOR, AgentClient, agents_in_secret};

use crate::cluster::{Access, Target, get_opt, list};

/// The label `nfsprov-agent init` puts on the Secrets it prints.
pub(crate) const CREDENTIALS_SELECTOR: &str = AGENT_SECRET_SELECTOR;

/// One agent as configured: its name and a client, or why none could be made.
pub(crate) struct ConfiguredAgent {
    pub name: String,
    pub secret: String,
    pub url: Option<String>,
    pub client: Result<AgentClient, String>,
}

/// Every configured agent, by name.
pub(crate) struct Agents {
    pub agents: Vec<ConfiguredAgent>,
    /// Secrets the Deployment mounts that do not exist.
    pub missing_secrets: Vec<String>,
    /// How the Secrets were found, for messages.
    pub source: String,
}

impl Agents {
    pub(crate) fn names(&self) -> BTreeSet<&str> {
        self.agents.iter().map(|a| a.name.as_str()).collect()
    }

    pub(crate) fn get(&self, name: &str) -> Option<&ConfiguredAgent> {
        self.agents.iter().find(|a| a.name == name)
    }

    /// Agent `name`, or an error naming the agents there are.
    pub(crate) fn configured(&self, name: &str) -> anyhow::Result<&ConfiguredAgent> {
        self.get(name).ok_or_else(|| {
            anyhow::anyhow!(
                "agent {name:?} is not configured; known agents: {}",
                self.names().into_iter().collect::<Vec<_>>().join(", ")
            )
        })
    }

    /// The client of agent `name`, or why there is none (not configured, or its Secret
    /// does not make a client).
    pub(crate) fn client(&self, name: &str) -> anyhow::Result<&AgentClient> {
        self.configured(name)?
            .client
            .as_ref()
            .map_err(|e| anyhow::anyhow!("agent {name}: {e}"))
    }
}

/// The Secrets the controller's Deployment projects into its agents directory (the
/// directory its `--agents-dir` flag or `NFSPROV_AGENTS_DIR` names), in mount order;
/// empty when it names none, and the controller reads the labelled Secrets instead.
pub(crate) fn secrets_of_deployment(deployment: &Deployment) -> Vec<String> {
    let Some(pod) = deployment
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
    else {
        return Vec::new();
    };
    let mut names = Vec::new();
    for container in &pod.containers {
        let Some(dir) = agents_dir_of(container) else {
            continue;
        };
        let mounts = container.volume_mounts.iter().flatten();
        for mount in mounts.filter(|m| m.mount_path.trim_end_matches('/') == dir) {
            let volumes = pod.volumes.iter().flatten();
            for volume in volumes.filter(|v| v.name == mount.name) {
                if let Some(name) = volume.secret.as_ref().and_then(|s| s.secret_name.clone()) {
                    names.push(name);
                }
                let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref());
                for source in sources.into_iter().flatten() {
                    if let Some(secret) = &source.secret {
                        names.push(secret.name.clone());
                    }
                }
            }
        }
    }
    let mut seen = BTreeSet::new();
    names.retain(|n| seen.insert(n.clone()));
    names
}

fn agents_dir_of(container: &k8s_openapi::api::core::v1::Container) -> Option<String> {
    let args = container
        .command
        .iter()
        .flatten()
        .chain(container.args.iter().flatten());
    let mut previous_was_flag = false;
    let mut from_args = None;
    for arg in args {
        if previous_was_flag {
            from_args = Some(arg.clone());
        } else if let Some(value) = arg.strip_prefix("--agents-dir=") {
            from_args = Some(value.to_owned());
        }
        previous_was_flag = arg == "--agents-dir";
    }
    let from_env = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "NFSPROV_AGENTS_DIR")
        .and_then(|e| e.value.clone());
    from_args
        .or(from_env)
        .map(|dir| dir.trim_end_matches('/').to_owned())
}

/// The agents of one Secret: each `*.toml` key is one agent.
pub(crate) fn agents_in(secret: &Secret) -> Vec<ConfiguredAgent> {
    let secret_name = secret.metadata.name.clone().unwrap_or_default();
    let mut data: BTreeMap<String, Vec<u8>> = secret
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect();
    // stringData is write-only on a real API server, but a Secret read from a file or an
    // older server may still carry it.
    data.extend(
        secret
            .string_data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.clone().into_bytes())),
    );
    let found = agents_in_secret(&data);
    if found.is_empty() {
        return vec![ConfiguredAgent {
            name: secret_name.clone(),
            secret: secret_name.clone(),
            url: None,
            client: Err(format!(
                "Secret {secret_name} has no *.toml key with agent settings"
            )),
        }];
    }
    found
        .into_iter()
        .map(|read| match read {
            Ok(agent) => ConfiguredAgent {
                name: agent.config.name.clone(),
                secret: secret_name.clone(),
                url: Some(agent.config.url.clone()),
                client: AgentClient::from_secret(&agent).map_err(|e| e.to_string()),
            },
            Err(e) => ConfiguredAgent {
                name: e.key.trim_end_matches(".toml").to_owned(),
                secret: secret_name.clone(),
                url: None,
                client: Err(format!("Secret {secret_name}: {e}")),
            },
        })
        .collect()
}

/// Finds the agent Secrets (those the controller's Deployment mounts when it runs with an
/// agents directory, otherwise those labelled as agent credentials, as the controller
/// reads them) and makes a client for each agent.
pub(crate) async fn load(
    target: &Target,
    deployment: Option<&Deployment>,
) -> anyhow::Result<Agents> {
    let api = Api::<Secret>::namespaced(target.client.clone(), &target.namespace);
    let mut secrets = Vec::new();
    let mut missing_secrets = Vec::new();
    let source;
    match deployment.map(secrets_of_deployment) {
        Some(names) if !names.is_empty() => {
            source = format!(
                "the Secrets Deployment {}/{} mounts",
                target.namespace, target.deployment
            );
            for name in names {
                let access = Access {
                    verb: "get",
                    group: "",
                    resource: "secrets",
                    namespace: Some(&target.namespace),
                };
                match get_opt(&api, &name, access).await? {
                    Some(secret) => secrets.push(secret),
                    None => missing_secrets.push(name),
                }
            }
        }
        _ => {
            source = format!(
                "the Secrets labelled {CREDENTIALS_SELECTOR} in namespace {}",
                target.namespace
            );
            let access = Access {
                verb: "list",
                group: "",
                resource: "secrets",
                namespace: Some(&target.namespace),
            };
            secrets = list(
                &api,
                &ListParams::default().labels(CREDENTIALS_SELECTOR),
                access,
            )
            .await?;
        }
    }
    let mut agents: Vec<ConfiguredAgent> = secrets.iter().flat_map(agents_in).collect();
    agents.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Agents {
        agents,
        missing_secrets,
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment(value: serde_json::Value) -> Deployment {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn the_secrets_projected_into_the_agents_directory_are_found() {
        let with_flag = deployment(json!({
            "metadata": {"name": "nfsprov-controller"},
            "spec": {"selector": {}, "template": {"spec": {
                "containers": [{"name": "controller",
                    "args": ["--agents-dir=/etc/nfsprov/agents"],
                    "volumeMounts": [
                        {"name": "agents", "mountPath": "/etc/nfsprov/agents"},
                        {"name": "other", "mountPath": "/etc/other"},
                    ]}],
                "volumes": [
                    {"name": "agents", "projected": {"sources": [
                        {"secret": {"name": "nfsprov-agent-nfs1"}},
                        {"secret": {"name": "nfsprov-agent-nfs2"}},
                        {"configMap": {"name": "unrelated"}},
                    ]}},
                    {"name": "other", "secret": {"secretName": "not-an-agent"}},
                ],
            }}},
        }));
        assert_eq!(
            secrets_of_deployment(&with_flag),
            ["nfsprov-agent-nfs1", "nfsprov-agent-nfs2"]
        );
        let moved = deployment(json!({
            "spec": {"selector": {}, "template": {"spec": {
                "containers": [{"name": "c", "args": ["--agents-dir", "/agents/"],
                    "volumeMounts": [{"name": "a", "mountPath": "/agents"}]}],
                "volumes": [{"name": "a", "secret": {"secretName": "s1"}}],
            }}},
        }));
        assert_eq!(secrets_of_deployment(&moved), ["s1"]);
        let by_env = deployment(json!({
            "spec": {"selector": {}, "template": {"spec": {
                "containers": [{"name": "c", "env": [{"name": "NFSPROV_AGENTS_DIR", "value": "/x"}],
                    "volumeMounts": [{"name": "a", "mountPath": "/etc/nfsprov/agents"}]}],
                "volumes": [{"name": "a", "secret": {"secretName": "s1"}}],
            }}},
        }));
        assert!(secrets_of_deployment(&by_env).is_empty());
        // Without an agents directory the controller reads the labelled Secrets, whatever
        // is mounted.
        let shipped = deployment(json!({
            "spec": {"selector": {}, "template": {"spec": {
                "containers": [{"name": "c",
                    "volumeMounts": [{"name": "a", "mountPath": "/etc/nfsprov/agents"}]}],
                "volumes": [{"name": "a", "secret": {"secretName": "s1"}}],
            }}},
        }));
        assert!(secrets_of_deployment(&shipped).is_empty());
    }

    #[test]
    fn a_secret_becomes_the_settings_the_controller_reads() {
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "nfsprov-agent-nfs1"},
            "stringData": {
                "nfs1.toml": "name = \"nfs1\"\nurl = \"https://nfs1:8443\"\nca_file = \"nfs1-ca.pem\"\ntoken_file = \"nfs1-token\"\n",
                "nfs1-ca.pem": "not a certificate\n",
                "nfs1-token": "secret\n",
            },
        }))
        .unwrap();
        let agents = agents_in(&secret);
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].name, "nfs1");
        assert_eq!(agents[0].url.as_deref(), Some("https://nfs1:8443"));
        // The settings parse; the client refuses the CA, as the controller would.
        let err = agents[0].client.as_ref().err().unwrap();
        assert!(err.contains("nfs1-ca.pem"), "{err}");

        let bad: Secret = serde_json::from_value(json!({
            "metadata": {"name": "broken"},
            "data": {"b.toml": "bmFtZSA9ICJiIgp1cmwgPSAiaHR0cDovL3giCg=="},
        }))
        .unwrap();
        let agents = agents_in(&bad);
        assert_eq!(agents[0].name, "b");
        let err = agents[0].client.as_ref().err().unwrap();
        assert!(err.starts_with("Secret broken: key b.toml:"), "{err}");

        let empty: Secret = serde_json::from_value(json!({"metadata": {"name": "empty"}})).unwrap();
        let agents = agents_in(&empty);
        assert!(agents[0].client.as_ref().is_err());
    }
}
