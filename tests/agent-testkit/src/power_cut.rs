//! A power cut after each acknowledged operation, on a real filesystem: the agent binary
//! serves an export root on a loop-mounted filesystem; as soon as an operation's 2xx
//! answer arrives the backing image is copied as it is, with no sync of any kind. A read
//! of the image file sees exactly what the loop device has written, which is what a disk
//! would hold if the power went then. The copy is mounted (its journal recovered, as at a
//! reboot) and an agent started on it, which must show every acknowledged result with its
//! exact content and its record, and nothing half-made at a volume path.
//!
//! The agent exports each volume through its knfsd manager, its exports directory (a file
//! per exported volume) on the same filesystem (as /etc/exports.d/ is on a server's disk)
//! and `exportfs` a stand-in that accepts and logs. Before any agent starts on the copy,
//! the exports files `exportfs -a` would read must list exactly the acknowledged
//! exports, each once, what the NFS server would restore at boot; snapshot
//! trees are read where the agent keeps them, not through the agent.
//!
//! Or through its ganesha manager, with a real ganesha on a private D-Bus, the manager's
//! directory on the same filesystem (as /etc/ganesha/ is). Its files name absolute
//! paths, so the copy is checked as a rebooted server would see it: mounted in a mount
//! namespace of its own at the original's paths, where a second ganesha boots from the
//! copy's `exports.conf` and then the agent starts. Before either, the harness reads the
//! directory itself and compares every EXPORT block with what was acknowledged.
//!
//! Or with image volumes ([`FsKind::Image`]): each volume an ext4 filesystem in an image
//! file on an XFS export root that reflinks, loop-mounted at its path. The cut copies the
//! XFS; what a volume holds is read through the agent started on the copy, which must
//! mount it from its own image in the copy, and archives and snapshots (images the agent
//! never mounts) through a read-only mount of their image in the copy. Adoption and
//! resizing are not cut there (see [`FsKind::skips`]), and each step's volumes are
//! deleted once its cut is checked, so that each cut's agent mounts only a few.
//!
//! A replica ([`Op::Replica`]) is received from an agent outside the cut filesystem, a
//! full receive and one built from the replica before in turn. Its tree, read where the
//! agent keeps it, must hold the source's entries exactly (content, modes, owners,
//! times, symlink targets, hard links, holes), and the agent on the copy must list
//! exactly the replicas acknowledged, ready; a tree left half received for a resume is
//! never listed.
//!
//! Each operation is a few arms: what `prepare` sets up, what `act` sends and the
//! acknowledgement it records as `Done`, what `on_disk` and `served` check of it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail, ensure};
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_agent::store::STATE_DIR;
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig, CloneOutcome, RestoreOutcome};
use nfsprov_api_types::{
    AdoptVolumeRequest, CloneMethod, CloneVolumeRequest, CreateSnapshotRequest,
    CreateVolumeRequest, ErrorCode, ExportAccess, ExportRequest, RestoreSource,
    RestoreVolumeRequest, Snapshot, SnapshotMethod, SnapshotName, Squash, VolumeOwner, VolumePath,
};

use crate::ganesha::{Ganesha, PrivateBus};
use crate::{LoopBtrfs, LoopExt4, LoopXfs};

mod ganesha_files;
mod images;
mod namespace;
mod replica;
mod retry;

use ganesha_files::{ExportBlock, GaneshaFiles};
use images::{ImageArea, ReadOnlyImage};
use namespace::CopyAtOriginal;
use replica::{ReplicaSource, Tree};
use retry::until_ready;

/// The filesystems the check runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FsKind {
    Ext4,
    Xfs,
    /// With the btrfs quota backend: volumes are subvolumes, clones snapshots.
    Btrfs,
    /// With the image quota backend, on XFS with reflinks: each volume an ext4 filesystem
    /// in an image file, loop-mounted at its path; clones, snapshots and restores
    /// reflinks of images.
    Image,
}

impl FsKind {
    pub const ALL: [FsKind; 4] = [FsKind::Ext4, FsKind::Xfs, FsKind::Btrfs, FsKind::Image];

    /// The `mkfs` of the export root's filesystem.
    pub fn mkfs(self) -> &'static str {
        match self {
            FsKind::Ext4 => "mkfs.ext4",
            FsKind::Xfs | FsKind::Image => "mkfs.xfs",
            FsKind::Btrfs => "mkfs.btrfs",
        }
    }

    /// The tools the check needs here: the root's `mkfs`, and for image volumes what the
    /// agent's image backend runs.
    fn tools(self) -> &'static [&'static str] {
        match self {
            FsKind::Ext4 => &["mkfs.ext4"],
            FsKind::Xfs => &["mkfs.xfs"],
            FsKind::Btrfs => &["mkfs.btrfs"],
            FsKind::Image => &[
                "mkfs.xfs",
                "mkfs.ext4",
                "tune2fs",
                "resize2fs",
                "dumpe2fs",
                "losetup",
                "findmnt",
                "fsfreeze",
            ],
        }
    }

    /// The first tool the check needs here (the root's `mkfs`, and for image volumes what
    /// the image backend runs) that is not installed, if any.
    pub fn missing(self) -> Option<String> {
        self.tools()
            .iter()
            .find(|tool| installed(tool).is_none())
            .map(|tool| format!("{tool} is not installed"))
    }

    /// Why `op` is not cut here, if it is not.
    ///
    /// Image volumes: an adoption is refused by the image backend (a directory becomes a
    /// filesystem of its own only by copying its data). A resize is cut: it grows the
    /// mounted filesystem where the agent may, and unmounted otherwise.
    pub fn skips(self, op: Op) -> Option<&'static str> {
        match (self, op) {
            (FsKind::Image, Op::Adopt) => {
                Some("the image backend adopts no directory (a volume is a filesystem of its own)")
            }
            (FsKind::Image, Op::Replica) => {
                Some("the image backend keeps snapshots as images; a replica is received as a tree")
            }
            _ => None,
        }
    }

    /// Whether each volume is a filesystem of its own, mounted by the agent: a reboot
    /// loses those mounts, and knfsd exports each with an `fsid` of its own.
    fn own_filesystems(self) -> bool {
        self == FsKind::Image
    }

    /// How the agent keeps a snapshot here: each filesystem exercises one method.
    pub fn snapshot_method(self) -> SnapshotMethod {
        match self {
            FsKind::Ext4 => SnapshotMethod::Copy,
            FsKind::Xfs | FsKind::Image => SnapshotMethod::Reflink,
            FsKind::Btrfs => SnapshotMethod::BtrfsSnapshot,
        }
    }

    /// How the agent restores a volume from a snapshot here.
    pub fn restore_method(self) -> CloneMethod {
        match self {
            FsKind::Ext4 => CloneMethod::Copy,
            FsKind::Xfs | FsKind::Image => CloneMethod::Reflink,
            FsKind::Btrfs => CloneMethod::BtrfsSnapshot,
        }
    }
}

impl fmt::Display for FsKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::Image => "image",
        })
    }
}

/// How the agent exports its volumes, and so which files of the NFS server's the cut must
/// leave right.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Manager {
    /// The kernel's server: a file per exported volume, `exportfs` a logging stand-in.
    Knfsd,
    /// nfs-ganesha over D-Bus: a directory of EXPORT blocks, a real ganesha.
    Ganesha,
}

impl Manager {
    pub const ALL: [Manager; 2] = [Manager::Knfsd, Manager::Ganesha];
}

impl Manager {
    /// What the check with this manager lacks here, if anything: root, and for ganesha
    /// its daemon with the VFS FSAL, the bus and the namespace tools.
    pub fn missing(self) -> Option<String> {
        if !rustix::process::geteuid().is_root() {
            return Some("needs root (loop mounts)".into());
        }
        if self == Manager::Knfsd {
            return None;
        }
        let tools = [
            "ganesha.nfsd",
            "dbus-daemon",
            "dbus-send",
            "unshare",
            "nsenter",
        ];
        if let Some(tool) = tools.into_iter().find(|tool| installed(tool).is_none()) {
            return Some(format!("{tool} is not installed"));
        }
        if !vfs_fsal_installed() {
            return Some("ganesha's VFS FSAL (libfsalvfs.so) is not installed".into());
        }
        None
    }
}

