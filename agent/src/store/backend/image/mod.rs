//! Volumes that are filesystems of their own (quota backend `image`): each an ext4
//! filesystem in a sparse image file in the agent's area, loop-mounted at its path.
//!
//! Why: an NFS server refuses a file handle whose filesystem is not one the export it
//! names serves, but within a filesystem it honours a handle to any object, wherever it
//! lies (docs/isolation-findings.md). A volume that is a filesystem of its own is the only
//! boundary a forged handle cannot cross. The filesystem's size is the volume's quota,
//! enforced for every client; clones, snapshots and restores are reflinks of the image
//! where the export root's filesystem shares extents (XFS, btrfs), copies elsewhere.
//!
//! Layout, beneath the export root:
//! - `.nfsprov/images/<path>.img` and `.json`: a volume's image and its record;
//! - `.nfsprov/images/.archive/<path>/@<time>.img` and `.json`: an archive, not mounted
//!   (its entry in `.archive` is an empty directory that names it);
//! - `.nfsprov/images/.snapshots/<name>.img`: a snapshot, not mounted;
//! - `.nfsprov/images/.freezing/`: a mark for each filesystem being frozen, so a crash
//!   mid-copy leaves none frozen after the next start.
//!
//! A volume is finished once its record is written; an image without one is what a crash
//! left of a creation and goes at the next start. A volume's mountpoint is an empty
//! directory of mode 000, made immutable: while nothing is mounted on it (after a reboot,
//! before the agent has mounted the volumes) no client can write into it, and the agent
//! never exports a volume whose filesystem is not mounted.

mod files;
mod growth;
mod tools;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use nfsprov_api_types::{
    ArchivePath, CloneMethod, QuotaBackend, SnapshotMethod, SnapshotName, VolumePath, VolumeUsage,
};
use rustix::fs::{AtFlags, IFlags, Mode};
use rustix::io::Errno;

use crate::quota::command::{ToolError, ToolRunner};
use crate::store::archive::area::StoredArchive;
use crate::store::archive::naming::{ARCHIVE_DIR, archive_path};
use crate::store::backend::zfs::KeptSnapshot;
use crate::store::backend::{CloneSource, CloneTarget, KnownQuota, Layout, VolumeBackend};
use crate::store::confine::{Root, STATE_DIR, open_child};
use crate::store::copy::CopyProgress;
use crate::store::error::{Result, StoreError, quota_error};
use crate::store::record::{QuotaRecord, VolumeRecord};
use crate::store::tree::remove_tree;

use self::files::{
    failed, make_parents, remove_synced, set_size, sync_file, sync_parent, write_synced,
};
use self::growth::{Growth, Remount, filesystem_bytes, grown_size};
use self::tools::{ImageTools, superblock_usage};

/// The image area, in the agent's state directory.
const AREA: &str = "images";
const SNAPSHOTS: &str = ".snapshots";
const FREEZING: &str = ".freezing";
const IMAGE: &str = ".img";
const RECORD: &str = ".json";

/// The image size that holds `capacity` bytes for the tenant: what ext4 keeps for itself
/// on top (its journal, sized by mke2fs from the filesystem's size; inode tables at 256
/// bytes per 16 KiB; bitmaps and descriptors), in whole mebibytes. An estimate: a new
/// volume is grown until it holds its capacity ([`ImageBackend::fit`]).
fn first_size(capacity: u64) -> u64 {
    const BLOCK: u64 = 4096;
    let blocks = capacity / BLOCK;
    let journal_blocks = match blocks {
        0..32_768 => 1024,
        32_768..262_144 => 4096,
        262_144..524_288 => 8192,
        524_288..4_194_304 => 16_384,
        4_194_304..8_388_608 => 32_768,
        8_388_608..16_777_216 => 65_536,
        16_777_216..33_554_432 => 131_072,
        _ => 262_144,
    };
    let size = capacity
        .saturating_add(journal_blocks * BLOCK)
        .saturating_add(capacity / 64)
        // Bitmaps, group descriptors and the blocks reserved for growing them.
        .saturating_add(capacity / 128)
        .saturating_add(1 << 20);
    size.div_ceil(1 << 20) << 20
}

#[derive(Debug)]
pub struct ImageBackend {
    tools: ImageTools,
    /// The export root as the tools are given it.
    root: PathBuf,
    /// The root's device: a volume's mountpoint on another one is mounted.
    root_device: u64,
    area: PathBuf,
    /// Images older than this without a record are a crash's leftovers; younger ones may
    /// be creations under way.
    started: SystemTime,
    unique: AtomicU64,
    /// What [`VolumeBackend::prepare`] mounted.
    mounted_at_open: Mutex<Vec<VolumePath>>,
    /// Which way volumes grow.
    growth: Growth,
}

