//! Peak resident memory of the agent, as a process of its own over HTTPS, on what a
//! tenant may store: a usage walk of a volume of many subdirectories with 250-byte names
//! (and two such walks at once), the deletion of a volume of many files with such names,
//! and a clone of a volume of many hard-linked files; and the list of many volumes, whole
//! and in pages, on the agent's side and on the side of an orphan check paging through it.
//! Each figure is the agent's (or this process's) `VmHWM` from `/proc` after the
//! operation, reset (`clear_refs`) just before it. Prints figures; fails (exit status 1)
//! only when an operation fails or a listing is incomplete.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::Parser;
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig, CloneOutcome};
use nfsprov_api_types::{
    CloneVolumeRequest, CreateVolumeRequest, MAX_PAGE_LIMIT, QuotaPolicy, VolumeOwner, VolumePath,
};
use nfsprov_vocabulary::orphans::{Finding, Listing, PvPointer, compare};

const MIB: u64 = 1 << 20;
/// Names as long as a tenant may make them, nearly.
const NAME_LEN: usize = 250;

#[derive(Debug, Parser)]
#[command(about = "Peak memory of the nfsprov agent on huge volumes")]
struct Args {
    /// Subdirectories of the volume walked for its usage; 0 skips the case.
    #[arg(long, default_value_t = 1_000_000)]
    directories: usize,
    /// Also walk two such volumes at once.
    #[arg(long)]
    two_walks: bool,
    /// Files of the volume deleted; 0 skips the case.
    #[arg(long, default_value_t = 1_000_000)]
    files: usize,
    /// Names of the volume cloned: files with two names each, every first name in one
    /// directory and every second in another; 0 skips the case.
    #[arg(long, default_value_t = 3_000_000)]
    hard_links: usize,
    /// Volumes made for the list case; 0 skips it.
    #[arg(long, default_value_t = 0)]
    volumes: usize,
    /// Volumes per page in the list case.
    #[arg(long, default_value_t = MAX_PAGE_LIMIT)]
    page: u32,
    /// The agent binary; by default the one built beside this benchmark.
    #[arg(long)]
    agent: Option<PathBuf>,
    /// Directory the export root is made in.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
}

fn long_name(i: usize) -> String {
    let prefix = format!("{i:08}-");
    format!("{prefix}{}", "n".repeat(NAME_LEN - prefix.len()))
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).expect("a valid volume path")
}

/// The agent as a process, stopped when dropped.
struct Agent {
    child: Child,
    client: AgentClient,
    root: PathBuf,
    _temp: tempfile::TempDir,
}

impl Agent {
    async fn start(binary: &Path, dir: &Path) -> anyhow::Result<Agent> {
        let temp = tempfile::tempdir_in(dir)?;
        let root = temp.path().join("export");
        std::fs::create_dir(&root)?;
        let etc = temp.path().join("etc");
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        init::run(&InitArgs {
            dir: etc.clone(),
            export_root: root.clone(),
            hostnames: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse()?],
            listen: format!("127.0.0.1:{port}"),
            name: "bench".into(),
            nfs_server: None,
            nfs_path: None,
            namespace: "nfsprov".into(),
            force: false,
            days: 1,
            // Test export roots are directories of a filesystem that holds more.
            shared_filesystem: true,
        })?;
        let child = Command::new(binary)
            .args(["run", "--config"])
            .arg(etc.join(files::CONFIG))
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
        let agent = Agent {
            child,
            client,
            root,
            _temp: temp,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while agent.client.healthz().await.is_err() {
            ensure!(Instant::now() < deadline, "the agent did not come up");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(agent)
    }

    /// Resets the peak to what the agent holds now; answers that, in bytes.
    fn reset_peak(&self) -> anyhow::Result<u64> {
        reset_peak(&self.child.id().to_string())
    }

    fn peak(&self) -> anyhow::Result<u64> {
        peak(&self.child.id().to_string())
    }

    async fn create(&self, volume: &str) -> anyhow::Result<PathBuf> {
        let request = CreateVolumeRequest {
            capacity_bytes: 1 << 40,
            ..Default::default()
        };
        self.client
            .create_volume(&path(volume), &request, None)
            .await?;
        Ok(self.root.join(volume))
    }

    async fn usage(&self, volume: &str) -> anyhow::Result<u64> {
        loop {
            let found = self
                .client
                .get_volume(&path(volume), None)
                .await?
                .context("the volume is gone")?;
            if let Some(usage) = found.usage {
                return Ok(usage.used_inodes);
            }
        }
    }
}

fn status_kib(pid: &str, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in the status of process {pid}"))
}

/// Resets the peak of process `pid` (`self` for this one) to what it holds now; answers
/// that, in bytes.
fn reset_peak(pid: &str) -> anyhow::Result<u64> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")?;
    Ok(status_kib(pid, "VmRSS:")? * 1024)
}