/// Where `program` is, on the PATH or in the system's program directories.
pub fn installed(program: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/sbin", "/usr/sbin", "/bin", "/usr/bin"].map(PathBuf::from))
        .map(|dir| dir.join(program))
        .find(|candidate| candidate.is_file())
}

/// Whether ganesha's VFS FSAL is in one of the library directories distributions put
/// ganesha's modules in (`<libdir>[/<multiarch>]/ganesha/`).
fn vfs_fsal_installed() -> bool {
    let module = Path::new("ganesha").join("libfsalvfs.so");
    [
        "/usr/lib",
        "/usr/lib64",
        "/usr/local/lib",
        "/usr/local/lib64",
    ]
    .iter()
    .flat_map(|lib| {
        let arches = std::fs::read_dir(lib)
            .into_iter()
            .flatten()
            .flatten()
            .map(|entry| entry.path());
        std::iter::once(PathBuf::from(lib)).chain(arches)
    })
    .any(|dir| dir.join(&module).is_file())
}

impl fmt::Display for Manager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Manager::Knfsd => "knfsd",
            Manager::Ganesha => "ganesha",
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
    /// A volume's clients replaced (`PUT /v1/exports/{path}`).
    Export,
    Archive,
    Delete,
    Snapshot,
    SnapshotDelete,
    /// A new volume made from a ready snapshot.
    Restore,
    /// A new volume made from an archive, which stays.
    ArchiveRestore,
    /// Another agent's snapshot received as a snapshot of this one
    /// (`PUT /v1/replicas/{name}`), every other one built from the one before.
    Replica,
}

impl Op {
    pub const ALL: [Op; 12] = [
        Op::Create,
        Op::Clone,
        Op::Adopt,
        Op::Resize,
        Op::Export,
        Op::Archive,
        Op::Delete,
        Op::Snapshot,
        Op::SnapshotDelete,
        Op::Restore,
        Op::ArchiveRestore,
        Op::Replica,
    ];

    /// The operations whose answer makes, changes or removes an export: the snapshot
    /// operations leave every export as it is.
    pub const EXPORTING: [Op; 9] = [
        Op::Create,
        Op::Clone,
        Op::Adopt,
        Op::Resize,
        Op::Export,
        Op::Archive,
        Op::Delete,
        Op::Restore,
        Op::ArchiveRestore,
    ];
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(match self {
            Op::Create => "create",
            Op::Clone => "clone",
            Op::Adopt => "adopt",
            Op::Resize => "resize",
            Op::Export => "export",
            Op::Archive => "archive",
            Op::Delete => "delete",
            Op::Snapshot => "snapshot",
            Op::SnapshotDelete => "snapshot-delete",
            Op::Restore => "restore",
            Op::ArchiveRestore => "archive-restore",
            Op::Replica => "replica",
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

/// Files of real data in each volume an operation reads or keeps, and their size.
const FILES: usize = 5;
const FILE_BYTES: usize = 160 * 1024;
const GIB: u64 = 1 << 30;
/// The directory of the agent's exports files, beside the export root on the same
/// filesystem: the copy of the disk holds it as a server's disk holds /etc/exports.d/.
const EXPORTS_DIR: &str = "exports.d";
/// The single exports file of earlier agents, which this one must not leave behind.
const EXPORTS_FILE: &str = "nfsprov.exports";
/// The ganesha manager's directory, beside the export root as /etc/ganesha/ is on a
/// server's disk.
const GANESHA_DIR: &str = "ganesha";
/// Where the agent keeps snapshot trees and their records, in its state directory.
const SNAPSHOT_DATA: &str = "snapshots/data";
const SNAPSHOT_RECORDS: &str = "snapshots/records";

/// The exports directory of the agent serving `root`.
fn exports_dir(root: &Path) -> PathBuf {
    root.with_file_name(EXPORTS_DIR)
}

/// What `exportfs -a` reads at boot from the exports directory of the agent serving
/// `root`: every `*.exports` file whose name does not start with a dot, in order of
/// their names, as one text.
fn exports_text(root: &Path) -> anyhow::Result<String> {
    let dir = exports_dir(root);
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if name.ends_with(".exports") && name.len() > ".exports".len() && !name.starts_with('.') {
            names.push(name.into_owned());
        }
    }
    names.sort();
    let mut text = String::new();
    for name in names {
        text.push_str(
            &std::fs::read_to_string(dir.join(&name)).with_context(|| format!("reading {name}"))?,
        );
    }
    Ok(text)
}

fn snapshot_tree(root: &Path, name: &SnapshotName) -> PathBuf {
    root.join(STATE_DIR).join(SNAPSHOT_DATA).join(name.as_str())
}

fn snapshot_record(root: &Path, name: &SnapshotName) -> PathBuf {
    root.join(STATE_DIR)
        .join(SNAPSHOT_RECORDS)
        .join(format!("{name}.json"))
}

/// The ganesha manager's directory of the agent serving `root`.
fn ganesha_dir(root: &Path) -> PathBuf {
    root.with_file_name(GANESHA_DIR)
}

/// Who may mount a volume, as sent, with the options exports(5) must show for each of its
/// clients and the values of its ganesha EXPORT block: spelled out here rather than taken
/// from the agent, so that the files are checked as the server would read them at boot.
/// The options depend on the volumes too ([`ExportCase::options`]).
#[derive(Debug)]
struct ExportCase {
    clients: &'static [&'static str],
    access: ExportAccess,
    squash: Squash,
    anon_id: Option<u32>,
    /// The options of access and squashing, before those every export has.
    access_options: &'static str,
    /// ganesha: the `Access_Type` of the block's CLIENT and the block's `Squash`.
    ganesha_access: &'static str,
    ganesha_squash: &'static str,
}

/// Two networks, read-write, root squashed.
const READ_WRITE: ExportCase = ExportCase {
    clients: &["10.20.0.0/16", "192.168.30.0/24"],
    access: ExportAccess::ReadWrite,
    squash: Squash::Root,
    anon_id: None,
    access_options: "rw,root_squash,sec=sys",
    ganesha_access: "RW",
    ganesha_squash: "Root_Squash",
};

/// Two networks (one IPv6), read-only, every user squashed to 2000.
const READ_ONLY: ExportCase = ExportCase {
    clients: &["10.21.0.0/16", "fd00:21::/64"],
    access: ExportAccess::ReadOnly,
    squash: Squash::All,
    anon_id: Some(2000),
    access_options: "ro,all_squash,anonuid=2000,anongid=2000,sec=sys",
    ganesha_access: "RO",
    ganesha_squash: "All_Squash",
};

/// What the `export` operation changes a volume's export to: other clients, other options.
const CHANGED: ExportCase = ExportCase {
    clients: &["10.22.0.0/16", "127.0.0.2"],
    access: ExportAccess::ReadWrite,
    squash: Squash::None,
    anon_id: None,
    access_options: "rw,no_root_squash,sec=sys",
    ganesha_access: "RW",
    ganesha_squash: "No_Root_Squash",
};

impl ExportCase {
    fn request(&self) -> anyhow::Result<ExportRequest> {
        Ok(ExportRequest {
            clients: self
                .clients
                .iter()
                .map(|c| c.parse())
                .collect::<Result<_, _>>()?,
            access: self.access,
            squash: self.squash,
            anon_uid: self.anon_id,
            anon_gid: self.anon_id,
            ..ExportRequest::default()
        })
    }

    /// The options exports(5) must show for each client: writes on stable storage
    /// (`sync`) and privileged ports (`secure`) always; where volumes share the root's
    /// filesystem `subtree_check`, where each is a filesystem of its own
    /// `no_subtree_check` and the export's own `fsid=` (`fsid`: the one found, or
    /// [`FSID`] as the exports file is read).
    fn options(&self, kind: FsKind, fsid: &str) -> String {
        let confinement = if kind.own_filesystems() {
            format!("no_subtree_check,fsid={fsid}")
        } else {
            "subtree_check".to_owned()
        };
        format!("{},sync,{confinement},secure", self.access_options)
    }