impl ImageBackend {
    /// Checks that the tools are there and that the root can hold images.
    pub fn probe(
        runner: Arc<dyn ToolRunner>,
        export_root: &Path,
    ) -> std::result::Result<Self, String> {
        let root = fs::canonicalize(export_root)
            .map_err(|e| format!("export root {}: {e}", export_root.display()))?;
        let root_device = fs::metadata(&root)
            .map_err(|e| format!("export root {}: {e}", root.display()))?
            .dev();
        for tool in [
            "mkfs.ext4",
            "e2fsck",
            "tune2fs",
            "resize2fs",
            "dumpe2fs",
            "mount",
            "umount",
            "losetup",
            "findmnt",
            "fsfreeze",
        ] {
            if !tool_exists(tool) {
                return Err(format!(
                    "quota.backend image needs `{tool}` (e2fsprogs and util-linux), which is not installed"
                ));
            }
        }
        let area = root.join(STATE_DIR).join(AREA);
        Ok(Self {
            growth: Growth::detect(area.clone()),
            tools: ImageTools::new(runner),
            area,
            root,
            root_device,
            started: SystemTime::now(),
            unique: AtomicU64::new(0),
            mounted_at_open: Mutex::default(),
        })
    }

    fn image_of(&self, key: &str) -> PathBuf {
        self.area.join(format!("{key}{IMAGE}"))
    }

    fn record_of(&self, key: &str) -> PathBuf {
        self.area.join(format!("{key}{RECORD}"))
    }

    fn snapshot_image(&self, name: &str) -> PathBuf {
        self.image_of(&format!("{SNAPSHOTS}/{name}"))
    }

    fn mountpoint(&self, key: &str) -> PathBuf {
        self.root.join(key)
    }

    fn is_mounted(&self, mountpoint: &Path) -> bool {
        fs::symlink_metadata(mountpoint).is_ok_and(|m| m.is_dir() && m.dev() != self.root_device)
    }

    fn tool_error(&self, context: impl Into<String>, error: ToolError) -> StoreError {
        quota_error(context, error)
    }

