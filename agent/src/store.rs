//! The volume store: every volume operation of the agent, confined beneath the export
//! root, on whichever backend holds the volumes.
//!
//! The store does, once for every backend, what keeps volumes safe: it reaches paths only
//! through `store::confine` (one component at a time from a descriptor of the root, never
//! following a symlink), serializes requests per path (`store::locks`), refuses nested
//! volumes, compares a repeated create with the volume's record, and moves volumes
//! through its work areas. Validated volume paths cannot name hidden entries, which keeps
//! those areas (`.nfsprov` for staging and trash, `.archive` for archives) out of reach
//! of the volume endpoints.
//!
//! Creation is atomic: a directory volume is made and fully set up (owner, mode, quota,
//! record) in the staging area, then renamed into place with `RENAME_NOREPLACE`; a volume
//! made in place is finished by writing its record last. Deletion first renames a
//! directory volume into the trash (so the path is gone at once and a retry sees it
//! absent), then removes the tree; what a crash leaves in staging or trash is purged at
//! the next start. Adoption, asked for explicitly, makes a directory already at its path a
//! volume by writing its record and nothing else; a create never takes a directory over.

mod archive;
mod backend;
mod confine;
mod copy;
mod dataset;
mod directory;
mod durable;
mod error;
mod image;
mod legacy;
mod locks;
mod mounts;
mod nesting;
mod provisioned;
mod reconcile;
mod record;
pub mod snapshot;
mod tree;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use nfsprov_api_types::{
    AdoptVolumeRequest, ArchiveEntry, ArchivePath, ArchiveResult, CloneMethod, CloneOrigin,
    CloneVolumeRequest, CreateVolumeRequest, FilesystemStats, QuotaBackend, QuotaPolicy,
    RestoreOrigin, RestoreSource, Volume, VolumeOwner, VolumePath, VolumeUsage,
};
use rustix::fs::{AtFlags, FileType, Mode, RenameFlags};
use rustix::io::Errno;
use time::OffsetDateTime;

use self::archive::area;
use self::archive::naming::{
    archive_components, archive_entries, archive_path, archive_result, latest_entry,
};
use self::confine::{Root, STAGING_DIR, TRASH_DIR, list_dir, open_child, open_or_create_dir};
use self::durable::{Changes, Durability};
use self::error::{io_error, not_found, walk_error};
use self::record::{now_rfc3339, rfc3339};
use crate::holds;
use crate::quota::QuotaSettings;
use crate::quota::btrfs::Btrfs;
use crate::quota::command::{SystemRunner, ToolRunner};
use crate::quota::xfs::Xfs;
use crate::zfs::Zfs;

pub use self::archive::area::StoredArchive;
pub use self::archive::naming::ARCHIVE_DIR;
pub use self::backend::{CloneSource, CloneTarget, KnownQuota, Layout, VolumeBackend};
pub use self::confine::{STATE_DIR, is_dot};
pub use self::copy::{
    COPY_DESCRIPTORS, CopyOptions, CopyProgress, CopyStats, copy_tree, reflink_supported,
};
pub use self::dataset::DatasetBackend;
pub use self::directory::{DirectoryBackend, NoQuota, QuotaStrategy};
pub use self::error::{Result, StoreError};
pub use self::image::ImageBackend;
pub use self::locks::PathGuard;
pub use self::provisioned::{OvercommitLimits, Provisioned, ratio as provisioned_ratio};
pub use self::record::{ArchiveRecord, QuotaRecord, VolumeRecord};
pub use self::tree::{MAX_USAGE_DEPTH, measure_tree, remove_tree};

/// Whether [`VolumeStore::create`] or [`VolumeStore::adopt`] made the volume or found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Created {
    New,
    Existing,
}

/// Whether [`VolumeStore::archive`] moved the volume now or found an earlier archive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Archived {
    New,
    Earlier,
}

/// Whether [`VolumeStore::delete`] removed something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    Removed,
    WasAbsent,
}

/// What [`VolumeStore::purge_leftovers`] did.
#[derive(Debug, Default)]
pub struct Purge {
    pub removed: usize,
    /// Entries left in place, with why.
    pub failed: Vec<(String, StoreError)>,
}

/// The backend the quota settings ask for, probed on the export root, so a backend that
/// cannot work there stops the agent with one line saying why.
pub fn backend_for(
    settings: &QuotaSettings,
    export_root: &Path,
) -> std::result::Result<Box<dyn VolumeBackend>, String> {
    let runner: Arc<dyn ToolRunner> = Arc::new(SystemRunner::new(settings.command_timeout));
    let backend: Box<dyn VolumeBackend> = match settings.backend {
        QuotaBackend::None => Box::new(DirectoryBackend::unlimited()),
        QuotaBackend::Btrfs => Box::new(DirectoryBackend::new(Box::new(Btrfs::probe(
            runner,
            export_root,
        )?))),
        QuotaBackend::Xfs => Box::new(DirectoryBackend::new(Box::new(Xfs::probe(
            runner,
            export_root,
            settings.xfs_project_ids.clone(),
        )?))),
        QuotaBackend::Image => Box::new(ImageBackend::probe(runner, export_root)?),
        QuotaBackend::Unknown => return Err("quota.backend is not one this agent knows".into()),
        QuotaBackend::Zfs => {
            let dataset = settings
                .zfs_dataset
                .as_deref()
                .ok_or("quota.zfs_dataset is not set")?;
            Box::new(DatasetBackend::new(Zfs::probe(
                runner,
                dataset,
                export_root,
            )?))
        }
    };
    Ok(backend)
}

/// The export root and the operations on it.
#[derive(Debug)]
pub struct VolumeStore {
    backend: Box<dyn VolumeBackend>,
    root: Root,
    default_uid: u32,
    default_gid: u32,
    unique: AtomicU64,
    locks: Arc<locks::PathLocks>,
    mounts: mounts::MountTable,
    /// Held shared while an archive directory is made and a volume moved into it, and
    /// exclusively while empty archive directories are removed, so the one never removes
    /// a directory the other is about to use.
    archive_dirs: RwLock<()>,
    /// Holds creates and clones against adoptions of related paths, so a volume never
    /// ends up nested in another.
    nesting: nesting::Nesting,
    /// Every change is synced through it before the request that made it answers.
    durable: Durability,
    /// Records of volumes found gone at open, and removed.
    stale_records: usize,
    /// The capacity promised to the live volumes, and its bounds.
    provisioned: Provisioned,
}

impl VolumeStore {
    /// Opens the export root for directory volumes without quotas (the crate's tests; the
    /// agent always opens it with the backend its settings name).
    #[cfg(test)]
    pub(crate) fn open(root_path: &Path) -> Result<Self> {
        Self::open_with_backend(root_path, Box::new(DirectoryBackend::unlimited()))
    }

    /// Opens the export root with the given backend (already probed) and prepares the
    /// agent's work areas beneath it.
    pub fn open_with_backend(root_path: &Path, backend: Box<dyn VolumeBackend>) -> Result<Self> {
        let root = Root::open(root_path)?;
        let state = root.open_internal(&[STATE_DIR], true)?;
        for area in [STAGING_DIR, TRASH_DIR] {
            open_child(state.as_fd(), area, true)?;
        }
        root.open_internal(&[ARCHIVE_DIR], true)?;
        let staging = root.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
        let stale_records = backend.prepare(&root, staging.as_fd())?;
        let unique = format!(
            "{}-{}",
            std::process::id(),
            OffsetDateTime::now_utc().unix_timestamp_nanos()
        );
        Self::set_aside_snapshot_leftovers(&root, backend.as_ref(), &unique)?;
        let durable = Durability::new(root.fd())?;
        Ok(Self {
            durable,
            stale_records,
            backend,
            mounts: mounts::MountTable::new(root.canonical_path()),
            root,
            default_uid: rustix::process::geteuid().as_raw(),
            default_gid: rustix::process::getegid().as_raw(),
            unique: AtomicU64::new(0),
            locks: Arc::default(),
            archive_dirs: RwLock::new(()),
            nesting: nesting::Nesting::default(),
            provisioned: Provisioned::default(),
        })
    }

