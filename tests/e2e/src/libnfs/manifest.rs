//! The clone fixture: a tree with everything a copy can lose, and a comparable manifest.

use std::collections::BTreeMap;
use std::path::Path;

use super::client::*;

/// The fixture's names, relative to its directory.
pub mod fixture {
    /// 1001:1001, 0640, text.
    pub const OWNER_A: &str = "owner-a.txt";
    /// 2002:3003, 0755, a script.
    pub const OWNER_B: &str = "owner-b.sh";
    /// 1001:1001, 0600.
    pub const SECRET: &str = "secret.key";
    /// 2002:3003, 0644, no bytes.
    pub const EMPTY: &str = "empty";
    /// Directory 1001:1001, 0750.
    pub const SUBDIR: &str = "sub";
    /// 1001:1001, 0644, inside [`SUBDIR`].
    pub const NESTED: &str = "sub/nested.txt";
    /// Two names of one inode (2002:3003, 0644), in different directories.
    pub const HARD_LINK: &str = "linked-1";
    pub const HARD_LINK_2: &str = "sub/linked-2";
    /// A relative symlink (owned 1001:1001) to [`OWNER_A`].
    pub const SYMLINK: &str = "sub/to-owner-a";
    pub const SYMLINK_TARGET: &str = "../owner-a.txt";
    /// 64 MiB apparent, two 4 KiB data extents, holes elsewhere; 1001:1001, 0644.
    pub const SPARSE: &str = "sparse.img";
    pub const SPARSE_SIZE: u64 = 64 << 20;
    pub const SPARSE_EXTENTS: [u64; 2] = [1 << 20, 40 << 20];
    pub const EXTENT_LEN: usize = 4096;

    /// Every name the fixture makes, parents before children.
    pub const NAMES: [&str; 10] = [
        OWNER_A,
        OWNER_B,
        SECRET,
        EMPTY,
        SUBDIR,
        NESTED,
        HARD_LINK,
        HARD_LINK_2,
        SYMLINK,
        SPARSE,
    ];

    /// The bytes of the sparse file's `index`th extent.
    pub fn extent_bytes(index: usize) -> Vec<u8> {
        (0..EXTENT_LEN)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(index as u8 + 1) | 1)
            .collect()
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// Makes the clone fixture under `dir` (a volume's path inside the export, which must
/// exist): files with distinct owners and modes, a directory, a hard-link pair, a relative
/// symlink, a sparse file and an empty file (see [`fixture`]). Files are created by
/// `client` (root, so any `dir` works) and then chowned; the directory and the symlink,
/// which libnfs 4.0 cannot chown over NFSv4, are made by their owners
/// ([`NfsClient::mkdir_owned`], [`NfsClient::symlink_owned`]), so the export's root must
/// be searchable by others.
pub fn write_fixture_tree(client: &NfsClient, dir: &str) -> anyhow::Result<()> {
    use fixture::*;
    let at = |name: &str| join(dir, name);
    client.write_file(&at(OWNER_A), b"owned by 1001, mode 0640\n", 0o640)?;
    client.write_file(&at(OWNER_B), b"#!/bin/sh\necho owned by 2002:3003\n", 0o755)?;
    client.write_file(&at(SECRET), b"not for others\n", 0o600)?;
    client.write_file(&at(EMPTY), b"", 0o644)?;
    client.mkdir_owned(&at(SUBDIR), 0o750, 1001, 1001)?;
    client.write_file(&at(NESTED), b"a file in a 0750 directory\n", 0o644)?;
    client.write_file(&at(HARD_LINK), b"one inode, two names\n", 0o644)?;
    client.hard_link(&at(HARD_LINK), &at(HARD_LINK_2))?;
    client.symlink_owned(SYMLINK_TARGET, &at(SYMLINK), 1001, 1001)?;
    let extents: Vec<(u64, Vec<u8>)> = SPARSE_EXTENTS
        .iter()
        .enumerate()
        .map(|(i, offset)| (*offset, extent_bytes(i)))
        .collect();
    let extents: Vec<(u64, &[u8])> = extents.iter().map(|(o, b)| (*o, b.as_slice())).collect();
    client.write_sparse(&at(SPARSE), SPARSE_SIZE, &extents, 0o644)?;

    for name in [OWNER_A, SECRET, NESTED, SPARSE] {
        client.chown(&at(name), 1001, 1001)?;
    }
    for name in [OWNER_B, EMPTY, HARD_LINK] {
        client.chown(&at(name), 2002, 3003)?;
    }
    Ok(())
}

/// A file's content in a form that compares and prints well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Small UTF-8 files, verbatim.
    Text(String),
    /// Anything else: its length, a 64-bit FNV-1a hash of every byte, and the offsets of
    /// its 4 KiB blocks that are not all zeros (where a sparse file has data).
    Digest {
        len: u64,
        fnv1a: u64,
        nonzero_blocks: Vec<u64>,
    },
}

/// Largest file whose text is kept verbatim.
const TEXT_LIMIT: usize = 4096;
/// Unit of [`Content::Digest::nonzero_blocks`].
const BLOCK: usize = 4096;
/// Files this large report whether they have holes.
const HOLE_CHECK_MIN: u64 = 1 << 20;

