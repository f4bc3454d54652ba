//! Volume backends side by side: quota backend `image` (each volume an ext4 filesystem in
//! a sparse image, loop-mounted at its path) against `none` (each volume a directory), both
//! on one loop-mounted XFS that shares extents (`reflink=1`), in one run, their steps
//! interleaved so that a change in the machine's load falls on both alike. Measures, at the
//! agent's store (`VolumeStore`, no HTTPS): create + delete pairs; the per-volume export
//! add and remove with ganesha's D-Bus export manager (a ganesha and a private bus per
//! backend), and the growth of an exported volume to twice its capacity (an image volume
//! offline where the agent may not grow it mounted); clones and snapshots of a volume holding data (reflinks of the image, or of
//! each file); and, for the image backend, what `mkfs.ext4`, mount and unmount of an
//! image of the same size cost alone. Prints figures; fails only when a step fails or a
//! clone, snapshot or export is not what was asked for. Root required.
//!
//!   cargo build --release -p nfsprov-e2e --bin nfsprov-backend-bench &&
//!     target/release/nfsprov-backend-bench --pairs 200 --exports 200 --repeats 3

use std::fs::File;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use nfsprov_agent::exports::{ExportSettings, Exports, VolumeLayout};
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent::store::{CopyProgress, Layout, STATE_DIR, VolumeStore, backend_for};
use nfsprov_agent_testkit::LoopXfs;
use nfsprov_api_types::{
    CloneMethod, CloneVolumeRequest, CreateVolumeRequest, ExportManager, ExportRequest,
    QuotaBackend, QuotaPolicy, SnapshotMethod, SnapshotName, VolumeOwner, VolumePath,
};
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};

const MIB: u64 = 1 << 20;
/// Pairs, exports and image steps run in blocks of this many per backend, alternately.
const BLOCK: usize = 10;

#[derive(Debug, Parser)]
#[command(about = "Compare the image quota backend with directory volumes (root required)")]
struct Args {
    /// Create + delete pairs per backend.
    #[arg(long, default_value_t = 200)]
    pairs: usize,
    /// Volumes made and exported one at a time per backend.
    #[arg(long, default_value_t = 200)]
    exports: usize,
    /// Clones and snapshots of the data volume per backend.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Capacity of every volume, MiB (an image volume's filesystem holds at least this).
    #[arg(long, default_value_t = 1024)]
    capacity_mib: u64,
    /// Files in the volume that is cloned and snapshotted.
    #[arg(long, default_value_t = 1000)]
    files: usize,
    /// Data in those files, MiB in all.
    #[arg(long, default_value_t = 200)]
    data_mib: u64,
    /// Size of the loop-mounted XFS both backends share, MiB.
    #[arg(long, default_value_t = 8192)]
    xfs_mib: u64,
    /// Runs of `mkfs.ext4`, mount and unmount alone.
    #[arg(long, default_value_t = 20)]
    mkfs_runs: usize,
}

/// One backend's export root and store.
struct Side {
    name: &'static str,
    backend: QuotaBackend,
    root: PathBuf,
    store: VolumeStore,
}

impl Side {
    fn open(name: &'static str, backend: QuotaBackend, root: PathBuf) -> anyhow::Result<Self> {
        std::fs::create_dir_all(&root)?;
        let settings = QuotaSettings {
            backend,
            ..QuotaSettings::default()
        };
        let probed = backend_for(&settings, &root)
            .map_err(|e| anyhow::anyhow!("quota backend {name}: {e}"))?;
        let store = VolumeStore::open_with_backend(&root, probed)?;
        Ok(Self {
            name,
            backend,
            root,
            store,
        })
    }

    fn create(&self, path: &VolumePath, capacity_bytes: u64) -> anyhow::Result<()> {
        let quota = if self.backend == QuotaBackend::None {
            QuotaPolicy::Off
        } else {
            QuotaPolicy::Enforce
        };
        let request = CreateVolumeRequest {
            capacity_bytes,
            quota,
            owner: VolumeOwner::default(),
            ..CreateVolumeRequest::default()
        };
        self.store
            .create(path, &request)
            .with_context(|| format!("{}: create {path}", self.name))?;
        Ok(())
    }

