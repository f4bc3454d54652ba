//! Migration of records kept the old way, in the `user.nfsprov.volume` extended attribute
//! of each volume directory, which whoever can write the volume can change. At start the
//! agent copies each such record into its own store and then removes the attribute; a
//! start interrupted halfway simply does the rest next time, and nothing is lost.
//!
//! Only the places where the agent itself put volumes are searched (paths beneath the
//! root, the archive, staging and trash), and never below a volume: an attribute a tenant
//! planted inside a volume is never taken for a record. And only once: after the first
//! start that completes it, a marker in the agent's state directory turns it off, so an
//! attribute planted later on a directory that is not a volume never makes one.

use std::os::fd::{AsFd, BorrowedFd};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::confine::{Root, list_dir, may_be_directory, open_child};
use super::error::{Result, io_error};
use super::record::{RecordStore, VolumeRecord};

const LEGACY_XATTR: &str = "user.nfsprov.volume";
/// Records were never larger; anything bigger was not written by the agent.
const LEGACY_MAX_BYTES: usize = 4096;

/// Where to search, below the root, and how many levels deep volumes can sit there.
pub(super) struct Area<'a> {
    pub components: &'a [&'a str],
    pub depth: usize,
}

/// Marks, in the agent's state directory, that the migration has been done: a tenant who
/// can set extended attributes on a directory it owns (any directory of a provisioner
/// being replaced, over NFS) must not have it taken for a volume at a later start.
const MIGRATED_MARKER: &str = "legacy-records-migrated";

/// [`migrate`], at the first start that gets to the end of it, never again.
pub(super) fn migrate_once(
    state: BorrowedFd<'_>,
    root: &Root,
    store: &RecordStore,
    areas: &[Area<'_>],
) -> Result<usize> {
    match rustix::fs::statat(state, MIGRATED_MARKER, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(_) => return Ok(0),
        Err(Errno::NOENT) => {}
        Err(e) => return Err(io_error("look for the migration marker", e)),
    }
    let migrated = migrate(root, store, areas)?;
    // Written only after a complete pass: an interrupted start does the rest next time.
    match rustix::fs::openat(
        state,
        MIGRATED_MARKER,
        OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    ) {
        Ok(_) | Err(Errno::EXIST) => Ok(migrated),
        Err(e) => Err(io_error("write the migration marker", e)),
    }
}

/// Moves every record kept the old way in `areas` into `store`; answers how many.
fn migrate(root: &Root, store: &RecordStore, areas: &[Area<'_>]) -> Result<usize> {
    let mut migrated = 0;
    for area in areas {
        let Some(dir) = root.open_existing(area.components)? else {
            continue;
        };
        let mut prefix: Vec<String> = area.components.iter().map(|c| (*c).to_owned()).collect();
        migrate_below(
            store,
            dir.as_fd(),
            area.depth,
            &mut prefix,
            area.components.is_empty(),
            &mut migrated,
        )?;
    }
    Ok(migrated)
}

fn migrate_below(
    store: &RecordStore,
    dir: BorrowedFd<'_>,
    depth: usize,
    prefix: &mut Vec<String>,
    skip_hidden: bool,
    migrated: &mut usize,
) -> Result<()> {
    if depth == 0 {
        return Ok(());
    }
    for (name, kind) in list_dir(dir).map_err(|e| io_error("scan for records to migrate", e))? {
        // At the top of the root, hidden entries are the agent's areas, searched apart.
        if (skip_hidden && name.starts_with('.')) || !may_be_directory(kind) {
            continue;
        }
        let Ok(child) = open_child(dir, &name, false) else {
            continue;
        };
        prefix.push(name);
        let location = prefix.join("/");
        if store.contains(child.as_fd())? {
            // Already the store's: a volume, never searched below. A leftover attribute
            // of an interrupted migration goes.
            remove_legacy(child.as_fd(), &location)?;
        } else if let Some(record) = read_legacy(child.as_fd(), &location)? {
            store.write(child.as_fd(), &location, &record)?;
            remove_legacy(child.as_fd(), &location)?;
            *migrated += 1;
        } else {
            migrate_below(store, child.as_fd(), depth - 1, prefix, false, migrated)?;
        }
        prefix.pop();
    }
    Ok(())
}

fn read_legacy(dir: BorrowedFd<'_>, location: &str) -> Result<Option<VolumeRecord>> {
    let mut buf = vec![0u8; LEGACY_MAX_BYTES];
    match rustix::fs::fgetxattr(dir, LEGACY_XATTR, &mut buf[..]) {
        Ok(len) => {
            buf.truncate(len);
            // Unreadable: not a record the agent wrote; the directory stays foreign.
            Ok(VolumeRecord::decode(&buf))
        }
        Err(Errno::NODATA | Errno::NOTSUP | Errno::RANGE) => Ok(None),
        Err(e) => Err(io_error(format!("read the old record of {location}"), e)),
    }
}

fn remove_legacy(dir: BorrowedFd<'_>, location: &str) -> Result<()> {
    match rustix::fs::fremovexattr(dir, LEGACY_XATTR) {
        Ok(()) | Err(Errno::NODATA | Errno::NOTSUP) => Ok(()),
        Err(e) => Err(io_error(format!("remove the old record of {location}"), e)),
    }
}
