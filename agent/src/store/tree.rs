//! Whole-tree walks of a volume: removal and usage. Both reach every entry relative to its
//! directory with `O_NOFOLLOW`, so a symlink is unlinked or counted, never followed; both
//! stay on the volume's own mount, so a filesystem or bind mount inside a volume is never
//! entered; and neither recurses.
//!
//! What a tenant stores never sets how much memory a walk takes. Neither ever holds a
//! directory's whole listing: a removal reads names a batch of [`BATCH`] at a time and
//! removes (or moves away) each batch before reading the next, and the usage walk reads
//! one entry at a time from a stream per open level. Hard-linked files are not
//! remembered either (see [`measure_tree`]). So a removal holds a few batches and two
//! descriptors per thread, and a usage walk one directory stream (a descriptor and a
//! small buffer) per level, at most [`MAX_USAGE_DEPTH`] of them, whatever the number of
//! entries.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nfsprov_api_types::VolumeUsage;
use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, RenameFlags, StatxFlags};
use rustix::io::Errno;

use super::confine::is_dot;
use super::error::{Result, StoreError, io_error};

/// Deepest level below a volume's root that a usage walk descends to. Every open level
/// keeps one directory stream, so this bounds the walk's descriptors and memory.
pub const MAX_USAGE_DEPTH: usize = 512;

/// Most names a removal reads from a directory before acting on them: about 270 KiB of
/// names at most, per directory being emptied.
const BATCH: usize = 1024;

/// Which mount an entry is on: the mount id where the kernel reports it (Linux 5.8 and
/// later; it tells a bind mount of the same filesystem apart), else the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MountId {
    Mount(u64),
    Device(u32, u32),
}