    fn delete(&self, path: &VolumePath) -> anyhow::Result<()> {
        self.store
            .delete(path)
            .with_context(|| format!("{}: delete {path}", self.name))?;
        Ok(())
    }
}

/// Durations of one step, per backend (`none` first, then `image`).
#[derive(Default)]
struct Samples([Vec<Duration>; 2]);

impl Samples {
    fn time<T>(&mut self, side: usize, step: impl FnOnce() -> T) -> T {
        let started = Instant::now();
        let out = step();
        self.0[side].push(started.elapsed());
        out
    }
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn load_average() -> String {
    let text = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    text.split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn print_header() {
    println!(
        "{:<34} {:>5} {:>11} {:>11} {:>11} {:>11} {:>9}",
        "step", "N", "none p50", "none p99", "image p50", "image p99", "image/none"
    );
}

/// A row of p50/p99 in ms and the ratio of the medians.
fn print_row(step: &str, samples: &Samples) {
    let [none, image] = &samples.0;
    let (n50, i50) = (percentile(none, 0.5), percentile(image, 0.5));
    println!(
        "{:<34} {:>5} {:>8.2} ms {:>8.2} ms {:>8.2} ms {:>8.2} ms {:>8.2}x",
        step,
        none.len(),
        ms(n50),
        ms(percentile(none, 0.99)),
        ms(i50),
        ms(percentile(image, 0.99)),
        i50.as_secs_f64() / n50.as_secs_f64()
    );
}

fn volume(prefix: &str, i: usize) -> VolumePath {
    VolumePath::parse(&format!("bench/{prefix}{i:05}")).expect("a valid volume path")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        rustix::process::geteuid().is_root(),
        "this benchmark loop-mounts filesystems: run it as root"
    );
    ensure!(
        args.pairs > 0 && args.exports > 0 && args.repeats > 0 && args.files > 0,
        "--pairs, --exports, --repeats and --files must be at least 1"
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
    println!(
        "kernel {}, {} cores, load average before {}",
        kernel.trim(),
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        load_average()
    );
    let xfs = LoopXfs::new(args.xfs_mib, true)?;
    let sides = [
        Side::open("none", QuotaBackend::None, xfs.root().join("none"))?,
        Side::open("image", QuotaBackend::Image, xfs.root().join("image"))?,
    ];
    let capacity = args.capacity_mib * MIB;
    println!(
        "both on one loop-mounted XFS (reflink=1) of {} MiB; volumes of {} MiB",
        args.xfs_mib, args.capacity_mib
    );
    print_header();

    let image_bytes = pairs(&args, &sides, capacity)?;
    mkfs_alone(&args, &xfs, image_bytes)?;
    runtime.block_on(exports(&args, &sides, capacity))?;
    clones_and_snapshots(&args, &sides, capacity)?;

    println!("load average after {}", load_average());
    Ok(())
}

/// Create + delete pairs, one at a time; answers the size of an image volume's file.
fn pairs(args: &Args, sides: &[Side; 2], capacity: u64) -> anyhow::Result<u64> {
    let (mut creates, mut deletes, mut pairs) =
        (Samples::default(), Samples::default(), Samples::default());
    let mut image_bytes = 0;
    let mut done = 0;
    while done < args.pairs {
        let block = BLOCK.min(args.pairs - done);
        for (s, side) in sides.iter().enumerate() {
            for i in done..done + block {
                let path = volume("p", i);
                let started = Instant::now();
                creates.time(s, || side.create(&path, capacity))?;
                if side.backend == QuotaBackend::Image && image_bytes == 0 {
                    let image = side
                        .root
                        .join(STATE_DIR)
                        .join("images")
                        .join(format!("{path}.img"));
                    image_bytes = std::fs::metadata(&image)
                        .with_context(|| format!("the image of {path} at {}", image.display()))?
                        .len();
                }
                deletes.time(s, || side.delete(&path))?;
                pairs.0[s].push(started.elapsed());
            }
        }
        done += block;
    }
    print_row("create", &creates);
    print_row("delete", &deletes);
    print_row("create + delete pair", &pairs);
    let per_second =
        |s: usize| pairs.0[s].len() as f64 / pairs.0[s].iter().sum::<Duration>().as_secs_f64();
    println!(
        "{:<34} {:>5} {:>11.1} {:>11} {:>11.1} {:>11} {:>8.2}x",
        "pairs/s (one at a time)",
        args.pairs,
        per_second(0),
        "",
        per_second(1),
        "",
        per_second(1) / per_second(0)
    );
    Ok(image_bytes)
}

/// What an image create runs, alone: `mkfs.ext4` as the agent runs it on a sparse file of
/// the size an image volume got, its fsync, the loop mount and the unmount, and the
/// `resize2fs` of the unmounted image a fitting that falls short runs.
fn mkfs_alone(args: &Args, xfs: &LoopXfs, image_bytes: u64) -> anyhow::Result<()> {
    let dir = xfs.mount_point().join("mkfs-alone");
    std::fs::create_dir_all(&dir)?;
    let (image, mountpoint) = (dir.join("fs.img"), dir.join("mnt"));
    std::fs::create_dir_all(&mountpoint)?;
    let names = [
        "mkfs.ext4 alone",
        "  its fsync",
        "  mount -o loop",
        "  umount",
        "  resize2fs -f, 4 MiB more",
    ];
    let mut steps: [Vec<Duration>; 5] = Default::default();
    for _ in 0..args.mkfs_runs {
        File::create(&image)?.set_len(image_bytes)?;
        let started = Instant::now();
        run(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-b",
                "4096",
                "-m",
                "0",
                "-O",
                "metadata_csum_seed",
                "-E",
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1",
                path_str(&image)?,
            ],
        )?;
        steps[0].push(started.elapsed());
        let started = Instant::now();
        File::open(&image)?.sync_all()?;
        steps[1].push(started.elapsed());
        let started = Instant::now();
        run(
            "mount",
            &[
                "-t",
                "ext4",
                "-o",
                "loop,nodev,nosuid",
                path_str(&image)?,
                path_str(&mountpoint)?,
            ],
        )?;
        steps[2].push(started.elapsed());
        let started = Instant::now();
        run("umount", &[path_str(&mountpoint)?])?;
        steps[3].push(started.elapsed());
        // What a fitting that falls short adds: the unmounted image grown a little.
        File::options()
            .write(true)
            .open(&image)?
            .set_len(image_bytes + 4 * MIB)?;
        let started = Instant::now();
        run("resize2fs", &["-f", path_str(&image)?])?;
        steps[4].push(started.elapsed());
        std::fs::remove_file(&image)?;
    }
    for (name, samples) in names.iter().zip(&steps) {
        println!(
            "{:<34} {:>5} {:>11} {:>11} {:>8.2} ms {:>8.2} ms",
            name,
            samples.len(),
            "",
            "",
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.99)),
        );
    }
    println!(
        "  (image file {} MiB, sparse; the store's create adds the fitting, records and syncs)",
        image_bytes / MIB
    );
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

