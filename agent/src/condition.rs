//! Each volume's condition: whether clients can use it as it is, and if not, why.
//!
//! Looked at cheaply (see `store::Looked`: a few syscalls per volume, no walk of its
//! tree), on every pass of the agent's one periodic task (`exports::Reconciler`, as a
//! [`PassStep`]) and again, for the volumes it answers with, at each request. When
//! several reasons hold, the one reported is the first of: filesystem_error, missing,
//! read_only, quota_full, not_exported.
//!
//! What the filesystem says is read at request time; what the NFS server served (its
//! last listing) and the repairs come from the last pass. Both the volumes last seen and
//! the repairs are kept in memory only: after a restart of the agent a volume that went
//! missing before it is not known, and a repair made before it is not reported again.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Instant, SystemTime};

use arc_swap::ArcSwap;
use nfsprov_api_types::{AbnormalReason, RepairedCondition, Volume, VolumeCondition, VolumePath};
use time::OffsetDateTime;

use crate::exports::{Exports, Pass, PassStep};
use crate::metrics::{ConditionLabels, ConditionMetrics};
use crate::store::{Looked, VolumeStore};
use crate::usage::UsageCache;

/// What is known of one volume, enough to judge its condition.
#[derive(Debug, Clone, Default)]
pub(crate) struct Facts {
    /// What the look at its directory found; `None` for a directory that is there and
    /// fine.
    pub looked: Option<Looked>,
    /// Its capacity is enforced and its last usage figure reached it.
    pub quota_full: bool,
    /// Its export is recorded and the NFS server's last listing lacked it (and it could
    /// not be served again).
    pub unserved: bool,
}

/// The reason that wins among what `facts` say, with its message for people; `dir` names
/// the volume's directory on the server, `nfs` where clients mount it, each asked for only
/// by the message that needs it (a normal volume, most of them, needs neither).
pub(crate) fn judge(
    facts: &Facts,
    dir: impl FnOnce() -> String,
    nfs: impl FnOnce() -> String,
) -> Option<(AbnormalReason, String)> {
    use crate::store::Found;
    match &facts.looked {
        Some(Looked::Failing(error)) => {
            let dir = dir();
            return Some((
                AbnormalReason::FilesystemError,
                format!("the filesystem under {dir} answers with an error: {error}"),
            ));
        }
        Some(Looked::Absent) => {
            let dir = dir();
            return Some((
                AbnormalReason::Missing,
                format!("the directory {dir} is gone from the NFS server"),
            ));
        }
        Some(Looked::Present(Found {
            servable: false, ..
        })) => {
            let dir = dir();
            return Some((
                AbnormalReason::Missing,
                format!("the filesystem of {dir} is not mounted on the NFS server"),
            ));
        }
        Some(Looked::Present(Found {
            read_only: true, ..
        })) => {
            let dir = dir();
            return Some((
                AbnormalReason::ReadOnly,
                format!("the filesystem under {dir} is mounted read-only"),
            ));
        }
        Some(Looked::Present(Found {
            own_filesystem_full: true,
            ..
        })) => {
            let dir = dir();
            return Some((
                AbnormalReason::QuotaFull,
                format!("the filesystem of {dir} has no space left"),
            ));
        }
        _ => {}
    }
    if facts.quota_full {
        return Some((AbnormalReason::QuotaFull, quota_full_message(&dir())));
    }
    if facts.unserved {
        let nfs = nfs();
        return Some((
            AbnormalReason::NotExported,
            format!("the NFS server does not serve {nfs}, which the agent exported"),
        ));
    }
    None
}

/// The most of its quota a volume may have left and still count as full: filesystems
/// refuse a write that would take a quota to its very last block (btrfs refused one 32 KiB
/// short of a 10 MiB limit, holding space back for its metadata), so a volume this close
/// is full for its writers.
const QUOTA_FULL_MARGIN_BYTES: u64 = 16 << 20;

