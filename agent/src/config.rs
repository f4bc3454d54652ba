//! The agent's settings: a TOML file, overridden by flags and environment variables.
//! Every mistake is reported at start in one line naming the setting and the problem.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use nfsprov_api_types::{ExportManager, QuotaBackend};
use serde::Deserialize;

use crate::archive::retention::{self, ArchiveSettings};
use crate::connections::AdmissionSettings;
use crate::credentials::ScopeSettings;
use crate::exports::ExportSettings;
use crate::policy::Policy;
use crate::private_file;
use crate::quota::QuotaSettings;
use crate::scope::{Limits, Operations};
use crate::store::OvercommitLimits;

/// Default location of the agent's settings.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/nfsprov/agent.toml";
/// Default HTTPS port.
pub const DEFAULT_PORT: u16 = 8443;
/// The scoped credentials' file, beside the settings file unless they name another.
pub const DEFAULT_CREDENTIALS_FILE: &str = "credentials.toml";

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

#[derive(Debug, Args, Default)]
pub struct RunArgs {
    /// Settings file.
    #[arg(long, short, env = "NFSPROV_AGENT_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    /// Address to listen on (overrides `listen`).
    #[arg(long, env = "NFSPROV_AGENT_LISTEN")]
    pub listen: Option<String>,
    /// Export root (overrides `export_root`).
    #[arg(long, env = "NFSPROV_AGENT_EXPORT_ROOT")]
    pub export_root: Option<PathBuf>,
    /// Log format (overrides `log_format`).
    #[arg(long, env = "NFSPROV_AGENT_LOG_FORMAT")]
    pub log_format: Option<LogFormat>,
    /// Development only: serve without any authentication. Refuses any address but loopback.
    #[arg(long, env = "NFSPROV_AGENT_INSECURE_DEV_NO_AUTH")]
    pub insecure_dev_no_auth: bool,
}

/// The settings file, as written.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    pub listen: Option<String>,
    pub export_root: Option<PathBuf>,
    #[serde(default)]
    pub log_format: Option<LogFormat>,
    pub nfs: Option<NfsSection>,
    pub tls: TlsSection,
    #[serde(default)]
    pub tokens: Vec<TokenSection>,
    /// Scopes of client certificates, by the name the certificate carries.
    #[serde(default)]
    pub client_certificates: Vec<ClientCertificateSection>,
    /// The scoped credentials `nfsprov-agent credential` writes; absent:
    /// `credentials.toml` beside this file.
    pub credentials_file: Option<PathBuf>,
    #[serde(default)]
    pub limits: LimitsSection,
    #[serde(default)]
    pub readiness: ReadinessSection,
    #[serde(default)]
    pub quota: QuotaSection,
    #[serde(default)]
    pub policy: Policy,
    #[serde(default)]
    pub archive: ArchiveSection,
    #[serde(default)]
    pub exports: ExportsSection,
}

/// `[exports]`: who exports each volume to its NFS clients.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExportsSection {
    /// `none` (the operator exports the export root by hand), `knfsd` or `ganesha`.
    #[serde(deserialize_with = "known_manager")]
    pub manager: ExportManager,
    /// ganesha: the directory the agent owns for its EXPORT blocks; ganesha.conf
    /// `%include`s its `exports.conf`.
    pub ganesha_config_dir: PathBuf,
    /// ganesha: the D-Bus bus ganesha listens on; absent: the system bus.
    pub ganesha_dbus_address: Option<String>,
    /// ganesha: the first and last export id the agent may give a volume.
    pub ganesha_first_export_id: u16,
    pub ganesha_last_export_id: u16,
    /// ganesha: whether its own start reads every export from the agent's include
    /// lists; `false`: the agent serves them all once ganesha is on the bus.
    pub ganesha_reads_exports_at_start: bool,
    /// knfsd: the directory of each exported volume's file (`nfsprov-*.exports`).
    pub knfsd_exports_dir: PathBuf,
    /// knfsd: the one exports file of earlier agents, whose exports are moved to their
    /// own files at start.
    pub knfsd_exports_file: PathBuf,
    /// knfsd: the `exportfs` command.
    pub knfsd_exportfs: PathBuf,
    /// Admit NFS requests from unprivileged source ports (ganesha `PrivilegedPort =
    /// false`, knfsd `insecure`).
    pub allow_unprivileged_ports: bool,
    /// Make new per-volume exports although the export root shares its filesystem.
    pub allow_shared_filesystem: bool,
    /// Make new per-volume exports on a quota backend whose volumes share a filesystem,
    /// knowing that they control mounts by name only.
    pub mount_control_only: bool,
    /// Longest wait for the NFS server (each answer of ganesha, a connection to its bus,
    /// a change's turn) before an export change is answered 503.
    pub server_timeout_seconds: u64,
    /// How often the agent's periodic pass runs: the export comparison (ganesha), then
    /// every volume's condition, with any manager or none.
    pub reconcile_interval_seconds: u64,
}

/// A manager this agent can run: [`ExportManager::Unknown`] is for answers only.
fn known_manager<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<ExportManager, D::Error> {
    const NAMES: &[&str] = &["none", "knfsd", "ganesha"];
    let raw = String::deserialize(deserializer)?;
    match raw.as_str() {
        "none" => Ok(ExportManager::None),
        "knfsd" => Ok(ExportManager::Knfsd),
        "ganesha" => Ok(ExportManager::Ganesha),
        _ => Err(serde::de::Error::unknown_variant(&raw, NAMES)),
    }
}

