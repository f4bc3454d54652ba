//! The capacity the agent has promised: the sum of every live volume's capacity, against
//! the size of the filesystem that has to hold it.
//!
//! Sparse directories, reflinked or snapshotted clones and quotas only cap what a volume
//! may take; none of them sets space aside. So the promises can add up to more than the
//! filesystem holds, and when tenants come to use them the first sign would be ENOSPC
//! inside volumes. The counter makes that visible (`/v1/info`, the metrics) and bounds it
//! (`limits.max_overcommit_ratio`): a new promise that would take the ratio past the
//! bound is refused before anything is made.
//!
//! Only live volumes count. Archives and snapshots take no new writes: they hold what they
//! hold, which the filesystem's used space already shows, and promise nothing more (a
//! btrfs snapshot or a ZFS snapshot or archived dataset shares its blocks with its
//! source, so its restore size would count data twice).
//!
//! The figure is summed from the volume records once when the agent starts, and moved by
//! each operation that changes a promise; it is never written anywhere, so a crash loses
//! nothing that the next start does not count again.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use super::error::{Result, StoreError};

/// The bounds of `[limits]` on the ratio of provisioned bytes to the filesystem's size.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OvercommitLimits {
    /// Past it the agent reports the overcommit (`kubectl nfsprov doctor`, the alert).
    pub warn_ratio: f64,
    /// Past it new promises are refused; `None`: never refused.
    pub max_ratio: Option<f64>,
}

impl Default for OvercommitLimits {
    fn default() -> Self {
        Self {
            warn_ratio: 1.0,
            max_ratio: None,
        }
    }
}

impl OvercommitLimits {
    /// The limits when they make sense, else why not, in the settings' names.
    pub fn check(self) -> std::result::Result<Self, String> {
        if !(self.warn_ratio.is_finite() && self.warn_ratio > 0.0) {
            return Err(format!(
                "limits.overcommit_warn_ratio ({}) must be a positive number",
                self.warn_ratio
            ));
        }
        if let Some(max) = self.max_ratio {
            if !(max.is_finite() && max > 0.0) {
                return Err(format!(
                    "limits.max_overcommit_ratio ({max}) must be a positive number"
                ));
            }
            if max < self.warn_ratio {
                return Err(format!(
                    "limits.max_overcommit_ratio ({max}) must be at least limits.overcommit_warn_ratio ({}): the warning comes before the refusals",
                    self.warn_ratio
                ));
            }
        }
        Ok(self)
    }
}

/// `provisioned / total`; 0 for a filesystem that reports no size.
pub fn ratio(provisioned: u64, total_bytes: u64) -> f64 {
    if total_bytes == 0 {
        0.0
    } else {
        provisioned as f64 / total_bytes as f64
    }
}

/// The running sum of the capacities of the live volumes.
#[derive(Debug, Default)]
pub struct Provisioned {
    bytes: AtomicU64,
    limits: OvercommitLimits,
}

impl Provisioned {
    /// Starts from `bytes`, the capacities summed from the records.
    pub fn new(bytes: u64, limits: OvercommitLimits) -> Self {
        Self {
            bytes: AtomicU64::new(bytes),
            limits,
        }
    }

    pub fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }

    pub fn limits(&self) -> OvercommitLimits {
        self.limits
    }

    /// Holds `more` bytes for a promise about to be made (`what`, for the refusal),
    /// unless that would take the ratio to a filesystem of `total_bytes` past the maximum.
    /// The bytes go back when the reservation is dropped without being kept, so a promise
    /// that is not made (a failure, a volume found there already) leaves no trace; two
    /// promises checked at once are both counted against the bound.
    pub fn reserve(
        &self,
        more: u64,
        total_bytes: u64,
        what: &dyn fmt::Display,
    ) -> Result<Reservation<'_>> {
        let max = self.limits.max_ratio.filter(|_| total_bytes > 0);
        let reserved = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                let after = now.saturating_add(more);
                match max {
                    Some(max) if more > 0 && ratio(after, total_bytes) > max => None,
                    _ => Some(after),
                }
            });
        match reserved {
            Ok(_) => Ok(Reservation {
                counter: self,
                bytes: more,
            }),
            Err(now) => {
                let after = now.saturating_add(more);
                Err(StoreError::Overcommitted(format!(
                    "{what}: refused: {more} more bytes would make the provisioned capacity {after} bytes, {:.3} times the filesystem's {total_bytes} bytes, past limits.max_overcommit_ratio {}; {now} bytes are provisioned now and nothing was changed. Free capacity (delete volumes), grow the filesystem or raise the limit",
                    ratio(after, total_bytes),
                    max.unwrap_or_default(),
                )))
            }
        }
    }

    /// Counts a promise made without asking the bound: an adoption takes over a
    /// directory whose data is there already, and is never refused for it.
    pub fn add(&self, bytes: u64) {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_add(bytes))
            })
            .ok();
    }

    /// A promise withdrawn: the volume was deleted or archived.
    pub fn release(&self, bytes: u64) {
        self.bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |now| {
                Some(now.saturating_sub(bytes))
            })
            .ok();
    }
}

