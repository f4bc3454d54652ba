//! Volumes that are directories of the export root's filesystem, held to their capacity
//! by a quota strategy: none (capacity recorded only), a btrfs subvolume with a qgroup
//! limit, or an XFS (or ext4) project quota. Records live in the agent's own record store
//! (see `record`), keyed by each volume directory's identity.

pub(in crate::store) mod btrfs;
pub(in crate::store) mod xfs;

use std::fmt::Debug;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::OnceLock;

use nfsprov_api_types::{
    ArchivePath, CloneMethod, QuotaBackend, SnapshotMethod, VolumePath, VolumeUsage,
};
use rustix::fs::Mode;

use self::btrfs::{Btrfs, SnapshotKind};
use self::xfs::Xfs;
use crate::store::archive::area::{self, StoredArchive};
use crate::store::archive::naming::{ARCHIVE_DIR, archive_components};
use crate::store::backend::{CloneSource, CloneTarget, KnownQuota, Layout, VolumeBackend};
use crate::store::confine::{Root, STAGING_DIR, STATE_DIR, TRASH_DIR, open_child};
use crate::store::copy::{CopyOptions, CopyProgress, copy_tree, reflink_supported};
use crate::store::error::{Result, StoreError, io_error, quota_error};
use crate::store::legacy::{self, Area};
use crate::store::reconcile;
use crate::store::record::{Identity, QuotaRecord, RecordStore, VolumeRecord};
use crate::store::tree::{MAX_USAGE_DEPTH, measure_tree, remove_tree};
use crate::subvolume;

/// How a directory volume is held to its capacity.
pub trait QuotaStrategy: Debug + Send + Sync {
    fn kind(&self) -> QuotaBackend;

    /// Makes the empty directory `name` in `parent` for `path`; `limited` when a quota
    /// will follow.
    fn make_dir(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        limited: bool,
    ) -> Result<()> {
        let _ = limited;
        plain_dir(parent, name, path)
    }

    /// Limits the new, still empty volume `dir` to `capacity_bytes`.
    fn limit_new(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        capacity_bytes: u64,
    ) -> Result<QuotaRecord>;

    /// Sets the limit of a volume this strategy limited before.
    fn set_limit(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()>;

    /// What the quota counts for the volume; the tree is walked for what it does not.
    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
    ) -> Result<VolumeUsage> {
        let _ = quota;
        walk(dir, path)
    }

    /// Removes `name` in `parent` with everything below it and its quota.
    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        quota: Option<&QuotaRecord>,
    ) -> Result<()> {
        let _ = quota;
        remove_tree(parent, name)
    }

    /// Makes `name` in `parent` a snapshot of `kind` of the volume `source`, when this
    /// strategy can snapshot that volume; `Ok(false)` when it cannot (the tree is then
    /// copied instead).
    fn snapshot(
        &self,
        source: BorrowedFd<'_>,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        kind: SnapshotKind,
    ) -> Result<bool> {
        let _ = (source, parent, name, path, kind);
        Ok(false)
    }

    /// Bytes only the snapshot `dir` holds, where this strategy's quota counts them.
    fn exclusive_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        let _ = dir;
        None
    }

    /// Bytes the snapshot `dir` references, where this strategy's quota counts them.
    fn referenced_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        let _ = dir;
        None
    }

    /// Releases the quota of a volume that is gone (whose tree was removed by a delete a
    /// crash interrupted).
    fn release(&self, quota: &QuotaRecord) -> Result<()> {
        let _ = quota;
        Ok(())
    }

    /// Learns the quotas that existing volumes, archives and leftovers hold.
    fn recover(&self, recorded: Vec<QuotaRecord>) {
        let _ = recorded;
    }

    /// Whether [`Self::recover`] wants the records of the whole root (a walk at start).
    fn wants_records(&self) -> bool {
        false
    }
}

/// Capacity is recorded, never enforced.
#[derive(Debug)]
pub struct NoQuota;

impl QuotaStrategy for NoQuota {
    fn kind(&self) -> QuotaBackend {
        QuotaBackend::None
    }

