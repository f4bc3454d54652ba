//! Incremental replicas between two agents, file by file: two real agents in this
//! process on loopback HTTPS, a volume of incompressible files on the first, a snapshot
//! received in full by the second, then part of the volume rewritten and a second
//! snapshot received with the first replica as its base. Beside them, in the same run on
//! the same filesystem: `rsync -a --stats` of the volume to a local directory (full, then
//! after the same change) and `cp -a` (full). Prints figures; asserts nothing.
//!
//!   cargo build --release --locked -p nfsprov-e2e --bin nfsprov-replication-bench &&
//!     target/release/nfsprov-replication-bench --size-mib 1024 --file-mib 8 --changed-mib 10

#[path = "replication_bench/baseline.rs"]
mod baseline;

use std::fs::{File, OpenOptions};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Parser;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{
    CreateSnapshotRequest, CreateTransferRequest, CreateVolumeRequest, ReceiveReplicaRequest,
    ReplicaOutcome, SnapshotName, TransferGrant, VolumeOwner, VolumePath,
};

use baseline::Copy;

const MIB: u64 = 1 << 20;

#[derive(Debug, Parser)]
#[command(about = "Measure incremental replicas between two agents beside rsync and cp -a")]
struct Args {
    /// Size of the volume's data, in MiB (a multiple of --file-mib).
    #[arg(long, default_value_t = 1024)]
    size_mib: u64,
    /// Size of each file of the volume, in MiB.
    #[arg(long, default_value_t = 8)]
    file_mib: u64,
    /// Data rewritten between the two snapshots, in MiB: the first MiB of the volume
    /// taken in file order (whole files, then the start of the next one), rewritten in
    /// place with new random bytes, every size unchanged.
    #[arg(long, default_value_t = 10)]
    changed_mib: u64,
    /// Where the run makes its directories (a temporary directory of its own inside):
    /// both agents' export roots and the baselines' copies.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
}

/// /proc/loadavg's 1, 5 and 15 minute averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|e| format!("(unreadable: {e})"))
}

/// The type of the filesystem `dir` is on, as mounted (`stat -f` says "ext2/ext3" for
/// ext4).
fn filesystem_of(dir: &Path) -> String {
    std::process::Command::new("findmnt")
        .args(["-n", "-o", "FSTYPE", "--target"])
        .arg(dir)
        .output()
        .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_owned())
        .unwrap_or_else(|e| format!("(findmnt: {e})"))
}

fn name(n: &str) -> SnapshotName {
    SnapshotName::parse(n).expect("a valid snapshot name")
}

fn file_name(i: u64) -> String {
    format!("data-{i:05}.bin")
}

/// Writes `bytes` from the kernel's random source at the start of `file` (new random
/// bytes do not compress, and share no block with what was there).
fn write_random(file: &Path, bytes: u64, create: bool) -> anyhow::Result<()> {
    let mut random = File::open("/dev/urandom")?.take(bytes);
    let mut out = OpenOptions::new()
        .write(true)
        .create(create)
        .truncate(create)
        .open(file)
        .with_context(|| file.display().to_string())?;
    let copied = std::io::copy(&mut random, &mut out)?;
    anyhow::ensure!(
        copied == bytes,
        "{}: wrote {copied} of {bytes} bytes",
        file.display()
    );
    out.flush()?;
    Ok(())
}

/// The files of the volume: `files` files of `file_bytes` each.
fn fill(tree: &Path, files: u64, file_bytes: u64) -> anyhow::Result<()> {
    for i in 0..files {
        write_random(&tree.join(file_name(i)), file_bytes, true)?;
    }
    Ok(())
}

/// Rewrites the first `changed_bytes` of the volume in file order; returns the files
/// touched.
fn change(tree: &Path, changed_bytes: u64, file_bytes: u64) -> anyhow::Result<u64> {
    let (mut left, mut i) = (changed_bytes, 0);
    while left > 0 {
        let bytes = left.min(file_bytes);
        write_random(&tree.join(file_name(i)), bytes, false)?;
        left -= bytes;
        i += 1;
    }
    Ok(i)
}

