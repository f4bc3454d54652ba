//! Every filesystem operation of the agent, confined beneath the export root.
//!
//! Paths are walked one component at a time from a directory descriptor opened on the
//! root, each step with `O_NOFOLLOW | O_DIRECTORY`, so a symlink anywhere on the way is
//! refused instead of followed and nothing outside the root is ever reached. Validated
//! volume paths cannot name hidden entries, which keeps the agent's own areas (`.nfsprov`
//! for staging and trash, `.archive` for archives) out of reach of the volume endpoints.
//!
//! Creation is atomic: a directory is made and fully set up (owner, mode, metadata) in a
//! staging area, then renamed into place with `RENAME_NOREPLACE`. Deletion first renames
//! the volume into a trash area (so the path is gone at once and a retry sees it absent),
//! then removes the tree; trash left by a crash is purged at the next start.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::quota::{Quota, QuotaError};

mod zfs;
use nfsprov_api_types::{
    ArchiveResult, CreateVolumeRequest, FilesystemStats, Mode as VolumeMode, QuotaBackend,
    QuotaPolicy, Volume, VolumeOwner, VolumePath, VolumeUsage,
};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, RenameFlags, XattrFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

/// Hidden directory beneath the root holding the agent's work areas.
pub const STATE_DIR: &str = ".nfsprov";
/// Where volumes are set up before being renamed into place.
const STAGING_DIR: &str = "staging";
/// Where deleted volumes wait for their tree to be removed.
const TRASH_DIR: &str = "trash";
/// Archive area beneath the root; archives keep the volume's path below it.
pub const ARCHIVE_DIR: &str = ".archive";
/// Archive entries start with a character volume paths cannot contain, so an archive
/// can never be mistaken for (or collide with) a nested volume name.
const ARCHIVE_ENTRY_PREFIX: char = '@';
/// Extended attribute holding a volume's metadata; its presence is what makes a directory
/// a volume, so the agent never deletes or archives a directory it did not create.
const META_XATTR: &str = "user.nfsprov.volume";
/// Mode of parent directories the agent creates for nested paths: traversable by the
/// pods' users, writable only by the agent.
const PARENT_MODE: u32 = 0o755;

/// What went wrong, in terms the API maps to its error codes.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A symlink or non-directory where a directory must be.
    #[error("{0}")]
    Unsafe(String),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    NoSpace(String),
    #[error("{0}")]
    NotReady(String),
    /// A quota the backend cannot give, or a shrink.
    #[error("{0}")]
    Unsupported(String),
    /// A quota operation failed.
    #[error("{context}: {source}")]
    Quota {
        context: String,
        #[source]
        source: QuotaError,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

type Result<T> = std::result::Result<T, StoreError>;

fn quota_error(context: impl Into<String>, source: impl Into<QuotaError>) -> StoreError {
    StoreError::Quota {
        context: context.into(),
        source: source.into(),
    }
}

fn io_error(context: impl Into<String>, errno: Errno) -> StoreError {
    let context = context.into();
    match errno {
        Errno::NOSPC | Errno::DQUOT => StoreError::NoSpace(format!("{context}: no space left")),
        _ => StoreError::Io {
            context,
            source: errno.into(),
        },
    }
}

/// Metadata stored with each volume (in [`META_XATTR`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct VolumeMeta {
    mode: VolumeMode,
    uid: u32,
    gid: u32,
    capacity_bytes: u64,
    #[serde(default)]
    owner: VolumeOwner,
    created_at: String,
    /// The quota holding the volume to its capacity; absent when nothing enforces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    quota: Option<QuotaRecord>,
}

/// Which quota enforces a volume's capacity, with what the backend needs to find it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct QuotaRecord {
    backend: QuotaBackend,
    /// The XFS project id the volume's tree carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    project_id: Option<u32>,
}

/// Whether [`VolumeStore::create`] made the volume or found it.
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

/// The export root and the operations on it.
#[derive(Debug)]
pub struct VolumeStore {
    quota: Quota,
    root_path: PathBuf,
    root: OwnedFd,
    root_id: (u64, u64),
    default_uid: u32,
    default_gid: u32,
    unique: AtomicU64,
}

impl VolumeStore {
    /// Opens the export root and prepares the agent's work areas beneath it.
    pub fn open(root_path: &Path) -> Result<Self> {
        Self::open_with_quota(root_path, Quota::None)
    }