impl MountId {
    pub(crate) fn of(stat: &rustix::fs::Statx) -> Self {
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
    // Most volumes are flat or empty when they go: the mount is looked up only when
    // there is something to descend into.
    let mut mount = None;
    loop {
        drain(top.as_fd(), |batch| {
            let mut subdirectories = Vec::new();
            for (child, kind) in batch.drain(..) {
                if !unlink_unless_directory(top.as_fd(), &child, kind)? {
                    subdirectories.push(child);
                }
            }
            if subdirectories.is_empty() {
                return Ok(());
            }
            let mount = match mount {
                Some(mount) => mount,
                None => *mount.insert(MountId::of(&statx_fd(top.as_fd())?)),
            };
            remove_in_parallel(top.as_fd(), subdirectories, mount)
        })?;
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) => return Err(Stop::MountPoint(name.to_string_lossy().into_owned())),
            // Refilled meanwhile (a client still writing through an open handle).
            Err(Errno::NOTEMPTY) => continue,
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

/// Removes an empty directory; one refilled meanwhile is emptied again.
fn remove_empty(parent: BorrowedFd<'_>, name: &CStr, mount: MountId) -> Removal {
    loop {
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            Err(Errno::BUSY) => return Err(Stop::MountPoint(name.to_string_lossy().into_owned())),
            Err(Errno::NOTEMPTY) => {
                let Some(dir) = open_or_unlink(parent, name)? else {
                    return Ok(());
                };
                empty_directory(dir.as_fd(), mount)?;
            }
            Err(e) => return Err(e.into()),
        }
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
    remove_empty(parent, name, mount)
}

/// Empties `top` without recursion: it removes its files and, for each subdirectory,
/// moves that subdirectory's own subdirectories up into `top`, removes the rest of it and
/// then the subdirectory itself, until a pass finds `top` empty. Each pass takes one
/// level off every branch, with no more than one descriptor besides `top`'s.
fn empty_directory(top: BorrowedFd<'_>, mount: MountId) -> Removal {
    drain(top, |batch| {
        for (child, kind) in batch.drain(..) {
            if !unlink_unless_directory(top, &child, kind)? {
                flatten(top, &child, mount)?;
            }
        }
        Ok(())
    })
}

fn flatten(top: BorrowedFd<'_>, child: &CStr, mount: MountId) -> Removal {
    let Some(dir) = open_or_unlink(top, child)? else {
        return Ok(());
    };
    if MountId::of(&statx_fd(dir.as_fd())?) != mount {
        return Err(Stop::MountPoint(child.to_string_lossy().into_owned()));
    }
    drain(dir.as_fd(), |batch| {
        for (entry, kind) in batch.drain(..) {
            if !unlink_unless_directory(dir.as_fd(), &entry, kind)? {
                hoist(dir.as_fd(), &entry, top)?;
            }
        }
        Ok(())
    })?;
    drop(dir);
    remove_empty(top, child, mount)
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

/// Hands the entries of `dir` (without `.` and `..`) to `act` a batch of at most
/// [`BATCH`] at a time, until a whole pass over the directory finds none; `act` must
/// take every entry of its batch out of `dir` (or fail). Removing entries while the
/// listing goes on can make it skip some (getdents gives no promise there): the next
/// pass, from the start, finds them, and only a pass that finds nothing ends.
fn drain(
    dir: BorrowedFd<'_>,
    mut act: impl FnMut(&mut Vec<(CString, FileType)>) -> Removal,
) -> Removal {
    let mut stream = Dir::read_from(dir)?;
    let mut batch = Vec::with_capacity(BATCH);
    loop {
        let mut found = false;
        let mut ended = false;
        while !ended {
            while batch.len() < BATCH {
                let Some(entry) = stream.read() else {
                    ended = true;
                    break;
                };
                let entry = entry?;
                if !is_dot(entry.file_name()) {
                    batch.push((entry.file_name().to_owned(), entry.file_type()));
                }
            }
            if !batch.is_empty() {
                found = true;
                act(&mut batch)?;
                batch.clear();
            }
        }
        if !found {
            return Ok(());
        }
        stream.rewind();
    }
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
///
/// A file with several names is counted as a share per name (its blocks and its one
/// inode divided by its link count), rather than by remembering which files were seen,
/// which would take memory for every such file a tenant makes. The shares of all its
/// names add up to the file once, exactly what `du` counts, as long as its names all lie
/// inside the volume (a tenant cannot link across volumes: each is its own export);
/// a file also linked from outside counts only for the names inside.
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
    // Shares of hard-linked files, summed apart and rounded once at the end.
    let (mut shared_bytes, mut shared_inodes) = (0f64, 0f64);
    // One stream per level from the root to the directory being read: a subdirectory is
    // entered as soon as it is met, so nothing waits in memory but these streams.
    let mut levels = vec![Dir::read_from(dir)?];
    loop {
        // What a subdirectory met now would be: its level below the root.
        let depth = levels.len();
        let Some(directory) = levels.last_mut() else {
            break;
        };
        let Some(entry) = directory.read() else {
            levels.pop();
            continue;
        };
        let entry = entry?;
        let name = entry.file_name();
        if is_dot(name) {
            continue;
        }
        let directory_fd = directory.fd()?;
        let stat = match rustix::fs::statx(
            directory_fd,
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
        if !is_dir && stat.stx_nlink > 1 {
            let names = f64::from(stat.stx_nlink);
            shared_bytes += allocated(&stat) as f64 / names;
            shared_inodes += 1.0 / names;
            continue;
        }
        walk.usage.used_bytes = walk.usage.used_bytes.saturating_add(allocated(&stat));
        walk.usage.used_inodes += 1;
        if !is_dir {
            continue;
        }
        if MountId::of(&stat) != mount {
            walk.mount_points += 1;
            continue;
        }
        if depth > MAX_USAGE_DEPTH {
            walk.too_deep += 1;
            continue;
        }
        match rustix::fs::openat(
            directory_fd,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => levels.push(Dir::new(fd)?),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => {}
            Err(e) => return Err(e),
        }
    }
    walk.usage.used_bytes = walk
        .usage
        .used_bytes
        .saturating_add(shared_bytes.round() as u64);
    walk.usage.used_inodes = walk
        .usage
        .used_inodes
        .saturating_add(shared_inodes.round() as u64);
    Ok(walk)
}

fn allocated(stat: &rustix::fs::Statx) -> u64 {
    stat.stx_blocks.saturating_mul(512)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::MetadataExt;

    fn open(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap()
    }

    /// More entries than a batch in one directory, in a subdirectory and deep down: all
    /// of it goes, read a batch at a time.
    #[test]
    fn a_removal_takes_directories_larger_than_a_batch() {
        let tmp = tempfile::tempdir().unwrap();
        let volume = tmp.path().join("volume");
        let deep = volume.join("a/b/c/d");
        fs::create_dir_all(&deep).unwrap();
        for n in 0..BATCH * 2 + 7 {
            fs::write(volume.join(format!("file-{n}")), b"x").unwrap();
            fs::create_dir(volume.join("a").join(format!("dir-{n}"))).unwrap();
            fs::write(deep.join(format!("deep-{n}")), b"y").unwrap();
        }
        remove_tree(open(tmp.path()).as_fd(), "volume").unwrap();
        assert!(!volume.exists());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
    }

    /// A file's names share its blocks and its inode: together they count once, as `du`
    /// counts them, wherever in the tree they are.
    #[test]
    fn hard_linked_files_count_once() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        fs::create_dir_all(root.join("x/y")).unwrap();
        fs::write(root.join("plain"), vec![1u8; 10_000]).unwrap();
        fs::write(root.join("linked"), vec![2u8; 50_000]).unwrap();
        fs::hard_link(root.join("linked"), root.join("x/second")).unwrap();
        fs::hard_link(root.join("linked"), root.join("x/y/third")).unwrap();
        let blocks = |p: &str| fs::symlink_metadata(root.join(p)).unwrap().blocks() * 512;
        let expected = ["", "x", "x/y", "plain", "linked"]
            .iter()
            .map(|p| blocks(p))
            .sum::<u64>();
        let walk = measure_tree(open(root).as_fd()).unwrap();
        assert_eq!(walk.usage.used_bytes, expected);
        assert_eq!(walk.usage.used_inodes, 5);
        assert_eq!((walk.mount_points, walk.too_deep), (0, 0));
    }

    #[test]
    fn a_usage_walk_stops_at_the_deepest_level() {
        let tmp = tempfile::tempdir().unwrap();
        let bottom = tmp.path().join("d/".repeat(MAX_USAGE_DEPTH + 2));
        fs::create_dir_all(&bottom).unwrap();
        let walk = measure_tree(open(tmp.path()).as_fd()).unwrap();
        // The root and the levels down to the deepest; the one below is met, not entered.
        assert_eq!(walk.usage.used_inodes, MAX_USAGE_DEPTH as u64 + 2);
        assert_eq!(walk.too_deep, 1);
    }
}
