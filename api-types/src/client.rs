//! A typed client for the agent API over HTTPS (rustls with ring), with the connection
//! settings the controller reads from its agents directory or from the agents' Secrets.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::Deserialize;

use crate::endpoints::{self, ApiEndpoint, NoBody, PathArg};
use crate::logsafe::Clean;
use crate::{
    AdoptVolumeRequest, AgentInfo, ApiError, Archive, ArchiveList, ArchivePath, ArchiveRequest,
    ArchiveResult, CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, Endpoint,
    ErrorCode, ExportRequest, Health, ListQuery, MAX_PEM_BYTES, MAX_TOKEN_BYTES, REQUEST_ID_HEADER,
    ReadAnswer, ReloadingFile, ResizeVolumeRequest, RestoreVolumeRequest, Snapshot, SnapshotList,
    SnapshotName, Volume, VolumeList, VolumePath, read_bounded,
};
use crate::{CreateTransferRequest, ReceiveReplicaRequest, ReplicaOutcome, TransferGrant};

/// How to reach one agent. Relative file names are resolved against the directory of the
/// file the settings were read from, so a mounted Secret can hold the settings and the
/// files side by side.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConnectionConfig {
    /// Name StorageClasses use in their `agent` parameter.
    pub name: String,
    /// Base URL, `https://host:port`.
    pub url: String,
    /// CA certificate(s) that signed the agent's server certificate.
    pub ca_file: PathBuf,
    /// Bearer token file, re-read when it changes.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// Client certificate chain for mTLS.
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// Key of the client certificate.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// Per-request timeout.
    #[serde(default = "default_timeout_seconds")]
    pub timeout_seconds: u64,
    /// NFS server name for PVs, overriding what the agent reports (multi-homed servers).
    #[serde(default)]
    pub nfs_server: Option<String>,
    /// NFS export path for PVs, overriding what the agent reports.
    #[serde(default)]
    pub nfs_path: Option<String>,
    /// The agent for StorageClasses that name none, once several agents are configured;
    /// at most one agent may say so.
    #[serde(default)]
    pub default: bool,
}

fn default_timeout_seconds() -> u64 {
    30
}

/// Two defaults would make a class without an `agent` parameter depend on file order.
fn check_single_default(agents: &[AgentConnectionConfig]) -> Result<(), ClientError> {
    let defaults: Vec<&str> = agents
        .iter()
        .filter(|a| a.default)
        .map(|a| a.name.as_str())
        .collect();
    if defaults.len() > 1 {
        return Err(ClientError::Config(format!(
            "several agents are marked default = true ({}); mark at most one",
            defaults.join(", ")
        )));
    }
    Ok(())
}

impl AgentConnectionConfig {
    /// Reads one agent's settings from a TOML file (a regular file of bounded size: it
    /// comes from the same Secret as the credentials).
    pub fn from_file(path: &Path) -> Result<Self, ClientError> {
        let io_error = |source| ClientError::Io {
            path: path.to_owned(),
            source,
        };
        let bytes = read_bounded(path, MAX_PEM_BYTES).map_err(io_error)?;
        let text = String::from_utf8(bytes).map_err(|_| {
            io_error(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                "not UTF-8",
            ))
        })?;
        let mut config = Self::parse(&text)
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let resolve = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        resolve(&mut config.ca_file);
        config.token_file.as_mut().map(resolve);
        config.client_cert_file.as_mut().map(resolve);
        config.client_key_file.as_mut().map(resolve);
        config
            .validate()
            .map_err(|e| ClientError::Config(format!("{}: {e}", path.display())))?;
        Ok(config)
    }

    /// Parses one agent's settings, file names left as written.
    fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|e| e.message().to_owned())
    }

    /// Reads every `*.toml` file of a directory (one agent each), sorted by file name.
    pub fn from_dir(dir: &Path) -> Result<Vec<Self>, ClientError> {
        let entries = std::fs::read_dir(dir).map_err(|source| ClientError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut files = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|source| ClientError::Io {
                path: dir.to_owned(),
                source,
            })?;
            let path = entry.path();
            // Kubernetes projects Secrets through hidden `..data` links; skip those names.
            let hidden = entry.file_name().to_string_lossy().starts_with('.');
            if !hidden && path.extension().is_some_and(|ext| ext == "toml") {
                files.push(path);
            }
        }
        files.sort();
        let mut agents: Vec<Self> = Vec::with_capacity(files.len());
        for file in files {
            let agent = Self::from_file(&file)?;
            if agents.iter().any(|a| a.name == agent.name) {
                return Err(ClientError::Config(format!(
                    "{}: agent name {:?} is used twice",
                    file.display(),
                    agent.name
                )));
            }
            agents.push(agent);
        }
        if agents.is_empty() {
            return Err(ClientError::Config(format!(
                "{}: no agent settings (*.toml) found",
                dir.display()
            )));
        }
        check_single_default(&agents)?;
        Ok(agents)
    }

    /// The name of the agent marked `default = true`, if any.
    pub fn default_name(agents: &[Self]) -> Result<Option<&str>, ClientError> {
        check_single_default(agents)?;
        Ok(agents.iter().find(|a| a.default).map(|a| a.name.as_str()))
    }

    fn validate(&self) -> Result<(), String> {
        crate::validate_component(&self.name).map_err(|e| format!("invalid agent name: {e}"))?;
        if !self.url.starts_with("https://") {
            return Err(format!("url {:?} must start with https://", self.url));
        }
        if self.client_cert_file.is_some() != self.client_key_file.is_some() {
            return Err("client_cert_file and client_key_file must be given together".into());
        }
        if self.token_file.is_none() && self.client_cert_file.is_none() {
            return Err("no credentials: set token_file and/or client_cert_file".into());
        }
        if self.timeout_seconds == 0 {
            return Err("timeout_seconds must be positive".into());
        }
        Ok(())
    }
}

