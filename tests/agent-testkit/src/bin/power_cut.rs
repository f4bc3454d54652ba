//! Power cuts after acknowledged operations, many times over: for each filesystem and
//! operation, how many acknowledged results were checked on a copy of the disk taken the
//! moment the answer arrived, and how many were lost. Prints figures; the suite's own
//! test runs a few of the same. Needs root, and the mkfs of each filesystem; with
//! `--exports ganesha`, also ganesha.nfsd with its VFS FSAL, dbus-daemon, unshare and
//! nsenter.
//!
//! `image` is the image quota backend on an XFS export root: each volume an ext4
//! filesystem in an image file (needs e2fsprogs and util-linux's loop tools too). It
//! runs with the knfsd manager only, and skips, saying so, the operations it does not
//! cut: adoption (the backend adopts no directory) and resize (an online grow needs
//! CAP_SYS_RESOURCE).

use std::path::PathBuf;

use anyhow::Context;
use clap::Parser;
use nfsprov_agent_testkit::power_cut::{self, FsKind, Manager, Op};

#[derive(Debug, Parser)]
#[command(about = "Check that what the nfsprov agent acknowledges survives a power cut")]
struct Args {
    /// Power cuts per operation and filesystem.
    #[arg(long, default_value_t = 50)]
    iterations: usize,
    /// The agent binary (default: `nfsprov-agent` beside this program).
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Filesystems to run on (ext4, xfs, btrfs, image: image volumes on XFS); all by
    /// default.
    #[arg(long = "fs", value_delimiter = ',')]
    filesystems: Vec<String>,
    /// Operations to cut after (create, clone, ..., archive-restore); by default all, or
    /// with ganesha all that make, change or remove an export.
    #[arg(long = "op", value_delimiter = ',')]
    ops: Vec<String>,
    /// The agent's export manager (knfsd, ganesha), whose files the cut must leave right.
    #[arg(long, default_value = "knfsd")]
    exports: String,
    /// Print every lost result, not only the first few of each operation.
    #[arg(long)]
    verbose: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let agent = match args.agent {
        Some(agent) => agent,
        None => std::env::current_exe()?
            .parent()
            .context("no directory of this program")?
            .join("nfsprov-agent"),
    };
    anyhow::ensure!(agent.is_file(), "no agent binary at {}", agent.display());
    let kinds: Vec<FsKind> = FsKind::ALL
        .into_iter()
        .filter(|kind| args.filesystems.is_empty() || args.filesystems.contains(&kind.to_string()))
        .collect();
    let manager = Manager::ALL
        .into_iter()
        .find(|manager| manager.to_string() == args.exports)
        .with_context(|| {
            format!(
                "no export manager is named {:?}; they are: {}",
                args.exports,
                Manager::ALL.map(|manager| manager.to_string()).join(", ")
            )
        })?;
    if let Some(missing) = manager.missing() {
        anyhow::bail!("the check with {manager} cannot run here: {missing}");
    }
    let all_ops: &[Op] = match manager {
        Manager::Knfsd => &Op::ALL,
        Manager::Ganesha => &Op::EXPORTING,
    };
    let ops: Vec<Op> = Op::ALL
        .into_iter()
        .filter(|op| {
            if args.ops.is_empty() {
                all_ops.contains(op)
            } else {
                args.ops.contains(&op.to_string())
            }
        })
        .collect();
    anyhow::ensure!(
        !ops.is_empty(),
        "no operation is named {:?}; they are: {}",
        args.ops,
        Op::ALL.map(|op| op.to_string()).join(", ")
    );
    println!(
        "agent: {}; exports: {manager}; {} power cuts per operation and filesystem",
        agent.display(),
        args.iterations
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let mut lost_in_all = 0;
    for kind in kinds {
        if let Some(missing) = kind.missing() {
            println!("{kind}: skipped, {missing}");
            continue;
        }
        if kind == FsKind::Image && manager != Manager::Knfsd {
            println!("{kind}: skipped, image volumes are cut with the knfsd manager only");
            continue;
        }
        let mut kind_ops = Vec::new();
        for &op in &ops {
            match kind.skips(op) {
                Some(why) => println!("{kind:<6} {op:<15} skipped: {why}"),
                None => kind_ops.push(op),
            }
        }
        let started = std::time::Instant::now();
        let tallies = runtime.block_on(power_cut::run(
            &agent,
            kind,
            manager,
            &kind_ops,
            args.iterations,
        ))?;
        for (op, tally) in &tallies {
            println!(
                "{kind:<6} {op:<15} checked {:>4}  lost {:>4}",
                tally.checked, tally.lost
            );
            lost_in_all += tally.lost;
            let shown = if args.verbose {
                tally.failures.len()
            } else {
                3
            };
            for failure in tally.failures.iter().take(shown) {
                println!("         {failure}");
            }
        }
        println!("{kind}: {:.0}s", started.elapsed().as_secs_f64());
    }
    println!("lost in all: {lost_in_all}");
    Ok(())
}
