//! Volumes made from archives. An archive is a finished volume that only moved, so a
//! restore makes a new volume from it as a clone is made from a volume: a writable btrfs
//! snapshot of the archived subvolume, a ZFS clone of a new snapshot of the archived
//! dataset, else reflinks or an exact copy by the clone engine, in staging first so that
//! only a complete copy ever reaches the path. The archive is only read: it stays listed,
//! with its retention, and can be restored again.
//!
//! The caller holds the lock of the path the archive was made of (the one archive
//! deletion and the retention sweep take), so the archive cannot go while it is read.
//! Afterwards the restore shares nothing the archive's deletion could take: a btrfs
//! snapshot is a subvolume of its own, a copy is a copy, and deleting an archived dataset
//! promotes its ZFS clones first.

use std::os::fd::{AsFd, BorrowedFd};

use nfsprov_api_types::{ArchivePath, RestoreSource, RestoreVolumeRequest, Volume, VolumePath};

use super::area::{StoredArchive, open_entry};
use super::naming::{archive_components, archive_path};
use crate::store::backend::{CloneSource, Layout};
use crate::store::copy::CopyProgress;
use crate::store::error::{Result, StoreError};
use crate::store::{Created, VolumeStore};

impl VolumeStore {
    /// The archive `id` as the store knows it, or `None`: with the usage the backend
    /// knows without a walk, as the listing has it.
    pub fn find_stored_archive(&self, id: &ArchivePath) -> Result<Option<StoredArchive>> {
        if self.backend.layout() == Layout::Mounts {
            // One listing of the datasets either way; it carries their figures.
            return Ok(self
                .backend
                .list_archives(&self.root)?
                .into_iter()
                .find(|archive| archive.id == *id));
        }
        let Some(parent) = self.root.open_existing(&archive_components(id.volume()))? else {
            return Ok(None);
        };
        Ok(self
            .backend
            .find_archive(&self.root, parent.as_fd(), id)?
            .map(|record| StoredArchive {
                id: id.clone(),
                record,
                usage: None,
            }))
    }

    /// Makes the volume at `path` (its parent directory `parent`, nothing at it yet) from
    /// the archive `id`. Callers hold the locks of `id`'s volume path and of `path`.
    pub(in crate::store) fn restore_from_archive(
        &self,
        parent: BorrowedFd<'_>,
        path: &VolumePath,
        source: &RestoreSource,
        id: &ArchivePath,
        request: &RestoreVolumeRequest,
        progress: &CopyProgress,
    ) -> Result<(Volume, Created)> {
        let missing = || {
            StoreError::NotFound(format!(
                "{path}: there is no archive {id} to restore from; nothing was created"
            ))
        };
        let archive_parent = self
            .root
            .open_existing(&archive_components(id.volume()))?
            .ok_or_else(missing)?;
        let record = self
            .backend
            .find_archive(&self.root, archive_parent.as_fd(), id)?
            .ok_or_else(missing)?;
        if request.capacity_bytes < record.capacity_bytes {
            return Err(StoreError::Invalid(format!(
                "{path}: a restore of archive {id} needs at least the capacity its volume had, {} bytes; {} bytes were asked for",
                record.capacity_bytes, request.capacity_bytes
            )));
        }
        let dir = open_entry(archive_parent.as_fd(), id)?.ok_or_else(missing)?;
        self.refuse_mount_points(
            &format_args!("{path}: archive {id}"),
            &archive_path(id),
            "restore",
        )?;
        let clone_source = CloneSource {
            path: id.volume(),
            dir: dir.as_fd(),
            record: &record,
        };
        self.make_restored(parent, &clone_source, path, source, request, progress)
    }
}