impl Default for ExportsSection {
    fn default() -> Self {
        let defaults = ExportSettings::default();
        Self {
            manager: defaults.manager,
            ganesha_config_dir: defaults.ganesha_config_dir,
            ganesha_dbus_address: None,
            ganesha_first_export_id: *defaults.ganesha_export_ids.start(),
            ganesha_last_export_id: *defaults.ganesha_export_ids.end(),
            ganesha_reads_exports_at_start: defaults.ganesha_reads_exports_at_start,
            knfsd_exports_dir: defaults.knfsd_exports_dir,
            knfsd_exports_file: defaults.knfsd_exports_file,
            knfsd_exportfs: defaults.knfsd_exportfs,
            allow_unprivileged_ports: defaults.allow_unprivileged_ports,
            allow_shared_filesystem: defaults.allow_shared_filesystem,
            mount_control_only: defaults.mount_control_only,
            server_timeout_seconds: defaults.server_timeout.as_secs(),
            reconcile_interval_seconds: defaults.reconcile_interval.as_secs(),
        }
    }
}

impl ExportsSection {
    fn check(self) -> Result<ExportSettings, ConfigError> {
        let invalid = |message: String| Err(ConfigError::Invalid(message));
        if self.ganesha_first_export_id < 2
            || self.ganesha_first_export_id > self.ganesha_last_export_id
        {
            // Ids 0 and 1 are ganesha's pseudo root and its customary first export.
            return invalid(format!(
                "exports.ganesha_first_export_id {} .. exports.ganesha_last_export_id {} is not a range of export ids from 2 to 65535",
                self.ganesha_first_export_id, self.ganesha_last_export_id
            ));
        }
        for (name, path) in [
            ("exports.ganesha_config_dir", &self.ganesha_config_dir),
            ("exports.knfsd_exports_dir", &self.knfsd_exports_dir),
            ("exports.knfsd_exports_file", &self.knfsd_exports_file),
        ] {
            // Both are written into NFS server configuration, where a quote or a line
            // break would end the value.
            let text = path.to_string_lossy();
            if !path.is_absolute() || text.contains(['"', '\n', '\r', ' ']) {
                return invalid(format!(
                    "{name} {text:?} must be an absolute path without quotes, spaces or line breaks"
                ));
            }
        }
        // The old file is removed once read: it must not be a volume's own file.
        if self.knfsd_exports_file.parent() == Some(self.knfsd_exports_dir.as_path())
            && self
                .knfsd_exports_file
                .file_name()
                .and_then(|name| name.to_str())
                .is_some_and(crate::exports::Knfsd::owns_file_name)
        {
            return invalid(format!(
                "exports.knfsd_exports_file {:?} is named as a volume's file of exports.knfsd_exports_dir; it names the single exports file of earlier agents",
                self.knfsd_exports_file.to_string_lossy()
            ));
        }
        for (name, seconds, most) in [
            (
                "exports.server_timeout_seconds",
                self.server_timeout_seconds,
                300,
            ),
            (
                "exports.reconcile_interval_seconds",
                self.reconcile_interval_seconds,
                86_400,
            ),
        ] {
            if !(1..=most).contains(&seconds) {
                return invalid(format!("{name} {seconds} must be from 1 to {most}"));
            }
        }
        Ok(ExportSettings {
            manager: self.manager,
            ganesha_config_dir: self.ganesha_config_dir,
            ganesha_dbus_address: self.ganesha_dbus_address,
            ganesha_export_ids: self.ganesha_first_export_id..=self.ganesha_last_export_id,
            ganesha_reads_exports_at_start: self.ganesha_reads_exports_at_start,
            knfsd_exports_dir: self.knfsd_exports_dir,
            knfsd_exports_file: self.knfsd_exports_file,
            knfsd_exportfs: self.knfsd_exportfs,
            allow_unprivileged_ports: self.allow_unprivileged_ports,
            allow_shared_filesystem: self.allow_shared_filesystem,
            mount_control_only: self.mount_control_only,
            server_timeout: Duration::from_secs(self.server_timeout_seconds),
            reconcile_interval: Duration::from_secs(self.reconcile_interval_seconds),
        })
    }
}

/// `[archive]`: how long archives are kept.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveSection {
    /// Days an archive is kept when its archive request named no retention; absent:
    /// until it is deleted by hand.
    pub retention_days: Option<u32>,
    /// How often the agent looks for expired archives.
    pub sweep_interval_seconds: u64,
}

impl Default for ArchiveSection {
    fn default() -> Self {
        Self {
            retention_days: None,
            sweep_interval_seconds: ArchiveSettings::default().sweep_interval.as_secs(),
        }
    }
}

impl ArchiveSection {
    fn check(&self) -> Result<ArchiveSettings, ConfigError> {
        if self.retention_days == Some(0) {
            return Err(ConfigError::Invalid(
                "archive.retention_days must be at least 1; leave it out to keep archives until they are deleted by hand".into(),
            ));
        }
        if self.sweep_interval_seconds == 0 {
            return Err(ConfigError::Invalid(
                "archive.sweep_interval_seconds must be at least 1".into(),
            ));
        }
        Ok(ArchiveSettings {
            default_retention: self.retention_days.map(retention::days),
            sweep_interval: Duration::from_secs(self.sweep_interval_seconds),
        })
    }
}

/// `[quota]`: how capacities are enforced.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct QuotaSection {
    /// `none`, `btrfs`, `zfs`, `xfs` or `image`.
    #[serde(deserialize_with = "known_backend")]
    pub backend: QuotaBackend,
    /// ZFS: the dataset mounted at the export root.
    pub zfs_dataset: Option<String>,
    /// XFS: the first and last project id volumes may be given.
    pub xfs_first_project_id: u32,
    pub xfs_last_project_id: u32,
    pub command_timeout_seconds: u64,
}

/// A backend this agent can run: the API's [`QuotaBackend::Unknown`] fallback is for
/// answers read from a newer agent, never for settings.
fn known_backend<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<QuotaBackend, D::Error> {
    let raw = String::deserialize(deserializer)?;
    QuotaBackend::known(&raw).ok_or_else(|| {
        const NAMES: &[&str] = &["none", "btrfs", "zfs", "xfs", "image"];
        serde::de::Error::unknown_variant(&raw, NAMES)
    })
}

