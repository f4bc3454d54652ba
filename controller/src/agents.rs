//! The agents this controller talks to, by name. Each has its own client and a cached copy
//! of what `/v1/info` says (export, capabilities), so an unreachable agent fails only the
//! classes that use it.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use nfsprov_api_types::client::{
    AGENT_SECRET_SELECTOR, AgentClient, AgentConnectionConfig, Call, ClientError, Observer,
    SecretAgent,
};
use nfsprov_api_types::{Capabilities, Endpoint, NfsExport};
use tokio::sync::watch;
use tracing::{debug, warn};

use crate::metrics::Metrics;

/// How long what `/v1/info` reported is trusted before asking again. Short, because the
/// free space it reports decides where new volumes go; long enough that a burst of claims
/// shares one request.
const INFO_TTL: Duration = Duration::from_secs(15);

/// How long an unreachable agent is taken as unreachable without trying again, so that a
/// dead agent costs one connection timeout per interval instead of one per claim.
const UNREACHABLE_TTL: Duration = Duration::from_secs(10);

/// Most reconciles that work with one agent at once, unless configured otherwise: half of
/// the default reconcile slots, so a slow or stuck agent leaves the other half to the
/// others. One agent's volumes are still made far faster than a control plane binds them.
pub(crate) const DEFAULT_MAX_IN_FLIGHT: usize = 16;

/// When a reconcile finds its agent's slots all taken, it is tried again after this long,
/// without backoff, event or failure count: waiting is not failing.
pub(crate) const BUSY_RETRY: Duration = Duration::from_millis(500);

/// An id that ties this controller's log lines to the agent's audit log: the object the
/// call is about, then a timestamp so each attempt is told apart.
pub(crate) fn request_id(subject: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{subject}-{nanos:x}")
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum SelectError {
    #[error(
        "StorageClass names agent {wanted:?}, which is not configured ({why}); known agents: {known}"
    )]
    Unknown {
        wanted: String,
        why: String,
        known: String,
    },
    #[error(
        "StorageClass has no \"agent\" parameter and several agents are configured ({known}) with no default; name one in the class, or mark one agent default = true in its connection file or with --default-agent"
    )]
    Ambiguous { known: String },
    #[error("no agents are configured ({why})")]
    None { why: String },
    /// Retriable: agents come back.
    #[error("none of the StorageClass's agents is ready: {reasons}")]
    NoneReady { reasons: String },
}

impl SelectError {
    /// Whether trying again without a change to the class can help.
    pub(crate) fn is_retriable(&self) -> bool {
        matches!(self, SelectError::NoneReady { .. })
    }
}

/// A failed `/v1/info`, shared by every caller that waited for the same request or came
/// while the failure was remembered.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub(crate) struct InfoError(Arc<ClientError>);

impl InfoError {
    pub(crate) fn client_error(&self) -> &ClientError {
        &self.0
    }
}

/// The parts of an agent's `/v1/info` answer the controller acts on.
#[derive(Debug, Clone)]
struct InfoFacts {
    export: NfsExport,
    capabilities: Capabilities,
    /// Bytes unprivileged writers can still use on the export's filesystem: what pods
    /// writing through a root-squashed export actually get.
    available_bytes: u64,
}

type InfoFetch = Shared<BoxFuture<'static, Result<InfoFacts, InfoError>>>;

#[derive(Debug, Default)]
struct InfoState {
    /// The last answer and when it came; failures are kept only when the agent was
    /// unreachable (an agent that answers an error costs nothing to ask again).
    last: Option<(Instant, Result<InfoFacts, InfoError>)>,
    /// The request under way, which every caller meanwhile waits for instead of sending
    /// its own.
    in_flight: Option<InfoFetch>,
}

impl InfoState {
    fn fresh(&self, now: Instant) -> Option<Result<InfoFacts, InfoError>> {
        let (at, result) = self.last.as_ref()?;
        let ttl = if result.is_ok() {
            INFO_TTL
        } else {
            UNREACHABLE_TTL
        };
        (now.saturating_duration_since(*at) < ttl).then(|| result.clone())
    }
}

/// One agent: client, export overrides and the cached `/v1/info` facts.
#[derive(Debug)]
pub(crate) struct Agent {
    name: String,
    client: AgentClient,
    nfs_server: Option<String>,
    nfs_path: Option<String>,
    info: Arc<Mutex<InfoState>>,
    /// Reconciles working with this agent now; see [`Agent::try_slot`].
    slots: Arc<tokio::sync::Semaphore>,
    /// `default = true` in its settings.
    marked_default: bool,
    /// The Secret it was read from, as read: a new version of the Secret that reads the
    /// same keeps this agent (its cache and slots) as it is.
    secret: Option<(String, SecretAgent)>,
}