/// Bytes held for a promise being made: given back when dropped, unless kept.
#[derive(Debug)]
#[must_use = "a reservation is given back when dropped"]
pub struct Reservation<'a> {
    counter: &'a Provisioned,
    bytes: u64,
}

impl Reservation<'_> {
    /// The promise was made: its bytes stay counted.
    pub fn keep(mut self) {
        self.bytes = 0;
    }

    /// Keeps the bytes when `made` says the promise was made now, else gives them back.
    pub fn keep_if(self, made: bool) {
        if made {
            self.keep();
        }
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.counter.release(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;

    fn limited(max: f64) -> Provisioned {
        Provisioned::new(
            0,
            OvercommitLimits {
                warn_ratio: 1.0,
                max_ratio: Some(max),
            },
        )
    }

    #[test]
    fn kept_reservations_add_up_and_dropped_ones_leave_nothing() {
        let counter = Provisioned::new(5, OvercommitLimits::default());
        counter.reserve(10, 100, &"a").unwrap().keep();
        assert_eq!(counter.bytes(), 15);
        {
            let held = counter.reserve(20, 100, &"b").unwrap();
            assert_eq!(counter.bytes(), 35, "held while the promise is made");
            drop(held);
        }
        assert_eq!(counter.bytes(), 15);
        counter.reserve(7, 100, &"c").unwrap().keep_if(false);
        assert_eq!(counter.bytes(), 15);
        counter.reserve(7, 100, &"d").unwrap().keep_if(true);
        assert_eq!(counter.bytes(), 22);
        counter.add(3);
        counter.release(20);
        assert_eq!(counter.bytes(), 5);
        counter.release(50);
        assert_eq!(counter.bytes(), 0, "never below zero");
    }

    #[test]
    fn a_promise_past_the_maximum_is_refused_with_the_figures_and_the_setting() {
        let counter = limited(1.5);
        counter.reserve(10 * GIB, 10 * GIB, &"a").unwrap().keep();
        // Exactly at the bound is allowed.
        counter.reserve(5 * GIB, 10 * GIB, &"b").unwrap().keep();
        let err = counter.reserve(1, 10 * GIB, &"vol/c").unwrap_err();
        assert!(matches!(err, StoreError::Overcommitted(_)), "{err}");
        let message = err.to_string();
        for part in [
            "vol/c",
            "limits.max_overcommit_ratio 1.5",
            &format!("{} bytes are provisioned now", 15 * GIB),
            &format!("filesystem's {} bytes", 10 * GIB),
        ] {
            assert!(message.contains(part), "{part:?} not in {message:?}");
        }
        assert_eq!(counter.bytes(), 15 * GIB, "a refusal counts nothing");
        // Freed capacity makes room again.
        counter.release(GIB);
        counter.reserve(GIB, 10 * GIB, &"d").unwrap().keep();
        assert_eq!(counter.bytes(), 15 * GIB);
    }

    #[test]
    fn without_a_maximum_or_a_size_nothing_is_refused() {
        let counter = Provisioned::new(0, OvercommitLimits::default());
        counter.reserve(1000 * GIB, GIB, &"a").unwrap().keep();
        assert_eq!(counter.bytes(), 1000 * GIB);
        let limited = limited(1.0);
        limited.reserve(5 * GIB, 0, &"b").unwrap().keep();
        assert_eq!(limited.bytes(), 5 * GIB);
        // Nothing more asked for (a resize to the same size) is never refused.
        limited.reserve(0, GIB, &"c").unwrap().keep();
    }

    #[test]
    fn concurrent_promises_never_pass_the_bound_together() {
        let counter = limited(1.0);
        let total = 64 * GIB;
        let kept = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|s| {
            for _ in 0..8 {
                s.spawn(|| {
                    for _ in 0..32 {
                        if let Ok(held) = counter.reserve(GIB, total, &"x") {
                            held.keep();
                            kept.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        assert_eq!(kept.load(Ordering::Relaxed), 64);
        assert_eq!(counter.bytes(), total);
    }

    mod store {
        use nfsprov_api_types::{
            AdoptVolumeRequest, CloneVolumeRequest, CreateVolumeRequest, RestoreSource,
            RestoreVolumeRequest, SnapshotName, VolumeOwner, VolumePath,
        };

        use super::super::OvercommitLimits;
        use crate::store::{CopyProgress, Created, Deleted, StoreError, VolumeStore};

        fn path(p: &str) -> VolumePath {
            VolumePath::parse(p).unwrap()
        }

        fn create(capacity_bytes: u64) -> CreateVolumeRequest {
            CreateVolumeRequest {
                capacity_bytes,
                ..Default::default()
            }
        }

        fn counted(root: &std::path::Path, max_ratio: Option<f64>) -> VolumeStore {
            VolumeStore::open(root)
                .unwrap()
                .count_provisioned(OvercommitLimits {
                    warn_ratio: 1.0,
                    max_ratio,
                })
                .unwrap()
        }

        /// Each operation that makes, grows or withdraws a promise moves the figure by
        /// the capacity it promised; one that finds its volume there already does not;
        /// a new store counts the same figure from the records.
        #[test]
        fn every_promise_moves_the_figure_and_a_new_start_counts_it_again() {
            let dir = tempfile::tempdir().unwrap();
            let store = counted(dir.path(), None);
            let figure = |store: &VolumeStore| store.provisioned().bytes();
            assert_eq!(figure(&store), 0);
            store.create(&path("a"), &create(100)).unwrap();
            assert_eq!(figure(&store), 100);
            assert_eq!(
                store.create(&path("a"), &create(100)).unwrap().1,
                Created::Existing
            );
            assert_eq!(
                figure(&store),
                100,
                "a repeated create promises nothing more"
            );
            store.resize(&path("a"), 250).unwrap();
            store.resize(&path("a"), 250).unwrap();
            assert_eq!(figure(&store), 250);
            let progress = CopyProgress::default();
            let clone = CloneVolumeRequest {
                source: path("a"),
                capacity_bytes: 300,
                owner: VolumeOwner::default(),
                quota: Default::default(),
                export: None,
            };
            store.clone_volume(&path("b"), &clone, &progress).unwrap();
            assert_eq!(figure(&store), 550);
            let name = SnapshotName::parse("snap").unwrap();
            store
                .take_snapshot(&name, &path("a"), &progress, &|_| true)
                .unwrap();
            assert_eq!(figure(&store), 550, "a snapshot promises nothing");
            let restore = RestoreVolumeRequest::from_source(
                RestoreSource::Snapshot(name.clone()),
                400,
                VolumeOwner::default(),
            );
            store
                .restore_volume(&path("c"), &restore.source().unwrap(), &restore, &progress)
                .unwrap();
            assert_eq!(figure(&store), 950);
            std::fs::create_dir(dir.path().join("found")).unwrap();
            let adoption = AdoptVolumeRequest {
                capacity_bytes: 50,
                owner: VolumeOwner::default(),
                export: None,
            };
            store.adopt(&path("found"), &adoption).unwrap();
            assert_eq!(figure(&store), 1000);

            let again = counted(dir.path(), None);
            assert_eq!(figure(&again), 1000, "counted from the records");
            drop(again);

            store.archive(&path("b"), None).unwrap();
            assert_eq!(figure(&store), 700, "an archive promises nothing");
            assert_eq!(store.delete(&path("c")).unwrap(), Deleted::Removed);
            assert_eq!(store.delete(&path("c")).unwrap(), Deleted::WasAbsent);
            assert_eq!(figure(&store), 300);
            assert_eq!(figure(&counted(dir.path(), None)), 300);
        }

        /// Past the maximum, creates, clones, restores and growths are refused before
        /// anything is made, and a resize refused keeps the volume as it was.
        #[test]
        fn promises_past_the_maximum_are_refused_and_make_nothing() {
            let dir = tempfile::tempdir().unwrap();
            let total = VolumeStore::open(dir.path())
                .unwrap()
                .filesystem_stats()
                .unwrap()
                .total_bytes;
            let store = counted(dir.path(), Some(1.0));
            let half = total / 2;
            store.create(&path("a"), &create(half)).unwrap();
            let refused = |err: StoreError| {
                assert!(matches!(err, StoreError::Overcommitted(_)), "{err}");
            };
            refused(store.create(&path("team/big"), &create(total)).unwrap_err());
            refused(store.resize(&path("a"), total + 1).unwrap_err());
            let progress = CopyProgress::default();
            let clone = CloneVolumeRequest {
                source: path("a"),
                capacity_bytes: total,
                owner: VolumeOwner::default(),
                quota: Default::default(),
                export: None,
            };
            refused(
                store
                    .clone_volume(&path("team/copy"), &clone, &progress)
                    .unwrap_err(),
            );
            let name = SnapshotName::parse("snap").unwrap();
            store
                .take_snapshot(&name, &path("a"), &progress, &|_| true)
                .unwrap();
            let restore = RestoreVolumeRequest::from_source(
                RestoreSource::Snapshot(name),
                total,
                VolumeOwner::default(),
            );
            refused(
                store
                    .restore_volume(
                        &path("team/r"),
                        &restore.source().unwrap(),
                        &restore,
                        &progress,
                    )
                    .unwrap_err(),
            );
            assert_eq!(store.provisioned().bytes(), half);
            let listed: Vec<String> = store
                .list(None)
                .unwrap()
                .0
                .into_iter()
                .map(|v| v.path.to_string())
                .collect();
            assert_eq!(listed, ["a"]);
            assert_eq!(store.get(&path("a")).unwrap().capacity_bytes, half);
            assert!(!dir.path().join("team").exists(), "not even a parent");
            assert_eq!(store.leftover_count().unwrap(), 0);
            // Up to the bound is allowed.
            store.create(&path("b"), &create(total - half)).unwrap();
            assert_eq!(store.provisioned().bytes(), total);
            // At the bound, a repeated request is still confirmed, and one for other
            // settings still judged so.
            assert_eq!(
                store.create(&path("a"), &create(half)).unwrap().1,
                Created::Existing
            );
            let err = store.create(&path("a"), &create(half + 1)).unwrap_err();
            assert!(matches!(err, StoreError::Conflict(_)), "{err}");
            assert_eq!(store.provisioned().bytes(), total);
        }
    }

    #[test]
    fn the_ratio_is_provisioned_over_total() {
        assert_eq!(ratio(3, 2), 1.5);
        assert_eq!(ratio(3, 0), 0.0);
    }

    #[test]
    fn limits_are_positive_and_the_maximum_not_below_the_warning() {
        let limits = |warn_ratio, max_ratio| OvercommitLimits {
            warn_ratio,
            max_ratio,
        };
        assert!(OvercommitLimits::default().check().is_ok());
        assert!(limits(0.8, Some(0.8)).check().is_ok());
        assert!(limits(2.0, Some(3.0)).check().is_ok());
        for (bad, expected) in [
            (limits(0.0, None), "limits.overcommit_warn_ratio (0)"),
            (limits(-1.0, None), "limits.overcommit_warn_ratio (-1)"),
            (limits(f64::NAN, None), "limits.overcommit_warn_ratio"),
            (limits(1.0, Some(0.0)), "limits.max_overcommit_ratio (0)"),
            (
                limits(1.0, Some(f64::INFINITY)),
                "limits.max_overcommit_ratio (inf)",
            ),
            (
                limits(2.0, Some(1.5)),
                "limits.max_overcommit_ratio (1.5) must be at least limits.overcommit_warn_ratio (2)",
            ),
        ] {
            let err = bad.check().unwrap_err();
            assert!(err.contains(expected), "{expected:?} not in {err:?}");
        }
    }
}
