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
//! - No point-in-time consistency. Each file is copied as it is when the copy reaches it;
//!   a volume in use gives a clone as inconsistent as a `cp -a` of it would be: only a
//!   stopped workload (or a snapshotting filesystem) gives a consistent one.
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
//! remembered on disk, not in memory, until its last name is linked (see [`LinkStage`]),
//! so there is no cap on how many hard-linked files a clone keeps exactly.
//!
//! One thread walks the tree and makes every directory, name, link and special file, in
//! order; it also applies each directory's metadata as it leaves it, since only it
//! changes directories. Worker threads copy file data and set the files' metadata, from
//! a bounded queue of open file pairs, so many small files and a few large ones both go
//! at the disks' speed while the descriptors in flight stay bounded.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, SyncSender, sync_channel};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use rustix::fs::{
    AtFlags, Dir, FileType, Gid, Mode, OFlags, SeekFrom, Statx, StatxFlags, Timespec, Timestamps,
    Uid, XattrFlags,
};
use rustix::io::Errno;

use super::confine::is_dot;
use super::error::{Result, StoreError, io_error};
use super::tree::{MAX_USAGE_DEPTH, MountId};

/// Progress of the copies in flight, as metrics: handles registered by the agent's
/// metrics, updated as data is copied (per chunk, so a large file shows progress).
#[derive(Debug, Clone, Default)]
pub struct CopyProgress {
    /// Bytes of file data copied (or reflinked).
    pub copied_bytes: Counter,
    /// Regular files copied (or reflinked).
    pub copied_files: Counter,
    /// Bytes of file data found but not copied yet, over all copies in flight.
    pub pending_bytes: Gauge,
}

/// How to copy.
#[derive(Debug, Clone, Copy)]
pub struct CopyOptions {
    /// Threads copying file data at once.
    pub workers: usize,
    /// Try `FICLONE` for each regular file first.
    pub reflink: bool,
}

/// What a copy did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CopyStats {
    /// Directories below the root.
    pub directories: u64,
    /// Regular files, each counted once however many hard links it has.
    pub files: u64,
    /// Symlinks, fifos, sockets and device nodes.
    pub others: u64,
    /// Extra names of hard-linked files.
    pub hard_links: u64,
    /// Bytes of file data (holes not counted), reflinked files included.
    pub bytes: u64,
    /// Files whose data was shared by `FICLONE`.
    pub reflinked_files: u64,
    /// Files whose data was copied.
    pub copied_files: u64,
}

/// Deepest level below the root that is copied: whatever a usage walk measures can be
/// cloned. Each level holds two descriptors (source and target) while the walk is below
/// it, so this also bounds the walk's descriptors.
const MAX_COPY_DEPTH: usize = MAX_USAGE_DEPTH;

/// The attribute old agents kept a volume's record in; never copied (see the module's
/// documentation).
const LEGACY_XATTR: &[u8] = b"user.nfsprov.volume";

/// Most bytes one `copy_file_range` is asked for: progress and a stop request are
/// noticed at least this often.
const CHUNK: usize = 8 << 20;
/// Buffer of a worker copying by `read`/`write`, where `copy_file_range` cannot.
const FALLBACK_BUFFER: usize = 1 << 20;
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
/// Tries at reading an attribute or list that keeps growing between size and read.
const XATTR_TRIES: usize = 8;

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

/// Whether `FICLONE` works in `dir`'s filesystem, tried on two empty files made (and
/// removed) in `dir`, which must be a directory only the agent writes.
pub fn reflink_supported(dir: BorrowedFd<'_>) -> bool {
    let probes = Probe::create(dir).and_then(|source| Ok((source, Probe::create(dir)?)));
    let (source, target) = match probes {
        Ok(probes) => probes,
        Err(e) => {
            tracing::debug!(error = %std::io::Error::from(e), "cannot make files to try FICLONE");
            return false;
        }
    };
    let cloned = rustix::fs::ioctl_ficlone(&target.fd, &source.fd);
    drop((source, target));
    match cloned {
        Ok(()) => true,
        Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::XDEV | Errno::NOTTY) => false,
        Err(e) => {
            tracing::debug!(error = %std::io::Error::from(e), "FICLONE failed");
            false
        }
    }
}

/// Names of probe files: hidden, unique within the process, and unlikely to be taken by
/// another (a taken one is skipped).
static PROBES: AtomicU64 = AtomicU64::new(0);

/// An empty file made to try `FICLONE`, removed when dropped.
struct Probe<'a> {
    dir: BorrowedFd<'a>,
    name: String,
    fd: OwnedFd,
}

impl<'a> Probe<'a> {
    fn create(dir: BorrowedFd<'a>) -> rustix::io::Result<Self> {
        let mut last = Errno::EXIST;
        for _ in 0..16 {
            let n = PROBES.fetch_add(1, Ordering::Relaxed);
            let name = format!(".nfsprov-reflink-probe-{}-{n}", std::process::id());
            match rustix::fs::openat(
                dir,
                name.as_str(),
                OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            ) {
                Ok(fd) => return Ok(Self { dir, name, fd }),
                Err(Errno::EXIST) => last = Errno::EXIST,
                Err(e) => return Err(e),
            }
        }
        Err(last)
    }
}

impl Drop for Probe<'_> {
    fn drop(&mut self) {
        if let Err(e) = rustix::fs::unlinkat(self.dir, self.name.as_str(), AtFlags::empty()) {
            tracing::debug!(name = %self.name, error = %std::io::Error::from(e), "cannot remove a FICLONE probe");
        }
    }
}

/// What the walker and the workers share: the first error, and the counts the workers
/// make.
#[derive(Default)]
struct Shared {
    /// Set once an error is recorded: everyone stops at the next step.
    failed: AtomicBool,
    error: Mutex<Option<StoreError>>,
    bytes: AtomicU64,
    reflinked: AtomicU64,
    copied: AtomicU64,
}

impl Shared {
    /// Records `error` unless one came first, and tells everyone to stop.
    fn fail(&self, error: StoreError) {
        let mut first = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(error);
        }
        self.failed.store(true, Ordering::Release);
    }

    fn stopped(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// What a stopping worker answers; never reported, since an error came first.
fn stopped() -> StoreError {
    StoreError::Conflict("the copy stopped".into())
}

/// A file's share of the pending-bytes gauge, given back as it is copied and, whatever
/// happens to the file (copied, failed, dropped from the queue), all of it when dropped.
struct Pending<'p> {
    gauge: &'p Gauge,
    left: u64,
}

impl<'p> Pending<'p> {
    fn new(gauge: &'p Gauge, bytes: u64) -> Self {
        gauge.inc_by(gauge_amount(bytes));
        Self { gauge, left: bytes }
    }

    fn copied(&mut self, bytes: u64) {
        let done = bytes.min(self.left);
        self.left -= done;
        self.gauge.dec_by(gauge_amount(done));
    }
}

impl Drop for Pending<'_> {
    fn drop(&mut self) {
        self.gauge.dec_by(gauge_amount(self.left));
    }
}

fn gauge_amount(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A regular file to copy: both ends open, the target already named in its directory.
struct Job<'p> {
    source: OwnedFd,
    target: OwnedFd,
    /// Of the source, taken after it was opened.
    stat: Statx,
    rel: String,
    pending: Pending<'p>,
}

fn work<'p>(
    jobs: &Mutex<Receiver<Job<'p>>>,
    reflink: bool,
    shared: &Shared,
    progress: &'p CopyProgress,
) {
    let mut buffer = Vec::new();
    loop {
        let next = jobs.lock().unwrap_or_else(|e| e.into_inner()).recv();
        let Ok(job) = next else {
            return;
        };
        // After an error the queue is only emptied: dropping a job closes its files and
        // gives its pending bytes back.
        if shared.stopped() {
            continue;
        }
        if let Err(e) = copy_file(job, reflink, shared, progress, &mut buffer) {
            shared.fail(e);
        }
    }
}