    /// The `client(options)` entries of the volume's line in the exports file, any
    /// `fsid` read as [`FSID`].
    fn entries(&self, kind: FsKind) -> BTreeSet<String> {
        self.clients
            .iter()
            .map(|client| format!("{client}({})", self.options(kind, FSID)))
            .collect()
    }

    /// What is wrong with `block` as the EXPORT of the volume at `path` (absolute, as
    /// the acknowledging agent served it): the path clients mount is the same (the
    /// export root is `nfs.path`), nobody but the clients may mount, AUTH_SYS.
    fn block_differences(&self, block: &ExportBlock, path: &str) -> Vec<String> {
        let mut wrong = Vec::new();
        let mut differ = |what: &str, found: &dyn fmt::Debug, wanted: &dyn fmt::Debug| {
            wrong.push(format!("{what} {found:?}, not {wanted:?}"));
        };
        let same = |found: &str, wanted: &str| found.eq_ignore_ascii_case(wanted);
        if block.path != path {
            differ("Path", &block.path, &path);
        }
        if block.pseudo != path {
            differ("Pseudo", &block.pseudo, &path);
        }
        if !same(&block.access, "None") {
            differ("Access_Type", &block.access, &"None");
        }
        if !same(&block.squash, self.ganesha_squash) {
            differ("Squash", &block.squash, &self.ganesha_squash);
        }
        if block.anon_uid != self.anon_id || block.anon_gid != self.anon_id {
            differ(
                "Anonymous_Uid/Gid",
                &(block.anon_uid, block.anon_gid),
                &self.anon_id,
            );
        }
        if !matches!(block.sec.as_slice(), [sec] if same(sec, "sys")) {
            differ("SecType", &block.sec, &["sys"]);
        }
        if !same(&block.fsal, "VFS") {
            differ("FSAL", &block.fsal, &"VFS");
        }
        let wanted: BTreeMap<&str, &str> = self
            .clients
            .iter()
            .map(|client| (*client, self.ganesha_access))
            .collect();
        let found: BTreeMap<&str, &str> = block
            .clients
            .iter()
            .map(|(client, access)| (client.as_str(), access.as_str()))
            .collect();
        let found_same = found.len() == wanted.len()
            && found
                .iter()
                .zip(&wanted)
                .all(|((fc, fa), (wc, wa))| fc == wc && same(fa, wa));
        if !found_same {
            differ("CLIENT", &found, &wanted);
        }
        wrong
    }
}

/// One operation under test and the names it works with.
struct Step {
    op: Op,
    iteration: usize,
    name: String,
}

impl Step {
    fn new(op: Op, iteration: usize) -> Self {
        Self {
            op,
            iteration,
            name: format!("{op}-{iteration}"),
        }
    }

    /// The volume the operation makes, changes or removes.
    fn path(&self) -> anyhow::Result<VolumePath> {
        Ok(VolumePath::parse(&self.name)?)
    }

    /// The volume a clone or snapshot is taken of.
    fn source(&self) -> anyhow::Result<VolumePath> {
        Ok(VolumePath::parse(&format!("{}-source", self.name))?)
    }

    fn snapshot(&self) -> anyhow::Result<SnapshotName> {
        Ok(SnapshotName::parse(&self.name)?)
    }

    /// The replica a receive is built from: on every other iteration the one received
    /// by the iteration before (acknowledged, and still on the original disk), so that
    /// both a full and an incremental receive are cut.
    fn replica_base(&self) -> anyhow::Result<Option<SnapshotName>> {
        if self.iteration.is_multiple_of(2) {
            return Ok(None);
        }
        let previous = Step::new(self.op, self.iteration - 1);
        Ok(Some(previous.snapshot()?))
    }

    /// The export the step's volumes are made with: read-only every other iteration.
    fn export(&self) -> &'static ExportCase {
        if self.iteration.is_multiple_of(2) {
            &READ_WRITE
        } else {
            &READ_ONLY
        }
    }
}

/// Runs `iterations` power cuts after each of `ops` on a new filesystem of `kind` served
/// by the agent binary `agent`, exporting through its export manager `manager`.
pub async fn run(
    agent: &Path,
    kind: FsKind,
    manager: Manager,
    ops: &[Op],
    iterations: usize,
) -> anyhow::Result<BTreeMap<Op, Tally>> {
    if let Some(op) = ops.iter().find(|op| kind.skips(**op).is_some()) {
        bail!(
            "{op} is not cut on {kind}: {}",
            kind.skips(*op).unwrap_or_default()
        );
    }
    if kind.own_filesystems() && manager == Manager::Ganesha {
        bail!("image volumes are cut with the knfsd manager only");
    }
    let fs = Filesystem::new(kind)?;
    let root = fs.root();
    let nfs = match manager {
        Manager::Knfsd => {
            std::fs::create_dir(root.with_file_name(EXPORTS_DIR))?;
            None
        }
        Manager::Ganesha => Some(GaneshaService::start(&ganesha_dir(&root), None).await?),
    };
    let exports = match &nfs {
        None => ExportSetup::Knfsd,
        Some(nfs) => ExportSetup::Ganesha(&nfs.ganesha),
    };
    let server = Server::start(agent, &root, kind, &exports, None).await?;
    // Outside the filesystem under test, as another server would be.
    let source = match ops.contains(&Op::Replica) {
        true => Some(ReplicaSource::start().await?),
        false => None,
    };
    // Every replica acknowledged: exactly those must be listed after a cut.
    let mut replicas = BTreeSet::new();
    let copies = tempfile::tempdir()?;
    let mut tallies = BTreeMap::new();
    // Every export acknowledged and not since removed, by volume: what the server's files
    // must hold after a cut, whole.
    let mut exported = BTreeMap::new();
    let mut fsids = Fsids::new();
    for &op in ops {
        let tally: &mut Tally = tallies.entry(op).or_default();
        for i in 0..iterations {
            let step = Step::new(op, i);
            let mut expected = prepare(&server, &root, &step, source.as_ref()).await?;
            step.prepared(&mut exported)?;
            // Whatever was set up is on disk before the operation under test.
            rustix::fs::syncfs(std::fs::File::open(&root)?.as_fd())?;
            if manager == Manager::Knfsd {
                first_fsids(&root, kind, &mut fsids)?;
            }
            let done = act(&server, &step, source.as_ref()).await?;
            // At once: the power goes as the answer arrives.
            let image = copies.path().join("cut.img");
            copy_image(fs.image(), &image)?;
            done.acknowledged(&mut exported);
            if let Done::Replica { name, .. } = &done {
                replicas.insert(name.clone());
            }
            expected.replicas = replicas.clone();
            let cut = Cut {
                agent,
                kind,
                manager,
                image: &image,
                scratch: copies.path(),
                original_root: &root,
                fsids: &fsids,
            };
            let verdict = cut.check(&expected, &done, &exported).await?;
            std::fs::remove_file(&image)?;
            tally.checked += 1;
            if let Err(e) = verdict {
                tally.lost += 1;
                tally.failures.push(format!("{kind} {}: {e:#}", step.name));
            }
            if kind.own_filesystems() {
                delete_volumes(&server, &mut exported).await?;
            }
        }
    }
    drop(server);
    drop(source);
    drop(nfs);
    unmount_below(&root)?;
    Ok(tallies)
}

/// Deletes every volume, each deletion acknowledged and so checked by the next cut (gone
/// from the exports files, its image and record gone from the image area). For image
/// volumes after each step: the agent started on a copy mounts every volume, and with
/// the hundreds a run makes each cut took tens of seconds. Archives and snapshots, never
/// mounted, are kept.
async fn delete_volumes(server: &Server, exported: &mut Exported) -> anyhow::Result<()> {
    for volume in server.client.list_volumes(None).await? {
        server.client.delete_volume(&volume.path, None).await?;
        exported.remove(volume.path.as_str());
    }
    Ok(())
}