impl Agent {
    pub(crate) fn new(
        config: &AgentConnectionConfig,
        metrics: Arc<Metrics>,
        max_in_flight: usize,
    ) -> Result<Self, ClientError> {
        Ok(Self {
            slots: Arc::new(tokio::sync::Semaphore::new(max_in_flight.max(1))),
            name: config.name.clone(),
            client: AgentClient::new(config)?.observed_by(Arc::new(Recorder(metrics))),
            nfs_server: config.nfs_server.clone(),
            nfs_path: config.nfs_path.clone(),
            info: Arc::default(),
            marked_default: config.default,
            secret: None,
        })
    }

    /// The agent of one Secret's key; `slots` carries over the reconciles already working
    /// with an earlier version of it, so a changed Secret never doubles the limit.
    pub(crate) fn from_secret(
        secret: &str,
        agent: SecretAgent,
        metrics: Arc<Metrics>,
        slots: Arc<tokio::sync::Semaphore>,
    ) -> Result<Self, ClientError> {
        let config = &agent.config;
        Ok(Self {
            name: config.name.clone(),
            client: AgentClient::from_secret(&agent)?.observed_by(Arc::new(Recorder(metrics))),
            nfs_server: config.nfs_server.clone(),
            nfs_path: config.nfs_path.clone(),
            info: Arc::default(),
            slots,
            marked_default: config.default,
            secret: Some((secret.to_owned(), agent)),
        })
    }

    /// The Secret this agent was read from, and what it read there.
    pub(crate) fn secret(&self) -> Option<(&str, &SecretAgent)> {
        self.secret
            .as_ref()
            .map(|(name, agent)| (name.as_str(), agent))
    }

    /// Its reconcile slots, to hand on to the agent a changed Secret makes.
    pub(crate) fn slots(&self) -> Arc<tokio::sync::Semaphore> {
        self.slots.clone()
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The agent's API; every call is timed and counted in the metrics under the agent's
    /// name.
    pub(crate) fn client(&self) -> &AgentClient {
        &self.client
    }

    /// A reconcile slot of this agent, held while the reconcile works with it; `None`
    /// when all are taken, and the reconcile should step aside (retry after
    /// `BUSY_RETRY`) rather than wait and hold one of the controller's own slots.
    pub(crate) fn try_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.slots.clone().try_acquire_owned().ok()
    }

    /// What PVs mount: the agent's `/v1/info` answer with the configured overrides applied.
    /// With both overrides set the agent is not asked at all.
    pub(crate) async fn export(&self, request_id: &str) -> Result<NfsExport, InfoError> {
        if let (Some(server), Some(path)) = (&self.nfs_server, &self.nfs_path) {
            return Ok(NfsExport {
                server: server.clone(),
                path: path.clone(),
            });
        }
        let export = self.info(request_id).await?.export;
        Ok(NfsExport {
            server: self.nfs_server.clone().unwrap_or(export.server),
            path: self.nfs_path.clone().unwrap_or(export.path),
        })
    }

    /// What the agent says it can do (quota enforcement, archiving).
    pub(crate) async fn capabilities(&self, request_id: &str) -> Result<Capabilities, InfoError> {
        Ok(self.info(request_id).await?.capabilities)
    }

    /// Bytes still available on the agent's export filesystem.
    pub(crate) async fn available_bytes(&self, request_id: &str) -> Result<u64, InfoError> {
        Ok(self.info(request_id).await?.available_bytes)
    }

    fn info_state(&self) -> MutexGuard<'_, InfoState> {
        self.info.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The cached facts, or the answer of one request shared by all concurrent callers.
    /// The lock is never held across the request: a slow agent must not block callers
    /// that only need what is already known.
    async fn info(&self, request_id: &str) -> Result<InfoFacts, InfoError> {
        let fetch = {
            let mut state = self.info_state();
            if let Some(result) = state.fresh(Instant::now()) {
                return result;
            }
            match &state.in_flight {
                Some(fetch) => fetch.clone(),
                None => {
                    let fetch = self.start_info_fetch(request_id);
                    state.in_flight = Some(fetch.clone());
                    fetch
                }
            }
        };
        fetch.await
    }

