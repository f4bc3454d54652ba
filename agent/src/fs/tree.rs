//! Whole-tree walks of a volume: removal and usage. Both reach every entry relative to its
//! directory with `O_NOFOLLOW`, so a symlink is unlinked or counted, never followed; both
//! stay on the volume's own mount, so a filesystem or bind mount inside a volume is never
//! entered; and neither recurses, so a tenant's arbitrarily deep tree costs neither stack
//! nor a descriptor per level.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use nfsprov_api_types::VolumeUsage;
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, StatxFlags};
use rustix::io::Errno;

use super::confine::is_dot;
use super::error::{Result, StoreError, io_error};

/// Deepest level below a volume's root that a usage walk descends to. Every open level
/// keeps one descriptor while its subdirectories wait, so this bounds both.
pub const MAX_USAGE_DEPTH: usize = 512;

/// Which mount an entry is on: the mount id where the kernel reports it (Linux 5.8 and
/// later; it tells a bind mount of the same filesystem apart), else the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum MountId {
    Mount(u64),
    Device(u32, u32),
}

impl MountId {
    pub(super) fn of(stat: &rustix::fs::Statx) -> Self {
        if stat.stx_mask & StatxFlags::MNT_ID.bits() != 0 {
            MountId::Mount(stat.stx_mnt_id)
        } else {
            MountId::Device(stat.stx_dev_major, stat.stx_dev_minor)
        }
    }
}

fn statx_fd(dir: BorrowedFd<'_>) -> rustix::io::Result<rustix::fs::Statx> {
    rustix::fs::statx(
        dir,
        c"",
        AtFlags::EMPTY_PATH,
        StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
    )
}

/// Why a removal stopped.
enum Stop {
    Io(Errno),
    /// A mount point (named relative to the directory being emptied) was met.
    MountPoint(String),
}

impl From<Errno> for Stop {
    fn from(errno: Errno) -> Self {
        Stop::Io(errno)
    }
}

type Removal = std::result::Result<(), Stop>;

/// Removes `name` in `parent` and everything below it. Entries are opened relative to
/// their directory with `O_NOFOLLOW`, so a symlink is unlinked, never followed. The
/// subdirectories of the top directory are removed by several threads at once: unlinks
/// in different directories do not contend, and a big tree goes markedly faster.
///
/// Below that, each directory is emptied by moving its subdirectories' subdirectories up
/// into it and removing everything else, until nothing is left: any depth is removed
/// with two descriptors per thread. A mount point stops the removal before anything
/// behind it is touched.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &str) -> Result<()> {
    let c_name =
        CString::new(name).map_err(|_| StoreError::Unsafe(format!("{name:?} contains NUL")))?;
    remove_top(parent, &c_name).map_err(|stop| match stop {
        Stop::Io(e) => io_error(format!("remove {name}"), e),
        Stop::MountPoint(at) => StoreError::Conflict(format!(
            "{name} holds a mount point ({at}); the agent never removes anything across a mount point and left what is behind it untouched; unmount it and retry"
        )),
    })
}

fn remove_top(parent: BorrowedFd<'_>, name: &CStr) -> Removal {
    let Some(top) = open_or_unlink(parent, name)? else {
        return Ok(());
    };
    let mut subdirectories = Vec::new();
    for (child, kind) in read_children(top.as_fd())? {
        if !unlink_unless_directory(top.as_fd(), &child, kind)? {
            subdirectories.push(child);
        }
    }
    // Most volumes are flat or empty when they go: the mount is looked up only when
    // there is something to descend into.
    let mount = if subdirectories.is_empty() {
        None
    } else {
        let mount = MountId::of(&statx_fd(top.as_fd())?);
        remove_in_parallel(top.as_fd(), subdirectories, mount)?;
        Some(mount)
    };
    loop {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) => return Err(Stop::MountPoint(name.to_string_lossy().into_owned())),
            // Refilled meanwhile (a client still writing through an open handle).
            Err(Errno::NOTEMPTY) => {
                let mount = match mount {
                    Some(mount) => mount,
                    None => MountId::of(&statx_fd(top.as_fd())?),
                };
                empty_directory(top.as_fd(), mount)?;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// Opens `name` in `parent` as a directory; when it is not one, unlinks it instead.
fn open_or_unlink(
    parent: BorrowedFd<'_>,
    name: &CStr,
) -> std::result::Result<Option<OwnedFd>, Stop> {
    match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => return Ok(None),
        // A directory: handled below.
        Err(Errno::ISDIR) | Err(Errno::PERM) => {}
        Err(e) => return Err(e.into()),
    }
    match rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => Ok(Some(dir)),
        Err(Errno::NOENT) => Ok(None),
        // Replaced by a non-directory since: unlink that.
        Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
            match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
                Ok(()) | Err(Errno::NOENT) => Ok(None),
                Err(e) => Err(e.into()),
            }
        }
        Err(e) => Err(e.into()),
    }
}

