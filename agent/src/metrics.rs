//! Prometheus metrics of the agent (`/metrics`, authenticated).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use std::sync::atomic::AtomicU64;

use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::connections::ConnectionMetrics;
use crate::store::CopyProgress;

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RequestLabels {
    /// A known method or `other`: never what a client sent.
    pub method: &'static str,
    /// The endpoint table's template of the route (`/v1/volumes/{*path}`, see
    /// `nfsprov_api_types::Endpoint::template`) or `unmatched`, never the concrete path,
    /// to bound the number of series.
    pub route: &'static str,
    pub status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RouteLabels {
    pub method: &'static str,
    pub route: &'static str,
}

/// The namespace of a claim, as the controller recorded it on its volume (empty for
/// volumes made without an owner). Names of the cluster, never of files.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct NamespaceLabels {
    pub namespace: String,
}

/// The name of the credential a request came with: a name from the agent's settings or
/// its credentials file, or of a certificate its CA signed.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CredentialLabels {
    pub credential: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// What the archive listing and the retention sweep report.
#[derive(Debug, Clone, Default)]
pub(crate) struct ArchiveMetrics {
    /// Archives at the last listing or sweep.
    pub count: Gauge,
    /// Their bytes as of the last measurement of each.
    pub bytes: Gauge,
    /// Archives deleted because their retention ran out.
    pub expired: Counter,
    /// Deletions of an archive (asked for or by retention) that failed.
    pub deletion_failures: Counter,
}

