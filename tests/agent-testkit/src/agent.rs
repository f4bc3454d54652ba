//! A real agent for other crates' tests: HTTPS on 127.0.0.1 with freshly generated
//! certificates and token, serving a given export root, stopped when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};
use tokio::sync::oneshot;

use nfsprov_agent::archive::retention::ArchiveSettings;
use nfsprov_agent::config::{
    AgentConfig, AuthConfig, DEFAULT_CREDENTIALS_FILE, LogFormat, TokenSection,
};
use nfsprov_agent::credentials::CredentialsFile;
use nfsprov_agent::exports::ExportSettings;
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_agent::policy::Policy;
use nfsprov_agent::quota::QuotaSettings;

/// A running agent; dropping it shuts it down.
pub struct TestAgent {
    addr: SocketAddr,
    root: PathBuf,
    credentials: tempfile::TempDir,
    stop: Option<oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl TestAgent {
    /// Starts an agent on a free loopback port with mTLS and a token, serving `root`.
    pub async fn start(root: &Path) -> anyhow::Result<TestAgent> {
        Self::start_with_quota(root, QuotaSettings::default()).await
    }

    /// Like [`TestAgent::start`], with a quota backend (probed as at a real start).
    pub async fn start_with_quota(root: &Path, quota: QuotaSettings) -> anyhow::Result<TestAgent> {
        Self::start_with(root, quota, Policy::default()).await
    }

    /// An agent with the given quota settings and create policy.
    pub async fn start_with(
        root: &Path,
        quota: QuotaSettings,
        policy: Policy,
    ) -> anyhow::Result<TestAgent> {
        Self::start_with_archive(root, quota, policy, ArchiveSettings::default()).await
    }

    /// An agent with the given quota settings, create policy and archive retention
    /// (a `Duration`, so a test can have archives expire without waiting for days).
    pub async fn start_with_archive(
        root: &Path,
        quota: QuotaSettings,
        policy: Policy,
        archive: ArchiveSettings,
    ) -> anyhow::Result<TestAgent> {
        Self::start_with_settings(
            root,
            quota,
            policy,
            archive,
            ExportSettings::default(),
            None,
        )
        .await
    }

    /// An agent with the given quota settings whose credentials file holds `credentials`
    /// from its start (beside the whole-root token and certificate of `init`).
    pub async fn start_with_credentials(
        root: &Path,
        quota: QuotaSettings,
        credentials: &CredentialsFile,
    ) -> anyhow::Result<TestAgent> {
        Self::start_with_settings(
            root,
            quota,
            Policy::default(),
            ArchiveSettings::default(),
            ExportSettings::default(),
            Some(credentials),
        )
        .await
    }

    /// An agent whose volumes are exported by the manager `exports` names.
    pub async fn start_with_exports(
        root: &Path,
        exports: ExportSettings,
    ) -> anyhow::Result<TestAgent> {
        let defaults = (QuotaSettings::default(), Policy::default());
        Self::start_with_settings(
            root,
            defaults.0,
            defaults.1,
            ArchiveSettings::default(),
            exports,
            None,
        )
        .await
    }

    /// An agent with the given quota settings whose volumes are exported by the
    /// manager `exports` names.
    pub async fn start_with_quota_and_exports(
        root: &Path,
        quota: QuotaSettings,
        exports: ExportSettings,
    ) -> anyhow::Result<TestAgent> {
        Self::start_with_settings(
            root,
            quota,
            Policy::default(),
            ArchiveSettings::default(),
            exports,
            None,
        )
        .await
    }

    async fn start_with_settings(
        root: &Path,
        quota: QuotaSettings,
        policy: Policy,
        archive: ArchiveSettings,
        exports: ExportSettings,
        scoped: Option<&CredentialsFile>,
    ) -> anyhow::Result<TestAgent> {
        let credentials = tempfile::tempdir()?;
        init::run(&InitArgs {
            dir: credentials.path().to_owned(),
            export_root: root.to_owned(),
            hostnames: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse()?],
            listen: "127.0.0.1:8443".into(),
            name: "test".into(),
            nfs_server: Some("127.0.0.1".into()),
            nfs_path: None,
            namespace: "nfsprov".into(),
            force: false,
            days: 1,
            // Test export roots are directories of a filesystem that holds more.
            shared_filesystem: true,
        })?;
        let dir = credentials.path();
        let credentials_file = dir.join(DEFAULT_CREDENTIALS_FILE);
        if let Some(scoped) = scoped {
            scoped.write(&credentials_file)?;
        }
        let config = AgentConfig {
            listen: "127.0.0.1:0".parse()?,
            export_root: root.to_owned(),
            nfs_server: "127.0.0.1".into(),
            nfs_path: root.display().to_string(),
            log_format: LogFormat::Text,
            cert_file: dir.join(files::SERVER_CERT),
            key_file: dir.join(files::SERVER_KEY),
            auth: AuthConfig {
                client_ca_file: Some(dir.join(files::CA_CERT)),
                allowed_client_names: Vec::new(),
                tokens: vec![TokenSection::whole_root(
                    "controller",
                    dir.join(files::TOKEN),
                )],
                certificate_scopes: Vec::new(),
                credentials_file,
                disabled: false,
            },
            max_body_bytes: 64 * 1024,
            request_timeout: Duration::from_secs(120),
            max_connections: 4096,
            max_tls_handshakes: 256,
            tls_handshake_timeout: Duration::from_secs(5),
            max_unauthenticated_connections: 512,
            max_unauthenticated_per_source: 128,
            unauthenticated_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            body_read_timeout: Duration::from_secs(10),
            max_concurrent_requests: 256,
            max_clone_jobs: 2,
            max_queued_jobs: 64,
            overcommit: Default::default(),
            max_snapshot_bytes_per_namespace: None,
            shutdown_grace: Duration::from_secs(5),
            min_free_bytes: 0,
            min_free_inodes: 0,
            quota,
            policy,
            archive,
            exports,
        };
        let agent = nfsprov_agent::Agent::bind(config)?;
        let addr = agent.local_addr();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.serve(async move {
            let _ = stopped.await;
        }));
        Ok(TestAgent {
            addr,
            root: root.to_owned(),
            credentials,
            stop: Some(stop),
            task: Some(task),
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Directory holding the CA, certificates, keys and token `init` generated.
    pub fn credentials_dir(&self) -> &Path {
        self.credentials.path()
    }

    /// Connection settings with both the client certificate and the token.
    pub fn connection(&self) -> AgentConnectionConfig {
        let dir = self.credentials.path();
        AgentConnectionConfig {
            name: "test".into(),
            url: format!("https://127.0.0.1:{}", self.addr.port()),
            ca_file: dir.join(files::CA_CERT),
            token_file: Some(dir.join(files::TOKEN)),
            client_cert_file: Some(dir.join(files::CONTROLLER_CERT)),
            client_key_file: Some(dir.join(files::CONTROLLER_KEY)),
            timeout_seconds: 30,
            nfs_server: None,
            nfs_path: None,
            default: false,
        }
    }

    /// Connection settings with the token in `token_file` and no client certificate (a
    /// certificate would name the caller before any token is looked at).
    pub fn token_connection(&self, token_file: &Path) -> AgentConnectionConfig {
        AgentConnectionConfig {
            token_file: Some(token_file.to_owned()),
            client_cert_file: None,
            client_key_file: None,
            ..self.connection()
        }
    }

    pub fn client(&self) -> AgentClient {
        AgentClient::new(&self.connection()).expect("test agent settings are valid")
    }

    /// Stops the agent and waits until it has finished serving.
    pub async fn stop(mut self) -> std::io::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => task.await.map_err(std::io::Error::other)?,
            None => Ok(()),
        }
    }
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