fn copy_file(
    mut job: Job<'_>,
    reflink: bool,
    shared: &Shared,
    progress: &CopyProgress,
    buffer: &mut Vec<u8>,
) -> Result<()> {
    let reflinked = reflink && clone_file(&job)?;
    let bytes = if reflinked {
        // Counted like a copy, by its data and not its holes, so that the bytes of a
        // clone mean the same whichever way it was made.
        let bytes = data_bytes(job.source.as_fd(), job.stat.stx_size)
            .map_err(|e| io_error(format!("read {}", job.rel), e))?;
        progress.copied_bytes.inc_by(bytes);
        job.pending.copied(bytes);
        bytes
    } else {
        copy_data(&mut job, shared, progress, buffer)?
    };
    set_metadata(
        &Node::Fd(job.source.as_fd()),
        &Node::Fd(job.target.as_fd()),
        &job.stat,
        &job.rel,
    )?;
    shared.bytes.fetch_add(bytes, Ordering::Relaxed);
    let method = if reflinked {
        &shared.reflinked
    } else {
        &shared.copied
    };
    method.fetch_add(1, Ordering::Relaxed);
    progress.copied_files.inc();
    Ok(())
}

/// Shares the whole file's data (holes included); `false` where the filesystem cannot.
fn clone_file(job: &Job<'_>) -> Result<bool> {
    match rustix::fs::ioctl_ficlone(&job.target, &job.source) {
        Ok(()) => Ok(true),
        Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::XDEV | Errno::NOTTY) => Ok(false),
        Err(e) => Err(write_error("clone", &job.rel, e)),
    }
}

/// Copies the data extents of the file, then sizes the target like the source, so holes
/// stay holes; answers the bytes copied.
fn copy_data(
    job: &mut Job<'_>,
    shared: &Shared,
    progress: &CopyProgress,
    buffer: &mut Vec<u8>,
) -> Result<u64> {
    let (source, target) = (job.source.as_fd(), job.target.as_fd());
    let rel = job.rel.as_str();
    // The size when the file was opened: data appended later is not copied.
    let mut end = job.stat.stx_size;
    let mut offset = 0;
    let mut copied = 0;
    let mut plain = false;
    'extents: while let Some((start, stop)) =
        next_data(source, offset, end).map_err(|e| io_error(format!("read {rel}"), e))?
    {
        let mut position = start;
        while position < stop {
            if shared.stopped() {
                return Err(stopped());
            }
            let len = usize::try_from(stop - position).map_or(CHUNK, |len| len.min(CHUNK));
            let done = if plain {
                copy_plain(source, target, position, len, buffer, rel)?
            } else {
                let (mut from, mut to) = (position, position);
                match rustix::fs::copy_file_range(
                    source,
                    Some(&mut from),
                    target,
                    Some(&mut to),
                    len,
                ) {
                    Ok(done) => done,
                    // Across filesystems, on old kernels and on filesystems that do not
                    // have it: read and write instead, for the rest of this file.
                    Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => {
                        plain = true;
                        continue;
                    }
                    Err(Errno::INTR) => continue,
                    Err(e) => return Err(write_error("copy", rel, e)),
                }
            };
            if done == 0 {
                // Shrunk since it was opened: it ends here.
                end = position;
                break 'extents;
            }
            let done = done as u64;
            position += done;
            copied += done;
            progress.copied_bytes.inc_by(done);
            job.pending.copied(done);
        }
        offset = stop;
    }
    rustix::fs::ftruncate(target, end).map_err(|e| write_error("write", rel, e))?;
    Ok(copied)
}

fn copy_plain(
    source: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    offset: u64,
    len: usize,
    buffer: &mut Vec<u8>,
    rel: &str,
) -> Result<usize> {
    if buffer.is_empty() {
        buffer.resize(FALLBACK_BUFFER, 0);
    }
    let len = len.min(buffer.len());
    let read = loop {
        match rustix::io::pread(source, &mut buffer[..len], offset) {
            Ok(read) => break read,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(io_error(format!("read {rel}"), e)),
        }
    };
    let mut written = 0;
    while written < read {
        match rustix::io::pwrite(target, &buffer[written..read], offset + written as u64) {
            Ok(0) => return Err(write_error("write", rel, Errno::IO)),
            Ok(n) => written += n,
            Err(Errno::INTR) => continue,
            Err(e) => return Err(write_error("write", rel, e)),
        }
    }
    Ok(read)
}

/// The next extent of data at or after `offset` and before `end`, as its start and end.
fn next_data(fd: BorrowedFd<'_>, offset: u64, end: u64) -> rustix::io::Result<Option<(u64, u64)>> {
    if offset >= end {
        return Ok(None);
    }
    let start = match rustix::fs::seek(fd, SeekFrom::Data(offset)) {
        Ok(start) => start,
        // No data after `offset` (or the file shrank to before it).
        Err(Errno::NXIO) => return Ok(None),
        // A filesystem that cannot tell: all of it is data.
        Err(Errno::INVAL | Errno::OPNOTSUPP) => return Ok(Some((offset, end))),
        Err(e) => return Err(e),
    };
    if start >= end {
        return Ok(None);
    }
    let stop = match rustix::fs::seek(fd, SeekFrom::Hole(start)) {
        Ok(stop) => stop.min(end),
        // Shrunk meanwhile: the copy meets the end of the file and stops there.
        Err(Errno::NXIO) => end,
        Err(e) => return Err(e),
    };
    Ok(Some((start, stop)))
}

/// The bytes of data (not holes) of a file `size` bytes long.
fn data_bytes(fd: BorrowedFd<'_>, size: u64) -> rustix::io::Result<u64> {
    let (mut offset, mut bytes) = (0, 0);
    while let Some((start, stop)) = next_data(fd, offset, size)? {
        bytes += stop - start;
        offset = stop;
    }
    Ok(bytes)
}

/// What a file's data is likely to take: its size, less its holes as far as its
/// allocated blocks tell. Only a gauge's estimate: the copy gives back exactly this.
fn data_estimate(stat: &Statx) -> u64 {
    stat.stx_size.min(stat.stx_blocks.saturating_mul(512))
}

fn stat_mask() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::BTIME | StatxFlags::MNT_ID
}

fn stat_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Statx> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, stat_mask())
}

/// Which inode a stat is of. The birth time, where the filesystem keeps one, tells apart
/// a file removed during the copy and a new one given its inode number.
type Identity = (u32, u32, u64, i64, u32);

fn identity(stat: &Statx) -> Identity {
    let born = if stat.stx_mask & StatxFlags::BTIME.bits() != 0 {
        (stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec)
    } else {
        (0, 0)
    };
    (
        stat.stx_dev_major,
        stat.stx_dev_minor,
        stat.stx_ino,
        born.0,
        born.1,
    )
}

fn file_type(stat: &Statx) -> FileType {
    FileType::from_raw_mode(stat.stx_mode.into())
}

/// Permission bits with the set-user-ID, set-group-ID and sticky bits.
fn permissions(stat: &Statx) -> u32 {
    u32::from(stat.stx_mode) & 0o7777
}

fn timestamps(stat: &Statx) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: stat.stx_atime.tv_sec,
            tv_nsec: stat.stx_atime.tv_nsec.into(),
        },
        last_modification: Timespec {
            tv_sec: stat.stx_mtime.tv_sec,
            tv_nsec: stat.stx_mtime.tv_nsec.into(),
        },
    }
}

/// An error of a step that writes the target; a full filesystem or quota is the clone
/// not fitting, said so.
fn write_error(what: &str, rel: &str, errno: Errno) -> StoreError {
    match errno {
        Errno::NOSPC | Errno::DQUOT => StoreError::NoSpace(format!(
            "{what} {rel}: no space left; the clone's capacity or the filesystem is too small for the source volume"
        )),
        e => io_error(format!("{what} {rel}"), e),
    }
}

fn mount_point(rel: &str) -> StoreError {
    StoreError::Conflict(format!(
        "{rel} is a mount point inside the source volume; a clone never spans filesystems; unmount it and retry"
    ))
}

fn changed(rel: &str) -> StoreError {
    StoreError::Conflict(format!(
        "{rel} was replaced while the volume was being copied; retry the clone"
    ))
}

fn special_bits(rel: &str) -> StoreError {
    StoreError::Unsupported(format!(
        "{rel} has the set-user-ID or set-group-ID bit, which the agent is not allowed to set (it needs CAP_FSETID, and no RestrictSUIDSGID= in its unit); a clone is exact or fails"
    ))
}