/// Whether `volume`'s capacity is enforced and `used_bytes` leaves at most 2% of it (and
/// at most [`QUOTA_FULL_MARGIN_BYTES`]) free.
fn quota_is_full(volume: &Volume, used_bytes: u64) -> bool {
    let capacity = volume.capacity_bytes;
    let margin = (capacity / 50).min(QUOTA_FULL_MARGIN_BYTES);
    volume.quota_enforced && capacity > 0 && used_bytes.saturating_add(margin) >= capacity
}

fn quota_full_message(dir: &str) -> String {
    format!("{dir} uses all of its quota: writes that need space fail")
}

/// RFC 3339 UTC, as the rest of the API writes times.
pub(crate) fn rfc3339(at: SystemTime) -> String {
    OffsetDateTime::from(at)
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The repairs of `pass`: each volume whose export it served again, found missing at
/// the pass's listing and served again when its comparison ended.
pub(crate) fn repairs_of(
    pass: &Pass,
    nfs_of: impl Fn(&VolumePath) -> String,
) -> Vec<(VolumePath, RepairedCondition)> {
    let Some(Ok(restored)) = &pass.exports else {
        return Vec::new();
    };
    restored
        .re_added
        .iter()
        .map(|volume| {
            (
                volume.clone(),
                RepairedCondition {
                    reason: AbnormalReason::NotExported,
                    message: format!(
                        "the NFS server had stopped serving {}; the agent exported it again",
                        nfs_of(volume)
                    ),
                    found_at: rfc3339(pass.started_at),
                    repaired_at: rfc3339(pass.compared_at),
                },
            )
        })
        .collect()
}

/// The volumes' conditions, as the last pass found them, and the repairs.
pub(crate) struct Conditions {
    store: Arc<VolumeStore>,
    exports: Arc<Exports>,
    usage: Arc<UsageCache>,
    metrics: ConditionMetrics,
    /// Exports the last comparison found missing and could not serve again, with the
    /// time a pass first found each so.
    unserved: ArcSwap<BTreeMap<VolumePath, SystemTime>>,
    /// What the passes remember of volumes, changed in place: a delete costs a lookup,
    /// not a copy of every volume.
    memory: Mutex<Memory>,
}

/// What the passes remember, under one brief lock.
#[derive(Debug, Default)]
struct Memory {
    /// Each volume the last pass found, as found (its condition included): a volume
    /// that is gone or unreadable since is still answered for with its condition.
    known: BTreeMap<VolumePath, Volume>,
    /// Volumes deleted or archived since the current pass listed them.
    forgotten: BTreeSet<VolumePath>,
    /// The newest repair of each volume.
    repaired: BTreeMap<VolumePath, RepairedCondition>,
}

impl std::fmt::Debug for Conditions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conditions")
            .field("known", &self.memory().known.len())
            .finish_non_exhaustive()
    }
}

impl Conditions {
    pub(crate) fn new(
        store: Arc<VolumeStore>,
        exports: Arc<Exports>,
        usage: Arc<UsageCache>,
        metrics: ConditionMetrics,
    ) -> Self {
        Self {
            store,
            exports,
            usage,
            metrics,
            unserved: ArcSwap::default(),
            memory: Mutex::default(),
        }
    }

    fn memory(&self) -> MutexGuard<'_, Memory> {
        self.memory.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn dir_of(&self, path: &VolumePath) -> String {
        self.store
            .root_path()
            .join(path.as_str())
            .display()
            .to_string()
    }

    fn nfs_of(&self, path: &VolumePath) -> String {
        self.exports
            .get(path)
            .map_or_else(|| self.dir_of(path), |export| export.path)
    }

    /// The condition of `volume` now: its filesystem looked at (blocking: call off the
    /// async workers), the rest as of the last pass.
    pub(crate) fn condition_of(&self, volume: &Volume) -> VolumeCondition {
        let looked = self.store.look(&volume.path);
        self.condition_with(volume, looked)
    }

