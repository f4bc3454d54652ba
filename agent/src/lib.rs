//! The nfsprov agent: an HTTPS service on the NFS server that creates, archives and
//! deletes volume directories beneath one export root for the cluster's controller.
//!
//! Modules depend only downward, in this order (the test suite checks it):
//!
//! 1. leaves: `mountinfo` (the kernel's mount table), `policy` (what a create may ask
//!    for), `connections` (limits on connections), `ratelimit` (of log lines), `holds`
//!    (where a debug build waits for a test), `subvolume` (what a btrfs subvolume is, for
//!    the store's records, the exports and the btrfs tool), `scope` (what one credential
//!    may reach), `private_file` (whether a file holding a credential is the agent's
//!    alone);
//! 2. `credentials` (the scoped credentials' file, watched), `quota` (the quota settings and the runner of every filesystem tool),
//!    `tls` (the server's TLS settings and its acceptor) and `root_filesystem` (whether
//!    the export root has its filesystem to itself);
//! 3. `exports`: each volume's own NFS export, through knfsd or nfs-ganesha (a btrfs
//!    volume mounted on its own for ganesha);
//! 4. `store`: the volume store, confined beneath the export root, on its backends
//!    (directories with btrfs or XFS quotas, ZFS datasets, filesystem images) and the
//!    tools each drives;
//! 5. `metrics`, `usage` (measured in the background, cached) and `condition` (each
//!    volume's condition, checked by the periodic pass and at each request);
//! 6. `archive`: how long archives are kept, and their catalog for the API and the sweep;
//!    `replication`: a snapshot's tree sent to another agent and received from one, file
//!    by file, and the receives under way;
//! 7. `config`: the settings file, checked into the settings of the layers below;
//! 8. `auth`, `logging`, `init` (first-run setup), `credential` (the command that adds,
//!    rotates and revokes scoped credentials), `jobs` (the clone, snapshot and
//!    restore jobs, and the one runner of them all), `transfers` (the grants that let
//!    another agent read one snapshot);
//! 9. `cli`: the command line;
//! 10. `api`: the HTTPS API, its routes and handlers;
//! 11. `server`: the accept loop, each connection admitted, its handshake and served.

// Reachable from outside is what the binary, the integration tests and the test crates
// use; everything else is `pub(crate)`, which the lint holds to.
#![warn(unreachable_pub)]

pub(crate) mod api;
pub mod archive;
pub(crate) mod auth;
pub mod cli;
pub(crate) mod condition;
pub mod config;
pub(crate) mod connections;

pub mod credential;
pub mod credentials;
pub mod exports;
pub(crate) mod holds;
pub mod init;
pub(crate) mod jobs;
pub(crate) mod logging;
pub(crate) mod metrics;
pub(crate) mod mountinfo;
pub mod policy;
pub(crate) mod private_file;
pub mod quota;
pub(crate) mod ratelimit;
pub mod replication;
pub(crate) mod root_filesystem;
pub mod scope;
pub(crate) mod server;
pub mod store;
pub(crate) mod subvolume;
pub(crate) mod tls;
pub(crate) mod transfers;
pub(crate) mod usage;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::api::AppState;
use crate::auth::Authenticator;
use crate::config::AgentConfig;
use crate::connections::Admission;
pub use crate::logging::init_tracing;
use crate::store::VolumeStore;