    /// Runs the request in its own task, so it completes (and its answer is kept) even
    /// when every caller waiting for it gives up.
    fn start_info_fetch(&self, request_id: &str) -> InfoFetch {
        let client = self.client.clone();
        let state = self.info.clone();
        let request_id = request_id.to_owned();
        let task = tokio::spawn(async move {
            let result = client
                .info(Some(&request_id))
                .await
                .map(|info| InfoFacts {
                    export: info.nfs,
                    capabilities: info.capabilities,
                    available_bytes: info.filesystem.available_bytes,
                })
                .map_err(|e| InfoError(Arc::new(e)));
            let mut state = state.lock().unwrap_or_else(|e| e.into_inner());
            state.in_flight = None;
            let remember = match &result {
                Ok(_) => true,
                Err(e) => matches!(e.client_error(), ClientError::Transport(_)),
            };
            state.last = remember.then(|| (Instant::now(), result.clone()));
            result
        });
        task.map(|joined| {
            joined.unwrap_or_else(|e| {
                Err(InfoError(Arc::new(ClientError::Config(format!(
                    "the /v1/info request task failed: {e}"
                )))))
            })
        })
        .boxed()
        .shared()
    }
}

/// Records each call to an agent in the metrics, and logs it at debug level with its
/// request id.
#[derive(Debug)]
struct Recorder(Arc<Metrics>);

impl Observer for Recorder {
    fn finished(&self, call: &Call<'_>) {
        let operation = operation(call.endpoint);
        let code = call.error.map(error_label);
        self.0
            .agent_request(call.agent, operation, call.elapsed, code.as_deref());
        debug!(
            agent = call.agent,
            operation,
            request_id = call.request_id,
            elapsed_ms = call.elapsed.as_millis(),
            error = code,
            "agent call"
        );
    }
}

/// The `operation` label of an endpoint's calls.
fn operation(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Healthz => "healthz",
        Endpoint::Readyz => "readyz",
        Endpoint::Metrics => "metrics",
        Endpoint::Info => "info",
        Endpoint::ListVolumes => "list",
        Endpoint::CreateVolume => "create",
        Endpoint::GetVolume => "get",
        Endpoint::ResizeVolume => "resize",
        Endpoint::DeleteVolume => "delete",
        Endpoint::AdoptVolume => "adopt",
        Endpoint::CloneVolume => "clone",
        Endpoint::SetVolumeExport => "export",
        Endpoint::ListArchives => "list_archives",
        Endpoint::ArchiveVolume => "archive",
        Endpoint::GetArchive => "get_archive",
        Endpoint::DeleteArchive => "delete_archive",
        Endpoint::ListSnapshots => "list_snapshots",
        Endpoint::CreateSnapshot => "snapshot",
        Endpoint::GetSnapshot => "get_snapshot",
        Endpoint::DeleteSnapshot => "delete_snapshot",
        Endpoint::RestoreVolume => "restore",
        Endpoint::CreateTransfer => "create_transfer",
        Endpoint::TransferManifest => "transfer_manifest",
        Endpoint::TransferContent => "transfer_content",
        Endpoint::ReceiveReplica => "receive_replica",
    }
}

/// A short, bounded label for an agent error.
fn error_label(error: &ClientError) -> String {
    match error {
        ClientError::Api { error, .. } => error.code.to_string(),
        ClientError::Transport(_) => "transport".to_owned(),
        ClientError::UnexpectedResponse { .. } => "unexpected_response".to_owned(),
        ClientError::Config(_) | ClientError::Io { .. } | ClientError::Tls(_) => {
            "client".to_owned()
        }
    }
}

/// Where the agents come from, for messages naming what to fix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum AgentSource {
    /// Connection files (`--agents-dir`), read once at start.
    Files,
    /// The labelled Secrets of this namespace, watched.
    Secrets { namespace: String },
}

/// The agents as they are now: replaced whole when their Secrets change, so a reconcile
/// works with one consistent set from start to end.
#[derive(Debug, Default)]
struct Snapshot {
    agents: BTreeMap<String, Arc<Agent>>,
    default: Option<String>,
    /// Why an agent some Secret meant to configure is not there, by agent name (or by
    /// Secret name when the agent's own name could not be read).
    problems: BTreeMap<String, String>,
}

