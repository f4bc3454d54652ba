//! Archiving a volume into `.archive/<path>/@<time>`, and listing, measuring and
//! deleting archives.

use std::os::fd::AsFd;

use nfsprov_api_types::{
    ArchiveEntry, ArchivePath, ArchiveResult, PageRequest, VolumePath, VolumeUsage,
};
use rustix::fs::RenameFlags;
use rustix::io::Errno;
use time::OffsetDateTime;

use crate::store::archive::area;
use crate::store::archive::naming::{
    archive_components, archive_entries, archive_path, archive_result, latest_entry,
};
use crate::store::confine::{TRASH_DIR, list_dir, open_child};
use crate::store::durable::Changes;
use crate::store::error::io_error;
use crate::store::record::rfc3339;

use crate::store::{
    ArchiveRecord, Archived, Deleted, KnownQuota, Layout, Result, STATE_DIR, StoreError,
    StoredArchive, VolumeStore,
};

impl VolumeStore {
    /// Moves the volume into the archive area under `.archive/<path>/@<UTC time>`, with the
    /// retention the request asked for recorded. When the volume is already gone but was
    /// archived before, reports the latest archive, so a retried request gets the same
    /// answer (and the first request's retention stays).
    pub fn archive(
        &self,
        path: &VolumePath,
        retention_days: Option<u32>,
    ) -> Result<(ArchiveResult, Archived)> {
        self.archive_at(path, retention_days, OffsetDateTime::now_utc())
    }

    /// [`Self::archive`] as if it were `at`: the present, except in tests of retention.
    pub(crate) fn archive_at(
        &self,
        path: &VolumePath,
        retention_days: Option<u32>,
        at: OffsetDateTime,
    ) -> Result<(ArchiveResult, Archived)> {
        self.root.ensure_present()?;
        let components = archive_components(path);
        let _dirs = self.archive_dirs.read().unwrap_or_else(|e| e.into_inner());
        let Some((parent, mut record)) = self.locate(path)? else {
            return match self.latest_archive(&components)? {
                Some(entry) => {
                    // Perhaps a retry of an archive whose sync failed: confirmed once
                    // durable.
                    let mut changes = Changes::new();
                    let dirs = self.dirs_along(&components)?;
                    if dirs.len() == components.len() + 1
                        && let Some(archive_dir) = dirs.last()
                        && let Ok(archived) = open_child(archive_dir.as_fd(), entry.as_str(), false)
                    {
                        changes.extend(self.backend.record_dirs(archived.as_fd())?);
                    }
                    changes.extend(dirs);
                    if let Some(parent) = self.walk_parents(path, false)? {
                        changes.owned(parent);
                    }
                    self.durable.commit(changes)?;
                    Ok((archive_result(path, &entry), Archived::Earlier))
                }
                None => Err(StoreError::NotFound(format!(
                    "no volume at {path} and no archive of it"
                ))),
            };
        };
        record.archive = Some(ArchiveRecord {
            archived_at: rfc3339(at),
            retention_days,
        });
        // Recorded before the move (which keeps the directory's identity, or the dataset),
        // so an archive never exists without its time and retention.
        let record_dirs = {
            let dir = open_child(parent.as_fd(), path.file_name(), false)?;
            self.backend.write_record(dir.as_fd(), path, &record)?;
            self.backend.record_dirs(dir.as_fd())?
            // Closed before the move: a dataset held open cannot be unmounted.
        };
        let target = self.root.open_internal(&components, true)?;
        for entry in archive_entries(at) {
            let moved = match self.backend.layout() {
                Layout::Directories => rustix::fs::renameat_with(
                    &parent,
                    path.file_name(),
                    &target,
                    entry.as_str(),
                    RenameFlags::NOREPLACE,
                ),
                Layout::Mounts if open_child(target.as_fd(), entry.as_str(), false).is_ok() => {
                    Err(Errno::EXIST)
                }
                Layout::Mounts => {
                    let id = ArchivePath::new(path.clone(), entry.clone());
                    self.backend.archive_in_place(path, &archive_path(&id))?;
                    Ok(())
                }
            };
            match moved {
                Ok(()) => {
                    self.archive_index
                        .insert(ArchivePath::new(path.clone(), entry.clone()));
                    self.provisioned.release(record.capacity_bytes);
                    self.prefix_tally.forget(path);
                    let mut changes = Changes::new();
                    changes
                        .dir(parent.as_fd())?
                        .extend(self.dirs_along(&components)?)
                        .extend(record_dirs);
                    self.durable.commit(changes)?;
                    return Ok((archive_result(path, &entry), Archived::New));
                }
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(io_error(format!("move {path} to the archive"), e)),
            }
        }
        Err(StoreError::Conflict(format!(
            "could not find a free archive name for {path}"
        )))
    }

