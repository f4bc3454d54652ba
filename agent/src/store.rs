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
mod cloning;
mod confine;
pub(crate) mod copy;
mod creation;
mod deletion;
mod durable;
pub(crate) mod error;
mod legacy;
mod locks;
mod mounts;
mod nesting;
mod prefix_tally;
mod probe;
mod provisioned;
mod reconcile;
mod record;
mod resizing;
pub(crate) mod snapshot;
mod snapshot_budget;
pub(crate) mod tree;

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use nfsprov_api_types::{
    CloneMethod, CloneOrigin, FilesystemStats, PageRequest, QuotaBackend, QuotaPolicy,
    RestoreOrigin, RestoreSource, Volume, VolumeOwner, VolumePath, VolumeUsage,
};
use rustix::fs::{AtFlags, Mode};
use rustix::io::Errno;
use time::OffsetDateTime;

use self::backend::directory::btrfs::Btrfs;
use self::confine::{Root, STAGING_DIR, TRASH_DIR, open_child, open_or_create_dir};
use self::durable::{Changes, Durability};
use self::error::{io_error, not_found, walk_error};
use self::record::now_rfc3339;
use crate::quota::QuotaSettings;
use crate::quota::command::{SystemRunner, ToolRunner};

pub use self::archive::area::StoredArchive;
pub use self::archive::naming::ARCHIVE_DIR;
pub use self::backend::directory::xfs::{Xfs, XfsError};
pub use self::backend::directory::{DirectoryBackend, NoQuota, QuotaStrategy};
pub use self::backend::image::ImageBackend;
pub use self::backend::zfs::dataset_backend::DatasetBackend;
pub use self::backend::zfs::{Zfs, ZfsError};
pub use self::backend::{CloneSource, CloneTarget, KnownQuota, Layout, VolumeBackend};
pub use self::confine::{STATE_DIR, is_dot};
pub use self::copy::{
    COPY_DESCRIPTORS, CopyOptions, CopyProgress, CopyStats, copy_tree, reflink_supported,
};
pub use self::error::{Result, StoreError};
pub use self::locks::PathGuard;
pub use self::prefix_tally::{PrefixLimit, PrefixTally, PrefixUse};
pub use self::probe::{Found, Looked};
pub use self::provisioned::{OvercommitLimits, Provisioned, ratio as provisioned_ratio};
pub use self::record::{ArchiveRecord, QuotaRecord, VolumeRecord};
pub use self::snapshot_budget::SnapshotBudget;
pub use self::tree::{MAX_USAGE_DEPTH, measure_tree, remove_tree};

/// A volume's capacity held while it is made or grown, in the provisioned figure and the
/// credentials' tally: given back when dropped, unless kept.
#[derive(Debug)]
#[must_use = "a promise is given back when dropped"]
struct Promise<'a> {
    reservation: provisioned::Reservation<'a>,
    hold: prefix_tally::TallyHold<'a>,
}

