//! The scan of a (snapshot) tree into its manifest, streamed entry by entry.

use std::collections::HashMap;
use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nfsprov_api_types::manifest::{EntryKind, MAX_MANIFEST_DEPTH, ManifestEntry, WireBytes, Xattr};
use rustix::fs::{AtFlags, Dir, FileType, Statx};
use rustix::io::Errno;

use super::common::{child_path, hash_file, open_dir_at, open_file_at, shown, to_ns};
use crate::store::copy::metadata::{
    Identity, LEGACY_XATTR, Node, file_type, identity, permissions, stat_fd, stat_mask,
};
use crate::store::error::{Result, StoreError, io_error};
use crate::store::tree::MountId;

/// What a scan met.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanStats {
    /// Below the root.
    pub directories: u64,
    /// Regular files, each inode once.
    pub files: u64,
    /// Bytes of those files, holes included: what was hashed.
    pub bytes: u64,
    pub symlinks: u64,
    /// Fifos, sockets and devices.
    pub others: u64,
    /// Names after the first of an inode.
    pub hard_links: u64,
}

/// A directory being listed: its names not yet emitted, last first.
struct Frame {
    dir: OwnedFd,
    path: Vec<u8>,
    names: Vec<CString>,
}

/// Walks the tree below `root` and gives `emit` its manifest, entry by entry in manifest
/// order (see [`nfsprov_api_types::manifest`]); stops at the first error, its own or
/// `emit`'s.
///
/// Confined like the local copy: every entry is reached from its parent's descriptor
/// with `O_NOFOLLOW` and checked once opened to be the inode listed; a mount point below
/// the root stops the scan; nothing is followed. Meant for a snapshot, which does not
/// change; a tree that changes during the scan may fail it (an entry replaced) or give a
/// manifest of no single moment.
///
/// Memory: the names of each directory on the path being walked (a directory's names
/// are sorted, so they are read whole), at most [`MAX_MANIFEST_DEPTH`] levels; and the
/// path of the first name of each inode with several names, until the scan ends.
pub fn scan(
    root: BorrowedFd<'_>,
    emit: &mut dyn FnMut(ManifestEntry) -> Result<()>,
) -> Result<ScanStats> {
    let mut stats = ScanStats::default();
    let root = open_dir_at(root, c".", b"")?;
    let root_stat = stat_fd(root.as_fd()).map_err(|e| io_error("stat the root", e))?;
    let mount = MountId::of(&root_stat);
    emit(describe(&Node::Fd(root.as_fd()), &root_stat, Vec::new())?)?;
    let names = list(root.as_fd(), b"")?;
    let mut stack = vec![Frame {
        dir: root,
        path: Vec::new(),
        names,
    }];
    let mut first_names: HashMap<Identity, (Vec<u8>, Option<String>)> = HashMap::new();
    loop {
        let depth = stack.len();
        let Some(top) = stack.last_mut() else {
            break;
        };
        let Some(name) = top.names.pop() else {
            stack.pop();
            continue;
        };
        let path = child_path(&top.path, name.to_bytes());
        let dir = top.dir.as_fd();
        let listed = rustix::fs::statx(dir, &name, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
            .map_err(|e| match e {
                Errno::NOENT => changed(&path),
                e => io_error(format!("stat {}", shown(&path)), e),
            })?;
        if MountId::of(&listed) != mount {
            return Err(StoreError::Conflict(format!(
                "{} is a mount point inside the tree; a replica never spans filesystems",
                shown(&path)
            )));
        }
        let kind = file_type(&listed);
        if kind == FileType::Directory {
            if depth >= MAX_MANIFEST_DEPTH {
                return Err(StoreError::Unsupported(format!(
                    "{} is deeper than a manifest goes ({MAX_MANIFEST_DEPTH} levels)",
                    shown(&path)
                )));
            }
            let opened = open_dir_at(dir, &name, &path)?;
            let stat = checked_stat(opened.as_fd(), &listed, &path)?;
            emit(describe(&Node::Fd(opened.as_fd()), &stat, path.clone())?)?;
            stats.directories += 1;
            let names = list(opened.as_fd(), &path)?;
            stack.push(Frame {
                dir: opened,
                path,
                names,
            });
            continue;
        }
        let linked = listed.stx_nlink > 1;
        if linked && let Some((first, sha256)) = first_names.get(&identity(&listed)) {
            let mut entry = describe(&Node::At(dir, &name), &listed, path)?;
            entry.link = Some(WireBytes(first.clone()));
            if entry.kind == EntryKind::Symlink {
                entry.atime_ns = None;
                entry.target = Some(WireBytes(
                    rustix::fs::readlinkat(dir, &name, Vec::new())
                        .map_err(|e| {
                            io_error(format!("read the link {}", shown(&entry.path.0)), e)
                        })?
                        .into_bytes(),
                ));
            }
            if entry.kind == EntryKind::File {
                entry.size = listed.stx_size;
                entry.sha256.clone_from(sha256);
            }
            stats.hard_links += 1;
            emit(entry)?;
            continue;
        }
        let entry = match kind {
            FileType::RegularFile => {
                let opened = open_file_at(dir, &name).map_err(|e| match e {
                    Errno::LOOP | Errno::NXIO => changed(&path),
                    e => io_error(format!("open {}", shown(&path)), e),
                })?;
                let stat = checked_stat(opened.as_fd(), &listed, &path)?;
                let mut entry = describe(&Node::Fd(opened.as_fd()), &stat, path)?;
                entry.size = stat.stx_size;
                entry.sha256 = Some(hash_file(opened.as_fd(), stat.stx_size, &entry.path.0)?);
                stats.files += 1;
                stats.bytes += stat.stx_size;
                entry
            }
            FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(dir, &name, Vec::new()).map_err(|e| match e {
                        Errno::INVAL | Errno::NOENT => changed(&path),
                        e => io_error(format!("read the link {}", shown(&path)), e),
                    })?;
                let mut entry = describe(&Node::At(dir, &name), &listed, path)?;
                entry.target = Some(WireBytes(target.into_bytes()));
                // Reading a link moves its access time (there is no O_NOATIME for it),
                // so the time read is of no moment worth keeping.
                entry.atime_ns = None;
                stats.symlinks += 1;
                entry
            }
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => {
                let mut entry = describe(&Node::At(dir, &name), &listed, path)?;
                if matches!(kind, FileType::CharacterDevice | FileType::BlockDevice) {
                    entry.rdev = Some(rustix::fs::makedev(
                        listed.stx_rdev_major,
                        listed.stx_rdev_minor,
                    ));
                }
                stats.others += 1;
                entry
            }
            _ => {
                return Err(StoreError::Unsupported(format!(
                    "{} is of a type a manifest cannot hold",
                    shown(&path)
                )));
            }
        };
        if linked {
            first_names.insert(
                identity(&listed),
                (entry.path.0.clone(), entry.sha256.clone()),
            );
        }
        emit(entry)?;
    }
    Ok(stats)
}