    /// Counts the capacity of every volume, from the records, once, before the store
    /// serves, and bounds new promises by `limits`. A store not counted (the crate's tests)
    /// counts from zero without bounds.
    pub fn count_provisioned(mut self, limits: OvercommitLimits) -> Result<Self> {
        let bytes = self
            .backend
            .list(&self.root)?
            .iter()
            .map(|(_, record)| record.capacity_bytes)
            .fold(0u64, u64::saturating_add)
            .saturating_add(self.snapshot_promises()?);
        self.provisioned = Provisioned::new(bytes, limits);
        Ok(self)
    }

    /// The capacity promised to the live volumes, and its bounds.
    pub fn provisioned(&self) -> &Provisioned {
        &self.provisioned
    }

    /// Holds `more` bytes of capacity for what is made at `path`, or refuses it when
    /// that would take the promises past `limits.max_overcommit_ratio`.
    fn reserve(&self, path: &VolumePath, more: u64) -> Result<provisioned::Reservation<'_>> {
        let total = self.filesystem_stats()?.total_bytes;
        self.provisioned.reserve(more, total, path)
    }

    /// Holds `capacity` for the volume a create, clone or restore is about to make at
    /// `path`, before anything is made (its parents neither). A refused promise is
    /// answered only when no volume is there: a repeated request is confirmed (or judged)
    /// as ever, and promises nothing more.
    fn promise(&self, path: &VolumePath, capacity: u64) -> Result<provisioned::Reservation<'_>> {
        match self.reserve(path, capacity) {
            Err(refused @ StoreError::Overcommitted(_)) if self.locate(path)?.is_none() => {
                Err(refused)
            }
            Err(StoreError::Overcommitted(_)) => self.reserve(path, 0),
            held => held,
        }
    }

    /// How many records of volumes that were gone (a deletion a crash interrupted) the
    /// store removed when it opened.
    pub fn stale_records_removed(&self) -> usize {
        self.stale_records
    }

    pub fn root_path(&self) -> &Path {
        self.root.path()
    }

    pub fn backend(&self) -> &dyn VolumeBackend {
        self.backend.as_ref()
    }

    /// Waits until no other request works on `path`; the guard holds it until dropped.
    pub async fn lock(&self, path: &VolumePath) -> PathGuard {
        self.locks.lock(path.as_str()).await
    }

    /// The record a create request asks for, to compare with an existing volume's.
    fn wanted_record(&self, request: &CreateVolumeRequest) -> VolumeRecord {
        VolumeRecord {
            mode: request.mode,
            uid: request.uid.unwrap_or(self.default_uid),
            gid: request.gid.unwrap_or(self.default_gid),
            capacity_bytes: request.capacity_bytes,
            owner: request.owner.clone(),
            created_at: String::new(),
            quota: None,
            archive: None,
            clone: None,
            restore: None,
        }
    }

    /// Whether a new volume gets a quota, or why the request cannot be honoured.
    fn enforcement(&self, path: &VolumePath, policy: QuotaPolicy) -> Result<bool> {
        let can_enforce = self.backend.can_enforce();
        match policy {
            QuotaPolicy::Off => Ok(false),
            QuotaPolicy::BestEffort => Ok(can_enforce),
            QuotaPolicy::Enforce if can_enforce => Ok(true),
            QuotaPolicy::Enforce => Err(StoreError::Unsupported(format!(
                "{path}: quota enforcement was required, but this agent's quota backend is none, so capacity cannot be enforced; configure a quota backend on the agent or use quota bestEffort or off"
            ))),
            QuotaPolicy::Unknown => Err(StoreError::Unsupported(format!(
                "{path}: the request asks for a quota policy this agent does not know (the controller is newer); upgrade the agent, or use quota enforce, bestEffort or off"
            ))),
        }
    }

    /// Why the root cannot serve right now, if it cannot: missing, replaced (e.g. the
    /// filesystem was unmounted under the agent), read-only, unwritable or full.
    pub fn readiness(
        &self,
        min_free_bytes: u64,
        min_free_inodes: u64,
    ) -> std::result::Result<(), String> {
        let display = self.root.path().display();
        let stat = rustix::fs::stat(self.root.path()).map_err(|e| {
            format!(
                "export root {display} is missing: {}",
                std::io::Error::from(e)
            )
        })?;
        if !self.root.is_unchanged(&stat) {
            return Err(format!(
                "export root {display} is no longer the directory the agent opened (unmounted or replaced); restart the agent"
            ));
        }
        let probe = format!("{STATE_DIR}-probe-{}", std::process::id());
        match rustix::fs::mkdirat(self.root.fd(), probe.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {
                let _ = rustix::fs::unlinkat(self.root.fd(), probe.as_str(), AtFlags::REMOVEDIR);
            }
            Err(e) => {
                return Err(format!(
                    "export root {display} is not writable: {}",
                    std::io::Error::from(e)
                ));
            }
        }
        let fs = self.filesystem_stats().map_err(|e| e.to_string())?;
        if fs.available_bytes < min_free_bytes {
            return Err(format!(
                "filesystem of {display} is full: {} bytes available, at least {min_free_bytes} required",
                fs.available_bytes
            ));
        }
        if fs.total_inodes > 0 && fs.free_inodes < min_free_inodes {
            return Err(format!(
                "filesystem of {display} is out of inodes: {} free, at least {min_free_inodes} required",
                fs.free_inodes
            ));
        }
        Ok(())
    }

    pub fn filesystem_stats(&self) -> Result<FilesystemStats> {
        let vfs =
            rustix::fs::fstatvfs(self.root.fd()).map_err(|e| io_error("statvfs export root", e))?;
        let unit = vfs.f_frsize.max(1);
        Ok(FilesystemStats {
            total_bytes: vfs.f_blocks.saturating_mul(unit),
            free_bytes: vfs.f_bfree.saturating_mul(unit),
            available_bytes: vfs.f_bavail.saturating_mul(unit),
            total_inodes: vfs.f_files,
            free_inodes: vfs.f_ffree,
        })
    }

    /// Creates the volume, or confirms it exists with the same settings.
    pub fn create(
        &self,
        path: &VolumePath,
        request: &CreateVolumeRequest,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        let _nesting = self.nesting.making(path.as_str());
        let reservation = self.promise(path, request.capacity_bytes)?;
        let wanted = self.wanted_record(request);
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        if let Some(existing) = self.backend.find(&self.root, parent.as_fd(), path)? {
            // Confirmed only once durable: it may be what a request that failed to sync made.
            let confirmed = confirm(path, existing, &wanted, request.quota)?;
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        let limit = self
            .enforcement(path, request.quota)?
            .then_some(request.capacity_bytes);
        let record = VolumeRecord {
            created_at: now_rfc3339(),
            ..wanted.clone()
        };
        let made = match self.backend.layout() {
            Layout::Directories => {
                self.create_staged(path, parent.as_fd(), record, limit, &wanted, request.quota)
            }
            Layout::Mounts => self.create_in_place(path, parent.as_fd(), record, limit),
        }?;
        reservation.keep_if(made.1 == Created::New);
        self.settle(path, parent.as_fd())?;
        Ok(made)
    }

    /// Syncs what making, finding or changing the volume at `path` (in `parent`) touched:
    /// the directories from the root down to it (a rename or new parent changed their
    /// entries), the volume's own directory, the staging area it left, and its record.
    fn settle(&self, path: &VolumePath, parent: BorrowedFd<'_>) -> Result<()> {
        let components: Vec<&str> = path.components().collect();
        let mut changes = Changes::new();
        changes.extend(self.dirs_along(&components[..components.len() - 1])?);
        changes.dir(parent)?;
        match open_child(parent, path.file_name(), false) {
            Ok(dir) => {
                changes.extend(self.backend.record_dirs(dir.as_fd())?);
                changes.owned(dir);
            }
            // Moved away meanwhile (another request holds no lock of this path's; the
            // caller does): nothing of it left to sync here.
            Err(StoreError::NotFound(_)) => {}
            Err(e) => return Err(e),
        }
        if self.backend.layout() == Layout::Directories {
            changes.owned(self.root.open_internal(&[STATE_DIR, STAGING_DIR], false)?);
        }
        self.durable.commit(changes)
    }

    /// The root and each directory below it on the way through `components`, as far as
    /// they exist.
    fn dirs_along(&self, components: &[&str]) -> Result<Vec<OwnedFd>> {
        let mut dirs = vec![self.root.reopen()?];
        for component in components {
            let next = match dirs.last() {
                Some(last) => open_child(last.as_fd(), component, false),
                None => break,
            };
            match next {
                Ok(dir) => dirs.push(dir),
                Err(StoreError::NotFound(_)) => break,
                Err(e) => return Err(e),
            }
        }
        Ok(dirs)
    }

    /// Makes the directory already at `path` a volume as it is, by writing a record of it:
    /// mode, uid and gid as found, the request's capacity and owner, no quota. Nothing
    /// inside is read or changed and nothing moves, so data a tenant reaches over NFS
    /// stays exactly where and what it was. A volume already there with the same owner
    /// and capacity is confirmed.
    pub fn adopt(
        &self,
        path: &VolumePath,
        request: &AdoptVolumeRequest,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        self.backend.check_adoptable(path)?;
        let _nesting = self.nesting.adopting(path.as_str());
        let parent = self
            .walk_parents(path, false)?
            .ok_or_else(|| no_directory(path))?;
        let dir = open_adoptable(parent.as_fd(), path)?;
        if self.backend.is_volume(&self.root, dir.as_fd())? {
            let existing = self
                .backend
                .find(&self.root, parent.as_fd(), path)?
                .ok_or_else(|| no_directory(path))?;
            let wanted = VolumeRecord {
                capacity_bytes: request.capacity_bytes,
                owner: request.owner.clone(),
                ..existing.clone()
            };
            let confirmed = confirm(path, existing, &wanted, QuotaPolicy::BestEffort)?;
            drop(dir);
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        self.refuse_volumes_below(path)?;
        self.refuse_mount_points_around(path)?;
        let record = record_as_found(dir.as_fd(), path, request.capacity_bytes, &request.owner)?;
        self.backend.write_record(dir.as_fd(), path, &record)?;
        self.provisioned.add(record.capacity_bytes);
        drop(dir);
        self.settle(path, parent.as_fd())?;
        tracing::info!(
            %path,
            capacity_bytes = record.capacity_bytes,
            quota_backend = %self.backend.kind(),
            "adopted an existing directory as a volume; no quota enforces its capacity"
        );
        Ok((record.to_volume(path), Created::New))
    }

    /// Refuses to adopt a directory that holds volumes: they would be nested in it.
    fn refuse_volumes_below(&self, path: &VolumePath) -> Result<()> {
        let prefix = format!("{path}/");
        let below: Vec<String> = self
            .backend
            .list(&self.root)?
            .into_iter()
            .map(|(volume, _)| volume.to_string())
            .filter(|volume| volume.starts_with(&prefix))
            .collect();
        if below.is_empty() {
            return Ok(());
        }
        let shown = below.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = below.len().saturating_sub(5);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Err(StoreError::Conflict(format!(
            "{path} holds volumes ({shown}{more}); volumes cannot be nested, so it cannot be adopted"
        )))
    }

    /// Refuses to adopt a directory that is, holds or lies beneath a mount point: its
    /// volume would span filesystems, and could then be neither deleted nor archived.
    fn refuse_mount_points_around(&self, path: &VolumePath) -> Result<()> {
        let points = self.mount_points(path.as_str(), mounts::MountTable::mount_points_around)?;
        if points.is_empty() {
            return Ok(());
        }
        Err(StoreError::Conflict(format!(
            "{path} is, holds or lies beneath mount points ({}); a volume never spans a mount point, so it cannot be adopted; unmount them and retry",
            points.join(", ")
        )))
    }

    /// Sets a directory volume up in staging, then renames it into place.
    fn create_staged(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        mut record: VolumeRecord,
        limit: Option<u64>,
        wanted: &VolumeRecord,
        policy: QuotaPolicy,
    ) -> Result<(Volume, Created)> {
        let staging = self.root.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
        let staged = self.unique_name("new");
        record.quota = self.backend.make(
            &self.root,
            staging.as_fd(),
            &staged,
            path,
            limit,
            record.capacity_bytes,
        )?;
        let quota = record.quota.clone();
        self.place_staged(
            path,
            parent,
            Staged {
                dir: staging.as_fd(),
                name: &staged,
                quota: quota.as_ref(),
            },
            |dir| {
                self.finish(dir, path, &record)?;
                Ok(record)
            },
            |existing| confirm(path, existing, wanted, policy),
        )
    }

    /// Finishes the volume made in staging (`finish` sets it up, writes its record and
    /// answers it) and renames it into place. When anything fails it is removed; when the
    /// path was taken meanwhile, what is there is judged by `confirm_taken`.
    fn place_staged(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        staged: Staged<'_>,
        finish: impl FnOnce(BorrowedFd<'_>) -> Result<VolumeRecord>,
        confirm_taken: impl FnOnce(VolumeRecord) -> Result<(Volume, Created)>,
    ) -> Result<(Volume, Created)> {
        let result = (|| -> Result<(VolumeRecord, rustix::io::Result<()>)> {
            let dir = open_child(staged.dir, staged.name, false)?;
            let record = finish(dir.as_fd())?;
            let moved = rustix::fs::renameat_with(
                staged.dir,
                staged.name,
                parent,
                path.file_name(),
                RenameFlags::NOREPLACE,
            );
            Ok((record, moved))
        })();
        let discard = || {
            self.backend.remove(
                staged.dir,
                staged.name,
                None,
                KnownQuota::Known(staged.quota),
            )
        };
        match result {
            Ok((record, Ok(()))) => Ok((record.to_volume(path), Created::New)),
            Ok((_, Err(Errno::EXIST))) => {
                // Someone (another request, or a stray file) took the name meanwhile.
                discard()?;
                match self.backend.find(&self.root, parent, path)? {
                    Some(existing) => confirm_taken(existing),
                    None => Err(StoreError::Conflict(format!(
                        "{path} was created concurrently"
                    ))),
                }
            }
            Ok((_, Err(e))) => {
                discard()?;
                Err(io_error(format!("move new volume {path} into place"), e))
            }
            Err(e) => {
                discard()?;
                Err(e)
            }
        }
    }

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
    fn make_from(
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

    /// Makes a volume at its path; writing its record last finishes it.
    fn create_in_place(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        mut record: VolumeRecord,
        limit: Option<u64>,
    ) -> Result<(Volume, Created)> {
        let leaf = path.file_name();
        record.quota =
            self.backend
                .make(&self.root, parent, leaf, path, limit, record.capacity_bytes)?;
        let finished =
            open_child(parent, leaf, false).and_then(|dir| self.finish(dir.as_fd(), path, &record));
        match finished {
            Ok(()) => Ok((record.to_volume(path), Created::New)),
            Err(e) => {
                // Unfinished: nothing refers to it yet, so it goes at once.
                let _ = self.backend.remove(
                    parent,
                    leaf,
                    Some(path),
                    KnownQuota::Known(record.quota.as_ref()),
                );
                Err(e)
            }
        }
    }

    /// Gives a new volume its owner and mode, then its record.
    fn finish(&self, dir: BorrowedFd<'_>, path: &VolumePath, record: &VolumeRecord) -> Result<()> {
        // chown before chmod: chown clears the setuid and setgid bits.
        rustix::fs::fchown(
            dir,
            Some(rustix::fs::Uid::from_raw(record.uid)),
            Some(rustix::fs::Gid::from_raw(record.gid)),
        )
        .map_err(|e| io_error(format!("chown {path} to {}:{}", record.uid, record.gid), e))?;
        rustix::fs::fchmod(dir, Mode::from_raw_mode(record.mode.bits()))
            .map_err(|e| io_error(format!("chmod {path}"), e))?;
        self.backend.write_record(dir, path, record)
    }

    /// The volume at `path` with the parent directory it is in.
    fn locate(&self, path: &VolumePath) -> Result<Option<(OwnedFd, VolumeRecord)>> {
        let Some(parent) = self.walk_parents(path, false)? else {
            return Ok(None);
        };
        Ok(self
            .backend
            .find(&self.root, parent.as_fd(), path)?
            .map(|record| (parent, record)))
    }

    /// The volume at `path`.
    pub fn get(&self, path: &VolumePath) -> Result<Volume> {
        match self.locate(path)? {
            Some((_, record)) => Ok(record.to_volume(path)),
            None => Err(not_found(path)),
        }
    }

    /// Space and inodes the volume uses, as its backend counts them.
    pub fn measure(&self, path: &VolumePath) -> Result<VolumeUsage> {
        let (parent, record) = self.locate(path)?.ok_or_else(|| not_found(path))?;
        let dir = open_child(parent.as_fd(), path.file_name(), false)?;
        self.backend.measure(dir.as_fd(), path, &record)
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
        let reservation =
            self.reserve(path, capacity_bytes.saturating_sub(record.capacity_bytes))?;
        let dir = open_child(parent.as_fd(), path.file_name(), false)?;
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
            self.backend
                .resize(dir.as_fd(), path, quota, capacity_bytes)?;
        }
        record.capacity_bytes = capacity_bytes;
        self.backend.write_record(dir.as_fd(), path, &record)?;
        reservation.keep();
        drop(dir);
        self.settle(path, parent.as_fd())?;
        Ok(record.to_volume(path))
    }

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
            Ok(()) => self.provisioned.release(record.capacity_bytes),
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
                    self.provisioned.release(record.capacity_bytes);
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

    /// Every archive the agent made, sorted by id.
    pub fn list_archives(&self) -> Result<Vec<StoredArchive>> {
        let mut found = self.backend.list_archives(&self.root)?;
        found.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(found)
    }

    /// At most `limit` archives whose ids follow `after`, in id order, and the cursor of
    /// the next page (the page's last id) when more may follow.
    pub fn list_archives_page(
        &self,
        after: Option<&ArchivePath>,
        limit: usize,
    ) -> Result<(Vec<StoredArchive>, Option<String>)> {
        let (found, more) = self.backend.list_archives_page(&self.root, after, limit)?;
        let next = more
            .then(|| found.last().map(|archive| archive.id.to_string()))
            .flatten();
        Ok((found, next))
    }

    /// Removes the archive `id` with its quota and record, the way a volume is deleted
    /// (through the trash for directories). Only the archive area is reached: an id
    /// cannot name a live volume, and its directories are walked without following links.
    pub fn delete_archive(&self, id: &ArchivePath) -> Result<Deleted> {
        self.root.ensure_present()?;
        let Some(parent) = self.root.open_existing(&archive_components(id.volume()))? else {
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

    /// Every volume beneath the root, sorted by path.
    pub fn list(&self) -> Result<Vec<Volume>> {
        let mut found: Vec<Volume> = self
            .backend
            .list(&self.root)?
            .into_iter()
            .map(|(path, record)| record.to_volume(&path))
            .collect();
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    /// At most `limit` volumes whose paths follow `after`, in path order, and the cursor
    /// of the next page (the page's last path) when more may follow.
    pub fn list_page(
        &self,
        after: Option<&VolumePath>,
        limit: usize,
    ) -> Result<(Vec<Volume>, Option<String>)> {
        let (found, more) = self.backend.list_page(&self.root, after, limit)?;
        let next = more
            .then(|| found.last().map(|(path, _)| path.to_string()))
            .flatten();
        let page = found
            .into_iter()
            .map(|(path, record)| record.to_volume(&path))
            .collect();
        Ok((page, next))
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

    /// Opens the parent directory of `path`, creating missing parents when `create` is set.
    /// `None` when a parent is missing and `create` is not set. Refuses symlinks,
    /// non-directories and parents that are volumes themselves (no nested volumes).
    fn walk_parents(&self, path: &VolumePath, create: bool) -> Result<Option<OwnedFd>> {
        let mut current: Option<OwnedFd> = None;
        let mut walked = Vec::new();
        let count = path.components().count();
        for component in path.components().take(count - 1) {
            walked.push(component);
            let base = current.as_ref().map_or(self.root.fd(), |fd| fd.as_fd());
            let next = match open_or_create_dir(base, component, create) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if !create => return Ok(None),
                Err(e) => return Err(walk_error(&walked.join("/"), e)),
            };
            if self.backend.is_volume(&self.root, next.as_fd())? {
                return Err(StoreError::Conflict(format!(
                    "{path} would be inside the volume {}; volumes cannot be nested",
                    walked.join("/")
                )));
            }
            current = Some(next);
        }
        match current {
            Some(fd) => Ok(Some(fd)),
            None => self.root.reopen().map(Some),
        }
    }

    /// The mount points `which` finds for `relative` below the root, for messages.
    fn mount_points(
        &self,
        relative: &str,
        which: fn(&mounts::MountTable, &Path) -> std::io::Result<Vec<std::path::PathBuf>>,
    ) -> Result<Vec<String>> {
        let dir = self.root.canonical_path().join(relative);
        let points = which(&self.mounts, &dir).map_err(|e| StoreError::Io {
            context: "read the mount table".into(),
            source: e,
        })?;
        Ok(points.iter().map(|p| p.display().to_string()).collect())
    }

    /// Refuses to `verb` (delete, clone, snapshot, restore) the tree at `relative`, named
    /// `subject` in the message, while it holds a mount point: a delete would reach into
    /// the mounted directory, a copy would take in another filesystem. Checked before
    /// anything moves, so the tree stays whole and a retry after the unmount succeeds.
    /// Datasets are left to ZFS, whose clones and removals never cross into another mount.
    fn refuse_mount_points(
        &self,
        subject: &dyn std::fmt::Display,
        relative: &str,
        verb: &str,
    ) -> Result<()> {
        if self.backend.layout() == Layout::Mounts {
            return Ok(());
        }
        let points = self.mount_points(relative, mounts::MountTable::mount_points_below)?;
        if points.is_empty() {
            return Ok(());
        }
        Err(StoreError::Conflict(format!(
            "{subject} holds mount points ({}); a {verb} never spans filesystems; unmount them and retry",
            points.join(", ")
        )))
    }

    /// The newest archive entry under the given archive directory, if any.
    fn latest_archive(&self, components: &[&str]) -> Result<Option<ArchiveEntry>> {
        let Some(dir) = self.root.open_existing(components)? else {
            return Ok(None);
        };
        let names = list_dir(dir.as_fd()).map_err(|e| io_error("list archives", e))?;
        Ok(latest_entry(names.into_iter().map(|(name, _)| name)))
    }

    fn unique_name(&self, kind: &str) -> String {
        let n = self.unique.fetch_add(1, Ordering::Relaxed);
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        format!("{kind}-{}-{nanos}-{n}", std::process::id())
    }
}

fn no_directory(path: &VolumePath) -> StoreError {
    StoreError::NotFound(format!("no directory at {path} to adopt"))
}

/// The directory at `path` in `parent`, opened without following a link. A link there is
/// refused as on every path (never followed, whatever it points to); anything else that is
/// not a directory is a conflict, as a foreign directory is for a create.
fn open_adoptable(parent: BorrowedFd<'_>, path: &VolumePath) -> Result<OwnedFd> {
    let name = path.file_name();
    match open_or_create_dir(parent, name, false) {
        Ok(dir) => Ok(dir),
        Err(Errno::NOENT) => Err(no_directory(path)),
        Err(Errno::NOTDIR | Errno::LOOP) => {
            let is_link = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
            if is_link {
                Err(walk_error(path.as_str(), Errno::LOOP))
            } else {
                Err(StoreError::Conflict(format!(
                    "{path} is not a directory; only a directory can be adopted"
                )))
            }
        }
        Err(e) => Err(walk_error(path.as_str(), e)),
    }
}

/// A record of the directory `dir` at `path` as it is on disk (its mode and owner), for
/// a volume the agent did not make that way itself: an adopted or a cloned one. No quota,
/// archive or clone origin: callers add what they know.
fn record_as_found(
    dir: BorrowedFd<'_>,
    path: &VolumePath,
    capacity_bytes: u64,
    owner: &VolumeOwner,
) -> Result<VolumeRecord> {
    let stat = rustix::fs::fstat(dir).map_err(|e| io_error(format!("stat {path}"), e))?;
    let mode = nfsprov_api_types::Mode::new(stat.st_mode & nfsprov_api_types::Mode::MAX)
        .map_err(|e| StoreError::Unsupported(format!("{path}: {e}")))?;
    Ok(VolumeRecord {
        mode,
        uid: stat.st_uid,
        gid: stat.st_gid,
        capacity_bytes,
        owner: owner.clone(),
        created_at: now_rfc3339(),
        quota: None,
        archive: None,
        clone: None,
        restore: None,
    })
}

/// Whether a resize to `capacity_bytes` changes anything; an error for a shrink.
fn is_growth(path: &VolumePath, record: &VolumeRecord, capacity_bytes: u64) -> Result<bool> {
    if capacity_bytes < record.capacity_bytes {
        return Err(StoreError::Unsupported(format!(
            "{path} has a capacity of {} bytes; shrinking it to {capacity_bytes} bytes is not supported",
            record.capacity_bytes
        )));
    }
    Ok(capacity_bytes > record.capacity_bytes)
}

/// A volume made in the staging area, not yet in place.
#[derive(Clone, Copy)]
struct Staged<'a> {
    dir: BorrowedFd<'a>,
    name: &'a str,
    quota: Option<&'a QuotaRecord>,
}

/// A volume made from the data of another volume or of a snapshot, as asked for.
struct NewVolume<'a> {
    path: &'a VolumePath,
    capacity_bytes: u64,
    owner: &'a VolumeOwner,
    quota: QuotaPolicy,
    origin: Origin<'a>,
}

/// Where a new volume's data came from, as its record keeps it.
enum Origin<'a> {
    Clone(&'a VolumePath),
    Restore(&'a RestoreSource),
}

impl Origin<'_> {
    fn record(&self, record: &mut VolumeRecord, method: CloneMethod) {
        match self {
            Origin::Clone(source) => {
                record.clone = Some(CloneOrigin {
                    source: (*source).clone(),
                    method,
                });
            }
            Origin::Restore(source) => {
                record.restore = Some(RestoreOrigin {
                    source: (*source).clone(),
                    method,
                });
            }
        }
    }
}

/// A repeated clone is confirmed only when the volume there is a clone of the same source
/// with the same capacity, owner and quota. Mode and owner come from the source, so they
/// are not compared.
fn confirm_clone(
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

/// A volume made from another's data (a clone, a restore) found again: confirmed only when
/// it came from the same origin (`origin_difference` says how it did not) with the same
/// quota, capacity and owner.
fn confirm_made(
    path: &VolumePath,
    existing: VolumeRecord,
    origin_difference: Option<String>,
    quota: QuotaPolicy,
    capacity_bytes: u64,
    owner: &VolumeOwner,
) -> Result<(Volume, Created)> {
    let mut differences: Vec<String> = origin_difference.into_iter().collect();
    differences.extend(quota_difference(&existing, quota));
    differences.extend(claim_differences(&existing, capacity_bytes, owner));
    confirmed(path, existing, differences)
}

/// A repeated create is confirmed only when the volume has exactly the settings asked for.
fn confirm(
    path: &VolumePath,
    existing: VolumeRecord,
    wanted: &VolumeRecord,
    policy: QuotaPolicy,
) -> Result<(Volume, Created)> {
    let mut differences: Vec<String> = quota_difference(&existing, policy).into_iter().collect();
    if existing.mode != wanted.mode {
        differences.push(format!(
            "mode {} (requested {})",
            existing.mode, wanted.mode
        ));
    }
    if existing.uid != wanted.uid {
        differences.push(format!("uid {} (requested {})", existing.uid, wanted.uid));
    }
    if existing.gid != wanted.gid {
        differences.push(format!("gid {} (requested {})", existing.gid, wanted.gid));
    }
    differences.extend(claim_differences(
        &existing,
        wanted.capacity_bytes,
        &wanted.owner,
    ));
    confirmed(path, existing, differences)
}

fn quota_difference(existing: &VolumeRecord, policy: QuotaPolicy) -> Option<String> {
    (policy == QuotaPolicy::Enforce && existing.quota.is_none())
        .then(|| "no enforced quota (requested enforce)".to_owned())
}

/// How the volume differs from what its claim asks for: capacity and owner.
fn claim_differences(
    existing: &VolumeRecord,
    capacity_bytes: u64,
    owner: &nfsprov_api_types::VolumeOwner,
) -> Vec<String> {
    let mut differences = Vec::new();
    if existing.capacity_bytes != capacity_bytes {
        differences.push(format!(
            "capacity {} bytes (requested {capacity_bytes})",
            existing.capacity_bytes
        ));
    }
    if existing.owner != *owner {
        differences.push(format!("owner {:?} (requested {owner:?})", existing.owner));
    }
    differences
}

/// The volume there, when nothing differs from the request.
fn confirmed(
    path: &VolumePath,
    existing: VolumeRecord,
    differences: Vec<String>,
) -> Result<(Volume, Created)> {
    if differences.is_empty() {
        Ok((existing.to_volume(path), Created::Existing))
    } else {
        Err(StoreError::Conflict(format!(
            "{path} already exists with other settings: {}",
            differences.join(", ")
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    use super::*;
    use crate::quota::xfs::tests::{FakeXfsQuota, xfs_backend_for_tests};

    fn store() -> (tempfile::TempDir, VolumeStore) {
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::open(dir.path()).unwrap();
        (dir, store)
    }

    fn request(capacity: u64) -> CreateVolumeRequest {
        CreateVolumeRequest {
            capacity_bytes: capacity,
            ..Default::default()
        }
    }

    fn path(p: &str) -> VolumePath {
        VolumePath::parse(p).unwrap()
    }

    /// The store on `root` with XFS project quotas set through `fake` (a mock of the
    /// quota tool), as the agent opens it at each start.
    fn open_with_fake_xfs(root: &Path, fake: &Arc<FakeXfsQuota>) -> VolumeStore {
        let xfs = xfs_backend_for_tests(fake.clone());
        VolumeStore::open_with_backend(root, Box::new(DirectoryBackend::new(Box::new(xfs))))
            .unwrap()
    }

    /// The XFS project id recorded for the volume at `p`.
    fn project_of(store: &VolumeStore, p: &str) -> u32 {
        let (_, record) = store.locate(&path(p)).unwrap().unwrap();
        record.quota.unwrap().project_id.unwrap()
    }

    #[test]
    fn xfs_project_ids_are_recorded_freed_on_delete_and_kept_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeXfsQuota::default());
        let open = || open_with_fake_xfs(dir.path(), &fake);
        let store = open();
        let (kept, _) = store.create(&path("ns/kept"), &request(1 << 20)).unwrap();
        assert!(kept.quota_enforced);
        let kept_id = project_of(&store, "ns/kept");
        assert_eq!(fake.limit_kib(kept_id), Some(1024));
        store.create(&path("ns/gone"), &request(1 << 20)).unwrap();
        let gone_id = project_of(&store, "ns/gone");
        assert_ne!(gone_id, kept_id);

        store.resize(&path("ns/kept"), 4 << 20).unwrap();
        assert_eq!(fake.limit_kib(kept_id), Some(4096));
        store.delete(&path("ns/gone")).unwrap();
        assert_eq!(fake.limit_kib(gone_id), None, "limit cleared on delete");
        store.archive(&path("ns/kept"), None).unwrap();
        drop(store);

        // After a restart the archived volume's id is still taken; the freed one is reused.
        let store = open();
        store.create(&path("ns/new"), &request(1 << 20)).unwrap();
        assert_eq!(project_of(&store, "ns/new"), gone_id);
        store.create(&path("ns/other"), &request(1 << 20)).unwrap();
        let other = project_of(&store, "ns/other");
        assert!(other != kept_id && other != gone_id, "{other}");

        // Deleting the archive frees its id at last.
        let [archive] = &store.list_archives().unwrap()[..] else {
            panic!("one archive");
        };
        assert_eq!(fake.limit_kib(kept_id), Some(4096));
        assert_eq!(store.delete_archive(&archive.id).unwrap(), Deleted::Removed);
        assert_eq!(fake.limit_kib(kept_id), None, "limit cleared");
        store.create(&path("ns/third"), &request(1 << 20)).unwrap();
        assert_eq!(project_of(&store, "ns/third"), kept_id);
    }

    #[test]
    fn records_of_volumes_a_crash_removed_go_at_start_with_their_project_ids() {
        let dir = tempfile::tempdir().unwrap();
        let fake = Arc::new(FakeXfsQuota::default());
        let open = || open_with_fake_xfs(dir.path(), &fake);
        let store = open();
        for p in ["ns/live", "ns/gone", "ns/archived", "ns/trashed"] {
            store.create(&path(p), &request(1 << 20)).unwrap();
        }
        let gone_id = project_of(&store, "ns/gone");
        let trashed_id = project_of(&store, "ns/trashed");
        let (archived, _) = store.archive(&path("ns/archived"), None).unwrap();
        assert_eq!(store.stale_records_removed(), 0);
        drop(store);

        // What crashes left: a tree removed before its record, and a volume renamed into
        // the trash whose removal never ran.
        std::fs::remove_dir(dir.path().join("ns/gone")).unwrap();
        std::fs::rename(
            dir.path().join("ns/trashed"),
            dir.path().join(STATE_DIR).join(TRASH_DIR).join("del-crash"),
        )
        .unwrap();
        let store = open();
        assert_eq!(store.stale_records_removed(), 1);
        assert_eq!(
            fake.limit_kib(gone_id),
            None,
            "the gone volume's id is released"
        );
        assert_eq!(
            fake.limit_kib(trashed_id),
            Some(1024),
            "the trash keeps its record for the purge"
        );
        assert_eq!(listed(&store), ["ns/live"]);
        assert_eq!(ids(&store), [archived.archive_path[9..].to_owned()]);
        // A directory made at the gone volume's path is no volume.
        std::fs::create_dir(dir.path().join("ns/gone")).unwrap();
        assert!(matches!(
            store.get(&path("ns/gone")),
            Err(StoreError::Conflict(_))
        ));
        let purge = store.purge_leftovers();
        assert_eq!((purge.removed, purge.failed.len()), (1, 0));
        assert_eq!(fake.limit_kib(trashed_id), None);
        drop(store);

        let store = open();
        assert_eq!(store.stale_records_removed(), 0, "nothing is stale twice");
        assert_eq!(listed(&store), ["ns/live"]);
    }

    fn owned_request(claim: &str) -> CreateVolumeRequest {
        CreateVolumeRequest {
            owner: nfsprov_api_types::VolumeOwner {
                pvc_namespace: Some("team".into()),
                pvc_name: Some(claim.into()),
                pv_name: Some(format!("pvc-{claim}")),
            },
            ..request(1 << 20)
        }
    }

    fn ids(store: &VolumeStore) -> Vec<String> {
        store
            .list_archives()
            .unwrap()
            .into_iter()
            .map(|a| a.id.to_string())
            .collect()
    }

    #[test]
    fn a_volume_made_where_one_was_archived_is_listed_once_with_its_own_record() {
        let (_dir, store) = store();
        store.create(&path("a"), &owned_request("first")).unwrap();
        store.archive(&path("a"), None).unwrap();
        store.create(&path("a"), &owned_request("second")).unwrap();
        let listed = store.list().unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].owner.pvc_name.as_deref(), Some("second"));
        assert_eq!(store.list_page(None, 10).unwrap().0, listed);
    }

    #[test]
    fn archives_are_listed_from_their_records_and_deleted_one_at_a_time() {
        let (dir, store) = store();
        let at = time::macros::datetime!(2026-01-02 03:04:05.000000006 UTC);
        store.create(&path("a"), &owned_request("first")).unwrap();
        let (first, _) = store.archive_at(&path("a"), Some(3), at).unwrap();
        store.create(&path("a"), &owned_request("second")).unwrap();
        let (second, _) = store.archive_at(&path("a"), None, at).unwrap();
        store
            .create(&path("ns/b/c"), &owned_request("deep"))
            .unwrap();
        store.archive(&path("ns/b/c"), Some(30)).unwrap();
        store.create(&path("live"), &owned_request("live")).unwrap();
        std::fs::write(dir.path().join("live/data"), b"tenant").unwrap();

        // The same instant twice: the second archive gets a counter.
        assert_eq!(first.archive_path, ".archive/a/@20260102T030405.000000006Z");
        assert_eq!(
            second.archive_path,
            ".archive/a/@20260102T030405.000000006Z-1"
        );
        let listed = store.list_archives().unwrap();
        assert_eq!(listed.len(), 3, "{listed:?}");
        assert_eq!(listed[0].archive_path(), first.archive_path);
        assert_eq!(listed[0].record.owner.pvc_name.as_deref(), Some("first"));
        assert_eq!(listed[0].retention_days(), Some(3));
        assert_eq!(listed[0].archived_at(), Some(at));
        assert_eq!(listed[1].record.owner.pvc_name.as_deref(), Some("second"));
        assert_eq!(listed[1].retention_days(), None);
        assert_eq!(listed[2].id.volume().as_str(), "ns/b/c");
        assert_eq!(listed[2].retention_days(), Some(30));

        // One and only one goes; the directory of the path stays while it holds another.
        assert_eq!(
            store.delete_archive(&listed[0].id).unwrap(),
            Deleted::Removed
        );
        assert_eq!(
            ids(&store),
            [listed[1].id.to_string(), listed[2].id.to_string()]
        );
        assert!(dir.path().join(&second.archive_path).is_dir());
        assert_eq!(
            store.delete_archive(&listed[0].id).unwrap(),
            Deleted::WasAbsent
        );
        // The last archive of a path takes its now empty directories with it, and never
        // the area itself.
        store.delete_archive(&listed[2].id).unwrap();
        assert!(!dir.path().join(".archive/ns").exists());
        store.delete_archive(&listed[1].id).unwrap();
        assert!(!dir.path().join(".archive/a").exists());
        assert!(dir.path().join(ARCHIVE_DIR).is_dir());
        assert!(ids(&store).is_empty());

        // The volumes were never touched, and nothing waits in the trash.
        assert_eq!(
            std::fs::read(dir.path().join("live/data")).unwrap(),
            b"tenant"
        );
        let volumes: Vec<String> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.path.to_string())
            .collect();
        assert_eq!(volumes, ["live"]);
        assert_eq!(store.leftover_count().unwrap(), 0);
    }

    #[test]
    fn a_retention_is_recorded_once_and_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let store = VolumeStore::open(dir.path()).unwrap();
        store.create(&path("p"), &request(1)).unwrap();
        let (archived, how) = store.archive(&path("p"), Some(9)).unwrap();
        assert_eq!(how, Archived::New);
        // A retry answers the same archive and keeps the first request's retention.
        let (again, how) = store.archive(&path("p"), Some(2)).unwrap();
        assert_eq!((how, &again), (Archived::Earlier, &archived));
        drop(store);

        let store = VolumeStore::open(dir.path()).unwrap();
        let [archive] = &store.list_archives().unwrap()[..] else {
            panic!("one archive");
        };
        assert_eq!(archive.retention_days(), Some(9));
        assert_eq!(archive.archive_path(), archived.archive_path);
        assert_eq!(
            archive.archived_at().map(record::rfc3339),
            Some(archived.archived_at)
        );
    }

    #[test]
    fn archives_made_before_times_were_recorded_are_dated_by_their_name() {
        let (dir, store) = store();
        let at = time::macros::datetime!(2024-05-06 07:08:09.1 UTC);
        store.create(&path("old"), &request(1)).unwrap();
        let (archived, _) = store.archive_at(&path("old"), Some(5), at).unwrap();
        // What an earlier version left: the record as it was before archiving.
        let entry = open_child(
            store
                .root
                .open_existing(&[ARCHIVE_DIR, "old"])
                .unwrap()
                .unwrap()
                .as_fd(),
            archived.archive_path.rsplit('/').next().unwrap(),
            false,
        )
        .unwrap();
        let [listed] = &store.list_archives().unwrap()[..] else {
            panic!("one archive");
        };
        let mut record = listed.record.clone();
        record.archive = None;
        store
            .backend
            .write_record(entry.as_fd(), &path("old"), &record)
            .unwrap();

        let [listed] = &store.list_archives().unwrap()[..] else {
            panic!("one archive");
        };
        assert_eq!(listed.record.archive, None);
        assert_eq!(listed.archived_at(), Some(at));
        assert_eq!(listed.retention_days(), None);
        assert!(dir.path().join(&archived.archive_path).is_dir());
    }

    #[test]
    fn only_the_agents_archives_are_listed_and_nothing_else_is_deleted() {
        let (dir, store) = store();
        let root = dir.path();
        let outside = tempfile::tempdir().unwrap();
        let stamp = "@20260102T030405.000000006Z";
        std::fs::create_dir_all(outside.path().join(format!("x/{stamp}"))).unwrap();
        std::fs::write(outside.path().join(format!("x/{stamp}/precious")), b"x").unwrap();
        let area = root.join(ARCHIVE_DIR);
        // A link to elsewhere, whole or as an entry; a directory nobody recorded.
        std::os::unix::fs::symlink(outside.path(), area.join("evil")).unwrap();
        std::fs::create_dir_all(area.join("ns")).unwrap();
        std::os::unix::fs::symlink(
            outside.path().join(format!("x/{stamp}")),
            area.join(format!("ns/{stamp}")),
        )
        .unwrap();
        std::fs::create_dir_all(area.join(format!("foreign/{stamp}"))).unwrap();
        // A real archive holding what looks like more archives: tenant data, not structure.
        store.create(&path("t"), &request(1)).unwrap();
        let (real, _) = store.archive(&path("t"), None).unwrap();
        std::fs::create_dir_all(root.join(&real.archive_path).join(format!("u/{stamp}"))).unwrap();
        // A volume moved into the archive area by hand keeps its own record's path.
        store.create(&path("moved"), &request(1)).unwrap();
        std::fs::create_dir_all(area.join("elsewhere")).unwrap();
        std::fs::rename(root.join("moved"), area.join(format!("elsewhere/{stamp}"))).unwrap();
        // A live volume whose record was marked for an archive that never happened.
        store.create(&path("live"), &request(1)).unwrap();
        let (parent, mut record) = store.locate(&path("live")).unwrap().unwrap();
        record.archive = Some(ArchiveRecord {
            archived_at: "2000-01-01T00:00:00Z".into(),
            retention_days: Some(1),
        });
        let live = open_child(parent.as_fd(), "live", false).unwrap();
        store
            .backend
            .write_record(live.as_fd(), &path("live"), &record)
            .unwrap();

        assert_eq!(ids(&store), [format!("t/{}", &real.archive_path[11..])]);
        let id = |raw: &str| ArchivePath::parse(raw).unwrap();
        for (raw, refused) in [
            (format!("evil/x/{stamp}"), "unsafe"),
            (format!("ns/{stamp}"), "unsafe"),
            (format!("foreign/{stamp}"), "conflict"),
            (format!("elsewhere/{stamp}"), "conflict"),
        ] {
            let err = store.delete_archive(&id(&raw)).unwrap_err();
            let matches = match refused {
                "unsafe" => matches!(err, StoreError::Unsafe(_)),
                _ => matches!(err, StoreError::Conflict(_)),
            };
            assert!(matches, "{raw}: {err}");
        }
        // The live volume's path, with an entry: nothing is at it in the archive area.
        assert_eq!(
            store.delete_archive(&id(&format!("live/{stamp}"))).unwrap(),
            Deleted::WasAbsent
        );
        assert!(store.get(&path("live")).is_ok());
        assert!(outside.path().join(format!("x/{stamp}/precious")).exists());
        assert!(area.join(format!("foreign/{stamp}")).is_dir());
        assert!(area.join(format!("elsewhere/{stamp}")).is_dir());
        assert_eq!(ids(&store).len(), 1);
    }

    #[test]
    fn nested_volumes_are_refused_both_ways() {
        let (_dir, store) = store();
        store.create(&path("a"), &request(1)).unwrap();
        let err = store.create(&path("a/b"), &request(1)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.contains("nested")),
            "{err}"
        );
        store.create(&path("x/y"), &request(1)).unwrap();
        let err = store.create(&path("x"), &request(1)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.contains("not a volume")),
            "{err}"
        );
        // Deleting or archiving the plain parent directory is refused too.
        assert!(matches!(
            store.delete(&path("x")),
            Err(StoreError::Conflict(_))
        ));
        assert!(matches!(
            store.archive(&path("x"), None),
            Err(StoreError::Conflict(_))
        ));
        assert!(store.get(&path("x/y")).is_ok());
    }

    fn adoption(claim: &str, capacity: u64) -> AdoptVolumeRequest {
        AdoptVolumeRequest {
            capacity_bytes: capacity,
            owner: owned_request(claim).owner,
            export: None,
        }
    }

    fn listed(store: &VolumeStore) -> Vec<String> {
        store
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.path.to_string())
            .collect()
    }

    #[test]
    fn adoption_refuses_directories_inside_volumes_and_directories_holding_them() {
        let (dir, store) = store();
        let root = dir.path();
        store.create(&path("a"), &request(1)).unwrap();
        std::fs::create_dir(root.join("a/inner")).unwrap();
        let err = store
            .adopt(&path("a/inner"), &adoption("c", 1))
            .unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.contains("nested")),
            "{err}"
        );

        store.create(&path("x/y"), &request(1)).unwrap();
        store.create(&path("x/z/w"), &request(1)).unwrap();
        for parent in ["x", "x/z"] {
            let err = store.adopt(&path(parent), &adoption("c", 1)).unwrap_err();
            assert!(
                matches!(err, StoreError::Conflict(ref m) if m.contains("holds volumes")),
                "{parent}: {err}"
            );
        }
        // A name that merely starts like the directory's is no volume below it.
        std::fs::create_dir(root.join("x-y")).unwrap();
        assert_eq!(
            store.adopt(&path("x-y"), &adoption("c", 1)).unwrap().1,
            Created::New
        );
        // Refusals recorded nothing.
        assert_eq!(listed(&store), ["a", "x-y", "x/y", "x/z/w"]);
        assert!(store.get(&path("x")).is_err());

        // An archived volume is no longer below its former parent.
        store.archive(&path("x/y"), None).unwrap();
        store.delete(&path("x/z/w")).unwrap();
        let (adopted, how) = store.adopt(&path("x"), &adoption("c", 1)).unwrap();
        assert_eq!((adopted.path.as_str(), how), ("x", Created::New));
        // Now a volume, it can no more be adopted into than a created one.
        let err = store.adopt(&path("x/z"), &adoption("c", 1)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.contains("nested")),
            "{err}"
        );
        let err = store.create(&path("x/new"), &request(1)).unwrap_err();
        assert!(
            matches!(err, StoreError::Conflict(ref m) if m.contains("nested")),
            "{err}"
        );
    }

    #[test]
    fn an_adoption_and_a_create_below_it_never_both_succeed() {
        let (dir, store) = store();
        for round in 0..40 {
            let parent = format!("p{round}");
            std::fs::create_dir(dir.path().join(&parent)).unwrap();
            let start = std::sync::Barrier::new(2);
            let (adopted, created) = std::thread::scope(|s| {
                let adopting = s.spawn(|| {
                    start.wait();
                    store.adopt(&path(&parent), &adoption("p", 1))
                });
                let creating = s.spawn(|| {
                    start.wait();
                    store.create(&path(&format!("{parent}/child")), &request(1))
                });
                (adopting.join().unwrap(), creating.join().unwrap())
            });
            assert!(
                adopted.is_ok() != created.is_ok(),
                "round {round}: adopted {adopted:?}, created {created:?}"
            );
        }
    }

    #[test]
    fn adoption_records_the_directory_as_found_and_confirms_only_the_same_claim() {
        let (dir, store) = store();
        let legacy = dir.path().join("ns-claim-pvc-1");
        std::fs::create_dir(&legacy).unwrap();
        std::fs::write(legacy.join("data"), b"tenant").unwrap();
        std::fs::set_permissions(&legacy, std::fs::Permissions::from_mode(0o2751)).unwrap();
        let stat = std::fs::metadata(&legacy).unwrap();

        let (volume, how) = store
            .adopt(&path("ns-claim-pvc-1"), &adoption("claim", 1 << 30))
            .unwrap();
        assert_eq!(how, Created::New);
        assert_eq!(volume.mode.bits(), 0o2751);
        assert_eq!((volume.uid, volume.gid), (stat.uid(), stat.gid()));
        assert_eq!(volume.capacity_bytes, 1 << 30);
        assert!(!volume.quota_enforced);
        assert_eq!(volume.owner.pvc_name.as_deref(), Some("claim"));
        assert_eq!(store.get(&path("ns-claim-pvc-1")).unwrap(), volume);
        let after = std::fs::metadata(&legacy).unwrap();
        assert_eq!(
            (
                after.ino(),
                after.mode(),
                after.uid(),
                after.gid(),
                after.mtime()
            ),
            (
                stat.ino(),
                stat.mode(),
                stat.uid(),
                stat.gid(),
                stat.mtime()
            )
        );

        let again = store
            .adopt(&path("ns-claim-pvc-1"), &adoption("claim", 1 << 30))
            .unwrap();
        assert_eq!(again, (volume.clone(), Created::Existing));
        for (other, what) in [
            (adoption("other", 1 << 30), "owner"),
            (adoption("claim", 1 << 20), "capacity"),
        ] {
            let err = store.adopt(&path("ns-claim-pvc-1"), &other).unwrap_err();
            assert!(
                matches!(err, StoreError::Conflict(ref m) if m.contains(what)),
                "{what}: {err}"
            );
        }
        // A volume the agent created is confirmed to the same claim, like an adopted one.
        store.create(&path("made"), &owned_request("made")).unwrap();
        assert_eq!(
            store
                .adopt(&path("made"), &adoption("made", 1 << 20))
                .unwrap()
                .1,
            Created::Existing
        );
        assert_eq!(store.get(&path("ns-claim-pvc-1")).unwrap(), volume);
    }

    #[test]
    fn adopted_directories_are_deleted_without_a_quota_command() {
        use crate::quota::command::MockToolRunner;
        type Strategy = fn(Arc<MockToolRunner>) -> Box<dyn QuotaStrategy>;
        let strategies: [(&str, Strategy); 2] = [
            ("xfs", |runner| Box::new(xfs_backend_for_tests(runner))),
            ("btrfs", |runner| Box::new(Btrfs::for_tests(runner))),
        ];
        for (kind, strategy) in strategies {
            let dir = tempfile::tempdir().unwrap();
            let runner = Arc::new(MockToolRunner::default());
            let store = VolumeStore::open_with_backend(
                dir.path(),
                Box::new(DirectoryBackend::new(strategy(runner.clone()))),
            )
            .unwrap();
            std::fs::create_dir_all(dir.path().join("old/sub")).unwrap();
            std::fs::write(dir.path().join("old/sub/file"), b"x").unwrap();
            let (volume, _) = store.adopt(&path("old"), &adoption("c", 1 << 20)).unwrap();
            assert!(!volume.quota_enforced, "{kind}");
            assert_eq!(
                store.measure(&path("old")).unwrap().used_inodes,
                3,
                "{kind}"
            );
            store.resize(&path("old"), 2 << 20).unwrap();
            assert_eq!(store.delete(&path("old")).unwrap(), Deleted::Removed);
            assert!(!dir.path().join("old").exists(), "{kind}");
            assert!(runner.calls().is_empty(), "{kind}: {:?}", runner.calls());
        }
    }

    #[test]
    fn adoption_is_unsupported_on_zfs_and_runs_no_command() {
        use crate::quota::command::MockToolRunner;
        let dir = tempfile::tempdir().unwrap();
        let runner = Arc::new(MockToolRunner::default());
        let zfs = Zfs::for_tests(runner.clone(), "tank/export", dir.path());
        let store =
            VolumeStore::open_with_backend(dir.path(), Box::new(DatasetBackend::new(zfs))).unwrap();
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        // Opening looks for snapshots a crash left unrecorded; adoptions run nothing.
        let at_open = runner.calls();
        for target in ["plain", "missing"] {
            let err = store.adopt(&path(target), &adoption("c", 1)).unwrap_err();
            assert!(
                matches!(err, StoreError::Unsupported(ref m) if m.contains("zfs") && m.contains("dataset")),
                "{err}"
            );
        }
        assert_eq!(runner.calls(), at_open);
    }

    #[test]
    fn list_finds_nested_volumes_only() {
        let (dir, store) = store();
        for p in ["b", "a/c", "a/d/e"] {
            store.create(&path(p), &request(7)).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("plain/dir")).unwrap();
        store.archive(&path("b"), None).unwrap();
        let listed: Vec<String> = store
            .list()
            .unwrap()
            .into_iter()
            .map(|v| v.path.to_string())
            .collect();
        assert_eq!(listed, ["a/c", "a/d/e"]);
    }

    #[test]
    fn purge_removes_crash_leftovers() {
        let (dir, store) = store();
        let leftover = dir.path().join(STATE_DIR).join(TRASH_DIR).join("del-1/sub");
        std::fs::create_dir_all(&leftover).unwrap();
        std::fs::write(leftover.join("f"), b"x").unwrap();
        let purge = store.purge_leftovers();
        assert_eq!(purge.removed, 1);
        assert!(purge.failed.is_empty(), "{:?}", purge.failed);
        assert_eq!(
            std::fs::read_dir(dir.path().join(STATE_DIR).join(TRASH_DIR))
                .unwrap()
                .count(),
            0
        );
    }
}
