//! The record store checked against the disk at start. A crash between removing a
//! volume's tree and removing its record (a delete, or the purge of the trash) leaves a
//! record of a directory that no longer exists: its XFS project id would stay taken, and
//! on a filesystem without birth times a new directory given the same inode number would
//! be taken for that volume. Such records are removed before the agent serves, and their
//! quotas released.
//!
//! A record is kept as long as the directory it names is where the agent can have put it:
//! at the path it records, in that path's archive directory, or in staging or the trash
//! (which the purge after start handles with their records). Found elsewhere (moved by
//! hand) or nowhere, it is stale. Whatever cannot be checked (a path that cannot be
//! walked, say) keeps its record: a record is removed only when the volume is known gone.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd};

use nfsprov_api_types::VolumePath;

use super::archive::naming::archive_components;
use super::confine::{Root, STAGING_DIR, STATE_DIR, TRASH_DIR, list_dir, open_child};
use super::error::{Result, StoreError, io_error};
use super::record::{Identity, RecordKey, RecordStore, VolumeRecord};

type Keys = HashSet<RecordKey>;

/// Removes the records whose volume is gone; answers them, with the path each was for.
pub(super) fn remove_stale(
    root: &Root,
    records: &RecordStore,
) -> Result<Vec<(String, VolumeRecord)>> {
    let mut in_work_areas = Keys::new();
    for area in [STAGING_DIR, TRASH_DIR] {
        if let Some(dir) = root.open_existing(&[STATE_DIR, area])? {
            keys_of_entries(dir.as_fd(), |_| true, None, &mut in_work_areas)?;
        }
    }
    let mut stale = Vec::new();
    for (key, path, record) in records.entries()? {
        if in_work_areas.contains(&key) {
            continue;
        }
        let Ok(volume) = VolumePath::parse(&path) else {
            tracing::warn!(%path, "a record names an invalid path; kept");
            continue;
        };
        match is_present(root, records, &volume, &key) {
            Ok(true) => {}
            Ok(false) => {
                records.remove_entry(&key)?;
                stale.push((path, record));
            }
            Err(error) => {
                tracing::warn!(%path, %error, "could not check whether a recorded volume still exists; its record is kept");
            }
        }
    }
    Ok(stale)
}

/// Whether the directory recorded under `key` is at `path` or archived from it (and not
/// another directory given its inode number since).
fn is_present(
    root: &Root,
    records: &RecordStore,
    path: &VolumePath,
    key: &RecordKey,
) -> Result<bool> {
    let components: Vec<&str> = path.components().collect();
    let mut found = Keys::new();
    if let Some(parent) = root.open_existing(&components[..components.len() - 1])? {
        match open_child(parent.as_fd(), path.file_name(), false) {
            Ok(dir) => add_keys(dir.as_fd(), Some(records), &mut found)?,
            // Nothing, or no directory, at the path: the volume is not there.
            Err(StoreError::NotFound(_) | StoreError::Unsafe(_)) => {}
            Err(e) => return Err(e),
        }
    }
    if found.contains(key) {
        return Ok(true);
    }
    if let Some(archived) = root.open_existing(&archive_components(path))? {
        keys_of_entries(
            archived.as_fd(),
            |name| name.starts_with(nfsprov_api_types::ARCHIVE_ENTRY_PREFIX),
            Some(records),
            &mut found,
        )?;
    }
    Ok(found.contains(key))
}

/// The keys of the directories in `dir` whose names `wanted` accepts.
fn keys_of_entries(
    dir: BorrowedFd<'_>,
    wanted: impl Fn(&str) -> bool,
    records: Option<&RecordStore>,
    keys: &mut Keys,
) -> Result<()> {
    for (name, _) in list_dir(dir).map_err(|e| io_error("list a directory of volumes", e))? {
        if !wanted(&name) {
            continue;
        }
        match open_child(dir, &name, false) {
            Ok(entry) => add_keys(entry.as_fd(), records, keys)?,
            Err(StoreError::NotFound(_) | StoreError::Unsafe(_)) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The keys `dir` would have its record under; with `records`, only when the record
/// there is its own.
fn add_keys(dir: BorrowedFd<'_>, records: Option<&RecordStore>, keys: &mut Keys) -> Result<()> {
    if let Some(records) = records
        && records.read(dir)?.is_none()
    {
        return Ok(());
    }
    let identity = Identity::of(dir).map_err(|e| io_error("identify a directory", e))?;
    keys.insert(identity.key());
    keys.extend(identity.legacy_key());
    Ok(())
}
