//! Snapshots: a volume's content at one point in time, kept in the agent's own area
//! beneath the root (`.nfsprov/snapshots`, mode 0700), outside every volume, so no
//! volume path, export or tenant ever reaches one. A snapshot is named by a
//! [`SnapshotName`], always one plain directory entry.
//!
//! The area holds two directories: `data`, one entry per snapshot (its tree), and
//! `records`, one `<name>.json` per snapshot (source, method, time, restore size, size:
//! what it referenced when taken). A snapshot is ready exactly when its record exists: the record is written
//! last, after the tree is complete, synced and in place, and removed first when the
//! snapshot is deleted. Whatever a crash leaves (a tree being made, a tree without a
//! record, a tree being removed) is never listed, and is renamed aside when the store
//! opens and removed in the background.
//!
//! How each is made, the fastest exact way the source allows:
//! - a ZFS snapshot of a dataset volume, kept by ZFS (its record only is in the area;
//!   what becomes of it when its source is deleted or archived is in `backend::zfs::kept`);
//! - a read-only btrfs snapshot of a subvolume volume (every volume a btrfs quota limits).
//!   Such a snapshot cannot be renamed into another directory, so it is made in `data`
//!   under a name no snapshot can have (a leading `.`) and renamed to its own name there;
//! - otherwise the tree copied by the clone engine, by reflinks where the filesystem
//!   shares extents, with owners, modes, links, holes and times kept.
//!
//! How snapshots count against quota: a btrfs snapshot is a subvolume with a qgroup of
//! its own and no limit, so what only it holds is charged to it, never to its source's
//! limit (its exclusive bytes are reported); a reflink or copy lies in the agent's area,
//! outside every volume's subvolume or project, so no volume's quota is charged for it;
//! a ZFS snapshot's space is charged to its dataset's `used`, never to the volume's
//! `refquota` (its exclusive bytes are its `used`).
//! Either way a snapshot takes space of the filesystem, which the agent's readiness
//! checks watch like any other, and which no volume's quota bounds. What bounds it is
//! the snapshots' own budget: each is charged what it references when taken (the most it
//! can ever hold alone) to its source claim's namespace, and a namespace's snapshots
//! stop at `limits.max_snapshot_bytes_per_namespace` ([`SnapshotBudget`]).
//!
//! A snapshot outlives its source: it shares no entry with it (a btrfs snapshot is a
//! subvolume of its own, a copy is a copy), so deleting or archiving the source leaves
//! the snapshot, and every volume restored from it, as it is.

use std::io::Write;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nfsprov_api_types::{
    PageRequest, RestoreSource, RestoreVolumeRequest, Snapshot, SnapshotMethod, SnapshotName,
    Volume, VolumePath,
};
use rustix::fs::{AtFlags, Mode, OFlags, RenameFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use super::backend::{CloneSource, KnownQuota, Layout, VolumeBackend};
use super::confine::{Root, STATE_DIR, list_dir, open_child};
use super::durable::Changes;
use super::error::{Result, StoreError, io_error, not_found};
use super::record::{VolumeRecord, now_rfc3339};
use super::snapshot_budget::SnapshotBudget;
use super::tree::measure_tree;
use super::{
    Created, Deleted, NewVolume, Origin, PathGuard, VolumeStore, confirm_made, record_as_found,
};
use crate::holds;
use crate::store::copy::CopyProgress;

/// The snapshot area, in the agent's state directory.
pub(crate) const SNAPSHOTS_DIR: &str = "snapshots";
const DATA_DIR: &str = "data";
const RECORDS_DIR: &str = "records";
const RECORD_SUFFIX: &str = ".json";
/// Prefix of a tree being made, removed, or left by a crash: snapshot names never start
/// with a `.`, so none of these is ever taken for a snapshot.
const MAKING: &str = ".making";
const REMOVING: &str = ".removing";
const STALE: &str = ".stale";
/// Prefix of a replica being received: never listed, and kept when the store opens, so a
/// receive cut by a crash or a lost connection resumes with what it had.
const RECEIVING: &str = ".receiving-";
/// A record is a few hundred bytes; anything much larger is not one the agent wrote.
const MAX_RECORD_BYTES: usize = 16 * 1024;

/// Where a snapshot being taken asks whether it is still wanted. A delete answered
/// before then holds: from there on nothing more is made or recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// It has no record: it is about to be made.
    Making,
    /// It is made: it is about to be placed and recorded.
    Recording,
}

/// The answer to the taking of a snapshot deleted meanwhile.
pub(crate) fn deleted_while_taken(name: &SnapshotName) -> StoreError {
    StoreError::NotFound(format!(
        "snapshot {name} was deleted while it was being taken"
    ))
}

/// What the agent keeps of each ready snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct SnapshotRecord {
    source: VolumePath,
    method: SnapshotMethod,
    created_at: String,
    restore_size_bytes: u64,
    size_bytes: u64,
    /// The namespace the snapshot is charged to ([`SnapshotBudget`]); absent in records
    /// written before snapshots were charged, which count with their source's owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    namespace: Option<String>,
    /// Where a replica was received from; absent for a snapshot taken here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    replica_of: Option<ReplicaOrigin>,
}

/// The snapshot of another agent a replica holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaOrigin {
    /// The source agent's URL.
    pub source_url: String,
    pub source_snapshot: SnapshotName,
}