    fn condition_with(&self, volume: &Volume, looked: Looked) -> VolumeCondition {
        let quota_full = self
            .usage
            .peek(&volume.path)
            .is_some_and(|usage| quota_is_full(volume, usage.used_bytes));
        let facts = Facts {
            looked: Some(looked),
            quota_full,
            unserved: self.unserved.load().contains_key(&volume.path),
        };
        let mut condition = match judge(
            &facts,
            || self.dir_of(&volume.path),
            || self.nfs_of(&volume.path),
        ) {
            Some((reason, message)) => VolumeCondition::abnormal(reason, message),
            None => VolumeCondition::normal(),
        };
        condition.repaired = self.memory().repaired.get(&volume.path).cloned();
        condition
    }

    /// Fills in `volume.condition` (blocking).
    pub(crate) fn describe(&self, volume: &mut Volume) {
        volume.condition = Some(self.condition_of(volume));
    }

    /// Brings `volume.condition` up to date with a usage figure measured after it was
    /// judged (`volume.usage`): a quota that filled since is reported now, not at the
    /// next look, where no reason that comes first holds.
    pub(crate) fn with_usage(&self, volume: &mut Volume) {
        let Some(used) = volume.usage.map(|usage| usage.used_bytes) else {
            return;
        };
        let full = quota_is_full(volume, used);
        let message = quota_full_message(&self.dir_of(&volume.path));
        let Some(condition) = volume.condition.as_mut() else {
            return;
        };
        let outranked = condition
            .abnormal
            .is_some_and(|reason| reason != AbnormalReason::NotExported);
        if full && !outranked {
            condition.abnormal = Some(AbnormalReason::QuotaFull);
            condition.message = message;
        }
    }

    /// A volume the store no longer finds (or cannot read) that the last pass knew, with
    /// its condition now: `None` when it is normal again or was never known.
    pub(crate) fn lost(&self, path: &VolumePath) -> Option<Volume> {
        let mut volume = self.memory().known.get(path).cloned()?;
        let condition = self.condition_of(&volume);
        if condition.is_normal() {
            return None;
        }
        volume.condition = Some(condition);
        Some(volume)
    }

    /// The volumes the last pass knew with paths after `after` and up to `until` (both
    /// ends open when absent) that `listed` lacks and that are abnormal now: gone from the
    /// store's listing (missing, unreadable), which a listing shows as a GET does.
    pub(crate) fn lost_between(
        &self,
        after: Option<&VolumePath>,
        until: Option<&VolumePath>,
        listed: &BTreeSet<&VolumePath>,
    ) -> Vec<Volume> {
        use std::ops::Bound;
        let lower = after.map_or(Bound::Unbounded, Bound::Excluded);
        let upper = until.map_or(Bound::Unbounded, Bound::Included);
        let unlisted: Vec<VolumePath> = self
            .memory()
            .known
            .range::<VolumePath, _>((lower, upper))
            .map(|(path, _)| path)
            .filter(|path| !listed.contains(path))
            .cloned()
            .collect();
        unlisted.iter().filter_map(|path| self.lost(path)).collect()
    }

    /// Forgets `path` as a volume (deleted, archived): gone now is not missing, and a
    /// volume made at the same path later has no repairs of its own yet.
    pub(crate) fn forget(&self, path: &VolumePath) {
        let mut memory = self.memory();
        memory.forgotten.insert(path.clone());
        memory.known.remove(path);
        memory.repaired.remove(path);
    }

    /// Records the repairs an export restore made at start.
    pub(crate) fn note_repairs(&self, repairs: Vec<(VolumePath, RepairedCondition)>) {
        if repairs.is_empty() {
            return;
        }
        self.memory().repaired.extend(repairs);
    }

