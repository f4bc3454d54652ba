//! `kubectl nfsprov`: what an nfsprov installation is doing and what is wrong with it,
//! read from the Kubernetes API and from the agents themselves.
//!
//! Modules: `table` (output), `cluster` (API access with RBAC-aware errors),
//! `credentials` (the agents' Secrets, loaded with api-types' own settings type),
//! `probe` (asking the agents), `report` (printing), `exports` (the export a class asks
//! for), then one module per command;
//! the crate root only parses the command line and dispatches. The modules are private:
//! the crate exports the command line and the few pieces its tests drive directly.

#![warn(unreachable_pub)]

mod adopt;
mod agents;
mod archives;
mod cluster;
mod credentials;
mod doctor;
mod exports;
mod orphans;
mod probe;
mod report;
mod restore;
mod snapshots;
mod status;
mod table;
mod volumes;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
pub use cluster::{PV_PAGE, Target};
use nfsprov_vocabulary::names::DEFAULT_PROVISIONER;
pub use orphans::{OrphanKind, check_agent, pointers};
pub use probe::list_volumes;
pub use report::Output;
use report::print;
pub use restore::{Checked, wait_bound};

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
    /// The PVs of this provisioner: claim, agent, path, capacity, used, enforced, origin.
    Volumes,
    /// Problems found, one a line, each with what to do (exit status 1 when any).
    Doctor,
    /// Directories agents hold that no PV points to, and PVs whose directory is gone.
    Orphans,
    /// Takes over the PVs another provisioner made on an agent's export (e.g.
    /// nfs-subdir-external-provisioner's); --dry-run lists what would be adopted.
    Adopt {
        /// Provisioner name whose PVs to adopt (repeat or comma-separate for several).
        #[arg(long, required = true, value_delimiter = ',')]
        from: Vec<String>,
        /// The agent whose export holds their directories.
        #[arg(long)]
        agent: String,
        /// NFS server the PVs name, when not the one the agent reports.
        #[arg(long)]
        nfs_server: Option<String>,
        /// Export path the PVs' paths start with, when not the one the agent reports.
        #[arg(long)]
        nfs_path: Option<String>,
        /// Directory of agent connection files (as the controller's), instead of the
        /// agents' Secrets in the cluster.
        #[arg(long)]
        agents_dir: Option<PathBuf>,
        /// List what would be adopted; change nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Snapshots (claim, ready, size, method, agent, schedule) and SnapshotSchedules
    /// (interval, retention, last and next run) of every namespace.
    Snapshots,
    /// Archives the agents keep: origin, claim, age, size and expiry; `delete` removes one.
    Archives {
        /// Only this agent's archives.
        #[arg(long)]
        agent: Option<String>,
        #[command(subcommand)]
        action: Option<ArchivesAction>,
    },
    /// Creates a claim whose volume is made from an archive; the archive must be of the
    /// claim's namespace, and the claim at least as large as the archived volume.
    Restore {
        /// The agent that holds the archive.
        agent: String,
        /// The archive's id, as `archives` lists it (`<path>/@<time>`).
        id: String,
        /// The new claim, `NAMESPACE/CLAIM`.
        #[arg(long, value_name = "NAMESPACE/CLAIM")]
        to: String,
        /// Its StorageClass; the cluster's default class when that is one of this
        /// provisioner's.
        #[arg(long)]
        class: Option<String>,
        /// Its size (`10Gi`); the capacity the archived volume had when absent.
        #[arg(long)]
        size: Option<String>,
        /// Its access mode.
        #[arg(long, default_value = "ReadWriteMany")]
        access_mode: String,
        /// Waits until the claim is Bound and prints its PersistentVolume.
        #[arg(long)]
        wait: bool,
        /// Seconds --wait waits before it gives up.
        #[arg(long, default_value_t = 300, value_name = "SECONDS")]
        timeout: u64,
        /// Directory of agent connection files (as the controller's), instead of the
        /// agents' Secrets in the cluster.
        #[arg(long)]
        agents_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, Subcommand)]
pub enum ArchivesAction {
    /// Deletes one archive for good.
    Delete {
        /// The agent that holds it.
        agent: String,
        /// Its id, as `archives` lists it (`<path>/@<time>`).
        id: String,
    },
}

/// Runs one command and prints its report; the exit status on success.
pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    // kube's TLS and the agent client both use ring; kube needs it as the default.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Command::Archives {
        action: Some(ArchivesAction::Delete { id, .. }),
        ..
    } = &cli.command
    {
        archives::parse_id(id)?;
    }
    let restore = match &cli.command {
        Command::Restore {
            agent,
            id,
            to,
            class,
            size,
            access_mode,
            wait,
            timeout,
            agents_dir,
        } => {
            let options = restore::RestoreOptions {
                agent: agent.clone(),
                id: id.clone(),
                to: to.clone(),
                class: class.clone(),
                size: size.clone(),
                access_mode: access_mode.clone(),
                wait: *wait,
                timeout: std::time::Duration::from_secs(*timeout),
                agents_dir: agents_dir.clone(),
            };
            restore::check_options(&options)?;
            Some(options)
        }
        _ => None,
    };
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
        Command::Snapshots => print(&snapshots::run(&target.client).await?, cli.output),
        Command::Adopt {
            from,
            agent,
            nfs_server,
            nfs_path,
            agents_dir,
            dry_run,
        } => {
            let options = adopt::AdoptOptions {
                from,
                agent,
                nfs_server,
                nfs_path,
                agents_dir,
                dry_run,
            };
            print(&adopt::run(&target, &options).await?, cli.output)
        }
        Command::Archives {
            agent,
            action: None,
        } => print(
            &archives::list(&target, agent.as_deref()).await?,
            cli.output,
        ),
        Command::Archives {
            action: Some(ArchivesAction::Delete { agent, id }),
            ..
        } => print(&archives::delete(&target, &agent, &id).await?, cli.output),
        Command::Restore { .. } => {
            let options = restore.expect("read from the command above");
            print(&restore::run(&target, &options).await?, cli.output)
        }
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
        let cli = Cli::try_parse_from(["kubectl-nfsprov", "archives", "--agent", "nfs1"]).unwrap();
        assert!(matches!(
            cli.command,
            Command::Archives { agent: Some(ref a), action: None } if a == "nfs1"
        ));
        let cli = Cli::try_parse_from([
            "kubectl-nfsprov",
            "archives",
            "delete",
            "nfs1",
            "team-a/data/@20261120T120000.000000000Z",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Archives { action: Some(ArchivesAction::Delete { ref agent, .. }), .. } if agent == "nfs1"
        ));
        assert!(Cli::try_parse_from(["kubectl-nfsprov", "archives", "delete", "nfs1"]).is_err());
        let cli = Cli::try_parse_from([
            "kubectl-nfsprov",
            "restore",
            "nfs1",
            "team-a/data/@20261120T120000.000000000Z",
            "--to",
            "team-a/back",
            "--wait",
        ])
        .unwrap();
        assert!(matches!(
            cli.command,
            Command::Restore { ref to, wait: true, timeout: 300, ref access_mode, class: None, .. }
                if to == "team-a/back" && access_mode == "ReadWriteMany"
        ));
        assert!(
            Cli::try_parse_from(["kubectl-nfsprov", "restore", "nfs1", "x/@y"]).is_err(),
            "--to is required"
        );
        assert!(Cli::try_parse_from(["kubectl-nfsprov", "status", "-o", "yaml"]).is_err());
    }
}
