//! `--sizes-and-pages` of the agent bench: a btrfs snapshot of a large tree, a ZFS
//! snapshot, and a page of the archive list among many archives, each timed on two agent
//! binaries as processes of their own (an earlier build and this one) in the same run,
//! their turns interleaved. Prints figures; fails only when an operation fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use futures::StreamExt;
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_agent_testkit::{LoopBtrfs, ZfsPool};
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};
use nfsprov_api_types::{
    CreateSnapshotRequest, CreateVolumeRequest, QuotaPolicy, SnapshotName, VolumePath,
};

/// What the bench compares, and how much of it.
pub struct SizesArgs {
    pub before: PathBuf,
    pub after: PathBuf,
    pub tree_files: usize,
    pub archives: usize,
    pub page: u32,
    pub repeats: usize,
    pub dir: PathBuf,
}

/// The agent as a process, stopped when dropped.
struct AgentProcess {
    child: Child,
    client: AgentClient,
}

impl AgentProcess {
    /// Starts `binary` on `root` with the `[quota]` lines given; `etc` holds its files.
    async fn start(binary: &Path, root: &Path, etc: &Path, quota: &str) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        if etc.exists() {
            std::fs::remove_dir_all(etc)?;
        }
        init::run(&InitArgs {
            dir: etc.to_owned(),
            export_root: root.to_owned(),
            hostnames: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse()?],
            listen: format!("127.0.0.1:{port}"),
            name: "bench".into(),
            nfs_server: None,
            nfs_path: None,
            namespace: "nfsprov".into(),
            force: false,
            days: 1,
            shared_filesystem: true,
        })?;
        let config = etc.join(files::CONFIG);
        let mut settings = std::fs::read_to_string(&config)?;
        settings.push_str(&format!("\n[quota]\n{quota}\n"));
        std::fs::write(&config, settings)?;
        let child = Command::new(binary)
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        let client = AgentClient::new(&AgentConnectionConfig {
            name: "bench".into(),
            url: format!("https://localhost:{port}"),
            ca_file: etc.join(files::CA_CERT),
            token_file: Some(etc.join(files::TOKEN)),
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: 3600,
            nfs_server: None,
            nfs_path: None,
            default: false,
        })?;
        let mut agent = AgentProcess { child, client };
        let deadline = Instant::now() + Duration::from_secs(60);
        while agent.client.healthz().await.is_err() {
            if let Some(status) = agent.child.try_wait()? {
                bail!("{} exited: {status}", binary.display());
            }
            ensure!(Instant::now() < deadline, "the agent did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(agent)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn path(raw: &str) -> anyhow::Result<VolumePath> {
    Ok(VolumePath::parse(raw)?)
}

/// Takes snapshot `name` of `source`, answering the time until it was ready.
async fn time_snapshot(
    client: &AgentClient,
    name: &str,
    source: &VolumePath,
) -> anyhow::Result<Duration> {
    let name = SnapshotName::parse(name)?;
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let started = Instant::now();
    loop {
        if client.create_snapshot(&name, &request, None).await?.ready {
            return Ok(started.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn median(mut values: Vec<Duration>) -> Duration {
    values.sort_unstable();
    values[values.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

const LABELS: [&str; 2] = ["before", "after"];

pub async fn run(args: SizesArgs) -> anyhow::Result<()> {
    let binaries = [args.before.clone(), args.after.clone()];
    for binary in &binaries {
        ensure!(binary.exists(), "no agent binary {}", binary.display());
    }
    println!(
        "agents: before {}, after {}; {} repeats each, turns interleaved",
        args.before.display(),
        args.after.display(),
        args.repeats
    );
    btrfs_snapshots(&args, &binaries).await?;
    zfs_snapshots(&args, &binaries).await?;
    archive_pages(&args, &binaries).await?;
    Ok(())
}

/// One root per binary on one loop-mounted btrfs with quotas, a volume of `tree_files`
/// files in each; snapshots taken in turns.
async fn btrfs_snapshots(args: &SizesArgs, binaries: &[PathBuf; 2]) -> anyhow::Result<()> {
    let fs = LoopBtrfs::new(16384, true)?;
    let mut agents = Vec::new();
    let source = path("team/tree")?;
    let request = CreateVolumeRequest {
        capacity_bytes: 4 << 30,
        quota: QuotaPolicy::Enforce,
        ..Default::default()
    };
    for (label, binary) in LABELS.iter().zip(binaries) {
        let root = fs.mount_point().join(format!("export-{label}"));
        std::fs::create_dir(&root)?;
        let etc = args.dir.join(format!("bench-sizes-etc-btrfs-{label}"));
        let agent = AgentProcess::start(binary, &root, &etc, "backend = \"btrfs\"").await?;
        agent.client.create_volume(&source, &request, None).await?;
        fill(&root.join("team/tree"), args.tree_files)?;
        agents.push((agent, etc));
    }
    fs.sync()?;
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..args.repeats {
        for (which, (agent, _)) in agents.iter().enumerate() {
            let took = time_snapshot(&agent.client, &format!("tree-{round}"), &source).await?;
            times[which].push(took);
        }
    }
    for (which, label) in LABELS.iter().enumerate() {
        let taken = agents[which]
            .0
            .client
            .get_snapshot(&SnapshotName::parse("tree-0")?, None)
            .await?;
        println!(
            "btrfs snapshot of a {}-file tree, {label}: median {} (min {}, max {}), size_bytes {:?}",
            args.tree_files,
            ms(median(times[which].clone())),
            ms(*times[which].iter().min().unwrap_or(&Duration::ZERO)),
            ms(*times[which].iter().max().unwrap_or(&Duration::ZERO)),
            taken.size_bytes
        );
    }
    for (agent, etc) in agents {
        drop(agent);
        let _ = std::fs::remove_dir_all(etc);
    }
    Ok(())
}

/// One zfs-fuse pool; each binary in turn serves it (one agent on a dataset at a time),
/// snapshotting a volume of its own.
async fn zfs_snapshots(args: &SizesArgs, binaries: &[PathBuf; 2]) -> anyhow::Result<()> {
    let pool = match ZfsPool::create(1 << 30) {
        Ok(pool) => pool,
        Err(e) => {
            println!("zfs snapshot: not measured ({e})");
            return Ok(());
        }
    };
    let root = pool.export_root().to_owned();
    let quota = format!("backend = \"zfs\"\nzfs_dataset = \"{}\"", pool.dataset());
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        quota: QuotaPolicy::Enforce,
        ..Default::default()
    };
    let mut times = [Vec::new(), Vec::new()];
    for round in 0..args.repeats {
        for (which, (label, binary)) in LABELS.iter().zip(binaries).enumerate() {
            let etc = args.dir.join(format!("bench-sizes-etc-zfs-{label}"));
            let agent = AgentProcess::start(binary, &root, &etc, &quota).await?;
            let source = path(&format!("{label}/tree"))?;
            if round == 0 {
                agent.client.create_volume(&source, &request, None).await?;
                fill(&root.join(source.as_str()), 1_000)?;
            }
            let took = time_snapshot(&agent.client, &format!("{label}-{round}"), &source).await?;
            times[which].push(took);
            drop(agent);
            let _ = std::fs::remove_dir_all(etc);
        }
    }
    for (which, label) in LABELS.iter().enumerate() {
        println!(
            "zfs snapshot (zfs-fuse), {label}: median {} (min {}, max {})",
            ms(median(times[which].clone())),
            ms(*times[which].iter().min().unwrap_or(&Duration::ZERO)),
            ms(*times[which].iter().max().unwrap_or(&Duration::ZERO)),
        );
    }
    Ok(())
}

/// `archives` archives made once on a directory root (no quota), then each binary in
/// turn serves it and reads pages of `page` at several cursors through the list.
async fn archive_pages(args: &SizesArgs, binaries: &[PathBuf; 2]) -> anyhow::Result<()> {
    let base = tempfile::tempdir_in(&args.dir)?;
    let root = base.path().join("export");
    std::fs::create_dir(&root)?;
    let etc = base.path().join("etc");
    let quota = "backend = \"none\"";
    let made_in = Instant::now();
    {
        let agent = AgentProcess::start(&binaries[1], &root, &etc, quota).await?;
        let request = CreateVolumeRequest {
            capacity_bytes: 1 << 20,
            ..Default::default()
        };
        let client = &agent.client;
        futures::stream::iter(0..args.archives)
            .map(|i| {
                let request = request.clone();
                async move {
                    let volume = path(&format!("team-{}/claim-{i:06}", i % 100))?;
                    client.create_volume(&volume, &request, None).await?;
                    client.archive_volume(&volume, None, None).await?;
                    anyhow::Ok(())
                }
            })
            .buffer_unordered(16)
            .collect::<Vec<_>>()
            .await
            .into_iter()
            .collect::<anyhow::Result<Vec<()>>>()?;
    }
    println!(
        "archive list: {} archives made in {:.1} s",
        args.archives,
        made_in.elapsed().as_secs_f64()
    );
    // Each page timed from the answer before it (the first from the request), through
    // the whole list in pages.
    let mut times = [Vec::new(), Vec::new()];
    for _ in 0..args.repeats {
        for (which, binary) in binaries.iter().enumerate() {
            let agent = AgentProcess::start(binary, &root, &etc, quota).await?;
            let mut listed = 0;
            let mut last = Instant::now();
            let mut pages = Vec::new();
            agent
                .client
                .for_each_archive_page(args.page, None, |page| {
                    pages.push(last.elapsed());
                    listed += page.len();
                    last = Instant::now();
                })
                .await?;
            ensure!(
                listed == args.archives,
                "the pages held {listed} archives of {}",
                args.archives
            );
            times[which].extend(pages);
            drop(agent);
        }
    }
    for (which, label) in LABELS.iter().enumerate() {
        println!(
            "archive list page of {} at {} archives, {label}: median {} (min {}, max {}), the whole list in pages {:.2} s",
            args.page,
            args.archives,
            ms(median(times[which].clone())),
            ms(*times[which].iter().min().unwrap_or(&Duration::ZERO)),
            ms(*times[which].iter().max().unwrap_or(&Duration::ZERO)),
            times[which].iter().sum::<Duration>().as_secs_f64() / args.repeats as f64,
        );
    }
    Ok(())
}

/// `files` small files beneath `dir`, a thousand per directory: the tree both benches
/// snapshot or delete.
pub(crate) fn fill(dir: &Path, files: usize) -> std::io::Result<()> {
    for i in 0..files {
        let sub = dir.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(sub.join(format!("file-{i}")), b"0123456789")?;
    }
    Ok(())
}