/// Unmounts what the agent mounted below `root` (ganesha's btrfs volumes have a mount
/// each) and left when it was stopped, deepest first, so the filesystem can go.
fn unmount_below(root: &Path) -> anyhow::Result<()> {
    let prefix = format!("{}/", root.display());
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    // Temp directory names hold no character the table escapes.
    let mut points: Vec<&str> = table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .collect();
    points.sort_unstable_by_key(|point| std::cmp::Reverse(point.len()));
    for point in points {
        unmount(Path::new(point))?;
    }
    Ok(())
}

/// Acknowledged exports by volume path.
type Exported = BTreeMap<String, &'static ExportCase>;

impl Step {
    /// Records the exports `prepare` made for the step.
    fn prepared(&self, exported: &mut Exported) -> anyhow::Result<()> {
        let export = self.export();
        match self.op {
            Op::Create | Op::Adopt => {}
            Op::Resize | Op::Export | Op::Archive | Op::Delete => {
                exported.insert(self.path()?.to_string(), export);
            }
            Op::Clone | Op::Snapshot | Op::SnapshotDelete | Op::Restore => {
                exported.insert(self.source()?.to_string(), export);
            }
            // Made and archived again: no export left.
            Op::ArchiveRestore => {}
            // A replica is never exported.
            Op::Replica => {}
        }
        Ok(())
    }
}

impl Done {
    /// Records what the acknowledgement did to the exports.
    fn acknowledged(&self, exported: &mut Exported) {
        match self {
            Done::Volume { path, export, .. } => {
                exported.insert(path.to_string(), export);
            }
            Done::Archived { path, .. } | Done::Deleted { path } => {
                exported.remove(path.as_str());
            }
            Done::Snapshot { .. } | Done::SnapshotDeleted { .. } | Done::Replica { .. } => {}
        }
    }
}

/// A private bus and a ganesha on it, stopped when dropped (ganesha first).
struct GaneshaService {
    ganesha: Ganesha,
    _bus: PrivateBus,
}

impl GaneshaService {
    /// ganesha including `dir`'s `exports.conf`, in `namespace` if one is given.
    async fn start(dir: &Path, namespace: Option<&CopyAtOriginal>) -> anyhow::Result<Self> {
        let bus = PrivateBus::start().await?;
        let ganesha = match namespace {
            None => Ganesha::start(&bus, dir).await?,
            Some(namespace) => Ganesha::start_in_namespace(&bus, dir, &namespace.path()).await?,
        };
        Ok(Self { ganesha, _bus: bus })
    }
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
            // Room for hundreds of volumes' images, each a few MiB written of its
            // gibibyte; reflinks for the agent's clones of images.
            FsKind::Image => Filesystem::Xfs(LoopXfs::new(4096, true)?),
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

/// The export manager an agent is configured with.
enum ExportSetup<'a> {
    /// knfsd, its exports directory beside the export root, `exportfs` a logging stand-in.
    Knfsd,
    /// ganesha, this one's bus and directory.
    Ganesha(&'a Ganesha),
}

/// The agent binary serving an export root, with its own credentials, exporting each
/// volume through its export manager.
struct Server {
    etc: tempfile::TempDir,
    child: Child,
    client: AgentClient,
}

/// Where the `exportfs` stand-in logs, in the server's own directory.
const EXPORTFS_LOG: &str = "exportfs.log";

/// Stands in for `exportfs` (there may be no kernel NFS server): accepts every change and
/// logs its command line to `log`, one call a line. The log's path is written in rather
/// than derived at each call: an agent's start calls it once per client of every export,
/// and a `dirname` process per call made each call over three times as slow.
fn exportfs_stand_in(log: &Path) -> String {
    format!("#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\n", log.display())
}

impl Server {
    /// The agent serving `root`, in `namespace` if one is given.
    async fn start(
        agent: &Path,
        root: &Path,
        kind: FsKind,
        exports: &ExportSetup<'_>,
        namespace: Option<&CopyAtOriginal>,
    ) -> anyhow::Result<Self> {
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
            // Test export roots are directories of a filesystem that holds more.
            shared_filesystem: true,
        })?;
        let config = etc.path().join(files::CONFIG);
        let mut file = std::fs::OpenOptions::new().append(true).open(&config)?;
        match exports {
            ExportSetup::Knfsd => {
                // Outside the filesystem under test: the NFS server's program, not its state.
                let exportfs = etc.path().join("exportfs");
                std::fs::write(&exportfs, exportfs_stand_in(&etc.path().join(EXPORTFS_LOG)))?;
                std::fs::set_permissions(
                    &exportfs,
                    std::os::unix::fs::PermissionsExt::from_mode(0o755),
                )?;
                write!(
                    file,
                    // The export root is a directory of the filesystem under test.
                    "\n[exports]\nmanager = \"knfsd\"\nknfsd_exports_dir = {:?}\nknfsd_exports_file = {:?}\nknfsd_exportfs = {:?}\nallow_shared_filesystem = true\nmount_control_only = true\n",
                    exports_dir(root).display().to_string(),
                    exports_dir(root).join(EXPORTS_FILE).display().to_string(),
                    exportfs.display().to_string()
                )?;
            }
            ExportSetup::Ganesha(ganesha) => write!(file, "\n{}", ganesha.agent_settings())?,
        }
        match kind {
            FsKind::Btrfs => file.write_all(b"\n[quota]\nbackend = \"btrfs\"\n")?,
            FsKind::Image => file.write_all(b"\n[quota]\nbackend = \"image\"\n")?,
            FsKind::Ext4 | FsKind::Xfs => {}
        }
        drop(file);
        let mut command = match namespace {
            Some(namespace) => namespace.command(agent),
            None => Command::new(agent),
        };
        let child = command
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
        let mut server = Self { etc, child, client };
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

