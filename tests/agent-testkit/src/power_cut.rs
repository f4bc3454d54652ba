//! A power cut after each acknowledged operation, on a real filesystem: the agent binary
//! serves an export root on a loop-mounted filesystem; as soon as an operation's 2xx
//! answer arrives the backing image is copied as it is, with no sync of any kind. A read
//! of the image file sees exactly what the loop device has written, which is what a disk
//! would hold if the power went then. The copy is mounted (its journal recovered, as at a
//! reboot) and an agent started on it, which must show every acknowledged result with its
//! exact content and its record, and nothing half-made at a volume path.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig, CloneOutcome};
use nfsprov_api_types::{
    AdoptVolumeRequest, CloneVolumeRequest, CreateVolumeRequest, VolumeOwner, VolumePath,
};

use crate::{LoopBtrfs, LoopExt4, LoopXfs};

/// The filesystems the check runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FsKind {
    Ext4,
    Xfs,
    /// With the btrfs quota backend: volumes are subvolumes, clones snapshots.
    Btrfs,
}

impl FsKind {
    pub const ALL: [FsKind; 3] = [FsKind::Ext4, FsKind::Xfs, FsKind::Btrfs];

    /// The `mkfs` the filesystem needs.
    pub fn mkfs(self) -> &'static str {
        match self {
            FsKind::Ext4 => "mkfs.ext4",
            FsKind::Xfs => "mkfs.xfs",
            FsKind::Btrfs => "mkfs.btrfs",
        }
    }
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
        })
    }
}

/// The operations checked, each acknowledged by a 2xx.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Op {
    Create,
    Clone,
    Adopt,
    Resize,
    Archive,
    Delete,
}

impl Op {
    pub const ALL: [Op; 6] = [
        Op::Create,
        Op::Clone,
        Op::Adopt,
        Op::Resize,
        Op::Archive,
        Op::Delete,
    ];
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Op::Create => "create",
            Op::Clone => "clone",
            Op::Adopt => "adopt",
            Op::Resize => "resize",
            Op::Archive => "archive",
            Op::Delete => "delete",
        })
    }
}

/// What became of the acknowledged results of one operation.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Acknowledged results checked after a power cut.
    pub checked: usize,
    /// Of those, results missing, wrong or half-made after it.
    pub lost: usize,
    /// What was wrong, one line each.
    pub failures: Vec<String>,
}

/// Files of real data in each cloned or archived volume, and their size.
const FILES: usize = 5;
const FILE_BYTES: usize = 160 * 1024;
const GIB: u64 = 1 << 30;

/// Runs `iterations` power cuts after each of `ops` on a new filesystem of `kind` served
/// by the agent binary `agent`.
pub async fn run(
    agent: &Path,
    kind: FsKind,
    ops: &[Op],
    iterations: usize,
) -> anyhow::Result<BTreeMap<Op, Tally>> {
    let fs = Filesystem::new(kind)?;
    let server = Server::start(agent, &fs.root(), kind).await?;
    let copies = tempfile::tempdir()?;
    let mut tallies = BTreeMap::new();
    for &op in ops {
        let tally: &mut Tally = tallies.entry(op).or_default();
        for i in 0..iterations {
            let name = format!("{op}-{i}");
            let expected = prepare(&server, &fs, op, &name).await?;
            // Whatever was set up is on disk before the operation under test.
            rustix::fs::syncfs(std::fs::File::open(fs.root())?.as_fd())?;
            let done = act(&server, op, &name).await?;
            // At once: the power goes as the answer arrives.
            let image = copies.path().join("cut.img");
            copy_image(fs.image(), &image)?;
            let verdict = check(agent, kind, &image, copies.path(), &expected, &done).await?;
            std::fs::remove_file(&image)?;
            tally.checked += 1;
            if let Err(e) = verdict {
                tally.lost += 1;
                tally.failures.push(format!("{kind} {name}: {e:#}"));
            }
        }
    }
    drop(server);
    Ok(tallies)
}

enum Filesystem {
    Ext4(LoopExt4),
    Xfs(LoopXfs),
    Btrfs(LoopBtrfs),
}