    fn limit_new(&self, _: BorrowedFd<'_>, path: &VolumePath, _: u64) -> Result<QuotaRecord> {
        Err(StoreError::Unsupported(format!(
            "{path}: no quota backend to limit it"
        )))
    }

    fn set_limit(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        _: &QuotaRecord,
        _: u64,
    ) -> Result<()> {
        Err(StoreError::Unsupported(format!(
            "{path}: no quota backend to limit it"
        )))
    }
}

impl QuotaStrategy for Btrfs {
    fn kind(&self) -> QuotaBackend {
        QuotaBackend::Btrfs
    }

    /// A limited volume is a subvolume: a qgroup limits exactly one subvolume's bytes.
    fn make_dir(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        limited: bool,
    ) -> Result<()> {
        if !limited {
            return plain_dir(parent, name, path);
        }
        self.create_subvolume(parent, name)
            .map_err(|e| quota_error(format!("create subvolume for {path}"), e))
    }

    fn limit_new(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        capacity_bytes: u64,
    ) -> Result<QuotaRecord> {
        Btrfs::set_limit(self, dir, capacity_bytes)
            .map_err(|e| quota_error(format!("limit {path} to {capacity_bytes} bytes"), e))?;
        Ok(QuotaRecord::of(QuotaBackend::Btrfs))
    }

    fn set_limit(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        _: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        Btrfs::set_limit(self, dir, capacity_bytes)
            .map_err(|e| quota_error(format!("raise the quota of {path}"), e))
    }

    /// A volume that is a subvolume (every limited one) is snapshotted: instant, and
    /// the snapshot shares every extent until either side writes. A read-only one is a
    /// kept snapshot, whose qgroup counts what only it still holds.
    fn snapshot(
        &self,
        source: BorrowedFd<'_>,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        kind: SnapshotKind,
    ) -> Result<bool> {
        if !subvolume::is_subvolume(source) {
            return Ok(false);
        }
        self.snapshot_subvolume(source, parent, name, kind)
            .map_err(|e| {
                let what = match kind {
                    SnapshotKind::Writable => format!("snapshot the source of {path}"),
                    SnapshotKind::ReadOnly => format!("snapshot {path}"),
                };
                quota_error(what, e)
            })?;
        Ok(true)
    }

    fn exclusive_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        if !subvolume::is_subvolume(dir) {
            return None;
        }
        match Btrfs::exclusive_bytes(self, dir) {
            Ok(bytes) => Some(bytes),
            Err(error) => {
                tracing::warn!(%error, "could not read a snapshot's exclusive bytes");
                None
            }
        }
    }

    fn referenced_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        if !subvolume::is_subvolume(dir) {
            return None;
        }
        match self.used_bytes(dir) {
            Ok(bytes) => Some(bytes),
            Err(error) => {
                tracing::warn!(%error, "could not read a snapshot's referenced bytes");
                None
            }
        }
    }

    /// The qgroup's count is what enforcement compares with the capacity; inodes come
    /// from the walk.
    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        _: &QuotaRecord,
    ) -> Result<VolumeUsage> {
        let mut usage = walk(dir, path)?;
        usage.used_bytes = self
            .used_bytes(dir)
            .map_err(|e| quota_error(format!("read the quota usage of {path}"), e))?;
        Ok(usage)
    }

    /// A subvolume is deleted as such, never emptied file by file and left behind.
    fn remove(&self, parent: BorrowedFd<'_>, name: &str, _: Option<&QuotaRecord>) -> Result<()> {
        let is_subvolume = open_child(parent, name, false)
            .is_ok_and(|entry| subvolume::is_subvolume(entry.as_fd()));
        if is_subvolume {
            return self
                .delete_subvolume(parent, name)
                .map_err(|e| quota_error(format!("delete subvolume {name}"), e));
        }
        remove_tree(parent, name)
    }
}

impl QuotaStrategy for Xfs {
    fn kind(&self) -> QuotaBackend {
        QuotaBackend::Xfs
    }