/// Everything that can go wrong talking to an agent.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("invalid agent settings: {0}")]
    Config(String),
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS setup failed: {0}")]
    Tls(String),
    /// No answer: the connection, TLS handshake or exchange failed, or timed out. Not a
    /// `source`: the message already carries the cause that matters.
    #[error("agent unreachable: {}", transport_reason(.0))]
    Transport(reqwest::Error),
    /// Shown escaped and bounded: the message may name files a tenant chose, and it goes
    /// into the controller's log and the claim's events.
    #[error("agent answered {status}: {}: {}", .error.code, Clean(&.error.message))]
    Api {
        status: u16,
        error: ApiError,
        /// The answer's `Retry-After`, in seconds, when it had one.
        retry_after: Option<Duration>,
    },
    #[error("agent answered {status} with an unexpected body: {}", Clean(.body))]
    UnexpectedResponse { status: u16, body: String },
}

impl From<reqwest::Error> for ClientError {
    fn from(error: reqwest::Error) -> Self {
        ClientError::Transport(error)
    }
}

/// What went wrong on the way to the agent, in words an operator can act on. reqwest's own
/// message names only the URL ("error sending request for url (…)"); the cause that tells
/// a stopped agent from a wrong CA or a firewall sits at the bottom of its source chain.
fn transport_reason(error: &reqwest::Error) -> String {
    let url = error.url().map_or("the agent", |url| url.as_str());
    let root = std::iter::successors(std::error::Error::source(error), |cause| cause.source())
        .last()
        .map(ToString::to_string);
    if error.is_timeout() {
        format!("{url} did not answer within the time limit (the agent's timeout_seconds)")
    } else if error.is_connect() {
        match root {
            Some(root) => format!("cannot connect to {url}: {root}"),
            None => format!("cannot connect to {url}"),
        }
    } else {
        match root {
            Some(root) => format!("{error}: {root}"),
            None => error.to_string(),
        }
    }
}

impl ClientError {
    /// The agent's error code, when it answered with one.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Api { error, .. } => Some(error.code),
            _ => None,
        }
    }

    /// How long the agent asked to wait before the same request (its `Retry-After`), when
    /// it refused it for now: a full job queue says so.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            ClientError::Api { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    /// Whether the same request may succeed later without anyone changing it.
    pub fn is_transient(&self) -> bool {
        match self {
            ClientError::Transport(_) | ClientError::UnexpectedResponse { .. } => true,
            // A code newer than this side: the status tells a passing condition (a
            // server error, a timeout, too many requests) from a refusal.
            ClientError::Api {
                status,
                error:
                    ApiError {
                        code: ErrorCode::Unknown,
                        ..
                    },
                ..
            } => *status >= 500 || matches!(status, 408 | 429),
            ClientError::Api { error, .. } => error.code.is_transient(),
            ClientError::Config(_) | ClientError::Io { .. } | ClientError::Tls(_) => false,
        }
    }
}

pub use crate::answer::{CloneOutcome, CreateOutcome, RestoreOutcome};

/// One call a client made, once its outcome is known.
#[derive(Debug)]
pub struct Call<'a> {
    /// The agent's name from its settings.
    pub agent: &'a str,
    pub endpoint: Endpoint,
    pub request_id: Option<&'a str>,
    /// From sending the request to having the answer read and decoded.
    pub elapsed: Duration,
    /// What the caller got as an error; `None` for a success (a volume that
    /// `get_volume` finds missing is one).
    pub error: Option<&'a ClientError>,
}

/// Told of every call of the client it observes, after the call: the one place where a
/// caller hooks timing, metrics and logging in, whatever the endpoint.
pub trait Observer: Send + Sync + std::fmt::Debug {
    fn finished(&self, call: &Call<'_>);
}

/// A client for one agent. Cheap to clone; connections are pooled and kept alive.
#[derive(Debug, Clone)]
pub struct AgentClient {
    name: String,
    base_url: String,
    http: reqwest::Client,
    token: Option<Token>,
    observer: Option<Arc<dyn Observer>>,
}

/// A 2xx answer whose body is read as it arrives, a chunk at a time.
#[derive(Debug)]
pub struct StreamedAnswer(reqwest::Response);

impl StreamedAnswer {
    /// The next chunk of the body; `None` at its end. A body cut short is an error.
    pub async fn chunk(&mut self) -> Result<Option<Vec<u8>>, ClientError> {
        Ok(self.0.chunk().await?.map(Vec::from))
    }
}

/// A 2xx answer, read whole.
struct Answer {
    status: StatusCode,
    body: Vec<u8>,
}

/// A list endpoint's answer: one page of entries and the cursor of the next.
trait Page {
    type Entry;
    fn split(self) -> (Vec<Self::Entry>, Option<String>);
}

macro_rules! list_pages {
    ($($list:ty => $entries:ident: $entry:ty),*) => {$(
        impl Page for $list {
            type Entry = $entry;
            fn split(self) -> (Vec<$entry>, Option<String>) {
                (self.$entries, self.next)
            }
        }
    )*};
}

list_pages!(
    VolumeList => volumes: Volume,
    ArchiveList => archives: Archive,
    SnapshotList => snapshots: Snapshot
);

/// A non-2xx answer: the agent's error body, or the answer as it came when it is none.
fn refusal(status: StatusCode, retry_after: Option<Duration>, body: &[u8]) -> ClientError {
    match serde_json::from_slice::<ApiError>(body) {
        Ok(error) => ClientError::Api {
            status: status.as_u16(),
            error,
            retry_after,
        },
        Err(_) => unexpected(status, body),
    }
}

fn unexpected(status: StatusCode, body: &[u8]) -> ClientError {
    ClientError::UnexpectedResponse {
        status: status.as_u16(),
        body: String::from_utf8_lossy(body).chars().take(512).collect(),
    }
}

/// Where the bearer token comes from: a file re-read when it changes (a mounted Secret
/// rotates under it), or a value held in memory (read through the API, replaced by
/// making a new client).
#[derive(Clone)]
enum Token {
    File(Arc<ReloadingFile>),
    Inline(Arc<str>),
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Token::File(file) => write!(f, "Token::File({})", file.path().display()),
            Token::Inline(_) => f.write_str("Token::Inline(<redacted>)"),
        }
    }
}

