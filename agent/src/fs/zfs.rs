//! The store's operations when every volume is a ZFS dataset (quota backend `zfs`).
//!
//! A dataset cannot be renamed into place like a directory, so creation makes the dataset
//! at its path (mounted there by zfs), sets owner and mode on the mounted directory, and
//! records the metadata last: until then the dataset is an unfinished leftover that the
//! next create at that path, or the next start, destroys. The parents are plain
//! directories of the root dataset, walked like any others.

use std::os::fd::AsFd;

use nfsprov_api_types::{
    ArchiveResult, CreateVolumeRequest, QuotaBackend, Volume, VolumePath, VolumeUsage,
};
use time::OffsetDateTime;

use super::{
    ARCHIVE_DIR, Archived, Created, Deleted, QuotaRecord, Result, StoreError, VolumeMeta,
    VolumeStore, archive_entries, archive_result, confirm, io_error, is_growth, not_found,
    now_rfc3339, open_child, quota_error, set_owner_and_mode, volume,
};
use crate::quota::zfs::{Zfs, ZfsError};

impl VolumeStore {
    pub(super) fn zfs_create(
        &self,
        zfs: &Zfs,
        path: &VolumePath,
        request: &CreateVolumeRequest,
    ) -> Result<(Volume, Created)> {
        self.ensure_root()?;
        let enforce = self.enforcement(path, request.quota)?;
        let wanted = self.wanted_meta(request);
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        if let Some(existing) = finished_volume(zfs, path)? {
            return confirm(path, existing, &wanted, request.quota);
        }
        // A directory of the root dataset itself (not a mount) is not the agent's.
        if let Ok(dir) = open_child(parent.as_fd(), path.file_name(), false)
            && rustix::fs::fstat(&dir).is_ok_and(|st| st.st_dev == self.root_id.0)
        {
            return Err(StoreError::Conflict(format!(
                "{path} exists but is not a volume made by the agent (a plain directory, no dataset); refusing to touch it"
            )));
        }
        let refquota = enforce.then_some(request.capacity_bytes);
        zfs.create(path, refquota)
            .map_err(|e| zfs_error(format!("create the dataset of {path}"), e))?;
        let finish = || -> Result<VolumeMeta> {
            let dir = open_child(parent.as_fd(), path.file_name(), false)?;
            let meta = VolumeMeta {
                created_at: now_rfc3339(),
                quota: enforce.then_some(QuotaRecord {
                    backend: QuotaBackend::Zfs,
                    project_id: None,
                }),
                ..wanted.clone()
            };
            set_owner_and_mode(dir.as_fd(), path, &meta)?;
            write_meta(zfs, path, &meta)?;
            Ok(meta)
        };
        match finish() {
            Ok(meta) => Ok((volume(path, meta), Created::New)),
            Err(e) => {
                // Unfinished: nothing refers to it yet, so it goes at once.
                let _ = zfs.destroy(path);
                Err(e)
            }
        }
    }

    pub(super) fn zfs_get(&self, zfs: &Zfs, path: &VolumePath) -> Result<Volume> {
        finished_volume(zfs, path)?
            .map(|meta| volume(path, meta))
            .ok_or_else(|| not_found(path))
    }

    pub(super) fn zfs_measure(&self, zfs: &Zfs, path: &VolumePath) -> Result<VolumeUsage> {
        if finished_volume(zfs, path)?.is_none() {
            return Err(not_found(path));
        }
        let (used_bytes, objects) = zfs
            .usage(path)
            .map_err(|e| zfs_error(format!("read the usage of {path}"), e))?;
        let used_inodes = match objects {
            Some(objects) => objects,
            None => {
                let parent = self
                    .walk_parents(path, false)?
                    .ok_or_else(|| not_found(path))?;
                let dir = open_child(parent.as_fd(), path.file_name(), false)?;
                crate::usage::measure_tree(dir.as_fd())
                    .map_err(|e| io_error(format!("measure {path}"), e))?
                    .used_inodes
            }
        };
        Ok(VolumeUsage {
            used_bytes,
            used_inodes,
        })
    }

