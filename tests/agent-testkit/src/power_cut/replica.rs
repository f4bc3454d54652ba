//! The source of the replicas the agent under test receives: an agent outside the cut
//! filesystem, one volume holding a small tree with the entries a replica must keep
//! exactly (owners, modes, a hard link, symlinks, a sparse file), and one snapshot of it,
//! read through a fresh grant for each receive. And a listing of a tree to compare a
//! replica received with the source's tree, entry by entry.

use std::collections::{BTreeMap, HashMap};
use std::io::Read;
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::Context;
use nfsprov_agent::init::files;
use nfsprov_api_types::{
    CreateSnapshotRequest, CreateTransferRequest, CreateVolumeRequest, ReceiveReplicaRequest,
    SnapshotName, VolumePath,
};

use crate::TestAgent;

/// How long each grant reads the snapshot: far longer than a receive of this tree.
const GRANT_TTL_SECONDS: u64 = 600;
const SPARSE_BYTES: u64 = 64 << 20;

/// An agent with one snapshot to replicate, stopped when dropped.
pub struct ReplicaSource {
    agent: TestAgent,
    // Dropped after the agent serving it.
    _root: tempfile::TempDir,
    ca_pem: String,
    snapshot: SnapshotName,
    volume: VolumePath,
    /// The snapshot's tree, as written.
    tree: Tree,
}

impl ReplicaSource {
    /// Starts the agent on a directory of its own, makes the volume, writes its tree and
    /// takes the snapshot.
    pub async fn start() -> anyhow::Result<Self> {
        let root = tempfile::tempdir()?;
        let agent = TestAgent::start(root.path()).await?;
        let client = agent.client();
        let volume = VolumePath::parse("replicated")?;
        client
            .create_volume(
                &volume,
                &CreateVolumeRequest {
                    capacity_bytes: 1 << 30,
                    ..Default::default()
                },
                None,
            )
            .await?;
        let dir = root.path().join(volume.as_str());
        write_tree(&dir)?;
        let tree = Tree::read(&dir)?;
        let snapshot = SnapshotName::parse("replicated")?;
        let request = &CreateSnapshotRequest {
            source: volume.clone(),
        };
        let client = &client;
        let snapshot_name = &snapshot;
        super::retry::until_ready("the source's snapshot", move || async move {
            let taken = client.create_snapshot(snapshot_name, request, None).await?;
            Ok(taken.ready.then_some(()))
        })
        .await?;
        let ca_pem = std::fs::read_to_string(agent.credentials_dir().join(files::CA_CERT))?;
        Ok(Self {
            agent,
            _root: root,
            ca_pem,
            snapshot,
            volume,
            tree,
        })
    }

    /// The volume the snapshot was taken of, which a replica names as its source.
    pub fn volume(&self) -> &VolumePath {
        &self.volume
    }

    pub fn tree(&self) -> &Tree {
        &self.tree
    }

    /// A receive of the snapshot through a fresh grant, built from the replica `base`
    /// if one is given.
    pub async fn request(
        &self,
        base: Option<SnapshotName>,
    ) -> anyhow::Result<ReceiveReplicaRequest> {
        let grant = self
            .agent
            .client()
            .create_transfer(
                &self.snapshot,
                &CreateTransferRequest {
                    ttl_seconds: Some(GRANT_TTL_SECONDS),
                },
                None,
            )
            .await?;
        Ok(ReceiveReplicaRequest {
            source_url: self.agent.connection().url,
            source_ca_pem: self.ca_pem.clone(),
            grant,
            base,
        })
    }
}

