//! Benchmark of clones through a real agent over HTTPS, on real filesystems, against
//! `cp -a` of the same source on the same filesystem. For each clone method (`copy` on the
//! machine's own root filesystem, `reflink` on a loop-mounted XFS, `btrfs-snapshot` on a
//! loop-mounted btrfs with quotas, `zfs-clone` on a zfs-fuse pool in a file) it clones a
//! tree of many small files and a large sparse file, times the clone from the first
//! request until the agent answers that it is ready, and times `cp -a` of the same source.
//! Prints figures; fails (exit status 1) when a clone is made by another method than the
//! one expected or differs from its source.
//!
//! With `--mode snapshot` it times, per method, a snapshot of the same sources and a
//! restore from it (each from the first request until the agent answers it is ready),
//! beside `cp -a` and `tar czf` of the same source, and checks the restore like a clone.

use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use clap::{Parser, ValueEnum};
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::{LoopBtrfs, LoopXfs, PoolError, TestAgent, ZfsPool};
use nfsprov_api_types::client::{AgentClient, CloneOutcome, CreateOutcome, RestoreOutcome};
use nfsprov_api_types::{
    CloneMethod, CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, QuotaBackend,
    QuotaPolicy, RestoreVolumeRequest, SnapshotMethod, SnapshotName, VolumeOwner, VolumePath,
};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// Small files per directory of the tree.
const FILES_PER_DIR: usize = 1000;
/// The sparse file holds one data extent of this size every `SPARSE_STRIDE` bytes.
const SPARSE_EXTENT: u64 = MIB;
const SPARSE_STRIDE: u64 = 10 * MIB;
/// Left free on every filesystem a case writes to, beyond what it writes.
const SPACE_MARGIN: u64 = 2 * GIB;
/// How often a clone still in progress is asked for again.
const POLL: Duration = Duration::from_millis(100);
/// A clone that takes longer has gone wrong.
const CLONE_LIMIT: Duration = Duration::from_secs(3600);