impl SnapshotRecord {
    fn to_snapshot(&self, name: &SnapshotName, exclusive_bytes: Option<u64>) -> Snapshot {
        Snapshot {
            name: name.clone(),
            source: self.source.clone(),
            method: self.method,
            ready: true,
            created_at: self.created_at.clone(),
            restore_size_bytes: self.restore_size_bytes,
            size_bytes: Some(self.size_bytes),
            exclusive_bytes,
        }
    }
}

/// The area's two directories, opened beneath the root without following links.
struct Area {
    data: OwnedFd,
    records: OwnedFd,
}

/// A directory only the agent may enter, whatever the umask or an earlier run left.
fn private_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd> {
    match rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(io_error(format!("create the snapshot area's {name}"), e)),
    }
    let dir = open_child(parent, name, false)?;
    rustix::fs::fchmod(&dir, Mode::from_raw_mode(0o700))
        .map_err(|e| io_error(format!("restrict the snapshot area's {name}"), e))?;
    Ok(dir)
}

impl Area {
    /// Opens the area, making it when missing.
    fn open(root: &Root) -> Result<Self> {
        let state = root.open_internal(&[STATE_DIR], true)?;
        let top = private_dir(state.as_fd(), SNAPSHOTS_DIR)?;
        Ok(Self {
            data: private_dir(top.as_fd(), DATA_DIR)?,
            records: private_dir(top.as_fd(), RECORDS_DIR)?,
        })
    }

    fn record_name(name: &SnapshotName) -> String {
        format!("{name}{RECORD_SUFFIX}")
    }

    /// The record of snapshot `name`: `None` when it has none (it does not exist, or is
    /// not ready).
    fn read(&self, name: &SnapshotName) -> Result<Option<SnapshotRecord>> {
        let file = match rustix::fs::openat(
            &self.records,
            Self::record_name(name).as_str(),
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(file) => file,
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(io_error(format!("open the record of snapshot {name}"), e)),
        };
        let mut bytes = Vec::new();
        let mut buffer = [0u8; 4096];
        loop {
            let n = rustix::io::read(&file, &mut buffer)
                .map_err(|e| io_error(format!("read the record of snapshot {name}"), e))?;
            if n == 0 {
                break;
            }
            bytes.extend_from_slice(&buffer[..n]);
            if bytes.len() > MAX_RECORD_BYTES {
                return Err(StoreError::Conflict(format!(
                    "the record of snapshot {name} is larger than any the agent writes; refusing to use it"
                )));
            }
        }
        serde_json::from_slice(&bytes).map(Some).map_err(|e| {
            StoreError::Conflict(format!(
                "the record of snapshot {name} cannot be read ({e}); refusing to use it"
            ))
        })
    }

    /// Writes the record of `name` so that it survives a power cut once this returns:
    /// written and synced under a temporary name, renamed into place, the directory synced.
    fn write(&self, name: &SnapshotName, record: &SnapshotRecord) -> Result<()> {
        let failed = |e| io_error(format!("write the record of snapshot {name}"), e);
        let encoded = serde_json::to_vec(record).map_err(|e| StoreError::Io {
            context: format!("encode the record of snapshot {name}"),
            source: std::io::Error::other(e),
        })?;
        let temporary = format!(".new-{name}");
        let _ = rustix::fs::unlinkat(&self.records, temporary.as_str(), AtFlags::empty());
        let file = rustix::fs::openat(
            &self.records,
            temporary.as_str(),
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(failed)?;
        let mut file = std::fs::File::from(file);
        file.write_all(&encoded)
            .and_then(|()| file.sync_all())
            .map_err(|e| StoreError::Io {
                context: format!("write the record of snapshot {name}"),
                source: e,
            })?;
        drop(file);
        rustix::fs::renameat(
            &self.records,
            temporary.as_str(),
            &self.records,
            Self::record_name(name).as_str(),
        )
        .map_err(failed)?;
        rustix::fs::fsync(&self.records).map_err(failed)
    }

    /// Removes the record of `name`, durably; whether there was one.
    fn remove_record(&self, name: &SnapshotName) -> Result<bool> {
        let removed = match rustix::fs::unlinkat(
            &self.records,
            Self::record_name(name).as_str(),
            AtFlags::empty(),
        ) {
            Ok(()) => true,
            Err(Errno::NOENT) => false,
            Err(e) => return Err(io_error(format!("remove the record of snapshot {name}"), e)),
        };
        rustix::fs::fsync(&self.records)
            .map_err(|e| io_error(format!("remove the record of snapshot {name}"), e))?;
        Ok(removed)
    }

    /// The names of every snapshot with a record, sorted.
    fn names(&self) -> Result<Vec<SnapshotName>> {
        let mut names: Vec<SnapshotName> = list_dir(self.records.as_fd())
            .map_err(|e| io_error("list the snapshots", e))?
            .into_iter()
            .filter_map(|(entry, _)| SnapshotName::parse(entry.strip_suffix(RECORD_SUFFIX)?).ok())
            .collect();
        names.sort();
        Ok(names)
    }

    fn has_tree(&self, name: &str) -> bool {
        rustix::fs::statat(&self.data, name, AtFlags::SYMLINK_NOFOLLOW).is_ok()
    }
}

impl VolumeStore {
    /// Waits until no other request works on snapshot `name`. Its key cannot be a volume
    /// path's (those never start with a `.`), and sorts before every one, so a request
    /// that also locks a path takes the snapshot's lock first, as every other does.
    pub async fn lock_snapshot(&self, name: &SnapshotName) -> PathGuard {
        self.locks.lock(&format!(".{SNAPSHOTS_DIR}/{name}")).await
    }