#[derive(Debug)]
struct RegistryState {
    snapshot: RwLock<Arc<Snapshot>>,
    /// True once the agents are known: at once for files, after the first complete list
    /// of Secrets otherwise. Bumped on every change, for the claims waiting for an agent.
    changes: watch::Sender<(bool, u64)>,
    /// `--default-agent`: wins over `default = true` in the settings.
    default_override: Mutex<Option<String>>,
    source: AgentSource,
    metrics: Arc<Metrics>,
    max_in_flight: usize,
}

/// All configured agents by name, and the one classes without an agent parameter use.
/// Clones share one set, which the agent Secrets' watch replaces as they change.
#[derive(Debug, Clone)]
pub struct AgentRegistry {
    shared: Arc<RegistryState>,
}

impl Default for AgentRegistry {
    fn default() -> Self {
        Self::empty(
            AgentSource::Files,
            Arc::new(Metrics::new()),
            DEFAULT_MAX_IN_FLIGHT,
        )
    }
}

impl AgentRegistry {
    /// The default is the agent marked `default = true`, or the only agent there is.
    pub fn new(
        configs: &[AgentConnectionConfig],
        metrics: Arc<Metrics>,
    ) -> Result<Self, ClientError> {
        Self::with_max_in_flight(configs, metrics, DEFAULT_MAX_IN_FLIGHT)
    }

    /// As [`AgentRegistry::new`], with at most `max_in_flight` reconciles per agent.
    pub(crate) fn with_max_in_flight(
        configs: &[AgentConnectionConfig],
        metrics: Arc<Metrics>,
        max_in_flight: usize,
    ) -> Result<Self, ClientError> {
        AgentConnectionConfig::default_name(configs)?;
        let registry = Self::empty(AgentSource::Files, metrics.clone(), max_in_flight);
        let mut agents = BTreeMap::new();
        for config in configs {
            agents.insert(
                config.name.clone(),
                Arc::new(Agent::new(config, metrics.clone(), max_in_flight)?),
            );
        }
        registry.install(agents, BTreeMap::new());
        registry.mark_ready();
        Ok(registry)
    }

    /// No agent yet: the agent Secrets' watch fills it ([`AgentRegistry::install`]).
    pub(crate) fn empty(source: AgentSource, metrics: Arc<Metrics>, max_in_flight: usize) -> Self {
        Self {
            shared: Arc::new(RegistryState {
                snapshot: RwLock::default(),
                changes: watch::Sender::new((false, 0)),
                default_override: Mutex::default(),
                source,
                metrics,
                max_in_flight: max_in_flight.max(1),
            }),
        }
    }

    pub(crate) fn source(&self) -> &AgentSource {
        &self.shared.source
    }

    pub(crate) fn metrics(&self) -> &Arc<Metrics> {
        &self.shared.metrics
    }

    pub(crate) fn max_in_flight(&self) -> usize {
        self.shared.max_in_flight
    }

    fn snapshot(&self) -> Arc<Snapshot> {
        self.shared
            .snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Replaces the agents (and why others are missing); claims waiting for an agent are
    /// looked at again.
    pub(crate) fn install(
        &self,
        agents: BTreeMap<String, Arc<Agent>>,
        mut problems: BTreeMap<String, String>,
    ) {
        let forced = self
            .shared
            .default_override
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let marked: Vec<&str> = agents
            .values()
            .filter(|a| a.marked_default)
            .map(|a| a.name())
            .collect();
        let default = match (forced, marked.as_slice()) {
            (Some(name), _) => Some(name),
            (None, [one]) => Some((*one).to_owned()),
            (None, []) => None,
            (None, several) => {
                let message = format!(
                    "several agents are marked default = true ({}); mark at most one",
                    several.join(", ")
                );
                warn!("{message}");
                problems.insert(String::new(), message);
                None
            }
        };
        self.shared
            .metrics
            .set_configured_agents(agents.keys().map(String::as_str));
        *self
            .shared
            .snapshot
            .write()
            .unwrap_or_else(|e| e.into_inner()) = Arc::new(Snapshot {
            agents,
            default,
            problems,
        });
        self.shared
            .changes
            .send_modify(|(_, generation)| *generation += 1);
    }

    /// The agents are known: reconciles waiting in [`AgentRegistry::ready`] go on.
    pub(crate) fn mark_ready(&self) {
        self.shared.changes.send_modify(|(ready, _)| *ready = true);
    }

    /// Back to unknown, until a new watch has listed the Secrets again.
    pub(crate) fn mark_unready(&self) {
        self.shared.changes.send_modify(|(ready, _)| *ready = false);
    }

    /// Resolves once the agents are known, so no claim is refused for an agent whose
    /// Secret is simply not read yet.
    pub(crate) async fn ready(&self) {
        let mut changes = self.shared.changes.subscribe();
        let _ = changes.wait_for(|(ready, _)| *ready).await;
    }

    /// Yields once for every change of the agents after the first complete set.
    pub(crate) fn changes(&self) -> impl futures::Stream<Item = ()> + Send + 'static {
        let mut changes = self.shared.changes.subscribe();
        changes.mark_unchanged();
        futures::stream::unfold(changes, |mut changes| async move {
            changes.changed().await.ok()?;
            Some(((), changes))
        })
    }

