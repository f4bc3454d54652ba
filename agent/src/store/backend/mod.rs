//! What a kind of volume storage must do for the store. The store (`store.rs`) owns
//! confinement, locking, staging, the trash, archive naming and the comparison of
//! requests with records; a backend only makes, limits, measures, records and removes
//! volumes of its kind. Three backends exist, each in a module of its own here with the
//! tools it drives beside it (all run through `quota::command`):
//! - `directory`: directories of the root's filesystem, with a quota strategy (none,
//!   btrfs or xfs); the btrfs subvolume and qgroup tool in `directory::btrfs`, XFS project
//!   quotas in `directory::xfs`.
//! - `zfs`: ZFS datasets; the `zfs` tool in `zfs` itself (command lines, parsing, kept
//!   snapshots), the backend over it in `zfs::dataset_backend`.
//! - `image`: ext4 filesystem images loop-mounted one per volume; their tools in
//!   `image::tools`.

pub(super) mod directory;
pub(super) mod image;
pub(super) mod zfs;

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::os::fd::{BorrowedFd, OwnedFd};

use nfsprov_api_types::{
    ArchivePath, CloneMethod, QuotaBackend, SnapshotMethod, SnapshotName, VolumePath, VolumeUsage,
};

use self::zfs::KeptSnapshot;
use crate::store::archive::area::StoredArchive;
use crate::store::confine::Root;
use crate::store::copy::CopyProgress;
use crate::store::error::{Result, StoreError};
use crate::store::record::{QuotaRecord, VolumeRecord};

/// How a backend's volumes sit beneath the root, which decides how the store moves them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Directories of the root's own filesystem: set up in staging and renamed into
    /// place, renamed into the trash before their tree is removed, renamed into the
    /// archive.
    Directories,
    /// Filesystems of their own mounted at their path (ZFS datasets): made at their path
    /// and finished by writing their record last, destroyed and archived in place.
    Mounts,
}

/// What the caller of [`VolumeBackend::remove`] knows of the volume's quota.
#[derive(Debug, Clone, Copy)]
pub enum KnownQuota<'a> {
    /// From the volume's record (or from creating it): `None` when nothing limits it.
    Known(Option<&'a QuotaRecord>),
    /// What a crash left: the backend looks for a record itself.
    Unknown,
}

/// The finished volume a clone copies.
#[derive(Debug, Clone, Copy)]
pub struct CloneSource<'a> {
    pub path: &'a VolumePath,
    /// Its directory, opened by the store beneath the root.
    pub dir: BorrowedFd<'a>,
    pub record: &'a VolumeRecord,
}

/// Where a clone goes: `name` in `parent`, which is the staging area for
/// [`Layout::Directories`] and the directory of its path for [`Layout::Mounts`].
#[derive(Debug, Clone, Copy)]
pub struct CloneTarget<'a> {
    pub parent: BorrowedFd<'a>,
    pub name: &'a str,
    pub path: &'a VolumePath,
    /// Bytes the clone is limited to, when a quota must hold it.
    pub limit: Option<u64>,
    /// The clone's capacity, which storage that has no unlimited volumes sizes it to.
    pub capacity_bytes: u64,
}

pub trait VolumeBackend: Debug + Send + Sync {
    /// The quota backend this storage reports (and records in volumes it limits).
    fn kind(&self) -> QuotaBackend;

    /// Whether volumes can be held to their capacity.
    fn can_enforce(&self) -> bool;

    fn layout(&self) -> Layout;