    fn limit_new(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        capacity_bytes: u64,
    ) -> Result<QuotaRecord> {
        let id = Xfs::limit_new(self, dir, capacity_bytes)
            .map_err(|e| quota_error(format!("limit {path} to {capacity_bytes} bytes"), e))?;
        Ok(QuotaRecord {
            backend: QuotaBackend::Xfs,
            project_id: Some(id),
        })
    }

    fn set_limit(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        let id = project_id(path, quota)?;
        Xfs::set_limit(self, id, capacity_bytes)
            .map_err(|e| quota_error(format!("raise the quota of {path}"), e))
    }

    /// A project quota counts both figures itself; no walk is needed.
    fn measure(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
    ) -> Result<VolumeUsage> {
        let id = project_id(path, quota)?;
        self.usage(id)
            .map_err(|e| quota_error(format!("read the quota usage of {path}"), e))
    }

    /// The project id is freed only once nothing is charged to it any more.
    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        quota: Option<&QuotaRecord>,
    ) -> Result<()> {
        remove_tree(parent, name)?;
        if let Some(id) = quota.and_then(|q| q.project_id) {
            self.release(id)
                .map_err(|e| quota_error(format!("release project id {id} of {name}"), e))?;
        }
        Ok(())
    }

    fn release(&self, quota: &QuotaRecord) -> Result<()> {
        match quota.project_id {
            Some(id) => Xfs::release(self, id)
                .map_err(|e| quota_error(format!("release project id {id}"), e)),
            None => Ok(()),
        }
    }

    fn recover(&self, recorded: Vec<QuotaRecord>) {
        self.mark_in_use(recorded.into_iter().filter_map(|q| q.project_id));
    }

    fn wants_records(&self) -> bool {
        true
    }
}

fn project_id(path: &VolumePath, quota: &QuotaRecord) -> Result<u32> {
    quota.project_id.ok_or_else(|| {
        StoreError::Unsupported(format!(
            "{path} is limited by an XFS quota whose project id was not recorded; its quota cannot be changed"
        ))
    })
}

/// A new volume's directory, private until its owner and mode are set.
fn plain_dir(parent: BorrowedFd<'_>, name: &str, path: &VolumePath) -> Result<()> {
    rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
        .map_err(|e| io_error(format!("create {path}"), e))
}

fn walk(dir: BorrowedFd<'_>, path: &VolumePath) -> Result<VolumeUsage> {
    let walk = measure_tree(dir).map_err(|e| io_error(format!("measure {path}"), e))?;
    if walk.mount_points > 0 || walk.too_deep > 0 {
        tracing::warn!(
            %path,
            mount_points = walk.mount_points,
            directories_too_deep = walk.too_deep,
            max_depth = MAX_USAGE_DEPTH,
            "usage leaves out what lies behind mount points inside the volume and below the deepest level walked"
        );
    }
    Ok(walk.usage)
}

/// Threads a local copy uses: the machine's cores, at least two (a copy waits on the
/// disk as much as on the processor), at most eight.
fn copy_workers() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get().clamp(2, 8))
}

/// The record of the volume at `path`, read through its directory's identity: `None`
/// when nothing is there or the directory there holds another path's record (what is at
/// a path decides, never a record's say-so).
fn confirmed(
    root: &Root,
    records: &RecordStore,
    path: &VolumePath,
) -> Result<Option<VolumeRecord>> {
    let components: Vec<&str> = path.components().collect();
    let Some(parent) = root.open_existing(&components[..components.len() - 1])? else {
        return Ok(None);
    };
    let Ok(dir) = open_child(parent.as_fd(), path.file_name(), false) else {
        return Ok(None);
    };
    Ok(match records.read(dir.as_fd())? {
        Some((at, record)) if at == path.as_str() => Some(record),
        _ => None,
    })
}

/// Directory volumes with one quota strategy.
#[derive(Debug)]
pub struct DirectoryBackend {
    quota: Box<dyn QuotaStrategy>,
    /// Opened when the store prepares the root.
    records: OnceLock<RecordStore>,
    /// Whether the root's filesystem shares extents by `FICLONE`, probed at the first clone.
    reflink: OnceLock<bool>,
}

