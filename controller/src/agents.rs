//! The agents this controller talks to, by name. Each has its own client and a cached copy
//! of what `/v1/info` says (export, capabilities), so an unreachable agent fails only the
//! classes that use it.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig, ClientError, CreateOutcome};
use nfsprov_api_types::{
    ArchiveResult, Capabilities, CreateVolumeRequest, NfsExport, Volume, VolumePath,
};

use crate::metrics::Metrics;

/// How long what `/v1/info` reported is trusted before asking again.
const INFO_TTL: Duration = Duration::from_secs(300);

/// An id that ties this controller's log lines to the agent's audit log: the object the
/// call is about, then a timestamp so each attempt is told apart.
pub fn request_id(subject: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    format!("{subject}-{nanos:x}")
}

#[derive(Debug, thiserror::Error)]
pub enum SelectError {
    #[error("StorageClass names agent {wanted:?}, which is not configured; known agents: {known}")]
    Unknown { wanted: String, known: String },
    #[error(
        "StorageClass has no \"agent\" parameter and several agents are configured ({known}); name one"
    )]
    Ambiguous { known: String },
    #[error("no agents are configured")]
    None,
}

/// The parts of an agent's `/v1/info` answer the controller acts on.
#[derive(Debug, Clone)]
struct InfoFacts {
    export: NfsExport,
    capabilities: Capabilities,
    fetched: Instant,
}

/// One agent: client, export overrides and the cached `/v1/info` facts.
#[derive(Debug)]
pub struct Agent {
    name: String,
    client: AgentClient,
    nfs_server: Option<String>,
    nfs_path: Option<String>,
    info: tokio::sync::Mutex<Option<InfoFacts>>,
    metrics: Arc<Metrics>,
}

