//! Growing a volume's filesystem: online, mounted (resize2fs on the loop device), where
//! the kernel lets the agent, otherwise offline, unmounted.
//!
//! The kernel resizes a mounted ext4 only for a process with `CAP_SYS_RESOURCE`, which
//! some hosts withhold even from root (a container, a hardened unit). The agent reads
//! its capabilities at start and logs which way it grows volumes; an online growth the
//! kernel refuses all the same switches it to offline growth for good.
//!
//! Offline, the NFS server must let go of the filesystem first: the caller withholds the
//! volume's export and serves it again after (see `VolumeBackend::grows_offline`).
//! Here, under the volume's lock: a mark is written beside the image, the image file is
//! lengthened, the filesystem unmounted (never lazily: a filesystem still held stays
//! mounted and the growth fails), grown by resize2fs and mounted again. A crash at any
//! step leaves the mark, and the next start ([`Growth::repair`]) checks the unmounted
//! filesystem with e2fsck, grows it to fill its image and mounts it: the volume comes
//! back at its old or its new size.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nfsprov_api_types::VolumePath;

use crate::exports::{FaultPoint, crash_if_asked};
use crate::holds;
use crate::store::error::{Result, StoreError, quota_error};

use super::files::{failed, remove_synced, set_size, sync_parent};
use super::tools::{ImageTools, Released};

/// Beside a volume's image while it is grown offline.
const GROWING: &str = ".growing";
/// How long the NFS server may take to let go of a filesystem whose export it dropped.
const RELEASE_WAIT: Duration = Duration::from_secs(10);
const RELEASE_POLL: Duration = Duration::from_millis(100);
/// `CAP_SYS_RESOURCE`'s bit in the capability sets.
const CAP_SYS_RESOURCE: u32 = 24;

/// A size that holds `missing` more bytes than `size`, with room for the structures the
/// filesystem adds as it grows, in whole mebibytes.
pub(super) fn grown_size(size: u64, missing: u64) -> u64 {
    (size + missing + missing / 32 + (1 << 20)).div_ceil(1 << 20) << 20
}

/// The filesystem's size as its users see it (without its own structures).
pub(super) fn filesystem_bytes(mountpoint: &Path) -> Result<u64> {
    let vfs = rustix::fs::statvfs(mountpoint)
        .map_err(|e| failed(format!("statvfs {}", mountpoint.display()), e))?;
    Ok(vfs.f_blocks.saturating_mul(vfs.f_frsize.max(1)))
}

/// What an offline growth needs of the backend: its mounts.
pub(super) trait Remount {
    fn is_mounted(&self, mountpoint: &Path) -> bool;
    /// Mounts `image` at `mountpoint`, grown (unmounted) until it holds `capacity`.
    fn mount_fitted(&self, image: &Path, mountpoint: &Path, capacity: u64) -> Result<()>;
}

/// Which way volumes grow, and the marks of offline growths under way.
#[derive(Debug)]
pub(super) struct Growth {
    online: AtomicBool,
    /// The image area, where the marks lie beside the images.
    area: PathBuf,
}

impl Growth {
    /// Reads this process's capabilities and says which way volumes will grow.
    pub(super) fn detect(area: PathBuf) -> Self {
        let online = may_grow_mounted();
        if online {
            tracing::info!(
                growth = "online",
                "image volumes grow while mounted (the agent has CAP_SYS_RESOURCE)"
            );
        } else {
            tracing::warn!(
                growth = "offline",
                "image volumes grow unmounted: the agent lacks CAP_SYS_RESOURCE, which the kernel requires to resize a mounted filesystem; each growth withdraws the volume's export for the seconds it takes"
            );
        }
        Self {
            online: AtomicBool::new(online),
            area,
        }
    }

    pub(super) fn online(&self) -> bool {
        self.online.load(Ordering::Relaxed)
    }

    /// After the kernel refused to grow a mounted filesystem: every later growth is
    /// offline.
    pub(super) fn online_refused(&self) {
        if self.online.swap(false, Ordering::Relaxed) {
            tracing::warn!(
                growth = "offline",
                "the kernel refused to grow a mounted volume's filesystem (the agent lacks CAP_SYS_RESOURCE): image volumes grow unmounted from now on, each growth withdrawing the volume's export for the seconds it takes"
            );
        }
    }

    fn mark(&self, key: &str) -> PathBuf {
        self.area.join(format!("{key}{GROWING}"))
    }