impl Filesystem {
    fn new(kind: FsKind) -> anyhow::Result<Self> {
        Ok(match kind {
            // Sparse, and only what was written is copied: room for many iterations.
            FsKind::Ext4 => Filesystem::Ext4(LoopExt4::new(1024)?),
            // Reflinks: a clone there shares extents, which must be durable as well.
            FsKind::Xfs => Filesystem::Xfs(LoopXfs::new(1024, true)?),
            FsKind::Btrfs => Filesystem::Btrfs(LoopBtrfs::new(1024, true)?),
        })
    }

    fn root(&self) -> PathBuf {
        match self {
            Filesystem::Ext4(fs) => fs.root(),
            Filesystem::Xfs(fs) => fs.root(),
            Filesystem::Btrfs(fs) => fs.root(),
        }
    }

    fn image(&self) -> &Path {
        match self {
            Filesystem::Ext4(fs) => fs.image(),
            Filesystem::Xfs(fs) => fs.image(),
            Filesystem::Btrfs(fs) => fs.image(),
        }
    }
}

/// The agent binary serving an export root, with its own credentials.
struct Server {
    _etc: tempfile::TempDir,
    child: Child,
    client: AgentClient,
}

impl Server {
    async fn start(agent: &Path, root: &Path, kind: FsKind) -> anyhow::Result<Self> {
        let etc = tempfile::tempdir()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        init::run(&InitArgs {
            dir: etc.path().to_owned(),
            export_root: root.to_owned(),
            hostnames: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse()?],
            listen: format!("127.0.0.1:{port}"),
            name: "power-cut".into(),
            nfs_server: Some("127.0.0.1".into()),
            nfs_path: None,
            namespace: "nfsprov".into(),
            force: false,
            days: 1,
        })?;
        let config = etc.path().join(files::CONFIG);
        if kind == FsKind::Btrfs {
            let mut file = std::fs::OpenOptions::new().append(true).open(&config)?;
            file.write_all(b"\n[quota]\nbackend = \"btrfs\"\n")?;
        }
        let child = Command::new(agent)
            .args(["run", "--config"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("start {}", agent.display()))?;
        let client = AgentClient::new(&AgentConnectionConfig {
            name: "power-cut".into(),
            url: format!("https://localhost:{port}"),
            ca_file: etc.path().join(files::CA_CERT),
            token_file: Some(etc.path().join(files::TOKEN)),
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: 120,
            nfs_server: None,
            nfs_path: None,
            default: false,
        })?;
        let mut server = Self {
            _etc: etc,
            child,
            client,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.client.healthz().await.is_err() {
            if let Some(status) = server.child.try_wait()? {
                bail!("the agent exited before serving: {status}");
            }
            ensure!(Instant::now() < deadline, "the agent did not come up");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(server)
    }
}

/// Also on an early return: an agent left running would keep its filesystem busy.
impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What must be true after the power cut, set up before the operation.
struct Expected {
    /// The data files of the volume the operation works on, by name.
    files: Vec<(String, Vec<u8>)>,
}

/// What the acknowledged answer said.
enum Done {
    Volume {
        path: VolumePath,
        capacity_bytes: u64,
        /// The source whose files the volume holds, for a clone.
        cloned_from: Option<VolumePath>,
    },
    Archived {
        path: VolumePath,
        archive_path: String,
    },
    Deleted {
        path: VolumePath,
    },
}

fn volume_request(capacity_bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        ..Default::default()
    }
}

fn owner(name: &str) -> VolumeOwner {
    VolumeOwner {
        pvc_name: Some(name.to_owned()),
        ..Default::default()
    }
}

fn random_files() -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    (0..FILES)
        .map(|n| {
            let mut data = vec![0u8; FILE_BYTES];
            let mut filled = 0;
            while filled < data.len() {
                filled += rustix::rand::getrandom(
                    &mut data[filled..],
                    rustix::rand::GetRandomFlags::empty(),
                )?;
            }
            Ok((format!("file-{n}"), data))
        })
        .collect()
}

fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
    for (name, data) in files {
        std::fs::write(dir.join(name), data)?;
    }
    Ok(())
}