impl DirectoryBackend {
    pub fn new(quota: Box<dyn QuotaStrategy>) -> Self {
        Self {
            quota,
            records: OnceLock::new(),
            reflink: OnceLock::new(),
        }
    }

    /// Directory volumes whose capacity is recorded, never enforced.
    pub fn unlimited() -> Self {
        Self::new(Box::new(NoQuota))
    }

    fn copy_options(&self, parent: BorrowedFd<'_>) -> CopyOptions {
        CopyOptions {
            workers: copy_workers(),
            reflink: *self.reflink.get_or_init(|| reflink_supported(parent)),
        }
    }

    fn records(&self) -> Result<&RecordStore> {
        self.records
            .get()
            .ok_or_else(|| StoreError::NotReady("the record store is not open".into()))
    }
}

impl VolumeBackend for DirectoryBackend {
    fn kind(&self) -> QuotaBackend {
        self.quota.kind()
    }

    fn can_enforce(&self) -> bool {
        self.quota.kind() != QuotaBackend::None
    }

    fn layout(&self) -> Layout {
        Layout::Directories
    }

    fn prepare(&self, root: &Root, _: BorrowedFd<'_>) -> Result<usize> {
        let state = root.open_internal(&[STATE_DIR], false)?;
        let store = RecordStore::open(state.as_fd())?;
        let migrated = legacy::migrate_once(
            state.as_fd(),
            root,
            &store,
            &[
                Area {
                    components: &[],
                    depth: nfsprov_api_types::MAX_COMPONENTS,
                },
                // Archives sit one level below their path (`.archive/<path>/@<time>`).
                Area {
                    components: &[ARCHIVE_DIR],
                    depth: nfsprov_api_types::MAX_COMPONENTS + 1,
                },
                Area {
                    components: &[STATE_DIR, STAGING_DIR],
                    depth: 1,
                },
                Area {
                    components: &[STATE_DIR, TRASH_DIR],
                    depth: 1,
                },
            ],
        )?;
        if migrated > 0 {
            tracing::info!(
                records = migrated,
                "moved volume records from extended attributes into the agent's record store"
            );
        }
        let stale = reconcile::remove_stale(root, &store)?;
        for (path, record) in &stale {
            tracing::warn!(%path, "removed the record of a volume that is gone (a deletion was interrupted)");
            if let Some(quota) = record.quota.as_ref().filter(|q| q.backend == self.kind())
                && let Err(error) = self.quota.release(quota)
            {
                tracing::error!(%path, %error, "could not release the quota of a volume that is gone");
            }
        }
        if self.quota.wants_records() {
            let recorded = store
                .all()?
                .into_iter()
                .filter_map(|(_, r)| r.quota)
                .collect();
            self.quota.recover(recorded);
        }
        let _ = self.records.set(store);
        Ok(stale.len())
    }

    fn is_volume(&self, _: &Root, dir: BorrowedFd<'_>) -> Result<bool> {
        self.records()?.contains(dir)
    }