#[derive(Debug, Parser)]
#[command(about = "Time clones through the nfsprov agent against cp -a, per clone method")]
struct Args {
    /// Small files (1-8 KiB, 1,000 per directory) in the tree case; 0 skips it.
    #[arg(long, default_value_t = 100_000)]
    files: usize,
    /// Apparent size in GiB of the sparse file case (1 MiB of data every 10 MiB); 0 skips it.
    #[arg(long, default_value_t = 10)]
    sparse_gib: u64,
    /// Clone methods to measure, comma-separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "copy,reflink,btrfs-snapshot,zfs-clone"
    )]
    methods: Vec<Method>,
    /// Do not run `cp -a` beside each clone.
    #[arg(long)]
    skip_cp: bool,
    /// Directory on the machine's own filesystem for the `copy` method.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// What to time: clones, or snapshots and restores from them (beside `cp -a` and
    /// `tar czf`).
    #[arg(long, value_enum, default_value = "clone")]
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Clone,
    Snapshot,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Method {
    Copy,
    Reflink,
    BtrfsSnapshot,
    ZfsClone,
}

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Copy => "copy",
            Method::Reflink => "reflink",
            Method::BtrfsSnapshot => "btrfs-snapshot",
            Method::ZfsClone => "zfs-clone",
        }
    }

    fn expected(self) -> CloneMethod {
        match self {
            Method::Copy => CloneMethod::Copy,
            Method::Reflink => CloneMethod::Reflink,
            Method::BtrfsSnapshot => CloneMethod::BtrfsSnapshot,
            Method::ZfsClone => CloneMethod::ZfsClone,
        }
    }

    /// How the agent snapshots a volume where it clones by this method (a restore is then
    /// made by this method).
    fn expected_snapshot(self) -> SnapshotMethod {
        match self {
            Method::Copy => SnapshotMethod::Copy,
            Method::Reflink => SnapshotMethod::Reflink,
            Method::BtrfsSnapshot => SnapshotMethod::BtrfsSnapshot,
            Method::ZfsClone => SnapshotMethod::ZfsSnapshot,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Case {
    Files(usize),
    Sparse(u64),
}

impl Case {
    fn slug(self) -> &'static str {
        match self {
            Case::Files(_) => "files",
            Case::Sparse(_) => "sparse",
        }
    }

    fn label(self) -> String {
        match self {
            Case::Files(n) => format!("{n} files ({} MiB)", files_data_bytes(n) / MIB),
            Case::Sparse(size) => format!(
                "sparse {} GiB ({} MiB data)",
                size / GIB,
                sparse_extents(size) * SPARSE_EXTENT / MIB
            ),
        }
    }

    /// Space one copy of the case takes on disk, about (blocks of 4 KiB, inodes).
    fn disk_bytes(self) -> u64 {
        match self {
            Case::Files(n) => {
                (0..n)
                    .map(|i| file_size(i).div_ceil(4 * KIB) * 4 * KIB + 512)
                    .sum::<u64>()
                    + n.div_ceil(FILES_PER_DIR) as u64 * 64 * KIB
            }
            Case::Sparse(size) => sparse_extents(size) * SPARSE_EXTENT,
        }
    }

    /// The source volume's (and its clone's) capacity.
    fn capacity(self) -> u64 {
        match self {
            Case::Files(n) => n as u64 * 16 * KIB + GIB,
            Case::Sparse(size) => size + GIB,
        }
    }
}

/// Where a method runs: the export root, a directory beside it on the same filesystem
/// for `cp -a`, and what makes both (unmounted or destroyed when dropped).
struct Env {
    filesystem: String,
    root: PathBuf,
    scratch: PathBuf,
    /// Where the filesystem's backing file lives, when it is in one.
    host: PathBuf,
    quota: QuotaSettings,
    policy: QuotaPolicy,
    /// The temp dir, mount or pool; dropped after the agent has stopped.
    _keep: Box<dyn std::any::Any>,
}

/// One line of the table.
struct Row {
    method: Method,
    case: Case,
    filesystem: String,
    result: Outcome,
}

enum Outcome {
    Done(Timings),
    Snapshot(SnapshotTimings),
    Skipped(String),
    /// The clone was made by the expected method but differs from its source.
    Failed(String),
}

/// A snapshot and a restore from it, beside `cp -a` and `tar czf` of the source.
struct SnapshotTimings {
    snapshot: Duration,
    restore: Duration,
    cp: Option<Duration>,
    tar: Option<Duration>,
    /// The archive's size.
    tar_bytes: u64,
}

struct Timings {
    clone: Duration,
    clone_sync: Duration,
    cp: Option<(Duration, Duration)>,
    note: String,
}

fn main() {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let result = tokio::runtime::Runtime::new()
        .map_err(anyhow::Error::from)
        .and_then(|runtime| runtime.block_on(run(args)));
    if let Err(e) = result {
        eprintln!("nfsprov-clone-bench: {e:#}");
        std::process::exit(1);
    }
}

async fn run(args: Args) -> anyhow::Result<()> {
    ensure!(
        rustix::process::geteuid().is_root(),
        "run as root: the benchmark mounts filesystems and keeps files' owners"
    );
    let started = Instant::now();
    let cases: Vec<Case> = [
        (args.files > 0).then_some(Case::Files(args.files)),
        (args.sparse_gib > 0).then_some(Case::Sparse(args.sparse_gib * GIB)),
    ]
    .into_iter()
    .flatten()
    .collect();
    println!("{}", machine());
    match args.mode {
        Mode::Clone => {
            println!(
                "clone: from the first POST /v1/clones until the agent answers Ready (HTTPS, polled every {} ms); cp -a: coreutils `cp -a` of the same source on the same filesystem (its default --reflink=auto shares extents where it can).",
                POLL.as_millis()
            );
            println!(
                "Both start with the source written and synced (`sync -f`), its data in the page cache; the seconds in `clone s` and `cp s` include no sync after, the `+sync` columns add a `sync -f` of the filesystem right after each. ratio = clone / cp (below 1: the agent is faster)."
            );
            println!(
                "{:<15} {:<30} {:>9} {:>9} {:>7} {:>10} {:>10} {:>7}  filesystem",
                "method", "case", "clone s", "cp s", "ratio", "clone+sync", "cp+sync", "ratio"
            );
        }
        Mode::Snapshot => {
            println!(
                "snapshot: from the first PUT /v1/snapshots until the agent answers ready; restore: from the first POST /v1/restores from that snapshot until the agent answers Ready (HTTPS, polled every {} ms). cp -a: coreutils `cp -a` of the same source on the same filesystem; tar czf: GNU tar with gzip of the same source into a file on the same filesystem, as a copy to keep elsewhere would be made.",
                POLL.as_millis()
            );
            println!(
                "All start with the source written and synced, its data in the page cache; no sync after any of them (the agent syncs what it makes before it answers; cp and tar do not)."
            );
            println!(
                "{:<15} {:<30} {:>10} {:>9} {:>9} {:>9} {:>9}  filesystem",
                "method", "case", "snapshot s", "restore s", "cp s", "tar s", "tar MiB"
            );
        }
    }
    let mut failures = Vec::new();
    // Room for every case's source, cp -a copy and clone, were none of them shared, and
    // for metadata; a loop image or pool file is sparse, so only what is written counts.
    let all_cases: u64 = cases.iter().map(|c| c.disk_bytes()).sum();
    let fs_mib = (4 * all_cases + 2 * SPACE_MARGIN).div_ceil(MIB);
    for method in args.methods.iter().copied() {
        progress(started, &format!("{}: setting up", method.name()));
        let env = match setup(method, &args, fs_mib) {
            Ok(env) => env,
            Err(Setup::Skip(reason)) => {
                println!("{:<15} skipped: {reason}", method.name());
                continue;
            }
            Err(Setup::Fail(e)) => return Err(e.context(format!("{}: set up", method.name()))),
        };
        progress(
            started,
            &format!(
                "{}: export root {} on {}",
                method.name(),
                env.root.display(),
                env.filesystem
            ),
        );
        let agent = TestAgent::start_with_quota(&env.root, env.quota.clone()).await?;
        let client = agent.client();
        let mut rows = Vec::new();
        let outcome = async {
            client.healthz().await.context("agent not serving")?;
            for case in cases.iter().copied() {
                let row = run_case(&client, &env, method, case, &args, started).await?;
                print_row(&row);
                rows.push(row);
            }
            anyhow::Ok(())
        }
        .await;
        // Stopped before its filesystem is unmounted or destroyed.
        agent.stop().await?;
        progress(started, &format!("{}: cleaning up", method.name()));
        drop(env);
        outcome?;
        failures.extend(rows.iter().filter_map(|row| match &row.result {
            Outcome::Failed(e) => Some(e.clone()),
            _ => None,
        }));
    }
    progress(
        started,
        &format!("done in {:.1} s", started.elapsed().as_secs_f64()),
    );
    println!("whole run: {:.1} s", started.elapsed().as_secs_f64());
    if !failures.is_empty() {
        bail!("{} case(s) failed: {}", failures.len(), failures.join("; "));
    }
    Ok(())
}

enum Setup {
    Skip(String),
    Fail(anyhow::Error),
}

impl From<anyhow::Error> for Setup {
    fn from(e: anyhow::Error) -> Self {
        Setup::Fail(e)
    }
}

impl From<std::io::Error> for Setup {
    fn from(e: std::io::Error) -> Self {
        Setup::Fail(e.into())
    }
}

fn setup(method: Method, args: &Args, fs_mib: u64) -> Result<Env, Setup> {
    let host = std::env::temp_dir();
    match method {
        Method::Copy => {
            let dir = tempfile::Builder::new()
                .prefix("nfsprov-clone-bench-")
                .tempdir_in(&args.dir)?;
            let root = dir.path().join("export");
            let scratch = dir.path().join("cp");
            std::fs::create_dir(&root)?;
            std::fs::create_dir(&scratch)?;
            Ok(Env {
                filesystem: format!("{} (host, {})", filesystem(&root), args.dir.display()),
                host: root.clone(),
                root,
                scratch,
                quota: QuotaSettings::default(),
                policy: QuotaPolicy::BestEffort,
                _keep: Box::new(dir),
            })
        }
        Method::Reflink => {
            let (keep, root, scratch, note) = match LoopXfs::new(fs_mib, true) {
                Ok(fs) => {
                    let (root, scratch) = (fs.root(), fs.mount_point().join("cp"));
                    let keep: Box<dyn std::any::Any> = Box::new(fs);
                    (keep, root, scratch, "loop, mkfs.xfs -m reflink=1")
                }
                Err(e) => {
                    eprintln!("reflink: no XFS ({e:#}); using a loop btrfs without quotas");
                    let fs = LoopBtrfs::new(fs_mib, false)?;
                    let (root, scratch) = (fs.root(), fs.mount_point().join("cp"));
                    let keep: Box<dyn std::any::Any> = Box::new(fs);
                    (keep, root, scratch, "loop, no quotas; XFS failed")
                }
            };
            std::fs::create_dir(&scratch)?;
            Ok(Env {
                filesystem: format!("{} ({note}, {} GiB)", filesystem(&root), fs_mib / 1024),
                root,
                scratch,
                host,
                quota: QuotaSettings::default(),
                policy: QuotaPolicy::BestEffort,
                _keep: keep,
            })
        }
        Method::BtrfsSnapshot => {
            let fs = LoopBtrfs::new(fs_mib, true)?;
            let (root, scratch) = (fs.root(), fs.mount_point().join("cp"));
            std::fs::create_dir(&scratch)?;
            Ok(Env {
                filesystem: format!(
                    "{} (loop, quotas on, {} GiB)",
                    filesystem(&root),
                    fs_mib / 1024
                ),
                root,
                scratch,
                host,
                quota: QuotaSettings {
                    backend: QuotaBackend::Btrfs,
                    ..QuotaSettings::default()
                },
                policy: QuotaPolicy::Enforce,
                _keep: Box::new(fs),
            })
        }
        Method::ZfsClone => {
            let pool = ZfsPool::create(fs_mib * MIB).map_err(|e| match e {
                PoolError::Unavailable(reason) => Setup::Skip(reason),
                PoolError::Failed(reason) => Setup::Fail(anyhow::anyhow!(reason)),
            })?;
            let root = pool.export_root().to_owned();
            let scratch = pool.pool_mount().join("cp");
            std::fs::create_dir(&scratch)?;
            Ok(Env {
                filesystem: format!(
                    "{} (zfs-fuse pool in a file, {} GiB)",
                    filesystem(&root),
                    fs_mib / 1024
                ),
                root,
                scratch,
                host,
                quota: pool.quota_settings(),
                policy: QuotaPolicy::Enforce,
                _keep: Box::new(pool),
            })
        }
    }
}

async fn run_case(
    client: &AgentClient,
    env: &Env,
    method: Method,
    case: Case,
    args: &Args,
    started: Instant,
) -> anyhow::Result<Row> {
    let name = format!("{} {}", method.name(), case.slug());
    let row = |result| Row {
        method,
        case,
        filesystem: env.filesystem.clone(),
        result,
    };
    // The clone and the cp -a copy each take a full copy at worst.
    let need = case.disk_bytes() * if args.skip_cp { 2 } else { 3 } + SPACE_MARGIN;
    for dir in [&env.root, &env.host] {
        let free = free_bytes(dir)?;
        if free < need {
            return Ok(row(Outcome::Skipped(format!(
                "{} has {} MiB free, the case needs {} MiB",
                dir.display(),
                free / MIB,
                need / MIB
            ))));
        }
    }

    let source = VolumePath::parse(&format!("bench/{}-source", case.slug()))?;
    let target = VolumePath::parse(&format!("bench/{}-clone", case.slug()))?;
    let create = CreateVolumeRequest {
        capacity_bytes: case.capacity(),
        owner: owner(&format!("{}-source", case.slug())),
        quota: env.policy,
        ..CreateVolumeRequest::default()
    };
    client
        .create_volume(&source, &create, None)
        .await
        .with_context(|| format!("{name}: create the source volume"))?;
    let source_dir = env.root.join(source.as_str());
    progress(started, &format!("{name}: writing {}", case.label()));
    match case {
        Case::Files(n) => write_tree(&source_dir, n)?,
        Case::Sparse(size) => write_sparse(&source_dir.join("sparse.img"), size)?,
    }
    sync_fs(&env.root)?;
    if args.mode == Mode::Snapshot {
        let outcome = snapshot_case(
            client,
            env,
            method,
            case,
            args,
            started,
            &source,
            &source_dir,
        )
        .await?;
        return Ok(row(outcome));
    }

    progress(started, &format!("{name}: cloning through the agent"));
    let request = CloneVolumeRequest {
        source: source.clone(),
        capacity_bytes: case.capacity(),
        owner: owner(&format!("{}-clone", case.slug())),
        quota: env.policy,
        export: None,
    };
    let t = Instant::now();
    let made = clone_until_ready(client, &target, &request)
        .await
        .with_context(|| format!("{name}: clone"))?;
    let clone_time = t.elapsed();
    let t = Instant::now();
    sync_fs(&env.root)?;
    let clone_sync = t.elapsed();
    let Some(origin) = made.volume.clone.as_ref() else {
        bail!("{name}: the answer does not say the volume is a clone");
    };
    ensure!(
        origin.method == method.expected() && origin.source == source,
        "{name}: cloned from {} by {}, expected from {source} by {}",
        origin.source,
        origin.method,
        method.expected()
    );
    progress(
        started,
        &format!(
            "{name}: {} in {:.2} s (+{:.2} s sync); checking it",
            origin.method,
            clone_time.as_secs_f64(),
            clone_sync.as_secs_f64()
        ),
    );
    let clone_dir = env.root.join(target.as_str());
    if let Err(e) = verify(case, &source_dir, &clone_dir) {
        return Ok(row(Outcome::Failed(format!(
            "{name}: the clone differs: {e:#}"
        ))));
    }

    let mut note = String::new();
    let cp = if args.skip_cp {
        None
    } else {
        progress(started, &format!("{name}: cp -a"));
        let copy = env.scratch.join(case.slug());
        let t = Instant::now();
        let status = Command::new("cp")
            .arg("-a")
            .arg(&source_dir)
            .arg(&copy)
            .status()
            .context("cannot run cp")?;
        let cp_time = t.elapsed();
        ensure!(status.success(), "{name}: cp -a failed: {status}");
        let t = Instant::now();
        sync_fs(&env.scratch)?;
        let cp_sync = t.elapsed();
        progress(
            started,
            &format!(
                "{name}: cp -a in {:.2} s (+{:.2} s sync); checking it",
                cp_time.as_secs_f64(),
                cp_sync.as_secs_f64()
            ),
        );
        if let Err(e) = verify(case, &source_dir, &copy) {
            note = format!("cp -a copy differs: {e:#}");
        }
        Some((cp_time, cp_sync))
    };
    Ok(row(Outcome::Done(Timings {
        clone: clone_time,
        clone_sync,
        cp,
        note,
    })))
}

/// Times a snapshot of `source` and a restore from it through the agent, then `cp -a`
/// and `tar czf` of the source; checks the restore against the source.
#[allow(clippy::too_many_arguments)]
async fn snapshot_case(
    client: &AgentClient,
    env: &Env,
    method: Method,
    case: Case,
    args: &Args,
    started: Instant,
    source: &VolumePath,
    source_dir: &Path,
) -> anyhow::Result<Outcome> {
    let name = format!("{} {}", method.name(), case.slug());
    let snapshot = SnapshotName::parse(&format!("bench-{}", case.slug()))?;
    progress(started, &format!("{name}: snapshot through the agent"));
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let t = Instant::now();
    let deadline = t + CLONE_LIMIT;
    let taken = loop {
        let answer = client
            .create_snapshot(&snapshot, &request, None)
            .await
            .with_context(|| format!("{name}: snapshot"))?;
        if answer.ready {
            break answer;
        }
        ensure!(
            Instant::now() < deadline,
            "{name}: snapshot still being taken"
        );
        tokio::time::sleep(POLL).await;
    };
    let snapshot_time = t.elapsed();
    ensure!(
        taken.method == method.expected_snapshot(),
        "{name}: snapshot by {}, expected by {}",
        taken.method,
        method.expected_snapshot()
    );

    progress(
        started,
        &format!(
            "{name}: {} in {:.2} s; restoring",
            taken.method,
            snapshot_time.as_secs_f64()
        ),
    );
    let target = VolumePath::parse(&format!("bench/{}-restore", case.slug()))?;
    let restore = RestoreVolumeRequest {
        snapshot: Some(snapshot.clone()),
        archive: None,
        capacity_bytes: taken.restore_size_bytes,
        owner: owner(&format!("{}-restore", case.slug())),
        quota: env.policy,
        export: None,
    };
    let t = Instant::now();
    let restored = loop {
        match client
            .restore_volume(&target, &restore, None)
            .await
            .with_context(|| format!("{name}: restore"))?
        {
            RestoreOutcome::Ready(outcome) => break outcome,
            RestoreOutcome::InProgress(_) => {
                ensure!(Instant::now() < deadline, "{name}: restore still running");
                tokio::time::sleep(POLL).await;
            }
        }
    };
    let restore_time = t.elapsed();
    let Some(origin) = restored.volume.restore.as_ref() else {
        bail!("{name}: the answer does not say the volume is a restore");
    };
    ensure!(
        origin.method == method.expected(),
        "{name}: restored by {}, expected by {}",
        origin.method,
        method.expected()
    );
    progress(
        started,
        &format!(
            "{name}: restored by {} in {:.2} s; checking it",
            origin.method,
            restore_time.as_secs_f64()
        ),
    );
    if let Err(e) = verify(case, source_dir, &env.root.join(target.as_str())) {
        return Ok(Outcome::Failed(format!(
            "{name}: the restore differs: {e:#}"
        )));
    }

    let (mut cp, mut tar, mut tar_bytes) = (None, None, 0);
    if !args.skip_cp {
        progress(started, &format!("{name}: cp -a"));
        let copy = env.scratch.join(case.slug());
        let t = Instant::now();
        let status = Command::new("cp")
            .arg("-a")
            .arg(source_dir)
            .arg(&copy)
            .status()
            .context("cannot run cp")?;
        cp = Some(t.elapsed());
        ensure!(status.success(), "{name}: cp -a failed: {status}");
        std::fs::remove_dir_all(&copy)?;
        progress(started, &format!("{name}: tar czf"));
        let archive = env.scratch.join(format!("{}.tar.gz", case.slug()));
        let t = Instant::now();
        let status = Command::new("tar")
            .arg("czf")
            .arg(&archive)
            .arg("-C")
            .arg(source_dir)
            .arg(".")
            .status()
            .context("cannot run tar")?;
        tar = Some(t.elapsed());
        ensure!(status.success(), "{name}: tar czf failed: {status}");
        tar_bytes = std::fs::metadata(&archive)?.len();
        std::fs::remove_file(&archive)?;
    }
    // The snapshot goes before the next case takes its space.
    client
        .delete_snapshot(&snapshot, None)
        .await
        .with_context(|| format!("{name}: delete the snapshot"))?;
    Ok(Outcome::Snapshot(SnapshotTimings {
        snapshot: snapshot_time,
        restore: restore_time,
        cp,
        tar,
        tar_bytes,
    }))
}

/// Repeats the clone request until the agent answers that the clone is there.
async fn clone_until_ready(
    client: &AgentClient,
    target: &VolumePath,
    request: &CloneVolumeRequest,
) -> anyhow::Result<CreateOutcome> {
    let deadline = Instant::now() + CLONE_LIMIT;
    loop {
        match client.clone_volume(target, request, None).await? {
            CloneOutcome::Ready(outcome) => return Ok(outcome),
            CloneOutcome::InProgress(_) => {
                ensure!(
                    Instant::now() < deadline,
                    "still in progress after {} s",
                    CLONE_LIMIT.as_secs()
                );
                tokio::time::sleep(POLL).await;
            }
        }
    }
}

fn owner(claim: &str) -> VolumeOwner {
    VolumeOwner {
        pvc_namespace: Some("bench".into()),
        pvc_name: Some(claim.into()),
        pv_name: Some(format!("pvc-{claim}")),
    }
}

fn print_row(row: &Row) {
    let head = format!("{:<15} {:<30}", row.method.name(), row.case.label());
    match &row.result {
        Outcome::Skipped(e) => println!("{head} skipped: {e}  {}", row.filesystem),
        Outcome::Failed(e) => println!("{head} FAILED: {e}  {}", row.filesystem),
        Outcome::Snapshot(t) => {
            let seconds =
                |d: Option<Duration>| d.map_or("-".into(), |d| format!("{:.3}", d.as_secs_f64()));
            println!(
                "{head} {:>10.3} {:>9.3} {:>9} {:>9} {:>9}  {}",
                t.snapshot.as_secs_f64(),
                t.restore.as_secs_f64(),
                seconds(t.cp),
                seconds(t.tar),
                t.tar
                    .map_or("-".into(), |_| (t.tar_bytes / MIB).to_string()),
                row.filesystem
            );
        }
        Outcome::Done(t) => {
            let clone = t.clone.as_secs_f64();
            let clone_sync = clone + t.clone_sync.as_secs_f64();
            let (cp, cp_sync, ratio, ratio_sync) = match t.cp {
                Some((cp, sync)) => {
                    let cp = cp.as_secs_f64();
                    let cp_sync = cp + sync.as_secs_f64();
                    (
                        format!("{cp:.3}"),
                        format!("{cp_sync:.3}"),
                        format!("{:.3}", clone / cp),
                        format!("{:.3}", clone_sync / cp_sync),
                    )
                }
                None => ("-".into(), "-".into(), "-".into(), "-".into()),
            };
            let note = if t.note.is_empty() {
                String::new()
            } else {
                format!("  ({})", t.note)
            };
            println!(
                "{head} {clone:>9.3} {cp:>9} {ratio:>7} {clone_sync:>10.3} {cp_sync:>10} {ratio_sync:>7}  {}{note}",
                row.filesystem
            );
        }
    }
}

fn progress(started: Instant, message: &str) {
    eprintln!("[{:>7.1}s] {message}", started.elapsed().as_secs_f64());
}

// ---------------------------------------------------------------------------------------
// The sources and their checks.

/// A fast deterministic generator: data that does not compress, the same every run.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn random_bytes(buf: &mut [u8], seed: u64) {
    let mut state = seed;
    for chunk in buf.chunks_mut(8) {
        let word = splitmix(&mut state).to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
}

/// 1 to 8 KiB.
fn file_size(i: usize) -> u64 {
    let mut state = i as u64 ^ 0x5eed;
    KIB + splitmix(&mut state) % (7 * KIB + 1)
}

fn files_data_bytes(n: usize) -> u64 {
    (0..n).map(file_size).sum()
}

fn file_path(i: usize) -> PathBuf {
    PathBuf::from(format!("d{:04}/f{i:07}", i / FILES_PER_DIR))
}

/// `n` files of random bytes, 1,000 per directory, with owners and modes of several kinds.
fn write_tree(root: &Path, n: usize) -> anyhow::Result<()> {
    let mut buf = vec![0u8; 8 * KIB as usize];
    let dirs = n.div_ceil(FILES_PER_DIR);
    for d in 0..dirs {
        std::fs::create_dir(root.join(format!("d{d:04}")))?;
    }
    for i in 0..n {
        let path = root.join(file_path(i));
        let data = &mut buf[..file_size(i) as usize];
        random_bytes(data, i as u64);
        std::fs::write(&path, &*data).with_context(|| format!("write {}", path.display()))?;
        let mode = [0o644, 0o600, 0o640, 0o755, 0o444][i % 5];
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if i % 3 == 0 {
            let (uid, gid) = (1000 + (i % 7) as u32, 1000 + (i % 11) as u32);
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
    }
    for d in 0..dirs {
        let path = root.join(format!("d{d:04}"));
        let mode = [0o755, 0o750, 0o700, 0o775][d % 4];
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        if d % 2 == 1 {
            std::os::unix::fs::chown(&path, Some(1000 + d as u32), Some(1000))?;
        }
    }
    Ok(())
}

fn sparse_extents(size: u64) -> u64 {
    size / SPARSE_STRIDE
}

/// A file of `size` bytes, holes but for an extent of random data at every stride.
fn write_sparse(path: &Path, size: u64) -> anyhow::Result<()> {
    let file = std::fs::File::create(path)?;
    file.set_len(size)?;
    let mut buf = vec![0u8; SPARSE_EXTENT as usize];
    for k in 0..sparse_extents(size) {
        random_bytes(&mut buf, k);
        file.write_all_at(&buf, k * SPARSE_STRIDE)?;
    }
    Ok(())
}

fn verify(case: Case, source: &Path, copy: &Path) -> anyhow::Result<()> {
    match case {
        Case::Files(n) => verify_tree(n, source, copy),
        Case::Sparse(size) => {
            verify_sparse(size, &source.join("sparse.img"), &copy.join("sparse.img"))
        }
    }
}

/// As many files and directories as the source, and a sample of 200 files alike in
/// content, size, mode, owner and modification time.
fn verify_tree(n: usize, source: &Path, copy: &Path) -> anyhow::Result<()> {
    let (source_dirs, source_files) = count_entries(source)?;
    let (copy_dirs, copy_files) = count_entries(copy)?;
    ensure!(
        source_files == n as u64,
        "the source holds {source_files} files, not {n}"
    );
    ensure!(
        (copy_dirs, copy_files) == (source_dirs, source_files),
        "{copy_dirs} directories and {copy_files} files, the source {source_dirs} and {source_files}"
    );
    let step = (n / 200).max(1);
    for i in (0..n).step_by(step).chain([n - 1]) {
        let (a, b) = (source.join(file_path(i)), copy.join(file_path(i)));
        let (ma, mb) = (
            std::fs::symlink_metadata(&a)?,
            std::fs::symlink_metadata(&b)?,
        );
        let key = |m: &std::fs::Metadata| {
            (
                m.len(),
                m.mode(),
                m.uid(),
                m.gid(),
                m.mtime(),
                m.mtime_nsec(),
            )
        };
        ensure!(
            key(&ma) == key(&mb),
            "{}: {:?} against {:?}",
            b.display(),
            key(&mb),
            key(&ma)
        );
        ensure!(
            std::fs::read(&a)? == std::fs::read(&b)?,
            "{}: other content",
            b.display()
        );
    }
    Ok(())
}

/// Directories and regular files below `dir`.
fn count_entries(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut dirs, mut files) = (0, 0);
    let mut pending = vec![dir.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).with_context(|| format!("list {}", dir.display()))? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs += 1;
                pending.push(entry.path());
            } else if kind.is_file() {
                files += 1;
            }
        }
    }
    Ok((dirs, files))
}