    /// Makes `name` in `parent` the empty, locked mountpoint of a volume: mode 000 and
    /// immutable, so nothing is written into it while no filesystem is mounted on it.
    /// What is there already must be such a mountpoint (left by an unfinished creation).
    fn mountpoint_dir(&self, parent: BorrowedFd<'_>, name: &str, path: &VolumePath) -> Result<()> {
        match rustix::fs::mkdirat(parent, name, Mode::empty()) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(failed(format!("make the mountpoint of {path}"), e)),
        }
        let dir = open_child(parent, name, false)?;
        let stat = rustix::fs::fstat(&dir).map_err(|e| failed(format!("stat {path}"), e))?;
        if stat.st_dev != self.root_device {
            // A mount left by an unfinished creation: its image goes first.
            drop(dir);
            self.tools
                .unmount(&self.mountpoint(path.as_str()))
                .map_err(|e| self.tool_error(format!("unmount what is left at {path}"), e))?;
            return self.mountpoint_dir(parent, name, path);
        }
        let empty = crate::store::confine::list_dir(dir.as_fd())
            .map_err(|e| failed(format!("list {path}"), e))?
            .is_empty();
        if !empty {
            return Err(StoreError::Conflict(format!(
                "{path} exists but is not a volume made by the agent (a directory with content, no image); refusing to touch it"
            )));
        }
        if stat.st_mode & 0o7777 != 0 {
            // An immutable directory's mode cannot change either.
            set_immutable(dir.as_fd(), false);
            rustix::fs::fchmod(&dir, Mode::empty())
                .map_err(|e| failed(format!("lock the mountpoint of {path}"), e))?;
        }
        set_immutable(dir.as_fd(), true);
        Ok(())
    }

    /// Removes the (unmounted) mountpoint `name` in `parent`.
    fn remove_mountpoint(&self, parent: BorrowedFd<'_>, name: &str) -> Result<()> {
        if let Ok(dir) = open_child(parent, name, false) {
            set_immutable(dir.as_fd(), false);
        }
        match rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR) {
            Ok(()) | Err(Errno::NOENT) => Ok(()),
            Err(e) => Err(failed(format!("remove the mountpoint {name}"), e)),
        }
    }

    /// The mountpoint at `key` below the root, by path: for leftovers, whose parent
    /// directory the store did not open.
    fn remove_mountpoint_at(&self, key: &str) -> Result<()> {
        let (parent, name) = match key.rsplit_once('/') {
            Some((parent, name)) => (self.root.join(parent), name),
            None => (self.root.clone(), key),
        };
        let Ok(parent) = File::open(&parent) else {
            return Ok(());
        };
        self.remove_mountpoint(parent.as_fd(), name)
    }

    /// Mounts the filesystem in `image` at `mountpoint`, grown first until it holds
    /// `capacity` bytes for its users (what ext4 keeps for itself is not the tenant's).
    /// Its size is read once mounted (the superblock does not always say what the
    /// filesystem keeps for itself); a short one is unmounted and grown offline, which
    /// needs no more privilege than making it did.
    fn mount_fitted(&self, image: &Path, mountpoint: &Path, capacity: u64) -> Result<()> {
        for _ in 0..4 {
            self.tools
                .mount(image, mountpoint, false)
                .map_err(|e| self.tool_error(format!("mount {}", image.display()), e))?;
            let total = filesystem_bytes(mountpoint)?;
            if total >= capacity {
                return Ok(());
            }
            self.tools
                .unmount(mountpoint)
                .map_err(|e| self.tool_error(format!("unmount {}", image.display()), e))?;
            let size = fs::metadata(image)
                .map_err(|e| failed(format!("stat {}", image.display()), e))?
                .len();
            set_size(image, grown_size(size, capacity - total))?;
            self.tools
                .grow_unmounted(image)
                .map_err(|e| self.tool_error(format!("grow {}", image.display()), e))?;
        }
        Err(StoreError::NoSpace(format!(
            "{}: the filesystem could not be made to hold {capacity} bytes",
            image.display()
        )))
    }

    /// Grows the filesystem mounted at `mountpoint` (from `image`), as [`Self::mount_fitted`]
    /// does an unmounted one.
    fn fit_mounted(&self, image: &Path, mountpoint: &Path, capacity: u64) -> Result<()> {
        for _ in 0..4 {
            let total = filesystem_bytes(mountpoint)?;
            if total >= capacity {
                return Ok(());
            }
            let size = fs::metadata(image)
                .map_err(|e| failed(format!("stat {}", image.display()), e))?
                .len();
            set_size(image, grown_size(size, capacity - total))?;
            let device = self
                .tools
                .device_of(mountpoint)
                .map_err(|e| self.tool_error("find the volume's loop device", e))?;
            self.tools.grow(&device).map_err(|e| {
                if ImageTools::refused_for_privilege(&e) {
                    self.growth.online_refused();
                }
                self.tool_error(
                    "grow the volume's mounted filesystem (the agent needs CAP_SYS_RESOURCE for that)",
                    e,
                )
            })?;
        }
        Err(StoreError::NoSpace(format!(
            "{}: the filesystem could not be made to hold {capacity} bytes",
            mountpoint.display()
        )))
    }

    /// Copies `source` to the new file `target`: one reflink where the root's filesystem
    /// shares extents, otherwise the data ranges only (holes stay holes). Answers whether
    /// it was a reflink.
    fn copy_image(&self, source: &Path, target: &Path) -> Result<bool> {
        make_parents(target)?;
        let context = || format!("copy {} to {}", source.display(), target.display());
        let from = File::open(source).map_err(|e| failed(context(), e))?;
        let to = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(target)
            .map_err(|e| failed(context(), e))?;
        let reflinked = match rustix::fs::ioctl_ficlone(&to, &from) {
            Ok(()) => true,
            Err(Errno::OPNOTSUPP | Errno::XDEV | Errno::INVAL | Errno::NOTTY | Errno::BADF) => {
                copy_data(&from, &to).map_err(|e| failed(context(), e))?;
                false
            }
            Err(e) => return Err(failed(context(), e)),
        };
        to.sync_all().map_err(|e| failed(context(), e))?;
        sync_parent(target)?;
        Ok(reflinked)
    }

    /// Copies the image of the mounted volume at `source` while its filesystem is frozen,
    /// so that the copy is one consistent, clean filesystem.
    fn copy_frozen(&self, source: &VolumePath, target: &Path) -> Result<bool> {
        let mountpoint = self.mountpoint(source.as_str());
        let mark = self.area.join(FREEZING).join(format!(
            "{}-{}",
            std::process::id(),
            self.unique.fetch_add(1, Ordering::Relaxed)
        ));
        make_parents(&mark)?;
        write_synced(&mark, mountpoint.to_string_lossy().as_bytes())?;
        if let Err(e) = self.tools.freeze(&mountpoint) {
            let _ = fs::remove_file(&mark);
            return Err(self.tool_error(format!("freeze {source}"), e));
        }
        let copied = self.copy_image(&self.image_of(source.as_str()), target);
        let thawed = self.tools.thaw(&mountpoint);
        if let Err(e) = thawed {
            // The mark stays: the next start thaws it.
            tracing::error!(volume = %source, error = %e, "could not thaw a volume after copying it; writes to it wait until it is thawed");
            let _ = fs::remove_file(target);
            return Err(self.tool_error(format!("thaw {source}"), e));
        }
        let _ = fs::remove_file(&mark);
        copied
    }

    /// Makes the target a volume from the image just copied to its place: a UUID of its
    /// own, mounted, grown to its capacity. On failure what was made goes.
    fn finish_copy(&self, target: &CloneTarget<'_>, reflinked: bool) -> Result<CloneMethod> {
        let key = target.path.as_str();
        let image = self.image_of(key);
        let mountpoint = self.mountpoint(key);
        let made = self
            .tools
            .new_uuid(&image)
            .map_err(|e| self.tool_error(format!("give {} its own UUID", target.path), e))
            .and_then(|()| self.mount_fitted(&image, &mountpoint, target.capacity_bytes));
        if let Err(e) = made {
            self.discard(target.parent, target.name, key);
            return Err(e);
        }
        Ok(if reflinked {
            CloneMethod::Reflink
        } else {
            CloneMethod::Copy
        })
    }

    /// Removes what was made of the volume `key` (mount, image, record, mountpoint), as
    /// far as it was made; failures are logged, the next start finishes the job.
    fn discard(&self, parent: BorrowedFd<'_>, name: &str, key: &str) {
        let mountpoint = self.mountpoint(key);
        if self.is_mounted(&mountpoint)
            && let Err(error) = self.tools.unmount(&mountpoint)
        {
            tracing::warn!(volume = key, %error, "could not unmount an unfinished volume; it goes at the next start");
            return;
        }
        let _ = fs::remove_file(self.record_of(key));
        let _ = fs::remove_file(self.image_of(key));
        let _ = self.remove_mountpoint(parent, name);
    }

    /// Every record below `dir` of the area (a relative key prefix), skipping the
    /// areas named in `skip`: (key, record).
    fn records_below(&self, dir: &str, skip: &[&str]) -> Result<Vec<(String, VolumeRecord)>> {
        let mut found = Vec::new();
        let mut pending = vec![dir.to_owned()];
        while let Some(rel) = pending.pop() {
            let full = if rel.is_empty() {
                self.area.clone()
            } else {
                self.area.join(&rel)
            };
            let entries = match fs::read_dir(&full) {
                Ok(entries) => entries,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(failed(format!("list {}", full.display()), e)),
            };
            for entry in entries {
                let entry = entry.map_err(|e| failed(format!("list {}", full.display()), e))?;
                let name = entry.file_name().to_string_lossy().into_owned();
                let key = if rel.is_empty() {
                    name.clone()
                } else {
                    format!("{rel}/{name}")
                };
                let kind = entry
                    .file_type()
                    .map_err(|e| failed(format!("stat {key}"), e))?;
                if kind.is_dir() {
                    if !skip.contains(&key.as_str()) {
                        pending.push(key);
                    }
                } else if let Some(key) = key.strip_suffix(RECORD)
                    && let Ok(bytes) = fs::read(entry.path())
                    && let Some(record) = VolumeRecord::decode(&bytes)
                {
                    found.push((key.to_owned(), record));
                }
            }
        }
        Ok(found)
    }

    /// Every image file below the area with its key, for the leftovers' purge.
    fn images_below(&self, rel: &str, found: &mut Vec<(String, fs::Metadata)>) -> Result<()> {
        let full = if rel.is_empty() {
            self.area.clone()
        } else {
            self.area.join(rel)
        };
        let entries = match fs::read_dir(&full) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(failed(format!("list {}", full.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(|e| failed(format!("list {}", full.display()), e))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            let key = if rel.is_empty() {
                name
            } else {
                format!("{rel}/{name}")
            };
            let meta = entry
                .metadata()
                .map_err(|e| failed(format!("stat {key}"), e))?;
            if meta.is_dir() {
                if key != SNAPSHOTS && key != FREEZING {
                    self.images_below(&key, found)?;
                }
            } else if let Some(key) = key.strip_suffix(IMAGE) {
                found.push((key.to_owned(), meta));
            }
        }
        Ok(())
    }

    /// Thaws what a crash left frozen.
    fn thaw_left_frozen(&self) {
        let Ok(marks) = fs::read_dir(self.area.join(FREEZING)) else {
            return;
        };
        for mark in marks.flatten() {
            if let Ok(mountpoint) = fs::read_to_string(mark.path()) {
                // Not frozen any more is fine too.
                let _ = self.tools.thaw(Path::new(&mountpoint));
            }
            let _ = fs::remove_file(mark.path());
        }
    }
}

impl Remount for ImageBackend {
    fn is_mounted(&self, mountpoint: &Path) -> bool {
        ImageBackend::is_mounted(self, mountpoint)
    }

    fn mount_fitted(&self, image: &Path, mountpoint: &Path, capacity: u64) -> Result<()> {
        ImageBackend::mount_fitted(self, image, mountpoint, capacity)
    }
}

impl VolumeBackend for ImageBackend {
    fn kind(&self) -> QuotaBackend {
        QuotaBackend::Image
    }

    fn can_enforce(&self) -> bool {
        true
    }

    fn layout(&self) -> Layout {
        Layout::Mounts
    }

    /// Thaws what a crash left frozen and mounts every finished volume not mounted yet
    /// (after a reboot, all of them). A volume that cannot be mounted is logged and left
    /// unexported; the others are served.
    fn prepare(&self, _: &Root, _: BorrowedFd<'_>) -> Result<usize> {
        fs::create_dir_all(&self.area)
            .map_err(|e| failed(format!("make {}", self.area.display()), e))?;
        self.thaw_left_frozen();
        for (key, _) in self.records_below("", &[ARCHIVE_DIR, SNAPSHOTS, FREEZING])? {
            let mountpoint = self.mountpoint(&key);
            let repaired = self.growth.repair(
                &self.tools,
                &key,
                &self.image_of(&key),
                self.is_mounted(&mountpoint),
            );
            if let Err(error) = repaired {
                tracing::error!(volume = %key, %error, "could not repair a volume whose growth was interrupted; it is not exported until it is");
                continue;
            }
            if self.is_mounted(&mountpoint) {
                continue;
            }
            let Ok(path) = VolumePath::parse(&key) else {
                continue;
            };
            let mounted = fs::create_dir_all(mountpoint.parent().unwrap_or(&self.root))
                .map_err(|e| failed(format!("make the parents of {key}"), e))
                .and_then(|()| {
                    let parent = File::open(mountpoint.parent().unwrap_or(&self.root))
                        .map_err(|e| failed(format!("open the parent of {key}"), e))?;
                    self.mountpoint_dir(parent.as_fd(), path.file_name(), &path)
                })
                .and_then(|()| {
                    self.tools
                        .mount(&self.image_of(&key), &mountpoint, false)
                        .map_err(|e| self.tool_error(format!("mount {key}"), e))
                });
            match mounted {
                Ok(()) => self
                    .mounted_at_open
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(path),
                Err(error) => {
                    tracing::error!(volume = %key, %error, "could not mount a volume's filesystem; it is not exported until it is");
                }
            }
        }
        Ok(0)
    }

    fn is_volume(&self, root: &Root, dir: BorrowedFd<'_>) -> Result<bool> {
        Ok(rustix::fs::fstat(dir).is_ok_and(|st| st.st_dev != root.device()))
    }

    fn find(&self, _: &Root, _: BorrowedFd<'_>, path: &VolumePath) -> Result<Option<VolumeRecord>> {
        read_record(&self.record_of(path.as_str()), path.as_str())
    }

    fn make(
        &self,
        _: &Root,
        parent: BorrowedFd<'_>,
        name: &str,
        path: &VolumePath,
        _: Option<u64>,
        capacity_bytes: u64,
    ) -> Result<Option<QuotaRecord>> {
        self.mountpoint_dir(parent, name, path)?;
        let key = path.as_str();
        let (image, mountpoint) = (self.image_of(key), self.mountpoint(key));
        let made = (|| {
            make_parents(&image)?;
            // What an unfinished creation left: nothing refers to it.
            let _ = fs::remove_file(&image);
            let file = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&image)
                .map_err(|e| failed(format!("make the image of {path}"), e))?;
            file.set_len(first_size(capacity_bytes))
                .map_err(|e| failed(format!("size the image of {path}"), e))?;
            drop(file);
            self.tools
                .make_filesystem(&image)
                .map_err(|e| self.tool_error(format!("make the filesystem of {path}"), e))?;
            sync_file(&image)?;
            sync_parent(&image)?;
            self.mount_fitted(&image, &mountpoint, capacity_bytes)?;
            // A new volume is empty: the tenant has no use for ext4's lost+found, and
            // e2fsck makes it again when it needs one.
            let _ = fs::remove_dir(mountpoint.join("lost+found"));
            Ok(())
        })();
        match made {
            Ok(()) => Ok(Some(QuotaRecord::of(QuotaBackend::Image))),
            Err(e) => {
                self.discard(parent, name, key);
                Err(e)
            }
        }
    }

    fn clone_volume(
        &self,
        _: &Root,
        source: &CloneSource<'_>,
        target: &CloneTarget<'_>,
        _: &CopyProgress,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        self.mountpoint_dir(target.parent, target.name, target.path)?;
        let image = self.image_of(target.path.as_str());
        let _ = fs::remove_file(&image);
        let reflinked = match self.copy_frozen(source.path, &image) {
            Ok(reflinked) => reflinked,
            Err(e) => {
                self.discard(target.parent, target.name, target.path.as_str());
                return Err(e);
            }
        };
        let method = self.finish_copy(target, reflinked)?;
        Ok((Some(QuotaRecord::of(QuotaBackend::Image)), method))
    }

    /// A reflink of the frozen image where the root's filesystem shares extents: instant
    /// and point in time; otherwise a copy of the frozen image.
    fn take_kept_snapshot(
        &self,
        source: &VolumePath,
        name: &SnapshotName,
    ) -> Result<SnapshotMethod> {
        let image = self.snapshot_image(name.as_str());
        let _ = fs::remove_file(&image);
        let reflinked = self.copy_frozen(source, &image)?;
        Ok(if reflinked {
            SnapshotMethod::Reflink
        } else {
            SnapshotMethod::Copy
        })
    }

    fn snapshots_hold_capacity(&self) -> bool {
        true
    }

    /// What each snapshot's image holds; the bytes it alone holds are not counted here
    /// (shared extents are not cheap to tell apart).
    fn kept_snapshots(&self) -> Result<BTreeMap<String, KeptSnapshot>> {
        let dir = self.area.join(SNAPSHOTS);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => return Err(failed("list the snapshot images", e)),
        };
        let mut kept = BTreeMap::new();
        for entry in entries.flatten() {
            let file = entry.file_name().to_string_lossy().into_owned();
            let Some(name) = file.strip_suffix(IMAGE) else {
                continue;
            };
            let referenced = entry.metadata().ok().map(|m| m.blocks() * 512);
            kept.insert(
                name.to_owned(),
                KeptSnapshot {
                    full_name: format!("{SNAPSHOTS}/{file}"),
                    used: None,
                    referenced,
                },
            );
        }
        Ok(kept)
    }

    fn drop_kept_snapshot(&self, name: &SnapshotName) -> Result<bool> {
        let image = self.snapshot_image(name.as_str());
        match fs::remove_file(&image) {
            Ok(()) => {
                sync_parent(&image)?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(failed(format!("delete snapshot {name}"), e)),
        }
    }

    fn clone_kept_snapshot(
        &self,
        name: &SnapshotName,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        self.mountpoint_dir(target.parent, target.name, target.path)?;
        let image = self.image_of(target.path.as_str());
        let _ = fs::remove_file(&image);
        let reflinked = match self.copy_image(&self.snapshot_image(name.as_str()), &image) {
            Ok(reflinked) => reflinked,
            Err(e) => {
                self.discard(target.parent, target.name, target.path.as_str());
                return Err(e);
            }
        };
        let method = self.finish_copy(target, reflinked)?;
        Ok((Some(QuotaRecord::of(QuotaBackend::Image)), method))
    }

    fn clone_archive(
        &self,
        _: &Root,
        id: &ArchivePath,
        target: &CloneTarget<'_>,
    ) -> Result<(Option<QuotaRecord>, CloneMethod)> {
        self.mountpoint_dir(target.parent, target.name, target.path)?;
        let image = self.image_of(target.path.as_str());
        let _ = fs::remove_file(&image);
        let reflinked = match self.copy_image(&self.image_of(&archive_path(id)), &image) {
            Ok(reflinked) => reflinked,
            Err(e) => {
                self.discard(target.parent, target.name, target.path.as_str());
                return Err(e);
            }
        };
        let method = self.finish_copy(target, reflinked)?;
        Ok((Some(QuotaRecord::of(QuotaBackend::Image)), method))
    }

    /// A volume is a filesystem of its own, and a directory becomes one only by copying
    /// its data, which adoption never does.
    fn check_adoptable(&self, path: &VolumePath) -> Result<()> {
        Err(StoreError::Unsupported(format!(
            "{path}: this agent's quota backend is image, whose volumes are filesystems of their own; a plain directory cannot become one, so it cannot be adopted; copy its data into a volume the agent creates instead"
        )))
    }

    /// The volume's filesystem is committed first (owner and mode set on its root), then
    /// the record, which finishes the volume.
    fn write_record(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<()> {
        rustix::fs::syncfs(dir).map_err(|e| failed(format!("sync {path}"), e))?;
        let json = record.encode().map_err(|e| StoreError::Io {
            context: format!("encode the record of {path}"),
            source: io::Error::other(e),
        })?;
        write_synced(&self.record_of(path.as_str()), json.as_bytes())
    }

    /// The record goes first, so a crash leaves an unfinished image that the next start
    /// removes, never a record without its volume.
    fn remove(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: Option<&VolumePath>,
        _: KnownQuota<'_>,
    ) -> Result<()> {
        let Some(path) = path else {
            // Only plain directories ever reach the store's staging and trash areas.
            return remove_tree(parent, name);
        };
        let key = path.as_str();
        remove_synced(&self.record_of(key))?;
        let mountpoint = self.mountpoint(key);
        if self.is_mounted(&mountpoint) {
            self.tools
                .unmount(&mountpoint)
                .map_err(|e| self.tool_error(format!("unmount {path}"), e))?;
        }
        remove_synced(&self.image_of(key))?;
        self.remove_mountpoint(parent, name)
    }

    fn measure(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        _: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        if !self.is_mounted(&self.mountpoint(path.as_str())) {
            return Err(not_mounted(path));
        }
        let vfs = rustix::fs::fstatvfs(dir).map_err(|e| failed(format!("statvfs {path}"), e))?;
        let unit = vfs.f_frsize.max(1);
        Ok(VolumeUsage {
            used_bytes: vfs
                .f_blocks
                .saturating_sub(vfs.f_bfree)
                .saturating_mul(unit),
            // ext4 counts its reserved inodes (1 to 10) as used.
            used_inodes: vfs.f_files.saturating_sub(vfs.f_ffree).saturating_sub(10),
        })
    }

    fn resize(
        &self,
        _: BorrowedFd<'_>,
        path: &VolumePath,
        _: &QuotaRecord,
        capacity_bytes: u64,
    ) -> Result<()> {
        let key = path.as_str();
        let mountpoint = self.mountpoint(key);
        if !self.is_mounted(&mountpoint) {
            return Err(not_mounted(path));
        }
        self.fit_mounted(&self.image_of(key), &mountpoint, capacity_bytes)
    }

    fn grows_offline(&self) -> bool {
        !self.growth.online()
    }

    fn grow_offline(&self, path: &VolumePath, _: &QuotaRecord, capacity_bytes: u64) -> Result<()> {
        let key = path.as_str();
        let mountpoint = self.mountpoint(key);
        if !self.is_mounted(&mountpoint) {
            return Err(not_mounted(path));
        }
        self.growth.grow_unmounted(
            self,
            &self.tools,
            path,
            &self.image_of(key),
            &mountpoint,
            capacity_bytes,
        )
    }

    fn list(&self, _: &Root) -> Result<Vec<(VolumePath, VolumeRecord)>> {
        Ok(self
            .records_below("", &[ARCHIVE_DIR, SNAPSHOTS, FREEZING])?
            .into_iter()
            .filter_map(|(key, record)| Some((VolumePath::parse(&key).ok()?, record)))
            .collect())
    }

    /// Unmounted, its image and record moved to the archive's key, an empty directory
    /// at the archive's place naming it.
    fn archive_in_place(&self, path: &VolumePath, archive_path: &str) -> Result<()> {
        let key = path.as_str();
        let mountpoint = self.mountpoint(key);
        if self.is_mounted(&mountpoint) {
            self.tools
                .unmount(&mountpoint)
                .map_err(|e| self.tool_error(format!("unmount {path}"), e))?;
        }
        let marker = self.root.join(archive_path);
        match fs::create_dir(&marker) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(failed(format!("make {archive_path}"), e)),
        }
        for (from, to) in [
            (self.image_of(key), self.image_of(archive_path)),
            (self.record_of(key), self.record_of(archive_path)),
        ] {
            make_parents(&to)?;
            fs::rename(&from, &to)
                .map_err(|e| failed(format!("move {} to the archive", from.display()), e))?;
            sync_parent(&to)?;
            sync_parent(&from)?;
        }
        self.remove_mountpoint_at(key)
    }

    fn list_archives(&self, _: &Root) -> Result<Vec<StoredArchive>> {
        Ok(self
            .records_below(ARCHIVE_DIR, &[])?
            .into_iter()
            .filter_map(|(key, record)| {
                let below = key.strip_prefix(ARCHIVE_DIR)?.strip_prefix('/')?;
                let id = ArchivePath::parse(below).ok()?;
                Some(StoredArchive {
                    id,
                    record,
                    usage: None,
                })
            })
            .collect())
    }

    fn find_archive(
        &self,
        _: &Root,
        _: BorrowedFd<'_>,
        id: &ArchivePath,
    ) -> Result<Option<VolumeRecord>> {
        let key = archive_path(id);
        read_record(&self.record_of(&key), &key)
    }

    /// From the image's superblock: an archive is not mounted.
    fn measure_archive(
        &self,
        _: BorrowedFd<'_>,
        id: &ArchivePath,
        _: &VolumeRecord,
    ) -> Result<VolumeUsage> {
        let text = self
            .tools
            .superblock(&self.image_of(&archive_path(id)))
            .map_err(|e| self.tool_error(format!("read archive {id}"), e))?;
        let (used_bytes, used_inodes) = superblock_usage(&text).ok_or_else(|| {
            StoreError::Conflict(format!("archive {id}: its filesystem cannot be read"))
        })?;
        Ok(VolumeUsage {
            used_bytes,
            used_inodes,
        })
    }

    fn remove_archive_in_place(&self, id: &ArchivePath) -> Result<()> {
        let key = archive_path(id);
        remove_synced(&self.record_of(&key))?;
        remove_synced(&self.image_of(&key))?;
        match fs::remove_dir(self.root.join(&key)) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(failed(format!("remove {key}"), e)),
        }
    }

    /// Images without a record made before this start: creations a crash interrupted.
    fn purge_unfinished(&self) -> Result<usize> {
        let mut images = Vec::new();
        self.images_below("", &mut images)?;
        let mut removed = 0;
        for (key, meta) in images {
            if self.record_of(&key).exists()
                || meta.modified().is_ok_and(|made| made >= self.started)
            {
                continue;
            }
            if !key.starts_with(ARCHIVE_DIR) {
                let mountpoint = self.mountpoint(&key);
                if self.is_mounted(&mountpoint) {
                    self.tools
                        .unmount(&mountpoint)
                        .map_err(|e| self.tool_error(format!("unmount unfinished {key}"), e))?;
                }
                self.remove_mountpoint_at(&key)?;
            }
            remove_synced(&self.image_of(&key))?;
            removed += 1;
        }
        Ok(removed)
    }

    fn isolates_exports(&self) -> bool {
        true
    }

    fn is_servable(&self, path: &VolumePath) -> bool {
        self.is_mounted(&self.mountpoint(path.as_str()))
    }

    fn mounted_at_open(&self) -> Vec<VolumePath> {
        self.mounted_at_open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }
}