    /// Whether this store can take snapshots: every backend can.
    pub fn takes_snapshots(&self) -> bool {
        true
    }

    /// The method a snapshot that is still being made will most likely end with (an
    /// instant btrfs snapshot is never seen being made).
    pub fn copy_snapshot_method(&self) -> SnapshotMethod {
        if self.backend.layout() == Layout::Mounts {
            return SnapshotMethod::ZfsSnapshot;
        }
        let reflink = Area::open(&self.root)
            .is_ok_and(|area| super::copy::reflink_supported(area.data.as_fd()));
        if reflink {
            SnapshotMethod::Reflink
        } else {
            SnapshotMethod::Copy
        }
    }

    /// Takes the snapshot `name` of the volume `source`, or finds it taken already (the
    /// same source; another source is a conflict). Callers hold the locks of `name` and
    /// `source`, in that order. `wanted` is asked at each `Stage`; once it says no,
    /// what was made goes and nothing is recorded.
    pub fn take_snapshot(
        &self,
        name: &SnapshotName,
        source: &VolumePath,
        progress: &CopyProgress,
        wanted: &dyn Fn(Stage) -> bool,
    ) -> Result<(Snapshot, Created)> {
        self.root.ensure_present()?;
        if !self.takes_snapshots() {
            return Err(StoreError::Unsupported(format!(
                "snapshot {name}: this agent's {} volumes cannot be snapshotted",
                self.backend.kind()
            )));
        }
        let area = Area::open(&self.root)?;
        let mounts = self.backend.layout() == Layout::Mounts;
        if let Some(record) = area.read(name)? {
            if record.source != *source {
                return Err(StoreError::Conflict(format!(
                    "snapshot {name} exists already, of {} (requested of {source})",
                    record.source
                )));
            }
            // Perhaps a retry of a snapshot whose last sync failed: confirmed once durable.
            let mut changes = Changes::new();
            changes.dir(area.data.as_fd())?.dir(area.records.as_fd())?;
            self.durable.commit(changes)?;
            let exclusive = self.exclusive_bytes(&area, name);
            return Ok((record.to_snapshot(name, exclusive), Created::Existing));
        }
        // Its absence made durable first (a failed delete may have left an unlink
        // unsynced): a delete settled while it is made is answered on it.
        let mut unrecorded = Changes::new();
        unrecorded.dir(area.records.as_fd())?;
        self.durable.commit(unrecorded)?;
        if !wanted(Stage::Making) {
            return Err(deleted_while_taken(name));
        }
        if area.has_tree(name.as_str()) {
            // A tree without a record: what a crash left between placing it and
            // recording it. It is no snapshot; it goes before a new one is made.
            self.backend
                .remove(area.data.as_fd(), name.as_str(), None, KnownQuota::Unknown)?;
        }
        if mounts && self.backend.kept_snapshots()?.contains_key(name.as_str()) {
            // Likewise for a kept snapshot taken but never recorded.
            self.backend.drop_kept_snapshot(name)?;
        }
        let Some((source_parent, source_record)) = self.locate(source)? else {
            return Err(StoreError::NotFound(format!(
                "snapshot {name}: the source volume {source} does not exist; nothing was taken"
            )));
        };
        let namespace = charged_namespace(&source_record);
        self.snapshot_budget.check_room(name, &namespace)?;
        if mounts {
            // Taken and recorded at once: nothing is made before.
            if !wanted(Stage::Recording) {
                return Err(deleted_while_taken(name));
            }
            return self.take_kept_snapshot(&area, name, source, &source_record, namespace);
        }
        self.refuse_mount_points(
            &format_args!("snapshot {name}: the source volume {source}"),
            source.as_str(),
            "snapshot",
        )?;
        let source_dir = open_child(source_parent.as_fd(), source.file_name(), false)?;
        let clone_source = CloneSource {
            path: source,
            dir: source_dir.as_fd(),
            record: &source_record,
        };
        let created_at = now_rfc3339();
        let making = self.unique_name(MAKING);
        let made = self
            .backend
            .snapshot(&clone_source, area.data.as_fd(), &making, progress)
            // Written back before it is placed: a size committed ahead of its data
            // would read back as zeros.
            .and_then(|method| self.durable.sync_filesystem().map(|()| method))
            .and_then(|method| {
                let dir = open_child(area.data.as_fd(), &making, false)?;
                let size = self.snapshot_size(dir.as_fd(), method, &source_record, name)?;
                Ok((method, size))
            });
        let (method, size_bytes) = match made {
            Ok(made) => made,
            Err(e) => {
                self.discard(&area, &making, name);
                return Err(e);
            }
        };
        let charge = match self.snapshot_budget.charge(name, &namespace, size_bytes) {
            Ok(charge) => charge,
            Err(e) => {
                self.discard(&area, &making, name);
                return Err(e);
            }
        };
        holds::wait_if_asked(holds::SNAPSHOTS);
        if !wanted(Stage::Recording) {
            self.discard(&area, &making, name);
            return Err(deleted_while_taken(name));
        }
        if let Err(e) = rustix::fs::renameat_with(
            &area.data,
            making.as_str(),
            &area.data,
            name.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            self.discard(&area, &making, name);
            return Err(io_error(format!("place snapshot {name}"), e));
        }
        // Durable before the record is: on btrfs a subvolume's rename is committed only
        // with the filesystem's transaction, which the store's commit forces there.
        let mut placed = Changes::new();
        placed.dir(area.data.as_fd())?;
        self.durable.commit(placed)?;
        let record = SnapshotRecord {
            source: source.clone(),
            method,
            created_at,
            restore_size_bytes: source_record.capacity_bytes,
            size_bytes,
            namespace: Some(namespace),
            replica_of: None,
        };
        area.write(name, &record)?;
        charge.keep();
        let exclusive = self.exclusive_bytes(&area, name);
        Ok((record.to_snapshot(name, exclusive), Created::New))
    }