    /// The archives the agent made in id order: every one, or with a `page` at most its
    /// limit of those whose ids follow its cursor; and the cursor of the next page (the
    /// page's last id) when more may follow.
    pub fn list_archives(
        &self,
        page: Option<&PageRequest<ArchivePath>>,
    ) -> Result<(Vec<StoredArchive>, Option<String>)> {
        let Some(page) = page else {
            let mut found = self.backend.list_archives(&self.root)?;
            found.sort_by(|a, b| a.id.cmp(&b.id));
            return Ok((found, None));
        };
        let (found, more) = match self.backend.layout() {
            Layout::Directories => self.indexed_archives_page(page.after.as_ref(), page.limit)?,
            Layout::Mounts => {
                self.backend
                    .list_archives_page(&self.root, page.after.as_ref(), page.limit)?
            }
        };
        let next = more
            .then(|| found.last().map(|archive| archive.id.to_string()))
            .flatten();
        Ok((found, next))
    }

    /// A page of archives from the index of ids: only the page's entries are opened and
    /// checked against the record store, whatever the number of archives. Ids that are no
    /// archive of the agent's (gone meanwhile, put there by hand) are passed over, and
    /// the next ids fill the page they thinned.
    fn indexed_archives_page(
        &self,
        after: Option<&ArchivePath>,
        limit: usize,
    ) -> Result<(Vec<StoredArchive>, bool)> {
        let mut page = Vec::new();
        let mut from = after.cloned();
        loop {
            let (candidates, more) = self.archive_index.after(from.as_ref(), limit - page.len());
            for id in candidates {
                let parent = match self.root.open_existing(&archive_components(id.volume())) {
                    Ok(Some(parent)) => Some(parent),
                    Ok(None) | Err(StoreError::Unsafe(_)) => None,
                    Err(e) => return Err(e),
                };
                let found = match parent {
                    Some(parent) => self.backend.find_archive(&self.root, parent.as_fd(), &id),
                    None => Ok(None),
                };
                match found {
                    Ok(Some(record)) => page.push(StoredArchive {
                        id: id.clone(),
                        record,
                        usage: None,
                    }),
                    Ok(None) | Err(StoreError::Conflict(_) | StoreError::Unsafe(_)) => {}
                    Err(e) => return Err(e),
                }
                from = Some(id);
            }
            if page.len() == limit || !more {
                return Ok((page, more));
            }
        }
    }

    /// Removes the archive `id` with its quota and record, the way a volume is deleted
    /// (through the trash for directories). Only the archive area is reached: an id
    /// cannot name a live volume, and its directories are walked without following links.
    pub fn delete_archive(&self, id: &ArchivePath) -> Result<Deleted> {
        self.root.ensure_present()?;
        let Some(parent) = self.root.open_existing(&archive_components(id.volume()))? else {
            self.archive_index.remove(id);
            return Ok(Deleted::WasAbsent);
        };
        let deleted = match self.backend.find_archive(&self.root, parent.as_fd(), id)? {
            None => Deleted::WasAbsent,
            Some(_) if self.backend.layout() == Layout::Mounts => {
                self.backend.remove_archive_in_place(id)?;
                Deleted::Removed
            }
            Some(record) => {
                self.refuse_mount_points(&id, &archive_path(id), "delete")?;
                let trash = self.root.open_internal(&[STATE_DIR, TRASH_DIR], false)?;
                let record_dirs = match area::open_entry(parent.as_fd(), id)? {
                    Some(dir) => self.backend.record_dirs(dir.as_fd())?,
                    None => Vec::new(),
                };
                let doomed = self.unique_name("del");
                match rustix::fs::renameat_with(
                    &parent,
                    id.entry().as_str(),
                    &trash,
                    doomed.as_str(),
                    RenameFlags::NOREPLACE,
                ) {
                    Ok(()) => {
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
                        Deleted::Removed
                    }
                    Err(Errno::NOENT) => Deleted::WasAbsent,
                    Err(e) => return Err(io_error(format!("move archive {id} to the trash"), e)),
                }
            }
        };
        drop(parent);
        self.archive_index.remove(id);
        let _dirs = self.archive_dirs.write().unwrap_or_else(|e| e.into_inner());
        // What is left is tidiness, not the archive: a failure leaves empty directories.
        if let Err(error) = area::prune(&self.root, id.volume()) {
            tracing::warn!(archive = %id, %error, "could not remove empty archive directories");
        }
        Ok(deleted)
    }

    /// Space and inodes the archive uses, as its backend counts them.
    pub fn measure_archive(&self, id: &ArchivePath) -> Result<VolumeUsage> {
        let missing = || StoreError::NotFound(format!("no archive {id}"));
        let parent = self
            .root
            .open_existing(&archive_components(id.volume()))?
            .ok_or_else(missing)?;
        let record = self
            .backend
            .find_archive(&self.root, parent.as_fd(), id)?
            .ok_or_else(missing)?;
        let dir = area::open_entry(parent.as_fd(), id)?.ok_or_else(missing)?;
        self.backend.measure_archive(dir.as_fd(), id, &record)
    }

    /// The newest archive entry under the given archive directory, if any.
    pub(in crate::store) fn latest_archive(
        &self,
        components: &[&str],
    ) -> Result<Option<ArchiveEntry>> {
        let Some(dir) = self.root.open_existing(components)? else {
            return Ok(None);
        };
        let names = list_dir(dir.as_fd()).map_err(|e| io_error("list archives", e))?;
        Ok(latest_entry(names.into_iter().map(|(name, _)| name)))
    }
}