impl Token {
    fn value(&self) -> Result<String, ClientError> {
        match self {
            Token::File(file) => file.trimmed().map_err(|source| ClientError::Io {
                path: file.path().to_owned(),
                source,
            }),
            Token::Inline(value) => Ok(value.to_string()),
        }
    }
}

/// One PEM part and where it came from, for error messages.
type Pem<'a> = (&'a [u8], String);

/// The PEM material a client is made of, whatever it was read from: the CA, and the
/// client certificate chain with its key.
struct Material<'a> {
    ca: Pem<'a>,
    client: Option<(Pem<'a>, Pem<'a>)>,
}

impl AgentClient {
    pub fn new(config: &AgentConnectionConfig) -> Result<Self, ClientError> {
        config.validate().map_err(ClientError::Config)?;
        let ca = read_file(&config.ca_file)?;
        let pair = match (&config.client_cert_file, &config.client_key_file) {
            (Some(cert), Some(key)) => Some(((read_file(cert)?, cert), (read_file(key)?, key))),
            _ => None,
        };
        let material = Material {
            ca: (&ca, config.ca_file.display().to_string()),
            client: pair.as_ref().map(|((cert, cert_path), (key, key_path))| {
                (
                    (cert.as_slice(), cert_path.display().to_string()),
                    (key.as_slice(), key_path.display().to_string()),
                )
            }),
        };
        let token = match &config.token_file {
            Some(path) => Some(Token::File(Arc::new(
                ReloadingFile::open(path, MAX_TOKEN_BYTES).map_err(|source| ClientError::Io {
                    path: path.clone(),
                    source,
                })?,
            ))),
            None => None,
        };
        Self::build(config, &material, token)
    }

    /// A client for an agent whose settings and files were read from a Kubernetes
    /// Secret; nothing is read from disk, now or later.
    pub fn from_secret(agent: &SecretAgent) -> Result<Self, ClientError> {
        let config = &agent.config;
        config.validate().map_err(ClientError::Config)?;
        let material = agent.material();
        let token = agent.token().map(|t| Token::Inline(Arc::from(t)));
        Self::build(config, &material, token)
    }

    fn build(
        config: &AgentConnectionConfig,
        material: &Material<'_>,
        token: Option<Token>,
    ) -> Result<Self, ClientError> {
        let tls = client_tls_config(material)?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .https_only(true)
            .timeout(Duration::from_secs(config.timeout_seconds))
            .connect_timeout(Duration::from_secs(config.timeout_seconds.min(10)))
            .pool_idle_timeout(Duration::from_secs(60))
            .retry(stale_connection_retry(&config.url))
            .build()
            .map_err(|e| ClientError::Tls(format!("cannot build the HTTPS client: {e}")))?;
        Ok(Self {
            name: config.name.clone(),
            base_url: config.url.trim_end_matches('/').to_owned(),
            http,
            token,
            observer: None,
        })
    }

    /// The same client, with `observer` told of each of its calls.
    #[must_use]
    pub fn observed_by(mut self, observer: Arc<dyn Observer>) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The agent's name from its settings.
    pub fn name(&self) -> &str {
        &self.name
    }

    pub async fn healthz(&self) -> Result<Health, ClientError> {
        self.call::<endpoints::Healthz>(&(), None, None).await
    }

    pub async fn readyz(&self) -> Result<Health, ClientError> {
        self.call::<endpoints::Readyz>(&(), None, None).await
    }

    pub async fn info(&self, request_id: Option<&str>) -> Result<AgentInfo, ClientError> {
        self.call::<endpoints::Info>(&(), None, request_id).await
    }

    pub async fn list_volumes(&self, request_id: Option<&str>) -> Result<Vec<Volume>, ClientError> {
        let list = self.call::<endpoints::ListVolumes>(&(), None, request_id);
        Ok(list.await?.volumes)
    }

    /// Raises the volume's capacity (and its quota, where the agent enforces one).
    pub async fn resize_volume(
        &self,
        path: &VolumePath,
        capacity_bytes: u64,
        request_id: Option<&str>,
    ) -> Result<Volume, ClientError> {
        let request = ResizeVolumeRequest { capacity_bytes };
        self.call::<endpoints::ResizeVolume>(path, Some(&request), request_id)
            .await
    }

