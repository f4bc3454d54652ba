//! The building of a replica from a manifest, in a staging directory.

use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nfsprov_api_types::manifest::{EntryKind, ManifestEntry, ManifestError, ManifestValidator};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};
use rustix::io::Errno;

use super::common::{
    BLOCK, PRIVATE, from_ns, hash_file, open_file_at, open_parent, shown, split_path,
};
use crate::store::copy::data::{copy_chunk, next_data};
use crate::store::copy::error::write_error;
use crate::store::copy::metadata::{Node, file_type, identity, set_mode, stat_fd, stat_mask};
use crate::store::error::{Result, StoreError, io_error};

/// The previous replica, whose files the builder takes instead of fetching them.
pub struct Base<'a> {
    root: BorrowedFd<'a>,
    /// The path of one file per content, by its SHA-256.
    by_hash: HashMap<String, Vec<u8>>,
}

impl<'a> Base<'a> {
    /// The replica under `root` and its manifest (the entries it was built from). Keeps
    /// one path per distinct content in memory.
    pub fn new<'m>(
        root: BorrowedFd<'a>,
        manifest: impl IntoIterator<Item = &'m ManifestEntry>,
    ) -> Self {
        let mut by_hash = HashMap::new();
        for entry in manifest {
            if let (EntryKind::File, Some(sha256), None) = (entry.kind, &entry.sha256, &entry.link)
            {
                by_hash
                    .entry(sha256.clone())
                    .or_insert_with(|| entry.path.0.clone());
            }
        }
        Self { root, by_hash }
    }
}

/// What a build did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct BuildStats {
    /// Below the root.
    pub directories: u64,
    /// Regular files, each inode once, however they were got.
    pub files: u64,
    /// Files whose content was asked of `fetch`, and their sizes (holes included).
    pub fetched_files: u64,
    pub fetched_bytes: u64,
    /// Files taken from the base, and their sizes (holes included).
    pub base_files: u64,
    pub base_bytes: u64,
    /// Of those, the ones shared with `FICLONE` rather than copied.
    pub reflinked_files: u64,
    /// Files an earlier build on this staging directory had completed, kept.
    pub kept_files: u64,
    pub symlinks: u64,
    /// Fifos, sockets and devices.
    pub others: u64,
    pub hard_links: u64,
}

/// Asks for the content of a regular file (the entry), to be written into the open,
/// empty file given; [`super::receive_extents`] is made for it.
pub type Fetch<'f> = dyn FnMut(&ManifestEntry, &File) -> Result<()> + 'f;

/// A directory made, open, whose metadata comes when the walk leaves it.
struct Open {
    fd: OwnedFd,
    entry: ManifestEntry,
}

/// Builds in `staging` (an empty directory, or one an earlier build of the same manifest
/// left unfinished) the tree `manifest` describes: see the module's documentation.
/// `base`, the previous replica, gives the files whose content it already has.
pub fn build(
    staging: BorrowedFd<'_>,
    manifest: impl IntoIterator<Item = Result<ManifestEntry>>,
    base: Option<&Base<'_>>,
    fetch: &mut Fetch<'_>,
) -> Result<BuildStats> {
    let mut builder = Builder {
        staging,
        base,
        fetch,
        stats: BuildStats::default(),
    };
    let mut validator = ManifestValidator::new();
    let mut open: Vec<Open> = Vec::new();
    let mut root_seen = false;
    for entry in manifest {
        let entry = entry?;
        validator.check(&entry).map_err(invalid)?;
        let path = entry.path.as_bytes();
        if path.is_empty() {
            root_seen = true;
            let fd = rustix::fs::openat(
                staging,
                c".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| io_error("open the staging directory", e))?;
            open.push(Open { fd, entry });
            continue;
        }
        let (parent, name) = split_path(path);
        // The validator checked the parent is one of the directories still open.
        while open
            .last()
            .is_some_and(|dir| dir.entry.path.as_bytes() != parent)
        {
            let done = open.pop().expect("a directory is open");
            finish_directory(&done)?;
        }
        let dir = open.last().expect("the parent is open");
        let name = CString::new(name).map_err(|_| invalid_path(path))?;
        if let Some(made) = builder.entry(dir.fd.as_fd(), &name, entry)? {
            open.push(made);
        }
    }
    if !root_seen {
        return Err(invalid(ManifestError::NoRoot));
    }
    while let Some(done) = open.pop() {
        finish_directory(&done)?;
    }
    // Symlinks and special files cannot be opened to be synced one by one.
    rustix::fs::syncfs(staging).map_err(|e| io_error("sync the staging directory", e))?;
    Ok(builder.stats)
}

fn invalid(e: ManifestError) -> StoreError {
    StoreError::Invalid(e.to_string())
}

fn invalid_path(path: &[u8]) -> StoreError {
    StoreError::Invalid(format!("manifest entry {}: invalid path", shown(path)))
}

struct Builder<'s, 'b, 'f> {
    staging: BorrowedFd<'s>,
    base: Option<&'b Base<'b>>,
    fetch: &'b mut Fetch<'f>,
    stats: BuildStats,
}