/// Unlinks `name` unless it is a directory; answers whether it is gone.
fn unlink_unless_directory(
    dir: BorrowedFd<'_>,
    name: &CStr,
    kind: FileType,
) -> std::result::Result<bool, Stop> {
    if kind == FileType::Directory {
        return Ok(false);
    }
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(true),
        // The type was unknown or changed: a directory after all.
        Err(Errno::ISDIR) | Err(Errno::PERM) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Removes an empty directory; one refilled meanwhile is left for the next pass.
fn remove_empty(parent: BorrowedFd<'_>, name: &CStr) -> Removal {
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::BUSY) => Err(Stop::MountPoint(name.to_string_lossy().into_owned())),
        Err(e) => Err(e.into()),
    }
}

fn remove_in_parallel(
    dir: BorrowedFd<'_>,
    subdirectories: Vec<CString>,
    mount: MountId,
) -> Removal {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(subdirectories.len());
    let queue = std::sync::Mutex::new(subdirectories.into_iter());
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    while let Some(child) = next() {
                        remove_subdirectory(dir, &child, mount)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(Stop::Io(Errno::IO))))
    })
}

fn remove_subdirectory(parent: BorrowedFd<'_>, name: &CStr, mount: MountId) -> Removal {
    let Some(dir) = open_or_unlink(parent, name)? else {
        return Ok(());
    };
    if MountId::of(&statx_fd(dir.as_fd())?) != mount {
        return Err(Stop::MountPoint(name.to_string_lossy().into_owned()));
    }
    empty_directory(dir.as_fd(), mount)?;
    drop(dir);
    remove_empty(parent, name)
}

/// Empties `top` without recursion: each pass removes its files and, for each
/// subdirectory, moves that subdirectory's own subdirectories up into `top`, removes
/// the rest of it and then the subdirectory itself. Each pass takes one level off every
/// branch, with no more than one descriptor besides `top`.
fn empty_directory(top: BorrowedFd<'_>, mount: MountId) -> Removal {
    loop {
        let children = read_children(top)?;
        if children.is_empty() {
            return Ok(());
        }
        for (child, kind) in children {
            if !unlink_unless_directory(top, &child, kind)? {
                flatten(top, &child, mount)?;
            }
        }
    }
}

fn flatten(top: BorrowedFd<'_>, child: &CStr, mount: MountId) -> Removal {
    let Some(dir) = open_or_unlink(top, child)? else {
        return Ok(());
    };
    if MountId::of(&statx_fd(dir.as_fd())?) != mount {
        return Err(Stop::MountPoint(child.to_string_lossy().into_owned()));
    }
    for (entry, kind) in read_children(dir.as_fd())? {
        if !unlink_unless_directory(dir.as_fd(), &entry, kind)? {
            hoist(dir.as_fd(), &entry, top)?;
        }
    }
    drop(dir);
    remove_empty(top, child)
}

/// Names given to directories moved up during a removal; they start with a dot, and a
/// name already taken is simply skipped.
static HOISTED: AtomicU64 = AtomicU64::new(0);