/// Makes `--exports` volumes per backend, then exports them one at a time through each
/// backend's own ganesha, alternately, then removes the exports the same way.
async fn exports(args: &Args, sides: &[Side; 2], capacity: u64) -> anyhow::Result<()> {
    let mut made = Samples::default();
    for (s, side) in sides.iter().enumerate() {
        for i in 0..args.exports {
            made.time(s, || side.create(&volume("e", i), capacity))?;
        }
    }
    print_row("create (volumes to export)", &made);

    let scratch = tempfile::tempdir()?;
    let mut servers = Vec::new();
    for side in sides {
        let bus = PrivateBus::start().await?;
        let config_dir = scratch.path().join(side.name);
        let ganesha = Ganesha::start(&bus, &config_dir).await?;
        let settings = ExportSettings {
            manager: ExportManager::Ganesha,
            ganesha_config_dir: config_dir,
            ganesha_dbus_address: Some(bus.address().to_owned()),
            ..ExportSettings::default()
        };
        let mount_root = side.root.display().to_string();
        let layout = match side.store.backend().layout() {
            Layout::Directories => VolumeLayout::SharedFilesystem,
            Layout::Mounts => VolumeLayout::OwnFilesystem,
        };
        let (table, _) = Exports::open(&settings, &side.root, &mount_root, layout, |_| true)?;
        servers.push((bus, ganesha, table));
    }
    let request = ExportRequest {
        clients: vec!["127.0.0.2".parse()?],
        ..ExportRequest::default()
    };
    let (mut adds, mut removes) = (Samples::default(), Samples::default());
    let mut grows = (Samples::default(), "");
    for phase in 0..2 {
        let mut done = 0;
        while done < args.exports {
            let block = BLOCK.min(args.exports - done);
            for (s, (_, _, table)) in servers.iter().enumerate() {
                for i in done..done + block {
                    let path = volume("e", i);
                    if phase == 0 {
                        adds.time(s, || table.set(&path, &request))
                            .with_context(|| format!("{}: export {path}", sides[s].name))?;
                    } else {
                        removes
                            .time(s, || table.remove(&path))
                            .with_context(|| format!("{}: unexport {path}", sides[s].name))?;
                    }
                }
            }
            done += block;
        }
        if phase == 0 {
            grows = grow_exported(args, sides, &servers, capacity)?;
            for (s, (_, ganesha, _)) in servers.iter().enumerate() {
                // Beside the pseudo root: the volumes' exports, below the export root.
                let root = sides[s].root.display().to_string();
                let served = ganesha
                    .exports()?
                    .iter()
                    .filter(|(_, path)| path.starts_with(&root))
                    .count();
                ensure!(
                    served == args.exports,
                    "{}: ganesha serves {served} exports, {} were added",
                    sides[s].name,
                    args.exports
                );
            }
        }
    }
    print_row("export add (ganesha D-Bus)", &adds);
    print_row("export remove", &removes);
    print_row("grow x2, exported", &grows.0);
    println!("  (image volumes grew {})", grows.1);
    drop(servers);

    let mut deletes = Samples::default();
    for (s, side) in sides.iter().enumerate() {
        for i in 0..args.exports {
            deletes.time(s, || side.delete(&volume("e", i)))?;
        }
    }
    print_row("delete (after unexport)", &deletes);
    Ok(())
}