    fn find(
        &self,
        _: &Root,
        parent: BorrowedFd<'_>,
        path: &VolumePath,
    ) -> Result<Option<VolumeRecord>> {
        let dir = match open_child(parent, path.file_name(), false) {
            Ok(dir) => dir,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match self.records()?.read(dir.as_fd())? {
            Some((recorded, record)) if recorded == path.as_str() => Ok(Some(record)),
            Some((recorded, _)) => Err(StoreError::Conflict(format!(
                "{path} is the volume made for {recorded}, moved here by hand; refusing to touch it"
            ))),
            None => Err(StoreError::Conflict(format!(
                "{path} exists but is not a volume made by the agent (no volume record); refusing to touch it"
            ))),
        }
    }

    fn make(
        &self,
        _: &Root,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        limit: Option<u64>,
        _: u64,
    ) -> Result<Option<QuotaRecord>> {
        self.quota.make_dir(parent, name, path, limit.is_some())?;
        let Some(capacity) = limit else {
            return Ok(None);
        };
        let limited = open_child(parent, name, false)
            .and_then(|dir| self.quota.limit_new(dir.as_fd(), path, capacity));
        match limited {
            Ok(quota) => Ok(Some(quota)),
            Err(e) => {
                // Nothing refers to it yet; the limit step left no quota behind.
                let _ = self.quota.remove(parent, name, None);
                Err(e)
            }
        }
    }

    /// A btrfs snapshot where the source is a subvolume; otherwise a new volume made
    /// like any other (so its quota holds the copy as it is written) and the tree copied
    /// into it, by reflinks where the filesystem shares extents.
    fn clone_volume(
        &self,
        root: &Root,
        source: &CloneSource<'_>,
        target: &CloneTarget<'_>,
        progress: &CopyProgress,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        // The snapshot's root shares its source's old record key: move the source's
        // record off it first.
        self.records()?.settle(source.dir)?;
        if self.quota.snapshot(
            source.dir,
            target.parent,
            target.name,
            target.path,
            SnapshotKind::Writable,
        )? {
            let Some(capacity) = target.limit else {
                return Ok((None, CloneMethod::BtrfsSnapshot));
            };
            let dir = open_child(target.parent, target.name, false)?;
            let quota = self.quota.limit_new(dir.as_fd(), target.path, capacity)?;
            return Ok((Some(quota), CloneMethod::BtrfsSnapshot));
        }
        let quota = self.make(
            root,
            target.parent,
            target.name,
            target.path,
            target.limit,
            target.capacity_bytes,
        )?;
        let dir = open_child(target.parent, target.name, false)?;
        let options = self.copy_options(target.parent);
        let stats = copy_tree(source.dir, dir.as_fd(), &options, progress)?;
        let method = if options.reflink && stats.copied_files == 0 {
            CloneMethod::Reflink
        } else {
            CloneMethod::Copy
        };
        Ok((quota, method))
    }

    /// A read-only btrfs snapshot where the source is a subvolume; otherwise the tree
    /// copied (reflinked where the filesystem shares extents) into a directory of the
    /// snapshot area, which no volume's quota covers.
    fn snapshot(
        &self,
        source: &CloneSource<'_>,
        parent: BorrowedFd<'_>,
        name: &str,
        progress: &CopyProgress,
    ) -> Result<SnapshotMethod> {
        // As for a clone: the snapshot's root would share its source's old record key.
        self.records()?.settle(source.dir)?;
        if self.quota.snapshot(
            source.dir,
            parent,
            name,
            source.path,
            SnapshotKind::ReadOnly,
        )? {
            return Ok(SnapshotMethod::BtrfsSnapshot);
        }
        rustix::fs::mkdirat(parent, name, Mode::from_raw_mode(0o700))
            .map_err(|e| io_error(format!("make the snapshot of {}", source.path), e))?;
        let dir = open_child(parent, name, false)?;
        let options = self.copy_options(parent);
        let stats = copy_tree(source.dir, dir.as_fd(), &options, progress)?;
        Ok(if options.reflink && stats.copied_files == 0 {
            SnapshotMethod::Reflink
        } else {
            SnapshotMethod::Copy
        })
    }

    fn snapshot_exclusive_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        self.quota.exclusive_bytes(dir)
    }

