//! Export benchmark on nfs-ganesha: N per-volume exports managed through ganesha's D-Bus
//! export manager by the agent's export table, on a private bus. Prints the time to
//! make the N, the time to add and to remove one export with N present (p50/p99), the
//! time for a change of nodes to reach all N, and the time to restore all N at an agent
//! start (ganesha kept them; ganesha restarted without them) and ganesha's own start
//! from the agent's include list. Prints figures; asserts nothing.
//!
//!   cargo run -p nfsprov-e2e --bin nfsprov-exports-bench -- --exports 1000

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use nfsprov_agent::exports::VolumeLayout;
use nfsprov_agent::exports::{ExportSettings, Exports};
use nfsprov_api_types::{ExportManager, ExportRequest, VolumePath};
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};

#[derive(Debug, Parser)]
#[command(about = "Measure per-volume export changes on nfs-ganesha with N exports present")]
struct Args {
    /// Exports present while one is added and removed.
    #[arg(long, default_value_t = 10_000)]
    exports: usize,
    /// Exports added and removed one at a time for the percentiles.
    #[arg(long, default_value_t = 200)]
    samples: usize,
}

fn request(clients: &[&str]) -> ExportRequest {
    ExportRequest {
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        ..ExportRequest::default()
    }
}

fn volume(i: usize) -> VolumePath {
    VolumePath::parse(&format!("bench/v{i:05}")).unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn open(settings: &ExportSettings, root: &Path) -> anyhow::Result<(Exports, Duration)> {
    let started = Instant::now();
    let mount_root = root.display().to_string();
    // The benchmark's root is a directory of the machine's filesystem.
    let (exports, restored) = Exports::open(
        settings,
        root,
        &mount_root,
        VolumeLayout::SharedFilesystem,
        |_| true,
    )?;
    let took = started.elapsed();
    println!(
        "  restore: kept {} added {} repaired {} removed {}",
        restored.kept, restored.added, restored.repaired, restored.removed
    );
    Ok((exports, took))
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let base = tempfile::tempdir()?;
    let root = base.path().join("export");
    let config_dir = base.path().join("ganesha.d");
    for i in 0..args.exports + args.samples {
        std::fs::create_dir_all(root.join(volume(i).as_str()))?;
    }
    let bus = PrivateBus::start().await?;
    let mut ganesha = Ganesha::start(&bus, &config_dir).await?;
    let settings = ExportSettings {
        manager: ExportManager::Ganesha,
        ganesha_config_dir: config_dir.clone(),
        ganesha_dbus_address: Some(bus.address().to_owned()),
        ..ExportSettings::default()
    };
    let node_a = request(&["127.0.0.2"]);
    let (exports, _) = open(&settings, &root)?;

    let started = Instant::now();
    for i in 0..args.exports {
        exports.set(&volume(i), &node_a)?;
    }
    let fill = started.elapsed();
    println!(
        "made {} exports in {:.1} s ({:.2} ms each)",
        args.exports,
        fill.as_secs_f64(),
        fill.as_secs_f64() * 1e3 / args.exports as f64
    );

    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for i in args.exports..args.exports + args.samples {
        let started = Instant::now();
        exports.set(&volume(i), &node_a)?;
        adds.push(started.elapsed());
        let started = Instant::now();
        exports.remove(&volume(i))?;
        removes.push(started.elapsed());
    }
    adds.sort_unstable();
    removes.sort_unstable();
    println!(
        "with {} present, {} samples: add p50 {:.2} ms p99 {:.2} ms; remove p50 {:.2} ms p99 {:.2} ms",
        args.exports,
        args.samples,
        percentile(&adds, 0.5).as_secs_f64() * 1e3,
        percentile(&adds, 0.99).as_secs_f64() * 1e3,
        percentile(&removes, 0.5).as_secs_f64() * 1e3,
        percentile(&removes, 0.99).as_secs_f64() * 1e3,
    );

    // A node joins: every export admits it (one UpdateExport each, one at a time).
    let both = request(&["127.0.0.2", "127.0.0.3"]);
    let started = Instant::now();
    for i in 0..args.exports {
        exports.set(&volume(i), &both)?;
    }
    let node_change = started.elapsed();
    println!(
        "a node change reached {} exports in {:.1} s",
        args.exports,
        node_change.as_secs_f64()
    );
    drop(exports);

    let (exports, took) = open(&settings, &root)?;
    println!(
        "agent start, ganesha serving all {}: restored in {:.2} s",
        exports.len(),
        took.as_secs_f64()
    );
    drop(exports);

    let started = Instant::now();
    ganesha.restart().await?;
    let ganesha_start = started.elapsed();
    let served = ganesha.export_ids()?.len();
    println!(
        "ganesha restarted from the include list: {} exports served, up in {:.1} s",
        served,
        ganesha_start.as_secs_f64()
    );

    // ganesha restarted without them (its include list emptied): the agent adds all.
    std::fs::write(config_dir.join("exports.conf"), "")?;
    ganesha.restart().await?;
    let (exports, took) = open(&settings, &root)?;
    println!(
        "agent start, ganesha serving none: {} restored in {:.1} s",
        exports.len(),
        took.as_secs_f64()
    );
    Ok(())
}
