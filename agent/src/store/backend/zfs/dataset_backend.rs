//! Volumes that are ZFS datasets (quota backend `zfs`), each a child of the dataset
//! mounted at the export root, mounted at its path and limited by a `refquota`.
//!
//! A dataset cannot be renamed into place like a directory, so creation makes the dataset
//! at its path (mounted there by zfs), the store sets owner and mode on the mounted
//! directory, and the record is written last, in user properties (zfs-fuse has no
//! extended attributes): until then the dataset is an unfinished leftover that the next
//! create at that path, or the next start, destroys.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwapOption;

use nfsprov_api_types::{
    ArchivePath, CloneMethod, QuotaBackend, SnapshotMethod, SnapshotName, VolumePath, VolumeUsage,
};

use super::{ArchivedDataset, KeptSnapshot, Zfs, ZfsError};
use crate::store::archive::area::StoredArchive;
use crate::store::archive::naming::{ARCHIVE_DIR, archive_path};
use crate::store::backend::{CloneSource, CloneTarget, KnownQuota, Layout, VolumeBackend};
use crate::store::confine::{Root, open_child};
use crate::store::copy::CopyProgress;
use crate::store::error::{Result, StoreError, io_error, quota_error};
use crate::store::record::{QuotaRecord, VolumeRecord};
use crate::store::tree::{measure_tree, remove_tree};

#[derive(Debug)]
pub struct DatasetBackend {
    zfs: Zfs,
    /// The last listing of the volumes, sorted by path, that pages are cut from while
    /// no dataset changed through the agent since and it is fresh enough: a client
    /// paging through thousands of volumes costs one `zfs get` in all, not one a page.
    listing: ArcSwapOption<Listing>,
}

/// A listing of every volume and when it was taken.
#[derive(Debug)]
struct Listing {
    /// [`Zfs::changes`] when the listing began.
    changes: u64,
    taken: Instant,
    volumes: Vec<(VolumePath, VolumeRecord)>,
}

/// How long a listing serves pages at most: a dataset changed by hand (not through the
/// agent) shows in a page within this time, and at once in an unpaged listing.
const LISTING_FRESH: Duration = Duration::from_secs(10);

impl DatasetBackend {
    pub fn new(zfs: Zfs) -> Self {
        Self {
            zfs,
            listing: ArcSwapOption::empty(),
        }
    }

    #[cfg(test)]
    pub(super) fn zfs(&self) -> &Zfs {
        &self.zfs
    }

    /// Every volume sorted by path: the last listing when it is still what a new one
    /// would find, otherwise a new one (one `zfs get`).
    fn listing(&self, root: &Root) -> Result<Arc<Listing>> {
        let changes = self.zfs.changes();
        if let Some(listing) = self.listing.load_full()
            && listing.changes == changes
            && listing.taken.elapsed() < LISTING_FRESH
        {
            return Ok(listing);
        }
        let taken = Instant::now();
        let mut volumes = self.list(root)?;
        volumes.sort_by(|a, b| a.0.cmp(&b.0));
        volumes.dedup_by(|a, b| a.0 == b.0);
        let listing = Arc::new(Listing {
            changes,
            taken,
            volumes,
        });
        self.listing.store(Some(listing.clone()));
        Ok(listing)
    }
}

impl VolumeBackend for DatasetBackend {
    fn kind(&self) -> QuotaBackend {
        QuotaBackend::Zfs
    }

    fn can_enforce(&self) -> bool {
        true
    }

    fn layout(&self) -> Layout {
        Layout::Mounts
    }

    /// Records are properties, and the datasets themselves say which are the agent's.
    fn prepare(&self, _: &Root, _: BorrowedFd<'_>) -> Result<usize> {
        Ok(0)
    }

    /// A volume is a mount: another device than the root's own dataset.
    fn is_volume(&self, root: &Root, dir: BorrowedFd<'_>) -> Result<bool> {
        Ok(rustix::fs::fstat(dir).is_ok_and(|st| st.st_dev != root.device()))
    }