    /// Runs once when the store opens, after its work areas exist: checks that records
    /// can be kept, removes the records of volumes that are gone (releasing their
    /// quotas) and recovers what the backend must know of existing volumes. Answers how
    /// many records it removed.
    fn prepare(&self, root: &Root, staging: BorrowedFd<'_>) -> Result<usize>;

    /// Whether `dir`, met on the way to a volume, is a volume itself.
    fn is_volume(&self, root: &Root, dir: BorrowedFd<'_>) -> Result<bool>;

    /// The record of the finished volume at `path`, whose directory would be its last
    /// component in `parent`: `None` when there is none, a conflict when something that
    /// is not a volume made by the agent is there.
    fn find(
        &self,
        root: &Root,
        parent: BorrowedFd<'_>,
        path: &VolumePath,
    ) -> Result<Option<VolumeRecord>>;

    /// Makes the empty volume `name` in `parent` for `path` (in staging for
    /// [`Layout::Directories`], at its path for [`Layout::Mounts`]), limited to `limit`
    /// bytes when given; `capacity_bytes` sizes it where storage has no unlimited
    /// volumes. Answers the quota record to keep with the volume.
    fn make(
        &self,
        root: &Root,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        limit: Option<u64>,
        capacity_bytes: u64,
    ) -> Result<Option<QuotaRecord>>;

    /// Makes the target a volume holding everything the source holds, with the fastest
    /// exact method this storage allows, limited like [`Self::make`]. The source's root
    /// owner and mode are kept. Answers the quota record to keep and the method used; on
    /// failure what was made is left for the caller to remove like an unfinished volume.
    fn clone_volume(
        &self,
        root: &Root,
        source: &CloneSource<'_>,
        target: &CloneTarget<'_>,
        progress: &CopyProgress,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)>;

    /// Makes `name` in `parent` (the agent's snapshot area, where it stays) a snapshot of
    /// the source: its content at one point in time where the storage can snapshot,
    /// otherwise an exact copy. Answers the method used; on failure what was made is left
    /// for the caller to remove.
    fn snapshot(
        &self,
        source: &CloneSource<'_>,
        parent: BorrowedFd<'_>,
        name: &str,
        progress: &CopyProgress,
    ) -> Result<SnapshotMethod> {
        let _ = (parent, name, progress);
        Err(StoreError::Unsupported(format!(
            "{}: this agent's {} volumes cannot be snapshotted",
            source.path,
            self.kind()
        )))
    }

    /// Bytes only the snapshot whose directory is `dir` holds, where the storage counts
    /// them.
    fn snapshot_exclusive_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        let _ = dir;
        None
    }

    /// Bytes the snapshot whose directory is `dir` references, where the storage counts
    /// them without a walk of its tree (a btrfs snapshot's qgroup); `None` otherwise.
    fn snapshot_referenced_bytes(&self, dir: BorrowedFd<'_>) -> Option<u64> {
        let _ = dir;
        None
    }

    /// [`Layout::Mounts`] only: takes the snapshot `name` of the volume at `source` as a
    /// snapshot of the storage's own, kept by it (not a tree in the snapshot area).
    /// Answers how it was taken.
    fn take_kept_snapshot(
        &self,
        source: &VolumePath,
        name: &SnapshotName,
    ) -> Result<SnapshotMethod> {
        let _ = name;
        Err(StoreError::Unsupported(format!(
            "{source}: {} volumes are snapshotted into the snapshot area",
            self.kind()
        )))
    }

    /// Whether a kept snapshot may come to hold its source's whole capacity on its own:
    /// a copy that shares the source's blocks only until the source is written (an
    /// image's reflink). Such a snapshot is counted in the capacity promised, so that the
    /// writes of a volume with snapshots never find the export root full.
    fn snapshots_hold_capacity(&self) -> bool {
        false
    }

    /// The snapshots the storage keeps itself, by name.
    fn kept_snapshots(&self) -> Result<BTreeMap<String, KeptSnapshot>> {
        Ok(BTreeMap::new())
    }

    /// The kept snapshot `name` just taken of the volume at `source`, looked up where it
    /// was taken: one question to the storage, not a listing of every snapshot.
    fn kept_snapshot_of(
        &self,
        source: &VolumePath,
        name: &SnapshotName,
    ) -> Result<Option<KeptSnapshot>> {
        let _ = source;
        Ok(self.kept_snapshots()?.remove(name.as_str()))
    }

    /// Deletes the kept snapshot `name`, as far as nothing depends on it; whether there
    /// was one.
    fn drop_kept_snapshot(&self, name: &SnapshotName) -> Result<bool> {
        let _ = name;
        Ok(false)
    }

    /// [`Layout::Mounts`] only: makes the target a volume holding what the kept snapshot
    /// `name` holds, limited like [`Self::make`]. Answers as [`Self::clone_volume`].
    fn clone_kept_snapshot(
        &self,
        name: &SnapshotName,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        let _ = target;
        Err(StoreError::Unsupported(format!(
            "snapshot {name}: {} volumes are restored from the snapshot area",
            self.kind()
        )))
    }

    /// [`Layout::Mounts`] only: makes the target a volume holding what the archive `id`
    /// holds, leaving the archive as it is, limited like [`Self::make`]. Answers as
    /// [`Self::clone_volume`].
    fn clone_archive(
        &self,
        root: &Root,
        id: &ArchivePath,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        let _ = (root, target);
        Err(StoreError::Unsupported(format!(
            "archive {id}: {} volumes are restored from the archive's directory",
            self.kind()
        )))
    }

    /// Refuses, saying why, when a plain directory already at `path` cannot become a
    /// volume of this kind just by recording it.
    fn check_adoptable(&self, path: &VolumePath) -> Result<()> {
        let _ = path;
        Ok(())
    }

    /// Writes the record of the volume whose directory is `dir`. For volumes made in
    /// place this is the last step of creation: until then the volume is unfinished.
    fn write_record(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<()>;

    /// The directories to sync once the record of the volume whose directory is `dir`
    /// was written or removed; none where records are not files (dataset properties,
    /// which zfs commits before it returns).
    fn record_dirs(&self, dir: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        let _ = dir;
        Ok(Vec::new())
    }

    /// Removes `name` in `parent` (a volume, an unfinished one, or what a crash left of
    /// one) with its quota; `path` is the volume's path when it is still at it.
    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: Option<&VolumePath>,
        quota: KnownQuota<'_>,
    ) -> Result<()>;

    /// Space and inodes the volume whose directory is `dir` uses.
    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<VolumeUsage>;

    /// Sets the volume's quota to `capacity_bytes` (never called where
    /// [`Self::grows_offline`]).
    fn resize(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        quota: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()>;

    /// Every finished volume beneath the root, in any order.
    fn list(&self, root: &Root) -> Result<Vec<(VolumePath, VolumeRecord)>>;

    /// At most `limit` finished volumes whose paths follow `after`, in path order, and
    /// whether more may follow. This default cuts the page from the whole list, for
    /// backends that learn every volume in one call anyway.
    fn list_page(
        &self,
        root: &Root,
        after: Option<&VolumePath>,
        limit: usize,
    ) -> Result<(Vec<(VolumePath, VolumeRecord)>, bool)> {
        let mut found: Vec<_> = self
            .list(root)?
            .into_iter()
            .filter(|(path, _)| after.is_none_or(|after| path > after))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found.dedup_by(|a, b| a.0 == b.0);
        let more = found.len() > limit;
        found.truncate(limit);
        Ok((found, more))
    }

    /// [`Layout::Mounts`] only: moves the volume at `path` to `archive_path` below the root.
    fn archive_in_place(&self, path: &VolumePath, archive_path: &str) -> Result<()> {
        let _ = archive_path;
        Err(StoreError::Unsupported(format!(
            "{path}: {} volumes are archived by renaming their directory",
            self.kind()
        )))
    }

    /// Every archive the agent made beneath the archive area, in any order.
    fn list_archives(&self, root: &Root) -> Result<Vec<StoredArchive>>;

    /// At most `limit` archives whose ids follow `after`, in id order, and whether more
    /// may follow, for [`Layout::Mounts`] (the store pages directories' archives from its
    /// own index of ids); cut from the whole list unless the backend can do better.
    fn list_archives_page(
        &self,
        root: &Root,
        after: Option<&ArchivePath>,
        limit: usize,
    ) -> Result<(Vec<StoredArchive>, bool)> {
        let mut found: Vec<_> = self
            .list_archives(root)?
            .into_iter()
            .filter(|archive| after.is_none_or(|after| &archive.id > after))
            .collect();
        found.sort_by(|a, b| a.id.cmp(&b.id));
        let more = found.len() > limit;
        found.truncate(limit);
        Ok((found, more))
    }

    /// The record of the archive `id`, whose entry would be in `parent` (its archive
    /// directory): `None` when nothing is there, a conflict when what is there is not an
    /// archive the agent made of that path.
    fn find_archive(
        &self,
        root: &Root,
        parent: BorrowedFd<'_>,
        id: &ArchivePath,
    ) -> Result<Option<VolumeRecord>>;

    /// Space and inodes the archive whose directory is `dir` uses.
    fn measure_archive(
        &self,
        dir: BorrowedFd<'_>,
        id: &ArchivePath,
        record: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        self.measure(dir, id.volume(), record)
    }

    /// [`Layout::Mounts`] only: removes the archive `id` where it is, with its quota.
    fn remove_archive_in_place(&self, id: &ArchivePath) -> Result<()> {
        Err(StoreError::Unsupported(format!(
            "{id}: {} archives are removed through the trash",
            self.kind()
        )))
    }

    /// Removes what a crash left outside the store's staging and trash areas (volumes
    /// made in place but never finished). Answers how many were removed.
    fn purge_unfinished(&self) -> Result<usize> {
        Ok(0)
    }

    /// Whether a volume is grown offline, its filesystem unmounted meanwhile: an image
    /// volume where the kernel does not let the agent resize a mounted filesystem. The
    /// volume is then grown by [`Self::grow_offline`], not [`Self::resize`], with its
    /// export withheld by the caller. It may turn true after a refused
    /// [`Self::resize`].
    fn grows_offline(&self) -> bool {
        false
    }

    /// Grows the volume at `path` to hold `capacity_bytes`, unmounted, where
    /// [`Self::grows_offline`]. Nothing may hold its filesystem (the NFS server has let
    /// go of it); if something does, it fails and the volume stays as it was.
    fn grow_offline(
        &self,
        path: &VolumePath,
        quota: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        let _ = (quota, capacity_bytes);
        Err(StoreError::Unsupported(format!(
            "{path}: this quota backend does not grow volumes offline"
        )))
    }

    /// Whether a file handle forged by a client admitted to one volume's export is
    /// refused by the NFS server for every other volume, archive and file: true only
    /// where each volume is a filesystem of its own to the server (see docs/security.md).
    fn isolates_exports(&self) -> bool {
        false
    }

    /// Whether the volume at `path` (a volume this backend found) can be served now:
    /// where volumes are mounts, that its filesystem is mounted, so that an export never
    /// serves the bare mountpoint beneath it.
    fn is_servable(&self, path: &VolumePath) -> bool {
        let _ = path;
        true
    }

    /// The volumes whose filesystems [`Self::prepare`] mounted (after a reboot, all):
    /// an NFS server that started first serves the directory beneath each until its
    /// export is added again.
    fn mounted_at_open(&self) -> Vec<VolumePath> {
        Vec::new()
    }
}