impl Builder<'_, '_, '_> {
    /// Makes one entry (not the root) named `name` in `dir`; a directory is answered open.
    fn entry(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        entry: ManifestEntry,
    ) -> Result<Option<Open>> {
        let path = entry.path.as_bytes();
        if entry.link.is_some() {
            self.hard_link(dir, name, &entry)?;
            return Ok(None);
        }
        match entry.kind {
            EntryKind::Directory => {
                match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(0o700)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(write_error("create", &shown(path), e)),
                }
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| match e {
                    Errno::LOOP | Errno::NOTDIR => StoreError::Unsafe(format!(
                        "the staging directory holds something other than a directory at {}",
                        shown(path)
                    )),
                    e => io_error(format!("open {}", shown(path)), e),
                })?;
                self.stats.directories += 1;
                return Ok(Some(Open { fd, entry }));
            }
            EntryKind::File => self.file(dir, name, &entry)?,
            EntryKind::Symlink => {
                let target = entry
                    .target
                    .as_ref()
                    .expect("validated: a symlink has a target");
                let target = CString::new(target.as_bytes()).map_err(|_| invalid_path(path))?;
                self.make_node(
                    dir,
                    name,
                    path,
                    FileType::Symlink,
                    |dir, name| rustix::fs::symlinkat(&target, dir, name),
                    |stat, dir, name| {
                        Ok(file_type(stat) == FileType::Symlink
                            && rustix::fs::readlinkat(dir, name, Vec::new())? == target)
                    },
                )?;
                set_metadata(&Node::At(dir, name), &entry)?;
                self.stats.symlinks += 1;
            }
            kind => {
                let (kind, rdev) = match kind {
                    EntryKind::Fifo => (FileType::Fifo, 0),
                    EntryKind::Socket => (FileType::Socket, 0),
                    EntryKind::CharDevice => (FileType::CharacterDevice, entry.rdev.unwrap_or(0)),
                    _ => (FileType::BlockDevice, entry.rdev.unwrap_or(0)),
                };
                let mode = Mode::from_raw_mode(entry.mode & 0o777);
                self.make_node(
                    dir,
                    name,
                    path,
                    kind,
                    |dir, name| rustix::fs::mknodat(dir, name, kind, mode, rdev),
                    |stat, _, _| {
                        Ok(file_type(stat) == kind
                            && rustix::fs::makedev(stat.stx_rdev_major, stat.stx_rdev_minor)
                                == rdev)
                    },
                )?;
                set_metadata(&Node::At(dir, name), &entry)?;
                self.stats.others += 1;
            }
        }
        Ok(None)
    }

    /// Makes a symlink or special file with `make`; one already there (from an earlier
    /// build) is kept when `same` says it is what the entry describes, else replaced.
    fn make_node(
        &mut self,
        dir: BorrowedFd<'_>,
        name: &CStr,
        path: &[u8],
        kind: FileType,
        make: impl Fn(BorrowedFd<'_>, &CStr) -> rustix::io::Result<()>,
        same: impl Fn(&rustix::fs::Statx, BorrowedFd<'_>, &CStr) -> rustix::io::Result<bool>,
    ) -> Result<()> {
        match make(dir, name) {
            Ok(()) => return Ok(()),
            Err(Errno::EXIST) => {}
            Err(Errno::PERM)
                if matches!(kind, FileType::CharacterDevice | FileType::BlockDevice) =>
            {
                return Err(StoreError::Unsupported(format!(
                    "{} is a device node, which the agent is not allowed to make (it needs CAP_MKNOD)",
                    shown(path)
                )));
            }
            Err(e) => return Err(write_error("create", &shown(path), e)),
        }
        let there = stat_at(dir, name, path)?;
        if same(&there, dir, name).map_err(|e| io_error(format!("read {}", shown(path)), e))? {
            return Ok(());
        }
        remove_non_directory(dir, name, &there, path)?;
        make(dir, name).map_err(|e| write_error("create", &shown(path), e))
    }

    fn hard_link(&mut self, dir: BorrowedFd<'_>, name: &CStr, entry: &ManifestEntry) -> Result<()> {
        let path = entry.path.as_bytes();
        let first = entry.link.as_ref().expect("a link").as_bytes();
        let (first_dir, first_name) = open_parent(self.staging, first)?;
        let first_stat = stat_at(first_dir.as_fd(), &first_name, first)?;
        match rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()) {
            Ok(there) if identity(&there) == identity(&first_stat) => {
                self.stats.hard_links += 1;
                return Ok(());
            }
            Ok(there) => remove_non_directory(dir, name, &there, path)?,
            Err(Errno::NOENT) => {}
            Err(e) => return Err(io_error(format!("stat {}", shown(path)), e)),
        }
        rustix::fs::linkat(&first_dir, &first_name, dir, name, AtFlags::empty())
            .map_err(|e| write_error("link", &shown(path), e))?;
        self.stats.hard_links += 1;
        Ok(())
    }

    fn file(&mut self, dir: BorrowedFd<'_>, name: &CStr, entry: &ManifestEntry) -> Result<()> {
        let path = entry.path.as_bytes();
        let sha256 = entry
            .sha256
            .as_deref()
            .expect("validated: a file has a hash");
        self.stats.files += 1;
        if let Some(kept) = complete_file(dir, name, entry, sha256)? {
            // Its metadata again: an earlier build of another manifest may have left it.
            set_metadata(&Node::Fd(kept.as_fd()), entry)?;
            rustix::fs::fsync(&kept).map_err(|e| io_error(format!("sync {}", shown(path)), e))?;
            self.stats.kept_files += 1;
            return Ok(());
        }
        // Unnamed until complete: a build cut short leaves no partial file under a name.
        let fd = rustix::fs::openat(dir, c".", OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC, PRIVATE)
            .map_err(|e| match e {
                Errno::OPNOTSUPP | Errno::ISDIR => StoreError::Unsupported(format!(
                    "the filesystem of the staging directory cannot make unnamed files (O_TMPFILE), which a replica is built with; at {}",
                    shown(path)
                )),
                e => write_error("create", &shown(path), e),
            })?;
        let file = File::from(fd);
        if !self.take_from_base(&file, entry, sha256)? {
            (self.fetch)(entry, &file)?;
            check_content(&file, entry, sha256)?;
            self.stats.fetched_files += 1;
            self.stats.fetched_bytes += entry.size;
        }
        set_metadata(&Node::Fd(file.as_fd()), entry)?;
        rustix::fs::fsync(&file).map_err(|e| io_error(format!("sync {}", shown(path)), e))?;
        // Named only now, complete: the name is the mark of a finished file.
        let proc_path = format!("/proc/self/fd/{}", file.as_raw_fd());
        rustix::fs::linkat(
            rustix::fs::CWD,
            proc_path.as_str(),
            dir,
            name,
            AtFlags::SYMLINK_FOLLOW,
        )
        .map_err(|e| write_error("name", &shown(path), e))
    }

    /// Fills `file` with the base's copy of the content, checked; `false` when the base
    /// has none (or its copy is not what it should be: then `file` is emptied again).
    fn take_from_base(&mut self, file: &File, entry: &ManifestEntry, sha256: &str) -> Result<bool> {
        let Some(base) = self.base else {
            return Ok(false);
        };
        let Some(base_path) = base.by_hash.get(sha256) else {
            return Ok(false);
        };
        let shown_base = shown(base_path);
        let (dir, name) = match open_parent(base.root, base_path) {
            Ok(found) => found,
            Err(e) => {
                tracing::debug!(file = %shown_base, error = %e, "the base's copy is unreachable; fetching");
                return Ok(false);
            }
        };
        let source = match open_file_at(dir.as_fd(), &name) {
            Ok(fd) => fd,
            Err(e) => {
                tracing::debug!(file = %shown_base, error = %std::io::Error::from(e), "the base's copy cannot be opened; fetching");
                return Ok(false);
            }
        };
        let stat =
            stat_fd(source.as_fd()).map_err(|e| io_error(format!("stat {shown_base}"), e))?;
        if file_type(&stat) != FileType::RegularFile || stat.stx_size != entry.size {
            return Ok(false);
        }
        let reflinked = copy_content(
            source.as_fd(),
            file.as_fd(),
            entry.size,
            &shown(entry.path.as_bytes()),
        )?;
        match check_content(file, entry, sha256) {
            Ok(()) => {}
            Err(StoreError::Conflict(message)) => {
                tracing::debug!(file = %shown_base, %message, "the base's copy changed; fetching");
                rustix::fs::ftruncate(file, 0)
                    .map_err(|e| write_error("write", &shown(entry.path.as_bytes()), e))?;
                return Ok(false);
            }
            Err(e) => return Err(e),
        }
        self.stats.base_files += 1;
        self.stats.base_bytes += entry.size;
        if reflinked {
            self.stats.reflinked_files += 1;
        }
        Ok(true)
    }
}