fn hoist(from: BorrowedFd<'_>, name: &CStr, to: BorrowedFd<'_>) -> Removal {
    loop {
        let n = HOISTED.fetch_add(1, Ordering::Relaxed);
        let target = format!(".nfsprov-hoisted-{}-{n}", std::process::id());
        match rustix::fs::renameat_with(from, name, to, target.as_str(), RenameFlags::NOREPLACE) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::EXIST) => continue,
            // A mount point cannot be moved.
            Err(Errno::BUSY) => return Err(Stop::MountPoint(name.to_string_lossy().into_owned())),
            Err(e) => return Err(e.into()),
        }
    }
}

/// The entries of a directory (without `.` and `..`), read completely before any is
/// removed: unlinking while iterating can make getdents skip entries.
fn read_children(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<(CString, FileType)>> {
    let mut children = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        if !is_dot(entry.file_name()) {
            children.push((entry.file_name().to_owned(), entry.file_type()));
        }
    }
    Ok(children)
}

/// What a usage walk counted, and what it left out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TreeUsage {
    pub usage: VolumeUsage,
    /// Mount points met (other filesystems or bind mounts), not entered.
    pub mount_points: u64,
    /// Directories deeper than [`MAX_USAGE_DEPTH`], not entered.
    pub too_deep: u64,
}

/// Walks the tree below `dir` (which counts too) the way `du -x` counts: the allocated
/// blocks of every entry, hard-linked files once, without following symlinks and without
/// entering another mount.
pub fn measure_tree(dir: BorrowedFd<'_>) -> rustix::io::Result<TreeUsage> {
    let top = statx_fd(dir)?;
    let mount = MountId::of(&top);
    let mut walk = TreeUsage {
        usage: VolumeUsage {
            used_bytes: allocated(&top),
            used_inodes: 1,
        },
        mount_points: 0,
        too_deep: 0,
    };
    let mut linked = HashSet::new();
    // Directories still to read, each with the open directory it is in and its depth; a
    // directory's descriptor stays open only while entries below it wait, so at most one
    // per level, and levels are bounded.
    let mut pending: Vec<(Arc<OwnedFd>, CString, usize)> = Vec::new();
    let first = Arc::new(dir.try_clone_to_owned().map_err(|_| Errno::BADF)?);
    let mut current = Some((first, 0usize));
    loop {
        if let Some((directory, depth)) = current.take() {
            for entry in rustix::fs::Dir::read_from(directory.as_fd())? {
                let entry = entry?;
                let name = entry.file_name();
                if is_dot(name) {
                    continue;
                }
                let stat = match rustix::fs::statx(
                    directory.as_fd(),
                    name,
                    AtFlags::SYMLINK_NOFOLLOW,
                    StatxFlags::BASIC_STATS | StatxFlags::MNT_ID,
                ) {
                    Ok(stat) => stat,
                    // Removed while we walked: it no longer uses anything.
                    Err(Errno::NOENT) => continue,
                    Err(e) => return Err(e),
                };
                let is_dir = FileType::from_raw_mode(stat.stx_mode.into()) == FileType::Directory;
                let identity = (stat.stx_dev_major, stat.stx_dev_minor, stat.stx_ino);
                if !is_dir && stat.stx_nlink > 1 && !linked.insert(identity) {
                    continue;
                }
                walk.usage.used_bytes = walk.usage.used_bytes.saturating_add(allocated(&stat));
                walk.usage.used_inodes += 1;
                if !is_dir {
                    continue;
                }
                if MountId::of(&stat) != mount {
                    walk.mount_points += 1;
                } else if depth + 1 > MAX_USAGE_DEPTH {
                    walk.too_deep += 1;
                } else {
                    pending.push((directory.clone(), name.to_owned(), depth + 1));
                }
            }
        }
        let Some((parent, name, depth)) = pending.pop() else {
            break;
        };
        match rustix::fs::openat(
            parent.as_fd(),
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => current = Some((Arc::new(fd), depth)),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(walk)
}

fn allocated(stat: &rustix::fs::Statx) -> u64 {
    stat.stx_blocks.saturating_mul(512)
}