    /// Opens the export root with the given quota backend (already probed).
    pub fn open_with_quota(root_path: &Path, quota: Quota) -> Result<Self> {
        if !root_path.is_absolute() {
            return Err(StoreError::NotReady(format!(
                "export root {} is not an absolute path",
                root_path.display()
            )));
        }
        let root = rustix::fs::open(
            root_path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            StoreError::NotReady(format!(
                "export root {} cannot be opened as a directory: {}",
                root_path.display(),
                io::Error::from(e)
            ))
        })?;
        let stat = rustix::fs::fstat(&root).map_err(|e| io_error("stat export root", e))?;
        let store = Self {
            quota,
            root_path: root_path.to_owned(),
            root,
            root_id: (stat.st_dev, stat.st_ino),
            default_uid: rustix::process::geteuid().as_raw(),
            default_gid: rustix::process::getegid().as_raw(),
            unique: AtomicU64::new(0),
        };
        let state = store.open_internal(&[STATE_DIR], true)?;
        for area in [STAGING_DIR, TRASH_DIR] {
            open_child(state.as_fd(), area, true)?;
        }
        store.open_internal(&[ARCHIVE_DIR], true)?;
        if !matches!(store.quota, Quota::Zfs(_)) {
            store.check_xattr_support()?;
        }
        if let Quota::Xfs(xfs) = &store.quota {
            xfs.mark_in_use(store.recorded_project_ids()?);
        }
        Ok(store)
    }

    pub fn root_path(&self) -> &Path {
        &self.root_path
    }

    pub fn quota(&self) -> &Quota {
        &self.quota
    }

    /// The settings a create request asks for, to compare with an existing volume's.
    fn wanted_meta(&self, request: &CreateVolumeRequest) -> VolumeMeta {
        VolumeMeta {
            mode: request.mode,
            uid: request.uid.unwrap_or(self.default_uid),
            gid: request.gid.unwrap_or(self.default_gid),
            capacity_bytes: request.capacity_bytes,
            owner: request.owner.clone(),
            created_at: String::new(),
            quota: None,
        }
    }

    /// Whether a new volume gets a quota, or why the request cannot be honoured.
    fn enforcement(&self, path: &VolumePath, policy: QuotaPolicy) -> Result<bool> {
        match policy {
            QuotaPolicy::Off => Ok(false),
            QuotaPolicy::BestEffort => Ok(self.quota.can_enforce()),
            QuotaPolicy::Enforce if self.quota.can_enforce() => Ok(true),
            QuotaPolicy::Enforce => Err(StoreError::Unsupported(format!(
                "{path}: quota enforcement was required, but this agent's quota backend is none, so capacity cannot be enforced; configure a quota backend on the agent or use quota bestEffort or off"
            ))),
        }
    }

    /// Fails unless user extended attributes work here: volume metadata depends on them.
    fn check_xattr_support(&self) -> Result<()> {
        let staging = self.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
        match rustix::fs::fsetxattr(&staging, "user.nfsprov.probe", b"1", XattrFlags::empty()) {
            Ok(()) => {
                let _ = rustix::fs::fremovexattr(&staging, "user.nfsprov.probe");
                Ok(())
            }
            Err(e) => Err(StoreError::NotReady(format!(
                "the filesystem of {} does not support user extended attributes ({}); the agent keeps volume metadata in them",
                self.root_path.display(),
                io::Error::from(e)
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
        let display = self.root_path.display();
        let stat = rustix::fs::stat(&self.root_path)
            .map_err(|e| format!("export root {display} is missing: {}", io::Error::from(e)))?;
        if (stat.st_dev, stat.st_ino) != self.root_id {
            return Err(format!(
                "export root {display} is no longer the directory the agent opened (unmounted or replaced); restart the agent"
            ));
        }
        let probe = format!("{STATE_DIR}-probe-{}", std::process::id());
        match rustix::fs::mkdirat(&self.root, probe.as_str(), Mode::from_raw_mode(0o700)) {
            Ok(()) | Err(Errno::EXIST) => {
                let _ = rustix::fs::unlinkat(&self.root, probe.as_str(), AtFlags::REMOVEDIR);
            }
            Err(e) => {
                return Err(format!(
                    "export root {display} is not writable: {}",
                    io::Error::from(e)
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

    /// Refuses mutations when the root is gone or was replaced.
    fn ensure_root(&self) -> Result<()> {
        match rustix::fs::stat(&self.root_path) {
            Ok(stat) if (stat.st_dev, stat.st_ino) == self.root_id => Ok(()),
            Ok(_) => Err(StoreError::NotReady(format!(
                "export root {} was replaced or unmounted",
                self.root_path.display()
            ))),
            Err(e) => Err(StoreError::NotReady(format!(
                "export root {} is missing: {}",
                self.root_path.display(),
                io::Error::from(e)
            ))),
        }
    }

    pub fn filesystem_stats(&self) -> Result<FilesystemStats> {
        let vfs =
            rustix::fs::fstatvfs(&self.root).map_err(|e| io_error("statvfs export root", e))?;
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
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_create(zfs, path, request);
        }
        self.ensure_root()?;
        let wanted = self.wanted_meta(request);
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        let leaf = path.file_name();
        if let Some(existing) = self.existing_volume(parent.as_fd(), path)? {
            return confirm(path, existing, &wanted, request.quota);
        }

        let enforce = self.enforcement(path, request.quota)?;
        let staging = self.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
        let staged = self.unique_name("new");
        match &self.quota {
            Quota::Btrfs(btrfs) if enforce => btrfs
                .create_subvolume(staging.as_fd(), &staged)
                .map_err(|e| quota_error(format!("create subvolume for {path}"), e))?,
            _ => rustix::fs::mkdirat(&staging, staged.as_str(), Mode::from_raw_mode(0o700))
                .map_err(|e| io_error(format!("create {path}"), e))?,
        }
        let mut limited = None;
        let result = (|| -> Result<rustix::io::Result<VolumeMeta>> {
            let dir = open_child(staging.as_fd(), &staged, false)?;
            let mut meta = VolumeMeta {
                created_at: now_rfc3339(),
                ..wanted.clone()
            };
            set_owner_and_mode(dir.as_fd(), path, &meta)?;
            if enforce {
                limited = Some(self.limit_new(dir.as_fd(), path, meta.capacity_bytes)?);
                meta.quota = limited.clone();
            }
            write_meta(dir.as_fd(), &meta)
                .map_err(|e| io_error(format!("record metadata of {path}"), e))?;
            Ok(rustix::fs::renameat_with(
                &staging,
                staged.as_str(),
                &parent,
                leaf,
                RenameFlags::NOREPLACE,
            )
            .map(|()| meta))
        })();
        match result {
            Ok(Ok(meta)) => Ok((volume(path, meta), Created::New)),
            Ok(Err(Errno::EXIST)) => {
                // Someone (another request, or a stray file) took the name meanwhile.
                self.remove_volume(staging.as_fd(), &staged, limited.as_ref())?;
                match self.existing_volume(parent.as_fd(), path)? {
                    Some(existing) => confirm(path, existing, &wanted, request.quota),
                    None => Err(StoreError::Conflict(format!(
                        "{path} was created concurrently"
                    ))),
                }
            }
            Ok(Err(e)) => {
                self.remove_volume(staging.as_fd(), &staged, limited.as_ref())?;
                Err(io_error(format!("move new volume {path} into place"), e))
            }
            Err(e) => {
                self.remove_volume(staging.as_fd(), &staged, limited.as_ref())?;
                Err(e)
            }
        }
    }

    /// The volume at `path`.
    pub fn get(&self, path: &VolumePath) -> Result<Volume> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_get(zfs, path);
        }
        let parent = self
            .walk_parents(path, false)?
            .ok_or_else(|| not_found(path))?;
        match self.existing_volume(parent.as_fd(), path)? {
            Some(meta) => Ok(volume(path, meta)),
            None => Err(not_found(path)),
        }
    }

    /// Space and inodes the volume uses, measured by walking its tree (see `usage`).
    pub fn measure(&self, path: &VolumePath) -> Result<VolumeUsage> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_measure(zfs, path);
        }
        let parent = self
            .walk_parents(path, false)?
            .ok_or_else(|| not_found(path))?;
        let Some(meta) = self.existing_volume(parent.as_fd(), path)? else {
            return Err(not_found(path));
        };
        let project_id = meta.quota.as_ref().and_then(|q| q.project_id);
        // A project quota counts both figures itself; no walk is needed.
        if let (Some(id), Quota::Xfs(xfs)) = (project_id, &self.quota) {
            return xfs
                .usage(id)
                .map_err(|e| quota_error(format!("read the quota usage of {path}"), e));
        }
        let dir = open_child(parent.as_fd(), path.file_name(), false)?;
        let mut usage = crate::usage::measure_tree(dir.as_fd())
            .map_err(|e| io_error(format!("measure {path}"), e))?;
        // The quota's own count is what enforcement compares with the capacity.
        if let (Some(_), Quota::Btrfs(btrfs)) = (&meta.quota, &self.quota) {
            usage.used_bytes = btrfs
                .used_bytes(dir.as_fd())
                .map_err(|e| quota_error(format!("read the quota usage of {path}"), e))?;
        }
        Ok(usage)
    }

    /// Raises the volume's capacity, and its quota when one enforces it. The same
    /// capacity again is a success that changes nothing; shrinking is refused.
    pub fn resize(&self, path: &VolumePath, capacity_bytes: u64) -> Result<Volume> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_resize(zfs, path, capacity_bytes);
        }
        self.ensure_root()?;
        let parent = self
            .walk_parents(path, false)?
            .ok_or_else(|| not_found(path))?;
        let Some(mut meta) = self.existing_volume(parent.as_fd(), path)? else {
            return Err(not_found(path));
        };
        if !is_growth(path, &meta, capacity_bytes)? {
            return Ok(volume(path, meta));
        }
        let dir = open_child(parent.as_fd(), path.file_name(), false)?;
        if let Some(record) = &meta.quota {
            // The quota first: a crash before the metadata is updated leaves a quota at
            // least as large as recorded, and the retried request sets it again.
            match (record.backend, record.project_id, &self.quota) {
                (QuotaBackend::Btrfs, _, Quota::Btrfs(btrfs)) => btrfs
                    .set_limit(dir.as_fd(), capacity_bytes)
                    .map_err(|e| quota_error(format!("raise the quota of {path}"), e))?,
                (QuotaBackend::Xfs, Some(id), Quota::Xfs(xfs)) => xfs
                    .set_limit(id, capacity_bytes)
                    .map_err(|e| quota_error(format!("raise the quota of {path}"), e))?,
                (kept_by, _, _) => {
                    return Err(StoreError::Unsupported(format!(
                        "{path} is limited by a {} quota, but the agent runs with quota backend {}; its quota cannot be changed",
                        kept_by,
                        self.quota.backend()
                    )));
                }
            }
        }
        meta.capacity_bytes = capacity_bytes;
        write_meta(dir.as_fd(), &meta)
            .map_err(|e| io_error(format!("record the new capacity of {path}"), e))?;
        Ok(volume(path, meta))
    }

    /// Removes the volume's whole tree; symlinks inside it are removed, never followed.
    pub fn delete(&self, path: &VolumePath) -> Result<Deleted> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_delete(zfs, path);
        }
        self.ensure_root()?;
        let Some(parent) = self.walk_parents(path, false)? else {
            return Ok(Deleted::WasAbsent);
        };
        let Some(meta) = self.existing_volume(parent.as_fd(), path)? else {
            return Ok(Deleted::WasAbsent);
        };
        let trash = self.open_internal(&[STATE_DIR, TRASH_DIR], false)?;
        let doomed = self.unique_name("del");
        match rustix::fs::renameat_with(
            &parent,
            path.file_name(),
            &trash,
            doomed.as_str(),
            RenameFlags::NOREPLACE,
        ) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(Deleted::WasAbsent),
            Err(e) => return Err(io_error(format!("move {path} to the trash"), e)),
        }
        self.remove_volume(trash.as_fd(), &doomed, meta.quota.as_ref())?;
        Ok(Deleted::Removed)
    }

    /// Moves the volume into the archive area under `.archive/<path>/@<UTC time>`. When the
    /// volume is already gone but was archived before, reports the latest archive, so a
    /// retried request gets the same answer.
    pub fn archive(&self, path: &VolumePath) -> Result<(ArchiveResult, Archived)> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_archive(zfs, path);
        }
        self.ensure_root()?;
        let parent = self.walk_parents(path, false)?;
        let exists = match &parent {
            Some(parent) => self.existing_volume(parent.as_fd(), path)?.is_some(),
            None => false,
        };
        let mut archive_components = vec![ARCHIVE_DIR];
        archive_components.extend(path.components());
        let Some(parent) = parent.filter(|_| exists) else {
            return match self.latest_archive(&archive_components)? {
                Some(entry) => Ok((archive_result(path, &entry), Archived::Earlier)),
                None => Err(StoreError::NotFound(format!(
                    "no volume at {path} and no archive of it"
                ))),
            };
        };
        let target = self.open_internal(&archive_components, true)?;
        for entry in archive_entries(OffsetDateTime::now_utc()) {
            match rustix::fs::renameat_with(
                &parent,
                path.file_name(),
                &target,
                entry.as_str(),
                RenameFlags::NOREPLACE,
            ) {
                Ok(()) => return Ok((archive_result(path, &entry), Archived::New)),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(io_error(format!("move {path} to the archive"), e)),
            }
        }
        Err(StoreError::Conflict(format!(
            "could not find a free archive name for {path}"
        )))
    }

    /// Every volume beneath the root, sorted by path.
    pub fn list(&self) -> Result<Vec<Volume>> {
        if let Quota::Zfs(zfs) = &self.quota {
            return self.zfs_list(zfs);
        }
        let mut found = Vec::new();
        let mut prefix = Vec::new();
        self.collect_volumes(self.root.as_fd(), &mut prefix, &mut found)?;
        found.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(found)
    }

    fn collect_volumes(
        &self,
        dir: BorrowedFd<'_>,
        prefix: &mut Vec<String>,
        found: &mut Vec<Volume>,
    ) -> Result<()> {
        if prefix.len() >= nfsprov_api_types::MAX_COMPONENTS {
            return Ok(());
        }
        let names = list_dir(dir).map_err(|e| io_error("list volumes", e))?;
        for (name, kind) in names {
            if name.starts_with('.') || nfsprov_api_types::validate_component(&name).is_err() {
                continue;
            }
            if !matches!(kind, FileType::Directory | FileType::Unknown) {
                continue;
            }
            let child = match open_child(dir, &name, false) {
                Ok(child) => child,
                // Vanished, a symlink, or not a directory: not a volume either way.
                Err(_) => continue,
            };
            prefix.push(name);
            match read_meta(child.as_fd()) {
                Ok(Some(meta)) => {
                    if let Ok(path) = VolumePath::parse(&prefix.join("/")) {
                        found.push(volume(&path, meta));
                    }
                }
                Ok(None) => self.collect_volumes(child.as_fd(), prefix, found)?,
                Err(e) => {
                    return Err(io_error(
                        format!("read metadata of {}", prefix.join("/")),
                        e,
                    ));
                }
            }
            prefix.pop();
        }
        Ok(())
    }

    /// Removes whatever a crash left in the staging and trash areas.
    pub fn purge_leftovers(&self) -> Result<usize> {
        let mut purged = 0;
        if let Quota::Zfs(zfs) = &self.quota {
            purged += zfs
                .purge_leftovers()
                .map_err(|e| quota_error("purge unfinished datasets", e))?;
        }
        for area in [STAGING_DIR, TRASH_DIR] {
            let dir = self.open_internal(&[STATE_DIR, area], false)?;
            for (name, _) in
                list_dir(dir.as_fd()).map_err(|e| io_error(format!("list {area}"), e))?
            {
                let record = open_child(dir.as_fd(), &name, false)
                    .ok()
                    .and_then(|entry| read_meta(entry.as_fd()).ok().flatten())
                    .and_then(|meta| meta.quota);
                self.remove_volume(dir.as_fd(), &name, record.as_ref())?;
                purged += 1;
            }
        }
        Ok(purged)
    }

    /// Puts the quota on a new volume (still in staging).
    fn limit_new(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        capacity: u64,
    ) -> Result<QuotaRecord> {
        match &self.quota {
            Quota::None => Err(StoreError::Unsupported(format!(
                "{path}: no quota backend to limit it"
            ))),
            Quota::Btrfs(btrfs) => {
                btrfs
                    .set_limit(dir, capacity)
                    .map_err(|e| quota_error(format!("limit {path} to {capacity} bytes"), e))?;
                Ok(QuotaRecord {
                    backend: QuotaBackend::Btrfs,
                    project_id: None,
                })
            }
            Quota::Zfs(_) => Err(StoreError::Unsupported(format!(
                "{path}: ZFS volumes get their quota when their dataset is created"
            ))),
            Quota::Xfs(xfs) => {
                let id = xfs
                    .limit_new(dir, capacity)
                    .map_err(|e| quota_error(format!("limit {path} to {capacity} bytes"), e))?;
                Ok(QuotaRecord {
                    backend: QuotaBackend::Xfs,
                    project_id: Some(id),
                })
            }
        }
    }

    /// Removes `name` in `parent` (a volume, or what is left of one) with its quota: a
    /// subvolume is deleted as such, never emptied file by file and left behind.
    fn remove_volume(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        record: Option<&QuotaRecord>,
    ) -> Result<()> {
        let entry = match open_child(parent, name, false) {
            Ok(entry) => entry,
            Err(StoreError::NotFound(_)) => return Ok(()),
            // Not a directory: an ordinary unlink below.
            Err(_) => return remove_tree(parent, name),
        };
        if let Quota::Btrfs(btrfs) = &self.quota
            && crate::quota::btrfs::is_subvolume(entry.as_fd())
        {
            drop(entry);
            return btrfs
                .delete_subvolume(parent, name)
                .map_err(|e| quota_error(format!("delete subvolume {name}"), e));
        }
        drop(entry);
        remove_tree(parent, name)?;
        // The project id is freed only once nothing is charged to it any more.
        if let (Some(id), Quota::Xfs(xfs)) = (record.and_then(|r| r.project_id), &self.quota) {
            xfs.release(id)
                .map_err(|e| quota_error(format!("release project id {id} of {name}"), e))?;
        }
        Ok(())
    }

    /// Every project id recorded in a volume's metadata anywhere beneath the root:
    /// volumes, archives, and whatever staging and trash hold.
    fn recorded_project_ids(&self) -> Result<Vec<u32>> {
        let mut ids = Vec::new();
        // Archives sit two levels below their path (`.archive/<path>/@<time>`).
        collect_project_ids(
            self.root.as_fd(),
            nfsprov_api_types::MAX_COMPONENTS + 2,
            &mut ids,
        )?;
        Ok(ids)
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
            let base = current.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
            let next = match open_or_create_dir(base, component, create) {
                Ok(fd) => fd,
                Err(Errno::NOENT) if !create => return Ok(None),
                Err(e) => return Err(walk_error(&walked.join("/"), e)),
            };
            let is_volume = read_meta(next.as_fd())
                .map_err(|e| io_error(format!("read metadata of {}", walked.join("/")), e))?
                .is_some();
            // A ZFS volume is a mount: another device than the root's own dataset.
            let is_dataset = matches!(self.quota, Quota::Zfs(_))
                && rustix::fs::fstat(&next).is_ok_and(|st| st.st_dev != self.root_id.0);
            if is_volume || is_dataset {
                return Err(StoreError::Conflict(format!(
                    "{path} would be inside the volume {}; volumes cannot be nested",
                    walked.join("/")
                )));
            }
            current = Some(next);
        }
        match current {
            Some(fd) => Ok(Some(fd)),
            None => rustix::fs::openat(
                &self.root,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map(Some)
            .map_err(|e| io_error("open export root", e)),
        }
    }

    /// The metadata of the volume named by `path`'s last component in `parent`; `None`
    /// when nothing is there; an error when something that is not a volume is there.
    fn existing_volume(
        &self,
        parent: BorrowedFd<'_>,
        path: &VolumePath,
    ) -> Result<Option<VolumeMeta>> {
        let dir = match open_child(parent, path.file_name(), false) {
            Ok(dir) => dir,
            Err(StoreError::NotFound(_)) => return Ok(None),
            Err(e) => return Err(e),
        };
        match read_meta(dir.as_fd()).map_err(|e| io_error(format!("read metadata of {path}"), e))? {
            Some(meta) => Ok(Some(meta)),
            None => Err(StoreError::Conflict(format!(
                "{path} exists but is not a volume made by the agent (no volume metadata); refusing to touch it"
            ))),
        }
    }

    /// The newest archive entry under the given archive directory, if any.
    fn latest_archive(&self, archive_components: &[&str]) -> Result<Option<String>> {
        let mut dir = self
            .root
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| StoreError::Io {
                context: "duplicate root descriptor".into(),
                source: e,
            })?;
        for component in archive_components {
            dir = match open_child(dir.as_fd(), component, false) {
                Ok(next) => next,
                Err(StoreError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        let names = list_dir(dir.as_fd()).map_err(|e| io_error("list archives", e))?;
        // Stamps sort chronologically as text; a "-N" suffix sorts after its base stamp.
        Ok(names
            .into_iter()
            .map(|(name, _)| name)
            .filter(|name| name.starts_with(ARCHIVE_ENTRY_PREFIX))
            .max())
    }

    /// Opens (and with `create`, makes) a directory of the agent's own beneath the root.
    fn open_internal(&self, components: &[&str], create: bool) -> Result<OwnedFd> {
        let mut dir: Option<OwnedFd> = None;
        for component in components {
            let base = dir.as_ref().map_or(self.root.as_fd(), |fd| fd.as_fd());
            dir = Some(open_child(base, component, create)?);
        }
        dir.ok_or_else(|| StoreError::NotReady("empty internal path".into()))
    }

    fn unique_name(&self, kind: &str) -> String {
        let n = self.unique.fetch_add(1, Ordering::Relaxed);
        let nanos = OffsetDateTime::now_utc().unix_timestamp_nanos();
        format!("{kind}-{}-{nanos}-{n}", std::process::id())
    }
}

/// Gives a new volume's root its owner and mode.
fn set_owner_and_mode(dir: BorrowedFd<'_>, path: &VolumePath, meta: &VolumeMeta) -> Result<()> {
    // chown before chmod: chown clears the setuid and setgid bits.
    rustix::fs::fchown(
        dir,
        Some(rustix::fs::Uid::from_raw(meta.uid)),
        Some(rustix::fs::Gid::from_raw(meta.gid)),
    )
    .map_err(|e| io_error(format!("chown {path} to {}:{}", meta.uid, meta.gid), e))?;
    rustix::fs::fchmod(dir, Mode::from_raw_mode(meta.mode.bits()))
        .map_err(|e| io_error(format!("chmod {path}"), e))
}

/// Whether a resize to `capacity_bytes` changes anything; an error for a shrink.
fn is_growth(path: &VolumePath, meta: &VolumeMeta, capacity_bytes: u64) -> Result<bool> {
    if capacity_bytes < meta.capacity_bytes {
        return Err(StoreError::Unsupported(format!(
            "{path} has a capacity of {} bytes; shrinking it to {capacity_bytes} bytes is not supported",
            meta.capacity_bytes
        )));
    }
    Ok(capacity_bytes > meta.capacity_bytes)
}

fn confirm(
    path: &VolumePath,
    existing: VolumeMeta,
    wanted: &VolumeMeta,
    policy: QuotaPolicy,
) -> Result<(Volume, Created)> {
    let mut differences = Vec::new();
    if policy == QuotaPolicy::Enforce && existing.quota.is_none() {
        differences.push("no enforced quota (requested enforce)".to_owned());
    }
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
    if existing.capacity_bytes != wanted.capacity_bytes {
        differences.push(format!(
            "capacity {} bytes (requested {})",
            existing.capacity_bytes, wanted.capacity_bytes
        ));
    }
    if existing.owner != wanted.owner {
        differences.push(format!(
            "owner {:?} (requested {:?})",
            existing.owner, wanted.owner
        ));
    }
    if differences.is_empty() {
        Ok((volume(path, existing), Created::Existing))
    } else {
        Err(StoreError::Conflict(format!(
            "{path} already exists with other settings: {}",
            differences.join(", ")
        )))
    }
}

fn volume(path: &VolumePath, meta: VolumeMeta) -> Volume {
    Volume {
        path: path.clone(),
        mode: meta.mode,
        uid: meta.uid,
        gid: meta.gid,
        capacity_bytes: meta.capacity_bytes,
        quota_enforced: meta.quota.is_some(),
        owner: meta.owner,
        created_at: meta.created_at,
        usage: None,
    }
}

fn not_found(path: &VolumePath) -> StoreError {
    StoreError::NotFound(format!("no volume at {path}"))
}

fn walk_error(walked: &str, errno: Errno) -> StoreError {
    match errno {
        Errno::LOOP | Errno::NOTDIR | Errno::MLINK => StoreError::Unsafe(format!(
            "{walked} is a symlink or not a directory; the agent never follows links"
        )),
        e => io_error(format!("open {walked}"), e),
    }
}

fn archive_result(path: &VolumePath, entry: &str) -> ArchiveResult {
    let stamp = entry.trim_start_matches(ARCHIVE_ENTRY_PREFIX);
    let stamp = stamp.split_once('-').map_or(stamp, |(base, _)| base);
    ArchiveResult {
        path: path.clone(),
        archive_path: format!("{ARCHIVE_DIR}/{path}/{entry}"),
        archived_at: archive_stamp_to_rfc3339(stamp).unwrap_or_default(),
    }
}

const ARCHIVE_STAMP: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year][month][day]T[hour][minute][second].[subsecond digits:9]Z"
);