    /// Makes `name` the default, overriding any `default = true`. With connection files
    /// an unknown name is a configuration error, refused at start-up rather than at the
    /// first claim; with Secrets its Secret may simply not be there yet.
    pub(crate) fn set_default(&mut self, name: &str) -> Result<(), ClientError> {
        let snapshot = self.snapshot();
        if self.shared.source == AgentSource::Files && !snapshot.agents.contains_key(name) {
            return Err(ClientError::Config(format!(
                "default agent {name:?} is not configured; known agents: {}",
                self.names().join(", ")
            )));
        }
        *self
            .shared
            .default_override
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(name.to_owned());
        let agents = snapshot.agents.clone();
        let problems = snapshot.problems.clone();
        self.install(agents, problems);
        Ok(())
    }

    /// The agent classes without an agent parameter use, if there is one.
    pub(crate) fn default_name(&self) -> Option<String> {
        let snapshot = self.snapshot();
        match &snapshot.default {
            Some(name) => Some(name.clone()),
            None if snapshot.agents.len() == 1 => snapshot.agents.keys().next().cloned(),
            None => None,
        }
    }

    pub(crate) fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.snapshot().agents.get(name).cloned()
    }

    pub(crate) fn names(&self) -> Vec<String> {
        self.snapshot().agents.keys().cloned().collect()
    }

    /// Every agent now configured.
    pub(crate) fn all(&self) -> Vec<Arc<Agent>> {
        self.snapshot().agents.values().cloned().collect()
    }

    /// Why `name` is not configured, in words naming what to fix.
    pub(crate) fn why_missing(&self, name: &str) -> String {
        if let Some(problem) = self.snapshot().problems.get(name) {
            return problem.clone();
        }
        format!("{} configures it", self.looked_at())
    }

    /// Where agents are looked for, as the subject of a sentence.
    fn looked_at(&self) -> String {
        match &self.shared.source {
            AgentSource::Files => "no connection file".to_owned(),
            AgentSource::Secrets { namespace } => {
                format!("no Secret labelled {AGENT_SECRET_SELECTOR} in namespace {namespace}")
            }
        }
    }

    fn known(&self, snapshot: &Snapshot, name: &str) -> Result<Arc<Agent>, SelectError> {
        snapshot
            .agents
            .get(name)
            .cloned()
            .ok_or_else(|| SelectError::Unknown {
                wanted: name.to_owned(),
                why: self.why_missing(name),
                known: known_list(snapshot),
            })
    }

    /// The agent a new volume goes to. `wanted` is what the class names: nothing (the
    /// default agent), one agent, or several, of which the one with the most available
    /// space among those answering wins (ties go to the first named).
    pub(crate) async fn select(
        &self,
        wanted: &[String],
        request_id: &str,
    ) -> Result<Arc<Agent>, SelectError> {
        let snapshot = self.snapshot();
        match wanted {
            [] => match self.default_name() {
                Some(name) => self.known(&snapshot, &name),
                None if snapshot.agents.is_empty() => Err(SelectError::None {
                    why: format!("{} configures one", self.looked_at()),
                }),
                None => Err(SelectError::Ambiguous {
                    known: known_list(&snapshot),
                }),
            },
            [only] => self.known(&snapshot, only),
            several => {
                let candidates = several
                    .iter()
                    .map(|name| self.known(&snapshot, name))
                    .collect::<Result<Vec<_>, _>>()?;
                let answers = futures::future::join_all(
                    candidates
                        .iter()
                        .map(|agent| agent.available_bytes(request_id)),
                )
                .await;
                let mut best: Option<(u64, &Arc<Agent>)> = None;
                let mut reasons = Vec::new();
                for (agent, answer) in candidates.iter().zip(answers) {
                    match answer {
                        Ok(bytes) => {
                            debug!(agent = agent.name(), available_bytes = bytes, "candidate");
                            if best.is_none_or(|(most, _)| bytes > most) {
                                best = Some((bytes, agent));
                            }
                        }
                        Err(e) => reasons.push(format!("agent {}: {e}", agent.name())),
                    }
                }
                best.map(|(_, agent)| agent.clone())
                    .ok_or_else(|| SelectError::NoneReady {
                        reasons: reasons.join("; "),
                    })
            }
        }
    }
}