    /// Grows the volume `path`, from `image` mounted at `mountpoint`, until it holds
    /// `capacity` bytes, unmounted. Nothing may hold the filesystem (its export
    /// withheld); if something does, it stays mounted as it was and this fails.
    pub(super) fn grow_unmounted(
        &self,
        mounts: &dyn Remount,
        tools: &ImageTools,
        path: &VolumePath,
        image: &Path,
        mountpoint: &Path,
        capacity: u64,
    ) -> Result<()> {
        let total = filesystem_bytes(mountpoint)?;
        if total >= capacity {
            return Ok(());
        }
        let started = Instant::now();
        let mark = self.mark(path.as_str());
        write_mark(&mark)?;
        let size = fs::metadata(image)
            .map_err(|e| failed(format!("stat {}", image.display()), e))?
            .len();
        // Longer first, while mounted: the loop device keeps its size until told, and
        // a crash leaves a longer image the start grows the filesystem into.
        set_size(image, grown_size(size, capacity - total))?;
        if let Err(e) = release(tools, path, mountpoint) {
            remove_synced(&mark)?;
            return Err(e);
        }
        crash_if_asked(FaultPoint::GrowUnmounted);
        holds::wait_if_asked(holds::GROWTHS);
        let grown = tools
            .grow_unmounted(image)
            .map_err(|e| quota_error(format!("grow the unmounted filesystem of {path}"), e));
        if let Err(error) = &grown {
            tracing::error!(volume = %path, %error, "could not grow a volume's unmounted filesystem; checking it before it is mounted again");
            if let Err(error) = tools.check(image) {
                tracing::error!(volume = %path, %error, "could not check a volume's filesystem");
            }
        }
        let fitted = grown.and_then(|()| mounts.mount_fitted(image, mountpoint, capacity));
        if !mounts.is_mounted(mountpoint) {
            // Mounted again whatever the growth did: at the size it reached, at worst
            // the old one. A volume left unmounted keeps its mark for the next start.
            tools.mount(image, mountpoint, false).map_err(|e| {
                quota_error(
                    format!("mount {path} again after growing it (the next start repairs it)"),
                    e,
                )
            })?;
        }
        remove_synced(&mark)?;
        fitted?;
        tracing::info!(
            volume = %path,
            growth = "offline",
            capacity_bytes = capacity,
            took_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "grew a volume's filesystem unmounted"
        );
        Ok(())
    }

    /// At start, before the volume `key` (from `image`) is mounted: finishes an offline
    /// growth a crash interrupted. A filesystem still `mounted` was never unmounted or
    /// was mounted again; an unmounted one is checked (resize2fs offline keeps no
    /// journal) and grown to fill its image, which is as long as the growth made it.
    pub(super) fn repair(
        &self,
        tools: &ImageTools,
        key: &str,
        image: &Path,
        mounted: bool,
    ) -> Result<()> {
        let mark = self.mark(key);
        if !mark.exists() {
            return Ok(());
        }
        if !mounted {
            tracing::warn!(
                volume = key,
                "a growth of this volume was interrupted; checking its filesystem and finishing the growth"
            );
            tools
                .check(image)
                .and_then(|()| tools.grow_unmounted(image))
                .map_err(|e| quota_error(format!("repair the interrupted growth of {key}"), e))?;
        }
        remove_synced(&mark)
    }
}

/// Whether this process may resize a mounted ext4: `CAP_SYS_RESOURCE` in its effective
/// set. Unreadable capabilities count as present: the first refused growth tells.
fn may_grow_mounted() -> bool {
    let Ok(status) = fs::read_to_string("/proc/self/status") else {
        return true;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|bits| u64::from_str_radix(bits.trim(), 16).ok())
        .is_none_or(|bits| bits & (1 << CAP_SYS_RESOURCE) != 0)
}

/// Unmounts `mountpoint` once nothing holds it any more (the NFS server lets go of a
/// filesystem shortly after its export is withdrawn).
fn release(tools: &ImageTools, path: &VolumePath, mountpoint: &Path) -> Result<()> {
    let deadline = Instant::now() + RELEASE_WAIT;
    loop {
        let released = tools
            .unmount_released(mountpoint)
            .map_err(|e| quota_error(format!("unmount {path} to grow it"), e))?;
        if released == Released::Unmounted {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(StoreError::NotReady(format!(
                "{path}: its filesystem is still in use {}s after its export was withdrawn, so it cannot be unmounted to grow it (the agent lacks CAP_SYS_RESOURCE to grow it mounted); it stays mounted and served at its old size; try again",
                RELEASE_WAIT.as_secs()
            )));
        }
        std::thread::sleep(RELEASE_POLL);
    }
}

fn write_mark(mark: &Path) -> Result<()> {
    if let Some(parent) = mark.parent() {
        fs::create_dir_all(parent).map_err(|e| failed(format!("make {}", parent.display()), e))?;
    }
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(mark)
        .and_then(|file| file.sync_all())
        .map_err(|e| failed(format!("write {}", mark.display()), e))?;
    sync_parent(mark)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_grown_image_holds_what_was_missing_and_room_for_the_filesystem() {
        let size = grown_size(33 << 20, 31 << 20);
        assert!(size >= (64 << 20) + (31 << 20) / 32, "{size}");
        assert_eq!(size % (1 << 20), 0);
    }
}