impl Agent {
    pub fn new(config: &AgentConnectionConfig, metrics: Arc<Metrics>) -> Result<Self, ClientError> {
        Ok(Self {
            name: config.name.clone(),
            client: AgentClient::new(config)?,
            nfs_server: config.nfs_server.clone(),
            nfs_path: config.nfs_path.clone(),
            info: tokio::sync::Mutex::new(None),
            metrics,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What PVs mount: the agent's `/v1/info` answer with the configured overrides applied.
    /// With both overrides set the agent is not asked at all.
    pub async fn export(&self, request_id: &str) -> Result<NfsExport, ClientError> {
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
    pub async fn capabilities(&self, request_id: &str) -> Result<Capabilities, ClientError> {
        Ok(self.info(request_id).await?.capabilities)
    }

    async fn info(&self, request_id: &str) -> Result<InfoFacts, ClientError> {
        // Holding the lock across the call makes concurrent claims share one request.
        let mut cached = self.info.lock().await;
        if let Some(facts) = cached.as_ref()
            && facts.fetched.elapsed() < INFO_TTL
        {
            return Ok(facts.clone());
        }
        let info = self
            .timed("info", self.client.info(Some(request_id)))
            .await?;
        let facts = InfoFacts {
            export: info.nfs,
            capabilities: info.capabilities,
            fetched: Instant::now(),
        };
        *cached = Some(facts.clone());
        Ok(facts)
    }

    pub async fn create_volume(
        &self,
        path: &VolumePath,
        request: &CreateVolumeRequest,
        request_id: &str,
    ) -> Result<CreateOutcome, ClientError> {
        self.timed(
            "create",
            self.client.create_volume(path, request, Some(request_id)),
        )
        .await
    }

    /// The volume with its usage, or `None` when the agent has no volume at that path.
    pub async fn get_volume(
        &self,
        path: &VolumePath,
        request_id: &str,
    ) -> Result<Option<Volume>, ClientError> {
        self.timed("get", self.client.get_volume(path, Some(request_id)))
            .await
    }

    /// Raises the volume's recorded capacity (and its quota where one is enforced); the
    /// agent answers the same for a repeat, so a retry after a crash is harmless.
    pub async fn resize_volume(
        &self,
        path: &VolumePath,
        capacity_bytes: u64,
        request_id: &str,
    ) -> Result<Volume, ClientError> {
        self.timed(
            "resize",
            self.client
                .resize_volume(path, capacity_bytes, Some(request_id)),
        )
        .await
    }

    pub async fn delete_volume(
        &self,
        path: &VolumePath,
        request_id: &str,
    ) -> Result<(), ClientError> {
        self.timed("delete", self.client.delete_volume(path, Some(request_id)))
            .await
    }

    pub async fn archive_volume(
        &self,
        path: &VolumePath,
        request_id: &str,
    ) -> Result<ArchiveResult, ClientError> {
        self.timed(
            "archive",
            self.client.archive_volume(path, Some(request_id)),
        )
        .await
    }

    async fn timed<T>(
        &self,
        operation: &str,
        call: impl Future<Output = Result<T, ClientError>>,
    ) -> Result<T, ClientError> {
        let started = Instant::now();
        let result = call.await;
        let code = result.as_ref().err().map(error_label);
        self.metrics
            .agent_request(&self.name, operation, started.elapsed(), code.as_deref());
        result
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

/// All configured agents by name.
#[derive(Debug, Clone, Default)]
pub struct AgentRegistry {
    agents: BTreeMap<String, Arc<Agent>>,
}

impl AgentRegistry {
    pub fn new(
        configs: &[AgentConnectionConfig],
        metrics: Arc<Metrics>,
    ) -> Result<Self, ClientError> {
        let mut agents = BTreeMap::new();
        for config in configs {
            agents.insert(
                config.name.clone(),
                Arc::new(Agent::new(config, metrics.clone())?),
            );
        }
        Ok(Self { agents })
    }

    pub fn get(&self, name: &str) -> Option<Arc<Agent>> {
        self.agents.get(name).cloned()
    }

    pub fn names(&self) -> Vec<&str> {
        self.agents.keys().map(String::as_str).collect()
    }

    /// The agent a class names, or the only agent when it names none.
    pub fn select(&self, wanted: Option<&str>) -> Result<Arc<Agent>, SelectError> {
        let known = || self.names().join(", ");
        match wanted {
            Some(name) => self.get(name).ok_or_else(|| SelectError::Unknown {
                wanted: name.to_owned(),
                known: known(),
            }),
            None => {
                let mut all = self.agents.values();
                match (all.next(), all.next()) {
                    (Some(only), None) => Ok(only.clone()),
                    (None, _) => Err(SelectError::None),
                    (Some(_), Some(_)) => Err(SelectError::Ambiguous { known: known() }),
                }
            }
        }
    }
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
        }
    }

    #[tokio::test]
    async fn selection_and_overrides() {
        let dir = tempfile::tempdir().unwrap();
        let metrics = Arc::new(Metrics::new());
        let one = AgentRegistry::new(&[config(dir.path(), "a")], metrics.clone()).unwrap();
        assert_eq!(one.select(None).unwrap().name(), "a");
        assert!(matches!(
            one.select(Some("b")),
            Err(SelectError::Unknown { .. })
        ));
        // Both overrides set: the export is known without contacting the (unreachable) agent.
        let export = one.select(None).unwrap().export("rid").await.unwrap();
        assert_eq!(export.server, "nfs.example");
        assert_eq!(export.path, "/export");

        let two = AgentRegistry::new(
            &[config(dir.path(), "a"), config(dir.path(), "b")],
            metrics.clone(),
        )
        .unwrap();
        let err = two.select(None).unwrap_err().to_string();
        assert!(err.contains("a, b"), "{err}");
        assert_eq!(two.select(Some("b")).unwrap().name(), "b");
        assert!(matches!(
            AgentRegistry::default().select(None),
            Err(SelectError::None)
        ));
    }
}