impl Promise<'_> {
    fn keep(self) {
        self.reservation.keep();
        self.hold.keep();
    }

    /// Keeps it when `made` says the volume was made now, else gives it back.
    fn keep_if(self, made: bool) {
        if made {
            self.keep();
        }
    }
}

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
    /// The live volumes by path, and the limits of credentials beneath their prefixes.
    prefix_tally: PrefixTally,
    snapshot_budget: SnapshotBudget,
    /// The ids of the archives in the area, sorted, where volumes are directories: pages
    /// of archives start from it.
    archive_index: archive::index::ArchiveIndex,
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
        let archive_index = match backend.layout() {
            Layout::Directories => archive::index::ArchiveIndex::new(archive::area::walk(&root)?),
            // Their backends list pages of archives themselves.
            Layout::Mounts => archive::index::ArchiveIndex::default(),
        };
        Ok(Self {
            archive_index,
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
            prefix_tally: PrefixTally::default(),
            snapshot_budget: SnapshotBudget::default(),
        })
    }

    /// Counts the capacity of every volume, from the records, once, before the store
    /// serves, and bounds new promises by `limits`. A store not counted (the crate's tests)
    /// counts from zero without bounds.
    pub fn count_provisioned(mut self, limits: OvercommitLimits) -> Result<Self> {
        let volumes = self.backend.list(&self.root)?;
        let bytes = volumes
            .iter()
            .map(|(_, record)| record.capacity_bytes)
            .fold(0u64, u64::saturating_add)
            .saturating_add(self.snapshot_promises()?);
        self.provisioned = Provisioned::new(bytes, limits);
        self.prefix_tally = PrefixTally::new(
            volumes
                .into_iter()
                .map(|(path, record)| (path, record.capacity_bytes)),
        );
        Ok(self)
    }

    /// The live volumes by path, and the limits of credentials beneath their prefixes.
    pub fn prefix_tally(&self) -> &PrefixTally {
        &self.prefix_tally
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
    fn promise(&self, path: &VolumePath, capacity: u64) -> Result<Promise<'_>> {
        let reservation = match self.reserve(path, capacity) {
            Err(refused @ StoreError::Overcommitted(_)) if self.locate(path)?.is_none() => {
                Err(refused)
            }
            Err(StoreError::Overcommitted(_)) => self.reserve(path, 0),
            held => held,
        }?;
        // A volume already counted at least this large adds nothing, so a repeated
        // request is never refused here either.
        let hold = self.prefix_tally.hold(path, capacity)?;
        Ok(Promise { reservation, hold })
    }

    /// Holds the growth of the volume at `path` from `from` to `to` bytes, or refuses it
    /// past the overcommit bound or a credential's limit.
    fn promise_growth(&self, path: &VolumePath, from: u64, to: u64) -> Result<Promise<'_>> {
        let reservation = self.reserve(path, to.saturating_sub(from))?;
        let hold = self.prefix_tally.hold(path, to)?;
        Ok(Promise { reservation, hold })
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

    /// Looks at the volume at `path` cheaply, for its condition (see `probe`).
    pub fn look(&self, path: &VolumePath) -> Looked {
        probe::look(&self.root, self.backend.as_ref(), path)
    }

    /// Waits until no other request works on `path`; the guard holds it until dropped.
    pub async fn lock(&self, path: &VolumePath) -> PathGuard {
        self.locks.lock(path.as_str()).await
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

    /// The volumes beneath the root in path order: every one, or with a `page` at most its
    /// limit of those whose paths follow its cursor; and the cursor of the next page (the
    /// page's last path) when more may follow.
    pub fn list(
        &self,
        page: Option<&PageRequest<VolumePath>>,
    ) -> Result<(Vec<Volume>, Option<String>)> {
        let Some(page) = page else {
            let mut found: Vec<Volume> = self
                .backend
                .list(&self.root)?
                .into_iter()
                .map(|(path, record)| record.to_volume(&path))
                .collect();
            found.sort_by(|a, b| a.path.cmp(&b.path));
            return Ok((found, None));
        };
        let (found, more) = self
            .backend
            .list_page(&self.root, page.after.as_ref(), page.limit)?;
        let next = more
            .then(|| found.last().map(|(path, _)| path.to_string()))
            .flatten();
        let found = found
            .into_iter()
            .map(|(path, record)| record.to_volume(&path))
            .collect();
        Ok((found, next))
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

    fn unique_name(&self, kind: &str) -> String {
        let n = self.unique.fetch_add(1, Ordering::Relaxed);
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        format!("{kind}-{}-{nanos}-{n}", std::process::id())
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

    use nfsprov_api_types::{AdoptVolumeRequest, ArchivePath, CreateVolumeRequest};

    use super::*;
    use crate::store::backend::directory::xfs::tests::{FakeXfsQuota, xfs_backend_for_tests};

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
        let [archive] = &store.list_archives(None).unwrap().0[..] else {
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
            .list_archives(None)
            .unwrap()
            .0
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
        let (listed, _) = store.list(None).unwrap();
        assert_eq!(listed.len(), 1, "{listed:?}");
        assert_eq!(listed[0].owner.pvc_name.as_deref(), Some("second"));
        let first = PageRequest {
            limit: 10,
            after: None,
        };
        assert_eq!(store.list(Some(&first)).unwrap().0, listed);
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
        let (listed, _) = store.list_archives(None).unwrap();
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
            .list(None)
            .unwrap()
            .0
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
        let [archive] = &store.list_archives(None).unwrap().0[..] else {
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
        let [listed] = &store.list_archives(None).unwrap().0[..] else {
            panic!("one archive");
        };
        let mut record = listed.record.clone();
        record.archive = None;
        store
            .backend
            .write_record(entry.as_fd(), &path("old"), &record)
            .unwrap();

        let [listed] = &store.list_archives(None).unwrap().0[..] else {
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
            .list(None)
            .unwrap()
            .0
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
            .list(None)
            .unwrap()
            .0
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
