//! Benchmark of the agent over real HTTPS on loopback: create + delete pairs at a given
//! concurrency with keep-alive connections, and deleting a large tree through the agent
//! against `rm -rf` of an identical tree. Prints figures; asserts nothing. With `--btrfs`
//! the export root is a loop-mounted btrfs with the btrfs quota backend.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::LoopBtrfs;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::{CreateVolumeRequest, QuotaBackend, VolumePath};
use tokio::sync::Mutex;

#[derive(Debug, Parser)]
#[command(
    about = "Measure the nfsprov agent's request throughput, latency and tree deletion speed"
)]
struct Args {
    /// Create + delete pairs to run.
    #[arg(long, default_value_t = 20_000)]
    pairs: usize,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Files in the tree deleted through the agent and with `rm -rf`.
    #[arg(long, default_value_t = 100_000)]
    tree_files: usize,
    /// Directory to create the export root in (default: the system temp dir).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Serve a loop-mounted btrfs with the btrfs quota backend (a subvolume and a qgroup
    /// limit per volume; needs root) instead of a plain directory.
    #[arg(long)]
    btrfs: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Runtime::new()?.block_on(run(args))
}

async fn run(args: Args) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    // Sparse: only what the benchmark writes takes space.
    let btrfs = if args.btrfs {
        Some(LoopBtrfs::new(8192, true)?)
    } else {
        None
    };
    let (root, agent) = match &btrfs {
        Some(fs) => {
            let settings = QuotaSettings {
                backend: QuotaBackend::Btrfs,
                ..QuotaSettings::default()
            };
            (
                fs.root(),
                TestAgent::start_with_quota(&fs.root(), settings).await?,
            )
        }
        None => {
            let root = base.path().join("export");
            std::fs::create_dir(&root)?;
            let agent = TestAgent::start(&root).await?;
            (root, agent)
        }
    };
    let client = agent.client();
    client.healthz().await.context("agent not serving")?;
    println!(
        "agent: https://{} (TLS 1.3, token auth), export root {}, quota backend {}",
        agent.addr(),
        root.display(),
        client.info(None).await?.capabilities.quota
    );

    // Warm up connections and caches.
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    for i in 0..args.concurrency {
        let path = VolumePath::parse(&format!("warmup/v{i}"))?;
        client.create_volume(&path, &request, None).await?;
        client.delete_volume(&path, None).await?;
    }

    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let create_latencies = Arc::new(Mutex::new(Vec::with_capacity(args.pairs)));
    let delete_latencies = Arc::new(Mutex::new(Vec::with_capacity(args.pairs)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..args.concurrency {
        let client = client.clone();
        let next = next.clone();
        let request = request.clone();
        let creates = create_latencies.clone();
        let deletes = delete_latencies.clone();
        let pairs = args.pairs;
        workers.push(tokio::spawn(async move {
            let mut mine_create = Vec::new();
            let mut mine_delete = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= pairs {
                    break;
                }
                let path = VolumePath::parse(&format!("bench/ns{}/v{i}", i % 16))?;
                let t = Instant::now();
                let outcome = client.create_volume(&path, &request, None).await?;
                mine_create.push(t.elapsed());
                if !outcome.created {
                    bail!("{path} already existed");
                }
                let t = Instant::now();
                client.delete_volume(&path, None).await?;
                mine_delete.push(t.elapsed());
            }
            creates.lock().await.extend(mine_create);
            deletes.lock().await.extend(mine_delete);
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let elapsed = started.elapsed();
    let mut creates = create_latencies.lock().await.clone();
    let mut deletes = delete_latencies.lock().await.clone();
    let mut all: Vec<Duration> = creates.iter().chain(deletes.iter()).copied().collect();
    println!(
        "create+delete pairs: {} in {:.2}s at concurrency {} = {:.0} pairs/s ({:.0} requests/s)",
        args.pairs,
        elapsed.as_secs_f64(),
        args.concurrency,
        args.pairs as f64 / elapsed.as_secs_f64(),
        2.0 * args.pairs as f64 / elapsed.as_secs_f64()
    );
    println!(
        "  request latency  p50 {}  p99 {}  max {}",
        ms(pct(&mut all, 50.0)),
        ms(pct(&mut all, 99.0)),
        ms(pct(&mut all, 100.0))
    );
    println!(
        "  create latency   p50 {}  p99 {}",
        ms(pct(&mut creates, 50.0)),
        ms(pct(&mut creates, 99.0))
    );
    println!(
        "  delete latency   p50 {}  p99 {}",
        ms(pct(&mut deletes, 50.0)),
        ms(pct(&mut deletes, 99.0))
    );

    // Tree deletion: the same shape of tree, once through the agent and once by rm -rf.
    let files = args.tree_files;
    let volume = VolumePath::parse("tree")?;
    client.create_volume(&volume, &request, None).await?;
    fill(&root.join("tree"), files)?;
    // On the same filesystem as the volumes, so both deletions do the same work.
    let plain = match &btrfs {
        Some(fs) => fs.mount_point().join("plain-tree"),
        None => base.path().join("plain-tree"),
    };
    std::fs::create_dir(&plain)?;
    fill(&plain, files)?;
    sync();

    let t = Instant::now();
    let status = Command::new("rm").arg("-rf").arg(&plain).status()?;
    let rm_time = t.elapsed();
    if !status.success() {
        bail!("rm -rf failed: {status}");
    }
    let t = Instant::now();
    client.delete_volume(&volume, None).await?;
    let agent_time = t.elapsed();
    if root.join("tree").exists() {
        bail!("the tree is still there after DELETE");
    }
    println!(
        "tree of {files} files: DELETE through the agent {:.3}s, rm -rf {:.3}s, ratio {:.2}",
        agent_time.as_secs_f64(),
        rm_time.as_secs_f64(),
        agent_time.as_secs_f64() / rm_time.as_secs_f64()
    );
    agent.stop().await?;
    Ok(())
}

/// `files` small files in subdirectories of 1,000 (a typical application layout).
fn fill(dir: &Path, files: usize) -> std::io::Result<()> {
    for i in 0..files {
        let sub = dir.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(sub.join(format!("file-{i}")), b"0123456789")?;
    }
    Ok(())
}

fn sync() {
    let _ = Command::new("sync").status();
}

fn pct(samples: &mut [Duration], percentile: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((percentile / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}ms", d.as_secs_f64() * 1000.0)
}