fn not_mounted(path: &VolumePath) -> StoreError {
    StoreError::NotReady(format!(
        "{path}: its filesystem is not mounted (the agent mounts every volume at start; its log says why this one failed)"
    ))
}

fn tool_exists(tool: &str) -> bool {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain(["/sbin".into(), "/usr/sbin".into()])
        .any(|dir| dir.join(tool).is_file())
}

/// Sets or clears the immutable flag where the filesystem has one (ext4, XFS, btrfs);
/// elsewhere mode 000 and root's ownership are what keep a bare mountpoint unwritten.
fn set_immutable(dir: BorrowedFd<'_>, on: bool) {
    let Ok(flags) = rustix::fs::ioctl_getflags(dir) else {
        return;
    };
    let wanted = if on {
        flags | IFlags::IMMUTABLE
    } else {
        flags - IFlags::IMMUTABLE
    };
    if wanted != flags
        && let Err(error) = rustix::fs::ioctl_setflags(dir, wanted)
    {
        tracing::debug!(%error, "could not change a mountpoint's immutable flag");
    }
}

fn read_record(file: &Path, what: &str) -> Result<Option<VolumeRecord>> {
    match fs::read(file) {
        Ok(bytes) => VolumeRecord::decode(&bytes).map(Some).ok_or_else(|| {
            StoreError::Conflict(format!(
                "{what}: its volume record cannot be read; refusing to touch it"
            ))
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(failed(format!("read the record of {what}"), e)),
    }
}

/// The data ranges of `from` into `to` (made as long), holes left as holes.
fn copy_data(from: &File, to: &File) -> io::Result<()> {
    let len = from.metadata()?.len();
    to.set_len(len)?;
    let mut offset = 0;
    while offset < len {
        let start = match rustix::fs::seek(from, rustix::fs::SeekFrom::Data(offset)) {
            Ok(start) => start,
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(from, rustix::fs::SeekFrom::Hole(start))?;
        let mut at = start;
        while at < end {
            let (mut from_at, mut to_at) = (at, at);
            let chunk = usize::try_from(end - at).unwrap_or(usize::MAX).min(1 << 30);
            let n =
                rustix::fs::copy_file_range(from, Some(&mut from_at), to, Some(&mut to_at), chunk)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the image shrank while it was copied",
                ));
            }
            at += n as u64;
        }
        offset = end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_image_leaves_room_for_the_filesystem_and_is_whole_mebibytes() {
        for capacity in [1, 1 << 20, 100 << 20, 10 << 30] {
            let size = first_size(capacity);
            assert!(size > capacity, "{capacity}");
            assert_eq!(size % (1 << 20), 0);
        }
    }
}