    /// What a snapshot just made in the area references (its `size_bytes`). A btrfs
    /// snapshot's qgroup counts it already (data and metadata, shared extents included),
    /// so its tree is not walked; should the qgroup not answer (quotas switched off since
    /// the agent started), its source's capacity stands in, what its source's limit let it
    /// hold. A reflink or copy was written file by file anyway: its tree is measured.
    fn snapshot_size(
        &self,
        dir: BorrowedFd<'_>,
        method: SnapshotMethod,
        source: &VolumeRecord,
        name: &SnapshotName,
    ) -> Result<u64> {
        if method == SnapshotMethod::BtrfsSnapshot {
            return Ok(match self.backend.snapshot_referenced_bytes(dir) {
                Some(bytes) => bytes,
                None => {
                    tracing::warn!(snapshot = %name, capacity_bytes = source.capacity_bytes, "no qgroup figure for a btrfs snapshot; its source's capacity is recorded as its size");
                    source.capacity_bytes
                }
            });
        }
        Ok(measure_tree(dir)
            .map_err(|e| io_error(format!("measure snapshot {name}"), e))?
            .usage
            .used_bytes)
    }

    /// A snapshot the storage keeps itself, recorded once it is taken.
    fn take_kept_snapshot(
        &self,
        area: &Area,
        name: &SnapshotName,
        source: &VolumePath,
        source_record: &VolumeRecord,
        namespace: String,
    ) -> Result<(Snapshot, Created)> {
        let created_at = now_rfc3339();
        let promised = if self.backend.snapshots_hold_capacity() {
            source_record.capacity_bytes
        } else {
            0
        };
        let promise = self.reserve(source, promised)?;
        let method = self.backend.take_kept_snapshot(source, name)?;
        let recorded = self
            .backend
            .kept_snapshot_of(source, name)?
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "snapshot {name} of {source} was taken but is not listed; retry"
                ))
            })
            .and_then(|kept| {
                let size_bytes = kept.referenced.unwrap_or(0);
                let charge = self.snapshot_budget.charge(name, &namespace, size_bytes)?;
                let record = SnapshotRecord {
                    source: source.clone(),
                    method,
                    created_at,
                    restore_size_bytes: source_record.capacity_bytes,
                    size_bytes,
                    namespace: Some(namespace),
                    replica_of: None,
                };
                area.write(name, &record)?;
                promise.keep();
                charge.keep();
                Ok(record.to_snapshot(name, kept.used))
            });
        match recorded {
            Ok(snapshot) => Ok((snapshot, Created::New)),
            Err(e) => {
                if let Err(error) = self.backend.drop_kept_snapshot(name) {
                    tracing::warn!(snapshot = %name, %error, "could not remove a snapshot that was not recorded; it goes when the name is taken again or at the next start");
                }
                Err(e)
            }
        }
    }

    /// Removes a tree that did not become a snapshot; what cannot be removed now goes
    /// at the next start.
    fn discard(&self, area: &Area, entry: &str, name: &SnapshotName) {
        if let Err(error) = self
            .backend
            .remove(area.data.as_fd(), entry, None, KnownQuota::Unknown)
        {
            tracing::warn!(snapshot = %name, %error, "could not remove a failed snapshot; it goes at the next start");
        }
    }

    fn exclusive_bytes(&self, area: &Area, name: &SnapshotName) -> Option<u64> {
        if self.backend.layout() == Layout::Mounts {
            return match self.backend.kept_snapshots() {
                Ok(mut kept) => kept.remove(name.as_str()).and_then(|k| k.used),
                Err(error) => {
                    tracing::warn!(snapshot = %name, %error, "could not read a snapshot's exclusive bytes");
                    None
                }
            };
        }
        let dir = open_child(area.data.as_fd(), name.as_str(), false).ok()?;
        self.backend.snapshot_exclusive_bytes(dir.as_fd())
    }

    /// The ready snapshot `name`, if there is one.
    pub fn snapshot(&self, name: &SnapshotName) -> Result<Option<Snapshot>> {
        let area = Area::open(&self.root)?;
        Ok(area
            .read(name)?
            .map(|record| record.to_snapshot(name, self.exclusive_bytes(&area, name))))
    }

    /// One page of ready snapshots in name order (those after its cursor, at most its
    /// limit) and the cursor of the next page (the page's last name) when more may
    /// follow; without a page, all of them.
    pub fn list_snapshots(
        &self,
        page: Option<&PageRequest<SnapshotName>>,
    ) -> Result<(Vec<Snapshot>, Option<String>)> {
        let after = page.and_then(|page| page.after.as_ref());
        let limit = page.map(|page| page.limit);
        let area = Area::open(&self.root)?;
        let mut names: Vec<SnapshotName> = area
            .names()?
            .into_iter()
            .filter(|name| after.is_none_or(|after| name > after))
            .collect();
        let more = limit.is_some_and(|limit| names.len() > limit);
        if let Some(limit) = limit {
            names.truncate(limit);
        }
        // Kept snapshots' figures in one listing, not one per snapshot.
        let mut kept = match self.backend.layout() {
            Layout::Mounts if !names.is_empty() => Some(self.backend.kept_snapshots()?),
            _ => None,
        };
        let mut page = Vec::with_capacity(names.len());
        for name in &names {
            // Deleted since the listing, or unreadable: not a snapshot to show.
            match area.read(name) {
                Ok(Some(record)) => {
                    let exclusive = match kept.as_mut() {
                        Some(kept) => kept.remove(name.as_str()).and_then(|k| k.used),
                        None => self.exclusive_bytes(&area, name),
                    };
                    page.push(record.to_snapshot(name, exclusive));
                }
                Ok(None) => {}
                Err(error) => {
                    tracing::warn!(snapshot = %name, %error, "snapshot left out of a listing")
                }
            }
        }
        let next = more
            .then(|| names.last().map(ToString::to_string))
            .flatten();
        Ok((page, next))
    }

    /// The capacity the kept snapshots promise, where they may come to hold their
    /// source's whole capacity ([`VolumeBackend::snapshots_hold_capacity`]).
    pub(super) fn snapshot_promises(&self) -> Result<u64> {
        if !self.backend.snapshots_hold_capacity() {
            return Ok(0);
        }
        let area = Area::open(&self.root)?;
        let mut bytes = 0u64;
        for name in area.names()? {
            if let Some(record) = area.read(&name)? {
                bytes = bytes.saturating_add(record.restore_size_bytes);
            }
        }
        Ok(bytes)
    }

    /// Counts what every snapshot holds at most against its namespace, from the records,
    /// once, before the store serves, and bounds new snapshots by `limit` bytes per
    /// namespace ([`SnapshotBudget`]). A store not counted (the crate's tests) counts from
    /// zero without a limit.
    pub fn count_snapshots(mut self, limit: Option<u64>) -> Result<Self> {
        let budget = SnapshotBudget::new(limit);
        let area = Area::open(&self.root)?;
        for name in area.names()? {
            // One unreadable record must not stop the agent: it is left out of listings
            // as well, and its snapshot cannot be restored from until it is mended.
            let record = match area.read(&name) {
                Ok(Some(record)) => record,
                Ok(None) => continue,
                Err(error) => {
                    tracing::warn!(snapshot = %name, %error, "snapshot not counted against its namespace");
                    continue;
                }
            };
            // A replica belongs to no claim of this agent's cluster: no namespace's
            // budget holds it (it is not charged when received either).
            if record.replica_of.is_some() {
                continue;
            }
            let namespace = match record.namespace {
                Some(namespace) => namespace,
                // Taken before snapshots were charged: its source's owner, while the
                // source is there.
                None => match self.locate(&record.source) {
                    Ok(found) => found
                        .map(|(_, source)| charged_namespace(&source))
                        .unwrap_or_default(),
                    Err(error) => {
                        tracing::warn!(snapshot = %name, source = %record.source, %error, "the source of a snapshot recorded without a namespace cannot be read; counted without one");
                        String::new()
                    }
                },
            };
            budget.count(&name, &namespace, record.size_bytes);
        }
        self.snapshot_budget = budget;
        Ok(self)
    }

    /// What the snapshots of each namespace hold at most, and their limit.
    pub fn snapshot_budget(&self) -> &SnapshotBudget {
        &self.snapshot_budget
    }

    /// Deletes the snapshot `name`, freeing what only it holds: its record first (from
    /// then on it does not exist), then its tree, renamed aside and removed. Volumes
    /// restored from it are volumes of their own and stay. Callers hold its lock.
    pub fn delete_snapshot(&self, name: &SnapshotName) -> Result<Deleted> {
        self.root.ensure_present()?;
        let area = Area::open(&self.root)?;
        let record = area.read(name)?;
        let had_record = area.remove_record(name)?;
        if had_record {
            self.snapshot_budget.release(name);
        }
        if self.backend.layout() == Layout::Mounts {
            let had_snapshot = self.backend.drop_kept_snapshot(name)?;
            if had_record
                && let Some(record) = record
                && self.backend.snapshots_hold_capacity()
            {
                self.provisioned.release(record.restore_size_bytes);
            }
            return Ok(if had_record || had_snapshot {
                Deleted::Removed
            } else {
                Deleted::WasAbsent
            });
        }
        // A replica whose receive was cut and never resumed goes with its name.
        let receiving = format!("{RECEIVING}{name}");
        let had_receiving = area.has_tree(&receiving);
        if had_receiving {
            self.remove_area_tree(&area, &receiving, name)?;
        }
        if !area.has_tree(name.as_str()) {
            return Ok(if had_record || had_receiving {
                Deleted::Removed
            } else {
                Deleted::WasAbsent
            });
        }
        self.remove_area_tree(&area, name.as_str(), name)?;
        Ok(Deleted::Removed)
    }

    /// Removes the tree `entry` of the area (of snapshot `name`): renamed aside durably
    /// first, so a crash leaves nothing a snapshot could be taken for.
    fn remove_area_tree(&self, area: &Area, entry: &str, name: &SnapshotName) -> Result<()> {
        let doomed = self.unique_name(REMOVING);
        rustix::fs::renameat_with(
            &area.data,
            entry,
            &area.data,
            doomed.as_str(),
            RenameFlags::NOREPLACE,
        )
        .map_err(|e| io_error(format!("remove snapshot {name}"), e))?;
        let mut moved = Changes::new();
        moved.dir(area.data.as_fd())?;
        self.durable.commit(moved)?;
        self.backend
            .remove(area.data.as_fd(), &doomed, None, KnownQuota::Unknown)
    }

    /// Makes the volume at `path` from `source` (the request's), a ready snapshot or an
    /// archive, as a clone is made from a volume (a writable btrfs snapshot of a btrfs
    /// snapshot or archived subvolume, a ZFS clone, else reflinks or a copy), or confirms
    /// it is there already. Callers hold the locks of the source (a snapshot's, or the
    /// path an archive was made of) and of `path`.
    pub fn restore_volume(
        &self,
        path: &VolumePath,
        source: &RestoreSource,
        request: &RestoreVolumeRequest,
        progress: &CopyProgress,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        let _nesting = self.nesting.making(path.as_str());
        let reservation = self.promise(path, request.capacity_bytes)?;
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        if let Some(existing) = self.backend.find(&self.root, parent.as_fd(), path)? {
            let confirmed = confirm_restore(path, existing, source, request)?;
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        let made = match source {
            RestoreSource::Snapshot(name) => {
                self.restore_from_snapshot(parent.as_fd(), path, source, name, request, progress)
            }
            RestoreSource::Archive(id) => {
                self.restore_from_archive(parent.as_fd(), path, source, id, request, progress)
            }
        };
        reservation.keep_if(matches!(made, Ok((_, Created::New))));
        made
    }

    fn restore_from_snapshot(
        &self,
        parent: BorrowedFd<'_>,
        path: &VolumePath,
        source: &RestoreSource,
        name: &SnapshotName,
        request: &RestoreVolumeRequest,
        progress: &CopyProgress,
    ) -> Result<(Volume, Created)> {
        let area = Area::open(&self.root)?;
        let Some(record) = area.read(name)? else {
            return Err(Self::no_ready_snapshot(path, name));
        };
        check_restore_size(path, name, &record, request)?;
        // A kept snapshot has no tree of its own here; its backend reads no source
        // directory, and the area's stands in.
        let dir = match self.backend.layout() {
            Layout::Directories => open_child(area.data.as_fd(), name.as_str(), false)?,
            Layout::Mounts => area.data.try_clone().map_err(|e| StoreError::Io {
                context: "open the snapshot area".into(),
                source: e,
            })?,
        };
        let found = record_as_found(dir.as_fd(), path, record.restore_size_bytes, &request.owner)?;
        let clone_source = CloneSource {
            path: &record.source,
            dir: dir.as_fd(),
            record: &found,
        };
        self.make_restored(parent, &clone_source, path, source, request, progress)
    }

    /// Makes the volume at `path` from `from` (the tree of the snapshot or archive
    /// `source`) as `request` asks, as a clone is made, or confirms the volume an earlier
    /// identical request made there.
    pub(super) fn make_restored(
        &self,
        parent: BorrowedFd<'_>,
        from: &CloneSource<'_>,
        path: &VolumePath,
        source: &RestoreSource,
        request: &RestoreVolumeRequest,
        progress: &CopyProgress,
    ) -> Result<(Volume, Created)> {
        let wanted = NewVolume {
            path,
            capacity_bytes: request.capacity_bytes,
            owner: &request.owner,
            quota: request.quota,
            origin: Origin::Restore(source),
        };
        self.make_from(parent, from, &wanted, progress, |existing| {
            confirm_restore(path, existing, source, request)
        })
    }

    /// The answer to a restore from a snapshot that is not there (or not the caller's to
    /// see: the API answers both alike).
    pub(crate) fn no_ready_snapshot(path: &VolumePath, name: &SnapshotName) -> StoreError {
        StoreError::NotFound(format!(
            "{path}: there is no ready snapshot {name} to restore from; nothing was created"
        ))
    }

    /// The capacity a restore from `name` needs at least, once the snapshot is ready; a
    /// not-found error when there is no such ready snapshot.
    pub fn snapshot_restore_size(&self, name: &SnapshotName) -> Result<u64> {
        let area = Area::open(&self.root)?;
        area.read(name)?
            .map(|record| record.restore_size_bytes)
            .ok_or_else(|| StoreError::NotFound(format!("no ready snapshot {name}")))
    }

    /// The ready snapshot `name` and its tree, opened for reading (to send it to another
    /// agent). Only a snapshot kept as a tree in the area has one: a ZFS snapshot is
    /// ZFS's own.
    pub fn open_snapshot_tree(&self, name: &SnapshotName) -> Result<(Snapshot, OwnedFd)> {
        self.root.ensure_present()?;
        if self.backend.layout() == Layout::Mounts {
            return Err(StoreError::Unsupported(format!(
                "snapshot {name}: snapshots of {} volumes are not sent file by file",
                self.backend.kind()
            )));
        }
        let area = Area::open(&self.root)?;
        let record = area
            .read(name)?
            .ok_or_else(|| StoreError::NotFound(format!("no ready snapshot {name}")))?;
        let tree = open_child(area.data.as_fd(), name.as_str(), false)?;
        Ok((record.to_snapshot(name, None), tree))
    }

    /// The replica `name` of `origin` when it is there already; a conflict when the name
    /// is another snapshot's; `None` when there is none.
    pub fn find_replica(
        &self,
        name: &SnapshotName,
        origin: &ReplicaOrigin,
    ) -> Result<Option<Snapshot>> {
        let area = Area::open(&self.root)?;
        match area.read(name)? {
            None => Ok(None),
            Some(record) if record.replica_of.as_ref() == Some(origin) => {
                Ok(Some(record.to_snapshot(name, None)))
            }
            Some(_) => Err(not_this_replica(name, origin)),
        }
    }

    /// Receives the replica `name` of `source` (a snapshot of the agent `origin` names):
    /// `build` fills an empty (or half-filled, when an earlier receive was cut) directory
    /// with its tree, synced, given the tree of the replica `base` to take unchanged
    /// files from. The replica is listed only
    /// once its tree is in place and its record written, both durably; the same receive
    /// again finds it. Callers hold the lock of `name`.
    pub fn receive_replica(
        &self,
        name: &SnapshotName,
        origin: &ReplicaOrigin,
        source: &Snapshot,
        base: Option<&SnapshotName>,
        build: &mut dyn FnMut(BorrowedFd<'_>, Option<BorrowedFd<'_>>) -> Result<()>,
    ) -> Result<(Snapshot, Created)> {
        self.root.ensure_present()?;
        if self.backend.layout() == Layout::Mounts {
            return Err(StoreError::Unsupported(format!(
                "replica {name}: this agent's {} volumes keep snapshots as datasets; a replica is received as a tree only",
                self.backend.kind()
            )));
        }
        let area = Area::open(&self.root)?;
        if let Some(record) = area.read(name)? {
            if record.replica_of.as_ref() == Some(origin) {
                return Ok((record.to_snapshot(name, None), Created::Existing));
            }
            return Err(not_this_replica(name, origin));
        }
        let base_tree = match base {
            Some(base) => {
                if area.read(base)?.is_none() {
                    return Err(StoreError::NotFound(format!(
                        "replica {name}: there is no ready snapshot {base} to build from; nothing was received"
                    )));
                }
                Some(open_child(area.data.as_fd(), base.as_str(), false)?)
            }
            None => None,
        };
        let staging_name = format!("{RECEIVING}{name}");
        let staging = private_dir(area.data.as_fd(), &staging_name)?;
        build(staging.as_fd(), base_tree.as_ref().map(|t| t.as_fd()))?;
        let size_bytes = measure_tree(staging.as_fd())
            .map_err(|e| io_error(format!("measure replica {name}"), e))?
            .usage
            .used_bytes;
        drop(staging);
        rustix::fs::renameat_with(
            &area.data,
            staging_name.as_str(),
            &area.data,
            name.as_str(),
            RenameFlags::NOREPLACE,
        )
        .map_err(|e| io_error(format!("put the replica {name} in place"), e))?;
        rustix::fs::fsync(&area.data)
            .map_err(|e| io_error(format!("put the replica {name} in place"), e))?;
        let record = SnapshotRecord {
            source: source.source.clone(),
            method: SnapshotMethod::Replica,
            created_at: source.created_at.clone(),
            restore_size_bytes: source.restore_size_bytes,
            size_bytes,
            namespace: None,
            replica_of: Some(origin.clone()),
        };
        area.write(name, &record)?;
        Ok((record.to_snapshot(name, None), Created::New))
    }

    /// Sets aside what a crash left in the snapshot area: trees being made or removed,
    /// trees without a record, records being written. Runs when the store opens, before
    /// any request, so nothing it renames is in use; the renamed trees are removed by
    /// [`Self::purge_snapshot_leftovers`] in the background. Answers how many it set aside.
    pub(super) fn set_aside_snapshot_leftovers(
        root: &Root,
        backend: &dyn VolumeBackend,
        unique: &str,
    ) -> Result<usize> {
        let area = Area::open(root)?;
        for kept in backend.kept_snapshots()?.into_keys() {
            // Taken, but a crash came before it was recorded: no snapshot.
            if let Ok(name) = SnapshotName::parse(&kept)
                && area.read(&name)?.is_none()
            {
                backend.drop_kept_snapshot(&name)?;
            }
        }
        for (entry, _) in
            list_dir(area.records.as_fd()).map_err(|e| io_error("list the snapshot records", e))?
        {
            if entry.starts_with('.') {
                let _ = rustix::fs::unlinkat(&area.records, entry.as_str(), AtFlags::empty());
            }
        }
        let mut set_aside = 0;
        let entries =
            list_dir(area.data.as_fd()).map_err(|e| io_error("list the snapshot area", e))?;
        for (n, (entry, _)) in entries.into_iter().enumerate() {
            if entry.starts_with(STALE) || entry.starts_with(RECEIVING) {
                continue;
            }
            let recorded = SnapshotName::parse(&entry)
                .ok()
                .is_some_and(|name| area.read(&name).is_ok_and(|record| record.is_some()));
            if recorded {
                continue;
            }
            let aside = format!("{STALE}-{unique}-{n}");
            rustix::fs::renameat_with(
                &area.data,
                entry.as_str(),
                &area.data,
                aside.as_str(),
                RenameFlags::NOREPLACE,
            )
            .map_err(|e| io_error(format!("set aside the snapshot leftover {entry}"), e))?;
            set_aside += 1;
        }
        if set_aside > 0 {
            // The whole filesystem: on btrfs a subvolume's rename is committed only with
            // its transaction.
            rustix::fs::syncfs(&area.data)
                .map_err(|e| io_error("set aside snapshot leftovers", e))?;
        }
        Ok(set_aside)
    }

    /// Removes the snapshot leftovers set aside when the store opened.
    pub(super) fn purge_snapshot_leftovers(&self, purge: &mut super::Purge) {
        let area = match Area::open(&self.root) {
            Ok(area) => area,
            Err(e) => {
                purge
                    .failed
                    .push((format!("{STATE_DIR}/{SNAPSHOTS_DIR}"), e));
                return;
            }
        };
        let entries = match list_dir(area.data.as_fd()) {
            Ok(entries) => entries,
            Err(e) => {
                purge.failed.push((
                    format!("{STATE_DIR}/{SNAPSHOTS_DIR}"),
                    io_error("list the snapshot area", e),
                ));
                return;
            }
        };
        for (entry, _) in entries {
            if !entry.starts_with(STALE) {
                continue;
            }
            match self
                .backend
                .remove(area.data.as_fd(), &entry, None, KnownQuota::Unknown)
            {
                Ok(()) => purge.removed += 1,
                Err(e) => purge
                    .failed
                    .push((format!("{STATE_DIR}/{SNAPSHOTS_DIR}/{DATA_DIR}/{entry}"), e)),
            }
        }
    }
}