fn child_path(parent: &str, name: &CStr) -> String {
    let name = name.to_string_lossy();
    if parent == "." {
        name.into_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// Opens `name` in `dir` without updating its access time (so the copy leaves the
/// source's times alone) where the agent may (owner or `CAP_FOWNER`).
fn open_source(dir: BorrowedFd<'_>, name: &CStr, flags: OFlags) -> rustix::io::Result<OwnedFd> {
    let open = |flags| rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty());
    match open(flags | OFlags::NOATIME) {
        Err(Errno::PERM) => open(flags),
        opened => opened,
    }
}

/// Opens the entry listed as `listed` (a regular file or a directory, as `kind` says)
/// for reading and checks it still is: a name replaced by a symlink is refused rather
/// than followed, by another entry (or a fifo, opened without blocking) refused once
/// opened. `None` when it is gone.
fn open_listed(
    dir: BorrowedFd<'_>,
    name: &CStr,
    listed: &Statx,
    rel: &str,
    kind: FileType,
) -> Result<Option<(OwnedFd, Statx)>> {
    let (flags, replaced) = if kind == FileType::Directory {
        (
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Errno::NOTDIR,
        )
    } else {
        (
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
            Errno::NXIO,
        )
    };
    let fd = match open_source(dir, name, flags) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) if e == Errno::LOOP || e == replaced => return Err(changed(rel)),
        Err(e) => return Err(io_error(format!("open {rel}"), e)),
    };
    let stat = stat_fd(fd.as_fd()).map_err(|e| io_error(format!("stat {rel}"), e))?;
    same_entry(&stat, listed, kind, rel)?;
    Ok(Some((fd, stat)))
}

fn same_entry(opened: &Statx, listed: &Statx, kind: FileType, rel: &str) -> Result<()> {
    if MountId::of(opened) != MountId::of(listed) {
        return Err(mount_point(rel));
    }
    if file_type(opened) != kind || identity(opened) != identity(listed) {
        return Err(changed(rel));
    }
    Ok(())
}

/// An entry whose metadata is read or set: open (files and directories), or a name in an
/// open directory (symlinks and special files, which are never opened: opening a device
/// can do things, a symlink would be followed).
enum Node<'a> {
    Fd(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a CStr),
}

impl Node<'_> {
    fn chown(&self, stat: &Statx) -> rustix::io::Result<()> {
        let (uid, gid) = (
            Some(Uid::from_raw(stat.stx_uid)),
            Some(Gid::from_raw(stat.stx_gid)),
        );
        match *self {
            Node::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
            Node::At(dir, name) => {
                rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            }
        }
    }

    /// Never called for a symlink (which has no mode of its own): `fchmodat` follows.
    fn chmod(&self, mode: u32) -> rustix::io::Result<()> {
        let mode = Mode::from_raw_mode(mode);
        match *self {
            Node::Fd(fd) => rustix::fs::fchmod(fd, mode),
            Node::At(dir, name) => rustix::fs::chmodat(dir, name, mode, AtFlags::empty()),
        }
    }

    fn set_times(&self, times: &Timestamps) -> rustix::io::Result<()> {
        match *self {
            Node::Fd(fd) => rustix::fs::futimens(fd, times),
            Node::At(dir, name) => {
                rustix::fs::utimensat(dir, name, times, AtFlags::SYMLINK_NOFOLLOW)
            }
        }
    }

    fn stat(&self) -> rustix::io::Result<Statx> {
        match *self {
            Node::Fd(fd) => stat_fd(fd),
            Node::At(dir, name) => {
                rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
            }
        }
    }

    /// The path that reaches the entry through its directory's descriptor, for the
    /// attribute calls that have no `*at` form: `/proc/self/fd/N` leads to the directory
    /// itself and the last component is not followed by the `l*` calls.
    fn path(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<CString> {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(name.to_bytes());
        CString::new(path).map_err(|_| Errno::INVAL)
    }

    /// The names of the entry's attributes, each followed by a NUL.
    fn list_xattrs(&self) -> rustix::io::Result<Vec<u8>> {
        match *self {
            Node::Fd(fd) => read_sized(
                || rustix::fs::flistxattr_query(fd),
                |buffer| rustix::fs::flistxattr(fd, buffer),
            ),
            Node::At(dir, name) => {
                let path = Self::path(dir, name)?;
                read_sized(
                    || rustix::fs::llistxattr_query(&path),
                    |buffer| rustix::fs::llistxattr(&path, buffer),
                )
            }
        }
    }

    fn get_xattr(&self, attribute: &CStr) -> rustix::io::Result<Vec<u8>> {
        match *self {
            Node::Fd(fd) => read_sized(
                || rustix::fs::fgetxattr_query(fd, attribute),
                |buffer| rustix::fs::fgetxattr(fd, attribute, buffer),
            ),
            Node::At(dir, name) => {
                let path = Self::path(dir, name)?;
                read_sized(
                    || rustix::fs::lgetxattr_query(&path, attribute),
                    |buffer| rustix::fs::lgetxattr(&path, attribute, buffer),
                )
            }
        }
    }

    fn set_xattr(&self, attribute: &CStr, value: &[u8]) -> rustix::io::Result<()> {
        match *self {
            Node::Fd(fd) => rustix::fs::fsetxattr(fd, attribute, value, XattrFlags::empty()),
            Node::At(dir, name) => rustix::fs::lsetxattr(
                Self::path(dir, name)?,
                attribute,
                value,
                XattrFlags::empty(),
            ),
        }
    }
}