/// The file already under `name` (from an earlier build) when it is complete: a regular
/// file of the entry's size and hash. Anything else there is removed.
fn complete_file(
    dir: BorrowedFd<'_>,
    name: &CStr,
    entry: &ManifestEntry,
    sha256: &str,
) -> Result<Option<OwnedFd>> {
    let path = entry.path.as_bytes();
    let there = match rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()) {
        Ok(there) => there,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io_error(format!("stat {}", shown(path)), e)),
    };
    if file_type(&there) == FileType::RegularFile && there.stx_size == entry.size {
        let fd =
            open_file_at(dir, name).map_err(|e| io_error(format!("open {}", shown(path)), e))?;
        let stat = stat_fd(fd.as_fd()).map_err(|e| io_error(format!("stat {}", shown(path)), e))?;
        if identity(&stat) == identity(&there) && hash_file(fd.as_fd(), entry.size, path)? == sha256
        {
            return Ok(Some(fd));
        }
    }
    remove_non_directory(dir, name, &there, path)?;
    Ok(None)
}

fn check_content(file: &File, entry: &ManifestEntry, sha256: &str) -> Result<()> {
    let path = entry.path.as_bytes();
    let size = stat_fd(file.as_fd())
        .map_err(|e| io_error(format!("stat {}", shown(path)), e))?
        .stx_size;
    if size != entry.size {
        return Err(StoreError::Conflict(format!(
            "{}: {size} bytes received where the manifest says {}",
            shown(path),
            entry.size
        )));
    }
    let got = hash_file(file.as_fd(), size, path)?;
    if got != sha256 {
        return Err(StoreError::Conflict(format!(
            "{}: the content received does not match the manifest's SHA-256",
            shown(path)
        )));
    }
    Ok(())
}