fn changed(path: &[u8]) -> StoreError {
    StoreError::Conflict(format!(
        "{} changed while the tree was scanned; a scan is of a snapshot, which does not change",
        shown(path)
    ))
}

/// The stat of an entry just opened, which must be the one listed.
fn checked_stat(fd: BorrowedFd<'_>, listed: &Statx, path: &[u8]) -> Result<Statx> {
    let stat = stat_fd(fd).map_err(|e| io_error(format!("stat {}", shown(path)), e))?;
    if identity(&stat) != identity(listed) || file_type(&stat) != file_type(listed) {
        return Err(changed(path));
    }
    Ok(stat)
}

/// A directory's names, sorted by their bytes, last first (popped in order).
fn list(dir: BorrowedFd<'_>, path: &[u8]) -> Result<Vec<CString>> {
    // Read through a descriptor with the directory's own flags, `O_NOATIME` included.
    let mut stream =
        Dir::read_from(dir).map_err(|e| io_error(format!("read {}", shown(path)), e))?;
    let mut names = Vec::new();
    while let Some(entry) = stream.read() {
        let entry = entry.map_err(|e| io_error(format!("read {}", shown(path)), e))?;
        let name = entry.file_name();
        if !crate::store::is_dot(name) {
            names.push(name.to_owned());
        }
    }
    names.sort_unstable_by(|a, b| b.as_bytes().cmp(a.as_bytes()));
    Ok(names)
}

/// An entry's metadata as the manifest holds it; the kind's own fields (size, hash,
/// target, device) are the caller's.
fn describe(node: &Node<'_>, stat: &Statx, path: Vec<u8>) -> Result<ManifestEntry> {
    let kind = match file_type(stat) {
        FileType::Directory => EntryKind::Directory,
        FileType::RegularFile => EntryKind::File,
        FileType::Symlink => EntryKind::Symlink,
        FileType::Fifo => EntryKind::Fifo,
        FileType::Socket => EntryKind::Socket,
        FileType::CharacterDevice => EntryKind::CharDevice,
        FileType::BlockDevice => EntryKind::BlockDevice,
        _ => {
            return Err(StoreError::Unsupported(format!(
                "{} is of a type a manifest cannot hold",
                shown(&path)
            )));
        }
    };
    Ok(ManifestEntry {
        kind,
        mode: permissions(stat),
        uid: stat.stx_uid,
        gid: stat.stx_gid,
        atime_ns: Some(to_ns(&stat.stx_atime, &path)?),
        mtime_ns: to_ns(&stat.stx_mtime, &path)?,
        size: 0,
        sha256: None,
        target: None,
        rdev: None,
        xattrs: xattrs(node, &path)?,
        link: None,
        path: WireBytes(path),
    })
}

fn xattrs(node: &Node<'_>, path: &[u8]) -> Result<Vec<Xattr>> {
    let names = match node.list_xattrs() {
        Ok(names) => names,
        Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
        Err(e) => {
            return Err(io_error(
                format!("list the extended attributes of {}", shown(path)),
                e,
            ));
        }
    };
    let mut xattrs = Vec::new();
    for name in names.split(|b| *b == 0) {
        if name.is_empty() || name == LEGACY_XATTR {
            continue;
        }
        let Ok(c_name) = CString::new(name) else {
            continue;
        };
        let value = match node.get_xattr(&c_name) {
            Ok(value) => value,
            Err(Errno::NODATA) => return Err(changed(path)),
            Err(e) => {
                return Err(io_error(
                    format!(
                        "read the extended attribute {} of {}",
                        String::from_utf8_lossy(name),
                        shown(path)
                    ),
                    e,
                ));
            }
        };
        xattrs.push(Xattr {
            name: WireBytes(name.to_vec()),
            value: WireBytes(value),
        });
    }
    xattrs.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(xattrs)
}