impl Default for QuotaSection {
    fn default() -> Self {
        let defaults = QuotaSettings::default();
        Self {
            backend: defaults.backend,
            zfs_dataset: None,
            xfs_first_project_id: *defaults.xfs_project_ids.start(),
            xfs_last_project_id: *defaults.xfs_project_ids.end(),
            command_timeout_seconds: defaults.command_timeout.as_secs(),
        }
    }
}

impl QuotaSection {
    fn check(&self) -> Result<QuotaSettings, ConfigError> {
        let zfs = self.backend == QuotaBackend::Zfs;
        match (&self.zfs_dataset, zfs) {
            (None, true) => {
                return Err(ConfigError::Invalid(
                    "quota.zfs_dataset must name the dataset mounted at export_root when quota.backend is zfs".into(),
                ));
            }
            (Some(_), false) => {
                return Err(ConfigError::Invalid(
                    "quota.zfs_dataset is set but quota.backend is not zfs".into(),
                ));
            }
            _ => {}
        }
        if self.xfs_first_project_id == 0 || self.xfs_first_project_id > self.xfs_last_project_id {
            return Err(ConfigError::Invalid(format!(
                "quota.xfs_first_project_id {} .. quota.xfs_last_project_id {} is not a range of project ids above 0",
                self.xfs_first_project_id, self.xfs_last_project_id
            )));
        }
        if self.command_timeout_seconds == 0 {
            return Err(ConfigError::Invalid(
                "quota.command_timeout_seconds must be at least 1".into(),
            ));
        }
        Ok(QuotaSettings {
            backend: self.backend,
            zfs_dataset: self.zfs_dataset.clone(),
            xfs_project_ids: self.xfs_first_project_id..=self.xfs_last_project_id,
            command_timeout: Duration::from_secs(self.command_timeout_seconds),
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NfsSection {
    /// Name or address NFS clients use to reach this server.
    pub server: String,
    /// Path clients mount for the export root (defaults to the export root itself).
    pub path: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// CA whose client certificates are accepted (mTLS). Without it, only tokens work.
    pub client_ca_file: Option<PathBuf>,
    /// When set, only client certificates with one of these names (subject common name
    /// or DNS subject alternative name) are accepted, not everything the CA signed.
    #[serde(default)]
    pub allowed_client_names: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenSection {
    /// Name logged as the caller's identity (the token itself never is).
    pub name: String,
    pub file: PathBuf,
    /// The volumes this token acts on lie beneath this path; absent: the whole root.
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub operations: Operations,
    /// The clients this token's exports may admit lie within one of these; absent: any.
    #[serde(default)]
    pub export_clients: Option<Vec<String>>,
    /// The most volumes beneath its prefix; absent: no bound.
    #[serde(default)]
    pub max_volumes: Option<u64>,
    /// The most capacity its volumes may add up to; absent: no bound.
    #[serde(default)]
    pub max_bytes: Option<u64>,
    /// The most clones, snapshots and restores of its admitted at once; absent: no bound.
    #[serde(default)]
    pub max_jobs: Option<usize>,
}

impl TokenSection {
    /// A token of the whole export root, as `init` writes it.
    pub fn whole_root(name: impl Into<String>, file: impl Into<PathBuf>) -> Self {
        Self {
            name: name.into(),
            file: file.into(),
            prefix: None,
            operations: Operations::All,
            export_clients: None,
            max_volumes: None,
            max_bytes: None,
            max_jobs: None,
        }
    }
}

impl TokenSection {
    /// Its scope and limits as written.
    pub fn settings(&self) -> ScopeSettings<'_> {
        ScopeSettings {
            prefix: self.prefix.as_deref(),
            operations: self.operations,
            export_clients: self.export_clients.as_deref(),
            limits: Limits {
                max_volumes: self.max_volumes,
                max_bytes: self.max_bytes,
                max_jobs: self.max_jobs,
            },
        }
    }
}

impl ClientCertificateSection {
    /// Its scope and limits as written.
    pub fn settings(&self) -> ScopeSettings<'_> {
        ScopeSettings {
            prefix: self.prefix.as_deref(),
            operations: self.operations,
            export_clients: self.export_clients.as_deref(),
            limits: Limits {
                max_volumes: self.max_volumes,
                max_bytes: self.max_bytes,
                max_jobs: self.max_jobs,
            },
        }
    }
}

/// `[[client_certificates]]`: the scope of the client certificate named `name` (its
/// subject common name or a DNS subject alternative name). A certificate named by no
/// entry keeps the whole export root.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientCertificateSection {
    pub name: String,
    #[serde(default)]
    pub prefix: Option<String>,
    #[serde(default)]
    pub operations: Operations,
    #[serde(default)]
    pub export_clients: Option<Vec<String>>,
    #[serde(default)]
    pub max_volumes: Option<u64>,
    #[serde(default)]
    pub max_bytes: Option<u64>,
    #[serde(default)]
    pub max_jobs: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    pub max_body_bytes: usize,
    pub request_timeout_seconds: u64,
    pub max_concurrent_requests: usize,
    pub shutdown_grace_seconds: u64,
    /// Authenticated connections open at once (by client certificate, or since a
    /// request with a valid token); one more is closed when it authenticates. Strangers
    /// never take one of these places.
    pub max_connections: usize,
    /// TLS handshakes in progress at once; a new one drops the oldest.
    pub max_tls_handshakes: usize,
    /// Longest TLS handshake.
    pub tls_handshake_timeout_seconds: u64,
    /// Connections open at once that have not authenticated yet; a new one closes the
    /// oldest.
    pub max_unauthenticated_connections: usize,
    /// Connections not authenticated yet (handshakes included) from one source address;
    /// one more is closed at once.
    pub max_unauthenticated_per_source: usize,
    /// A connection still unauthenticated this long after its handshake is closed,
    /// whatever it sends meanwhile.
    pub unauthenticated_timeout_seconds: u64,
    /// Longest wait for a request's headers (and, on a kept-alive connection, for the
    /// next request).
    pub header_read_timeout_seconds: u64,
    /// A connection with no traffic for this long is closed. Longer than
    /// `request_timeout_seconds`, so a slow request always gets its answer first.
    pub idle_timeout_seconds: u64,
    /// Longest wait for a request's body, from the end of its headers: a client that
    /// announces a body and stops sending gets a 408 long before the request timeout.
    pub body_read_timeout_seconds: u64,
    /// Clone jobs running at once. Jobs outlive their requests, so
    /// `max_concurrent_requests` does not count them; more wait for a slot.
    pub max_clone_jobs: usize,
    /// Jobs of each kind (clones, snapshots, restores) waiting for a slot at once; a
    /// request for one more is refused with 429 and `Retry-After`.
    pub max_queued_jobs: usize,
    /// The ratio of provisioned capacity (every volume's) to the filesystem's size past
    /// which the agent warns: `/v1/info`, the metrics, `kubectl nfsprov doctor`.
    pub overcommit_warn_ratio: f64,
    /// The ratio past which a create, clone, restore or expansion is refused with 507
    /// `overcommit_limit`; unset: never refused.
    pub max_overcommit_ratio: Option<f64>,
    /// The bytes one namespace's snapshots may hold at most, each counted at what it
    /// referenced when taken; a snapshot past it is refused with 507 `snapshot_limit`.
    /// Unset: never refused.
    pub max_snapshot_bytes_per_namespace: Option<u64>,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_body_bytes: 64 * 1024,
            // Deleting a very large tree can take minutes; the work goes on after a
            // timeout and a retry then finds the volume gone.
            request_timeout_seconds: 120,
            max_concurrent_requests: 256,
            shutdown_grace_seconds: 30,
            max_connections: 4096,
            // A real client completes its handshake in milliseconds: a handful of
            // seconds covers a slow link, and 256 in progress a burst of reconnects.
            max_tls_handshakes: 256,
            tls_handshake_timeout_seconds: 5,
            // Health checks and refused requests; the controller authenticates with
            // its first request and leaves this budget at once. Its own burst of new
            // connections (one per reconcile at most) stays well within its source's
            // share.
            max_unauthenticated_connections: 512,
            max_unauthenticated_per_source: 128,
            unauthenticated_timeout_seconds: 5,
            header_read_timeout_seconds: 10,
            idle_timeout_seconds: 300,
            // A body is at most `max_body_bytes` (64 KiB by default): seconds are plenty
            // on any link a controller uses.
            body_read_timeout_seconds: 10,
            // Each deep copy may hold over a thousand descriptors and keeps the disks
            // busy: a few at a time finish sooner than many at once.
            max_clone_jobs: 2,
            // Far more than a controller keeps going (its reconciles per agent), and a
            // few hundred KiB of memory at most per kind.
            max_queued_jobs: 64,
            // Promising exactly the filesystem is where the promises stop being
            // guaranteed; refusing is the operator's choice.
            overcommit_warn_ratio: OvercommitLimits::default().warn_ratio,
            max_overcommit_ratio: OvercommitLimits::default().max_ratio,
            // Whether tenants may snapshot without bound is the operator's choice, as
            // overcommit is.
            max_snapshot_bytes_per_namespace: None,
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReadinessSection {
    pub min_free_bytes: u64,
    pub min_free_inodes: u64,
}

impl Default for ReadinessSection {
    fn default() -> Self {
        Self {
            min_free_bytes: 16 * 1024 * 1024,
            min_free_inodes: 256,
        }
    }
}

/// How callers prove who they are.
#[derive(Debug, Clone)]
pub struct AuthConfig {
    pub client_ca_file: Option<PathBuf>,
    /// Empty: any client certificate the CA signed for client authentication.
    pub allowed_client_names: Vec<String>,
    pub tokens: Vec<TokenSection>,
    /// The scopes of client certificates, by name (checked).
    pub certificate_scopes: Vec<ClientCertificateSection>,
    /// The scoped credentials' file, watched while the agent runs.
    pub credentials_file: PathBuf,
    /// Development mode: no authentication at all (loopback only).
    pub disabled: bool,
}

/// Settings after merging file and flags, checked.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub listen: SocketAddr,
    pub export_root: PathBuf,
    pub nfs_server: String,
    pub nfs_path: String,
    pub log_format: LogFormat,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    pub auth: AuthConfig,
    pub max_body_bytes: usize,
    pub request_timeout: Duration,
    pub max_connections: usize,
    pub max_tls_handshakes: usize,
    pub tls_handshake_timeout: Duration,
    pub max_unauthenticated_connections: usize,
    pub max_unauthenticated_per_source: usize,
    pub unauthenticated_timeout: Duration,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub body_read_timeout: Duration,
    pub max_concurrent_requests: usize,
    pub max_clone_jobs: usize,
    pub max_queued_jobs: usize,
    pub overcommit: OvercommitLimits,
    /// `limits.max_snapshot_bytes_per_namespace`.
    pub max_snapshot_bytes_per_namespace: Option<u64>,
    pub shutdown_grace: Duration,
    pub min_free_bytes: u64,
    pub min_free_inodes: u64,
    pub quota: QuotaSettings,
    pub policy: Policy,
    pub archive: ArchiveSettings,
    pub exports: ExportSettings,
}

impl AgentConfig {
    /// The connection budgets and deadlines of `[limits]`.
    pub(crate) fn admission(&self) -> AdmissionSettings {
        AdmissionSettings {
            max_connections: self.max_connections,
            max_tls_handshakes: self.max_tls_handshakes,
            tls_handshake_timeout: self.tls_handshake_timeout,
            max_unauthenticated_connections: self.max_unauthenticated_connections,
            max_unauthenticated_per_source: self.max_unauthenticated_per_source,
            unauthenticated_timeout: self.unauthenticated_timeout,
            idle_timeout: self.idle_timeout,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("settings file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("{0}")]
    Invalid(String),
}

impl AgentConfig {
    /// Reads the settings file and applies the flags on top of it.
    pub fn load(args: &RunArgs) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(&args.config).map_err(|e| ConfigError::File {
            path: args.config.clone(),
            message: format!("cannot read it: {e}"),
        })?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| ConfigError::File {
            path: args.config.clone(),
            message: e.message().to_owned(),
        })?;
        let base = args.config.parent().unwrap_or(Path::new("/"));
        Self::from_parts(file, args, base)
    }

    /// Merges a parsed file with flags; relative file names resolve against `base`.
    pub fn from_parts(file: FileConfig, args: &RunArgs, base: &Path) -> Result<Self, ConfigError> {
        let resolve = |p: &Path| {
            if p.is_absolute() {
                p.to_owned()
            } else {
                base.join(p)
            }
        };
        let listen_text = args
            .listen
            .clone()
            .or(file.listen)
            .unwrap_or_else(|| format!("0.0.0.0:{DEFAULT_PORT}"));
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            ConfigError::Invalid(format!(
                "listen address {listen_text:?} is not an IP:port such as 0.0.0.0:{DEFAULT_PORT}"
            ))
        })?;
        let export_root = args
            .export_root
            .clone()
            .or(file.export_root)
            .ok_or_else(|| ConfigError::Invalid("export_root is not set".into()))?;
        check_export_root(&export_root)?;

        let cert_file = resolve(&file.tls.cert_file);
        let key_file = resolve(&file.tls.key_file);
        check_readable("tls.cert_file", &cert_file)?;
        check_readable("tls.key_file", &key_file)?;
        check_private("tls.key_file", &key_file)?;
        let client_ca_file = file.tls.client_ca_file.as_deref().map(resolve);
        if let Some(ca) = &client_ca_file {
            check_readable("tls.client_ca_file", ca)?;
        }
        let allowed_client_names = file.tls.allowed_client_names;
        if !allowed_client_names.is_empty() && client_ca_file.is_none() {
            return Err(ConfigError::Invalid(
                "tls.allowed_client_names needs tls.client_ca_file: without a client CA no certificate is accepted at all".into(),
            ));
        }
        if allowed_client_names.iter().any(|n| n.trim().is_empty()) {
            return Err(ConfigError::Invalid(
                "tls.allowed_client_names holds an empty name".into(),
            ));
        }
        let mut tokens = Vec::with_capacity(file.tokens.len());
        for token in file.tokens {
            if token.name.trim().is_empty() {
                return Err(ConfigError::Invalid(
                    "a [[tokens]] entry has an empty name".into(),
                ));
            }
            let path = resolve(&token.file);
            check_readable(&format!("token {:?}", token.name), &path)?;
            check_private(&format!("token {:?}", token.name), &path)?;
            token
                .settings()
                .scope()
                .map_err(|e| ConfigError::Invalid(format!("token {:?}: {e}", token.name)))?;
            tokens.push(TokenSection {
                file: path,
                ..token
            });
        }
        let mut certificate_scopes = Vec::with_capacity(file.client_certificates.len());
        for certificate in file.client_certificates {
            if client_ca_file.is_none() {
                return Err(ConfigError::Invalid(
                    "[[client_certificates]] needs tls.client_ca_file: without a client CA no certificate is accepted at all".into(),
                ));
            }
            certificate.settings().scope().map_err(|e| {
                ConfigError::Invalid(format!("client certificate {:?}: {e}", certificate.name))
            })?;
            if certificate_scopes
                .iter()
                .any(|known: &ClientCertificateSection| known.name == certificate.name)
            {
                return Err(ConfigError::Invalid(format!(
                    "client certificate {:?} is listed twice",
                    certificate.name
                )));
            }
            certificate_scopes.push(certificate);
        }
        let credentials_file = file
            .credentials_file
            .as_deref()
            .map_or_else(|| base.join(DEFAULT_CREDENTIALS_FILE), resolve);
        let disabled = args.insecure_dev_no_auth;
        if disabled && (client_ca_file.is_some() || !tokens.is_empty()) {
            return Err(ConfigError::Invalid(
                "--insecure-dev-no-auth would switch off the authentication the settings configure (tls.client_ca_file, [[tokens]]); remove one or the other"
                    .into(),
            ));
        }
        if client_ca_file.is_none() && tokens.is_empty() && !disabled {
            return Err(ConfigError::Invalid(
                "no authentication configured: set tls.client_ca_file and/or [[tokens]] (or --insecure-dev-no-auth for a loopback-only development agent)"
                    .into(),
            ));
        }
        if disabled && !listen.ip().is_loopback() {
            return Err(ConfigError::Invalid(format!(
                "--insecure-dev-no-auth only binds loopback addresses, not {listen}"
            )));
        }

        let nfs = file.nfs;
        let nfs_server = nfs
            .as_ref()
            .map(|n| n.server.clone())
            .unwrap_or_else(|| listen.ip().to_string());
        if nfs_server.trim().is_empty() {
            return Err(ConfigError::Invalid("nfs.server is empty".into()));
        }
        let nfs_path = nfs
            .and_then(|n| n.path)
            .unwrap_or_else(|| export_root.display().to_string());
        if !nfs_path.starts_with('/') {
            return Err(ConfigError::Invalid(format!(
                "nfs.path {nfs_path:?} must be absolute"
            )));
        }
        let limits = file.limits;
        if limits.max_body_bytes == 0
            || limits.request_timeout_seconds == 0
            || limits.max_concurrent_requests == 0
        {
            return Err(ConfigError::Invalid(
                "limits.max_body_bytes, limits.request_timeout_seconds and limits.max_concurrent_requests must be positive".into(),
            ));
        }
        if limits.max_clone_jobs == 0 || limits.max_queued_jobs == 0 {
            return Err(ConfigError::Invalid(
                "limits.max_clone_jobs and limits.max_queued_jobs must be positive".into(),
            ));
        }
        if limits.max_connections == 0
            || limits.header_read_timeout_seconds == 0
            || limits.body_read_timeout_seconds == 0
        {
            return Err(ConfigError::Invalid(
                "limits.max_connections, limits.header_read_timeout_seconds and limits.body_read_timeout_seconds must be positive"
                    .into(),
            ));
        }
        if limits.max_tls_handshakes == 0
            || limits.tls_handshake_timeout_seconds == 0
            || limits.max_unauthenticated_connections == 0
            || limits.max_unauthenticated_per_source == 0
            || limits.unauthenticated_timeout_seconds == 0
        {
            return Err(ConfigError::Invalid(
                "limits.max_tls_handshakes, limits.tls_handshake_timeout_seconds, limits.max_unauthenticated_connections, limits.max_unauthenticated_per_source and limits.unauthenticated_timeout_seconds must be positive"
                    .into(),
            ));
        }
        if limits.idle_timeout_seconds <= limits.request_timeout_seconds {
            return Err(ConfigError::Invalid(format!(
                "limits.idle_timeout_seconds ({}) must be longer than limits.request_timeout_seconds ({}), or a slow request would lose its connection before its answer",
                limits.idle_timeout_seconds, limits.request_timeout_seconds
            )));
        }
        Ok(Self {
            listen,
            export_root,
            nfs_server,
            nfs_path: match nfs_path.trim_end_matches('/') {
                "" => "/".to_owned(),
                trimmed => trimmed.to_owned(),
            },
            log_format: args.log_format.or(file.log_format).unwrap_or_default(),
            cert_file,
            key_file,
            auth: AuthConfig {
                client_ca_file,
                allowed_client_names,
                tokens,
                certificate_scopes,
                credentials_file,
                disabled,
            },
            max_body_bytes: limits.max_body_bytes,
            request_timeout: Duration::from_secs(limits.request_timeout_seconds),
            max_connections: limits.max_connections,
            max_tls_handshakes: limits.max_tls_handshakes,
            tls_handshake_timeout: Duration::from_secs(limits.tls_handshake_timeout_seconds),
            max_unauthenticated_connections: limits.max_unauthenticated_connections,
            max_unauthenticated_per_source: limits.max_unauthenticated_per_source,
            unauthenticated_timeout: Duration::from_secs(limits.unauthenticated_timeout_seconds),
            header_read_timeout: Duration::from_secs(limits.header_read_timeout_seconds),
            idle_timeout: Duration::from_secs(limits.idle_timeout_seconds),
            body_read_timeout: Duration::from_secs(limits.body_read_timeout_seconds),
            max_concurrent_requests: limits.max_concurrent_requests,
            max_clone_jobs: limits.max_clone_jobs,
            max_queued_jobs: limits.max_queued_jobs,
            overcommit: OvercommitLimits {
                warn_ratio: limits.overcommit_warn_ratio,
                max_ratio: limits.max_overcommit_ratio,
            }
            .check()
            .map_err(ConfigError::Invalid)?,
            max_snapshot_bytes_per_namespace: limits.max_snapshot_bytes_per_namespace,
            shutdown_grace: Duration::from_secs(limits.shutdown_grace_seconds),
            min_free_bytes: file.readiness.min_free_bytes,
            min_free_inodes: file.readiness.min_free_inodes,
            quota: file.quota.check()?,
            policy: {
                file.policy.check_settings().map_err(ConfigError::Invalid)?;
                file.policy
            },
            archive: file.archive.check()?,
            exports: file.exports.check()?,
        })
    }
}

fn check_export_root(root: &Path) -> Result<(), ConfigError> {
    if !root.is_absolute() {
        return Err(ConfigError::Invalid(format!(
            "export_root {} must be an absolute path",
            root.display()
        )));
    }
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(ConfigError::Invalid(format!(
            "export_root {} is not a directory",
            root.display()
        ))),
        Err(e) => Err(ConfigError::Invalid(format!(
            "export_root {} cannot be used: {e}",
            root.display()
        ))),
    }
}

