//! `kubectl nfsprov`: what an nfsprov installation is doing and what is wrong with it,
//! read from the Kubernetes API and from the agents themselves.
//!
//! Modules: `table` (output), `cluster` (API access with RBAC-aware errors),
//! `credentials` (the agents' Secrets, loaded with api-types' own settings type),
//! `probe` (asking the agents), `report` (printing), then one module per command;
//! the crate root only parses the command line and dispatches.

pub mod agents;
pub mod cluster;
pub mod credentials;
pub mod doctor;
pub mod orphans;
pub mod probe;
pub mod report;
pub mod status;
pub mod table;
pub mod volumes;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use nfsprov_controller::config::DEFAULT_PROVISIONER;
pub use report::Output;
use report::print;

#[derive(Debug, Clone, Parser)]
#[command(
    name = "kubectl-nfsprov",
    bin_name = "kubectl nfsprov",
    version,
    about = "Status, agents, volumes and problems of an nfsprov installation"
)]
pub struct Cli {
    /// Namespace of the controller, its Lease and the agents' Secrets.
    #[arg(short = 'n', long, global = true, default_value = "nfsprov")]
    pub namespace: String,
    /// Provisioner name the StorageClasses and PVs carry.
    #[arg(long, global = true, default_value = DEFAULT_PROVISIONER)]
    pub provisioner: String,
    /// Name of the controller's Deployment.
    #[arg(long, global = true, default_value = "nfsprov-controller")]
    pub deployment: String,
    /// Name of the controller's leader-election Lease.
    #[arg(long, global = true, default_value = "nfsprov-controller")]
    pub lease: String,
    /// kubeconfig file; `$KUBECONFIG`, then `~/.kube/config` when absent.
    #[arg(long, global = true)]
    pub kubeconfig: Option<PathBuf>,
    /// kubeconfig context; the current context when absent.
    #[arg(long, global = true)]
    pub context: Option<String>,
    /// Output format.
    #[arg(short = 'o', long, global = true, value_enum, default_value = "table")]
    pub output: Output,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Controller replicas, the leader, and the StorageClasses of this provisioner.
    Status,
    /// Each agent's health, version, quota backend, free space and volume count.
    Agents,
    /// The PVs of this provisioner: claim, agent, path, capacity, used, enforced.
    Volumes,
    /// Problems found, one a line, each with what to do (exit status 1 when any).
    Doctor,
    /// Directories agents hold that no PV points to, and PVs whose directory is gone.
    Orphans,
}

/// Runs one command and prints its report; the exit status on success.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    // kube's TLS and the agent client both use ring; kube needs it as the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let client = cluster::connect(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let target = cluster::Target {
        client,
        namespace: cli.namespace,
        provisioner: cli.provisioner,
        deployment: cli.deployment,
        lease: cli.lease,
    };
    match cli.command {
        Command::Status => print(&status::run(&target).await?, cli.output),
        Command::Agents => print(&agents::run(&target).await?, cli.output),
        Command::Volumes => print(&volumes::run(&target).await?, cli.output),
        Command::Doctor => print(&doctor::run(&target).await?, cli.output),
        Command::Orphans => print(&orphans::run(&target).await?, cli.output),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_default_to_the_shipped_installation() {
        let cli = Cli::try_parse_from(["kubectl-nfsprov", "status"]).unwrap();
        assert_eq!(cli.namespace, "nfsprov");
        assert_eq!(cli.provisioner, DEFAULT_PROVISIONER);
        assert_eq!(cli.deployment, "nfsprov-controller");
        assert_eq!(cli.output, Output::Table);
        // Global flags go before or after the command, as kubectl's own do.
        let cli = Cli::try_parse_from([
            "kubectl-nfsprov",
            "-n",
            "storage",
            "volumes",
            "-o",
            "json",
            "--context",
            "prod",
            "--provisioner=example.com/nfs",
        ])
        .unwrap();
        assert_eq!(cli.namespace, "storage");
        assert_eq!(cli.output, Output::Json);
        assert_eq!(cli.context.as_deref(), Some("prod"));
        assert_eq!(cli.provisioner, "example.com/nfs");
        assert!(matches!(cli.command, Command::Volumes));
        assert!(Cli::try_parse_from(["kubectl-nfsprov", "archives"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-nfsprov", "status", "-o", "yaml"]).is_err());
    }
}