fn not_this_replica(name: &SnapshotName, origin: &ReplicaOrigin) -> StoreError {
    StoreError::Conflict(format!(
        "snapshot {name} exists already and is not the replica of {} at {}",
        origin.source_snapshot, origin.source_url
    ))
}

/// The namespace a snapshot of the volume `source` is charged to: its claim's, or none.
fn charged_namespace(source: &VolumeRecord) -> String {
    source.owner.pvc_namespace.clone().unwrap_or_default()
}

/// A restore smaller than what the snapshot held could not take its data back.
fn check_restore_size(
    path: &VolumePath,
    name: &SnapshotName,
    record: &SnapshotRecord,
    request: &RestoreVolumeRequest,
) -> Result<()> {
    if request.capacity_bytes < record.restore_size_bytes {
        return Err(StoreError::Invalid(format!(
            "{path}: a restore of snapshot {name} needs at least its restore size of {} bytes; {} bytes were asked for",
            record.restore_size_bytes, request.capacity_bytes
        )));
    }
    Ok(())
}

/// A repeated restore is confirmed only when the volume there was restored from the same
/// snapshot or archive, with the same capacity, owner and quota.
fn confirm_restore(
    path: &VolumePath,
    existing: VolumeRecord,
    wanted: &RestoreSource,
    request: &RestoreVolumeRequest,
) -> Result<(Volume, Created)> {
    let origin = match &existing.restore {
        Some(origin) if origin.source == *wanted => None,
        Some(origin) => Some(format!(
            "restored from {} (requested from {wanted})",
            origin.source
        )),
        None => Some(format!("not restored (requested from {wanted})")),
    };
    confirm_made(
        path,
        existing,
        origin,
        request.quota,
        request.capacity_bytes,
        &request.owner,
    )
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use nfsprov_api_types::CreateVolumeRequest;

    use super::*;

    fn entries(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    }

    #[test]
    fn a_snapshot_no_longer_wanted_is_neither_made_nor_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::open(dir.path()).unwrap();
        let source = VolumePath::parse("team/source").unwrap();
        let request = CreateVolumeRequest {
            capacity_bytes: 1 << 20,
            ..Default::default()
        };
        store.create(&source, &request).unwrap();
        std::fs::write(dir.path().join("team/source/data"), b"kept").unwrap();
        let name = SnapshotName::parse("snap").unwrap();
        let area = dir.path().join(STATE_DIR).join(SNAPSHOTS_DIR);
        let progress = CopyProgress::default();

        // Deleted before it was made: nothing is copied.
        let refused = store
            .take_snapshot(&name, &source, &progress, &|stage| stage != Stage::Making)
            .unwrap_err();
        assert!(matches!(refused, StoreError::NotFound(_)), "{refused}");
        assert_eq!(progress.copied_files.get(), 0);

        // Deleted once made: the copy goes and nothing is recorded.
        let refused = store
            .take_snapshot(&name, &source, &progress, &|stage| {
                stage != Stage::Recording
            })
            .unwrap_err();
        assert!(matches!(refused, StoreError::NotFound(_)), "{refused}");
        assert_eq!(progress.copied_files.get(), 1, "it was made");
        assert_eq!(entries(&area.join(DATA_DIR)), Vec::<String>::new());
        assert_eq!(entries(&area.join(RECORDS_DIR)), Vec::<String>::new());
        assert!(store.snapshot(&name).unwrap().is_none());

        // Wanted throughout, it is taken; found recorded, it is not asked again.
        let (taken, created) = store
            .take_snapshot(&name, &source, &progress, &|_| true)
            .unwrap();
        assert_eq!(created, Created::New);
        assert!(taken.ready);
        let (_, again) = store
            .take_snapshot(&name, &source, &progress, &|_| false)
            .unwrap();
        assert_eq!(again, Created::Existing);
        assert_eq!(entries(&area.join(DATA_DIR)), ["snap"]);
    }
}