/// The same size, far fewer blocks than the size, and a sample of extents and holes
/// alike.
fn verify_sparse(size: u64, source: &Path, copy: &Path) -> anyhow::Result<()> {
    let (ma, mb) = (std::fs::metadata(source)?, std::fs::metadata(copy)?);
    ensure!(
        mb.len() == size && ma.len() == size,
        "size {} against {size}",
        mb.len()
    );
    let allocated = mb.blocks() * 512;
    ensure!(
        allocated <= size / 4,
        "{} MiB allocated for {} MiB: the holes were filled",
        allocated / MIB,
        size / MIB
    );
    let extents = sparse_extents(size);
    let (a, b) = (std::fs::File::open(source)?, std::fs::File::open(copy)?);
    let mut expected = vec![0u8; SPARSE_EXTENT as usize];
    let (mut from_a, mut from_b) = (expected.clone(), expected.clone());
    let mut state = 7;
    let sample = [0, extents / 2, extents - 1]
        .into_iter()
        .chain((0..8).map(|_| splitmix(&mut state) % extents));
    for k in sample {
        random_bytes(&mut expected, k);
        a.read_exact_at(&mut from_a, k * SPARSE_STRIDE)?;
        b.read_exact_at(&mut from_b, k * SPARSE_STRIDE)?;
        ensure!(
            from_a == expected,
            "the source's extent {k} is not what was written"
        );
        ensure!(from_b == expected, "extent {k} differs");
        b.read_exact_at(&mut from_b, k * SPARSE_STRIDE + SPARSE_STRIDE / 2)?;
        ensure!(
            from_b.iter().all(|&byte| byte == 0),
            "the hole after extent {k} holds data"
        );
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------
// The machine and its filesystems.

fn machine() -> String {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("MemTotal:"))
        .and_then(|kib| kib.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or("?".into(), |kib| {
            format!("{:.1} GiB", kib as f64 / f64::from(1 << 20))
        });
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|line| line.strip_prefix("model name"))
        .map_or("?", |rest| rest.trim_start_matches([' ', '\t', ':']));
    let kernel = output("uname", &["-r"]).unwrap_or_else(|e| e.to_string());
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    format!(
        "machine: nproc {}, {cpu}, memory {memory}, kernel {}, load average at start {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim(),
        load.join(" ")
    )
}

/// What `stat -f` says the filesystem is, with the mount's own type and source.
fn filesystem(path: &Path) -> String {
    let stat = output("stat", &["-f", "-c", "%T", &path.to_string_lossy()]);
    let mount = output(
        "findmnt",
        &["-n", "-o", "FSTYPE", "-T", &path.to_string_lossy()],
    );
    match (stat, mount) {
        (Ok(stat), Ok(mount)) if stat.trim() != mount.trim() => {
            format!("{} [{}]", mount.trim(), stat.trim())
        }
        (Ok(stat), _) => stat.trim().to_owned(),
        (Err(e), _) => format!("? ({e})"),
    }
}

fn free_bytes(path: &Path) -> anyhow::Result<u64> {
    let stat = rustix::fs::statvfs(path).with_context(|| format!("statvfs {}", path.display()))?;
    Ok(stat.f_bavail * stat.f_frsize)
}

fn sync_fs(path: &Path) -> anyhow::Result<()> {
    output("sync", &["-f", &path.to_string_lossy()]).map(drop)
}

fn output(program: &str, args: &[&str]) -> anyhow::Result<String> {
    nfsprov_agent_testkit::run(program, args).map_err(anyhow::Error::msg)
}