/// The archive entry names to try, in order, for an archive made at `at`: the time, then
/// the time with a counter for archives of the same path within the same nanosecond.
fn archive_entries(at: OffsetDateTime) -> impl Iterator<Item = String> {
    let stamp = archive_stamp(at);
    (0..100u32).map(move |attempt| match attempt {
        0 => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}"),
        n => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}-{n}"),
    })
}

fn archive_stamp(at: OffsetDateTime) -> String {
    at.format(ARCHIVE_STAMP)
        .unwrap_or_else(|_| at.unix_timestamp_nanos().to_string())
}

fn archive_stamp_to_rfc3339(stamp: &str) -> Option<String> {
    let parsed = time::PrimitiveDateTime::parse(stamp, ARCHIVE_STAMP).ok()?;
    parsed
        .assume_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

pub(crate) fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// Opens `name` in `dir` as a directory without following a symlink; with `create`,
/// makes it first when missing.
fn open_child(dir: BorrowedFd<'_>, name: &str, create: bool) -> Result<OwnedFd> {
    open_or_create_dir(dir, name, create).map_err(|e| match e {
        Errno::NOENT => StoreError::NotFound(format!("{name} does not exist")),
        e => walk_error(name, e),
    })
}

fn open_or_create_dir(
    dir: BorrowedFd<'_>,
    name: &str,
    create: bool,
) -> rustix::io::Result<OwnedFd> {
    let made = create
        && match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(PARENT_MODE)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(e),
        };
    let opened = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if made {
        // The process umask (0077 under the shipped unit) narrowed the mode; pods must
        // be able to traverse parents to reach their volume.
        rustix::fs::fchmod(&opened, Mode::from_raw_mode(PARENT_MODE))?;
    }
    Ok(opened)
}