    /// The `exportfs` command lines the agent ran, one a line.
    fn exportfs_calls(&self) -> anyhow::Result<String> {
        match std::fs::read_to_string(self.etc.path().join(EXPORTFS_LOG)) {
            Ok(log) => Ok(log),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(String::new()),
            Err(e) => Err(e.into()),
        }
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
    /// The data files of the volume or snapshot the operation works on, by name.
    files: Vec<(String, Vec<u8>)>,
    /// The tree of the snapshot a replica is received from.
    tree: Option<Tree>,
    /// Every replica acknowledged so far, the operation's own included.
    replicas: BTreeSet<SnapshotName>,
}

/// Where an acknowledged volume's data came from, when not from its own writes.
enum Origin {
    Clone(VolumePath),
    Restore {
        source: RestoreSource,
        method: CloneMethod,
    },
}

/// What the acknowledged answer said.
enum Done {
    Volume {
        path: VolumePath,
        capacity_bytes: u64,
        origin: Option<Origin>,
        /// Who may mount it, as last acknowledged.
        export: &'static ExportCase,
    },
    Archived {
        path: VolumePath,
        archive_path: String,
    },
    Deleted {
        path: VolumePath,
    },
    /// A snapshot acknowledged ready.
    Snapshot {
        name: SnapshotName,
        source: VolumePath,
        method: SnapshotMethod,
    },
    SnapshotDeleted {
        name: SnapshotName,
    },
    /// A replica acknowledged ready.
    Replica {
        name: SnapshotName,
        /// The volume the source's snapshot was taken of.
        source: VolumePath,
    },
}

fn volume_request(capacity_bytes: u64, export: &ExportCase) -> anyhow::Result<CreateVolumeRequest> {
    Ok(CreateVolumeRequest {
        capacity_bytes,
        export: Some(export.request()?),
        ..Default::default()
    })
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

/// Makes the volume `path` exported as `export` and fills it with random files, which it
/// answers.
async fn volume_with_files(
    server: &Server,
    root: &Path,
    path: &VolumePath,
    export: &ExportCase,
) -> anyhow::Result<Vec<(String, Vec<u8>)>> {
    server
        .client
        .create_volume(path, &volume_request(GIB, export)?, None)
        .await?;
    let files = random_files()?;
    let dir = root.join(path.as_str());
    write_files(&dir, &files)?;
    // The volume's own filesystem where it is one (an image volume's ext4): the caller
    // syncs the root's.
    rustix::fs::syncfs(std::fs::File::open(&dir)?.as_fd())?;
    Ok(files)
}

/// Takes the snapshot `name` of `source`, acknowledged once the agent answers it ready.
async fn take_snapshot(
    client: &AgentClient,
    name: &SnapshotName,
    source: &VolumePath,
) -> anyhow::Result<Snapshot> {
    let request = &CreateSnapshotRequest {
        source: source.clone(),
    };
    until_ready(&format!("the snapshot {name}"), move || async move {
        let snapshot = client.create_snapshot(name, request, None).await?;
        Ok(snapshot.ready.then_some(snapshot))
    })
    .await
}

/// Sets up what the step needs (a volume to clone, a directory to adopt, a snapshot to
/// restore, ...).
async fn prepare(
    server: &Server,
    root: &Path,
    step: &Step,
    source: Option<&ReplicaSource>,
) -> anyhow::Result<Expected> {
    let export = step.export();
    let mut tree = None;
    let files = match step.op {
        Op::Create => Vec::new(),
        Op::Replica => {
            tree = Some(replica_source(source)?.tree().clone());
            Vec::new()
        }
        Op::Adopt => {
            let files = random_files()?;
            let dir = root.join(&step.name);
            std::fs::create_dir(&dir)?;
            write_files(&dir, &files)?;
            files
        }
        Op::Resize | Op::Export | Op::Archive | Op::Delete => {
            volume_with_files(server, root, &step.path()?, export).await?
        }
        Op::Clone | Op::Snapshot => {
            volume_with_files(server, root, &step.source()?, export).await?
        }
        Op::SnapshotDelete | Op::Restore => {
            let source = step.source()?;
            let files = volume_with_files(server, root, &source, export).await?;
            take_snapshot(&server.client, &step.snapshot()?, &source).await?;
            files
        }
        Op::ArchiveRestore => {
            let source = step.source()?;
            let files = volume_with_files(server, root, &source, export).await?;
            server.client.archive_volume(&source, None, None).await?;
            files
        }
    };
    Ok(Expected {
        files,
        tree,
        replicas: BTreeSet::new(),
    })
}

fn replica_source(source: Option<&ReplicaSource>) -> anyhow::Result<&ReplicaSource> {
    source.context("replicas are cut with no source agent started")
}

/// Receives the source's snapshot as the replica `name`, built from `base` if given,
/// repeating the request as a client does while the agent answers it as running:
/// acknowledged once it is answered ready.
async fn receive_replica(
    client: &AgentClient,
    source: &ReplicaSource,
    name: &SnapshotName,
    base: Option<SnapshotName>,
) -> anyhow::Result<Snapshot> {
    let incremental = base.is_some();
    let request = &source.request(base).await?;
    let outcome = until_ready(&format!("the replica {name}"), move || async move {
        let outcome = client.receive_replica(name, request, None).await?;
        Ok(outcome.snapshot.ready.then_some(outcome))
    })
    .await?;
    // The base holds every file of the same snapshot: an incremental receive that took
    // none from it did not cut what it should.
    ensure!(
        !incremental || outcome.reused_files > 0,
        "the replica {name} took nothing from its base: {outcome:?}"
    );
    Ok(outcome.snapshot)
}

/// Does the step's operation and answers what its acknowledgement said.
async fn act(server: &Server, step: &Step, source: Option<&ReplicaSource>) -> anyhow::Result<Done> {
    let client = &server.client;
    let path = step.path()?;
    let export = step.export();
    let made = |origin, export| Done::Volume {
        path: path.clone(),
        capacity_bytes: GIB,
        origin,
        export,
    };
    Ok(match step.op {
        Op::Create => {
            let outcome = client
                .create_volume(&path, &volume_request(GIB, export)?, None)
                .await?;
            ensure!(outcome.created, "{path} existed already");
            made(None, export)
        }
        Op::Adopt => {
            let request = AdoptVolumeRequest {
                capacity_bytes: GIB,
                owner: owner(&step.name),
                export: Some(export.request()?),
            };
            client.adopt_volume(&path, &request, None).await?;
            made(None, export)
        }
        Op::Clone => {
            let source = step.source()?;
            let request = &CloneVolumeRequest {
                source: source.clone(),
                capacity_bytes: GIB,
                owner: owner(&step.name),
                quota: Default::default(),
                export: Some(export.request()?),
            };
            let target = &path;
            until_ready(&format!("the clone {path}"), move || async move {
                Ok(match client.clone_volume(target, request, None).await? {
                    CloneOutcome::Ready(_) => Some(()),
                    CloneOutcome::InProgress(_) => None,
                })
            })
            .await?;
            made(Some(Origin::Clone(source)), export)
        }
        Op::Resize => {
            client.resize_volume(&path, 2 * GIB, None).await?;
            Done::Volume {
                path,
                capacity_bytes: 2 * GIB,
                origin: None,
                export,
            }
        }
        Op::Export => {
            client
                .set_volume_export(&path, &CHANGED.request()?, None)
                .await?;
            made(None, &CHANGED)
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
        Op::Snapshot => {
            let snapshot = take_snapshot(client, &step.snapshot()?, &step.source()?).await?;
            Done::Snapshot {
                name: snapshot.name,
                source: snapshot.source,
                method: snapshot.method,
            }
        }
        Op::SnapshotDelete => {
            let name = step.snapshot()?;
            client.delete_snapshot(&name, None).await?;
            Done::SnapshotDeleted { name }
        }
        Op::Restore => {
            let source = RestoreSource::Snapshot(step.snapshot()?);
            let method = restore(client, &path, &source, export, &step.name).await?;
            made(Some(Origin::Restore { source, method }), export)
        }
        Op::ArchiveRestore => {
            // The step's source was archived under its own path, once.
            let from = step.source()?;
            let id = client
                .list_archives(None)
                .await?
                .into_iter()
                .find(|archive| archive.path == from)
                .with_context(|| format!("no archive of {from}"))?
                .id;
            let source = RestoreSource::Archive(id);
            let method = restore(client, &path, &source, export, &step.name).await?;
            made(Some(Origin::Restore { source, method }), export)
        }
        Op::Replica => {
            let source = replica_source(source)?;
            let name = step.snapshot()?;
            let snapshot = receive_replica(client, source, &name, step.replica_base()?).await?;
            ensure!(
                snapshot.method == SnapshotMethod::Replica && snapshot.source == *source.volume(),
                "the replica {name} is acknowledged as {snapshot:?}, not as a replica of {}",
                source.volume()
            );
            Done::Replica {
                name: snapshot.name,
                source: snapshot.source,
            }
        }
    })
}

/// Makes `path` from `source`, repeating the request while the agent answers it as
/// running; the method the made volume's origin names.
async fn restore(
    client: &AgentClient,
    path: &VolumePath,
    source: &RestoreSource,
    export: &ExportCase,
    claim: &str,
) -> anyhow::Result<CloneMethod> {
    let request = &RestoreVolumeRequest {
        export: Some(export.request()?),
        ..RestoreVolumeRequest::from_source(source.clone(), GIB, owner(claim))
    };
    let volume = until_ready(&format!("the restore {path}"), move || async move {
        Ok(match client.restore_volume(path, request, None).await? {
            RestoreOutcome::Ready(outcome) => Some(outcome.volume),
            RestoreOutcome::InProgress(_) => None,
        })
    })
    .await?;
    volume
        .restore
        .map(|origin| origin.method)
        .with_context(|| format!("the restored {path} is answered without its origin"))
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

/// One copy of the disk taken at a power cut, and how to check it.
struct Cut<'a> {
    agent: &'a Path,
    kind: FsKind,
    manager: Manager,
    image: &'a Path,
    scratch: &'a Path,
    /// The export root of the agent that acknowledged, as its exports file names it.
    original_root: &'a Path,
    /// The `fsid` each export was first seen with ([`first_fsids`]).
    fsids: &'a Fsids,
}

impl Cut<'_> {
    /// Mounts the copy (recovering its journal), checks what is on it as found, then
    /// starts an agent on it and checks what that agent answers: the verdict, inside what
    /// went wrong with the check itself.
    async fn check(
        &self,
        expected: &Expected,
        done: &Done,
        exported: &Exported,
    ) -> anyhow::Result<anyhow::Result<()>> {
        let mount = self.scratch.join("mnt");
        std::fs::create_dir_all(&mount)?;
        // The copy has the original's UUID; XFS refuses that unless told.
        let options = match self.kind {
            FsKind::Xfs | FsKind::Image => "loop,nouuid",
            FsKind::Ext4 | FsKind::Btrfs => "loop",
        };
        if let Err(e) = crate::run(
            "mount",
            &[
                "-o".as_ref(),
                options.as_ref(),
                self.image.as_os_str(),
                mount.as_os_str(),
            ],
        ) {
            return Ok(Err(anyhow::anyhow!("the copy does not mount: {e}")));
        }
        let checked = async {
            let root = mount.join("exports");
            match self.manager {
                Manager::Knfsd => {
                    // What the NFS server would read at boot, before any agent touches it.
                    let text = exports_text(&root)
                        .context("the exports directory is not readable on the copy")?;
                    let exports = ExportsFile::parse(&text, self.original_root, self.kind)?;
                    same_fsids(&exports, self.fsids)?;
                    let found = OnDisk::Knfsd(exports);
                    on_disk(self.kind, &root, &found, expected, done, exported)?;
                    let server =
                        Server::start(self.agent, &root, self.kind, &ExportSetup::Knfsd, None)
                            .await?;
                    let verdict = served(&server, self.kind, &root, &found, expected, done).await;
                    drop(server);
                    verdict
                }
                Manager::Ganesha => self.check_ganesha(&mount, expected, done, exported).await,
            }
        }
        .await;
        // With what the agent mounted on the copy (image volumes).
        unmount_recursively(&mount)?;
        Ok(checked)
    }

    /// The ganesha manager's directory as found, then a ganesha booted from it and the
    /// agent started after it, both seeing the copy at the original's paths.
    async fn check_ganesha(
        &self,
        mount: &Path,
        expected: &Expected,
        done: &Done,
        exported: &Exported,
    ) -> anyhow::Result<()> {
        let root = mount.join("exports");
        let original_dir = ganesha_dir(self.original_root);
        let files = GaneshaFiles::read(&ganesha_dir(&root), &original_dir)?;
        let leftovers = files.leftovers();
        ensure!(
            leftovers.is_empty(),
            "staged files are left in ganesha's directory: {leftovers:?}"
        );
        // What the served list must be: each acknowledged block's id at its path.
        let wanted: Vec<(u16, String)> = files
            .blocks
            .values()
            .map(|block| (block.id, block.path.clone()))
            .collect();
        let found = OnDisk::Ganesha(files, self.original_root.to_owned());
        on_disk(self.kind, &root, &found, expected, done, exported)?;
        let original_mount = self
            .original_root
            .parent()
            .context("the export root has no parent")?;
        let view = CopyAtOriginal::new(mount, original_mount)?;
        let nfs = GaneshaService::start(&original_dir, Some(&view)).await?;
        // Subvolumes are mounted by the agent, and a reboot loses those mounts: ganesha
        // alone cannot serve a btrfs volume until the agent has started.
        if self.kind != FsKind::Btrfs {
            let booted = agents_exports(&nfs.ganesha)?;
            ensure!(
                booted == wanted,
                "ganesha booted from the copy serves {booted:?}, not the acknowledged {wanted:?}"
            );
        }
        let server = Server::start(
            self.agent,
            self.original_root,
            self.kind,
            &ExportSetup::Ganesha(&nfs.ganesha),
            Some(&view),
        )
        .await?;
        served(&server, self.kind, &root, &found, expected, done).await?;
        let restored = agents_exports(&nfs.ganesha)?;
        ensure!(
            restored == wanted,
            "after the agent's start on the copy ganesha serves {restored:?}, not the acknowledged {wanted:?}"
        );
        // Dropped in reverse: the agent, ganesha, then the namespace's holder, whose
        // namespace (and its hold on the copy) ends with the last of them.
        Ok(())
    }
}

/// The exports ganesha serves but its own pseudo-filesystem root (id 0).
fn agents_exports(ganesha: &Ganesha) -> anyhow::Result<Vec<(u16, String)>> {
    let mut exports = ganesha.exports()?;
    exports.retain(|(id, _)| *id != 0);
    exports.sort_unstable_by(|a, b| a.1.cmp(&b.1));
    Ok(exports)
}

/// The NFS server's files as the cut left them.
enum OnDisk {
    Knfsd(ExportsFile),
    /// With the export root the files name.
    Ganesha(GaneshaFiles, PathBuf),
}

impl OnDisk {
    /// The volumes exported, by their path below the export root.
    fn volumes(&self) -> anyhow::Result<BTreeSet<String>> {
        match self {
            OnDisk::Knfsd(exports) => Ok(exports.lines.keys().cloned().collect()),
            OnDisk::Ganesha(files, root) => {
                let prefix = format!("{}/", root.display());
                files
                    .blocks
                    .keys()
                    .map(|path| {
                        path.strip_prefix(&prefix)
                            .map(str::to_owned)
                            .with_context(|| {
                                format!("ganesha's files export {path}, outside the export root")
                            })
                    })
                    .collect()
            }
        }
    }

    /// What is wrong with the export of `volume` as found, against `export`; `None` when
    /// the volume is not exported at all.
    fn differences(&self, volume: &str, export: &ExportCase) -> Option<Vec<String>> {
        match self {
            OnDisk::Knfsd(exports) => exports.lines.get(volume).map(|listed| {
                let mut wrong = Vec::new();
                let wanted = export.entries(exports.kind);
                if listed.entries != wanted {
                    wrong.push(format!("listed as {:?}, not as {wanted:?}", listed.entries));
                }
                match (&listed.fsid, exports.kind.own_filesystems()) {
                    (Some(fsid), true) if is_uuid(fsid) => {}
                    (None, false) => {}
                    (fsid, _) => wrong.push(format!("listed with the fsid {fsid:?}")),
                }
                wrong
            }),
            OnDisk::Ganesha(files, root) => {
                let path = root.join(volume).display().to_string();
                files
                    .blocks
                    .get(&path)
                    .map(|block| export.block_differences(block, &path))
            }
        }
    }
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

/// The `fsid` of each knfsd export of a volume that is a filesystem of its own, by the
/// volume's path, as first seen.
type Fsids = BTreeMap<String, String>;

/// Adds the `fsid`s of the exports files the agent serving `root` keeps now, before the
/// operation under test, for the exports not seen before: an export must keep its fsid
/// for good, through changes of its clients and restarts.
fn first_fsids(root: &Path, kind: FsKind, fsids: &mut Fsids) -> anyhow::Result<()> {
    let text = exports_text(root)?;
    for (volume, line) in ExportsFile::parse(&text, root, kind)?.lines {
        if let Some(fsid) = line.fsid {
            fsids.entry(volume).or_insert(fsid);
        }
    }
    Ok(())
}

/// Fails if an export in `exports` has another `fsid` than it was first seen with: every
/// file handle its clients hold would go stale.
fn same_fsids(exports: &ExportsFile, fsids: &Fsids) -> anyhow::Result<()> {
    for (volume, line) in &exports.lines {
        if let (Some(found), Some(first)) = (&line.fsid, fsids.get(volume)) {
            ensure!(
                found == first,
                "{volume} is exported with the fsid {found}, not the {first} it had: every file handle its clients hold would go stale"
            );
        }
    }
    Ok(())
}

/// Unmounts `mount` and every mount below it, waiting as [`unmount`] does.
fn unmount_recursively(mount: &Path) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match crate::run("umount", &["--recursive".as_ref(), mount.as_os_str()]) {
            Ok(_) => return Ok(()),
            Err(e) if e.contains("busy") && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => bail!(e),
        }
    }
}

/// The export lines of the exports files, by the volume's path below the export root.
struct ExportsFile {
    lines: BTreeMap<String, ExportLine>,
    /// The volumes the file was written for, which its options depend on.
    kind: FsKind,
}

/// One volume's line of an exports file.
#[derive(Debug)]
struct ExportLine {
    /// Its `client(options)` entries, the value of an `fsid=` option replaced by [`FSID`].
    entries: BTreeSet<String>,
    /// The `fsid=` its entries share, if they have one.
    fsid: Option<String>,
}

/// What an `fsid=` value is read as in an exports file's entries, so that lines compare
/// whatever UUID each export was given.
const FSID: &str = "<fsid>";

impl ExportLine {
    fn parse(volume: &str, entries: &str) -> anyhow::Result<Self> {
        let mut fsids = BTreeSet::new();
        let entries = entries
            .split_whitespace()
            .map(|entry| match entry.split_once("fsid=") {
                Some((before, rest)) => {
                    let end = rest.find([',', ')']).unwrap_or(rest.len());
                    fsids.insert(rest[..end].to_owned());
                    format!("{before}fsid={FSID}{}", &rest[end..])
                }
                None => entry.to_owned(),
            })
            .collect();
        ensure!(
            fsids.len() <= 1,
            "the exports files give the clients of {volume} different fsids: {fsids:?}"
        );
        Ok(Self {
            entries,
            fsid: fsids.pop_first(),
        })
    }
}

/// Whether `text` is a UUID as exports(5) takes an `fsid`: `8-4-4-4-12` hex digits.
fn is_uuid(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(part, len)| part.len() == len && part.bytes().all(|b| b.is_ascii_hexdigit()))
}