    fn snapshot_referenced_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        self.quota.referenced_bytes(dir)
    }

    fn write_record(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<()> {
        self.records()?.write(dir, path.as_str(), record)
    }

    fn record_dirs(&self, dir: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        self.records()?.dirs_of(dir)
    }

    /// The record goes first, while the directory still holds its inode: once the tree
    /// is removed, a new directory can get the same inode number (and, within one tick of
    /// the filesystem's clock, the same birth time), and removing the record by identity
    /// then would remove the new volume's. A crash after the record went leaves an entry
    /// in staging or trash, which the next start removes without a record; its XFS
    /// project id, recorded nowhere any more, is free again at that start.
    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        _: Option<&VolumePath>,
        quota: KnownQuota<'_>,
    ) -> Result<()> {
        let records = self.records()?;
        let identity = match open_child(parent, name, false) {
            Ok(dir) => Some(
                Identity::of(dir.as_fd()).map_err(|e| io_error(format!("identify {name}"), e))?,
            ),
            Err(StoreError::NotFound(_)) => return Ok(()),
            // Not a directory: nothing was recorded of it.
            Err(_) => None,
        };
        let recorded = match (quota, &identity) {
            (KnownQuota::Known(quota), _) => quota.cloned(),
            (KnownQuota::Unknown, Some(identity)) => records
                .read_identity(identity)?
                .and_then(|(_, record)| record.quota),
            (KnownQuota::Unknown, None) => None,
        };
        if let Some(identity) = identity {
            records.remove(&identity)?;
        }
        self.quota.remove(parent, name, recorded.as_ref())
    }

    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        match &record.quota {
            Some(quota) if quota.backend == self.kind() => self.quota.measure(dir, path, quota),
            _ => walk(dir, path),
        }
    }

    fn resize(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        self.quota.set_limit(dir, path, quota, capacity_bytes)
    }

    /// From the record store, each checked against what is really at its path, so an
    /// archived or vanished volume is not listed and no tenant's tree is walked.
    fn list(&self, root: &Root) -> Result<Vec<(VolumePath, VolumeRecord)>> {
        let mut found = Vec::new();
        // An archive keeps the record of the volume it was, under the same path: a volume
        // made at that path since must be listed once, with its own record.
        let mut seen = std::collections::HashSet::new();
        for (recorded, _) in self.records()?.all()? {
            let Ok(path) = VolumePath::parse(&recorded) else {
                continue;
            };
            if seen.contains(&path) {
                continue;
            }
            if let Some(record) = confirmed(root, self.records()?, &path)? {
                seen.insert(path.clone());
                found.push((path, record));
            }
        }
        Ok(found)
    }

    /// The page's first paths come from the record store's index of paths, then only the
    /// page's volumes are checked and read: a page costs its own volumes, whatever the
    /// number of records. Records of volumes that are not at their path (archived, or
    /// gone meanwhile) are passed over, and the next paths fill a page they thinned.
    fn list_page(
        &self,
        root: &Root,
        after: Option<&VolumePath>,
        limit: usize,
    ) -> Result<(Vec<(VolumePath, VolumeRecord)>, bool)> {
        let records = self.records()?;
        let mut page = Vec::new();
        let mut from = after.cloned();
        loop {
            let (candidates, more) = records.paths_after(from.as_ref(), limit - page.len())?;
            for path in candidates {
                if let Some(record) = confirmed(root, records, &path)? {
                    page.push((path.clone(), record));
                }
                from = Some(path);
            }
            if page.len() == limit || !more {
                return Ok((page, more));
            }
        }
    }

    /// The archive area walked by name, each entry kept only when the record store holds
    /// a record of its directory made for the path it is archived under.
    fn list_archives(&self, root: &Root) -> Result<Vec<StoredArchive>> {
        let mut found = Vec::new();
        for id in area::walk(root)? {
            let parent = match root.open_existing(&archive_components(id.volume())) {
                Ok(Some(parent)) => parent,
                Ok(None) | Err(StoreError::Unsafe(_)) => continue,
                Err(e) => return Err(e),
            };
            match self.find_archive(root, parent.as_fd(), &id) {
                Ok(Some(record)) => found.push(StoredArchive {
                    id,
                    record,
                    usage: None,
                }),
                // Gone meanwhile, or not the agent's: not an archive.
                Ok(None) | Err(StoreError::Conflict(_) | StoreError::Unsafe(_)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(found)
    }

    fn find_archive(
        &self,
        _: &Root,
        parent: BorrowedFd<'_>,
        id: &ArchivePath,
    ) -> Result<Option<VolumeRecord>> {
        let Some(dir) = area::open_entry(parent, id)? else {
            return Ok(None);
        };
        match self.records()?.read(dir.as_fd())? {
            Some((recorded, record)) if recorded == id.volume().as_str() => Ok(Some(record)),
            Some((recorded, _)) => Err(StoreError::Conflict(format!(
                "archive {id} holds the volume made for {recorded}, moved there by hand; refusing to touch it"
            ))),
            None => Err(StoreError::Conflict(format!(
                "archive {id} exists but is not an archive made by the agent (no volume record); refusing to touch it"
            ))),
        }
    }
}