    /// Moves the volume into the archive area; a retry after success returns the same
    /// result. `retention_days` is how long the agent keeps the archive; `None` leaves it
    /// to the agent's default (and sends no body, as before retention existed).
    pub async fn archive_volume(
        &self,
        path: &VolumePath,
        retention_days: Option<u32>,
        request_id: Option<&str>,
    ) -> Result<ArchiveResult, ClientError> {
        let request = retention_days.map(|days| ArchiveRequest {
            retention_days: Some(days),
        });
        self.call::<endpoints::ArchiveVolume>(path, request.as_ref(), request_id)
            .await
    }

    /// Every archive the agent holds, sorted by id.
    pub async fn list_archives(
        &self,
        request_id: Option<&str>,
    ) -> Result<Vec<Archive>, ClientError> {
        let list = self.call::<endpoints::ListArchives>(&(), None, request_id);
        Ok(list.await?.archives)
    }

    /// A client that reads one snapshot of the agent at `url` with `grant`, as another
    /// agent does to receive a replica; `ca_pem` signed that agent's server certificate.
    pub fn for_transfer(
        url: &str,
        ca_pem: &str,
        grant: &TransferGrant,
        timeout: Duration,
    ) -> Result<Self, ClientError> {
        let config = AgentConnectionConfig {
            name: "transfer-source".to_owned(),
            url: url.to_owned(),
            ca_file: PathBuf::new(),
            token_file: None,
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: timeout.as_secs().max(1),
            nfs_server: None,
            nfs_path: None,
            default: false,
        };
        if !url.starts_with("https://") {
            return Err(ClientError::Config(format!(
                "url {url:?} must start with https://"
            )));
        }
        let material = Material {
            ca: (ca_pem.as_bytes(), "the source agent's CA".to_owned()),
            client: None,
        };
        let token = Token::Inline(Arc::from(grant.token.as_str()));
        Self::build(&config, &material, Some(token))
    }

    /// The granted snapshot's manifest as it arrives: a
    /// [`TransferManifestLine`](crate::TransferManifestLine) a line.
    pub async fn transfer_manifest(
        &self,
        request_id: Option<&str>,
    ) -> Result<StreamedAnswer, ClientError> {
        self.stream(Endpoint::TransferManifest, "", request_id)
            .await
    }

    /// The framed content of the granted snapshot's file at `path_hex` (its manifest
    /// path, hex-encoded), as it arrives.
    pub async fn transfer_content(
        &self,
        path_hex: &str,
        request_id: Option<&str>,
    ) -> Result<StreamedAnswer, ClientError> {
        let query = serde_urlencoded::to_string(crate::TransferContentQuery {
            path: path_hex.to_owned(),
        })
        .map_err(|e| ClientError::Config(e.to_string()))?;
        self.stream(Endpoint::TransferContent, &format!("?{query}"), request_id)
            .await
    }

    /// A request of `endpoint` at `path` with the request id and the token.
    fn request(
        &self,
        endpoint: Endpoint,
        path: &str,
        request_id: Option<&str>,
    ) -> Result<reqwest::RequestBuilder, ClientError> {
        let mut request = self
            .http
            .request(endpoint.method(), format!("{}{path}", self.base_url));
        if let Some(id) = request_id {
            request = request.header(REQUEST_ID_HEADER, id);
        }
        if let Some(token) = &self.token {
            request = request.bearer_auth(token.value()?);
        }
        Ok(request)
    }

    /// Sends a `GET` of `endpoint` (with `query`) and answers its body as a stream once
    /// the status says it succeeded.
    async fn stream(
        &self,
        endpoint: Endpoint,
        query: &str,
        request_id: Option<&str>,
    ) -> Result<StreamedAnswer, ClientError> {
        let path = format!("{}{query}", endpoint.path());
        let response = self.request(endpoint, &path, request_id)?.send().await?;
        let status = response.status();
        if status.is_success() {
            return Ok(StreamedAnswer(response));
        }
        let retry_after = retry_after(response.headers());
        let body = Vec::from(response.bytes().await?);
        Err(refusal(status, retry_after, &body))
    }

    /// Asks the list endpoint `E` for its list `limit` entries at a time, handing each
    /// page to `each` before asking for the next.
    async fn for_each_page<E>(
        &self,
        limit: u32,
        request_id: Option<&str>,
        mut each: impl FnMut(Vec<<E::Answer as Page>::Entry>),
    ) -> Result<(), ClientError>
    where
        E: ApiEndpoint<Param = (), Request = NoBody>,
        E::Answer: Page,
    {
        let mut query = ListQuery::first(limit);
        loop {
            let path = format!("{}?{}", E::ENDPOINT.path(), query.to_query_string());
            let page: E::Answer = self
                .exchange(E::ENDPOINT, &path, None::<&NoBody>, request_id)
                .await?;
            let (entries, next) = page.split();
            each(entries);
            match next_page(&query, next)? {
                Some(next) => query.after = Some(next),
                None => return Ok(()),
            }
        }
    }

    /// The one call every typed method makes: `E`'s method and path (its template filled
    /// with `param`), `body` as JSON, and the answer read as `E` answers.
    async fn call<E: ApiEndpoint>(
        &self,
        param: &E::Param,
        body: Option<&E::Request>,
        request_id: Option<&str>,
    ) -> Result<E::Answer, ClientError> {
        let path = param.path_of(E::ENDPOINT);
        self.exchange(E::ENDPOINT, &path, body, request_id).await
    }