fn read_meta(dir: BorrowedFd<'_>) -> rustix::io::Result<Option<VolumeMeta>> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::fgetxattr(dir, META_XATTR, &mut buf[..]) {
        Ok(len) => {
            buf.truncate(len);
            // Unreadable metadata is treated as foreign: better refuse than guess.
            Ok(serde_json::from_slice(&buf).ok())
        }
        // zfs-fuse has no extended attributes; its volumes keep metadata in properties.
        Err(Errno::NODATA | Errno::NOTSUP) => Ok(None),
        Err(e) => Err(e),
    }
}

fn write_meta(dir: BorrowedFd<'_>, meta: &VolumeMeta) -> rustix::io::Result<()> {
    let bytes = serde_json::to_vec(meta).map_err(|_| Errno::INVAL)?;
    rustix::fs::fsetxattr(dir, META_XATTR, &bytes, XattrFlags::empty())
}

/// Collects the project ids of the volumes at or below `dir`, descending at most `depth`
/// levels and never into a volume.
fn collect_project_ids(dir: BorrowedFd<'_>, depth: usize, ids: &mut Vec<u32>) -> Result<()> {
    if depth == 0 {
        return Ok(());
    }
    for (name, kind) in list_dir(dir).map_err(|e| io_error("scan for project ids", e))? {
        if !matches!(kind, FileType::Directory | FileType::Unknown) {
            continue;
        }
        let Ok(child) = open_child(dir, &name, false) else {
            continue;
        };
        match read_meta(child.as_fd()) {
            Ok(Some(meta)) => ids.extend(meta.quota.and_then(|q| q.project_id)),
            Ok(None) => collect_project_ids(child.as_fd(), depth - 1, ids)?,
            Err(e) => return Err(io_error(format!("read metadata of {name}"), e)),
        }
    }
    Ok(())
}

