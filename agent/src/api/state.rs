//! What the handlers share, and the readiness verdict.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfsprov_api_types::NfsExport;
use tokio::sync::Semaphore;

use crate::archive::catalog::Archives;
use crate::auth::Authenticator;
use crate::condition::Conditions;
use crate::config::AgentConfig;
use crate::exports::{ExportHealth, Exports};
use crate::jobs::{Clones, JobRunner, JobShares, Snapshots};
use crate::metrics::Metrics;
use crate::policy::Policy;
use crate::ratelimit::RateLimit;
use crate::replication::jobs::ReplicaJobs;
use crate::root_filesystem::RootFilesystem;
use crate::store::VolumeStore;
use crate::usage::UsageCache;

/// What the handlers share.
#[derive(Debug)]
pub(crate) struct AppState {
    pub(crate) store: Arc<VolumeStore>,
    pub(crate) auth: Authenticator,
    pub(crate) metrics: Metrics,
    pub(crate) nfs: NfsExport,
    pub(crate) min_free_bytes: u64,
    pub(crate) min_free_inodes: u64,
    pub(crate) request_timeout: Duration,
    /// Longest wait for a request's body.
    pub(crate) body_read_timeout: Duration,
    /// Largest request body accepted.
    pub(crate) max_body_bytes: usize,
    /// What a create may ask for.
    pub(crate) policy: Policy,
    /// The archives, for the archive endpoints and the retention sweep.
    pub(crate) archives: Arc<Archives>,
    /// The clones being made.
    pub(crate) clones: Clones,
    /// The snapshots and restores being made.
    pub(crate) snapshots: Snapshots,
    /// Each credential's share of those jobs, where it has a `max_jobs`.
    pub(crate) job_shares: JobShares,
    /// The replicas being received from other agents.
    pub(super) replicas: ReplicaJobs,
    /// Who each volume is exported to.
    pub(crate) exports: Arc<Exports>,
    /// Whether the export root has its filesystem to itself.
    pub(crate) root_filesystem: RootFilesystem,
    /// New per-volume exports on a shared filesystem (`exports.allow_shared_filesystem`).
    pub(super) allow_shared_filesystem: bool,
    /// New per-volume exports where volumes share a filesystem (`exports.mount_control_only`).
    pub(super) mount_control_only: bool,
    pub(super) usage: Arc<UsageCache>,
    /// How old a usage figure of a volume whose capacity is enforced may be when a GET
    /// answers with it: no older than the periodic pass, so that a quota that filled is
    /// reported as promptly as any other condition.
    pub(super) quota_usage_fresh_for: Duration,
    /// Each volume's condition, as the periodic pass and each request find it.
    pub(crate) conditions: Arc<Conditions>,
    pub(super) readiness: Mutex<Option<(Instant, Result<(), String>)>>,
    /// Audit lines of unauthenticated requests allowed per second.
    pub(super) unauthenticated_log: RateLimit,
    /// Bodies of refused requests being drained at once (see
    /// [`authenticate`](super::middleware::authenticate)).
    pub(super) refused_drains: Arc<Semaphore>,
}

/// How long a usage figure is served before it is measured again: a figure up to a
/// minute old is good enough for capacity dashboards.
const USAGE_FRESH_FOR: Duration = Duration::from_secs(60);

/// The most bodies of refused requests drained at once: past it, a refused body is dropped
/// at once (the client of a flood may then see a reset instead of its 401).
const MAX_REFUSED_DRAINS: usize = 1024;

impl AppState {
    /// The state for `config`'s agent, serving `store` and checking callers with `auth`.
    pub(crate) fn new(store: Arc<VolumeStore>, auth: Authenticator, config: &AgentConfig) -> Self {
        let metrics = Metrics::new();
        let job_runner = JobRunner::new(config, &metrics);
        // The first request for a volume waits a little for a fresh figure.
        let usage = Arc::new(UsageCache::new(USAGE_FRESH_FOR, Duration::from_secs(2), 2));
        let exports = Arc::new(Exports::none(&config.nfs_path));
        let conditions = Arc::new(Conditions::new(
            store.clone(),
            exports.clone(),
            usage.clone(),
            metrics.conditions.clone(),
        ));
        Self {
            archives: Arc::new(Archives::new(
                store.clone(),
                config.archive.clone(),
                metrics.archives.clone(),
            )),
            snapshots: Snapshots::new(store.clone(), metrics.snapshots.clone(), &job_runner),
            clones: Clones::new(store.clone(), metrics.clones.clone(), &job_runner),
            job_shares: JobShares::default(),
            exports,
            conditions,
            root_filesystem: RootFilesystem {
                mount_point: config.export_root.clone(),
                shared: None,
            },
            allow_shared_filesystem: config.exports.allow_shared_filesystem,
            mount_control_only: config.exports.mount_control_only,
            store,
            auth,
            metrics,
            nfs: NfsExport {
                server: config.nfs_server.clone(),
                path: config.nfs_path.clone(),
            },
            min_free_bytes: config.min_free_bytes,
            min_free_inodes: config.min_free_inodes,
            request_timeout: config.request_timeout,
            body_read_timeout: config.body_read_timeout,
            max_body_bytes: config.max_body_bytes,
            policy: config.policy.clone(),
            usage,
            quota_usage_fresh_for: config.exports.reconcile_interval.min(USAGE_FRESH_FOR),
            readiness: Mutex::new(None),
            replicas: ReplicaJobs::default(),
            unauthenticated_log: RateLimit::new(20, "unauthenticated requests"),
            refused_drains: Arc::new(Semaphore::new(MAX_REFUSED_DRAINS)),
        }
    }

    /// The state with `exports` managing the volumes' exports.
    pub(crate) fn with_exports(mut self, exports: Arc<Exports>) -> Self {
        self.conditions = Arc::new(Conditions::new(
            self.store.clone(),
            exports.clone(),
            self.usage.clone(),
            self.metrics.conditions.clone(),
        ));
        self.exports = exports;
        self
    }

    /// The state with the export root's filesystem as found at start.
    pub(crate) fn with_root_filesystem(self, root_filesystem: RootFilesystem) -> Self {
        self.metrics
            .export_root_shared
            .set(i64::from(root_filesystem.is_shared()));
        Self {
            root_filesystem,
            ..self
        }
    }

    /// The readiness verdict, re-checked at most once a second: `/readyz` is
    /// unauthenticated and must not let anyone drive filesystem work by polling it.
    pub(super) async fn readiness(self: &Arc<Self>) -> Result<(), String> {
        if let Some((at, verdict)) = self
            .readiness
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            && at.elapsed() < Duration::from_secs(1)
        {
            return verdict.clone();
        }
        let state = self.clone();
        let verdict = tokio::task::spawn_blocking(move || {
            state
                .store
                .readiness(state.min_free_bytes, state.min_free_inodes)
        })
        .await
        .unwrap_or_else(|e| Err(format!("readiness check failed: {e}")))
        .and_then(|()| self.exports_readiness());
        *self.readiness.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((Instant::now(), verdict.clone()));
        verdict
    }
}

impl AppState {
    /// Not ready while the exports are degraded: the volumes' API still serves, but a
    /// volume may not be mountable until the reconciler has repaired its export.
    fn exports_readiness(&self) -> Result<(), String> {
        match &*self.exports.health() {
            ExportHealth::Serving => Ok(()),
            ExportHealth::Degraded { reason, since } => Err(format!(
                "exports degraded for {}s: {reason}",
                since.elapsed().as_secs()
            )),
        }
    }
}