    /// The one path every call takes: sends the request, reads the answer as `A`, and
    /// tells the observer how it ended.
    async fn exchange<A: ReadAnswer>(
        &self,
        endpoint: Endpoint,
        path: &str,
        body: Option<&impl serde::Serialize>,
        request_id: Option<&str>,
    ) -> Result<A, ClientError> {
        let started = Instant::now();
        let outcome = match self.send(endpoint, path, body, request_id).await {
            Ok(answer) => A::read(answer.status, &answer.body)
                .map_err(|_| unexpected(answer.status, &answer.body)),
            Err(error) if error.code() == Some(ErrorCode::NotFound) => {
                A::when_not_found().ok_or(error)
            }
            Err(error) => Err(error),
        };
        if let Some(observer) = &self.observer {
            observer.finished(&Call {
                agent: &self.name,
                endpoint,
                request_id,
                elapsed: started.elapsed(),
                error: outcome.as_ref().err(),
            });
        }
        outcome
    }

    /// Sends a request and reads the answer; any non-2xx answer becomes
    /// [`ClientError::Api`].
    async fn send<B: serde::Serialize>(
        &self,
        endpoint: Endpoint,
        path: &str,
        body: Option<&B>,
        request_id: Option<&str>,
    ) -> Result<Answer, ClientError> {
        let mut request = self.request(endpoint, path, request_id)?;
        if let Some(body) = body {
            request = request.json(body);
        }
        let response = request.send().await?;
        let status = response.status();
        let retry_after = retry_after(response.headers());
        let body = Vec::from(response.bytes().await?);
        if status.is_success() {
            return Ok(Answer { status, body });
        }
        Err(refusal(status, retry_after, &body))
    }
}