    /// One pass over every volume: the export comparison's findings recorded, then each
    /// volume the store lists (and each known one it no longer does) looked at.
    pub(crate) fn check_all(&self, pass: &Pass) {
        let started = Instant::now();
        self.memory().forgotten.clear();
        let mut repairs = repairs_of(pass, |path| self.nfs_of(path));
        if let Some(Ok(restored)) = &pass.exports {
            let before = self.unserved.load_full();
            // Served again after passes that could not: found when the first of them was.
            for (volume, repair) in &mut repairs {
                if let Some(found) = before.get(volume) {
                    repair.found_at = rfc3339(*found);
                }
            }
            let unserved = restored
                .unserved
                .iter()
                .map(|volume| {
                    let found = before.get(volume).copied().unwrap_or(pass.started_at);
                    (volume.clone(), found)
                })
                .collect();
            self.unserved.store(Arc::new(unserved));
        }
        self.note_repairs(repairs);
        let mut found: BTreeMap<VolumePath, Volume> = match self.store.list(None) {
            Ok((volumes, _)) => volumes.into_iter().map(|v| (v.path.clone(), v)).collect(),
            Err(error) => {
                tracing::warn!(%error, "the volumes could not be listed; their conditions are checked as last known");
                BTreeMap::new()
            }
        };
        // Known before and not listed now (gone, or the listing failed), and exported
        // volumes: still volumes of the agent's, whose condition says what happened.
        // Only those the listing lacks are copied (few: the gone ones); requests meanwhile
        // still find what the last pass knew.
        {
            let memory = self.memory();
            for (path, volume) in &memory.known {
                if !found.contains_key(path) {
                    found.insert(path.clone(), volume.clone());
                }
            }
        }
        for volume in found.values_mut() {
            let condition = self.condition_of(volume);
            volume.condition = Some(condition);
        }
        let volumes = {
            let mut memory = self.memory();
            let forgotten = std::mem::take(&mut memory.forgotten);
            found.retain(|path, _| !forgotten.contains(path));
            memory.known = found;
            memory.known.len()
        };
        let mut counts: BTreeMap<AbnormalReason, i64> = BTreeMap::new();
        for reason in self
            .memory()
            .known
            .values()
            .filter_map(|volume| volume.condition.as_ref()?.abnormal)
        {
            *counts.entry(reason).or_default() += 1;
        }
        for reason in AbnormalReason::ALL {
            self.metrics
                .abnormal
                .get_or_create(&ConditionLabels {
                    reason: reason.as_str(),
                })
                .set(counts.get(&reason).copied().unwrap_or(0));
        }
        self.metrics.volumes.set(volumes as i64);
        self.metrics
            .pass_seconds
            .observe(started.elapsed().as_secs_f64());
        if !counts.is_empty() {
            tracing::debug!(?counts, volumes, "volumes abnormal");
        }
    }
}

impl PassStep for Conditions {
    fn run(&self, pass: &Pass) {
        self.check_all(pass);
    }
}