/// Names and types of the entries of a directory, without `.` and `..`.
fn list_dir(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<(String, FileType)>> {
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if is_dot(name) {
            continue;
        }
        // Names that are not UTF-8 are still removable through the byte-level path in
        // `remove_tree`; here they are only listed, so a lossy form is enough to skip them.
        entries.push((name.to_string_lossy().into_owned(), entry.file_type()));
    }
    Ok(entries)
}

pub(crate) fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// Removes `name` in `parent` and everything below it. Entries are opened relative to
/// their directory with `O_NOFOLLOW`, so a symlink is unlinked, never followed. The
/// subdirectories of the top directory are removed by several threads at once: unlinks
/// in different directories do not contend, and a big tree goes markedly faster.
pub(crate) fn remove_tree(parent: BorrowedFd<'_>, name: &str) -> Result<()> {
    let c_name = std::ffi::CString::new(name)
        .map_err(|_| StoreError::Unsafe(format!("{name:?} contains NUL")))?;
    remove_entry(parent, &c_name, None, true).map_err(|e| io_error(format!("remove {name}"), e))
}

/// Removes one entry; `hint` is its type as listed (`None` when unknown).
fn remove_entry(
    parent: BorrowedFd<'_>,
    name: &CStr,
    hint: Option<FileType>,
    parallel: bool,
) -> rustix::io::Result<()> {
    if hint != Some(FileType::Directory) {
        match rustix::fs::unlinkat(parent, name, AtFlags::empty()) {
            Ok(()) | Err(Errno::NOENT) => return Ok(()),
            // A directory (the type was unknown or lied): empty it below.
            Err(Errno::ISDIR) | Err(Errno::PERM) => {}
            Err(e) => return Err(e),
        }
    }
    let dir = match rustix::fs::openat(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(dir) => dir,
        Err(Errno::NOENT) => return Ok(()),
        // Replaced by a non-directory since it was listed: unlink that instead.
        Err(Errno::NOTDIR) | Err(Errno::LOOP) => {
            return remove_entry(parent, name, Some(FileType::RegularFile), false);
        }
        Err(e) => return Err(e),
    };
    let children = read_children(dir.as_fd())?;
    if parallel {
        remove_children_in_parallel(dir.as_fd(), children)?;
    } else {
        for (child, kind) in children {
            remove_entry(
                dir.as_fd(),
                &child,
                Some(kind).filter(|k| *k != FileType::Unknown),
                false,
            )?;
        }
    }
    drop(dir);
    match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Removes the files of `dir` at once and its subdirectories on a few threads.
fn remove_children_in_parallel(
    dir: BorrowedFd<'_>,
    children: Vec<(std::ffi::CString, FileType)>,
) -> rustix::io::Result<()> {
    let mut subdirectories = Vec::new();
    for (child, kind) in children {
        match kind {
            FileType::Directory => subdirectories.push(child),
            FileType::Unknown => remove_entry(dir, &child, None, false)?,
            kind => remove_entry(dir, &child, Some(kind), false)?,
        }
    }
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, 4)
        .min(subdirectories.len());
    let queue = std::sync::Mutex::new(subdirectories.into_iter());
    let next = || queue.lock().unwrap_or_else(|e| e.into_inner()).next();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    while let Some(child) = next() {
                        remove_entry(dir, &child, Some(FileType::Directory), false)?;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .try_for_each(|h| h.join().unwrap_or(Err(Errno::IO)))
    })
}