    pub(super) fn zfs_resize(
        &self,
        zfs: &Zfs,
        path: &VolumePath,
        capacity_bytes: u64,
    ) -> Result<Volume> {
        self.ensure_root()?;
        let Some(mut meta) = finished_volume(zfs, path)? else {
            return Err(not_found(path));
        };
        if !is_growth(path, &meta, capacity_bytes)? {
            return Ok(volume(path, meta));
        }
        // The quota first, as for the other backends: a crash in between leaves a quota
        // at least as large as recorded, and the retry sets it again.
        if meta.quota.is_some() {
            zfs.set_refquota(path, Some(capacity_bytes))
                .map_err(|e| zfs_error(format!("raise the quota of {path}"), e))?;
        }
        meta.capacity_bytes = capacity_bytes;
        write_meta(zfs, path, &meta)?;
        Ok(volume(path, meta))
    }

    pub(super) fn zfs_delete(&self, zfs: &Zfs, path: &VolumePath) -> Result<Deleted> {
        self.ensure_root()?;
        if finished_volume(zfs, path)?.is_none() {
            return Ok(Deleted::WasAbsent);
        }
        zfs.destroy(path)
            .map_err(|e| zfs_error(format!("destroy the dataset of {path}"), e))?;
        Ok(Deleted::Removed)
    }

    pub(super) fn zfs_archive(
        &self,
        zfs: &Zfs,
        path: &VolumePath,
    ) -> Result<(ArchiveResult, Archived)> {
        self.ensure_root()?;
        let mut archive_components = vec![ARCHIVE_DIR];
        archive_components.extend(path.components());
        if finished_volume(zfs, path)?.is_none() {
            return match self.latest_archive(&archive_components)? {
                Some(entry) => Ok((archive_result(path, &entry), Archived::Earlier)),
                None => Err(StoreError::NotFound(format!(
                    "no volume at {path} and no archive of it"
                ))),
            };
        }
        let target = self.open_internal(&archive_components, true)?;
        let taken = |entry: &str| open_child(target.as_fd(), entry, false).is_ok();
        let entry = archive_entries(OffsetDateTime::now_utc())
            .find(|entry| !taken(entry))
            .ok_or_else(|| {
                StoreError::Conflict(format!("could not find a free archive name for {path}"))
            })?;
        zfs.archive(path, &format!("{ARCHIVE_DIR}/{path}/{entry}"))
            .map_err(|e| zfs_error(format!("archive the dataset of {path}"), e))?;
        Ok((archive_result(path, &entry), Archived::New))
    }

    pub(super) fn zfs_list(&self, zfs: &Zfs) -> Result<Vec<Volume>> {
        let mut volumes = Vec::new();
        for (path, json) in zfs
            .list()
            .map_err(|e| zfs_error("list the volumes' datasets", e))?
        {
            // Unreadable metadata is treated as foreign, as in the directory backends.
            if let Ok(meta) = serde_json::from_str::<VolumeMeta>(&json) {
                volumes.push(volume(&path, meta));
            }
        }
        volumes.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(volumes)
    }
}

/// The metadata of the finished volume at `path`, if there is one.
fn finished_volume(zfs: &Zfs, path: &VolumePath) -> Result<Option<VolumeMeta>> {
    let Some(json) = zfs
        .read_meta(path)
        .map_err(|e| zfs_error(format!("read the metadata of {path}"), e))?
    else {
        return Ok(None);
    };
    serde_json::from_str(&json).map(Some).map_err(|_| {
        StoreError::Conflict(format!(
            "{path}: the dataset's volume metadata cannot be read; refusing to touch it"
        ))
    })
}

fn write_meta(zfs: &Zfs, path: &VolumePath, meta: &VolumeMeta) -> Result<()> {
    let json = serde_json::to_string(meta).map_err(|e| StoreError::Io {
        context: format!("encode the metadata of {path}"),
        source: std::io::Error::other(e),
    })?;
    zfs.write_meta(path, &json)
        .map_err(|e| zfs_error(format!("record the metadata of {path}"), e))
}

/// Maps the module's answers to the store's, keeping the API's codes meaningful.
fn zfs_error(context: impl Into<String>, error: ZfsError) -> StoreError {
    let context = context.into();
    match error {
        ZfsError::Invalid(message) => StoreError::Unsupported(format!("{context}: {message}")),
        ZfsError::Conflict(message) => StoreError::Conflict(format!("{context}: {message}")),
        ZfsError::NotFound(message) => StoreError::NotFound(format!("{context}: {message}")),
        other => quota_error(context, other),
    }
}