fn peak(pid: &str) -> anyhow::Result<u64> {
    Ok(status_kib(pid, "VmHWM:")? * 1024)
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn report(case: &str, before: u64, peak: u64, took: Duration) {
    println!(
        "{case:<48} rss before {:>5} MiB   peak {:>5} MiB   grew {:>5} MiB   {:>6.1} s",
        before / MIB,
        peak / MIB,
        peak.saturating_sub(before) / MIB,
        took.as_secs_f64()
    );
}

fn fill_directories(dir: &Path, count: usize) -> anyhow::Result<()> {
    for i in 0..count {
        std::fs::create_dir(dir.join(long_name(i)))?;
    }
    Ok(())
}

async fn walks(agent: &Agent, args: &Args) -> anyhow::Result<()> {
    let count = args.directories;
    fill_directories(&agent.create("tenant/wide-1").await?, count)?;
    let before = agent.reset_peak()?;
    let started = Instant::now();
    let inodes = agent.usage("tenant/wide-1").await?;
    ensure!(inodes == count as u64 + 1, "walk counted {inodes} inodes");
    report(
        &format!("usage walk, {count} dirs"),
        before,
        agent.peak()?,
        started.elapsed(),
    );
    if args.two_walks {
        fill_directories(&agent.create("tenant/wide-2").await?, count)?;
        fill_directories(&agent.create("tenant/wide-3").await?, count)?;
        let before = agent.reset_peak()?;
        let started = Instant::now();
        let (a, b) = tokio::join!(agent.usage("tenant/wide-2"), agent.usage("tenant/wide-3"));
        ensure!(a? == count as u64 + 1 && b? == count as u64 + 1);
        report(
            &format!("two usage walks at once, {count} dirs each"),
            before,
            agent.peak()?,
            started.elapsed(),
        );
    }
    Ok(())
}

async fn delete(agent: &Agent, count: usize) -> anyhow::Result<()> {
    let dir = agent.create("tenant/files").await?;
    for i in 0..count {
        std::fs::write(dir.join(long_name(i)), b"")?;
    }
    let before = agent.reset_peak()?;
    let started = Instant::now();
    agent
        .client
        .delete_volume(&path("tenant/files"), None)
        .await?;
    ensure!(!dir.exists(), "the volume is still there");
    report(
        &format!("delete, {count} files"),
        before,
        agent.peak()?,
        started.elapsed(),
    );
    Ok(())
}

async fn clone(agent: &Agent, names: usize) -> anyhow::Result<()> {
    let files = names / 2;
    let dir = agent.create("tenant/linked").await?;
    let (first, second) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir(&first)?;
    std::fs::create_dir(&second)?;
    for i in 0..files {
        let name = long_name(i);
        std::fs::write(first.join(&name), b"")?;
        std::fs::hard_link(first.join(&name), second.join(&name))?;
    }
    let request = CloneVolumeRequest {
        source: path("tenant/linked"),
        capacity_bytes: 1 << 40,
        owner: VolumeOwner::default(),
        quota: QuotaPolicy::BestEffort,
        export: None,
    };
    let before = agent.reset_peak()?;
    let started = Instant::now();
    loop {
        match agent
            .client
            .clone_volume(&path("tenant/linked-copy"), &request, None)
            .await?
        {
            CloneOutcome::Ready(_) => break,
            CloneOutcome::InProgress(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    let took = started.elapsed();
    let peak = agent.peak()?;
    let copy = agent.root.join("tenant/linked-copy");
    let (a, b) = (
        std::fs::metadata(copy.join("a").join(long_name(0)))?,
        std::fs::metadata(copy.join("b").join(long_name(0)))?,
    );
    if a.ino() != b.ino() {
        bail!("the clone lost a hard link");
    }
    report(
        &format!("clone, {files} files with 2 names ({names} names)"),
        before,
        peak,
        took,
    );
    Ok(())
}

fn volume_name(i: usize) -> String {
    format!("ns-{:03}/pvc-{i:08x}-claim-{i}", i % 500)
}

/// The volumes' PVs as the orphan check sees them: all but the first have one, and one
/// more PV points to a volume that does not exist. A complete listing finds exactly
/// those two.
fn pointers(count: usize) -> Vec<PvPointer> {
    (1..=count)
        .map(|i| {
            let path = if i == count {
                "ns-missing/none".to_owned()
            } else {
                volume_name(i)
            };
            PvPointer {
                pv: format!("pvc-{i:08x}"),
                agent: "bench".into(),
                path,
                claim: Some(format!("ns/claim-{i}")),
                expects_directory: true,
            }
        })
        .collect()
}

fn check_findings(findings: &[Finding]) -> anyhow::Result<()> {
    let unreferenced: Vec<&str> = findings
        .iter()
        .filter_map(|f| match f {
            Finding::Unreferenced { path, .. } => Some(path.as_str()),
            Finding::Missing { .. } => None,
        })
        .collect();
    ensure!(
        unreferenced == [volume_name(0).as_str()] && findings.len() == 2,
        "the orphan check found {findings:?}"
    );
    Ok(())
}

async fn lists(agent: &Agent, count: usize, page: u32) -> anyhow::Result<()> {
    let started = Instant::now();
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        owner: VolumeOwner {
            pvc_namespace: Some("ns".into()),
            pvc_name: Some("claim".into()),
            pv_name: Some("pvc-00000000-0000-0000-0000-000000000000".into()),
        },
        ..Default::default()
    };
    let client = &agent.client;
    let made = std::sync::atomic::AtomicUsize::new(0);
    let workers = (0..64).map(|_| async {
        loop {
            let i = made.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if i >= count {
                return Ok::<_, anyhow::Error>(());
            }
            client
                .create_volume(&path(&volume_name(i)), &request, None)
                .await?;
        }
    });
    for made in futures::future::join_all(workers).await {
        made?;
    }
    println!(
        "made {count} volumes in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let pointers = pointers(count);
    // Pages first: memory the whole list took is not all given back to the system.

    let before = agent.reset_peak()?;
    let started = Instant::now();
    let mut listed = 0;
    client
        .for_each_volume_page(page, None, |volumes| listed += volumes.len())
        .await?;
    let took = started.elapsed();
    ensure!(listed == count, "the pages held {listed}");
    report(
        &format!("agent: pages of {page}, {count} volumes"),
        before,
        agent.peak()?,
        took,
    );

    let before = agent.reset_peak()?;
    let started = Instant::now();
    let whole = client.list_volumes(None).await?;
    let took = started.elapsed();
    ensure!(whole.len() == count, "the whole list held {}", whole.len());
    report(
        &format!("agent: whole list, {count} volumes"),
        before,
        agent.peak()?,
        took,
    );
    drop(whole);

    // The caller's side: this process, running the comparison the controller's check
    // and `kubectl nfsprov orphans` run, page by page and then on the whole list.
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs();
    let now = k8s_openapi::jiff::Timestamp::from_second(i64::try_from(seconds)?)
        .map_err(|e| anyhow::anyhow!("the time now: {e}"))?;

    let before = reset_peak("self")?;
    let started = Instant::now();
    let mut listing = Listing::new("bench", &pointers, Duration::ZERO, now);
    client
        .for_each_volume_page(page, None, |volumes| listing.add(&volumes))
        .await?;
    let findings = listing.finish(&pointers);
    let took = started.elapsed();
    check_findings(&findings)?;
    report(
        &format!("orphan check: pages of {page}, {count} volumes"),
        before,
        peak("self")?,
        took,
    );

    let before = reset_peak("self")?;
    let started = Instant::now();
    let whole = client.list_volumes(None).await?;
    let findings = compare("bench", &whole, &pointers, &pointers, Duration::ZERO, now);
    drop(whole);
    let took = started.elapsed();
    check_findings(&findings)?;
    report(
        &format!("orphan check: whole list, {count} volumes"),
        before,
        peak("self")?,
        took,
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let binary = match &args.agent {
        Some(binary) => binary.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("the benchmark's directory")?
            .join("nfsprov-agent"),
    };
    println!("agent: {}", binary.display());
    // A fresh agent per case, so each starts from the same memory.
    if args.directories > 0 {
        walks(&Agent::start(&binary, &args.dir).await?, &args).await?;
    }
    if args.files > 0 {
        delete(&Agent::start(&binary, &args.dir).await?, args.files).await?;
    }
    if args.hard_links > 0 {
        clone(&Agent::start(&binary, &args.dir).await?, args.hard_links).await?;
    }
    if args.volumes > 0 {
        lists(
            &Agent::start(&binary, &args.dir).await?,
            args.volumes,
            args.page,
        )
        .await?;
    }
    Ok(())
}