/// The typed methods that are their endpoint's call as it is: a path parameter, the
/// request body when the endpoint takes one, the request id; and the answer as the
/// endpoint table reads it. The types are written out for the reader; the compiler checks
/// them against the table.
macro_rules! calls {
    ($(
        $(#[$doc:meta])*
        $method:ident($param:ident: $param_ty:ty $(, $body:ident: $body_ty:ty)?)
            -> $answer:ty = $endpoint:ident;
    )*) => {
        impl AgentClient {$(
            $(#[$doc])*
            pub async fn $method(
                &self,
                $param: &$param_ty,
                $($body: &$body_ty,)?
                request_id: Option<&str>,
            ) -> Result<$answer, ClientError> {
                let body = calls!(@body $($body)?);
                self.call::<endpoints::$endpoint>($param, body, request_id).await
            }
        )*}
    };
    (@body) => { None };
    (@body $body:ident) => { Some($body) };
}

calls! {
    /// Creates the volume or confirms it exists with the same settings.
    create_volume(path: VolumePath, request: CreateVolumeRequest)
        -> CreateOutcome = CreateVolume;

    /// Makes the directory already at `path` a volume as it is (nothing on disk changes;
    /// no quota enforces it), or confirms it already is one with the same owner and
    /// capacity.
    adopt_volume(path: VolumePath, request: AdoptVolumeRequest)
        -> CreateOutcome = AdoptVolume;

    /// Makes `path` a clone of `request.source`, or learns how far the agent is with it,
    /// or confirms the clone is there.
    clone_volume(path: VolumePath, request: CloneVolumeRequest)
        -> CloneOutcome = CloneVolume;

    /// Replaces the volume's export with `request` (who may mount it, and how); answers
    /// the volume with the export the NFS server now serves.
    set_volume_export(path: VolumePath, request: ExportRequest) -> Volume = SetVolumeExport;

    /// The volume, or `None` when the agent has no volume at that path.
    get_volume(path: VolumePath) -> Option<Volume> = GetVolume;

    /// Removes the volume's tree; succeeds also when it is already gone.
    delete_volume(path: VolumePath) -> () = DeleteVolume;

    /// The archive `id`, with the capacity its volume had (`not_found` when there is
    /// none).
    get_archive(id: ArchivePath) -> Archive = GetArchive;

    /// Removes one archive with its quota; succeeds also when it is already gone.
    delete_archive(id: ArchivePath) -> () = DeleteArchive;

    /// Takes a snapshot of `request.source` named `name`, or learns how far the agent is
    /// with it (`ready` is `false` while a reflink or copy runs: repeat the same call), or
    /// finds it again.
    create_snapshot(name: SnapshotName, request: CreateSnapshotRequest)
        -> Snapshot = CreateSnapshot;

    /// One snapshot; a [`ErrorCode::NotFound`] error when the agent has none by that name.
    get_snapshot(name: SnapshotName) -> Snapshot = GetSnapshot;

    /// Deletes a snapshot, freeing what only it holds; succeeds also when it is already
    /// gone. A snapshot still being made is stopped and removed.
    delete_snapshot(name: SnapshotName) -> () = DeleteSnapshot;

    /// Makes the volume at `path` from `request.snapshot`, or learns how far the agent is
    /// with it, or confirms it is there.
    restore_volume(path: VolumePath, request: RestoreVolumeRequest)
        -> RestoreOutcome = RestoreVolume;

    /// A grant for another agent to read the snapshot `name` (see
    /// [`for_transfer`](Self::for_transfer)).
    create_transfer(name: SnapshotName, request: CreateTransferRequest)
        -> TransferGrant = CreateTransfer;

    /// Receives the snapshot `request.grant` names from its agent as this agent's
    /// snapshot `name`, or finds it received already.
    receive_replica(name: SnapshotName, request: ReceiveReplicaRequest)
        -> ReplicaOutcome = ReceiveReplica;
}

/// The methods that walk a list endpoint page by page.
macro_rules! pages {
    ($(
        $(#[$doc:meta])*
        $method:ident($entry:ty) = $endpoint:ident;
    )*) => {
        impl AgentClient {$(
            $(#[$doc])*
            pub async fn $method(
                &self,
                limit: u32,
                request_id: Option<&str>,
                each: impl FnMut(Vec<$entry>),
            ) -> Result<(), ClientError> {
                self.for_each_page::<endpoints::$endpoint>(limit, request_id, each).await
            }
        )*}
    };
}

pages! {
    /// Every volume, `limit` at a time in path order: `each` gets one page and returns
    /// before the next is asked for, so no more than a page is ever held here. An agent
    /// that predates paging answers everything as one page.
    for_each_volume_page(Volume) = ListVolumes;

    /// Every archive, `limit` at a time in id order, as
    /// [`for_each_volume_page`](Self::for_each_volume_page) pages volumes.
    for_each_archive_page(Archive) = ListArchives;

    /// Every snapshot, `limit` at a time in name order, as
    /// [`for_each_volume_page`](Self::for_each_volume_page) pages volumes.
    for_each_snapshot_page(Snapshot) = ListSnapshots;
}

/// A `Retry-After` of whole seconds, as the agent sends it; an HTTP date (which the agent
/// never sends) or anything else reads as none. Capped at an hour, so a wrong value
/// cannot park a request for good.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let seconds: u64 = headers
        .get(reqwest::header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse()
        .ok()?;
    Some(Duration::from_secs(seconds.min(3600)))
}

/// Sends a request once more when the kept-alive connection it went out on turns out to
/// have been closed by the agent, which closes a connection left idle past its
/// header-read timeout (10 s by default), while the pool keeps it for longer. A client
/// whose runtime was busy when the close came cannot have noticed it, and its next
/// request then meets a closed connection before any answer. Every agent request may be
/// repeated (a repeat finds what the first made), and no other failure is repeated here:
/// time-outs and answers reach the caller as they are.
fn stale_connection_retry(url: &str) -> reqwest::retry::Builder {
    let host = reqwest::Url::parse(url)
        .ok()
        .and_then(|url| url.host_str().map(str::to_owned))
        .unwrap_or_default();
    reqwest::retry::for_host(host)
        .max_retries_per_request(1)
        .classify_fn(|attempt| {
            if attempt.error().is_some_and(closed_before_any_answer) {
                attempt.retryable()
            } else {
                attempt.success()
            }
        })
}

/// Whether `error` says the connection ended before an answer began: the agent closed it
/// (with or without a TLS close_notify) or reset it.
fn closed_before_any_answer(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(|e| e.is_incomplete_message())
        {
            return true;
        }
        if let Some(io) = error.downcast_ref::<std::io::Error>()
            && matches!(
                io.kind(),
                std::io::ErrorKind::UnexpectedEof
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
                    | std::io::ErrorKind::BrokenPipe
            )
        {
            return true;
        }
        cause = error.source();
    }
    false
}

/// The cursor of the page after the one `query` asked for. A cursor that does not move
/// on would page for ever: it is an error, not a loop.
fn next_page(query: &ListQuery, next: Option<String>) -> Result<Option<String>, ClientError> {
    match next {
        Some(next) if query.after.as_ref() == Some(&next) => Err(ClientError::UnexpectedResponse {
            status: 200,
            body: format!("the same next page again ({next:?})"),
        }),
        next => Ok(next),
    }
}

/// A certificate or key: a regular file of bounded size only.
fn read_file(path: &Path) -> Result<Vec<u8>, ClientError> {
    read_bounded(path, MAX_PEM_BYTES).map_err(|source| ClientError::Io {
        path: path.to_owned(),
        source,
    })
}

/// rustls settings trusting only the agent's CA, with the client certificate when given.
/// Uses ring explicitly so the client works whether or not a process default is installed.
fn client_tls_config(material: &Material<'_>) -> Result<rustls::ClientConfig, ClientError> {
    let mut roots = rustls::RootCertStore::empty();
    let (ca_pem, ca_label) = &material.ca;
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| ClientError::Tls(format!("{ca_label}: {e}")))?;
        roots
            .add(cert)
            .map_err(|e| ClientError::Tls(format!("{ca_label}: {e}")))?;
        found += 1;
    }
    if found == 0 {
        return Err(ClientError::Tls(format!(
            "{ca_label}: no PEM certificate found"
        )));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| ClientError::Tls(e.to_string()))?
    .with_root_certificates(roots);
    match &material.client {
        Some(((cert_pem, cert_label), (key_pem, key_label))) => {
            let chain = CertificateDer::pem_slice_iter(cert_pem)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ClientError::Tls(format!("{cert_label}: {e}")))?;
            if chain.is_empty() {
                return Err(ClientError::Tls(format!(
                    "{cert_label}: no PEM certificate found"
                )));
            }
            let key = PrivateKeyDer::from_pem_slice(key_pem)
                .map_err(|e| ClientError::Tls(format!("{key_label}: {e}")))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| ClientError::Tls(e.to_string()))
        }
        None => Ok(builder.with_no_client_auth()),
    }
}

