//! File data: the workers that copy it, extent by extent so that holes stay holes, or
//! share it with `FICLONE` where the filesystem can.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, Mode, OFlags, SeekFrom, Statx};
use rustix::io::Errno;
use rustix::time::ClockId;

use super::error::{kept_changing, stopped, write_error};
use super::metadata::{Node, set_metadata, stat_fd};
use super::progress::{CopyProgress, Pending, Shared};
use crate::store::error::{Result, io_error};

/// Most bytes one `copy_file_range` is asked for: progress and a stop request are
/// noticed at least this often.
const CHUNK: usize = 8 << 20;
/// Buffer of a worker copying by `read`/`write`, where `copy_file_range` cannot.
const FALLBACK_BUFFER: usize = 1 << 20;
/// Copies of one file that changes during them before the whole copy fails: a copy is a
/// state the file really had, never a mixture of two.
pub(super) const MAX_FILE_COPIES: u32 = 8;
/// Longest wait, per copy of a file, for its last change to be a clock tick old.
const SETTLE_LIMIT: Duration = Duration::from_millis(50);

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

/// A regular file to copy: both ends open, the target already named in its directory.
pub(super) struct Job<'p> {
    pub(super) source: OwnedFd,
    pub(super) target: OwnedFd,
    /// Of the source, taken after it was opened.
    pub(super) stat: Statx,
    pub(super) rel: String,
    pub(super) pending: Pending<'p>,
}

pub(super) fn work<'p>(
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
    let (reflinked, bytes) = copy_unchanged(&mut job, shared, |job, size| {
        let reflinked = reflink && clone_file(job)?;
        let bytes = if reflinked {
            // Counted like a copy, by its data and not its holes, so that the bytes of a
            // clone mean the same whichever way it was made.
            let bytes = data_bytes(job.source.as_fd(), size)
                .map_err(|e| io_error(format!("read {}", job.rel), e))?;
            progress.copied_bytes.inc_by(bytes);
            job.pending.copied(bytes);
            bytes
        } else {
            copy_data(job, size, shared, progress, buffer)?
        };
        Ok((reflinked, bytes))
    })?;
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

/// Copies `job`'s file with `copy` (given the size to copy) until one copy began and
/// ended with the file unchanged, so that it holds a state the file really had; then
/// `job.stat` is the file as that copy saw it. A file that changes during
/// [`MAX_FILE_COPIES`] copies fails the copy: never a mixture of two states, such as the
/// old size with the zeros of a truncation behind it.
fn copy_unchanged<'p, T>(
    job: &mut Job<'p>,
    shared: &Shared,
    mut copy: impl FnMut(&mut Job<'p>, u64) -> Result<T>,
) -> Result<T> {
    for copies in 1..=MAX_FILE_COPIES {
        let Some(before) = settled_stat(job.source.as_fd(), shared, &job.rel)? else {
            continue;
        };
        if copies > 1 {
            // A spoiled copy leaves nothing behind: the next one starts from nothing.
            rustix::fs::ftruncate(&job.target, 0).map_err(|e| write_error("write", &job.rel, e))?;
        }
        let copied = copy(job, before.stx_size)?;
        let after =
            stat_fd(job.source.as_fd()).map_err(|e| io_error(format!("stat {}", job.rel), e))?;
        if unchanged(&before, &after) {
            // The data is the file as `before` saw it: its metadata goes with it.
            job.stat = before;
            return Ok(copied);
        }
        tracing::debug!(file = %job.rel, copies, "the file changed while it was copied; copying it again");
    }
    Err(kept_changing(&job.rel, MAX_FILE_COPIES))
}