fn known_list(snapshot: &Snapshot) -> String {
    if snapshot.agents.is_empty() {
        return "none".to_owned();
    }
    snapshot
        .agents
        .keys()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path, name: &str) -> AgentConnectionConfig {
        let ca = dir.join("ca.pem");
        let token = dir.join("token");
        std::fs::write(&token, "t\n").unwrap();
        // Any parseable certificate will do: nothing connects in this test.
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec!["x".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        std::fs::write(&ca, cert.pem()).unwrap();
        AgentConnectionConfig {
            name: name.to_owned(),
            url: "https://127.0.0.1:1".to_owned(),
            ca_file: ca,
            token_file: Some(token),
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: 1,
            nfs_server: Some("nfs.example".to_owned()),
            nfs_path: Some("/export".to_owned()),
            default: false,
        }
    }

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|n| (*n).to_owned()).collect()
    }

    #[tokio::test]
    async fn selection_and_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let one = AgentRegistry::new(&[config(dir.path(), "a")], metrics.clone()).unwrap();
        assert_eq!(one.select(&[], "rid").await.unwrap().name(), "a");
        assert!(matches!(
            one.select(&names(&["b"]), "rid").await,
            Err(SelectError::Unknown { .. })
        ));
        // Both overrides set: the export is known without contacting the (unreachable) agent.
        let export = one
            .select(&[], "rid")
            .await
            .unwrap()
            .export("rid")
            .await
            .unwrap();
        assert_eq!(export.server, "nfs.example");
        assert_eq!(export.path, "/export");

        let mut two = AgentRegistry::new(
            &[config(dir.path(), "a"), config(dir.path(), "b")],
            metrics.clone(),
        )
        .unwrap();
        let err = two.select(&[], "rid").await.unwrap_err();
        assert!(!err.is_retriable());
        let err = err.to_string();
        assert!(
            err.contains("a, b") && err.contains("--default-agent"),
            "{err}"
        );
        assert_eq!(two.select(&names(&["b"]), "rid").await.unwrap().name(), "b");
        assert!(
            two.set_default("c")
                .unwrap_err()
                .to_string()
                .contains("\"c\"")
        );
        two.set_default("b").unwrap();
        assert_eq!(two.select(&[], "rid").await.unwrap().name(), "b");
        assert!(matches!(
            AgentRegistry::default().select(&[], "rid").await,
            Err(SelectError::None { .. })
        ));
    }

    #[tokio::test]
    async fn default_from_connection_files() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let mut b = config(dir.path(), "b");
        b.default = true;
        let registry =
            AgentRegistry::new(&[config(dir.path(), "a"), b.clone()], metrics.clone()).unwrap();
        assert_eq!(registry.default_name(), Some("b".to_owned()));
        let mut a = config(dir.path(), "a");
        a.default = true;
        let err = AgentRegistry::new(&[a, b], metrics)
            .unwrap_err()
            .to_string();
        assert!(err.contains("several agents are marked default"), "{err}");
    }

    #[tokio::test]
    async fn unreachable_agents_are_remembered_briefly() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let mut dead = config(dir.path(), "dead");
        dead.nfs_server = None;
        let registry = AgentRegistry::new(&[dead], metrics.clone()).unwrap();
        let agent = registry.get("dead").unwrap();
        // Concurrent callers share one request, and the next caller gets the remembered
        // failure without a request of its own.
        let (first, second) = tokio::join!(agent.export("r1"), agent.export("r2"));
        assert!(first.unwrap_err().to_string().contains("agent unreachable"));
        assert!(second.is_err());
        assert!(agent.export("r3").await.is_err());
        let text = metrics.encode().unwrap();
        assert!(
            text.contains(
                "nfsprov_agent_request_errors_total{agent=\"dead\",operation=\"info\",code=\"transport\"} 1"
            ),
            "{text}"
        );
    }
}
