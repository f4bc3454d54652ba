//! The agents of the controller's namespace, read from the Secrets `nfsprov-agent init`
//! prints (labelled as agent credentials) and watched: an added, changed or deleted
//! Secret takes effect without a restart, and a broken one fails only the agent it was
//! meant to configure, reported by name in the log, an event on the Secret and a metric.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ObjectReference, Secret};
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use nfsprov_api_types::client::{AGENT_SECRET_SELECTOR, agents_in_secret};
use tokio::sync::watch;
use tracing::{info, warn};

use crate::agents::{Agent, AgentRegistry};
use crate::context::{Context, stopped};

pub(crate) const REASON_INVALID: &str = "AgentSecretInvalid";
const ACTION: &str = "ReadAgent";

/// What one reading of the Secrets gave.
#[derive(Debug, Default)]
pub(crate) struct Reading {
    pub(crate) agents: BTreeMap<String, Arc<Agent>>,
    /// Why an agent a Secret meant to configure is missing, by agent name.
    pub(crate) problems: BTreeMap<String, String>,
    /// What is wrong with each Secret that configures no agent (or not all of its).
    pub(crate) invalid: BTreeMap<String, String>,
}

/// Reads every Secret; an agent whose Secret reads as before is kept as it is (with its
/// cached facts and its reconcile slots).
pub(crate) fn read(secrets: &[Arc<Secret>], registry: &AgentRegistry) -> Reading {
    let mut sorted: Vec<&Arc<Secret>> = secrets.iter().collect();
    sorted.sort_by_key(|s| s.name_any());
    let mut reading = Reading::default();
    for secret in sorted {
        let name = secret.name_any();
        let data: BTreeMap<String, Vec<u8>> = secret
            .data
            .iter()
            .flatten()
            .map(|(k, v)| (k.clone(), v.0.clone()))
            .collect();
        let found = agents_in_secret(&data);
        let mut complain = |agent: Option<&str>, message: String| {
            if let Some(agent) = agent {
                reading
                    .problems
                    .insert(agent.to_owned(), format!("its Secret {name}: {message}"));
            }
            let entry = reading.invalid.entry(name.clone()).or_default();
            if !entry.is_empty() {
                entry.push_str("; ");
            }
            entry.push_str(&message);
        };
        if found.is_empty() {
            complain(None, "no *.toml key with agent settings".to_owned());
            continue;
        }
        for result in found {
            let agent = match result {
                Ok(agent) => agent,
                Err(e) => {
                    // Keys are named after their agent (`<name>.toml`), so the claims of
                    // that agent's classes learn what is wrong with its Secret.
                    complain(Some(e.key.trim_end_matches(".toml")), e.to_string());
                    continue;
                }
            };
            let agent_name = agent.config.name.clone();
            if let Some(first) = reading.agents.get(&agent_name) {
                let other = first.secret().map_or("", |(s, _)| s).to_owned();
                complain(
                    None,
                    format!(
                        "key {}: agent {agent_name} is already configured by Secret {other}",
                        agent.key
                    ),
                );
                continue;
            }
            let previous = registry.get(&agent_name);
            if let Some(previous) = previous
                .as_ref()
                .filter(|p| p.secret() == Some((name.as_str(), &agent)))
            {
                reading.agents.insert(agent_name, previous.clone());
                continue;
            }
            let slots = previous.map_or_else(
                || Arc::new(tokio::sync::Semaphore::new(registry.max_in_flight())),
                |p| p.slots(),
            );
            let key = agent.key.clone();
            match Agent::from_secret(&name, agent, registry.metrics().clone(), slots) {
                Ok(made) => {
                    registry.metrics().agent_loaded(&agent_name);
                    reading.agents.insert(agent_name, Arc::new(made));
                }
                Err(e) => complain(Some(&agent_name), format!("key {key}: {e}")),
            }
        }
    }
    reading
}

fn secret_reference(namespace: &str, name: &str, secrets: &Store<Secret>) -> ObjectReference {
    let found = secrets.get(&reflector::ObjectRef::new(name).within(namespace));
    match found {
        Some(secret) => secret.object_ref(&()),
        None => ObjectReference {
            api_version: Some("v1".to_owned()),
            kind: Some("Secret".to_owned()),
            namespace: Some(namespace.to_owned()),
            name: Some(name.to_owned()),
            ..ObjectReference::default()
        },
    }
}

/// Watches the agent Secrets of `namespace` into `ctx.agents` until `shutdown`. The
/// agents count as known only once the first complete list is in.
pub(crate) async fn run(ctx: Arc<Context>, namespace: String, shutdown: watch::Receiver<bool>) {
    ctx.agents.mark_unready();
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &namespace);
    let (store, writer) = reflector::store::<Secret>();
    let stream = watcher(
        api,
        watcher::Config::default().labels(AGENT_SECRET_SELECTOR),
    )
    .default_backoff()
    .reflect(writer);
    let mut stream = std::pin::pin!(stream.take_until(stopped(shutdown)));
    // What was last said about each broken Secret, so a resync does not say it again.
    let mut reported: BTreeMap<String, String> = BTreeMap::new();
    let mut listed = false;
    while let Some(event) = stream.next().await {
        match event {
            Ok(watcher::Event::InitDone) => listed = true,
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) => {}
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => continue,
            Err(e) => {
                warn!(error = %e, %namespace, "cannot watch the agent Secrets");
                continue;
            }
        }
        if !listed {
            continue;
        }
        let before = ctx.agents.names();
        let reading = read(&store.state(), &ctx.agents);
        let after: Vec<String> = reading.agents.keys().cloned().collect();
        ctx.metrics
            .set_invalid_agent_secrets(reading.invalid.keys().map(String::as_str));
        for (secret, message) in &reading.invalid {
            if reported.get(secret) == Some(message) {
                continue;
            }
            warn!(%secret, problem = %message, "agent Secret configures no agent");
            let regarding = secret_reference(&namespace, secret, &store);
            ctx.event(
                &regarding,
                EventType::Warning,
                REASON_INVALID,
                ACTION,
                &format!("Secret {secret}: {message}"),
            )
            .await;
        }
        reported = reading.invalid.clone();
        let changed: Vec<&str> = reading
            .agents
            .iter()
            .filter(|(name, agent)| {
                ctx.agents
                    .get(name)
                    .is_some_and(|old| !Arc::ptr_eq(&old, agent))
            })
            .map(|(name, _)| name.as_str())
            .collect();
        if before != after || !changed.is_empty() {
            info!(agents = ?after, ?changed, "agents from Secrets");
        }
        ctx.agents.install(reading.agents, reading.problems);
        ctx.agents.mark_ready();
    }
}