/// Each exported volume grown to twice `capacity`, as the agent's resize does it: an
/// image volume the agent may not grow mounted (no `CAP_SYS_RESOURCE`) is grown offline,
/// its export withheld meanwhile and served again after. Answers the samples and which
/// way the image volumes grew.
fn grow_exported(
    args: &Args,
    sides: &[Side; 2],
    servers: &[(PrivateBus, Ganesha, Exports)],
    capacity: u64,
) -> anyhow::Result<(Samples, &'static str)> {
    let mut grows = Samples::default();
    let mut done = 0;
    while done < args.exports {
        let block = BLOCK.min(args.exports - done);
        for (s, side) in sides.iter().enumerate() {
            let table = &servers[s].2;
            let offline = side.store.backend().grows_offline();
            for i in done..done + block {
                let path = volume("e", i);
                grows
                    .time(s, || -> anyhow::Result<()> {
                        if offline {
                            table.withhold(&path)?;
                        }
                        let grown = side.store.resize(&path, 2 * capacity);
                        table.serve_withheld(&path)?;
                        grown?;
                        Ok(())
                    })
                    .with_context(|| format!("{}: grow {path}", side.name))?;
            }
        }
        done += block;
    }
    let way = if sides[1].store.backend().grows_offline() {
        "image offline, export withheld"
    } else {
        "image online"
    };
    Ok((grows, way))
}

