//! The archive area beneath the root: finding the archives in it and removing the empty
//! directories deleted archives leave behind.
//!
//! `.archive` holds the volume paths' directories, which are the agent's own, and in
//! them the archive entries (`@<time>`), which are tenants' trees. A walk descends only
//! through names a volume path can have, at most as deep as a path can be, never through
//! a symlink, and never into an entry: what a tenant left inside its archive is never
//! read as structure.

use std::os::fd::AsFd;

use nfsprov_api_types::{
    ARCHIVE_ENTRY_PREFIX, ArchiveEntry, ArchivePath, MAX_COMPONENTS, VolumePath, VolumeUsage,
    validate_component,
};
use rustix::fs::AtFlags;
use rustix::io::Errno;
use time::OffsetDateTime;

use super::naming::{ARCHIVE_DIR, archive_path, archived_at};
use crate::store::confine::{Root, list_dir, may_be_directory, open_child};
use crate::store::error::{Result, StoreError, io_error};
use crate::store::record::{VolumeRecord, parse_rfc3339};

/// An archive the agent made, with the record of the volume it was.
#[derive(Debug, Clone)]
pub struct StoredArchive {
    pub id: ArchivePath,
    pub record: VolumeRecord,
    /// When the backend knows it without walking the tree (a dataset's own count).
    pub usage: Option<VolumeUsage>,
}

impl StoredArchive {
    /// Where the archive is, relative to the root.
    pub fn archive_path(&self) -> String {
        archive_path(&self.id)
    }

    /// When the volume was archived: as recorded, else as its entry's name says
    /// (archives made before the time was recorded).
    pub fn archived_at(&self) -> Option<OffsetDateTime> {
        self.record
            .archive
            .as_ref()
            .and_then(|archive| parse_rfc3339(&archive.archived_at))
            .or_else(|| archived_at(self.id.entry()))
    }

    /// The retention the archive request asked for.
    pub fn retention_days(&self) -> Option<u32> {
        self.record.archive.as_ref()?.retention_days
    }
}

/// Every archive entry beneath the archive area, by the name it has: what is there is
/// not checked against any record (the backend does that).
pub(crate) fn walk(root: &Root) -> Result<Vec<ArchivePath>> {
    let mut found = Vec::new();
    // Components below the archive area; each directory is reopened from the root, so
    // a wide tree costs no descriptor per pending directory.
    let mut pending: Vec<Vec<String>> = vec![Vec::new()];
    while let Some(components) = pending.pop() {
        let mut full = vec![ARCHIVE_DIR];
        full.extend(components.iter().map(String::as_str));
        let dir = match root.open_existing(&full) {
            Ok(Some(dir)) => dir,
            // Gone meanwhile, or replaced by a symlink: nothing to list there.
            Ok(None) | Err(StoreError::Unsafe(_)) => continue,
            Err(e) => return Err(e),
        };
        let names = list_dir(dir.as_fd()).map_err(|e| io_error("list the archive area", e))?;
        for (name, kind) in names {
            if !may_be_directory(kind) {
                continue;
            }
            if name.starts_with(ARCHIVE_ENTRY_PREFIX) {
                let volume = VolumePath::parse(&components.join("/"));
                if let (Ok(volume), Ok(entry)) = (volume, ArchiveEntry::parse(&name)) {
                    found.push(ArchivePath::new(volume, entry));
                }
            } else if components.len() < MAX_COMPONENTS && validate_component(&name).is_ok() {
                let mut below = components.clone();
                below.push(name);
                pending.push(below);
            }
        }
    }
    Ok(found)
}

/// Removes the directories of `volume`'s path in the archive area that no longer hold
/// anything, deepest first, up to (not including) the archive area itself. A directory
/// that is not empty, or not a directory, stops it.
pub(crate) fn prune(root: &Root, volume: &VolumePath) -> Result<()> {
    let components: Vec<&str> = volume.components().collect();
    for depth in (1..=components.len()).rev() {
        let mut parent = vec![ARCHIVE_DIR];
        parent.extend(&components[..depth - 1]);
        let Some(dir) = root.open_existing(&parent)? else {
            continue;
        };
        let name = components[depth - 1];
        match rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => {}
            Err(Errno::NOTEMPTY | Errno::EXIST | Errno::NOTDIR | Errno::BUSY) => return Ok(()),
            Err(e) => {
                return Err(io_error(
                    format!("remove the empty archive directory of {volume}"),
                    e,
                ));
            }
        }
    }
    Ok(())
}

/// Opens the entry of `id` in its archive directory `parent`: `None` when absent.
pub(crate) fn open_entry(
    parent: std::os::fd::BorrowedFd<'_>,
    id: &ArchivePath,
) -> Result<Option<std::os::fd::OwnedFd>> {
    match open_child(parent, id.entry().as_str(), false) {
        Ok(dir) => Ok(Some(dir)),
        Err(StoreError::NotFound(_)) => Ok(None),
        Err(e) => Err(e),
    }
}