/// Why the agent could not start. Each message is one line naming the problem.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Tls(#[from] tls::TlsError),
    #[error(transparent)]
    Auth(#[from] auth::AuthSetupError),
    #[error("export root: {0}")]
    Store(#[from] store::StoreError),
    #[error("exports ({manager}): {source}")]
    Exports {
        manager: nfsprov_api_types::ExportManager,
        #[source]
        source: exports::ExportError,
    },
    #[error("quota backend {backend}: {reason}")]
    Quota {
        backend: nfsprov_api_types::QuotaBackend,
        reason: String,
    },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// An agent whose settings were checked and whose socket is bound, ready to serve.
pub struct Agent {
    config: AgentConfig,
    state: Arc<AppState>,
    tls: Arc<rustls::ServerConfig>,
    listener: std::net::TcpListener,
}

impl Agent {
    /// Checks everything that can be checked before serving: the export root, the
    /// certificates and keys, the token files, and the listen address.
    pub fn bind(config: AgentConfig) -> Result<Self, StartError> {
        let backend = store::backend_for(&config.quota, &config.export_root).map_err(|reason| {
            StartError::Quota {
                backend: config.quota.backend,
                reason,
            }
        })?;
        let store = Arc::new(
            VolumeStore::open_with_backend(&config.export_root, backend)?
                .count_provisioned(config.overcommit)?
                .count_snapshots(config.max_snapshot_bytes_per_namespace)?,
        );
        let auth = {
            let store = store.clone();
            Authenticator::new(
                &config.auth,
                Box::new(move |limits| store.prefix_tally().set_limits(limits)),
            )?
        };
        // Tokens may come from the credentials file alone; one added while the agent runs
        // needs a handshake without a certificate to arrive.
        let certificate_optional = !config.auth.tokens.is_empty()
            || config.auth.disabled
            || config.auth.credentials_file.exists();
        let tls = tls::server_config(
            &config.cert_file,
            &config.key_file,
            config.auth.client_ca_file.as_deref(),
            &config.auth.allowed_client_names,
            certificate_optional,
        )?;
        let listener =
            std::net::TcpListener::bind(config.listen).map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| StartError::Listen {
                addr: config.listen,
                source,
            })?;
        let (exports, restored) = exports::Exports::open(
            &config.exports,
            &config.export_root,
            &config.nfs_path,
            match store.backend().layout() {
                store::Layout::Directories => exports::VolumeLayout::SharedFilesystem,
                store::Layout::Mounts => exports::VolumeLayout::OwnFilesystem,
            },
            // A volume whose filesystem is not mounted is not served: its export would
            // serve the bare mountpoint, and through it the root's filesystem.
            |volume| store.get(volume).is_ok() && store.backend().is_servable(volume),
        )
        .map_err(|source| StartError::Exports {
            manager: config.exports.manager,
            source,
        })?;
        // An NFS server that started before this agent (a boot) resolved these volumes'
        // paths to the bare mountpoints beneath them: served again, it sees the mounts.
        for volume in store.backend().mounted_at_open() {
            if let Err(error) = exports.serve_again(&volume) {
                tracing::warn!(%volume, %error, "could not export a volume again after mounting it; restart the agent once the NFS server answers");
            }
        }
        if exports.kind().per_volume() && !exports.health().is_degraded() {
            tracing::info!(
                manager = %exports.kind(),
                exports = exports.len(),
                kept = restored.kept,
                added = restored.added,
                repaired = restored.repaired,
                removed = restored.removed,
                "export table restored"
            );
        }
        let root_filesystem = root_filesystem::RootFilesystem::probe(&config.export_root)
            .unwrap_or_else(|error| root_filesystem::RootFilesystem {
                mount_point: config.export_root.clone(),
                shared: Some(format!("the mount table could not be read: {error}")),
            });
        if let Some(why) = &root_filesystem.shared {
            // A warning, never a refusal to start: an upgraded agent keeps serving the
            // volumes it has; only new per-volume exports wait for the operator.
            tracing::warn!(
                export_root = %config.export_root.display(),
                mount_point = %root_filesystem.mount_point.display(),
                per_volume_exports = exports.kind().per_volume(),
                allowed = config.exports.allow_shared_filesystem,
                "the export root shares its filesystem ({why}): a client that forges NFS file handles can reach everything on that filesystem; give the export root a filesystem of its own"
            );
        }
        let state = Arc::new(
            AppState::new(store, auth, &config)
                .with_exports(Arc::new(exports))
                .with_root_filesystem(root_filesystem),
        );
        state
            .metrics
            .stale_records_removed
            .inc_by(state.store.stale_records_removed() as u64);
        state
            .metrics
            .exports
            .repaired
            .inc_by((restored.added + restored.repaired + restored.removed) as u64);
        // Exports a start served again were lost by the NFS server while the agent was
        // away: reported as repairs like those of a pass.
        let now = std::time::SystemTime::now();
        let start = exports::Pass {
            exports: Some(Ok(restored)),
            started_at: now,
            compared_at: now,
            took: std::time::Duration::ZERO,
        };
        state
            .conditions
            .note_repairs(condition::repairs_of(&start, |path| {
                state
                    .exports
                    .get(path)
                    .map_or_else(|| path.to_string(), |export| export.path)
            }));
        Ok(Self {
            config,
            state,
            tls,
            listener,
        })
    }

    /// The bound address (useful when the port was 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.config.listen)
    }

    /// Serves until `shutdown` completes, then lets in-flight requests finish (up to the
    /// configured grace period).
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        let store = self.state.store.clone();
        // Trash and staging left by a crash are purged in the background: the API is
        // already consistent without it (those areas are invisible to it).
        tokio::task::spawn_blocking(move || {
            let purge = store.purge_leftovers();
            if purge.removed > 0 {
                tracing::info!(
                    entries = purge.removed,
                    "purged leftovers of an interrupted run"
                );
            }
            for (entry, error) in &purge.failed {
                tracing::error!(%entry, %error, "could not purge a leftover of an interrupted run; it stays until the next start");
            }
        });
        let reconciler = self.spawn_periodic_pass();
        let app = api::router(self.state.clone(), self.config.max_concurrent_requests);
        tracing::info!(
            addr = %self.local_addr(),
            export_root = %self.config.export_root.display(),
            mtls = self.config.auth.client_ca_file.is_some(),
            tokens = self.config.auth.tokens.len(),
            quota = %self.state.store.backend().kind(),
            archive_retention_seconds = self
                .config
                .archive
                .default_retention
                .map(|d| d.as_secs()),
            archive_sweep_seconds = self.config.archive.sweep_interval.as_secs(),
            "agent listening"
        );
        if self.config.auth.disabled {
            tracing::warn!("authentication is DISABLED (development mode, loopback only)");
        }
        let admission = Admission::new(
            self.config.admission(),
            self.state.metrics.connections.clone(),
        );
        let listener = tokio::net::TcpListener::from_std(self.listener)?;
        // Stopped with the server: a sweep never outlives the agent that started it.
        let sweeper = tokio::spawn(self.state.archives.clone().sweep_forever());
        server::serve(
            listener,
            self.tls,
            admission,
            app,
            self.config.header_read_timeout,
            shutdown,
            self.config.shutdown_grace,
        )
        .await;
        sweeper.abort();
        reconciler.abort();
        Ok(())
    }

    /// The agent's one periodic pass: the export comparison and repair of an agent that
    /// manages exports (counted in the metrics), then every volume's condition.
    fn spawn_periodic_pass(&self) -> tokio::task::JoinHandle<()> {
        let exports = self.state.exports.clone();
        let metrics = self.state.metrics.exports.clone();
        let reconciler = exports::Reconciler::new(exports, self.config.exports.reconcile_interval)
            .with_step(condition::step(&self.state.conditions));
        reconciler.spawn(move |pass| {
            metrics.repaired.inc_by(pass.repairs() as u64);
            if pass.failed() {
                metrics.failed_passes.inc();
            }
        })
    }
}

/// Completes on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = terminate => {}
    }
}