/// Writes the tree: files of other owners and modes, a directory with the sticky bit,
/// a hard link, a relative and an absolute symlink (neither followed), a file of
/// 64 MiB that is mostly holes, and an old modification time.
fn write_tree(volume: &Path) -> anyhow::Result<()> {
    let deep = volume.join("sub/deeper");
    std::fs::create_dir_all(&deep)?;
    std::fs::write(deep.join("leaf.txt"), b"two levels down")?;
    let mut data = vec![0u8; 96 * 1024];
    rustix::rand::getrandom(&mut data, rustix::rand::GetRandomFlags::empty())?;
    std::fs::write(volume.join("data.bin"), &data)?;
    std::fs::write(volume.join("private.txt"), b"for 1234 only")?;
    std::os::unix::fs::chown(volume.join("private.txt"), Some(1234), Some(5678))?;
    std::fs::set_permissions(
        volume.join("private.txt"),
        std::fs::Permissions::from_mode(0o640),
    )?;
    std::fs::write(volume.join("empty"), b"")?;
    let shared = volume.join("shared");
    std::fs::create_dir(&shared)?;
    std::os::unix::fs::chown(&shared, Some(2000), Some(2000))?;
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777))?;
    std::fs::hard_link(volume.join("data.bin"), shared.join("data-link.bin"))?;
    std::os::unix::fs::symlink("../data.bin", shared.join("relative-link"))?;
    std::os::unix::fs::symlink("/etc", volume.join("escape"))?;
    let sparse = std::fs::File::create(volume.join("sparse.img"))?;
    sparse.set_len(SPARSE_BYTES)?;
    sparse.write_all_at(&[0xab; 65536], 65536)?;
    sparse.write_all_at(&[0xcd; 65536], SPARSE_BYTES / 2)?;
    drop(sparse);
    let past = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123_456_789);
    std::fs::File::options()
        .write(true)
        .open(volume.join("data.bin"))?
        .set_times(std::fs::FileTimes::new().set_modified(past))?;
    Ok(())
}

/// Every entry below a directory as a comparable line (kind, mode, owner, modification
/// time, symlink target, size, a hash of the content and, for a file of many
/// mebibytes, whether it is mostly holes), and the names that share an inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tree {
    entries: BTreeMap<PathBuf, String>,
    links: Vec<Vec<PathBuf>>,
}

impl Tree {
    pub fn read(root: &Path) -> anyhow::Result<Self> {
        let mut entries = BTreeMap::new();
        let mut inodes: HashMap<u64, Vec<PathBuf>> = HashMap::new();
        let mut pending = vec![root.to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let full = entry?.path();
                let relative = full.strip_prefix(root)?.to_owned();
                let meta = std::fs::symlink_metadata(&full)?;
                let kind = meta.file_type();
                let mut line = format!(
                    "mode {:o} owner {}:{} mtime {}.{:09}",
                    meta.mode(),
                    meta.uid(),
                    meta.gid(),
                    meta.mtime(),
                    meta.mtime_nsec()
                );
                if kind.is_symlink() {
                    line += &format!(" link->{}", std::fs::read_link(&full)?.display());
                } else if kind.is_dir() {
                    pending.push(full.clone());
                } else if kind.is_file() {
                    line += &format!(" size {} data {:016x}", meta.len(), content_hash(&full)?);
                    if meta.len() >= 16 << 20 {
                        line += &format!(" sparse {}", meta.blocks() * 512 < meta.len() / 16);
                    }
                    if meta.nlink() > 1 {
                        inodes.entry(meta.ino()).or_default().push(relative.clone());
                    }
                }
                entries.insert(relative, line);
            }
        }
        let mut links: Vec<Vec<PathBuf>> = inodes
            .into_values()
            .map(|mut names| {
                names.sort();
                names
            })
            .collect();
        links.sort();
        Ok(Self { entries, links })
    }

    /// What differs between this tree as found and `wanted`, one line each.
    pub fn differences(&self, wanted: &Tree) -> Vec<String> {
        let mut wrong = Vec::new();
        for (name, line) in &wanted.entries {
            match self.entries.get(name) {
                None => wrong.push(format!("{} is missing", name.display())),
                Some(found) if found != line => {
                    wrong.push(format!("{}: {found}, not {line}", name.display()));
                }
                Some(_) => {}
            }
        }
        for name in self.entries.keys() {
            if !wanted.entries.contains_key(name) {
                wrong.push(format!("{} is not in the source", name.display()));
            }
        }
        if self.links != wanted.links {
            wrong.push(format!(
                "hard links {:?}, not {:?}",
                self.links, wanted.links
            ));
        }
        wrong
    }
}

/// FNV-1a of a file's content, read in pieces.
fn content_hash(path: &Path) -> anyhow::Result<u64> {
    let mut file = std::fs::File::open(path)?;
    let mut buffer = vec![0u8; 1 << 20];
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    loop {
        let n = file.read(&mut buffer)?;
        if n == 0 {
            return Ok(hash);
        }
        for byte in &buffer[..n] {
            hash = (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3);
        }
    }
}