impl ExportsFile {
    fn parse(text: &str, root: &Path, kind: FsKind) -> anyhow::Result<Self> {
        let prefix = format!("{}/", root.display());
        let mut lines = BTreeMap::new();
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let (path, entries) = line
                .strip_prefix('"')
                .and_then(|rest| rest.split_once('"'))
                .with_context(|| {
                    // Shortened and escaped: a torn write can leave a line of NULs.
                    let shown: String = line.chars().take(80).collect();
                    format!("the exports files have a line of no path: {shown:?}")
                })?;
            let volume = path.strip_prefix(&prefix).with_context(|| {
                format!("the exports files export {path}, outside the export root")
            })?;
            let line = ExportLine::parse(volume, entries)?;
            ensure!(
                lines.insert(volume.to_owned(), line).is_none(),
                "the exports files list {volume} twice"
            );
        }
        Ok(Self { lines, kind })
    }
}

/// Compares each named file in `dir` with what was written.
fn same_files(dir: &Path, files: &[(String, Vec<u8>)]) -> anyhow::Result<()> {
    for (name, data) in files {
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
}

/// What the copy holds before any agent starts on it: the exports files the NFS server
/// would serve at boot, and the snapshot area as the cut left it (read directly, not
/// through the agent under test); with image volumes, the image area too.
fn on_disk(
    kind: FsKind,
    root: &Path,
    found: &OnDisk,
    expected: &Expected,
    done: &Done,
    exported: &Exported,
) -> anyhow::Result<()> {
    match done {
        Done::Volume { path, export, .. } => match found.differences(path.as_str(), export) {
            None => bail!("the server's files do not export {path}"),
            Some(wrong) => ensure!(
                wrong.is_empty(),
                "the server's files export {path} otherwise than acknowledged: {}",
                wrong.join("; ")
            ),
        },
        Done::Archived { path, .. } | Done::Deleted { path } => {
            ensure!(
                found.differences(path.as_str(), &READ_WRITE).is_none(),
                "the server's files still export {path}, which is gone"
            );
        }
        Done::Snapshot { name, .. } => {
            // Image volumes' snapshots are images, read below.
            if kind != FsKind::Image {
                same_files(&snapshot_tree(root, name), &expected.files)
                    .with_context(|| format!("the snapshot {name} on disk"))?;
            }
        }
        Done::SnapshotDeleted { name } => {
            ensure!(
                !snapshot_record(root, name).exists(),
                "the deleted snapshot {name} still has its record"
            );
            ensure!(
                !snapshot_tree(root, name).exists(),
                "the deleted snapshot {name}'s tree is still at its name"
            );
        }
        Done::Replica { name, .. } => {
            ensure!(
                snapshot_record(root, name).is_file(),
                "the replica {name} has no record on disk"
            );
            let wanted = expected
                .tree
                .as_ref()
                .context("no source tree to compare the replica with")?;
            let found = Tree::read(&snapshot_tree(root, name))
                .with_context(|| format!("the replica {name}'s tree on disk"))?;
            let wrong = found.differences(wanted);
            ensure!(
                wrong.is_empty(),
                "the replica {name}'s tree differs from the source's: {}",
                wrong.join("; ")
            );
        }
    }
    if kind == FsKind::Image {
        images_on_disk(root, expected, done)?;
    }
    // Every other acknowledged export as it was, and nothing else.
    let volumes = found.volumes()?;
    let wanted: BTreeSet<String> = exported.keys().cloned().collect();
    ensure!(
        volumes == wanted,
        "the server's files export {:?} beyond the acknowledged and miss {:?}",
        volumes.difference(&wanted).collect::<Vec<_>>(),
        wanted.difference(&volumes).collect::<Vec<_>>()
    );
    for (volume, export) in exported {
        let wrong = found.differences(volume, export).unwrap_or_default();
        ensure!(
            wrong.is_empty(),
            "the server's files export {volume} otherwise than acknowledged: {}",
            wrong.join("; ")
        );
    }
    Ok(())
}

/// The image area as the cut left it: an acknowledged volume's image and record are
/// there, an archive's or snapshot's image holds exactly its files, and what was
/// deleted or archived has left the volume's image and record.
fn images_on_disk(root: &Path, expected: &Expected, done: &Done) -> anyhow::Result<()> {
    let area = ImageArea::new(root);
    let gone = |key: &str, what: &str| -> anyhow::Result<()> {
        for file in [area.image(key), area.record(key)] {
            ensure!(
                !file.exists(),
                "{} is still on disk, after {what}",
                file.display()
            );
        }
        Ok(())
    };
    match done {
        Done::Volume { path, .. } => {
            for file in [area.image(path.as_str()), area.record(path.as_str())] {
                ensure!(
                    file.is_file(),
                    "the acknowledged volume {path} has no {} on disk",
                    file.display()
                );
            }
        }
        Done::Archived { path, archive_path } => {
            ensure!(
                area.record(archive_path).is_file(),
                "the archive {archive_path} has no record on disk"
            );
            let image = ReadOnlyImage::mount(&area.image(archive_path))?;
            same_files(image.path(), &expected.files)
                .with_context(|| format!("the archive {archive_path}'s image"))?;
            gone(path.as_str(), "its archive")?;
        }
        Done::Deleted { path } => gone(path.as_str(), "its deletion")?,
        Done::Snapshot { name, .. } => {
            let image = ReadOnlyImage::mount(&area.snapshot(name.as_str()))?;
            same_files(image.path(), &expected.files)
                .with_context(|| format!("the snapshot {name}'s image"))?;
        }
        Done::SnapshotDeleted { name } => {
            let image = area.snapshot(name.as_str());
            ensure!(
                !image.exists(),
                "the deleted snapshot {name}'s image {} is still on disk",
                image.display()
            );
        }
        Done::Replica { name, .. } => {
            bail!("the replica {name} was received by image volumes, which take none")
        }
    }
    Ok(())
}

/// What the agent started on the copy answers.
async fn served(
    server: &Server,
    kind: FsKind,
    root: &Path,
    found: &OnDisk,
    expected: &Expected,
    done: &Done,
) -> anyhow::Result<()> {
    let client = &server.client;
    match done {
        Done::Volume {
            path,
            capacity_bytes,
            origin,
            export,
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
            if kind.own_filesystems() {
                // An image volume's capacity is its filesystem's size: a growth
                // acknowledged must have reached the filesystem, not the record only.
                let vfs = rustix::fs::statvfs(root.join(path.as_str()))
                    .with_context(|| format!("statvfs {path}"))?;
                let size = vfs.f_blocks * vfs.f_frsize;
                ensure!(
                    size >= *capacity_bytes,
                    "{path}'s filesystem holds {size} bytes, less than its acknowledged capacity {capacity_bytes}"
                );
            }
            match origin {
                None => {}
                Some(Origin::Clone(source)) => {
                    let recorded = volume.clone.as_ref().map(|c| &c.source);
                    ensure!(
                        recorded == Some(source),
                        "{path} is not recorded as a clone of {source}"
                    );
                }
                Some(Origin::Restore { source, method }) => {
                    ensure!(
                        *method == kind.restore_method(),
                        "{path} was restored by {method}, not by {} as {kind} allows",
                        kind.restore_method()
                    );
                    let recorded = volume.restore.as_ref();
                    ensure!(
                        recorded.is_some_and(|r| r.source == *source && r.method == *method),
                        "{path} is recorded as restored from {recorded:?}, not from {source} by {method}"
                    );
                }
            }
            let served = volume
                .export
                .as_ref()
                .with_context(|| format!("{path} is answered without its export"))?;
            ensure!(
                served.matches(&export.request()?) && served.path.ends_with(&format!("/{path}")),
                "{path} is answered exported as {served:?}, not as acknowledged: {export:?}"
            );
            // Restored to the kernel at start: each client exported with the acknowledged
            // options once the calls are replayed (ganesha's list is compared whole by
            // the caller).
            if let OnDisk::Knfsd(exports) = found {
                let target = root.join(path.as_str());
                // With the fsid of the file as found: the same export, the same handles.
                let fsid = exports
                    .lines
                    .get(path.as_str())
                    .and_then(|line| line.fsid.as_deref())
                    .unwrap_or_default();
                let options = export.options(kind, fsid);
                let calls = server.exportfs_calls()?;
                let table = exported_by_calls(&calls, &target);
                ensure!(
                    table.len() == export.clients.len()
                        && table.values().all(|found| *found == options),
                    "the agent started on the copy left {path} exported as {table:?}, not to {} clients with {options}:\n{calls}",
                    export.clients.len()
                );
            }
            if kind == FsKind::Image {
                // Read through the agent's mount of the copy's image, nothing else.
                images::ensure_mounted_from(
                    &root.join(path.as_str()),
                    &ImageArea::new(root).image(path.as_str()),
                )?;
            }
            // Its root as the agent answers it: an owner and mode set on a filesystem of
            // its own are durable only once that filesystem is synced.
            let meta = std::fs::metadata(root.join(path.as_str()))?;
            let found = (meta.mode() & 0o7777, meta.uid(), meta.gid());
            let answered = (volume.mode.bits(), volume.uid, volume.gid);
            ensure!(
                found == answered,
                "{path} has mode {:o}, owner {}:{} on disk, not {:o}, {}:{} as answered",
                found.0,
                found.1,
                found.2,
                answered.0,
                answered.1,
                answered.2
            );
            same_files(&root.join(path.as_str()), &expected.files)?;
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
            // An image volume's archive is an image, read before the agent started.
            if kind != FsKind::Image {
                same_files(&root.join(archive_path), &expected.files)?;
            }
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
        Done::Snapshot {
            name,
            source,
            method,
        } => {
            ensure!(
                *method == kind.snapshot_method(),
                "the snapshot {name} was taken by {method}, not by {} as {kind} allows",
                kind.snapshot_method()
            );
            let found = client.get_snapshot(name, None).await?;
            ensure!(
                found.ready && found.method == *method && found.source == *source,
                "the snapshot {name} is answered as {found:?}, not ready by {method} of {source}"
            );
            let listed = snapshots(client).await?;
            ensure!(
                listed.iter().any(|s| s.name == *name && s.ready),
                "the snapshot {name} is not listed ready"
            );
        }
        Done::SnapshotDeleted { name } => {
            match client.get_snapshot(name, None).await {
                Err(e) if e.code() == Some(ErrorCode::NotFound) => {}
                Err(e) => return Err(e.into()),
                Ok(found) => bail!("the deleted snapshot {name} is back: {found:?}"),
            }
            ensure!(
                !snapshots(client).await?.iter().any(|s| s.name == *name),
                "the deleted snapshot {name} is listed"
            );
        }
        Done::Replica { name, source } => {
            let found = client.get_snapshot(name, None).await?;
            ensure!(
                found.ready && found.method == SnapshotMethod::Replica && found.source == *source,
                "the replica {name} is answered as {found:?}, not ready by replica of {source}"
            );
        }
    }
    // Every replica acknowledged listed ready, and no other: one received in part (its
    // `.receiving-` tree kept for a resume) never is.
    let listed: BTreeSet<SnapshotName> = snapshots(client)
        .await?
        .into_iter()
        .filter(|s| s.method == SnapshotMethod::Replica || s.name.as_str().starts_with('.'))
        .map(|s| {
            ensure!(s.ready, "the replica {} is listed but not ready", s.name);
            Ok(s.name)
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(
        listed == expected.replicas,
        "the replicas listed are {listed:?}, not the acknowledged {:?}",
        expected.replicas
    );
    // Nothing half-made: every entry at a volume path is a volume (each directory made
    // to be adopted was adopted, durably, before the next operation), and the server's
    // files as found export exactly those volumes (every volume here is made with one).
    let volumes: BTreeSet<String> = client
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
    let exported = found.volumes()?;
    ensure!(
        exported == volumes,
        "the server's files export {:?} but the volumes are {:?}",
        exported.difference(&volumes).collect::<Vec<_>>(),
        volumes.difference(&exported).collect::<Vec<_>>()
    );
    if kind == FsKind::Image {
        // Every volume served from its own image, and no image or record in the area
        // (a creation's image without its record, say) that the agent does not repair
        // away: nothing half-made of an image volume either.
        let area = ImageArea::new(root);
        for volume in &volumes {
            images::ensure_mounted_from(&root.join(volume), &area.image(volume))?;
        }
        let archives = client
            .list_archives(None)
            .await?
            .into_iter()
            .map(|a| a.archive_path)
            .collect();
        let snapshots = snapshots(client)
            .await?
            .into_iter()
            .map(|s| s.name.to_string())
            .collect();
        area.settled(&volumes, &archives, &snapshots).await?;
    }
    Ok(())
}

/// The clients `exportfs` calls leave `path` exported to, each with its options: the
/// calls replayed as the kernel's export table takes them, `-o OPTIONS CLIENT:PATH`
/// exporting, `-u CLIENT:PATH` unexporting. An agent whose volumes are filesystems it
/// mounts at its start exports each again once it is mounted.
fn exported_by_calls(calls: &str, path: &Path) -> BTreeMap<String, String> {
    let suffix = format!(":{}", path.display());
    let mut table = BTreeMap::new();
    for call in calls.lines() {
        let words: Vec<&str> = call.split(' ').collect();
        match words.as_slice() {
            ["-o", options, target] => {
                if let Some(client) = target.strip_suffix(&suffix) {
                    table.insert(client.to_owned(), (*options).to_owned());
                }
            }
            ["-u", target] => {
                if let Some(client) = target.strip_suffix(&suffix) {
                    table.remove(client);
                }
            }
            _ => {}
        }
    }
    table
}

/// Every snapshot the agent lists.
async fn snapshots(client: &AgentClient) -> anyhow::Result<Vec<Snapshot>> {
    let mut all = Vec::new();
    client
        .for_each_snapshot_page(500, None, |page| all.extend(page))
        .await?;
    Ok(all)
}