// ---------------------------------------------------------------- from a Secret
//
// An agent's connection as a Kubernetes Secret holds it (the Secret `nfsprov-agent init`
// prints): the settings under a `*.toml` key, and the files they name as other keys of
// the same Secret. Read through the API, so nothing is written to disk.

/// The label selector of the Secrets that hold agents' connections: the label
/// `nfsprov-agent init` puts on the Secret it prints.
pub const AGENT_SECRET_SELECTOR: &str = "app.kubernetes.io/component=agent-credentials";

/// One agent read from a Secret: its settings and the material they name.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretAgent {
    /// The key the settings were read from.
    pub key: String,
    /// The settings; their file names are the keys the files were read from.
    pub config: AgentConnectionConfig,
    ca: Vec<u8>,
    client_pair: Option<(Vec<u8>, Vec<u8>)>,
    token: Option<String>,
}

impl std::fmt::Debug for SecretAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretAgent")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SecretAgent {
    fn material(&self) -> Material<'_> {
        let label = |path: &Option<std::path::PathBuf>| {
            path.as_ref()
                .map(|p| format!("key {}", p.display()))
                .unwrap_or_default()
        };
        Material {
            ca: (&self.ca, format!("key {}", self.config.ca_file.display())),
            client: self.client_pair.as_ref().map(|(cert, key)| {
                (
                    (cert.as_slice(), label(&self.config.client_cert_file)),
                    (key.as_slice(), label(&self.config.client_key_file)),
                )
            }),
        }
    }

    fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

/// Why one `*.toml` key of a Secret does not make an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key}: {message}")]
pub struct AgentSecretError {
    pub key: String,
    pub message: String,
}

/// Every agent of a Secret's data, one per `*.toml` key in key order, each read or the
/// reason it cannot be. No `*.toml` key gives an empty list.
pub fn agents_in_secret(
    data: &BTreeMap<String, Vec<u8>>,
) -> Vec<Result<SecretAgent, AgentSecretError>> {
    data.iter()
        .filter(|(key, _)| key.ends_with(".toml") && !key.starts_with('.'))
        .map(|(key, settings)| {
            read_agent(data, settings)
                .map_err(|message| AgentSecretError {
                    key: key.clone(),
                    message,
                })
                .map(|(config, ca, client_pair, token)| SecretAgent {
                    key: key.clone(),
                    config,
                    ca,
                    client_pair,
                    token,
                })
        })
        .collect()
}

type Read = (
    AgentConnectionConfig,
    Vec<u8>,
    Option<(Vec<u8>, Vec<u8>)>,
    Option<String>,
);

fn read_agent(data: &BTreeMap<String, Vec<u8>>, settings: &[u8]) -> Result<Read, String> {
    let text = std::str::from_utf8(settings).map_err(|_| "settings are not UTF-8".to_owned())?;
    let config = AgentConnectionConfig::parse(text)?;
    config.validate()?;
    let ca = lookup(data, "ca_file", &config.ca_file)?.to_vec();
    let client_pair = match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => Some((
            lookup(data, "client_cert_file", cert)?.to_vec(),
            lookup(data, "client_key_file", key)?.to_vec(),
        )),
        _ => None,
    };
    let token = match &config.token_file {
        Some(file) => {
            let bytes = lookup(data, "token_file", file)?;
            let token = std::str::from_utf8(bytes)
                .map_err(|_| format!("token_file key {} is not UTF-8", file.display()))?
                .trim();
            if token.is_empty() {
                return Err(format!("token_file key {} is empty", file.display()));
            }
            Some(token.to_owned())
        }
        None => None,
    };
    Ok((config, ca, client_pair, token))
}

