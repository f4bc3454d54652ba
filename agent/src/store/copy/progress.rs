//! What a copy reports (its progress as metrics, its counts when done) and what its
//! walker and workers share while it runs.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use crate::store::error::StoreError;

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

/// What the walker and the workers share: the first error, and the counts the workers
/// make.
#[derive(Default)]
pub(super) struct Shared {
    /// Set once an error is recorded: everyone stops at the next step.
    failed: AtomicBool,
    pub(super) error: Mutex<Option<StoreError>>,
    pub(super) bytes: AtomicU64,
    pub(super) reflinked: AtomicU64,
    pub(super) copied: AtomicU64,
}

impl Shared {
    /// Records `error` unless one came first, and tells everyone to stop.
    pub(super) fn fail(&self, error: StoreError) {
        let mut first = self.error.lock().unwrap_or_else(|e| e.into_inner());
        if first.is_none() {
            *first = Some(error);
        }
        self.failed.store(true, Ordering::Release);
    }

    pub(super) fn stopped(&self) -> bool {
        self.failed.load(Ordering::Acquire)
    }
}

/// A file's share of the pending-bytes gauge, given back as it is copied and, whatever
/// happens to the file (copied, failed, dropped from the queue), all of it when dropped.
pub(super) struct Pending<'p> {
    gauge: &'p Gauge,
    left: u64,
}

impl<'p> Pending<'p> {
    pub(super) fn new(gauge: &'p Gauge, bytes: u64) -> Self {
        gauge.inc_by(gauge_amount(bytes));
        Self { gauge, left: bytes }
    }

    pub(super) fn copied(&mut self, bytes: u64) {
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