/// Gives `target` the first `size` bytes of `source`: shared with `FICLONE` where the
/// filesystem can (answers `true`), else copied extent by extent so holes stay holes.
fn copy_content(
    source: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    size: u64,
    rel: &str,
) -> Result<bool> {
    match rustix::fs::ioctl_ficlone(target, source) {
        Ok(()) => return Ok(true),
        Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::XDEV | Errno::NOTTY | Errno::BADF) => {}
        Err(e) => return Err(write_error("clone", rel, e)),
    }
    let mut buffer = Vec::new();
    let mut plain = false;
    let mut offset = 0;
    while let Some((start, stop)) = next_data(source, offset, size)
        .map_err(|e| io_error(format!("read the base's copy of {rel}"), e))?
    {
        let mut position = start;
        while position < stop {
            let len = (stop - position).min(BLOCK as u64) as usize;
            let done = copy_chunk(source, target, position, len, &mut plain, &mut buffer, rel)?;
            if done == 0 {
                // Shorter than it was: the hash check that follows refuses it.
                break;
            }
            position += done as u64;
        }
        offset = stop;
    }
    rustix::fs::ftruncate(target, size).map_err(|e| write_error("write", rel, e))?;
    Ok(false)
}

fn stat_at(dir: BorrowedFd<'_>, name: &CStr, path: &[u8]) -> Result<rustix::fs::Statx> {
    rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
        .map_err(|e| io_error(format!("stat {}", shown(path)), e))
}