impl Content {
    pub(super) fn of(bytes: &[u8]) -> Self {
        if bytes.len() <= TEXT_LIMIT
            && let Ok(text) = std::str::from_utf8(bytes)
        {
            return Self::Text(text.to_owned());
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let nonzero_blocks = bytes
            .chunks(BLOCK)
            .enumerate()
            .filter(|(_, block)| block.iter().any(|b| *b != 0))
            .map(|(i, _)| (i * BLOCK) as u64)
            .collect();
        Self::Digest {
            len: bytes.len() as u64,
            fnv1a: hash,
            nonzero_blocks,
        }
    }
}

/// One name of a tree, everything a faithful copy keeps (inode numbers and times aside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub kind: FileKind,
    /// `mode & 0o7777`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size of files and symlinks; `None` for directories (it depends on the filesystem).
    pub size: Option<u64>,
    /// Link count of non-directories (a directory's depends on the filesystem).
    pub nlink: Option<u64>,
    pub content: Option<Content>,
    pub symlink_target: Option<String>,
    /// For files of at least 1 MiB: whether less than half of the size is allocated.
    pub has_holes: Option<bool>,
}

/// A tree as a comparable value: `assert_eq!(source, clone)` shows what differs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeManifest {
    /// Relative path to entry, sorted; the tree's root itself is not included.
    pub entries: BTreeMap<String, ManifestEntry>,
    /// Sets of names that are one inode, each sorted, sorted.
    pub hard_links: Vec<Vec<String>>,
}

/// What the manifest needs of a tree: std::fs on the server side, or a client over NFS.
trait TreeReader {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat>;
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>>;
    fn readlink(&self, path: &str) -> anyhow::Result<String>;
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>>;
}

impl TreeReader for NfsClient {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat> {
        NfsClient::lstat(self, path)
    }
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>> {
        self.read_dir(dir)
    }
    fn readlink(&self, path: &str) -> anyhow::Result<String> {
        NfsClient::readlink(self, path)
    }
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        self.read_file(path)
    }
}

/// The server's own view of a directory, through std::fs.
struct LocalTree;

impl TreeReader for LocalTree {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat> {
        local_stat(Path::new(path))
    }
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }
    fn readlink(&self, path: &str) -> anyhow::Result<String> {
        Ok(std::fs::read_link(path)?.to_string_lossy().into_owned())
    }
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        Ok(std::fs::read(path)?)
    }
}

/// `lstat` on the server side, in [`NfsStat`]'s terms (`used_bytes` is `st_blocks * 512`).
pub fn local_stat(path: &Path) -> anyhow::Result<NfsStat> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| anyhow::anyhow!("lstat {}: {e}", path.display()))?;
    let time = |sec: i64, nsec: i64| Timestamp {
        sec,
        nsec: nsec as u32,
    };
    Ok(NfsStat {
        kind: FileKind::from_mode(meta.mode()),
        mode: meta.mode() & 0o7777,
        raw_mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        nlink: meta.nlink(),
        ino: meta.ino(),
        size: meta.size(),
        used_bytes: meta.blocks() * 512,
        blocks: meta.blocks(),
        blksize: meta.blksize(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
    })
}

fn snapshot<R: TreeReader>(reader: &R, root: &str) -> anyhow::Result<TreeManifest> {
    let mut manifest = TreeManifest::default();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut pending = vec![String::new()];
    while let Some(relative_dir) = pending.pop() {
        let dir = if relative_dir.is_empty() {
            root.to_owned()
        } else {
            join(root, &relative_dir)
        };
        for name in reader.names(&dir)? {
            let relative = if relative_dir.is_empty() {
                name.clone()
            } else {
                format!("{relative_dir}/{name}")
            };
            let path = join(&dir, &name);
            let stat = reader.lstat(&path)?;
            let is_dir = stat.kind == FileKind::Directory;
            let mut entry = ManifestEntry {
                kind: stat.kind,
                mode: stat.mode,
                uid: stat.uid,
                gid: stat.gid,
                size: (!is_dir).then_some(stat.size),
                nlink: (!is_dir).then_some(stat.nlink),
                content: None,
                symlink_target: None,
                has_holes: None,
            };
            match stat.kind {
                FileKind::Directory => pending.push(relative.clone()),
                FileKind::Symlink => entry.symlink_target = Some(reader.readlink(&path)?),
                FileKind::File => {
                    entry.content = Some(Content::of(&reader.read(&path)?));
                    if stat.size >= HOLE_CHECK_MIN {
                        entry.has_holes = Some(stat.used_bytes < stat.size / 2);
                    }
                }
                FileKind::Other(_) => {}
            }
            if !is_dir && stat.nlink > 1 {
                inodes.entry(stat.ino).or_default().push(relative.clone());
            }
            manifest.entries.insert(relative, entry);
        }
    }
    manifest.hard_links = inodes
        .into_values()
        .filter(|names| names.len() > 1)
        .map(|mut names| {
            names.sort();
            names
        })
        .collect();
    manifest.hard_links.sort();
    Ok(manifest)
}

/// Reads the tree under `dir` through NFS into a [`TreeManifest`]. Names come from
/// `readdir` (libnfs's `nfs_readdir`), so anything in the tree shows, not only the
/// fixture's names; `dir`'s own attributes are left out.
pub fn snapshot_tree(client: &NfsClient, dir: &str) -> anyhow::Result<TreeManifest> {
    snapshot(client, dir)
}

/// As [`snapshot_tree`], on the server side with std::fs (for a tree inside an export).
pub fn snapshot_local_tree(dir: &Path) -> anyhow::Result<TreeManifest> {
    let dir = dir
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", dir.display()))?;
    snapshot(&LocalTree, dir)
}

/// Apparent size and allocated bytes (NFSv4 `space_used`) of the fixture's sparse file,
/// so a test can check its holes survived a copy.
pub fn sparse_usage(client: &NfsClient, dir: &str) -> anyhow::Result<(u64, u64)> {
    let stat = client.lstat(&join(dir, fixture::SPARSE))?;
    Ok((stat.size, stat.used_bytes))
}