/// Fills a volume per backend with `--files` files, then clones and snapshots it
/// `--repeats` times, alternately, checking each clone's method and content.
fn clones_and_snapshots(args: &Args, sides: &[Side; 2], capacity: u64) -> anyhow::Result<()> {
    let source = VolumePath::parse("bench/data")?;
    let file_bytes = args.data_mib * MIB / args.files as u64;
    let mut expected = (0, 0);
    for side in sides {
        side.create(&source, capacity)?;
        expected = write_files(&side.root.join(source.as_str()), args.files, file_bytes)?;
    }
    let (mut clones, mut snapshots) = (Samples::default(), Samples::default());
    let (mut clone_deletes, mut snapshot_deletes) = (Samples::default(), Samples::default());
    for r in 0..args.repeats {
        for (s, side) in sides.iter().enumerate() {
            let target = volume("clone", r);
            let request = CloneVolumeRequest {
                source: source.clone(),
                capacity_bytes: capacity,
                owner: VolumeOwner::default(),
                quota: if side.backend == QuotaBackend::None {
                    QuotaPolicy::Off
                } else {
                    QuotaPolicy::Enforce
                },
                export: None,
            };
            let progress = CopyProgress::default();
            let (clone, _) = clones
                .time(s, || side.store.clone_volume(&target, &request, &progress))
                .with_context(|| format!("{}: clone {source} to {target}", side.name))?;
            let method = clone.clone.map(|c| c.method);
            ensure!(
                method == Some(CloneMethod::Reflink),
                "{}: the clone was made by {method:?}, not by reflink",
                side.name
            );
            let found = count_files(&side.root.join(target.as_str()))?;
            ensure!(
                found == expected,
                "{}: the clone holds {found:?} (files, bytes), its source {expected:?}",
                side.name
            );
            clone_deletes.time(s, || side.delete(&target))?;

            let name = SnapshotName::parse(&format!("bench-{r}"))?;
            let (snapshot, _) = snapshots
                .time(s, || {
                    side.store
                        .take_snapshot(&name, &source, &progress, &|_| true)
                })
                .with_context(|| format!("{}: snapshot {source} as {name}", side.name))?;
            ensure!(
                snapshot.method == SnapshotMethod::Reflink,
                "{}: the snapshot was made by {:?}, not by reflink",
                side.name,
                snapshot.method
            );
            snapshot_deletes.time(s, || side.store.delete_snapshot(&name))?;
        }
    }
    let label = format!("{} files, {} MiB", args.files, args.data_mib);
    print_row(&format!("clone ({label})"), &clones);
    print_row("  delete of the clone", &clone_deletes);
    print_row(&format!("snapshot ({label})"), &snapshots);
    print_row("  delete of the snapshot", &snapshot_deletes);
    for side in sides {
        side.delete(&source)?;
    }
    Ok(())
}

/// Writes `files` files of `bytes` each (10 directories), synced; answers (files, bytes).
fn write_files(dir: &Path, files: usize, bytes: u64) -> anyhow::Result<(u64, u64)> {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut buf = vec![0u8; bytes as usize];
    for i in 0..files {
        let sub = dir.join(format!("d{:02}", i % 10));
        std::fs::create_dir_all(&sub)?;
        for chunk in buf.chunks_mut(8) {
            // xorshift: data no filesystem could compress or share.
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let word = state.to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
        File::create(sub.join(format!("f{i:05}")))?.write_all(&buf)?;
    }
    rustix::fs::syncfs(File::open(dir)?)?;
    count_files(dir)
}

/// Regular files below `dir` and their bytes.
fn count_files(dir: &Path) -> anyhow::Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let meta = entry.metadata()?;
        if meta.is_dir() {
            let (f, b) = count_files(&entry.path())?;
            files += f;
            bytes += b;
        } else if meta.is_file() {
            files += 1;
            bytes += meta.size();
        }
    }
    Ok((files, bytes))
}

fn path_str(path: &Path) -> anyhow::Result<&str> {
    path.to_str()
        .with_context(|| format!("{} is not UTF-8", path.display()))
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("run {program}"))?;
    ensure!(
        out.status.success(),
        "{program} {args:?}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