/// The entries of a directory (without `.` and `..`), read completely before any is
/// removed: unlinking while iterating can make getdents skip entries.
fn read_children(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<(std::ffi::CString, FileType)>> {
    let mut children = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        if !is_dot(entry.file_name()) {
            children.push((entry.file_name().to_owned(), entry.file_type()));
        }
    }
    Ok(children)
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn xfs_project_ids_are_recorded_freed_on_delete_and_kept_across_restarts() {
        use crate::quota::xfs::tests::{FakeXfsQuota, xfs_backend_for_tests};
        let dir = tempfile::tempdir().unwrap();
        let fake = std::sync::Arc::new(FakeXfsQuota::default());
        let open = || {
            VolumeStore::open_with_quota(
                dir.path(),
                Quota::Xfs(xfs_backend_for_tests(fake.clone())),
            )
            .unwrap()
        };
        let store = open();
        let project_of = |store: &VolumeStore, p: &str| {
            let parent = store.walk_parents(&path(p), false).unwrap().unwrap();
            store
                .existing_volume(parent.as_fd(), &path(p))
                .unwrap()
                .unwrap()
                .quota
                .unwrap()
                .project_id
                .unwrap()
        };
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
        store.archive(&path("ns/kept")).unwrap();
        drop(store);

        // After a restart the archived volume's id is still taken; the freed one is reused.
        let store = open();
        store.create(&path("ns/new"), &request(1 << 20)).unwrap();
        assert_eq!(project_of(&store, "ns/new"), gone_id);
        store.create(&path("ns/other"), &request(1 << 20)).unwrap();
        let other = project_of(&store, "ns/other");
        assert!(other != kept_id && other != gone_id, "{other}");
    }

    #[test]
    fn archive_stamps_round_trip() {
        let at = time::macros::datetime!(2026-11-22 06:01:02.123456789 UTC);
        let stamp = archive_stamp(at);
        assert_eq!(stamp, "20261122T060102.123456789Z");
        assert_eq!(
            archive_stamp_to_rfc3339(&stamp).unwrap(),
            "2026-11-22T06:01:02.123456789Z"
        );
        let result = archive_result(&path("a/b"), &format!("@{stamp}-2"));
        assert_eq!(result.archive_path, format!(".archive/a/b/@{stamp}-2"));
        assert_eq!(result.archived_at, "2026-11-22T06:01:02.123456789Z");
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
            store.archive(&path("x")),
            Err(StoreError::Conflict(_))
        ));
        assert!(store.get(&path("x/y")).is_ok());
    }

    #[test]
    fn list_finds_nested_volumes_only() {
        let (dir, store) = store();
        for p in ["b", "a/c", "a/d/e"] {
            store.create(&path(p), &request(7)).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("plain/dir")).unwrap();
        store.archive(&path("b")).unwrap();
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
        assert_eq!(store.purge_leftovers().unwrap(), 1);
        assert_eq!(
            std::fs::read_dir(dir.path().join(STATE_DIR).join(TRASH_DIR))
                .unwrap()
                .count(),
            0
        );
    }
}