/// The step of the pass, shared with the API.
pub(crate) fn step(conditions: &Arc<Conditions>) -> Arc<dyn PassStep> {
    conditions.clone()
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::exports::Restored;
    use crate::store::Found;

    use super::*;

    fn present(read_only: bool, full: bool, servable: bool) -> Option<Looked> {
        Some(Looked::Present(Found {
            read_only,
            own_filesystem_full: full,
            servable,
        }))
    }

    fn reason(facts: Facts) -> Option<AbnormalReason> {
        judge(
            &facts,
            || "/srv/nfs/ns/claim".into(),
            || "/exports/ns/claim".into(),
        )
        .map(|(reason, _)| reason)
    }

    #[test]
    fn the_reasons_that_hold_are_reported_in_their_order_of_precedence() {
        let all = Facts {
            looked: Some(Looked::Failing("Input/output error".into())),
            quota_full: true,
            unserved: true,
        };
        assert_eq!(reason(all.clone()), Some(AbnormalReason::FilesystemError));
        let absent = Facts {
            looked: Some(Looked::Absent),
            ..all.clone()
        };
        assert_eq!(reason(absent), Some(AbnormalReason::Missing));
        let unmounted = Facts {
            looked: present(true, true, false),
            ..all.clone()
        };
        assert_eq!(reason(unmounted), Some(AbnormalReason::Missing));
        let read_only = Facts {
            looked: present(true, true, true),
            ..all.clone()
        };
        assert_eq!(reason(read_only), Some(AbnormalReason::ReadOnly));
        let full = Facts {
            looked: present(false, true, true),
            quota_full: false,
            unserved: true,
        };
        assert_eq!(reason(full), Some(AbnormalReason::QuotaFull));
        let over_quota = Facts {
            looked: present(false, false, true),
            quota_full: true,
            unserved: true,
        };
        assert_eq!(reason(over_quota), Some(AbnormalReason::QuotaFull));
        let unserved = Facts {
            looked: present(false, false, true),
            quota_full: false,
            unserved: true,
        };
        assert_eq!(reason(unserved), Some(AbnormalReason::NotExported));
        let fine = Facts {
            looked: present(false, false, true),
            ..Facts::default()
        };
        assert_eq!(reason(fine), None);
    }

    #[test]
    fn a_quota_is_full_within_two_percent_of_its_capacity_at_most_16_mib() {
        let volume = |capacity_bytes: u64, quota_enforced: bool| Volume {
            capacity_bytes,
            quota_enforced,
            ..serde_json::from_value(serde_json::json!({
                "path": "ns/claim", "mode": "0777", "uid": 0, "gid": 0,
                "capacity_bytes": 0, "created_at": "",
            }))
            .unwrap()
        };
        let small = volume(10 << 20, true);
        // btrfs refused a write here, 32 KiB short of the limit.
        assert!(quota_is_full(&small, 10_452_992));
        assert!(!quota_is_full(&small, 9 << 20));
        let large = volume(100 << 30, true);
        assert!(quota_is_full(&large, (100 << 30) - (16 << 20)));
        assert!(!quota_is_full(&large, (100 << 30) - (17 << 20)));
        assert!(
            !quota_is_full(&volume(10 << 20, false), 10 << 20),
            "a capacity nothing enforces is never full"
        );
        assert!(!quota_is_full(&volume(0, true), 0));
    }

    #[test]
    fn each_message_names_the_directory_or_the_path_clients_mount() {
        let (_, message) = judge(
            &Facts {
                looked: Some(Looked::Absent),
                ..Facts::default()
            },
            || "/srv/nfs/ns/claim".into(),
            || "/exports/ns/claim".into(),
        )
        .unwrap();
        assert_eq!(
            message,
            "the directory /srv/nfs/ns/claim is gone from the NFS server"
        );
        let (_, message) = judge(
            &Facts {
                unserved: true,
                ..Facts::default()
            },
            || "/srv/nfs/ns/claim".into(),
            || "/exports/ns/claim".into(),
        )
        .unwrap();
        assert!(message.contains("/exports/ns/claim"), "{message}");
    }

    #[test]
    fn a_pass_that_served_exports_again_records_each_as_repaired_between_its_start_and_end() {
        let volume = VolumePath::parse("ns/claim").unwrap();
        let started_at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let pass = Pass {
            exports: Some(Ok(Restored {
                added: 1,
                re_added: vec![volume.clone()],
                ..Restored::default()
            })),
            started_at,
            compared_at: started_at + Duration::from_secs(2),
            took: Duration::from_secs(2),
        };
        let repairs = repairs_of(&pass, |path| format!("/exports/{path}"));
        assert_eq!(repairs.len(), 1);
        let (repaired, record) = &repairs[0];
        assert_eq!(repaired, &volume);
        assert_eq!(record.reason, AbnormalReason::NotExported);
        assert_eq!(record.found_at, "2027-01-15T08:00:00Z");
        assert_eq!(record.repaired_at, "2027-01-15T08:00:02Z");
        assert!(
            record.message.contains("/exports/ns/claim"),
            "{}",
            record.message
        );

        let failed = Pass {
            exports: Some(Err("no answer".into())),
            ..pass.clone()
        };
        assert!(repairs_of(&failed, |path| path.to_string()).is_empty());
        let not_compared = Pass {
            exports: None,
            ..pass
        };
        assert!(repairs_of(&not_compared, |path| path.to_string()).is_empty());
    }
}