/// The export reconciler's figures (see `exports::Reconciler`).
#[derive(Debug, Clone, Default)]
pub(crate) struct ExportMetrics {
    /// 1 while the NFS server does not serve the table as far as the agent knows.
    pub degraded: Gauge,
    /// Exports the reconciler added, set back or withdrawn on the server.
    pub repaired: Counter,
    /// Reconciliation passes that could not finish.
    pub failed_passes: Counter,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ConditionLabels {
    pub reason: &'static str,
}

/// What each pass's check of the volumes' conditions found (see `condition`).
#[derive(Debug, Clone)]
pub(crate) struct ConditionMetrics {
    /// Volumes abnormal at the last pass, by reason (every reason present, 0 included).
    pub abnormal: Family<ConditionLabels, Gauge>,
    /// Volumes the last pass checked.
    pub volumes: Gauge,
    /// How long each pass's check of every volume took.
    pub pass_seconds: Histogram,
}

impl Default for ConditionMetrics {
    fn default() -> Self {
        Self {
            abnormal: Family::default(),
            volumes: Gauge::default(),
            pass_seconds: Histogram::new([
                0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloneLabels {
    pub method: &'static str,
}

/// What clones report: how many, by which method, and how far the copies in flight are.
#[derive(Debug, Clone, Default)]
pub(crate) struct CloneMetrics {
    /// Clones finished, by method.
    pub made: Family<CloneLabels, Counter>,
    /// Clones that failed to be made.
    pub failed: Counter,
    /// Clone jobs running now (holding a slot and the locks of their paths).
    pub in_progress: Gauge,
    /// Clone jobs waiting for a slot now.
    pub queued: Gauge,
    /// Clone jobs that had to wait for a slot.
    pub waited: Counter,
    /// Clone jobs allowed to run at once.
    pub slots: Gauge,
    /// Updated by the copies themselves.
    pub copy: CopyProgress,
}

/// A restore: what kind of source it was made from (`snapshot`, `archive`), and how.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct RestoreLabels {
    pub source: &'static str,
    pub method: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SnapshotLabels {
    pub method: &'static str,
}

/// What snapshots and restores report: how many, by which method, and how far the
/// copies in flight are.
#[derive(Debug, Clone, Default)]
pub(crate) struct SnapshotMetrics {
    /// Snapshots made, by method.
    pub made: Family<SnapshotLabels, Counter>,
    /// Snapshots that failed to be made.
    pub failed: Counter,
    /// Snapshot and restore jobs running now.
    pub in_progress: Gauge,
    /// Bytes of file data the snapshots made held when made.
    pub bytes: Counter,
    /// Volumes restored from snapshots and archives, by source kind and method.
    pub restored: Family<RestoreLabels, Counter>,
    /// Restores that failed.
    pub restores_failed: Counter,
    /// Updated by the copies themselves.
    pub copy: CopyProgress,
}

/// A kind of job: `clone`, `snapshot` or `restore`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct JobLabels {
    pub kind: &'static str,
}

/// The queues of the jobs that outlive their requests, by kind.
#[derive(Debug, Clone, Default)]
pub(crate) struct JobMetrics {
    /// Jobs admitted that wait for a slot now.
    pub queued: Family<JobLabels, Gauge>,
    /// Jobs holding a slot now.
    pub running: Family<JobLabels, Gauge>,
    /// Requests refused because as many jobs waited as allowed.
    pub refused: Family<JobLabels, Counter>,
    /// Jobs allowed to wait at once.
    pub limit: Family<JobLabels, Gauge>,
}

#[derive(Debug)]
pub(crate) struct Metrics {
    registry: Registry,
    pub requests: Family<RequestLabels, Counter>,
    pub request_duration: Family<RouteLabels, Histogram>,
    pub operations: Family<OperationLabels, Counter>,
    /// Requests refused because they reached outside their credential's scope.
    pub refused_out_of_scope: Family<CredentialLabels, Counter>,
    /// The live volumes beneath each scoped credential's prefix, and their capacity.
    pub credential_volumes: Family<CredentialLabels, Gauge>,
    pub credential_bytes: Family<CredentialLabels, Gauge>,
    /// Each credential's `max_volumes` and `max_bytes`, where it has them.
    pub credential_volumes_limit: Family<CredentialLabels, Gauge>,
    pub credential_bytes_limit: Family<CredentialLabels, Gauge>,
    /// Each credential's clones, snapshots and restores admitted, and its `max_jobs`.
    pub credential_jobs: Family<CredentialLabels, Gauge>,
    pub credential_jobs_limit: Family<CredentialLabels, Gauge>,
    pub filesystem_available_bytes: Gauge,
    pub filesystem_free_inodes: Gauge,
    /// The capacity promised to the live volumes.
    pub provisioned_bytes: Gauge,
    /// `provisioned_bytes` over the filesystem's size.
    pub overcommit_ratio: Gauge<f64, AtomicU64>,
    /// `limits.overcommit_warn_ratio`, so an alert compares each agent with its own.
    pub overcommit_warn_ratio: Gauge<f64, AtomicU64>,
    /// What each namespace's snapshots hold at most (`SnapshotBudget`).
    pub namespace_snapshot_bytes: Family<NamespaceLabels, Gauge>,
    /// `limits.max_snapshot_bytes_per_namespace`, 0 when unset.
    pub namespace_snapshot_bytes_limit: Gauge,
    pub leftover_entries: Gauge,
    /// Records of volumes found gone at start (a deletion a crash interrupted), removed.
    pub stale_records_removed: Counter,
    /// 1 when the export root shares its filesystem with anything else.
    pub export_root_shared: Gauge,
    pub archives: ArchiveMetrics,
    pub clones: CloneMetrics,
    pub snapshots: SnapshotMetrics,
    pub connections: ConnectionMetrics,
    pub exports: ExportMetrics,
    pub conditions: ConditionMetrics,
    pub jobs: JobMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub(crate) fn new() -> Self {
        let mut registry = Registry::with_prefix("nfsprov_agent");
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register("http_requests", "HTTP requests answered", requests.clone());
        let request_duration = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([
                0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0,
                60.0,
            ])
        });
        registry.register(
            "http_request_duration_seconds",
            "Time to answer HTTP requests",
            request_duration.clone(),
        );
        let operations = Family::<OperationLabels, Counter>::default();
        registry.register(
            "volume_operations",
            "Volume operations by kind and outcome",
            operations.clone(),
        );
        let filesystem_available_bytes = Gauge::default();
        registry.register(
            "filesystem_available_bytes",
            "Bytes available on the export root's filesystem at the last scrape",
            filesystem_available_bytes.clone(),
        );
        let filesystem_free_inodes = Gauge::default();
        registry.register(
            "filesystem_free_inodes",
            "Free inodes on the export root's filesystem at the last scrape",
            filesystem_free_inodes.clone(),
        );
        let provisioned_bytes = Gauge::default();
        registry.register(
            "provisioned_bytes",
            "Capacity promised to the live volumes (the sum of their capacities; archives and snapshots not counted) at the last scrape",
            provisioned_bytes.clone(),
        );
        let overcommit_ratio = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "overcommit_ratio",
            "Provisioned bytes over the size of the export root's filesystem at the last scrape; past 1 the volumes are promised more than the filesystem holds",
            overcommit_ratio.clone(),
        );
        let overcommit_warn_ratio = Gauge::<f64, AtomicU64>::default();
        registry.register(
            "overcommit_warn_ratio",
            "The overcommit ratio past which the agent warns: limits.overcommit_warn_ratio",
            overcommit_warn_ratio.clone(),
        );
        // Not `snapshot_bytes`: that is the counter of what snapshots held when made, and
        // two families of one name make a scrape no parser accepts.
        let refused_out_of_scope = Family::<CredentialLabels, Counter>::default();
        registry.register(
            "refused_out_of_scope",
            "Requests refused because they reached outside their credential's scope (another prefix, an operation or export client it may not ask for), by credential",
            refused_out_of_scope.clone(),
        );
        let credential_volumes = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_volumes",
            "Live volumes beneath each scoped credential's prefix at the last scrape",
            credential_volumes.clone(),
        );
        let credential_bytes = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_bytes",
            "Capacity of the live volumes beneath each scoped credential's prefix at the last scrape",
            credential_bytes.clone(),
        );
        let credential_volumes_limit = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_volumes_limit",
            "Each credential's max_volumes, where it has one",
            credential_volumes_limit.clone(),
        );
        let credential_bytes_limit = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_bytes_limit",
            "Each credential's max_bytes, where it has one",
            credential_bytes_limit.clone(),
        );
        let credential_jobs = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_jobs",
            "Clones, snapshots and restores admitted (waiting or running) of each credential with a max_jobs",
            credential_jobs.clone(),
        );
        let credential_jobs_limit = Family::<CredentialLabels, Gauge>::default();
        registry.register(
            "credential_jobs_limit",
            "Each credential's max_jobs, as its last request came with it",
            credential_jobs_limit.clone(),
        );
        let namespace_snapshot_bytes = Family::<NamespaceLabels, Gauge>::default();
        registry.register(
            "namespace_snapshot_bytes",
            "Bytes the snapshots of each namespace hold at most (what each referenced when taken) at the last scrape",
            namespace_snapshot_bytes.clone(),
        );
        let namespace_snapshot_bytes_limit = Gauge::default();
        registry.register(
            "namespace_snapshot_bytes_limit",
            "limits.max_snapshot_bytes_per_namespace: the bytes one namespace's snapshots may hold; 0 when unset",
            namespace_snapshot_bytes_limit.clone(),
        );
        let leftover_entries = Gauge::default();
        registry.register(
            "leftover_entries",
            "Entries in the staging and trash areas at the last scrape: work in flight, or leftovers that could not be removed (the log names them)",
            leftover_entries.clone(),
        );
        let stale_records_removed = Counter::default();
        registry.register(
            "stale_records_removed",
            "Records of volumes found gone at start (a deletion interrupted by a crash) and removed, their quotas released",
            stale_records_removed.clone(),
        );
        let export_root_shared = Gauge::default();
        registry.register(
            "export_root_shared_filesystem",
            "1 when the export root shares its filesystem with other data (a client forging NFS file handles can reach that data); 0 when the filesystem is its own",
            export_root_shared.clone(),
        );
        let archives = ArchiveMetrics::default();
        registry.register(
            "archives",
            "Archives beneath the export root at the last listing or retention sweep",
            archives.count.clone(),
        );
        registry.register(
            "archive_bytes",
            "Bytes the archives use, as of the last measurement of each (measured at most hourly)",
            archives.bytes.clone(),
        );
        registry.register(
            "archives_expired",
            "Archives deleted because their retention ran out",
            archives.expired.clone(),
        );
        registry.register(
            "archive_deletions_failed",
            "Deletions of an archive, asked for or by retention, that failed (the log names them)",
            archives.deletion_failures.clone(),
        );
        let clones = CloneMetrics::default();
        registry.register(
            "clones",
            "Clones made, by method (btrfs-snapshot, zfs-clone, reflink, copy)",
            clones.made.clone(),
        );
        registry.register(
            "clones_failed",
            "Clones that could not be made (the log says why)",
            clones.failed.clone(),
        );
        registry.register(
            "clones_in_progress",
            "Clones being made now",
            clones.in_progress.clone(),
        );
        registry.register(
            "clone_jobs_queued",
            "Clone jobs waiting for a slot now (their requests were answered 202 Accepted)",
            clones.queued.clone(),
        );
        registry.register(
            "clone_jobs_waited",
            "Clone jobs that had to wait for a slot because as many as allowed were running",
            clones.waited.clone(),
        );
        registry.register(
            "clone_job_slots",
            "Clone jobs allowed to run at once: limits.max_clone_jobs, or fewer where the descriptor limit cannot hold that many",
            clones.slots.clone(),
        );
        register_copy_progress(&mut registry, "clone", "clones", "copies", &clones.copy);
        let snapshots = SnapshotMetrics::default();
        registry.register(
            "snapshots",
            "Snapshots made, by method (btrfs-snapshot, reflink, copy)",
            snapshots.made.clone(),
        );
        registry.register(
            "snapshots_failed",
            "Snapshots that could not be made (the log says why)",
            snapshots.failed.clone(),
        );
        registry.register(
            "snapshot_jobs_in_progress",
            "Snapshots and restores being made now",
            snapshots.in_progress.clone(),
        );
        registry.register(
            "snapshot_bytes",
            "Bytes of file data the snapshots made held when they were made",
            snapshots.bytes.clone(),
        );
        registry.register(
            "restores",
            "Volumes restored, by source (snapshot, archive) and method (btrfs-snapshot, zfs-clone, reflink, copy)",
            snapshots.restored.clone(),
        );
        registry.register(
            "restores_failed",
            "Restores from snapshots or archives that could not be made (the log says why)",
            snapshots.restores_failed.clone(),
        );
        register_copy_progress(
            &mut registry,
            "snapshot",
            "snapshots and restores",
            "snapshot and restore copies",
            &snapshots.copy,
        );
        let connections = ConnectionMetrics::default();
        registry.register(
            "connections",
            "Connections open now, by stage: handshake (TLS in progress), unauthenticated, authenticated",
            connections.open.clone(),
        );
        registry.register(
            "connections_closed",
            "Connections the agent refused or closed to keep its connection budgets, by reason",
            connections.closed.clone(),
        );
        let exports = ExportMetrics::default();
        registry.register(
            "exports_degraded",
            "1 while the NFS server may not serve every export the agent recorded (it did not answer or refused; the reconciler repairs the exports when it answers), else 0",
            exports.degraded.clone(),
        );
        registry.register(
            "exports_repaired",
            "Exports the reconciler added, set back or withdrawn on the NFS server to match the agent's records",
            exports.repaired.clone(),
        );
        registry.register(
            "export_reconcile_failures",
            "Passes of the export reconciler that could not finish (the NFS server or its bus did not answer, or refused)",
            exports.failed_passes.clone(),
        );
        let conditions = ConditionMetrics::default();
        registry.register(
            "volumes_abnormal",
            "Volumes whose condition was abnormal at the agent's last periodic pass, by reason (missing, not_exported, read_only, quota_full, filesystem_error)",
            conditions.abnormal.clone(),
        );
        registry.register(
            "volumes_checked",
            "Volumes whose condition the agent's last periodic pass checked",
            conditions.volumes.clone(),
        );
        registry.register(
            "volume_check_duration_seconds",
            "Time each periodic pass took to check every volume's condition",
            conditions.pass_seconds.clone(),
        );
        let jobs = JobMetrics::default();
        registry.register(
            "jobs_queued",
            "Clone, snapshot and restore jobs waiting for a slot now, by kind (their requests were answered 202 Accepted)",
            jobs.queued.clone(),
        );
        registry.register(
            "jobs_running",
            "Clone, snapshot and restore jobs holding a slot now, by kind",
            jobs.running.clone(),
        );
        registry.register(
            "jobs_refused",
            "Requests for a new job refused with 429 because limits.max_queued_jobs jobs of its kind waited already",
            jobs.refused.clone(),
        );
        registry.register(
            "job_queue_limit",
            "Jobs of each kind allowed to wait for a slot at once: limits.max_queued_jobs",
            jobs.limit.clone(),
        );
        Self {
            clones,
            snapshots,
            connections,
            exports,
            conditions,
            jobs,
            registry,
            requests,
            request_duration,
            operations,
            filesystem_available_bytes,
            filesystem_free_inodes,
            provisioned_bytes,
            overcommit_ratio,
            overcommit_warn_ratio,
            namespace_snapshot_bytes,
            namespace_snapshot_bytes_limit,
            refused_out_of_scope,
            credential_volumes,
            credential_bytes,
            credential_volumes_limit,
            credential_bytes_limit,
            credential_jobs,
            credential_jobs_limit,
            leftover_entries,
            stale_records_removed,
            export_root_shared,
            archives,
        }
    }

    pub(crate) fn count_operation(&self, operation: &'static str, outcome: &'static str) {
        self.operations
            .get_or_create(&OperationLabels { operation, outcome })
            .inc();
    }

    /// The text exposition format.
    pub(crate) fn encode(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// Registers the progress of one kind of copy as `<prefix>_copied_bytes`,
/// `<prefix>_copied_files` and `<prefix>_pending_bytes`, made by `makers` (who copy a
/// tree) and in flight as `copies`.
fn register_copy_progress(
    registry: &mut Registry,
    prefix: &str,
    makers: &str,
    copies: &str,
    progress: &CopyProgress,
) {
    registry.register(
        format!("{prefix}_copied_bytes"),
        format!("Bytes of file data copied or reflinked by {makers} that copy their tree"),
        progress.copied_bytes.clone(),
    );
    registry.register(
        format!("{prefix}_copied_files"),
        format!("Regular files copied or reflinked by {makers} that copy their tree"),
        progress.copied_files.clone(),
    );
    registry.register(
        format!("{prefix}_pending_bytes"),
        format!("Bytes of file data that the {copies} in flight have found but not copied yet"),
        progress.pending_bytes.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The copy-progress metrics of clones and of snapshots are read by the dashboard,
    /// the alerts and the docs under these names and help texts.
    #[test]
    fn the_copy_progress_metrics_keep_their_names_and_help() {
        let metrics = Metrics::new();
        metrics.clones.copy.copied_bytes.inc_by(3);
        metrics.snapshots.copy.pending_bytes.set(5);
        let text = metrics.encode();
        for line in [
            "# HELP nfsprov_agent_clone_copied_bytes Bytes of file data copied or reflinked by clones that copy their tree.",
            "# TYPE nfsprov_agent_clone_copied_bytes counter",
            "nfsprov_agent_clone_copied_bytes_total 3",
            "# HELP nfsprov_agent_clone_copied_files Regular files copied or reflinked by clones that copy their tree.",
            "nfsprov_agent_clone_copied_files_total 0",
            "# HELP nfsprov_agent_clone_pending_bytes Bytes of file data that the copies in flight have found but not copied yet.",
            "nfsprov_agent_clone_pending_bytes 0",
            "# HELP nfsprov_agent_snapshot_copied_bytes Bytes of file data copied or reflinked by snapshots and restores that copy their tree.",
            "nfsprov_agent_snapshot_copied_bytes_total 0",
            "# HELP nfsprov_agent_snapshot_copied_files Regular files copied or reflinked by snapshots and restores that copy their tree.",
            "nfsprov_agent_snapshot_copied_files_total 0",
            "# HELP nfsprov_agent_snapshot_pending_bytes Bytes of file data that the snapshot and restore copies in flight have found but not copied yet.",
            "# TYPE nfsprov_agent_snapshot_pending_bytes gauge",
            "nfsprov_agent_snapshot_pending_bytes 5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
    }
}
