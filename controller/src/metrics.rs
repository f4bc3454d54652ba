//! Prometheus metrics. The claim and volume metrics keep the names of
//! sig-storage-lib-external-provisioner so existing dashboards carry over; the per-claim
//! usage gauges carry the `namespace` and `persistentvolumeclaim` labels of kubelet's
//! `kubelet_volume_stats_*`, so the same queries and alerts work for NFS volumes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `operation` label values of `nfsprov_snapshot_failures_total`: taking a snapshot
/// on its agent, and deleting it there.
pub(crate) const SNAPSHOT_OPERATIONS: [&str; 2] = ["create", "delete"];

/// Where a Snapshot stands, as the `state` label of `nfsprov_snapshots`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SnapshotState {
    Pending,
    Ready,
    Failed,
}

impl SnapshotState {
    fn label(self) -> &'static str {
        match self {
            SnapshotState::Pending => "pending",
            SnapshotState::Ready => "ready",
            SnapshotState::Failed => "failed",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StateLabels {
    pub(crate) state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OperationLabels {
    pub(crate) operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ScheduleLabels {
    pub(crate) namespace: String,
    pub(crate) schedule: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ClassLabels {
    pub(crate) class: String,
}

/// The provisioning metrics' labels, as the library has them: the class and the kind of
/// the claim's data source (empty for a new, empty volume).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct ProvisionLabels {
    pub(crate) class: String,
    pub(crate) source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AgentLabels {
    pub(crate) agent: String,
    pub(crate) operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AgentErrorLabels {
    pub(crate) agent: String,
    pub(crate) operation: String,
    pub(crate) code: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct SecretLabels {
    pub(crate) secret: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct OrphanLabels {
    pub(crate) agent: String,
}

/// One claim's volume. `agent` adds no cardinality (a volume lives on one agent) and lets
/// dashboards group by NFS server.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct VolumeLabels {
    pub(crate) namespace: String,
    pub(crate) persistentvolumeclaim: String,
    pub(crate) agent: String,
}

/// The last figures of one claim's volume.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct VolumeFigures {
    pub(crate) capacity_bytes: u64,
    /// Bytes and inodes used: `None` until the agent has measured the tree once.
    pub(crate) used: Option<(u64, u64)>,
}

/// The per-claim usage gauges: one map by PV name, encoded as the three `nfsprov_volume_*`
/// families at scrape time. Three labelled families would hold every claim's labels three
/// times over, plus a gauge allocation each; at 10,000 claims that was a large share of the
/// controller's memory.
#[derive(Debug, Default)]
struct VolumeUsage(RwLock<HashMap<String, (VolumeLabels, VolumeFigures)>>);

/// One usage family: its name, its help, and its figure of a volume (none until measured).
type UsageFamily = (
    &'static str,
    &'static str,
    fn(&VolumeFigures) -> Option<u64>,
);

const USAGE_FAMILIES: [UsageFamily; 3] = [
    (
        "nfsprov_volume_used_bytes",
        "Bytes used by the claim's volume, as measured by its agent",
        |figures| figures.used.map(|(bytes, _)| bytes),
    ),
    (
        "nfsprov_volume_capacity_bytes",
        "Capacity of the claim's volume, as recorded by its agent",
        |figures| Some(figures.capacity_bytes),
    ),
    (
        "nfsprov_volume_used_inodes",
        "Inodes used by the claim's volume, as measured by its agent",
        |figures| figures.used.map(|(_, inodes)| inodes),
    ),
];

impl Collector for VolumeUsage {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let volumes = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        for (name, help, figure) in USAGE_FAMILIES {
            let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
            for (labels, figures) in volumes.values() {
                if let Some(value) = figure(figures) {
                    ConstGauge::new(value).encode(metric.encode_family(labels)?)?;
                }
            }
        }
        Ok(())
    }
}

/// `nfsprov_volume_abnormal`: claims whose volume is abnormal, by agent and reason, as the
/// last usage and health poll left them. Replaced whole at each poll, so a scrape never
/// sees half of one poll's figures.
#[derive(Debug, Default)]
struct VolumeAbnormal(RwLock<Vec<(AbnormalLabels, u64)>>);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct AbnormalLabels {
    pub(crate) agent: String,
    pub(crate) reason: String,
}

impl Collector for VolumeAbnormal {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let counts = self
            .0
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut metric = encoder.encode_descriptor(
            "nfsprov_volume_abnormal",
            "Claims whose volume is abnormal (missing, not_exported, read_only, quota_full, filesystem_error, agent_unreachable), by agent and reason, at the last usage and health poll",
            None,
            MetricType::Gauge,
        )?;
        for (labels, count) in counts.iter() {
            ConstGauge::new(*count).encode(metric.encode_family(labels)?)?;
        }
        Ok(())
    }
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// The library's provisioning and deletion latency buckets: Prometheus' default ones, so
/// dashboards made for it read ours unchanged.
fn library_histogram() -> Histogram {
    Histogram::new([
        0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    ])
}

fn operation_histogram() -> Histogram {
    // 5 ms .. ~80 s: covers a local mkdir as well as a slow archive of a large tree.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

pub struct Metrics {
    registry: Registry,
    provision_total: Family<ProvisionLabels, Counter>,
    provision_failed: Family<ProvisionLabels, Counter>,
    provision_duration: HistogramFamily<ProvisionLabels>,
    delete_total: Family<ClassLabels, Counter>,
    delete_failed: Family<ClassLabels, Counter>,
    delete_duration: HistogramFamily<ClassLabels>,
    agent_duration: HistogramFamily<AgentLabels>,
    agent_errors: Family<AgentErrorLabels, Counter>,
    volume_usage: Arc<VolumeUsage>,
    volume_abnormal: Arc<VolumeAbnormal>,
    orphaned_directories: Family<OrphanLabels, Gauge>,
    missing_directories: Family<OrphanLabels, Gauge>,
    orphans_archived: Family<OrphanLabels, Counter>,
    invalid_agent_secrets: Family<SecretLabels, Gauge>,
    configured_agents: Family<OrphanLabels, Gauge>,
    agents_loaded: Family<OrphanLabels, Counter>,
    exports_updated: Family<OrphanLabels, Counter>,
    export_update_failures: Family<OrphanLabels, Counter>,
    snapshots: Family<StateLabels, Gauge>,
    /// The state each Snapshot was last counted in, by its key, so a change moves it
    /// from one count to the other and a deleted one leaves its count.
    snapshot_states: Mutex<HashMap<String, SnapshotState>>,
    snapshot_failures: Family<OperationLabels, Counter>,
    schedule_lag: Family<ScheduleLabels, Gauge<f64, std::sync::atomic::AtomicU64>>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Metrics")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let provision_total = Family::<ProvisionLabels, Counter>::default();
        let provision_failed = Family::<ProvisionLabels, Counter>::default();
        let provision_duration =
            HistogramFamily::new_with_constructor(library_histogram as fn() -> _);
        let delete_total = Family::<ClassLabels, Counter>::default();
        let delete_failed = Family::<ClassLabels, Counter>::default();
        let delete_duration = HistogramFamily::new_with_constructor(library_histogram as fn() -> _);
        let agent_duration =
            HistogramFamily::new_with_constructor(operation_histogram as fn() -> _);
        let agent_errors = Family::<AgentErrorLabels, Counter>::default();
        let volume_usage = Arc::new(VolumeUsage::default());
        let volume_abnormal = Arc::new(VolumeAbnormal::default());
        let orphaned_directories = Family::<OrphanLabels, Gauge>::default();
        let missing_directories = Family::<OrphanLabels, Gauge>::default();
        let orphans_archived = Family::<OrphanLabels, Counter>::default();
        let invalid_agent_secrets = Family::<SecretLabels, Gauge>::default();
        let configured_agents = Family::<OrphanLabels, Gauge>::default();
        let agents_loaded = Family::<OrphanLabels, Counter>::default();
        let exports_updated = Family::<OrphanLabels, Counter>::default();
        let export_update_failures = Family::<OrphanLabels, Counter>::default();
        let snapshots = Family::<StateLabels, Gauge>::default();
        let snapshot_failures = Family::<OperationLabels, Counter>::default();
        // At zero from the start, so that an alert on their increase sees the first one.
        for operation in SNAPSHOT_OPERATIONS {
            drop(snapshot_failures.get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            }));
        }
        let schedule_lag =
            Family::<ScheduleLabels, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        // prometheus-client appends `_total` to counters itself.
        registry.register(
            "controller_persistentvolumeclaim_provision",
            "Number of persistent volume claims provisioned",
            provision_total.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_failed",
            "Number of failed provisioning attempts",
            provision_failed.clone(),
        );
        registry.register(
            "controller_persistentvolumeclaim_provision_duration_seconds",
            "Latency in seconds to provision persistent volumes",
            provision_duration.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete",
            "Number of persistent volumes deleted",
            delete_total.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_failed",
            "Number of failed persistent volume deletion attempts",
            delete_failed.clone(),
        );
        registry.register(
            "controller_persistentvolume_delete_duration_seconds",
            "Latency in seconds to delete persistent volumes",
            delete_duration.clone(),
        );
        registry.register(
            "nfsprov_agent_request_duration_seconds",
            "Latency of agent API requests",
            agent_duration.clone(),
        );
        registry.register(
            "nfsprov_agent_request_errors",
            "Failed agent API requests by error code",
            agent_errors.clone(),
        );
        registry.register_collector(Box::new(volume_usage.clone()));
        registry.register_collector(Box::new(volume_abnormal.clone()));
        registry.register(
            "nfsprov_orphaned_directories",
            "Directories an agent holds that no PV points to, older than the grace period, at the last orphan check",
            orphaned_directories.clone(),
        );
        registry.register(
            "nfsprov_missing_volume_directories",
            "PVs whose directory their agent does not have, at the last orphan check",
            missing_directories.clone(),
        );
        registry.register(
            "nfsprov_orphaned_directories_archived",
            "Orphaned directories archived by the orphan check's clean-up",
            orphans_archived.clone(),
        );
        registry.register(
            "nfsprov_agent_secret_invalid",
            "1 for each agent Secret (or key of one) that configures no agent, by Secret name",
            invalid_agent_secrets.clone(),
        );
        registry.register(
            "nfsprov_agent_configured",
            "1 for each agent the controller can use now, by agent name",
            configured_agents.clone(),
        );
        registry.register(
            "nfsprov_agent_secret_loads",
            "Times an agent's client was made from its Secret: once, then once per change (a rotated token)",
            agents_loaded.clone(),
        );
        registry.register(
            "nfsprov_exports_updated",
            "Volume exports changed to admit the clients their class asks for now (a node joined or left, a pod moved)",
            exports_updated.clone(),
        );
        registry.register(
            "nfsprov_export_update_failures",
            "Failed attempts to change a volume's export, retried with backoff",
            export_update_failures.clone(),
        );
        registry.register(
            "nfsprov_snapshots",
            "Snapshot objects this controller has seen, by state: pending, ready or failed",
            snapshots.clone(),
        );
        registry.register(
            "nfsprov_snapshot_failures",
            "Failed attempts to take (create) or delete (delete) an agent's snapshot, retried with backoff",
            snapshot_failures.clone(),
        );
        registry.register(
            "nfsprov_snapshot_schedule_lag_seconds",
            "How late a SnapshotSchedule's last run was taken after it was due (a controller down, or busy)",
            schedule_lag.clone(),
        );
        Self {
            registry,
            provision_total,
            provision_failed,
            provision_duration,
            delete_total,
            delete_failed,
            delete_duration,
            agent_duration,
            agent_errors,
            volume_usage,
            volume_abnormal,
            orphaned_directories,
            missing_directories,
            orphans_archived,
            invalid_agent_secrets,
            configured_agents,
            agents_loaded,
            exports_updated,
            export_update_failures,
            snapshots,
            snapshot_states: Mutex::new(HashMap::new()),
            snapshot_failures,
            schedule_lag,
        }
    }

    /// Counts the Snapshot `key` in `state` (`None`: it is gone).
    pub(crate) fn set_snapshot_state(&self, key: &str, state: Option<SnapshotState>) {
        let mut states = self
            .snapshot_states
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let before = match state {
            Some(state) => states.insert(key.to_owned(), state),
            None => states.remove(key),
        };
        if before == state {
            return;
        }
        let gauge = |state: SnapshotState| {
            self.snapshots.get_or_create(&StateLabels {
                state: state.label().to_owned(),
            })
        };
        if let Some(before) = before {
            gauge(before).dec();
        }
        if let Some(state) = state {
            gauge(state).inc();
        }
    }

    /// `operation` is one of [`SNAPSHOT_OPERATIONS`].
    pub(crate) fn snapshot_failed(&self, operation: &str) {
        self.snapshot_failures
            .get_or_create(&OperationLabels {
                operation: operation.to_owned(),
            })
            .inc();
    }

    pub(crate) fn schedule_ran(&self, namespace: &str, schedule: &str, lag: Duration) {
        self.schedule_lag
            .get_or_create(&ScheduleLabels {
                namespace: namespace.to_owned(),
                schedule: schedule.to_owned(),
            })
            .set(lag.as_secs_f64());
    }

    pub(crate) fn schedule_gone(&self, namespace: &str, schedule: &str) {
        self.schedule_lag.remove(&ScheduleLabels {
            namespace: namespace.to_owned(),
            schedule: schedule.to_owned(),
        });
    }

    /// A volume's export was changed on `agent`.
    pub(crate) fn export_updated(&self, agent: &str) {
        self.exports_updated
            .get_or_create(&OrphanLabels {
                agent: agent.to_owned(),
            })
            .inc();
    }

    /// An attempt to change a volume's export on `agent` failed.
    pub(crate) fn export_update_failed(&self, agent: &str) {
        self.export_update_failures
            .get_or_create(&OrphanLabels {
                agent: agent.to_owned(),
            })
            .inc();
    }

    /// An agent's client was made anew from its Secret.
    pub(crate) fn agent_loaded(&self, agent: &str) {
        self.agents_loaded
            .get_or_create(&OrphanLabels {
                agent: agent.to_owned(),
            })
            .inc();
    }

    /// The agents configured now; the series of the others go.
    /// Each configured agent's export counters start at zero, so that an alert on their
    /// increase sees the first failure (a series born at 1 shows no increase).
    pub(crate) fn set_configured_agents<'a>(&self, agents: impl IntoIterator<Item = &'a str>) {
        self.configured_agents.clear();
        for agent in agents {
            let labels = OrphanLabels {
                agent: agent.to_owned(),
            };
            self.configured_agents.get_or_create(&labels).set(1);
            drop(self.exports_updated.get_or_create(&labels));
            drop(self.export_update_failures.get_or_create(&labels));
        }
    }

    /// The agent Secrets that configure no agent now; the others' series go.
    pub(crate) fn set_invalid_agent_secrets<'a>(&self, secrets: impl IntoIterator<Item = &'a str>) {
        self.invalid_agent_secrets.clear();
        for secret in secrets {
            self.invalid_agent_secrets
                .get_or_create(&SecretLabels {
                    secret: secret.to_owned(),
                })
                .set(1);
        }
    }

    fn class(class: &str) -> ClassLabels {
        ClassLabels {
            class: class.to_owned(),
        }
    }

    /// `source` is the kind of the claim's data source, empty for none.
    pub(crate) fn provision_succeeded(&self, class: &str, source: &str, took: Duration) {
        let labels = ProvisionLabels {
            class: class.to_owned(),
            source: source.to_owned(),
        };
        self.provision_total.get_or_create(&labels).inc();
        self.provision_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    pub(crate) fn provision_failed(&self, class: &str, source: &str) {
        self.provision_failed
            .get_or_create(&ProvisionLabels {
                class: class.to_owned(),
                source: source.to_owned(),
            })
            .inc();
    }

    pub(crate) fn delete_succeeded(&self, class: &str, took: Duration) {
        self.delete_total.get_or_create(&Self::class(class)).inc();
        self.delete_duration
            .get_or_create(&Self::class(class))
            .observe(took.as_secs_f64());
    }

    pub(crate) fn delete_failed(&self, class: &str) {
        self.delete_failed.get_or_create(&Self::class(class)).inc();
    }

    pub(crate) fn agent_request(
        &self,
        agent: &str,
        operation: &str,
        took: Duration,
        error: Option<&str>,
    ) {
        let labels = AgentLabels {
            agent: agent.to_owned(),
            operation: operation.to_owned(),
        };
        self.agent_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        if let Some(code) = error {
            self.agent_errors
                .get_or_create(&AgentErrorLabels {
                    agent: agent.to_owned(),
                    operation: operation.to_owned(),
                    code: code.to_owned(),
                })
                .inc();
        }
    }

    /// What the last orphan check of `agent` found.
    pub(crate) fn set_orphans(
        &self,
        agent: &str,
        orphaned_directories: u64,
        missing_directories: u64,
    ) {
        let labels = OrphanLabels {
            agent: agent.to_owned(),
        };
        let gauge = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        self.orphaned_directories
            .get_or_create(&labels)
            .set(gauge(orphaned_directories));
        self.missing_directories
            .get_or_create(&labels)
            .set(gauge(missing_directories));
    }

    pub(crate) fn orphans_archived(&self, agent: &str, count: u64) {
        self.orphans_archived
            .get_or_create(&OrphanLabels {
                agent: agent.to_owned(),
            })
            .inc_by(count);
    }

    /// Publishes the figures of the volume `pv_name`, replacing its previous ones.
    pub(crate) fn set_volume(&self, pv_name: &str, labels: &VolumeLabels, figures: VolumeFigures) {
        let mut volumes = self
            .volume_usage
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner());
        match volumes.get_mut(pv_name) {
            Some(entry) => {
                if entry.0 != *labels {
                    entry.0 = labels.clone();
                }
                entry.1 = figures;
            }
            None => {
                volumes.insert(pv_name.to_owned(), (labels.clone(), figures));
            }
        }
    }

    /// Drops the figures of every volume `keep` says no to, so a deleted claim does not
    /// linger in dashboards with its last figures.
    pub(crate) fn retain_volumes(&self, mut keep: impl FnMut(&str) -> bool) {
        let mut volumes = self
            .volume_usage
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner());
        volumes.retain(|pv_name, _| keep(pv_name));
        if volumes.capacity() > 2 * volumes.len() + 64 {
            volumes.shrink_to_fit();
        }
    }