/// Reads something whose size is asked first, again when it grew in between.
fn read_sized(
    size: impl Fn() -> rustix::io::Result<usize>,
    read: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    for _ in 0..XATTR_TRIES {
        let mut buffer = vec![0; size()?];
        if buffer.is_empty() {
            return Ok(buffer);
        }
        match read(&mut buffer) {
            Ok(len) => {
                buffer.truncate(len);
                return Ok(buffer);
            }
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::RANGE)
}

/// Gives `target` the metadata of `source` (whose stat is `stat`), in the one order that
/// keeps it all (see the module's documentation).
fn set_metadata(source: &Node<'_>, target: &Node<'_>, stat: &Statx, rel: &str) -> Result<()> {
    let symlink = file_type(stat) == FileType::Symlink;
    target
        .chown(stat)
        .map_err(|e| write_error("set the owner of", rel, e))?;
    copy_xattrs(source, target, symlink, rel)?;
    if !symlink {
        set_mode(target, permissions(stat), rel)?;
    }
    target
        .set_times(&timestamps(stat))
        .map_err(|e| write_error("set the times of", rel, e))
}

fn set_mode(target: &Node<'_>, mode: u32, rel: &str) -> Result<()> {
    let set_id = mode & 0o6000 != 0;
    match target.chmod(mode) {
        Ok(()) => {}
        // What the unit's RestrictSUIDSGID= answers.
        Err(Errno::PERM) if set_id => return Err(special_bits(rel)),
        Err(e) => return Err(write_error("set the mode of", rel, e)),
    }
    if set_id {
        // Without CAP_FSETID the kernel silently drops the set-group-ID bit of a file
        // whose group the agent is not in: look.
        let now = target
            .stat()
            .map_err(|e| io_error(format!("stat {rel}"), e))?;
        if permissions(&now) != mode {
            return Err(special_bits(rel));
        }
    }
    Ok(())
}

fn copy_xattrs(source: &Node<'_>, target: &Node<'_>, symlink: bool, rel: &str) -> Result<()> {
    let names = match source.list_xattrs() {
        Ok(names) => names,
        // The source's filesystem has none.
        Err(Errno::OPNOTSUPP) => return Ok(()),
        Err(e) => {
            return Err(io_error(
                format!("list the extended attributes of {rel}"),
                e,
            ));
        }
    };
    for attribute in names.split(|b| *b == 0) {
        if attribute.is_empty() || attribute == LEGACY_XATTR {
            continue;
        }
        let shown = String::from_utf8_lossy(attribute);
        let Ok(attribute) = CString::new(attribute) else {
            continue;
        };
        let value = match source.get_xattr(&attribute) {
            Ok(value) => value,
            // Removed since it was listed.
            Err(Errno::NODATA) => continue,
            Err(e) => {
                return Err(io_error(
                    format!("read the extended attribute {shown} of {rel}"),
                    e,
                ));
            }
        };
        match target.set_xattr(&attribute, &value) {
            Ok(()) => {}
            // Linux allows no user.* attributes on symlinks.
            Err(Errno::PERM | Errno::OPNOTSUPP) if symlink && shown.starts_with("user.") => {}
            Err(Errno::OPNOTSUPP) => {
                return Err(StoreError::Unsupported(format!(
                    "{rel} has the extended attribute {shown}, which the clone's filesystem cannot store; a clone is exact or fails"
                )));
            }
            Err(e) => {
                return Err(write_error(
                    &format!("set the extended attribute {shown} of"),
                    rel,
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// A directory being copied: everything below it is done when its listing is.
struct Frame {
    source: Dir,
    target: OwnedFd,
    /// Of the source, taken when it was opened, before it was read.
    stat: Statx,
    rel: String,
}

impl Frame {
    fn source(&self) -> BorrowedFd<'_> {
        // Never fails on Linux; the descriptor is the stream's own.
        self.source
            .fd()
            .expect("a directory stream has a descriptor")
    }
}

/// Where the copy keeps the first name of each hard-linked file until it has met all
/// the others: a private directory in the new volume's root, holding one more link to
/// each such file, named by the source inode. The filesystem itself is the set of files
/// waiting for more names, so the copy's memory does not grow with them; each waits as
/// one directory entry, taken out once its last name is linked, and the directory goes
/// before the copy ends. Being inside the new volume, it shares its quota project (a
/// link across projects is refused), and its entries take the room of directory entries
/// from the clone's quota while the copy runs.
struct LinkStage {
    dir: OwnedFd,
    name: CString,
}

/// Names given to link stages; one a source root holds is moved out of the way.
static STAGES: AtomicU64 = AtomicU64::new(0);

impl LinkStage {
    fn create(root: BorrowedFd<'_>) -> Result<Self> {
        let name = Self::make(|name| rustix::fs::mkdirat(root, name, Mode::from_raw_mode(0o700)))?;
        let dir = rustix::fs::openat(
            root,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("open the directory of hard links", e))?;
        Ok(Self { dir, name })
    }

    /// Tries `make` with fresh names until one is not taken; answers the name.
    fn make(make: impl Fn(&CStr) -> rustix::io::Result<()>) -> Result<CString> {
        loop {
            let n = STAGES.fetch_add(1, Ordering::Relaxed);
            let name = CString::new(format!(".nfsprov-links-{}-{n}", std::process::id()))
                .expect("no NUL in a generated name");
            match make(&name) {
                Ok(()) => return Ok(name),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(write_error("create", "the directory of hard links", e)),
            }
        }
    }

    /// Moves the stage away from `name` in `root`, which the source's root holds too.
    fn step_aside(&mut self, root: BorrowedFd<'_>) -> Result<()> {
        let from = self.name.clone();
        self.name = Self::make(|to| {
            rustix::fs::renameat_with(root, &from, root, to, rustix::fs::RenameFlags::NOREPLACE)
        })?;
        Ok(())
    }

    /// The name a file waits under: its source inode, with its birth time where the
    /// filesystem keeps one, so a file removed during the copy and a new one given its
    /// inode number are told apart (the device is the same for every entry copied).
    fn key(listed: &Statx) -> CString {
        let (_, _, ino, born_sec, born_nsec) = identity(listed);
        CString::new(format!("{ino:x}-{born_sec:x}-{born_nsec:x}")).expect("no NUL in a number")
    }

    /// Removes the stage and what is left in it: files some of whose names were not
    /// reached (removed during the copy, or never inside the volume), which keep the
    /// names they were copied under.
    fn remove(self, root: BorrowedFd<'_>) -> Result<()> {
        let mut stream =
            Dir::read_from(&self.dir).map_err(|e| io_error("list the hard links", e))?;
        // Only the agent writes here, so one pass finds everything.
        while let Some(entry) = stream.read() {
            let entry = entry.map_err(|e| io_error("list the hard links", e))?;
            if !is_dot(entry.file_name()) {
                rustix::fs::unlinkat(&self.dir, entry.file_name(), AtFlags::empty())
                    .map_err(|e| io_error("remove a hard link", e))?;
            }
        }
        rustix::fs::unlinkat(root, &self.name, AtFlags::REMOVEDIR)
            .map_err(|e| io_error("remove the directory of hard links", e))
    }
}

/// The walking thread: makes every directory and name in the target in order, and hands
/// regular files to the workers.
struct Walker<'s, 'p> {
    mount: MountId,
    shared: &'s Shared,
    progress: &'p CopyProgress,
    queue: SyncSender<Job<'p>>,
    /// Made when the first file with several names is met.
    links: Option<LinkStage>,
    stack: Vec<Frame>,
    stats: CopyStats,
}

impl<'s, 'p> Walker<'s, 'p> {
    fn new(
        source: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        shared: &'s Shared,
        progress: &'p CopyProgress,
        queue: SyncSender<Job<'p>>,
    ) -> Result<Self> {
        let root = open_source(source, c".", OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| io_error("open the source volume", e))?;
        let stat = stat_fd(root.as_fd()).map_err(|e| io_error("stat the source volume", e))?;
        let source = Dir::new(root).map_err(|e| io_error("read the source volume", e))?;
        let target = target.try_clone_to_owned().map_err(|e| {
            io_error(
                "open the new volume",
                Errno::from_io_error(&e).unwrap_or(Errno::BADF),
            )
        })?;
        Ok(Self {
            mount: MountId::of(&stat),
            shared,
            progress,
            queue,
            links: None,
            stack: vec![Frame {
                source,
                target,
                stat,
                rel: ".".into(),
            }],
            stats: CopyStats::default(),
        })
    }

    fn finish(self) -> CopyStats {
        self.stats
    }

    fn run(&mut self) -> Result<()> {
        while let Some(top) = self.stack.last_mut() {
            // A worker's error is the one reported.
            if self.shared.stopped() {
                return Ok(());
            }
            match top.source.read() {
                Some(Ok(entry)) => {
                    if !is_dot(entry.file_name()) {
                        self.entry(entry.file_name().to_owned())?;
                    }
                }
                Some(Err(e)) => return Err(io_error(format!("list {}", top.rel), e)),
                None => {
                    let done = self.stack.pop().expect("the directory just read");
                    // The root's listing is done, and so is every name: the stage goes
                    // before the root's times are set.
                    if self.stack.is_empty()
                        && let Some(links) = self.links.take()
                    {
                        links.remove(done.target.as_fd())?;
                    }
                    let source = Node::Fd(done.source());
                    set_metadata(
                        &source,
                        &Node::Fd(done.target.as_fd()),
                        &done.stat,
                        &done.rel,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn top(&self) -> &Frame {
        self.stack.last().expect("a directory is being walked")
    }

    fn entry(&mut self, name: CString) -> Result<()> {
        let top = self.top();
        let rel = child_path(&top.rel, &name);
        let listed =
            match rustix::fs::statx(top.source(), &name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()) {
                Ok(stat) => stat,
                // Removed since it was listed: copied as it is when reached.
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(io_error(format!("stat {rel}"), e)),
            };
        if MountId::of(&listed) != self.mount {
            return Err(mount_point(&rel));
        }
        if self.stack.len() == 1
            && let Some(links) = &mut self.links
            && links.name == name
        {
            links.step_aside(self.stack[0].target.as_fd())?;
        }
        let kind = file_type(&listed);
        if kind == FileType::Directory {
            return self.directory(name, rel, &listed);
        }
        let linked = listed.stx_nlink > 1;
        if linked && self.link(&name, &rel, &listed)? {
            return Ok(());
        }
        let made = match kind {
            FileType::RegularFile => self.regular(&name, &rel, &listed)?,
            FileType::Symlink => self.symlink(&name, &rel, &listed)?,
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => self.special(&name, &rel, &listed, kind)?,
            _ => {
                return Err(StoreError::Unsupported(format!(
                    "{rel} is of a type the agent cannot copy"
                )));
            }
        };
        if made && linked {
            self.stage(&name, &rel, &listed)?;
        }
        Ok(())
    }

    fn directory(&mut self, name: CString, rel: String, listed: &Statx) -> Result<()> {
        if self.stack.len() > MAX_COPY_DEPTH {
            return Err(StoreError::Unsupported(format!(
                "{rel} is more than {MAX_COPY_DEPTH} directories deep; the agent does not clone trees that deep"
            )));
        }
        let top = self.top();
        let Some((source, stat)) =
            open_listed(top.source(), &name, listed, &rel, FileType::Directory)?
        else {
            return Ok(());
        };
        // Private to the agent until the copy is done; its metadata comes when everything
        // in it is.
        rustix::fs::mkdirat(&top.target, &name, Mode::from_raw_mode(0o700))
            .map_err(|e| write_error("create", &rel, e))?;
        let target = rustix::fs::openat(
            &top.target,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error(format!("open the copy of {rel}"), e))?;
        let source = Dir::new(source).map_err(|e| io_error(format!("read {rel}"), e))?;
        self.stats.directories += 1;
        self.stack.push(Frame {
            source,
            target,
            stat,
            rel,
        });
        Ok(())
    }

    /// Links another name of a file already copied; `false` when it is the first met.
    fn link(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let Some(links) = &self.links else {
            return Ok(false);
        };
        let key = LinkStage::key(listed);
        let to = self.stack.last().expect("a directory is being walked");
        match rustix::fs::linkat(&links.dir, &key, &to.target, name, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(write_error("link", rel, e)),
        }
        self.stats.hard_links += 1;
        // Every name the source had when listed is made (the stage holds one more): the
        // file stops waiting. Most such files have two names, and this is the second.
        let done = listed.stx_nlink <= 2 || {
            let made = rustix::fs::statx(&links.dir, &key, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
                .map_err(|e| io_error(format!("stat the copy of {rel}"), e))?;
            made.stx_nlink > listed.stx_nlink
        };
        if done {
            rustix::fs::unlinkat(&links.dir, &key, AtFlags::empty())
                .map_err(|e| io_error(format!("forget the first name of {rel}"), e))?;
        }
        Ok(true)
    }

    /// Keeps the copy of a file with several names, just made under `name`, until its
    /// other names are met.
    fn stage(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<()> {
        let links = match &mut self.links {
            Some(links) => links,
            None => self
                .links
                .insert(LinkStage::create(self.stack[0].target.as_fd())?),
        };
        let from = self.stack.last().expect("a directory is being walked");
        let key = LinkStage::key(listed);
        loop {
            match rustix::fs::linkat(&from.target, name, &links.dir, &key, AtFlags::empty()) {
                Ok(()) => return Ok(()),
                // Left by a file that had that inode before (removed during the copy).
                Err(Errno::EXIST) => {
                    match rustix::fs::unlinkat(&links.dir, &key, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => continue,
                        Err(e) => return Err(io_error(format!("forget a first name of {rel}"), e)),
                    }
                }
                Err(e) => return Err(write_error("link", rel, e)),
            }
        }
    }

    fn regular(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let top = self.top();
        let Some((source, stat)) =
            open_listed(top.source(), name, listed, rel, FileType::RegularFile)?
        else {
            return Ok(false);
        };
        // Made here rather than by the worker, so that only this thread changes
        // directories and a directory's times can be set as soon as it is walked.
        let target = rustix::fs::openat(
            &top.target,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| write_error("create", rel, e))?;
        self.stats.files += 1;
        let pending = Pending::new(&self.progress.pending_bytes, data_estimate(&stat));
        let job = Job {
            source,
            target,
            stat,
            rel: rel.to_owned(),
            pending,
        };
        self.queue
            .send(job)
            .map_err(|_| io_error(format!("copy {rel} (no worker left)"), Errno::IO))?;
        Ok(true)
    }

    fn symlink(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let top = self.top();
        let link = match rustix::fs::readlinkat(top.source(), name, Vec::new()) {
            Ok(link) => link,
            Err(Errno::NOENT) => return Ok(false),
            // Not a symlink any more.
            Err(Errno::INVAL) => return Err(changed(rel)),
            Err(e) => return Err(io_error(format!("read the link {rel}"), e)),
        };
        rustix::fs::symlinkat(link.as_c_str(), &top.target, name)
            .map_err(|e| write_error("create", rel, e))?;
        set_metadata(
            &Node::At(top.source(), name),
            &Node::At(top.target.as_fd(), name),
            listed,
            rel,
        )?;
        self.stats.others += 1;
        Ok(true)
    }

    fn special(&mut self, name: &CStr, rel: &str, listed: &Statx, kind: FileType) -> Result<bool> {
        let top = self.top();
        let device = matches!(kind, FileType::CharacterDevice | FileType::BlockDevice);
        let rdev = if device {
            rustix::fs::makedev(listed.stx_rdev_major, listed.stx_rdev_minor)
        } else {
            0
        };
        // The set-ID bits come with the rest of the mode, after the owner.
        let mode = Mode::from_raw_mode(permissions(listed) & 0o777);
        rustix::fs::mknodat(&top.target, name, kind, mode, rdev).map_err(|e| match e {
            Errno::PERM if device => StoreError::Unsupported(format!(
                "{rel} is a device node, which the agent is not allowed to make (it needs CAP_MKNOD); a clone is exact or fails"
            )),
            e => write_error("create", rel, e),
        })?;
        set_metadata(
            &Node::At(top.source(), name),
            &Node::At(top.target.as_fd(), name),
            listed,
            rel,
        )?;
        self.stats.others += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::fs;
    use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
    use std::path::{Path, PathBuf};
    use std::process::Command;

    use super::*;

    const WORKERS: usize = 4;
    const SPARSE_SIZE: u64 = 1 << 30;
    const EXTENT: usize = 64 << 10;
    const EXTENTS: [u64; 2] = [128 << 20, 640 << 20];
    /// Files compared whole; larger ones (the sparse one) are sampled.
    const COMPARED_WHOLE: u64 = 16 << 20;

    /// True (after reporting the skip) when the test cannot do its part without root.
    fn skip_unless_root(test: &str) -> bool {
        if rustix::process::geteuid().is_root() {
            return false;
        }
        nfsprov_test_skip::skip(test, "needs root");
        true
    }

    fn open_dir(path: &Path) -> OwnedFd {
        rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
    }

    fn new_dir(path: &Path) -> PathBuf {
        fs::create_dir(path).unwrap();
        path.to_owned()
    }

    fn copy(
        source: &Path,
        target: &Path,
        reflink: bool,
        progress: &CopyProgress,
    ) -> Result<CopyStats> {
        let options = CopyOptions {
            workers: WORKERS,
            reflink,
        };
        copy_tree(
            open_dir(source).as_fd(),
            open_dir(target).as_fd(),
            &options,
            progress,
        )
    }

    /// Bytes no two offsets of which are likely alike.
    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
            .collect()
    }

    fn write(root: &Path, rel: &str, data: &[u8]) -> u64 {
        fs::write(root.join(rel), data).unwrap();
        data.len() as u64
    }

    fn chown(path: &Path, uid: u32, gid: u32) {
        std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
    }

    fn chmod(path: &Path, mode: u32) {
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    fn set_xattr(path: &Path, name: &str, value: &[u8]) {
        rustix::fs::lsetxattr(path, name, value, XattrFlags::empty()).unwrap();
    }

    /// Distinct times for the `n`th entry, with nanoseconds.
    fn times(n: i64) -> Timestamps {
        Timestamps {
            last_access: Timespec {
                tv_sec: 1_000_000_000 + n * 1000,
                tv_nsec: 123_456_789 + n,
            },
            last_modification: Timespec {
                tv_sec: 1_100_000_000 + n * 1000,
                tv_nsec: 987_654_321 - n,
            },
        }
    }

    fn set_times(path: &Path, times: &Timestamps) {
        rustix::fs::utimensat(rustix::fs::CWD, path, times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
    }

    /// Names (lossy, for readable failures) and values.
    fn xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
        let mut names = vec![0; 64 << 10];
        let len = rustix::fs::llistxattr(path, &mut names[..]).unwrap();
        names.truncate(len);
        names
            .split(|b| *b == 0)
            .filter(|name| !name.is_empty())
            .map(|name| {
                let name = CString::new(name).unwrap();
                let mut value = vec![0; 64 << 10];
                let len = rustix::fs::lgetxattr(path, &name, &mut value[..]).unwrap();
                value.truncate(len);
                (name.to_string_lossy().into_owned(), value)
            })
            .collect()
    }

    /// The tree the exactness test copies; answers its bytes of data. Needs root (owners,
    /// a device node).
    fn build_source(root: &Path) -> u64 {
        let mut bytes = 0;
        fs::create_dir_all(root.join("a/b/c")).unwrap();
        fs::create_dir(root.join("shared")).unwrap();
        bytes += write(root, "plain.txt", b"hello, world\n");
        bytes += write(root, "setuid-tool", b"#!/bin/sh\necho tool\n");
        bytes += write(root, "empty", b"");
        bytes += write(root, "big.bin", &pattern(100 << 10, 7));
        bytes += write(root, "a/b/c/deep.txt", b"three levels down\n");
        bytes += write(root, "a/first-name", b"one inode, two names\n");
        fs::hard_link(root.join("a/first-name"), root.join("shared/second-name")).unwrap();
        std::os::unix::fs::symlink("a/b/c/deep.txt", root.join("rel-link")).unwrap();
        std::os::unix::fs::symlink("/etc", root.join("abs-link")).unwrap();
        let sparse = fs::File::create(root.join("sparse.img")).unwrap();
        sparse.set_len(SPARSE_SIZE).unwrap();
        for (n, offset) in EXTENTS.into_iter().enumerate() {
            sparse
                .write_all_at(&pattern(EXTENT, n as u8 + 1), offset)
                .unwrap();
            bytes += EXTENT as u64;
        }
        drop(sparse);
        let special = |name: &str, kind, mode, dev| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                root.join(name).as_path(),
                kind,
                Mode::from_raw_mode(mode),
                dev,
            )
            .unwrap();
        };
        special("fifo", FileType::Fifo, 0o600, 0);
        special(
            "null",
            FileType::CharacterDevice,
            0o600,
            rustix::fs::makedev(1, 3),
        );
        drop(std::os::unix::net::UnixListener::bind(root.join("socket")).unwrap());

        set_xattr(&root.join("plain.txt"), "user.test", b"value");
        set_xattr(&root.join("a"), "user.test", b"value");
        set_xattr(&root.join("a/b"), "user.kept", b"yes");
        set_xattr(
            &root.join("a/b"),
            "user.nfsprov.volume",
            b"{\"forged\":true}",
        );
        set_xattr(root, "user.root", b"top");
        // Linux allows user.* attributes only on files and directories; trusted.* ones
        // (root only) reach symlinks and special files, which are never opened.
        set_xattr(
            &root.join("rel-link"),
            "trusted.link",
            b"on the link itself",
        );
        set_xattr(&root.join("fifo"), "trusted.fifo", b"on the fifo");

        // Owners first: chown clears the set-ID bits.
        for (rel, uid, gid) in [
            (".", 1234, 5678),
            ("plain.txt", 1234, 5678),
            ("a", 1234, 5678),
            ("a/b", 2000, 2000),
            ("a/b/c/deep.txt", 2000, 2000),
            ("setuid-tool", 2000, 2000),
            ("rel-link", 1234, 5678),
            ("fifo", 2000, 2000),
            ("shared/second-name", 1234, 5678),
        ] {
            chown(&root.join(rel), uid, gid);
        }
        for (rel, mode) in [
            (".", 0o751),
            ("plain.txt", 0o640),
            ("setuid-tool", 0o4755),
            ("shared", 0o1777),
            ("a/b", 0o700),
            ("a/b/c", 0o750),
            ("fifo", 0o620),
            ("null", 0o666),
        ] {
            chmod(&root.join(rel), mode);
        }
        // Directories last, deepest first: what is done in them changes their times.
        let entries = [
            "plain.txt",
            "setuid-tool",
            "empty",
            "big.bin",
            "a/b/c/deep.txt",
            "a/first-name",
            "rel-link",
            "abs-link",
            "sparse.img",
            "fifo",
            "null",
            "socket",
            "a/b/c",
            "a/b",
            "a",
            "shared",
            ".",
        ];
        for (n, rel) in entries.into_iter().enumerate() {
            set_times(&root.join(rel), &times(n as i64));
        }
        bytes
    }

    fn expected_stats(bytes: u64, reflinked: bool) -> CopyStats {
        let files = 7;
        CopyStats {
            directories: 4,
            files,
            others: 5,
            hard_links: 1,
            bytes,
            reflinked_files: if reflinked { files } else { 0 },
            copied_files: if reflinked { 0 } else { files },
        }
    }

    /// Compares the metadata of every entry of both trees (before anything is read, which
    /// would change access times), then their contents.
    fn assert_same_tree(source: &Path, copy: &Path) {
        let mut files = Vec::new();
        compare_metadata(source, copy, Path::new("."), &mut files);
        for rel in files {
            compare_contents(&source.join(&rel), &copy.join(&rel), &rel);
        }
    }

    fn compare_metadata(source: &Path, copy: &Path, rel: &Path, files: &mut Vec<PathBuf>) {
        let s = fs::symlink_metadata(source).unwrap();
        let c = fs::symlink_metadata(copy).unwrap_or_else(|e| panic!("{rel:?} copied: {e}"));
        assert_eq!(s.file_type(), c.file_type(), "{rel:?}: type");
        assert_eq!(s.mode(), c.mode(), "{rel:?}: mode");
        assert_eq!((s.uid(), s.gid()), (c.uid(), c.gid()), "{rel:?}: owner");
        assert_eq!(s.nlink(), c.nlink(), "{rel:?}: links");
        assert_eq!(s.rdev(), c.rdev(), "{rel:?}: device");
        assert_eq!(
            (s.mtime(), s.mtime_nsec()),
            (c.mtime(), c.mtime_nsec()),
            "{rel:?}: modification time"
        );
        // Reading a symlink (as the copy does) sets its access time: checked apart.
        if !s.is_symlink() {
            assert_eq!(
                (s.atime(), s.atime_nsec()),
                (c.atime(), c.atime_nsec()),
                "{rel:?}: access time"
            );
        }
        let mut expected = xattrs(source);
        expected.remove("user.nfsprov.volume");
        assert_eq!(expected, xattrs(copy), "{rel:?}: extended attributes");
        if s.is_symlink() {
            assert_eq!(
                fs::read_link(source).unwrap(),
                fs::read_link(copy).unwrap(),
                "{rel:?}: link"
            );
        } else if s.is_file() {
            assert_eq!(s.size(), c.size(), "{rel:?}: size");
            files.push(rel.to_owned());
        } else if s.is_dir() {
            let names = |dir: &Path| -> BTreeSet<_> {
                fs::read_dir(dir)
                    .unwrap()
                    .map(|e| e.unwrap().file_name())
                    .collect()
            };
            let listed = names(source);
            assert_eq!(listed, names(copy), "{rel:?}: entries");
            for name in listed {
                compare_metadata(
                    &source.join(&name),
                    &copy.join(&name),
                    &rel.join(&name),
                    files,
                );
            }
        }
    }

    fn compare_contents(source: &Path, copy: &Path, rel: &Path) {
        let size = fs::metadata(source).unwrap().len();
        if size <= COMPARED_WHOLE {
            assert!(
                fs::read(source).unwrap() == fs::read(copy).unwrap(),
                "{rel:?}: contents"
            );
            return;
        }
        let (s, c) = (
            fs::File::open(source).unwrap(),
            fs::File::open(copy).unwrap(),
        );
        let read = |file: &fs::File, offset: u64, len: usize| {
            let mut buffer = vec![0; len];
            file.read_exact_at(&mut buffer, offset).unwrap();
            buffer
        };
        for offset in EXTENTS {
            assert!(
                read(&s, offset, EXTENT) == read(&c, offset, EXTENT),
                "{rel:?} at {offset}"
            );
            assert!(
                read(&c, offset, EXTENT).iter().any(|b| *b != 0),
                "{rel:?} at {offset}"
            );
        }
        for offset in [0, 4096, 256 << 20, 512 << 20, size - 4096] {
            assert!(
                read(&c, offset, 4096).iter().all(|b| *b == 0),
                "{rel:?}: hole at {offset}"
            );
        }
    }

    /// The checks of one exact copy beyond the tree comparison.
    fn assert_copy_details(source: &Path, copy: &Path) {
        // The hole stays a hole.
        let sparse = fs::metadata(copy.join("sparse.img")).unwrap();
        assert_eq!(sparse.len(), SPARSE_SIZE);
        assert!(
            sparse.blocks() * 512 < 1 << 20,
            "{} bytes allocated",
            sparse.blocks() * 512
        );
        // Hard links: one new inode, two names.
        let first = fs::metadata(copy.join("a/first-name")).unwrap();
        let second = fs::metadata(copy.join("shared/second-name")).unwrap();
        assert_eq!(first.ino(), second.ino());
        assert_eq!(first.nlink(), 2);
        assert_ne!(
            first.ino(),
            fs::metadata(source.join("a/first-name")).unwrap().ino()
        );
        // Links are links, never followed.
        assert!(
            fs::symlink_metadata(copy.join("abs-link"))
                .unwrap()
                .is_symlink()
        );
        assert_eq!(
            fs::read_link(copy.join("abs-link")).unwrap(),
            Path::new("/etc")
        );
        let mut names = Vec::new();
        let mut pending = vec![copy.to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                if entry.file_type().unwrap().is_dir() {
                    pending.push(entry.path());
                }
                names.push(entry.file_name());
            }
        }
        assert_eq!(names.len(), 17, "{names:?}");
        assert!(!names.iter().any(|n| n == "passwd" || n == "hostname"));
        assert_eq!(
            fs::symlink_metadata(copy.join("rel-link")).unwrap().uid(),
            1234
        );
        // The forged record stays behind; other attributes come along.
        assert!(xattrs(&source.join("a/b")).contains_key("user.nfsprov.volume"));
        let attributes = xattrs(&copy.join("a/b"));
        assert!(!attributes.contains_key("user.nfsprov.volume"));
        assert_eq!(
            attributes.get("user.kept").map(Vec::as_slice),
            Some(b"yes".as_slice())
        );
        assert_eq!(
            fs::metadata(copy.join("setuid-tool")).unwrap().mode() & 0o7777,
            0o4755
        );
        assert_eq!(
            fs::metadata(copy.join("shared")).unwrap().mode() & 0o7777,
            0o1777
        );
    }

    /// A symlink's own access time: the copy's must be the source's before the copy read
    /// the link (which sets it), and is looked at before anything else reads the copy.
    fn symlink_atime(path: &Path) -> (i64, i64) {
        let link = fs::symlink_metadata(path).unwrap();
        (link.atime(), link.atime_nsec())
    }

    fn assert_balanced(progress: &CopyProgress) {
        assert_eq!(progress.pending_bytes.get(), 0, "pending bytes left");
    }

    #[test]
    fn a_copy_is_exact_with_and_without_reflink() {
        const TEST: &str = "store::copy::tests::a_copy_is_exact_with_and_without_reflink";
        if skip_unless_root(TEST) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        let bytes = build_source(&source);
        let sparse = fs::metadata(source.join("sparse.img")).unwrap();
        assert!(
            sparse.blocks() * 512 < 1 << 20,
            "the test's filesystem made no hole"
        );
        let reflink = reflink_supported(open_dir(tmp.path()).as_fd());
        for use_reflink in [false, true] {
            let copied = new_dir(&tmp.path().join(format!("copy-{use_reflink}")));
            let link_times = symlink_atime(&source.join("rel-link"));
            let progress = CopyProgress::default();
            let stats = copy(&source, &copied, use_reflink, &progress).unwrap();
            assert_eq!(symlink_atime(&copied.join("rel-link")), link_times);
            assert_eq!(stats, expected_stats(bytes, use_reflink && reflink));
            assert_same_tree(&source, &copied);
            assert_copy_details(&source, &copied);
            assert_balanced(&progress);
            assert_eq!(progress.copied_files.get(), stats.files);
            assert_eq!(progress.copied_bytes.get(), stats.bytes);
        }
    }

    /// The same on btrfs, where FICLONE works: every file is reflinked.
    #[test]
    fn a_reflinked_copy_is_exact() {
        const TEST: &str = "store::copy::tests::a_reflinked_copy_is_exact";
        if skip_unless_root(TEST) {
            return;
        }
        let btrfs = match nfsprov_agent_testkit::LoopBtrfs::new(300, false) {
            Ok(btrfs) => btrfs,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("no loop-mounted btrfs: {e}"));
                return;
            }
        };
        let root = btrfs.root();
        assert!(reflink_supported(open_dir(&root).as_fd()));
        assert_eq!(
            fs::read_dir(&root).unwrap().count(),
            0,
            "probes left behind"
        );
        let source = new_dir(&root.join("source"));
        let bytes = build_source(&source);
        let copied = new_dir(&root.join("copy"));
        let link_times = symlink_atime(&source.join("rel-link"));
        let progress = CopyProgress::default();
        let stats = copy(&source, &copied, true, &progress).unwrap();
        assert_eq!(symlink_atime(&copied.join("rel-link")), link_times);
        assert_eq!(stats, expected_stats(bytes, true));
        assert_same_tree(&source, &copied);
        assert_copy_details(&source, &copied);
        assert_balanced(&progress);
        assert_eq!(progress.copied_bytes.get(), stats.bytes);
    }

    /// A filesystem mounted for a test, unmounted when dropped (lazily: a failed
    /// assertion must not leave it behind).
    struct Mounted(PathBuf);

    impl Mounted {
        fn new(args: &[&str], source: &str, target: &Path) -> std::result::Result<Self, String> {
            let output = Command::new("mount")
                .args(args)
                .arg(source)
                .arg(target)
                .output()
                .map_err(|e| format!("mount: {e}"))?;
            if !output.status.success() {
                return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
            }
            Ok(Self(target.to_owned()))
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-l").arg(&self.0).status();
        }
    }

    fn assert_mount_point_refused(error: StoreError, rel: &str) {
        match error {
            StoreError::Conflict(message) => assert!(
                message.starts_with(&format!("{rel} is a mount point inside the source volume")),
                "{message}"
            ),
            other => panic!("not refused as a mount point: {other:?}"),
        }
    }

    #[test]
    fn a_mount_point_inside_the_source_is_refused() {
        const TEST: &str = "store::copy::tests::a_mount_point_inside_the_source_is_refused";
        if skip_unless_root(TEST) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        write(&source, "file", b"data");
        let point = source.join("deep/er");
        fs::create_dir_all(&point).unwrap();
        let elsewhere = new_dir(&tmp.path().join("elsewhere"));
        write(&elsewhere, "secret", b"not the volume's");

        let tmpfs = match Mounted::new(
            &["-t", "tmpfs", "-o", "size=1m"],
            "nfsprov-copy-test",
            &point,
        ) {
            Ok(mounted) => mounted,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("cannot mount a tmpfs: {e}"));
                return;
            }
        };
        write(&point, "inside", b"another filesystem");
        let copied = new_dir(&tmp.path().join("copy-1"));
        let error = copy(&source, &copied, false, &CopyProgress::default()).unwrap_err();
        assert_mount_point_refused(error, "deep/er");
        assert!(!copied.join("deep/er").exists());
        drop(tmpfs);

        // The same filesystem bound elsewhere: same device, another mount.
        let bind = match Mounted::new(&["--bind"], elsewhere.to_str().unwrap(), &point) {
            Ok(mounted) => mounted,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("cannot bind-mount: {e}"));
                return;
            }
        };
        assert_eq!(
            fs::metadata(&point).unwrap().dev(),
            fs::metadata(&source).unwrap().dev()
        );
        let copied = new_dir(&tmp.path().join("copy-2"));
        let error = copy(&source, &copied, false, &CopyProgress::default()).unwrap_err();
        assert_mount_point_refused(error, "deep/er");
        assert!(!copied.join("deep/er/secret").exists());
        drop(bind);
    }

    #[test]
    fn a_copy_that_does_not_fit_is_no_space() {
        const TEST: &str = "store::copy::tests::a_copy_that_does_not_fit_is_no_space";
        if skip_unless_root(TEST) {
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        // One file only: with a second, small one the parallel workers may
        // fill the filesystem with the big file first and fail on the small.
        let source = new_dir(&tmp.path().join("source"));
        write(&source, "big.bin", &pattern(4 << 20, 3));
        let small = new_dir(&tmp.path().join("small"));
        let _tmpfs = match Mounted::new(
            &["-t", "tmpfs", "-o", "size=1m"],
            "nfsprov-copy-test",
            &small,
        ) {
            Ok(mounted) => mounted,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("cannot mount a tmpfs: {e}"));
                return;
            }
        };
        let progress = CopyProgress::default();
        match copy(&source, &small, false, &progress) {
            Err(StoreError::NoSpace(message)) => {
                assert!(message.contains("big.bin"), "{message}");
                assert!(message.contains("too small"), "{message}");
            }
            other => panic!("not NoSpace: {other:?}"),
        }
        assert_balanced(&progress);
    }

    #[test]
    fn a_file_replaced_after_listing_is_refused_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "victim", b"listed");
        write(root, "other", b"never to be read through the victim's name");
        let dir = open_dir(root);
        let listed = |name: &CStr| {
            rustix::fs::statx(&dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()).unwrap()
        };
        let open_victim = |listed: &Statx| {
            open_listed(
                dir.as_fd(),
                c"victim",
                listed,
                "victim",
                FileType::RegularFile,
            )
        };
        let refused = |result: Result<Option<(OwnedFd, Statx)>>| match result {
            Err(StoreError::Conflict(message)) => assert!(message.contains("victim"), "{message}"),
            Err(e) => panic!("not refused as changed: {e:?}"),
            Ok(opened) => panic!("opened: {:?}", opened.map(|(_, stat)| stat.stx_ino)),
        };

        let unchanged = listed(c"victim");
        let (_, stat) = open_victim(&unchanged).unwrap().unwrap();
        assert_eq!(stat.stx_ino, unchanged.stx_ino);

        // Replaced by a symlink to another file.
        fs::remove_file(root.join("victim")).unwrap();
        std::os::unix::fs::symlink("other", root.join("victim")).unwrap();
        refused(open_victim(&unchanged));

        // Replaced by another file, renamed over it.
        let symlink = listed(c"victim");
        write(root, "new", b"another file");
        fs::rename(root.join("new"), root.join("victim")).unwrap();
        refused(open_victim(&unchanged));
        refused(open_victim(&symlink));

        // Gone: nothing to copy.
        fs::remove_file(root.join("victim")).unwrap();
        assert!(open_victim(&unchanged).unwrap().is_none());
    }

    #[test]
    fn progress_ends_balanced_after_a_copy_and_after_a_failure() {
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        fs::create_dir(source.join("sub")).unwrap();
        let mut bytes = 0;
        for n in 0..40 {
            let dir = if n % 2 == 0 { "." } else { "sub" };
            bytes += write(
                &source.join(dir),
                &format!("file-{n}"),
                &pattern(n * 3000, n as u8),
            );
        }
        let sparse = fs::File::create(source.join("sparse")).unwrap();
        sparse.set_len(32 << 20).unwrap();
        sparse.write_all_at(&pattern(EXTENT, 9), 16 << 20).unwrap();
        bytes += EXTENT as u64;

        let progress = CopyProgress::default();
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, true, &progress).unwrap();
        assert_eq!(
            (stats.files, stats.directories, stats.bytes),
            (41, 1, bytes)
        );
        assert_eq!(stats.reflinked_files + stats.copied_files, stats.files);
        assert_balanced(&progress);
        assert_eq!(progress.copied_files.get(), stats.files);
        assert_eq!(progress.copied_bytes.get(), stats.bytes);

        // A target that is not empty: the copy stops at the name already there, and
        // what was queued gives its pending bytes back.
        let progress = CopyProgress::default();
        let taken = new_dir(&tmp.path().join("taken"));
        fs::create_dir(taken.join("sub")).unwrap();
        write(&taken.join("sub"), "file-39", b"in the way");
        let error = copy(&source, &taken, false, &progress).unwrap_err();
        assert!(error.to_string().contains("sub"), "{error}");
        assert_balanced(&progress);
    }

    #[test]
    fn names_that_are_not_utf8_are_copied_as_they_are() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let name = |bytes: &[u8]| OsStr::from_bytes(bytes).to_owned();
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        let (dir, file) = (name(b"d\xff"), name(b"caf\xe9"));
        fs::create_dir_all(source.join(&dir).join(&dir)).unwrap();
        fs::write(source.join(&dir).join(&file), b"latin-1").unwrap();
        // The second name, in a directory the first's is not in: reached from the root.
        fs::hard_link(
            source.join(&dir).join(&file),
            source.join(&dir).join(&dir).join(&file),
        )
        .unwrap();
        std::os::unix::fs::symlink(name(b"\xfe/target"), source.join(&file)).unwrap();
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
        assert_eq!((stats.files, stats.hard_links, stats.others), (1, 1, 1));
        assert_eq!(
            fs::read(copied.join(&dir).join(&dir).join(&file)).unwrap(),
            b"latin-1"
        );
        assert_eq!(
            fs::read_link(copied.join(&file)).unwrap().as_os_str(),
            name(b"\xfe/target")
        );
    }

    #[test]
    fn a_tree_deeper_than_the_bound_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        let deepest = source.join("d/".repeat(MAX_COPY_DEPTH));
        fs::create_dir_all(&deepest).unwrap();
        write(&deepest, "leaf", b"at the bound");
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
        assert_eq!((stats.directories, stats.files), (MAX_COPY_DEPTH as u64, 1));
        assert_eq!(
            fs::read(copied.join("d/".repeat(MAX_COPY_DEPTH)).join("leaf")).unwrap(),
            b"at the bound"
        );

        fs::create_dir(deepest.join("d")).unwrap();
        let copied = new_dir(&tmp.path().join("copy-2"));
        match copy(&source, &copied, false, &CopyProgress::default()) {
            Err(StoreError::Unsupported(message)) => {
                assert!(
                    message.contains(&format!("more than {MAX_COPY_DEPTH}")),
                    "{message}"
                )
            }
            other => panic!("not refused: {other:?}"),
        }
    }

    /// Names of one file in several directories are one file in the copy, met in any
    /// order; a file whose other name lies outside the source is copied once under the
    /// name inside; the copy's root keeps nothing of the bookkeeping, even when the
    /// source's root holds an entry named like it.
    #[test]
    fn hard_links_are_kept_and_nothing_else_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        for dir in ["a", "b", "c/d"] {
            fs::create_dir_all(source.join(dir)).unwrap();
        }
        for n in 0..50 {
            let first = source.join("b").join(format!("f{n}"));
            write(
                &source.join("b"),
                &format!("f{n}"),
                format!("file {n}").as_bytes(),
            );
            fs::hard_link(&first, source.join("a").join(format!("g{n}"))).unwrap();
            fs::hard_link(&first, source.join("c/d").join(format!("h{n}"))).unwrap();
        }
        write(&source, "half", b"one name inside");
        fs::hard_link(source.join("half"), tmp.path().join("outside")).unwrap();
        // What the first stage of this process would be called, and then some.
        let next = STAGES.load(Ordering::Relaxed);
        for n in next..next + 64 {
            fs::create_dir(source.join(format!(".nfsprov-links-{}-{n}", std::process::id())))
                .unwrap();
        }
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
        assert_eq!((stats.files, stats.hard_links), (51, 100));
        let listing = |dir: &Path| {
            let mut names: Vec<_> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        assert_eq!(listing(&copied), listing(&source));
        for n in 0..50 {
            let names = [
                copied.join("a").join(format!("g{n}")),
                copied.join("b").join(format!("f{n}")),
                copied.join("c/d").join(format!("h{n}")),
            ];
            let first = fs::metadata(&names[0]).unwrap();
            assert_eq!(first.nlink(), 3);
            for name in &names {
                assert_eq!(fs::metadata(name).unwrap().ino(), first.ino());
            }
            assert_eq!(fs::read(&names[0]).unwrap(), format!("file {n}").as_bytes());
        }
        assert_eq!(fs::metadata(copied.join("half")).unwrap().nlink(), 1);
    }

    #[test]
    fn the_reflink_probe_leaves_nothing_behind() {
        let tmp = tempfile::tempdir().unwrap();
        let supported = reflink_supported(open_dir(tmp.path()).as_fd());
        assert_eq!(fs::read_dir(tmp.path()).unwrap().count(), 0);
        // The test's filesystem: whatever it answers, a copy with reflinks works.
        let source = new_dir(&tmp.path().join("source"));
        write(&source, "file", b"data");
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, supported, &CopyProgress::default()).unwrap();
        assert_eq!(stats.reflinked_files, u64::from(supported));
        assert_eq!(fs::read(copied.join("file")).unwrap(), b"data");
    }
}