fn check_readable(what: &str, path: &Path) -> Result<(), ConfigError> {
    std::fs::File::open(path).map(drop).map_err(|e| {
        ConfigError::Invalid(format!("{what} {}: cannot read it: {e}", path.display()))
    })
}

/// A secret (private key, token) must be the agent's alone: whoever else can write it
/// can impersonate the controller, and whoever can read it can be the agent. Refused at
/// start rather than served with.
fn check_private(what: &str, path: &Path) -> Result<(), ConfigError> {
    match private_file::problem(path) {
        None => Ok(()),
        Some(problem) => Err(ConfigError::Invalid(format!(
            "{what} {}: {problem}",
            path.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_private(path: &Path) {
        use std::os::unix::fs::PermissionsExt;
        std::fs::write(path, "x").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    #[test]
    fn secrets_others_can_read_or_replace_refuse_start() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("export");
        std::fs::create_dir(&root).unwrap();
        for name in ["cert.pem", "key.pem", "token"] {
            write_private(&dir.path().join(name));
        }
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            format!(
                "export_root = {root:?}\nlisten = \"127.0.0.1:9443\"\n[tls]\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n[[tokens]]\nname = \"controller\"\nfile = \"token\"\n"
            ),
        )
        .unwrap();
        assert!(AgentConfig::load(&args(&file)).is_ok());
        let chmod = |name: &str, mode: u32| {
            std::fs::set_permissions(dir.path().join(name), std::fs::Permissions::from_mode(mode))
                .unwrap();
        };
        chmod("key.pem", 0o644);
        let err = AgentConfig::load(&args(&file)).unwrap_err().to_string();
        assert!(
            err.contains("tls.key_file") && err.contains("chmod 600"),
            "{err}"
        );
        chmod("key.pem", 0o600);
        chmod("token", 0o666);
        let err = AgentConfig::load(&args(&file)).unwrap_err().to_string();
        assert!(
            err.contains("token \"controller\"") && err.contains("0666"),
            "{err}"
        );
        chmod("token", 0o600);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = AgentConfig::load(&args(&file)).unwrap_err().to_string();
        assert!(err.contains("directory is writable"), "{err}");
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(AgentConfig::load(&args(&file)).is_ok());

        let mut run = args(&file);
        run.insecure_dev_no_auth = true;
        let err = AgentConfig::load(&run).unwrap_err().to_string();
        assert!(err.contains("would switch off the authentication"), "{err}");
    }

    fn args(config: &Path) -> RunArgs {
        RunArgs {
            config: config.to_owned(),
            ..Default::default()
        }
    }

    #[test]
    fn every_mistake_names_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("export");
        std::fs::create_dir(&root).unwrap();
        for name in ["cert.pem", "key.pem", "token"] {
            write_private(&dir.path().join(name));
        }
        let good = format!(
            "export_root = {root:?}\nlisten = \"127.0.0.1:9443\"\n[tls]\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n[[tokens]]\nname = \"controller\"\nfile = \"token\"\n"
        );
        let file = dir.path().join("agent.toml");
        std::fs::write(&file, &good).unwrap();
        let config = AgentConfig::load(&args(&file)).unwrap();
        assert_eq!(config.listen.port(), 9443);
        assert_eq!(config.cert_file, dir.path().join("cert.pem"));
        assert_eq!(config.nfs_path, root.display().to_string());
        assert_eq!(config.archive, ArchiveSettings::default());
        assert_eq!(config.archive.default_retention, None, "kept forever");
        assert_eq!(
            config.overcommit,
            OvercommitLimits {
                warn_ratio: 1.0,
                max_ratio: None
            },
            "warned past the filesystem's size, never refused"
        );
        assert_eq!(config.max_snapshot_bytes_per_namespace, None);
        std::fs::write(
            &file,
            format!("{good}[limits]\novercommit_warn_ratio = 1.5\nmax_overcommit_ratio = 2\nmax_snapshot_bytes_per_namespace = 1073741824\n"),
        )
        .unwrap();
        let config = AgentConfig::load(&args(&file)).unwrap();
        assert_eq!(
            config.overcommit,
            OvercommitLimits {
                warn_ratio: 1.5,
                max_ratio: Some(2.0)
            }
        );
        assert_eq!(config.max_snapshot_bytes_per_namespace, Some(1 << 30));

        std::fs::write(
            &file,
            format!("{good}[archive]\nretention_days = 30\nsweep_interval_seconds = 60\n"),
        )
        .unwrap();
        let archive = AgentConfig::load(&args(&file)).unwrap().archive;
        assert_eq!(
            archive.default_retention,
            Some(Duration::from_secs(30 * 86_400))
        );
        assert_eq!(archive.sweep_interval, Duration::from_secs(60));

        assert_eq!(config.exports, ExportSettings::default());
        assert_eq!(
            config.exports.manager,
            ExportManager::None,
            "today's behaviour"
        );
        std::fs::write(
            &file,
            format!(
                "{good}[exports]\nmanager = \"ganesha\"\nganesha_config_dir = \"/etc/g\"\nganesha_dbus_address = \"unix:path=/run/bus\"\nganesha_first_export_id = 2\nganesha_last_export_id = 9\nganesha_reads_exports_at_start = false\nserver_timeout_seconds = 3\nreconcile_interval_seconds = 7\n"
            ),
        )
        .unwrap();
        let exports = AgentConfig::load(&args(&file)).unwrap().exports;
        assert_eq!(exports.manager, ExportManager::Ganesha);
        assert_eq!(exports.ganesha_config_dir, Path::new("/etc/g"));
        assert_eq!(
            exports.ganesha_dbus_address.as_deref(),
            Some("unix:path=/run/bus")
        );
        assert_eq!(exports.ganesha_export_ids, 2..=9);
        assert!(!exports.ganesha_reads_exports_at_start);
        assert!(ExportSettings::default().ganesha_reads_exports_at_start);
        assert_eq!(exports.server_timeout, Duration::from_secs(3));
        assert_eq!(exports.reconcile_interval, Duration::from_secs(7));

        let cases = [
            (
                format!("{good}[exports]\nserver_timeout_seconds = 0\n"),
                "exports.server_timeout_seconds 0 must be from 1 to 300",
            ),
            (
                format!("{good}[exports]\nreconcile_interval_seconds = 0\n"),
                "exports.reconcile_interval_seconds 0",
            ),
            (
                format!("{good}[exports]\nmanager = \"nfsd4\"\n"),
                "unknown variant `nfsd4`",
            ),
            (
                format!("{good}[exports]\nmanager = \"unknown\"\n"),
                "unknown variant `unknown`",
            ),
            (
                format!("{good}[exports]\nganesha_first_export_id = 1\n"),
                "exports.ganesha_first_export_id 1",
            ),
            (
                format!("{good}[exports]\nganesha_config_dir = \"relative\"\n"),
                "exports.ganesha_config_dir \"relative\" must be an absolute path",
            ),
            (
                format!("{good}[exports]\nknfsd_exports_file = \"/etc/exports.d/a b\"\n"),
                "exports.knfsd_exports_file",
            ),
            (
                format!("{good}[exports]\nknfsd_exports_dir = \"exports.d\"\n"),
                "exports.knfsd_exports_dir \"exports.d\" must be an absolute path",
            ),
            (
                format!(
                    "{good}[exports]\nknfsd_exports_file = \"/etc/exports.d/nfsprov-0123456789abcdef0123456789abcdef.exports\"\n"
                ),
                "is named as a volume's file of exports.knfsd_exports_dir",
            ),
            (
                good.replace("127.0.0.1:9443", "nowhere"),
                "listen address \"nowhere\"",
            ),
            (good.replace("cert.pem", "missing.pem"), "tls.cert_file"),
            (good.replace("\"key.pem\"", "\"gone.pem\""), "tls.key_file"),
            (
                good.replace(&format!("{root:?}"), "\"relative/dir\""),
                "must be an absolute path",
            ),
            (
                good.replace(&format!("{root:?}"), "\"/nonexistent/root\""),
                "export_root /nonexistent/root cannot be used",
            ),
            (
                good.replace("[[tokens]]\nname = \"controller\"\nfile = \"token\"\n", ""),
                "no authentication configured",
            ),
            (format!("{good}colour = 1\n"), "unknown field"),
            (
                good.replace(
                    "key_file = \"key.pem\"\n",
                    "key_file = \"key.pem\"\nallowed_client_names = [\"controller\"]\n",
                ),
                "tls.allowed_client_names needs tls.client_ca_file",
            ),
            (
                format!("{good}[quota]\nbackend = \"zfs\"\n"),
                "quota.zfs_dataset must name the dataset",
            ),
            (
                format!("{good}[quota]\nbackend = \"ext3\"\n"),
                "unknown variant `ext3`",
            ),
            (
                format!("{good}[quota]\nzfs_dataset = \"tank/x\"\n"),
                "quota.backend is not zfs",
            ),
            (
                format!("{good}[quota]\nxfs_first_project_id = 5\nxfs_last_project_id = 4\n"),
                "is not a range of project ids",
            ),
            (
                format!("{good}[archive]\nretention_days = 0\n"),
                "archive.retention_days must be at least 1",
            ),
            (
                format!("{good}[archive]\nretention_days = -3\n"),
                "invalid value",
            ),
            (
                format!("{good}[archive]\nsweep_interval_seconds = 0\n"),
                "archive.sweep_interval_seconds must be at least 1",
            ),
            (format!("{good}[archive]\nretention = 7\n"), "unknown field"),
            (
                format!("{good}[limits]\nmax_clone_jobs = 0\n"),
                "limits.max_clone_jobs and limits.max_queued_jobs must be positive",
            ),
            (
                format!("{good}[limits]\nmax_queued_jobs = 0\n"),
                "limits.max_clone_jobs and limits.max_queued_jobs must be positive",
            ),
            (
                format!("{good}[limits]\novercommit_warn_ratio = 0.0\n"),
                "limits.overcommit_warn_ratio (0) must be a positive number",
            ),
            (
                format!("{good}[limits]\nmax_overcommit_ratio = -2.0\n"),
                "limits.max_overcommit_ratio (-2) must be a positive number",
            ),
            (
                format!(
                    "{good}[limits]\novercommit_warn_ratio = 2.0\nmax_overcommit_ratio = 1.5\n"
                ),
                "limits.max_overcommit_ratio (1.5) must be at least limits.overcommit_warn_ratio (2)",
            ),
            (
                format!("{good}[limits]\nmax_overcommit_ratio = \"none\"\n"),
                "invalid type",
            ),
            (
                format!("{good}[limits]\nmax_unauthenticated_per_source = 0\n"),
                "limits.max_unauthenticated_per_source and limits.unauthenticated_timeout_seconds must be positive",
            ),
        ];
        for (text, expected) in cases {
            std::fs::write(&file, &text).unwrap();
            let err = AgentConfig::load(&args(&file)).unwrap_err().to_string();
            assert!(err.contains(expected), "expected {expected:?} in {err:?}");
            assert!(!err.contains('\n'), "one line: {err:?}");
        }
    }

    #[test]
    fn shipped_example_is_a_valid_settings_file() {
        let example: FileConfig =
            toml::from_str(include_str!("../../deploy/agent/agent.example.toml")).unwrap();
        assert_eq!(example.tokens.len(), 1);
        assert!(example.tls.client_ca_file.is_some());
        assert_eq!(example.nfs.unwrap().server, "nfs1.example.com");
        assert_eq!(example.archive.retention_days, None, "kept until deleted");
        assert_eq!(example.exports.manager, ExportManager::None);
        assert_eq!(
            example.archive.check().unwrap().sweep_interval,
            ArchiveSettings::default().sweep_interval
        );
    }

    #[test]
    fn dev_mode_only_binds_loopback() {
        let dir = tempfile::tempdir().unwrap();
        for name in ["cert.pem", "key.pem"] {
            write_private(&dir.path().join(name));
        }
        let file = dir.path().join("agent.toml");
        std::fs::write(
            &file,
            format!(
                "export_root = {:?}\n[tls]\ncert_file = \"cert.pem\"\nkey_file = \"key.pem\"\n",
                dir.path()
            ),
        )
        .unwrap();
        let mut run = args(&file);
        run.insecure_dev_no_auth = true;
        run.listen = Some("0.0.0.0:9443".into());
        let err = AgentConfig::load(&run).unwrap_err().to_string();
        assert!(err.contains("only binds loopback"), "{err}");
        run.listen = Some("127.0.0.1:9443".into());
        assert!(AgentConfig::load(&run).unwrap().auth.disabled);
    }
}