    fn find(&self, _: &Root, _: BorrowedFd<'_>, path: &VolumePath) -> Result<Option<VolumeRecord>> {
        let Some(json) = self
            .zfs
            .read_meta(path)
            .map_err(|e| zfs_error(format!("read the metadata of {path}"), e))?
        else {
            return Ok(None);
        };
        VolumeRecord::decode(json.as_bytes())
            .map(Some)
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "{path}: the dataset's volume metadata cannot be read; refusing to touch it"
                ))
            })
    }

    fn make(
        &self,
        root: &Root,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        limit: Option<u64>,
        _: u64,
    ) -> Result<Option<QuotaRecord>> {
        refuse_plain_directory(root, parent, name, path)?;
        self.zfs
            .create(path, limit)
            .map_err(|e| zfs_error(format!("create the dataset of {path}"), e))?;
        Ok(limit.map(|_| QuotaRecord::of(QuotaBackend::Zfs)))
    }

    /// A ZFS clone of a new snapshot of the source's dataset: instant, nothing is copied
    /// (so there is no progress to report), and the root directory's owner and mode come
    /// with the data.
    fn clone_volume(
        &self,
        root: &Root,
        source: &CloneSource<'_>,
        target: &CloneTarget<'_>,
        _: &CopyProgress,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        refuse_plain_directory(root, target.parent, target.name, target.path)?;
        self.zfs
            .clone_volume(source.path, target.path, target.limit)
            .map_err(|e| {
                zfs_error(
                    format!("clone the dataset of {} to {}", source.path, target.path),
                    e,
                )
            })?;
        Ok((
            target.limit.map(|_| QuotaRecord::of(QuotaBackend::Zfs)),
            CloneMethod::ZfsClone,
        ))
    }

    /// A ZFS snapshot of the source's dataset: instant, point in time. What becomes of it
    /// when the source is deleted or archived is written down in `zfs::kept`.
    fn take_kept_snapshot(
        &self,
        source: &VolumePath,
        name: &SnapshotName,
    ) -> Result<SnapshotMethod> {
        self.zfs
            .take_snapshot(source, name.as_str())
            .map_err(|e| zfs_error(format!("snapshot {source} as {name}"), e))?;
        Ok(SnapshotMethod::ZfsSnapshot)
    }

    /// Datasets are filesystems of their own to the NFS server (tested with zfs-fuse
    /// only, by the forged-handle suite in `tests/nfs-attack`:
    /// docs/isolation-findings.md).
    fn isolates_exports(&self) -> bool {
        true
    }

    fn kept_snapshots(&self) -> Result<BTreeMap<String, KeptSnapshot>> {
        self.zfs
            .kept_snapshots()
            .map_err(|e| zfs_error("list the snapshots", e))
    }

    fn kept_snapshot_of(
        &self,
        source: &VolumePath,
        name: &SnapshotName,
    ) -> Result<Option<KeptSnapshot>> {
        self.zfs
            .kept_snapshot_of(source, name.as_str())
            .map_err(|e| zfs_error(format!("read snapshot {name} of {source}"), e))
    }

    fn drop_kept_snapshot(&self, name: &SnapshotName) -> Result<bool> {
        self.zfs
            .drop_snapshot(name.as_str())
            .map_err(|e| zfs_error(format!("delete snapshot {name}"), e))
    }

    /// A ZFS clone of the snapshot: instant, and it depends on the snapshot (see
    /// `zfs::kept` for what deleting the snapshot then does).
    fn clone_kept_snapshot(
        &self,
        name: &SnapshotName,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        self.zfs
            .clone_snapshot(name.as_str(), target.path, target.limit)
            .map_err(|e| zfs_error(format!("restore {} from snapshot {name}", target.path), e))?;
        Ok((
            target.limit.map(|_| QuotaRecord::of(QuotaBackend::Zfs)),
            CloneMethod::ZfsClone,
        ))
    }

    /// A ZFS clone of a new snapshot of the archived dataset: instant, and the archive
    /// stays as it is. Deleting the archive promotes the clone first (see `zfs`'s
    /// "Clones"), so the restore outlives it.
    fn clone_archive(
        &self,
        root: &Root,
        id: &ArchivePath,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        refuse_plain_directory(root, target.parent, target.name, target.path)?;
        self.zfs
            .clone_archive(&archive_path(id), target.path, target.limit)
            .map_err(|e| zfs_error(format!("restore {} from archive {id}", target.path), e))?;
        Ok((
            target.limit.map(|_| QuotaRecord::of(QuotaBackend::Zfs)),
            CloneMethod::ZfsClone,
        ))
    }

    /// A volume is a dataset of its own, and a directory of the root dataset becomes one
    /// only by copying its data, which adoption never does.
    fn check_adoptable(&self, path: &VolumePath) -> Result<()> {
        Err(StoreError::Unsupported(format!(
            "{path}: this agent's quota backend is zfs, whose volumes are ZFS datasets; a plain directory cannot become one, so it cannot be adopted; copy its data into a volume the agent creates instead"
        )))
    }

    fn write_record(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<()> {
        let json = record.encode().map_err(|e| StoreError::Io {
            context: format!("encode the metadata of {path}"),
            source: std::io::Error::other(e),
        })?;
        self.zfs
            .write_meta(path, &json)
            .map_err(|e| zfs_error(format!("record the metadata of {path}"), e))
    }

    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: Option<&VolumePath>,
        _: KnownQuota<'_>,
    ) -> Result<()> {
        match path {
            Some(path) => self
                .zfs
                .destroy(path)
                .map_err(|e| zfs_error(format!("destroy the dataset of {path}"), e)),
            // Only plain directories ever reach the store's staging and trash areas.
            None => remove_tree(parent, name),
        }
    }

    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        _: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        let (used_bytes, objects) = self
            .zfs
            .usage(path)
            .map_err(|e| zfs_error(format!("read the usage of {path}"), e))?;
        let used_inodes = match objects {
            Some(objects) => objects,
            None => {
                measure_tree(dir.as_fd())
                    .map_err(|e| io_error(format!("measure {path}"), e))?
                    .usage
                    .used_inodes
            }
        };
        Ok(VolumeUsage {
            used_bytes,
            used_inodes,
        })
    }

    fn resize(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        _: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        self.zfs
            .set_refquota(path, Some(capacity_bytes))
            .map_err(|e| zfs_error(format!("raise the quota of {path}"), e))
    }

    fn list(&self, _: &Root) -> Result<Vec<(VolumePath, VolumeRecord)>> {
        let datasets = self
            .zfs
            .list()
            .map_err(|e| zfs_error("list the volumes' datasets", e))?;
        // Unreadable records are treated as foreign, as in the directory backend.
        Ok(datasets
            .into_iter()
            .filter_map(|(path, json)| Some((path, VolumeRecord::decode(json.as_bytes())?)))
            .collect())
    }

    fn list_page(
        &self,
        root: &Root,
        after: Option<&VolumePath>,
        limit: usize,
    ) -> Result<(Vec<(VolumePath, VolumeRecord)>, bool)> {
        let listing = self.listing(root)?;
        let start = after.map_or(0, |after| {
            listing.volumes.partition_point(|(path, _)| path <= after)
        });
        let rest = &listing.volumes[start..];
        let page = rest.iter().take(limit).cloned().collect();
        Ok((page, rest.len() > limit))
    }

    fn archive_in_place(&self, path: &VolumePath, archive_path: &str) -> Result<()> {
        self.zfs
            .archive(path, archive_path)
            .map_err(|e| zfs_error(format!("archive the dataset of {path}"), e))
    }

    /// From the archived datasets' own marks (one `zfs get`), not from a walk; the size
    /// is the dataset's `referenced`.
    fn list_archives(&self, root: &Root) -> Result<Vec<StoredArchive>> {
        let datasets = self
            .zfs
            .archives()
            .map_err(|e| zfs_error("list the archives' datasets", e))?;
        Ok(datasets
            .into_iter()
            .filter_map(|archive| {
                let id = archive_id(&archive)?;
                // Unreadable records are treated as foreign, as for volumes.
                let record = VolumeRecord::decode(archive.meta.as_ref()?.as_bytes())?;
                let usage = archive
                    .referenced
                    .zip(mounted_objects(root, &archive.location));
                Some(StoredArchive {
                    id,
                    record,
                    usage: usage.map(|(used_bytes, used_inodes)| VolumeUsage {
                        used_bytes,
                        used_inodes,
                    }),
                })
            })
            .collect())
    }

    /// The archived dataset mounted at the archive's location. Anything else there (a
    /// directory left by an interrupted destroy, or put there by hand) is no archive.
    fn find_archive(
        &self,
        _: &Root,
        _: BorrowedFd<'_>,
        id: &ArchivePath,
    ) -> Result<Option<VolumeRecord>> {
        let location = archive_path(id);
        let datasets = self
            .zfs
            .archives()
            .map_err(|e| zfs_error("list the archives' datasets", e))?;
        let Some(archive) = datasets.into_iter().find(|a| a.location == location) else {
            return Ok(None);
        };
        if archive.path != *id.volume() {
            return Err(StoreError::Conflict(format!(
                "archive {id} is the dataset {} archived from {}, mounted there by hand; refusing to touch it",
                archive.name, archive.path
            )));
        }
        archive
            .meta
            .as_deref()
            .and_then(|meta| VolumeRecord::decode(meta.as_bytes()))
            .map(Some)
            .ok_or_else(|| {
                StoreError::Conflict(format!(
                    "archive {id}: the dataset's volume metadata cannot be read; refusing to touch it"
                ))
            })
    }

    /// An archived dataset's own figures are only found through the listing; this is for
    /// when it had none.
    fn measure_archive(
        &self,
        dir: BorrowedFd<'_>,
        id: &ArchivePath,
        _: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        Ok(measure_tree(dir)
            .map_err(|e| io_error(format!("measure archive {id}"), e))?
            .usage)
    }

    fn remove_archive_in_place(&self, id: &ArchivePath) -> Result<()> {
        self.zfs
            .destroy_archive(&archive_path(id))
            .map_err(|e| zfs_error(format!("destroy the dataset of archive {id}"), e))
    }

    fn purge_unfinished(&self) -> Result<usize> {
        self.zfs
            .purge_leftovers()
            .map_err(|e| quota_error("purge unfinished datasets", e))
    }
}

