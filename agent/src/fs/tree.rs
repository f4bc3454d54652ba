//! Whole-tree walks of a volume: removal and usage. Both reach every entry relative to its
//! directory with `O_NOFOLLOW`, so a symlink is unlinked or counted, never followed.

use std::collections::HashSet;
use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Arc;

use nfsprov_api_types::VolumeUsage;
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use super::confine::is_dot;
use super::error::{Result, StoreError, io_error};

/// Removes `name` in `parent` and everything below it. Entries are opened relative to
/// their directory with `O_NOFOLLOW`, so a symlink is unlinked, never followed. The
/// subdirectories of the top directory are removed by several threads at once: unlinks
/// in different directories do not contend, and a big tree goes markedly faster.
pub fn remove_tree(parent: BorrowedFd<'_>, name: &str) -> Result<()> {
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| StoreError::Unsafe(format!("{name:?} contains NUL")))?;
    remove_entry(parent, &c_name, None, true).map_err(|e| io_error(format!("remove {name}"), e))
}

/// Removes one entry; `hint` is its type as listed (`None` when unknown).
fn remove_entry(
    parent: BorrowedFd<'_>,
    name: &CStr,
    hint: Option<FileType>,
    parallel: bool,
) -> rustix::io::Result<()> {
    if hint != Some(FileType::Directory) {
        match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            // A directory (the type was unknown or lied): empty it below.
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(e),
        }
    }
    let dir = match rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        Err(Errno::NOENT) => return Ok(()),
        // Replaced by a non-directory since it was listed: unlink that instead.
        Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
            return remove_entry(parent, name, Some(FileType::RegularFile), false);
        }
        Err(e) => return Err(e),
    };
    let children = read_children(dir.as_fd())?;
    if parallel {
        remove_children_in_parallel(dir.as_fd(), children)?;
    } else {
        for (child, kind) in children {
            remove_entry(
                dir.as_fd(),
                &child,
                Some(kind).filter(|k| *k != FileType::Unknown),
                false,
            )?;
        }
    }
    drop(dir);
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the files of `dir` at once and its subdirectories on a few threads.
fn remove_children_in_parallel(
    dir: BorrowedFd<'_>,
    children: Vec<(std::ffi::CString, FileType)>,
) -> rustix::io::Result<()> {
    let mut subdirectories = Vec::new();
    for (child, kind) in children {
        match kind {
            FileType::Directory => subdirectories.push(child),
            FileType::Unknown => remove_entry(dir, &child, None, false)?,
            kind => remove_entry(dir, &child, Some(kind), false)?,
        }
    }
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
                        remove_entry(dir, &child, Some(FileType::Directory), false)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(Errno::IO)))
    })
}

/// The entries of a directory (without `.` and `..`), read completely before any is
/// removed: unlinking while iterating can make getdents skip entries.
fn read_children(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<(std::ffi::CString, FileType)>> {
    let mut children = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        if !is_dot(entry.file_name()) {
            children.push((entry.file_name().to_owned(), entry.file_type()));
        }
    }
    Ok(children)
}

/// Walks the tree below `dir` (which counts too) without following symlinks.
pub fn measure_tree(dir: BorrowedFd<'_>) -> rustix::io::Result<VolumeUsage> {
    let top = rustix::fs::fstat(dir)?;
    let device = top.st_dev;
    let mut used_bytes = allocated(&top);
    let mut used_inodes = 1u64;
    let mut linked = HashSet::new();
    // Directories still to read, each with the open directory it is in; a directory's
    // descriptor stays open only while entries below it wait, so at most one per level.
    let mut pending: Vec<(Arc<OwnedFd>, std::ffi::CString)> = Vec::new();
    let first = Arc::new(dir.try_clone_to_owned().map_err(|_| Errno::BADF)?);
    let mut current = Some(first);
    loop {
        if let Some(directory) = current.take() {
            for entry in rustix::fs::Dir::read_from(directory.as_fd())? {
                let entry = entry?;
                let name = entry.file_name();
                if is_dot(name) {
                    continue;
                }
                let stat =
                    match rustix::fs::statat(directory.as_fd(), name, AtFlags::SYMLINK_NOFOLLOW) {
                        Ok(stat) => stat,
                        // Removed while we walked: it no longer uses anything.
                        Err(Errno::NOENT) => continue,
                        Err(e) => return Err(e),
                    };
                let is_dir = FileType::from_raw_mode(stat.st_mode) == FileType::Directory;
                if !is_dir && stat.st_nlink > 1 && !linked.insert((stat.st_dev, stat.st_ino)) {
                    continue;
                }
                used_bytes = used_bytes.saturating_add(allocated(&stat));
                used_inodes += 1;
                if is_dir && stat.st_dev == device {
                    pending.push((directory.clone(), name.to_owned()));
                }
            }
        }
        let Some((parent, name)) = pending.pop() else {
            break;
        };
        match rustix::fs::openat(
            parent.as_fd(),
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => current = Some(Arc::new(fd)),
            Err(Errno::NOENT) | Err(Errno::NOTDIR) | Err(Errno::LOOP) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(VolumeUsage {
        used_bytes,
        used_inodes,
    })
}

fn allocated(stat: &rustix::fs::Stat) -> u64 {
    u64::try_from(stat.st_blocks)
        .unwrap_or(0)
        .saturating_mul(512)
}
