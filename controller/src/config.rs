//! Command-line flags, each with an environment fallback for use in a Deployment.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser, ValueEnum};
use nfsprov_vocabulary::names::DEFAULT_PROVISIONER;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How the leader's orphan check runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OrphanSettings {
    pub every: Duration,
    /// Directories younger than this are never reported or touched: their PV may be
    /// being created right now.
    pub grace: Duration,
    /// Archive orphaned directories (never delete them).
    pub archive: bool,
    /// Volumes asked of an agent at a time: the check holds one page, never the whole list.
    pub page_size: u32,
}

#[derive(Debug, Clone, Parser)]
#[command(
    name = "nfsprov-controller",
    version,
    about = "Provisions NFS PersistentVolumes through nfsprov agents"
)]
pub struct Args {
    /// Provisioner name StorageClasses must name for this controller to act.
    #[arg(long, env = "NFSPROV_PROVISIONER_NAME", default_value = DEFAULT_PROVISIONER)]
    pub(crate) provisioner_name: String,

    /// More provisioner names to act for, comma-separated, as the library's
    /// additionalProvisionerNames: the classes and PVs of a provisioner this controller
    /// replaces (e.g. k8s-sigs.io/nfs-subdir-external-provisioner) keep working.
    #[arg(
        long,
        env = "NFSPROV_ADDITIONAL_PROVISIONER_NAMES",
        value_delimiter = ',',
        num_args = 0..
    )]
    pub(crate) additional_provisioner_names: Vec<String>,

    /// kubeconfig file; in-cluster configuration (or ~/.kube/config) when absent.
    #[arg(long, env = "KUBECONFIG")]
    pub(crate) kubeconfig: Option<PathBuf>,

    /// Directory with one `*.toml` connection file per agent, read once at start. When
    /// absent, the agents are the Secrets labelled
    /// `app.kubernetes.io/component=agent-credentials` in the controller's namespace (as
    /// `nfsprov-agent init` prints them), watched: a Secret added, changed or deleted
    /// takes effect without a restart.
    #[arg(long, env = "NFSPROV_AGENTS_DIR")]
    pub(crate) agents_dir: Option<PathBuf>,

    /// Agent for StorageClasses without an `agent` or `agents` parameter; overrides
    /// `default = true` in the connection files. Needed only with several agents.
    #[arg(long, env = "NFSPROV_DEFAULT_AGENT")]
    pub(crate) default_agent: Option<String>,

    /// Address of the /livez, /readyz and /metrics server.
    #[arg(long, env = "NFSPROV_HTTP_ADDR", default_value = "0.0.0.0:8080")]
    pub(crate) http_addr: SocketAddr,

    #[arg(long, env = "NFSPROV_LOG_FORMAT", value_enum, default_value = "text")]
    pub log_format: LogFormat,

    /// Elect a leader through a Lease so several replicas can run safely.
    #[arg(long, env = "NFSPROV_LEADER_ELECT", default_value_t = true, action = ArgAction::Set)]
    pub(crate) leader_elect: bool,

    #[arg(long, env = "NFSPROV_LEASE_NAME", default_value = "nfsprov-controller")]
    pub(crate) lease_name: String,

    /// Namespace of the Lease and of the agent Secrets; the client's default namespace
    /// when absent.
    #[arg(long, env = "POD_NAMESPACE")]
    pub(crate) lease_namespace: Option<String>,

    /// This replica's identity in the Lease and in events; the host name when absent.
    #[arg(long, env = "POD_NAME")]
    pub(crate) identity: Option<String>,

    /// How long a Lease stays valid without renewal.
    #[arg(long, env = "NFSPROV_LEASE_DURATION_SECONDS", default_value_t = 15)]
    pub(crate) lease_duration_seconds: u64,

    /// Most claims (and, separately, volumes) reconciled at once; 0 for no limit. Not a
    /// rate limit: each slot is freed as soon as its reconcile finishes. 32 keeps well
    /// ahead of what a control plane binds per second, while every slot beyond that is
    /// one more API and agent connection with its buffers during a burst.
    #[arg(long, env = "NFSPROV_MAX_CONCURRENT_RECONCILES", default_value_t = 32)]
    pub(crate) max_concurrent_reconciles: u16,

    /// Most reconciles working with one agent at once (at least 1): when an agent's are
    /// all taken, others step aside and retry shortly, so one slow agent never holds every
    /// reconcile slot and the classes of the other agents keep provisioning.
    #[arg(long, env = "NFSPROV_MAX_RECONCILES_PER_AGENT", default_value_t = 16)]
    pub(crate) max_reconciles_per_agent: u16,

    /// Every object is reconciled again this often.
    #[arg(long, env = "NFSPROV_RESYNC_SECONDS", default_value_t = 600)]
    pub(crate) resync_seconds: u64,

    /// How often the usage and health of every bound volume is asked from its agent (for
    /// the nfsprov_volume_* gauges, VolumeNearlyFull events and the VolumeConditionAbnormal
    /// and VolumeConditionNormal events on claims); 0 turns the poll off.
    #[arg(long, env = "NFSPROV_USAGE_INTERVAL_SECONDS", default_value_t = 60)]
    pub(crate) usage_interval_seconds: u64,

    /// How long an agent must fail every request of the usage and health poll before each
    /// of its claims gets a VolumeConditionAbnormal event with reason agent_unreachable.
    #[arg(
        long,
        env = "NFSPROV_AGENT_UNREACHABLE_SECONDS",
        default_value_t = 120,
        value_parser = clap::value_parser!(u64).range(1..)
    )]
    pub(crate) agent_unreachable_seconds: u64,

    /// How often the leader compares each agent's volumes with the PVs (directories no
    /// PV points to, PVs whose directory is gone); 0 turns the check off.
    #[arg(
        long,
        env = "NFSPROV_ORPHAN_CHECK_INTERVAL_SECONDS",
        default_value_t = 600
    )]
    pub(crate) orphan_check_interval_seconds: u64,

    /// Directories younger than this are never reported or archived as orphans: their
    /// PV may be on its way.
    #[arg(long, env = "NFSPROV_ORPHAN_GRACE_SECONDS", default_value_t = 600)]
    pub(crate) orphan_grace_seconds: u64,

    /// Archive orphaned directories (never delete them) once the API server confirms no
    /// PV holds them and no pending claim can still get them.
    #[arg(long, env = "NFSPROV_ARCHIVE_ORPHANS", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub(crate) archive_orphans: bool,
}