    /// Replaces the `nfsprov_volume_abnormal` figures: one series per (agent, reason)
    /// given, in that order.
    pub(crate) fn set_volume_abnormal(
        &self,
        counts: impl IntoIterator<Item = (String, String, u64)>,
    ) {
        let counts = counts
            .into_iter()
            .map(|(agent, reason, count)| (AbnormalLabels { agent, reason }, count))
            .collect();
        *self
            .volume_abnormal
            .0
            .write()
            .unwrap_or_else(|p| p.into_inner()) = counts;
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_compatible_names() {
        let metrics = Metrics::new();
        metrics.provision_succeeded("nfs", "", Duration::from_millis(20));
        metrics.provision_failed("nfs", "PersistentVolumeClaim");
        metrics.delete_succeeded("nfs", Duration::from_millis(20));
        metrics.delete_failed("nfs");
        metrics.agent_request(
            "nfs1",
            "create",
            Duration::from_millis(3),
            Some("not_ready"),
        );
        let text = metrics.encode().unwrap();
        for line in [
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\",source=\"\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\",source=\"PersistentVolumeClaim\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"nfs\",source=\"\"} 1",
            // The library's buckets (Prometheus' defaults), not the agent requests' ones.
            "controller_persistentvolumeclaim_provision_duration_seconds_bucket{le=\"0.025\",class=\"nfs\",source=\"\"} 1",
            "controller_persistentvolume_delete_duration_seconds_bucket{le=\"2.5\",class=\"nfs\"}",
            "controller_persistentvolume_delete_total{class=\"nfs\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"nfs\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"nfs\"} 1",
            "nfsprov_agent_request_duration_seconds_count{agent=\"nfs1\",operation=\"create\"} 1",
            "nfsprov_agent_request_errors_total{agent=\"nfs1\",operation=\"create\",code=\"not_ready\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }

    fn volume(name: &str) -> VolumeLabels {
        VolumeLabels {
            namespace: "team-a".into(),
            persistentvolumeclaim: name.into(),
            agent: "nfs1".into(),
        }
    }

    #[test]
    fn alerted_failure_counters_start_at_zero_for_each_operation_and_configured_agent() {
        let metrics = Metrics::new();
        metrics.set_configured_agents(["nfs1"]);
        let text = metrics.encode().unwrap();
        for line in [
            "nfsprov_snapshot_failures_total{operation=\"create\"} 0",
            "nfsprov_snapshot_failures_total{operation=\"delete\"} 0",
            "nfsprov_export_update_failures_total{agent=\"nfs1\"} 0",
            "nfsprov_exports_updated_total{agent=\"nfs1\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
        metrics.snapshot_failed("create");
        metrics.export_update_failed("nfs1");
        let text = metrics.encode().unwrap();
        for line in [
            "nfsprov_snapshot_failures_total{operation=\"create\"} 1",
            "nfsprov_export_update_failures_total{agent=\"nfs1\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
        }
    }

    #[test]
    fn volume_gauges_are_set_replaced_and_removed() {
        let metrics = Metrics::new();
        let measured = |capacity_bytes, used| VolumeFigures {
            capacity_bytes,
            used,
        };
        metrics.set_volume("pvc-1", &volume("data"), measured(1 << 30, Some((1, 1))));
        metrics.set_volume(
            "pvc-1",
            &volume("data"),
            measured(1 << 30, Some((5 << 20, 42))),
        );
        metrics.set_volume("pvc-2", &volume("logs"), measured(u64::MAX, None));
        let text = metrics.encode().unwrap();
        for line in [
            "# TYPE nfsprov_volume_used_bytes gauge",
            "nfsprov_volume_capacity_bytes{namespace=\"team-a\",persistentvolumeclaim=\"data\",agent=\"nfs1\"} 1073741824",
            "nfsprov_volume_used_bytes{namespace=\"team-a\",persistentvolumeclaim=\"data\",agent=\"nfs1\"} 5242880",
            "nfsprov_volume_used_inodes{namespace=\"team-a\",persistentvolumeclaim=\"data\",agent=\"nfs1\"} 42",
            "nfsprov_volume_capacity_bytes{namespace=\"team-a\",persistentvolumeclaim=\"logs\",agent=\"nfs1\"} 18446744073709551615",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
        // A volume not measured yet has its capacity only; a replaced figure is gone.
        assert_eq!(
            text.matches("persistentvolumeclaim=\"logs\"").count(),
            1,
            "{text}"
        );
        assert!(!text.contains("agent=\"nfs1\"} 1\n"), "{text}");

        metrics.retain_volumes(|pv_name| pv_name != "pvc-1");
        let text = metrics.encode().unwrap();
        assert!(!text.contains("persistentvolumeclaim=\"data\""), "{text}");
        assert!(text.contains("persistentvolumeclaim=\"logs\""), "{text}");
    }
}
