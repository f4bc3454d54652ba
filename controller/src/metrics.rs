//! Prometheus metrics. The claim and volume metrics keep the names of
//! sig-storage-lib-external-provisioner so existing dashboards carry over.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    pub class: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentLabels {
    pub agent: String,
    pub operation: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AgentErrorLabels {
    pub agent: String,
    pub operation: String,
    pub code: String,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn operation_histogram() -> Histogram {
    // 5 ms .. ~80 s: covers a local mkdir as well as a slow archive of a large tree.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

pub struct Metrics {
    registry: Registry,
    provision_total: Family<ClassLabels, Counter>,
    provision_failed: Family<ClassLabels, Counter>,
    provision_duration: HistogramFamily<ClassLabels>,
    delete_total: Family<ClassLabels, Counter>,
    delete_failed: Family<ClassLabels, Counter>,
    delete_duration: HistogramFamily<ClassLabels>,
    agent_duration: HistogramFamily<AgentLabels>,
    agent_errors: Family<AgentErrorLabels, Counter>,
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
        let provision_total = Family::<ClassLabels, Counter>::default();
        let provision_failed = Family::<ClassLabels, Counter>::default();
        let provision_duration =
            HistogramFamily::new_with_constructor(operation_histogram as fn() -> _);
        let delete_total = Family::<ClassLabels, Counter>::default();
        let delete_failed = Family::<ClassLabels, Counter>::default();
        let delete_duration =
            HistogramFamily::new_with_constructor(operation_histogram as fn() -> _);
        let agent_duration =
            HistogramFamily::new_with_constructor(operation_histogram as fn() -> _);
        let agent_errors = Family::<AgentErrorLabels, Counter>::default();
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
        }
    }

    fn class(class: &str) -> ClassLabels {
        ClassLabels {
            class: class.to_owned(),
        }
    }

    pub fn provision_succeeded(&self, class: &str, took: Duration) {
        self.provision_total
            .get_or_create(&Self::class(class))
            .inc();
        self.provision_duration
            .get_or_create(&Self::class(class))
            .observe(took.as_secs_f64());
    }

    pub fn provision_failed(&self, class: &str) {
        self.provision_failed
            .get_or_create(&Self::class(class))
            .inc();
    }

    pub fn delete_succeeded(&self, class: &str, took: Duration) {
        self.delete_total.get_or_create(&Self::class(class)).inc();
        self.delete_duration
            .get_or_create(&Self::class(class))
            .observe(took.as_secs_f64());
    }

    pub fn delete_failed(&self, class: &str) {
        self.delete_failed.get_or_create(&Self::class(class)).inc();
    }

    pub fn agent_request(&self, agent: &str, operation: &str, took: Duration, error: Option<&str>) {
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
        metrics.provision_succeeded("nfs", Duration::from_millis(20));
        metrics.provision_failed("nfs");
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
            "controller_persistentvolumeclaim_provision_total{class=\"nfs\"} 1",
            "controller_persistentvolumeclaim_provision_failed_total{class=\"nfs\"} 1",
            "controller_persistentvolumeclaim_provision_duration_seconds_count{class=\"nfs\"} 1",
            "controller_persistentvolume_delete_total{class=\"nfs\"} 1",
            "controller_persistentvolume_delete_failed_total{class=\"nfs\"} 1",
            "controller_persistentvolume_delete_duration_seconds_count{class=\"nfs\"} 1",
            "nfsprov_agent_request_duration_seconds_count{agent=\"nfs1\",operation=\"create\"} 1",
            "nfsprov_agent_request_errors_total{agent=\"nfs1\",operation=\"create\",code=\"not_ready\"} 1",
        ] {
            assert!(text.contains(line), "missing {line:?} in\n{text}");
        }
    }
}
