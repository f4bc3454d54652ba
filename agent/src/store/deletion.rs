//! Deleting a volume (through the trash, or in place for mounts) and purging what a
//! crash left in the work areas.

use std::os::fd::AsFd;

use nfsprov_api_types::VolumePath;
use rustix::fs::RenameFlags;
use rustix::io::Errno;

use crate::store::confine::{STAGING_DIR, TRASH_DIR, list_dir, open_child};
use crate::store::durable::Changes;
use crate::store::error::io_error;

use crate::store::{Deleted, KnownQuota, Layout, Purge, Result, STATE_DIR, VolumeStore};

impl VolumeStore {
    /// Removes the volume's whole tree; symlinks inside it are removed, never followed.
    pub fn delete(&self, path: &VolumePath) -> Result<Deleted> {
        self.root.ensure_present()?;
        let Some((parent, record)) = self.locate(path)? else {
            // Perhaps a retry of a delete whose sync failed: confirmed once durable.
            if let Some(parent) = self.walk_parents(path, false)? {
                let mut changes = Changes::new();
                changes.owned(parent);
                if self.backend.layout() == Layout::Directories {
                    changes.owned(self.root.open_internal(&[STATE_DIR, TRASH_DIR], false)?);
                }
                self.durable.commit(changes)?;
            }
            return Ok(Deleted::WasAbsent);
        };
        if self.backend.layout() == Layout::Mounts {
            self.backend.remove(
                parent.as_fd(),
                path.file_name(),
                Some(path),
                KnownQuota::Known(record.quota.as_ref()),
            )?;
            self.provisioned.release(record.capacity_bytes);
            self.prefix_tally.forget(path);
            let mut changes = Changes::new();
            changes.dir(parent.as_fd())?;
            self.durable.commit(changes)?;
            return Ok(Deleted::Removed);
        }
        self.refuse_mount_points(path, path.as_str(), "delete")?;
        let trash = self.root.open_internal(&[STATE_DIR, TRASH_DIR], false)?;
        // Known while the directory is there: where its record's removal is to be synced.
        let record_dirs = {
            let dir = open_child(parent.as_fd(), path.file_name(), false)?;
            self.backend.record_dirs(dir.as_fd())?
        };
        let doomed = self.unique_name("del");
        match rustix::fs::renameat_with(
            &parent,
            path.file_name(),
            &trash,
            doomed.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            // Gone from its path: what is left in the trash is no volume any more.
            Ok(()) => {
                self.provisioned.release(record.capacity_bytes);
                self.prefix_tally.forget(path);
            }
            Err(Errno::NOENT) => return Ok(Deleted::WasAbsent),
            Err(e) => return Err(io_error(format!("move {path} to the trash"), e)),
        }
        self.backend.remove(
            trash.as_fd(),
            &doomed,
            None,
            KnownQuota::Known(record.quota.as_ref()),
        )?;
        let mut changes = Changes::new();
        changes
            .dir(parent.as_fd())?
            .dir(trash.as_fd())?
            .extend(record_dirs);
        self.durable.commit(changes)?;
        Ok(Deleted::Removed)
    }

    /// Removes whatever a crash left in the staging, trash and snapshot areas, and volumes made in
    /// place but never finished. An entry that cannot be removed is reported and left
    /// for the next start: it never keeps the agent from serving.
    pub fn purge_leftovers(&self) -> Purge {
        let mut purge = Purge::default();
        self.purge_snapshot_leftovers(&mut purge);
        match self.backend.purge_unfinished() {
            Ok(n) => purge.removed += n,
            Err(e) => purge.failed.push(("unfinished volumes".to_owned(), e)),
        }
        for area in [STAGING_DIR, TRASH_DIR] {
            let listed = self
                .root
                .open_internal(&[STATE_DIR, area], false)
                .and_then(|dir| {
                    let names =
                        list_dir(dir.as_fd()).map_err(|e| io_error(format!("list {area}"), e))?;
                    Ok((dir, names))
                });
            let (dir, names) = match listed {
                Ok(listed) => listed,
                Err(e) => {
                    purge.failed.push((format!("{STATE_DIR}/{area}"), e));
                    continue;
                }
            };
            for (name, _) in names {
                match self
                    .backend
                    .remove(dir.as_fd(), &name, None, KnownQuota::Unknown)
                {
                    Ok(()) => purge.removed += 1,
                    Err(e) => purge.failed.push((format!("{STATE_DIR}/{area}/{name}"), e)),
                }
            }
        }
        purge
    }

    /// How many entries the staging and trash areas hold: work in flight, or leftovers
    /// that could not be removed (the log names them). Absent areas hold none.
    pub fn leftover_count(&self) -> Result<usize> {
        let mut count = 0;
        for area in [STAGING_DIR, TRASH_DIR] {
            let Some(dir) = self.root.open_existing(&[STATE_DIR, area])? else {
                continue;
            };
            count += list_dir(dir.as_fd())
                .map_err(|e| io_error(format!("list {area}"), e))?
                .len();
        }
        Ok(count)
    }
}