/// Asks for the snapshot until the agent answers it ready; returns the time taken.
async fn snapshot(
    client: &AgentClient,
    snapshot: &str,
    source: &VolumePath,
) -> anyhow::Result<Duration> {
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3600);
    loop {
        if client
            .create_snapshot(&name(snapshot), &request, None)
            .await?
            .ready
        {
            return Ok(started.elapsed());
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{snapshot} not ready after an hour"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn grant(source: &TestAgent, snapshot: &str) -> anyhow::Result<TransferGrant> {
    Ok(source
        .client()
        .create_transfer(
            &name(snapshot),
            &CreateTransferRequest {
                ttl_seconds: Some(3600),
            },
            None,
        )
        .await?)
}

/// Receives `snapshot` of `source` on `target` as `replica`, repeating the request as
/// a controller would until the replica is there; returns the answer and the time from
/// the first request.
async fn receive(
    source: &TestAgent,
    target: &TestAgent,
    snapshot: &str,
    replica: &str,
    base: Option<&str>,
) -> anyhow::Result<(ReplicaOutcome, Duration)> {
    let ca = std::fs::read_to_string(
        source
            .credentials_dir()
            .join(nfsprov_agent::init::files::CA_CERT),
    )?;
    let grant = grant(source, snapshot).await?;
    let request = ReceiveReplicaRequest {
        source_url: source.connection().url,
        source_ca_pem: ca,
        grant,
        base: base.map(name),
    };
    let client = target.client();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(3600);
    loop {
        let answer = client
            .receive_replica(&name(replica), &request, None)
            .await?;
        if answer.snapshot.ready {
            return Ok((answer, started.elapsed()));
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "{replica} not received after an hour"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs file work and the baselines' commands off the agents' runtime threads.
async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(work).await?
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// One run of the table: the agent's replica and the baselines'.
struct Row {
    run: &'static str,
    replica: ReplicaOutcome,
    replica_time: Duration,
    rsync: Copy,
    cp: Option<Copy>,
}

fn print_table(rows: &[Row], volume_bytes: u64) {
    println!(
        "| run | agent replica: time | agent: bytes sent (files) | agent: bytes reused (files) | rsync: time (+ sync) | rsync: bytes sent (literal data) | `cp -a`: time (+ sync) | sent / volume: agent / rsync |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for row in rows {
        let rsync_sent = row.rsync.bytes_sent.unwrap_or_default();
        let cp = row.cp.as_ref().map_or_else(
            || "-".to_owned(),
            |cp| {
                format!(
                    "{:.2} s ({:.2} s)",
                    cp.time.as_secs_f64(),
                    cp.with_sync.as_secs_f64()
                )
            },
        );
        println!(
            "| {} | {:.2} s | {:.2} MiB ({}) | {:.2} MiB ({}) | {:.2} s ({:.2} s) | {:.2} MiB ({:.2} MiB) | {} | {:.4} / {:.4} |",
            row.run,
            row.replica_time.as_secs_f64(),
            mib(row.replica.fetched_bytes),
            row.replica.fetched_files,
            mib(row.replica.reused_bytes),
            row.replica.reused_files,
            row.rsync.time.as_secs_f64(),
            row.rsync.with_sync.as_secs_f64(),
            mib(rsync_sent),
            mib(row.rsync.literal_bytes.unwrap_or_default()),
            cp,
            row.replica.fetched_bytes as f64 / volume_bytes as f64,
            rsync_sent as f64 / volume_bytes as f64,
        );
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    anyhow::ensure!(
        args.file_mib > 0 && args.size_mib > 0 && args.size_mib % args.file_mib == 0,
        "--size-mib must be a positive multiple of --file-mib"
    );
    anyhow::ensure!(
        args.changed_mib <= args.size_mib,
        "--changed-mib is more than the volume"
    );
    println!(
        "command: {}",
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    std::fs::create_dir_all(&args.dir)?;
    let base = tempfile::Builder::new()
        .prefix("nfsprov-replication-bench-")
        .tempdir_in(&args.dir)?;
    println!(
        "{}: {}; {} cores; {}",
        args.dir.display(),
        filesystem_of(&args.dir),
        std::thread::available_parallelism().map_or(0, usize::from),
        baseline::rsync_version()
    );
    let load_before = load_average();
    println!("load average at start: {load_before}");

    let (source_root, target_root) = (base.path().join("source"), base.path().join("target"));
    let (rsync_copy, cp_copy) = (base.path().join("rsync"), base.path().join("cp"));
    for dir in [&source_root, &target_root, &rsync_copy] {
        std::fs::create_dir_all(dir)?;
    }
    let source = TestAgent::start(&source_root).await?;
    let target = TestAgent::start(&target_root).await?;
    let volume = VolumePath::parse("bench/replicated")?;
    source
        .client()
        .create_volume(
            &volume,
            &CreateVolumeRequest {
                capacity_bytes: args.size_mib * MIB * 2,
                owner: VolumeOwner {
                    pvc_namespace: Some("bench".into()),
                    pvc_name: Some("replicated".into()),
                    pv_name: Some("pvc-replicated".into()),
                },
                ..CreateVolumeRequest::default()
            },
            None,
        )
        .await?;
    let tree = source_root.join(volume.as_str());
    let volume_bytes = args.size_mib * MIB;

    let started = Instant::now();
    {
        let (tree, files, file_bytes) = (
            tree.clone(),
            args.size_mib / args.file_mib,
            args.file_mib * MIB,
        );
        blocking(move || fill(&tree, files, file_bytes)).await?;
    }
    println!(
        "volume: {} files of {} MiB of random data written in {:.2} s",
        args.size_mib / args.file_mib,
        args.file_mib,
        started.elapsed().as_secs_f64()
    );
    println!(
        "snapshot 1 ready in {:.2} s",
        snapshot(&source.client(), "bench-1", &volume)
            .await?
            .as_secs_f64()
    );

    let (first, first_time) = receive(&source, &target, "bench-1", "replica-1", None).await?;
    println!(
        "full replica: {:.2} s, fetched {} files {:.2} MiB, reused {} files",
        first_time.as_secs_f64(),
        first.fetched_files,
        mib(first.fetched_bytes),
        first.reused_files
    );
    let rsync_full = {
        let (from, to) = (tree.clone(), rsync_copy.clone());
        blocking(move || baseline::rsync(&from, &to)).await?
    };
    println!(
        "rsync full: {:.2} s ({:.2} s with sync), sent {:.2} MiB",
        rsync_full.time.as_secs_f64(),
        rsync_full.with_sync.as_secs_f64(),
        mib(rsync_full.bytes_sent.unwrap_or_default())
    );
    let cp_full = {
        let (from, to) = (tree.clone(), cp_copy.clone());
        blocking(move || baseline::cp(&from, &to)).await?
    };
    println!(
        "cp -a full: {:.2} s ({:.2} s with sync)",
        cp_full.time.as_secs_f64(),
        cp_full.with_sync.as_secs_f64()
    );

    let touched = {
        let (tree, changed, file_bytes) =
            (tree.clone(), args.changed_mib * MIB, args.file_mib * MIB);
        blocking(move || change(&tree, changed, file_bytes)).await?
    };
    println!(
        "changed: the first {} MiB of the volume in file order, {touched} files touched",
        args.changed_mib
    );
    println!(
        "snapshot 2 ready in {:.2} s",
        snapshot(&source.client(), "bench-2", &volume)
            .await?
            .as_secs_f64()
    );
    let (second, second_time) =
        receive(&source, &target, "bench-2", "replica-2", Some("replica-1")).await?;
    println!(
        "incremental replica: {:.2} s, fetched {} files {:.2} MiB, reused {} files {:.2} MiB",
        second_time.as_secs_f64(),
        second.fetched_files,
        mib(second.fetched_bytes),
        second.reused_files,
        mib(second.reused_bytes)
    );
    let rsync_incremental = {
        let (from, to) = (tree.clone(), rsync_copy.clone());
        blocking(move || baseline::rsync(&from, &to)).await?
    };
    println!(
        "rsync incremental: {:.2} s ({:.2} s with sync), sent {:.2} MiB",
        rsync_incremental.time.as_secs_f64(),
        rsync_incremental.with_sync.as_secs_f64(),
        mib(rsync_incremental.bytes_sent.unwrap_or_default())
    );

    source.stop().await?;
    target.stop().await?;
    let load_after = load_average();
    println!();
    println!(
        "volume {} MiB in {} files of {} MiB; change: the first {} MiB ({touched} files); \
         load average {load_before} at start, {load_after} at the end",
        args.size_mib,
        args.size_mib / args.file_mib,
        args.file_mib,
        args.changed_mib
    );
    println!();
    print_table(
        &[
            Row {
                run: "full",
                replica: first,
                replica_time: first_time,
                rsync: rsync_full,
                cp: Some(cp_full),
            },
            Row {
                run: "incremental",
                replica: second,
                replica_time: second_time,
                rsync: rsync_incremental,
                cp: None,
            },
        ],
        volume_bytes,
    );
    println!(
        "\n(agent: bytes sent are the file data fetched over HTTPS, without the manifest \
         and the HTTP/TLS framing; rsync: its \"Total bytes sent\", its protocol included, \
         between two local directories without TLS)"
    );
    Ok(())
}