/// The source's stat once its last change lies before the current tick of the clock that
/// stamps changes, so that any later change carries a later change time; `None` when it
/// keeps changing for [`SETTLE_LIMIT`]. That clock moves in ticks (4 ms at 250 Hz), and
/// a kernel without fine-grained timestamps gives every change within one tick the same
/// change time: a stat taken in the tick of the last change cannot tell a change made
/// after it in that tick.
fn settled_stat(source: BorrowedFd<'_>, shared: &Shared, rel: &str) -> Result<Option<Statx>> {
    let deadline = Instant::now() + SETTLE_LIMIT;
    loop {
        // Read before the stat: every change after the stat is stamped at or after it.
        let tick = rustix::time::clock_gettime(ClockId::RealtimeCoarse);
        let stat = stat_fd(source).map_err(|e| io_error(format!("stat {rel}"), e))?;
        let changed = (stat.stx_ctime.tv_sec, i64::from(stat.stx_ctime.tv_nsec));
        if changed < (tick.tv_sec, tick.tv_nsec) {
            return Ok(Some(stat));
        }
        if shared.stopped() {
            return Err(stopped());
        }
        if Instant::now() >= deadline {
            return Ok(None);
        }
        // Nothing to wait on but the clock's next tick; a millisecond is a fraction of one.
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Whether nothing of a file's data changed between two stats of it (`before` taken as
/// [`settled_stat`] takes it): any write or truncation moves its change time.
fn unchanged(before: &Statx, after: &Statx) -> bool {
    let time = |t: &rustix::fs::StatxTimestamp| (t.tv_sec, t.tv_nsec);
    before.stx_ino == after.stx_ino
        && before.stx_size == after.stx_size
        && time(&before.stx_ctime) == time(&after.stx_ctime)
        && time(&before.stx_mtime) == time(&after.stx_mtime)
}

/// Shares the whole file's data (holes included); `false` where the filesystem cannot.
fn clone_file(job: &Job<'_>) -> Result<bool> {
    match rustix::fs::ioctl_ficlone(&job.target, &job.source) {
        Ok(()) => Ok(true),
        Err(Errno::OPNOTSUPP | Errno::INVAL | Errno::XDEV | Errno::NOTTY) => Ok(false),
        Err(e) => Err(write_error("clone", &job.rel, e)),
    }
}

/// Copies the data extents of the file's first `size` bytes, then sizes the target like
/// the source, so holes stay holes; answers the bytes copied. Only exact when the file did
/// not change meanwhile, which the caller checks: a file truncated meanwhile reads as a
/// hole.
fn copy_data(
    job: &mut Job<'_>,
    size: u64,
    shared: &Shared,
    progress: &CopyProgress,
    buffer: &mut Vec<u8>,
) -> Result<u64> {
    let (source, target) = (job.source.as_fd(), job.target.as_fd());
    let rel = job.rel.as_str();
    // The size when this copy began: data appended later is not copied.
    let mut end = size;
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
            let done = copy_chunk(source, target, position, len, &mut plain, buffer, rel)?;
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

/// Copies up to `len` bytes at `offset` of `source` to the same offset of `target`, in
/// the kernel where it can; answers how many (0 at the end of `source`). Once
/// `copy_file_range` is found missing (across filesystems, on old kernels and on
/// filesystems without it), `plain` says so and the rest of the file is read and written.
pub(crate) fn copy_chunk(
    source: BorrowedFd<'_>,
    target: BorrowedFd<'_>,
    offset: u64,
    len: usize,
    plain: &mut bool,
    buffer: &mut Vec<u8>,
    rel: &str,
) -> Result<usize> {
    loop {
        if *plain {
            return copy_plain(source, target, offset, len, buffer, rel);
        }
        let (mut from, mut to) = (offset, offset);
        match rustix::fs::copy_file_range(source, Some(&mut from), target, Some(&mut to), len) {
            Ok(done) => return Ok(done),
            Err(Errno::XDEV | Errno::INVAL | Errno::NOSYS | Errno::OPNOTSUPP) => *plain = true,
            Err(Errno::INTR) => {}
            Err(e) => return Err(write_error("copy", rel, e)),
        }
    }
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
pub(crate) fn next_data(
    fd: BorrowedFd<'_>,
    offset: u64,
    end: u64,
) -> rustix::io::Result<Option<(u64, u64)>> {
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
pub(super) fn data_estimate(stat: &Statx) -> u64 {
    stat.stx_size.min(stat.stx_blocks.saturating_mul(512))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use prometheus_client::metrics::gauge::Gauge;

    use super::*;
    use crate::store::copy::progress::CopyProgress;
    use crate::store::copy::tests::{copy, new_dir, open_dir, write};
    use crate::store::error::StoreError;

    /// Truncates `path` and writes `data` again: the same size and contents, another state
    /// in between.
    fn rewrite(path: &std::path::Path, data: &[u8]) {
        fs::write(path, data).unwrap();
    }

    /// A job copying `source` (written with `data`) to `target`, as the walker makes one.
    fn job<'p>(source: &std::path::Path, target: &std::path::Path, gauge: &'p Gauge) -> Job<'p> {
        let source: OwnedFd = fs::File::open(source).unwrap().into();
        let target: OwnedFd = fs::File::create(target).unwrap().into();
        let stat = stat_fd(source.as_fd()).unwrap();
        Job {
            source,
            target,
            stat,
            rel: "file".into(),
            pending: Pending::new(gauge, 0),
        }
    }

    fn coarse_now() -> (i64, i64) {
        let now = rustix::time::clock_gettime(ClockId::RealtimeCoarse);
        (now.tv_sec, now.tv_nsec)
    }

    #[test]
    fn a_settled_stat_tells_every_later_change_by_its_change_time() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("file");
        let data = vec![b'A'; 4096];
        let shared = Shared::default();
        // Many rounds, so that some stats come in the very tick of the change before them.
        for _ in 0..200 {
            rewrite(&file, &data);
            let fd: OwnedFd = fs::File::open(&file).unwrap().into();
            let before = settled_stat(fd.as_fd(), &shared, "file").unwrap().unwrap();
            let changed = (before.stx_ctime.tv_sec, i64::from(before.stx_ctime.tv_nsec));
            assert!(
                changed < coarse_now(),
                "settled in the tick of its last change"
            );
            rewrite(&file, &data);
            let after = stat_fd(fd.as_fd()).unwrap();
            assert_eq!(after.stx_size, before.stx_size);
            assert!(
                !unchanged(&before, &after),
                "a truncate and rewrite to the same size went unseen"
            );
            assert!(unchanged(&after, &stat_fd(fd.as_fd()).unwrap()));
        }
    }

    /// The copy core with a stand-in for the copy of the data, which rewrites the source
    /// while it "copies" as often as the test says and leaves a mark in the target.
    fn copy_while_rewritten(rewrites: u32) -> (Result<u32>, u32, Vec<u8>, bool) {
        let tmp = tempfile::tempdir().unwrap();
        let (source, target) = (tmp.path().join("source"), tmp.path().join("target"));
        let data = vec![b'A'; 4096];
        rewrite(&source, &data);
        let gauge = Gauge::default();
        let mut job = job(&source, &target, &gauge);
        let shared = Shared::default();
        let mut calls = 0;
        let outcome = copy_unchanged(&mut job, &shared, |job, size| {
            assert_eq!(size, data.len() as u64);
            calls += 1;
            let end = rustix::fs::seek(&job.target, SeekFrom::End(0)).unwrap();
            rustix::io::pwrite(&job.target, b"x", end).unwrap();
            if calls <= rewrites {
                rewrite(&source, &data);
            }
            Ok(calls)
        });
        let now = stat_fd(job.source.as_fd()).unwrap();
        let stat_is_current = unchanged(&job.stat, &now);
        (outcome, calls, fs::read(&target).unwrap(), stat_is_current)
    }

    #[test]
    fn a_file_that_changed_during_its_copy_is_copied_again_from_nothing() {
        let (outcome, calls, target, stat_is_current) = copy_while_rewritten(3);
        assert_eq!(outcome.unwrap(), 4);
        assert_eq!(calls, 4);
        // Each spoiled copy was emptied before the next: one mark, the last copy's.
        assert_eq!(target, b"x");
        assert!(stat_is_current, "the metadata set is the copied state's");
    }

    #[test]
    fn a_file_that_changes_during_every_copy_fails_it_with_a_clear_error() {
        let (outcome, calls, _, _) = copy_while_rewritten(u32::MAX);
        assert_eq!(calls, MAX_FILE_COPIES);
        match outcome {
            Err(StoreError::Conflict(message)) => assert!(
                message.contains("file changed while it was being copied, 8 times in a row"),
                "{message}"
            ),
            other => panic!("not a conflict: {other:?}"),
        }
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