impl Args {
    /// The usage poll interval, `None` when it is off.
    pub(crate) fn usage_interval(&self) -> Option<Duration> {
        (self.usage_interval_seconds > 0).then(|| Duration::from_secs(self.usage_interval_seconds))
    }

    /// How long an agent fails every request before its claims hear of it.
    pub(crate) fn agent_unreachable(&self) -> Duration {
        Duration::from_secs(self.agent_unreachable_seconds)
    }

    /// The orphan check's settings, `None` when it is off.
    pub(crate) fn orphan_check(&self) -> Option<OrphanSettings> {
        (self.orphan_check_interval_seconds > 0).then(|| OrphanSettings {
            every: Duration::from_secs(self.orphan_check_interval_seconds),
            grace: Duration::from_secs(self.orphan_grace_seconds),
            archive: self.archive_orphans,
            page_size: nfsprov_api_types::MAX_PAGE_LIMIT,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_flags() {
        let args = Args::try_parse_from(["nfsprov-controller"]).unwrap();
        assert_eq!(args.provisioner_name, DEFAULT_PROVISIONER);
        assert!(args.leader_elect);
        assert_eq!(args.log_format, LogFormat::Text);
        assert_eq!(args.usage_interval(), Some(Duration::from_secs(60)));
        assert_eq!(args.default_agent, None);
        assert!(args.additional_provisioner_names.is_empty());
        assert_eq!(args.agents_dir, None);
        assert_eq!(args.max_reconciles_per_agent, 16);
        assert_eq!(args.agent_unreachable(), Duration::from_secs(120));
        assert_eq!(
            args.orphan_check(),
            Some(OrphanSettings {
                every: Duration::from_secs(600),
                grace: Duration::from_secs(600),
                archive: false,
                page_size: 1000,
            })
        );
        let args = Args::try_parse_from([
            "nfsprov-controller",
            "--provisioner-name=example.com/nfs",
            "--leader-elect=false",
            "--log-format=json",
            "--http-addr=127.0.0.1:9000",
            "--usage-interval-seconds=0",
            "--default-agent=nfs2",
            "--orphan-check-interval-seconds=0",
            "--additional-provisioner-names=k8s-sigs.io/nfs-subdir-external-provisioner,example.com/old",
        ])
        .unwrap();
        assert_eq!(args.provisioner_name, "example.com/nfs");
        assert!(!args.leader_elect);
        assert_eq!(args.log_format, LogFormat::Json);
        assert_eq!(args.usage_interval(), None);
        assert_eq!(args.default_agent.as_deref(), Some("nfs2"));
        assert_eq!(args.orphan_check(), None);
        assert_eq!(
            args.additional_provisioner_names,
            [
                "k8s-sigs.io/nfs-subdir-external-provisioner",
                "example.com/old"
            ]
        );
        let args = Args::try_parse_from(["nfsprov-controller", "--archive-orphans"]).unwrap();
        assert!(args.orphan_check().unwrap().archive);
        assert!(Args::try_parse_from(["nfsprov-controller", "--log-format=xml"]).is_err());
        let args =
            Args::try_parse_from(["nfsprov-controller", "--agent-unreachable-seconds=30"]).unwrap();
        assert_eq!(args.agent_unreachable(), Duration::from_secs(30));
        assert!(
            Args::try_parse_from(["nfsprov-controller", "--agent-unreachable-seconds=0"]).is_err()
        );
    }
}