/// A volume's dataset is made at its path: a directory of the root dataset itself (not
/// a mount) in the way is not the agent's.
fn refuse_plain_directory(
    root: &Root,
    parent: BorrowedFd<'_>,
    name: &str,
    path: &VolumePath,
) -> Result<()> {
    if let Ok(dir) = open_child(parent, name, false)
        && rustix::fs::fstat(&dir).is_ok_and(|st| st.st_dev == root.device())
    {
        return Err(StoreError::Conflict(format!(
            "{path} exists but is not a volume made by the agent (a plain directory, no dataset); refusing to touch it"
        )));
    }
    Ok(())
}

/// The archive id an archived dataset's mountpoint names, when it is in the archive area
/// and archived from the path the dataset says.
fn archive_id(archive: &ArchivedDataset) -> Option<ArchivePath> {
    let below = archive
        .location
        .strip_prefix(ARCHIVE_DIR)?
        .strip_prefix('/')?;
    ArchivePath::parse(below)
        .ok()
        .filter(|id| *id.volume() == archive.path)
}

/// Objects in use on the dataset mounted at `location` below the root, from its
/// `statvfs`; `None` unless a dataset of its own is mounted there (else the figures would
/// be the root dataset's).
fn mounted_objects(root: &Root, location: &str) -> Option<u64> {
    let components: Vec<&str> = location.split('/').collect();
    let dir = root.open_existing(&components).ok()??;
    if rustix::fs::fstat(&dir).ok()?.st_dev == root.device() {
        return None;
    }
    let vfs = rustix::fs::fstatvfs(&dir).ok()?;
    Some(vfs.f_files.saturating_sub(vfs.f_ffree))
}

/// Maps the tool layer's answers to the store's, keeping the API's codes meaningful.
fn zfs_error(context: impl Into<String>, error: ZfsError) -> StoreError {
    let context = context.into();
    match error {
        ZfsError::Invalid(message) => StoreError::Unsupported(format!("{context}: {message}")),
        ZfsError::Conflict(message) => StoreError::Conflict(format!("{context}: {message}")),
        ZfsError::NotFound(message) => StoreError::NotFound(format!("{context}: {message}")),
        other => quota_error(context, other),
    }
}
