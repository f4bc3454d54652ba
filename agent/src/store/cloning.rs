//! Cloning a volume: the copy made beside its path and placed only once complete.

use std::os::fd::{AsFd, BorrowedFd};

use nfsprov_api_types::{CloneVolumeRequest, RestoreSource, Volume, VolumePath};

use crate::holds;
use crate::store::confine::{STAGING_DIR, open_child};
use crate::store::confirm_made;
use crate::store::error::not_found;

use crate::store::{
    CloneSource, CloneTarget, CopyProgress, Created, KnownQuota, Layout, NewVolume, Origin, Result,
    STATE_DIR, Staged, StoreError, VolumeRecord, VolumeStore, record_as_found,
};

impl VolumeStore {
    /// Makes a new volume at `path` holding a copy of the volume `request.source`, by the
    /// fastest exact method the backend has (snapshot, clone, reflinks or a local copy),
    /// or confirms the clone is already there. The copy is made beside its path (in
    /// staging, or as an unfinished dataset) and becomes the volume only when complete,
    /// so a crash or a failure leaves no partial clone at the path. The new root keeps
    /// the source root's owner and mode. Callers hold the locks of both paths.
    pub fn clone_volume(
        &self,
        path: &VolumePath,
        request: &CloneVolumeRequest,
        progress: &CopyProgress,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        let source_path = &request.source;
        if source_path == path {
            return Err(StoreError::Unsupported(format!(
                "{path}: a volume cannot be cloned onto itself"
            )));
        }
        let _nesting = self.nesting.making(path.as_str());
        let reservation = self.promise(path, request.capacity_bytes)?;
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        if let Some(existing) = self.backend.find(&self.root, parent.as_fd(), path)? {
            let confirmed = confirm_clone(path, existing, request)?;
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        let Some((source_parent, source_record)) = self.locate(source_path)? else {
            return Err(StoreError::NotFound(format!(
                "{path}: the source volume {source_path} does not exist; nothing was created"
            )));
        };
        if request.capacity_bytes < source_record.capacity_bytes {
            return Err(StoreError::Unsupported(format!(
                "{path}: a clone of {source_path} needs at least its capacity of {} bytes; {} bytes were asked for",
                source_record.capacity_bytes, request.capacity_bytes
            )));
        }
        self.refuse_mount_points(
            &format_args!("{path}: the source volume {source_path}"),
            source_path.as_str(),
            "clone",
        )?;
        let source_dir = open_child(source_parent.as_fd(), source_path.file_name(), false)?;
        let source = CloneSource {
            path: source_path,
            dir: source_dir.as_fd(),
            record: &source_record,
        };
        let wanted = NewVolume {
            path,
            capacity_bytes: request.capacity_bytes,
            owner: &request.owner,
            quota: request.quota,
            origin: Origin::Clone(source_path),
        };
        let made = self.make_from(parent.as_fd(), &source, &wanted, progress, |existing| {
            confirm_clone(path, existing, request)
        });
        reservation.keep_if(matches!(made, Ok((_, Created::New))));
        made
    }

    /// Makes the volume `wanted` (whose parent directory is `parent`) holding a copy of
    /// `source`, by the fastest exact method the backend has, beside its path first (in
    /// staging, or as an unfinished dataset), so that only a complete copy ever reaches
    /// the path. What is found at the path meanwhile is judged by `confirm_taken`.
    pub(in crate::store) fn make_from(
        &self,
        parent: BorrowedFd<'_>,
        source: &CloneSource<'_>,
        wanted: &NewVolume<'_>,
        progress: &CopyProgress,
        confirm_taken: impl FnOnce(VolumeRecord) -> Result<(Volume, Created)>,
    ) -> Result<(Volume, Created)> {
        let path = wanted.path;
        let limit = self
            .enforcement(path, wanted.quota)?
            .then_some(wanted.capacity_bytes);
        let made_record = |dir: BorrowedFd<'_>, quota, method| -> Result<VolumeRecord> {
            let mut record = VolumeRecord {
                quota,
                ..record_as_found(dir, path, wanted.capacity_bytes, wanted.owner)?
            };
            wanted.origin.record(&mut record, method);
            self.backend.write_record(dir, path, &record)?;
            Ok(record)
        };
        match self.backend.layout() {
            Layout::Directories => {
                let staging = self.root.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
                let staged = self.unique_name("clone");
                let target = CloneTarget {
                    parent: staging.as_fd(),
                    name: &staged,
                    path,
                    limit,
                    capacity_bytes: wanted.capacity_bytes,
                };
                // The copy's data is written back before the clone can reach its path:
                // a size committed ahead of its data would read back as zeros.
                let made = self
                    .backend
                    .clone_volume(&self.root, source, &target, progress)
                    .and_then(|made| self.durable.sync_filesystem().map(|()| made));
                let (quota, method) = match made {
                    Ok(made) => {
                        if matches!(wanted.origin, Origin::Restore(_)) {
                            holds::wait_if_asked(holds::RESTORES);
                        }
                        made
                    }
                    Err(e) => {
                        // Whatever the backend left goes now, not at the next start.
                        if let Err(left) =
                            self.backend
                                .remove(staging.as_fd(), &staged, None, KnownQuota::Unknown)
                        {
                            tracing::warn!(%path, error = %left, "could not remove a failed clone from staging; it goes at the next start");
                        }
                        return Err(e);
                    }
                };
                let placed = self.place_staged(
                    path,
                    parent,
                    Staged {
                        dir: staging.as_fd(),
                        name: &staged,
                        quota: quota.as_ref(),
                    },
                    |dir| made_record(dir, quota.clone(), method),
                    confirm_taken,
                )?;
                self.settle(path, parent)?;
                Ok(placed)
            }
            Layout::Mounts => {
                let leaf = path.file_name();
                let target = CloneTarget {
                    parent,
                    name: leaf,
                    path,
                    limit,
                    capacity_bytes: wanted.capacity_bytes,
                };
                let (quota, method) = match &wanted.origin {
                    Origin::Restore(RestoreSource::Snapshot(name)) => {
                        self.backend.clone_kept_snapshot(name, &target)?
                    }
                    Origin::Restore(RestoreSource::Archive(id)) => {
                        self.backend.clone_archive(&self.root, id, &target)?
                    }
                    Origin::Clone(_) => self
                        .backend
                        .clone_volume(&self.root, source, &target, progress)?,
                };
                let finished = open_child(parent, leaf, false)
                    .and_then(|dir| made_record(dir.as_fd(), quota.clone(), method));
                match finished {
                    Ok(record) => {
                        self.settle(path, parent)?;
                        Ok((record.to_volume(path), Created::New))
                    }
                    Err(e) => {
                        // Unfinished: nothing refers to it yet, so it goes at once.
                        let _ = self.backend.remove(
                            parent,
                            leaf,
                            Some(path),
                            KnownQuota::Known(quota.as_ref()),
                        );
                        Err(e)
                    }
                }
            }
        }
    }
}

/// A repeated clone is confirmed only when the volume there is a clone of the same source
/// with the same capacity, owner and quota. Mode and owner come from the source, so they
/// are not compared.
pub(in crate::store) fn confirm_clone(
    path: &VolumePath,
    existing: VolumeRecord,
    request: &CloneVolumeRequest,
) -> Result<(Volume, Created)> {
    let origin = match &existing.clone {
        Some(origin) if origin.source == request.source => None,
        Some(origin) => Some(format!(
            "a clone of {} (requested a clone of {})",
            origin.source, request.source
        )),
        None => Some(format!(
            "not a clone (requested a clone of {})",
            request.source
        )),
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