/// Sets up what `op` needs (a volume to clone, a directory to adopt, ...).
async fn prepare(server: &Server, fs: &Filesystem, op: Op, name: &str) -> anyhow::Result<Expected> {
    let client = &server.client;
    let path = VolumePath::parse(name)?;
    let mut files = Vec::new();
    match op {
        Op::Create => {}
        Op::Adopt => {
            files = random_files()?;
            let dir = fs.root().join(name);
            std::fs::create_dir(&dir)?;
            write_files(&dir, &files)?;
        }
        Op::Clone | Op::Resize | Op::Archive | Op::Delete => {
            let source = match op {
                Op::Clone => VolumePath::parse(&format!("{name}-source"))?,
                _ => path,
            };
            client
                .create_volume(&source, &volume_request(GIB), None)
                .await?;
            files = random_files()?;
            write_files(&fs.root().join(source.as_str()), &files)?;
        }
    }
    Ok(Expected { files })
}

/// Does `op` and answers what its acknowledgement said.
async fn act(server: &Server, op: Op, name: &str) -> anyhow::Result<Done> {
    let client = &server.client;
    let path = VolumePath::parse(name)?;
    Ok(match op {
        Op::Create => {
            let made = client
                .create_volume(&path, &volume_request(GIB), None)
                .await?;
            ensure!(made.created, "{path} existed already");
            Done::Volume {
                path,
                capacity_bytes: GIB,
                cloned_from: None,
            }
        }
        Op::Adopt => {
            let request = AdoptVolumeRequest {
                capacity_bytes: GIB,
                owner: owner(name),
                export: None,
            };
            client.adopt_volume(&path, &request, None).await?;
            Done::Volume {
                path,
                capacity_bytes: GIB,
                cloned_from: None,
            }
        }
        Op::Clone => {
            let source = VolumePath::parse(&format!("{name}-source"))?;
            let request = CloneVolumeRequest {
                source: source.clone(),
                capacity_bytes: GIB,
                owner: owner(name),
                quota: Default::default(),
                export: None,
            };
            // A clone not done within the request's wait is acknowledged by a repeat.
            let deadline = Instant::now() + Duration::from_secs(120);
            loop {
                match client.clone_volume(&path, &request, None).await? {
                    CloneOutcome::Ready(_) => break,
                    CloneOutcome::InProgress(_) => {
                        ensure!(
                            Instant::now() < deadline,
                            "the clone of {path} never finished"
                        );
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            Done::Volume {
                path,
                capacity_bytes: GIB,
                cloned_from: Some(source),
            }
        }
        Op::Resize => {
            client.resize_volume(&path, 2 * GIB, None).await?;
            Done::Volume {
                path,
                capacity_bytes: 2 * GIB,
                cloned_from: None,
            }
        }
        Op::Archive => {
            let archived = client.archive_volume(&path, None, None).await?;
            Done::Archived {
                path,
                archive_path: archived.archive_path,
            }
        }
        Op::Delete => {
            client.delete_volume(&path, None).await?;
            Done::Deleted { path }
        }
    })
}

/// Copies the image file as it is, holes kept as holes: only what was written is read.
pub fn copy_image(from: &Path, to: &Path) -> anyhow::Result<()> {
    let mut source = std::fs::File::open(from)?;
    let size = source.metadata()?.len();
    let mut target = std::fs::File::create(to)?;
    target.set_len(size)?;
    let mut offset = 0u64;
    let mut buffer = vec![0u8; 1 << 20];
    while offset < size {
        let data = match rustix::fs::seek(&source, rustix::fs::SeekFrom::Data(offset)) {
            Ok(at) => at,
            Err(rustix::io::Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let hole = rustix::fs::seek(&source, rustix::fs::SeekFrom::Hole(data))?;
        source.seek(SeekFrom::Start(data))?;
        target.seek(SeekFrom::Start(data))?;
        let mut left = hole - data;
        while left > 0 {
            let chunk = left.min(buffer.len() as u64) as usize;
            source.read_exact(&mut buffer[..chunk])?;
            target.write_all(&buffer[..chunk])?;
            left -= chunk as u64;
        }
        offset = hole;
    }
    Ok(())
}

/// Mounts the copy `image` (recovering its journal), starts an agent on it and checks
/// what the acknowledgement promised: the verdict, inside what went wrong with the check
/// itself.
async fn check(
    agent: &Path,
    kind: FsKind,
    image: &Path,
    scratch: &Path,
    expected: &Expected,
    done: &Done,
) -> anyhow::Result<anyhow::Result<()>> {
    let mount = scratch.join("mnt");
    std::fs::create_dir_all(&mount)?;
    // The copy has the original's UUID; XFS refuses that unless told.
    let options = match kind {
        FsKind::Xfs => "loop,nouuid",
        _ => "loop",
    };
    if let Err(e) = crate::run(
        "mount",
        &[
            "-o".as_ref(),
            options.as_ref(),
            image.as_os_str(),
            mount.as_os_str(),
        ],
    ) {
        return Ok(Err(anyhow::anyhow!("the copy does not mount: {e}")));
    }
    let checked = async {
        let root = mount.join("exports");
        let server = Server::start(agent, &root, kind).await?;
        let verdict = verify(&server.client, &root, expected, done).await;
        drop(server);
        verdict
    }
    .await;
    unmount(&mount)?;
    Ok(checked)
}

/// Unmounts, waiting for what the stopped agent started (a btrfs tool deleting a
/// subvolume, say) to let go of the filesystem.
fn unmount(mount: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match crate::run("umount", &[mount.as_os_str()]) {
            Ok(_) => return Ok(()),
            Err(e) if e.contains("busy") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!(e),
        }
    }
}

async fn verify(
    client: &AgentClient,
    root: &Path,
    expected: &Expected,
    done: &Done,
) -> anyhow::Result<()> {
    let same_files = |dir: &Path| -> anyhow::Result<()> {
        for (name, data) in &expected.files {
            let found = std::fs::read(dir.join(name))
                .with_context(|| format!("{} is missing", dir.join(name).display()))?;
            ensure!(
                found == *data,
                "{} differs from what was written ({} of {} bytes are zero)",
                dir.join(name).display(),
                found.iter().filter(|b| **b == 0).count(),
                found.len()
            );
        }
        Ok(())
    };
    match done {
        Done::Volume {
            path,
            capacity_bytes,
            cloned_from,
        } => {
            let volume = client
                .get_volume(path, None)
                .await?
                .with_context(|| format!("the acknowledged volume {path} is gone"))?;
            ensure!(
                volume.capacity_bytes == *capacity_bytes,
                "{path} has capacity {} instead of the acknowledged {capacity_bytes}",
                volume.capacity_bytes
            );
            if let Some(source) = cloned_from {
                let origin = volume.clone.as_ref().map(|c| &c.source);
                ensure!(
                    origin == Some(source),
                    "{path} is not recorded as a clone of {source}"
                );
            }
            same_files(&root.join(path.as_str()))?;
        }
        Done::Archived { path, archive_path } => {
            ensure!(
                client.get_volume(path, None).await?.is_none(),
                "the archived volume {path} is back at its path"
            );
            let archives = client.list_archives(None).await?;
            ensure!(
                archives.iter().any(|a| a.archive_path == *archive_path),
                "the archive {archive_path} is not listed"
            );
            same_files(&root.join(archive_path))?;
        }
        Done::Deleted { path } => {
            ensure!(
                client.get_volume(path, None).await?.is_none(),
                "the deleted volume {path} is back"
            );
            ensure!(
                !root.join(path.as_str()).exists(),
                "something is left at the deleted volume's path {path}"
            );
        }
    }
    // Nothing half-made: every entry at a volume path is a volume (each directory made
    // to be adopted was adopted, durably, before the next operation).
    let volumes: Vec<String> = client
        .list_volumes(None)
        .await?
        .into_iter()
        .map(|v| v.path.to_string())
        .collect();
    for entry in std::fs::read_dir(root)? {
        let name = entry?.file_name().to_string_lossy().into_owned();
        ensure!(
            name.starts_with('.') || volumes.contains(&name),
            "{name} is at a volume path but is no volume"
        );
    }
    Ok(())
}