/// The value of the key a settings field names; in a Secret a file can only be another
/// key of the same Secret.
fn lookup<'a>(
    data: &'a BTreeMap<String, Vec<u8>>,
    field: &str,
    file: &Path,
) -> Result<&'a [u8], String> {
    let mut components = file.components();
    let key = match (components.next(), components.next()) {
        (Some(Component::Normal(key)), None) => key.to_string_lossy(),
        _ => {
            return Err(format!(
                "{field} {:?} must name another key of the same Secret",
                file.display().to_string()
            ));
        }
    };
    data.get(key.as_ref())
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{field} names key {key}, which the Secret does not hold"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_job_queue_is_transient_and_says_when_to_ask_again() {
        let mut headers = reqwest::header::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(reqwest::header::RETRY_AFTER, "5".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(5)));
        headers.insert(reqwest::header::RETRY_AFTER, "99999999".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(3600)));
        for unread in ["Wed, 21 Oct 2026 07:28:00 GMT", "-1", ""] {
            headers.insert(reqwest::header::RETRY_AFTER, unread.parse().unwrap());
            assert_eq!(retry_after(&headers), None, "{unread:?}");
        }
        let full = ClientError::Api {
            status: 429,
            error: ApiError::new(ErrorCode::JobQueueFull, "full"),
            retry_after: Some(Duration::from_secs(5)),
        };
        assert!(full.is_transient());
        assert_eq!(full.retry_after(), Some(Duration::from_secs(5)));
        assert_eq!(full.code(), Some(ErrorCode::JobQueueFull));
        // A newer agent's code sent as 429 is retried too, though it names no wait.
        let newer = ClientError::Api {
            status: 429,
            error: ApiError::new(ErrorCode::Unknown, "later"),
            retry_after: None,
        };
        assert!(newer.is_transient());
        assert_eq!(newer.retry_after(), None);
    }

    #[test]
    fn a_next_page_that_does_not_move_on_is_an_error() {
        let mut query = ListQuery::first(10);
        assert_eq!(next_page(&query, None).unwrap(), None);
        assert_eq!(
            next_page(&query, Some("a".into())).unwrap(),
            Some("a".into())
        );
        query.after = Some("a".into());
        assert_eq!(
            next_page(&query, Some("b".into())).unwrap(),
            Some("b".into())
        );
        assert!(next_page(&query, Some("a".into())).is_err());
    }

    #[test]
    fn settings_resolve_relative_files_and_reject_mistakes() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("nfs1.toml"),
            "name = \"nfs1\"\nurl = \"https://10.0.0.5:8443\"\nca_file = \"nfs1-ca.pem\"\ntoken_file = \"/abs/token\"\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("..data.toml"), "garbage").unwrap();
        let agents = AgentConnectionConfig::from_dir(dir.path()).unwrap();
        assert_eq!(agents.len(), 1);
        assert_eq!(agents[0].ca_file, dir.path().join("nfs1-ca.pem"));
        assert_eq!(
            agents[0].token_file.as_deref(),
            Some(Path::new("/abs/token"))
        );
        assert_eq!(agents[0].timeout_seconds, 30);

        let bad = [
            (
                "url = \"http://x\"\nca_file = \"c\"\ntoken_file = \"t\"",
                "https://",
            ),
            ("url = \"https://x\"\nca_file = \"c\"", "no credentials"),
            (
                "url = \"https://x\"\nca_file = \"c\"\nclient_cert_file = \"a\"",
                "together",
            ),
            (
                "url = \"https://x\"\nca_file = \"c\"\ntoken_file = \"t\"\ncolour = 1",
                "unknown field",
            ),
        ];
        for (body, expected) in bad {
            let file = dir.path().join("bad.toml");
            std::fs::write(&file, format!("name = \"b\"\n{body}\n")).unwrap();
            let err = AgentConnectionConfig::from_file(&file)
                .unwrap_err()
                .to_string();
            assert!(err.contains(expected), "{body}: {err}");
        }
    }

    #[test]
    fn duplicate_names_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        for file in ["a.toml", "b.toml"] {
            std::fs::write(
                dir.path().join(file),
                "name = \"same\"\nurl = \"https://x\"\nca_file = \"c\"\ntoken_file = \"t\"\n",
            )
            .unwrap();
        }
        let err = AgentConnectionConfig::from_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(err.contains("used twice"), "{err}");
    }

    #[test]
    fn at_most_one_default() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, default: bool| {
            std::fs::write(
                dir.path().join(format!("{name}.toml")),
                format!(
                    "name = \"{name}\"\nurl = \"https://x\"\nca_file = \"c\"\ntoken_file = \"t\"\ndefault = {default}\n"
                ),
            )
            .unwrap();
        };
        write("a", false);
        write("b", true);
        let agents = AgentConnectionConfig::from_dir(dir.path()).unwrap();
        assert_eq!(
            AgentConnectionConfig::default_name(&agents).unwrap(),
            Some("b")
        );
        assert!(!agents[0].default);
        write("c", true);
        let err = AgentConnectionConfig::from_dir(dir.path())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("several agents are marked default = true (b, c)"),
            "{err}"
        );
    }
}

#[cfg(test)]
mod secret_tests {
    use super::*;

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    const SETTINGS: &str = "name = \"nfs1\"\nurl = \"https://nfs1:8443\"\nca_file = \"nfs1-ca.pem\"\ntoken_file = \"nfs1-token\"\n";

    #[test]
    fn settings_and_the_keys_they_name() {
        let secret = data(&[
            ("nfs1.toml", SETTINGS),
            ("nfs1-ca.pem", "not a certificate\n"),
            ("nfs1-token", "  t0ken\n"),
        ]);
        let agents = agents_in_secret(&secret);
        assert_eq!(agents.len(), 1);
        let agent = agents[0].as_ref().unwrap();
        assert_eq!(agent.key, "nfs1.toml");
        assert_eq!(agent.config.name, "nfs1");
        assert_eq!(agent.token(), Some("t0ken"));
        assert!(!format!("{agent:?}").contains("t0ken"));
        // The material is the Secret's: a bad CA is named by its key.
        let err = AgentClient::from_secret(agent).unwrap_err().to_string();
        assert!(err.contains("key nfs1-ca.pem"), "{err}");
        assert!(agents_in_secret(&data(&[("nfs1-token", "t")])).is_empty());
    }

    #[test]
    fn what_a_secret_cannot_hold_is_named() {
        let cases = [
            (data(&[("a.toml", SETTINGS)]), "names key nfs1-ca.pem"),
            (
                data(&[
                    ("a.toml", &SETTINGS.replace("nfs1-ca.pem", "/etc/ca.pem")),
                    ("nfs1-token", "t"),
                ]),
                "must name another key",
            ),
            (
                data(&[
                    ("a.toml", SETTINGS),
                    ("nfs1-ca.pem", "x"),
                    ("nfs1-token", "\n"),
                ]),
                "is empty",
            ),
            (data(&[("a.toml", "name = 1")]), "invalid type"),
            (
                data(&[("a.toml", &SETTINGS.replace("https", "http"))]),
                "https://",
            ),
        ];
        for (secret, expected) in cases {
            let agents = agents_in_secret(&secret);
            let err = agents[0].as_ref().unwrap_err();
            assert_eq!(err.key, "a.toml");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
