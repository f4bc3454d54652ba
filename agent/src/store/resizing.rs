//! Growing a volume's capacity and its quota.

use std::os::fd::AsFd;

use nfsprov_api_types::{Volume, VolumePath};

use crate::store::confine::open_child;
use crate::store::error::not_found;

use crate::store::{Result, StoreError, VolumeRecord, VolumeStore};

impl VolumeStore {
    /// Whether [`Self::resize`] to `capacity_bytes` would grow the volume (an error for
    /// a shrink or a volume that is not there), for a caller that must prepare for it.
    pub fn would_grow(&self, path: &VolumePath, capacity_bytes: u64) -> Result<bool> {
        self.root.ensure_present()?;
        let (_, record) = self.locate(path)?.ok_or_else(|| not_found(path))?;
        is_growth(path, &record, capacity_bytes)
    }

    /// Raises the volume's capacity, and its quota when one enforces it. The same
    /// capacity again is a success that changes nothing; shrinking is refused.
    pub fn resize(&self, path: &VolumePath, capacity_bytes: u64) -> Result<Volume> {
        self.root.ensure_present()?;
        let (parent, mut record) = self.locate(path)?.ok_or_else(|| not_found(path))?;
        if !is_growth(path, &record, capacity_bytes)? {
            // Perhaps a retry of a resize whose sync failed: confirmed once durable.
            self.settle(path, parent.as_fd())?;
            return Ok(record.to_volume(path));
        }
        let reservation = self.promise_growth(path, record.capacity_bytes, capacity_bytes)?;
        if let Some(quota) = &record.quota {
            if quota.backend != self.backend.kind() {
                return Err(StoreError::Unsupported(format!(
                    "{path} is limited by a {} quota, but the agent runs with quota backend {}; its quota cannot be changed",
                    quota.backend,
                    self.backend.kind()
                )));
            }
            // The quota first: a crash before the record is updated leaves a quota at
            // least as large as recorded, and the retried request sets it again.
            if self.backend.grows_offline() {
                // Its filesystem is unmounted meanwhile: nothing here may hold it open.
                self.backend.grow_offline(path, quota, capacity_bytes)?;
            } else {
                let dir = open_child(parent.as_fd(), path.file_name(), false)?;
                self.backend
                    .resize(dir.as_fd(), path, quota, capacity_bytes)?;
            }
        }
        let dir = open_child(parent.as_fd(), path.file_name(), false)?;
        record.capacity_bytes = capacity_bytes;
        self.backend.write_record(dir.as_fd(), path, &record)?;
        reservation.keep();
        drop(dir);
        self.settle(path, parent.as_fd())?;
        Ok(record.to_volume(path))
    }
}

/// Whether a resize to `capacity_bytes` changes anything; an error for a shrink.
pub(in crate::store) fn is_growth(
    path: &VolumePath,
    record: &VolumeRecord,
    capacity_bytes: u64,
) -> Result<bool> {
    if capacity_bytes < record.capacity_bytes {
        return Err(StoreError::Unsupported(format!(
            "{path} has a capacity of {} bytes; shrinking it to {capacity_bytes} bytes is not supported",
            record.capacity_bytes
        )));
    }
    Ok(capacity_bytes > record.capacity_bytes)
}
