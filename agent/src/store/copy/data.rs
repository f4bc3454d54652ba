//! File data: the workers that copy it, extent by extent so that holes stay holes, or
//! share it with `FICLONE` where the filesystem can.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Receiver;

use rustix::fs::{AtFlags, Mode, OFlags, SeekFrom, Statx};
use rustix::io::Errno;

use super::error::{stopped, write_error};
use super::metadata::{Node, set_metadata};
use super::progress::{CopyProgress, Pending, Shared};
use crate::store::error::{Result, io_error};

/// Most bytes one `copy_file_range` is asked for: progress and a stop request are
/// noticed at least this often.
const CHUNK: usize = 8 << 20;
/// Buffer of a worker copying by `read`/`write`, where `copy_file_range` cannot.
const FALLBACK_BUFFER: usize = 1 << 20;

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
pub(super) fn data_estimate(stat: &Statx) -> u64 {
    stat.stx_size.min(stat.stx_blocks.saturating_mul(512))
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::store::copy::progress::CopyProgress;
    use crate::store::copy::tests::{copy, new_dir, open_dir, write};

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
