//! Local copy of a volume's tree into a new volume: how a clone is made where the
//! filesystem cannot snapshot.
//!
//! What is preserved, for every entry: its type, contents, owner, mode (with the
//! set-user-ID, set-group-ID and sticky bits), access and modification times to the
//! nanosecond, extended attributes (ACLs, SELinux labels and file capabilities are
//! extended attributes too), symlink targets, the type and device number of fifos,
//! sockets and device nodes, hard links between names inside the volume, and holes: only
//! the data extents of a sparse file are written, so a clone takes no more space than its
//! source. Where `FICLONE` works the data is shared instead of copied.
//!
//! What is not, and why:
//! - No point-in-time consistency across files. Each file is copied as one state it
//!   really had when the copy reached it (a file that changes during its copy is copied
//!   again, see `data::copy_unchanged`), but two files may be from different moments: only
//!   a stopped workload (or a snapshotting filesystem) gives a consistent volume.
//! - Change and birth times, inode numbers and the order of directory entries: the kernel
//!   sets them and nothing can set them back.
//! - `user.nfsprov.volume`, the attribute in which old versions of the agent kept a
//!   volume's record (see `legacy.rs`): a tenant can set it, and a clone must never carry
//!   a record it forged.
//! - Attributes the agent cannot read: without `CAP_SYS_ADMIN` the kernel does not even
//!   list `trusted.*` ones.
//! - Attributes the new root already has and the source's root lacks (an SELinux label
//!   given at creation, say) stay.
//! - Inode flags (`chattr`): the project id is the new volume's own (its quota), and
//!   immutable or append-only files would need a capability the agent is not given.
//!
//! Everything else is exact or the copy fails, with the entry named: an attribute the
//! target filesystem cannot store, a set-user-ID or set-group-ID bit the agent is not
//! allowed to set (without `CAP_FSETID`, or under `RestrictSUIDSGID=`), a device node it
//! may not make (without `CAP_MKNOD`), a file capability it may not set (without
//! `CAP_SETFCAP`). Metadata goes on in the one order that keeps it: data, owner,
//! attributes, mode, times. Writing data and `chown` clear the `security.capability`
//! attribute, and `chown` (and writing, without `CAP_FSETID`) the set-ID bits, so those
//! come after; `chmod` after the attributes because setting an ACL rewrites the mode's
//! group bits; times last because writing a file, or entries into a directory, changes
//! them.
//!
//! Safety against the tenant whose volume is copied, who may be changing it meanwhile:
//! every entry is reached from its parent's descriptor with `O_NOFOLLOW`, never by a path,
//! so a symlink is copied as a link and never followed; a file is checked after it is
//! opened to be the inode that was listed; and a mount point anywhere below the root
//! (another filesystem, or a bind mount of this one) stops the copy before anything
//! behind it is read. Nothing recurses: the walk keeps an explicit stack of two
//! descriptors per level, bounded by [`MAX_COPY_DEPTH`].
//!
//! Bounded whatever the source holds: a copy keeps at most [`COPY_DESCRIPTORS`]
//! descriptors open, and memory that grows with the depth of the tree but not with the
//! number of entries. Directories are read as streams, a few entries at a time; files
//! wait for a worker in a queue of fixed length; and a file with several names is
//! remembered on disk, not in memory, until its last name is linked (see
//! [`walk::LinkStage`]), so there is no cap on how many hard-linked files a clone keeps
//! exactly.
//!
//! One thread walks the tree and makes every directory, name, link and special file, in
//! order; it also applies each directory's metadata as it leaves it, since only it
//! changes directories. Worker threads copy file data and set the files' metadata, from
//! a bounded queue of open file pairs, so many small files and a few large ones both go
//! at the disks' speed while the descriptors in flight stay bounded.

pub(crate) mod data;
pub(crate) mod error;
pub(crate) mod metadata;
mod progress;
pub(crate) mod walk;

use std::os::fd::BorrowedFd;
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex};

use rustix::io::Errno;

use self::data::work;
use self::progress::Shared;
use self::walk::{MAX_COPY_DEPTH, Walker};
use super::error::{Result, io_error};

pub use self::data::reflink_supported;
pub use self::progress::{CopyProgress, CopyStats};

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Threads copying file data at once.
    pub workers: usize,
    /// Try `FICLONE` for each regular file first.
    pub reflink: bool,
}

/// Files opened and waiting for a worker, per worker: enough to keep workers busy while
/// the walker is slow on a directory, few enough to bound the descriptors held (two each).
const QUEUE_PER_WORKER: usize = 16;
/// Most threads a copy uses for file data, whatever it is asked for.
const MAX_WORKERS: usize = 8;
/// Most descriptors one copy holds at once: two per level of the walk (the source's
/// stream and the target) with the root, the link stage, and two for each file queued,
/// in a worker's hands or being queued.
pub const COPY_DESCRIPTORS: usize =
    2 * (MAX_COPY_DEPTH + 1) + 1 + 2 * (MAX_WORKERS * (QUEUE_PER_WORKER + 1) + 1);

/// Copies everything in `source` into the empty directory `target`, then gives `target`
/// the metadata of `source` itself. On error the target is left as it is, unfinished: the
/// caller removes the whole new volume.
pub fn copy_tree(
    source: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    options: &CopyOptions,
    progress: &CopyProgress,
) -> Result<CopyStats> {
    let shared = Shared::default();
    let workers = options.workers.clamp(1, MAX_WORKERS);
    let (queue, jobs) = sync_channel(workers.saturating_mul(QUEUE_PER_WORKER));
    // Each worker owns a handle: when every one has gone (even by a panic) the receiver
    // is dropped, and a walker waiting to queue more is told instead of waiting forever.
    let jobs = Arc::new(Mutex::new(jobs));
    let mut walker = Walker::new(source, target, &shared, progress, queue)?;
    let reflink = options.reflink;
    let mut stats = std::thread::scope(|scope| {
        let mut handles = Vec::with_capacity(workers);
        for _ in 0..workers {
            let jobs = Arc::clone(&jobs);
            let shared = &shared;
            let spawned = std::thread::Builder::new()
                .name("nfsprov-copy".into())
                .spawn_scoped(scope, move || work(&jobs, reflink, shared, progress));
            match spawned {
                Ok(handle) => handles.push(handle),
                Err(e) => {
                    let errno = Errno::from_io_error(&e).unwrap_or(Errno::AGAIN);
                    shared.fail(io_error("start the copy's workers", errno));
                    break;
                }
            }
        }
        drop(jobs);
        if let Err(e) = walker.run() {
            shared.fail(e);
        }
        // Drops the queue's sender: the workers finish what is queued and return.
        let stats = walker.finish();
        for handle in handles {
            if handle.join().is_err() {
                shared.fail(io_error("copy file data (a worker failed)", Errno::IO));
            }
        }
        stats
    });
    if let Some(error) = shared.error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(error);
    }
    stats.bytes = shared.bytes.into_inner();
    stats.reflinked_files = shared.reflinked.into_inner();
    stats.copied_files = shared.copied.into_inner();
    Ok(stats)
}

#[cfg(test)]
mod tests;