/// Removes what an earlier build left under a name the manifest now gives to something
/// else; a directory there is refused rather than emptied.
fn remove_non_directory(
    dir: BorrowedFd<'_>,
    name: &CStr,
    there: &rustix::fs::Statx,
    path: &[u8],
) -> Result<()> {
    if file_type(there) == FileType::Directory {
        return Err(StoreError::Conflict(format!(
            "the staging directory holds a directory at {}, where the manifest has none; start from an empty staging directory",
            shown(path)
        )));
    }
    rustix::fs::unlinkat(dir, name, AtFlags::empty())
        .map_err(|e| write_error("remove the earlier", &shown(path), e))
}

/// Leaves a directory: its metadata, now that its entries are all made, then a sync.
fn finish_directory(done: &Open) -> Result<()> {
    set_metadata(&Node::Fd(done.fd.as_fd()), &done.entry)?;
    rustix::fs::fsync(&done.fd)
        .map_err(|e| io_error(format!("sync {}", shown(done.entry.path.as_bytes())), e))
}

/// Gives an entry made in the staging tree the manifest's metadata, in the copy's order:
/// owner (which clears set-ID bits and file capabilities), attributes, mode (after the
/// attributes, since an ACL rewrites the group bits), times (last, since the rest
/// changes them). The data is already written.
fn set_metadata(node: &Node<'_>, entry: &ManifestEntry) -> Result<()> {
    let rel = shown(entry.path.as_bytes());
    let symlink = entry.kind == EntryKind::Symlink;
    node.chown_ids(entry.uid, entry.gid)
        .map_err(|e| write_error("set the owner of", &rel, e))?;
    for xattr in &entry.xattrs {
        let name = CString::new(xattr.name.as_bytes())
            .map_err(|_| StoreError::Invalid(format!("{rel}: an attribute name with a NUL")))?;
        match node.set_xattr(&name, xattr.value.as_bytes()) {
            Ok(()) => {}
            // Linux allows no user.* attributes on symlinks.
            Err(Errno::PERM | Errno::OPNOTSUPP)
                if symlink && xattr.name.as_bytes().starts_with(b"user.") => {}
            Err(Errno::OPNOTSUPP) => {
                return Err(StoreError::Unsupported(format!(
                    "{rel} has the extended attribute {}, which the replica's filesystem cannot store",
                    xattr.name.shown()
                )));
            }
            Err(e) => {
                return Err(write_error(
                    &format!("set the extended attribute {} of", xattr.name.shown()),
                    &rel,
                    e,
                ));
            }
        }
    }
    if !symlink {
        set_mode(node, entry.mode, &rel)?;
    }
    let times = Timestamps {
        last_access: match entry.atime_ns {
            Some(ns) => from_ns(ns),
            None => rustix::fs::Timespec {
                tv_sec: 0,
                tv_nsec: rustix::fs::UTIME_OMIT,
            },
        },
        last_modification: from_ns(entry.mtime_ns),
    };
    node.set_times(&times)
        .map_err(|e| write_error("set the times of", &rel, e))
}
