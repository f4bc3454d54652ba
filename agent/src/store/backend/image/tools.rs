//! The tools that make, mount and change a volume's filesystem image (e2fsprogs and
//! util-linux), run with the quota tools' time limit.

use std::path::Path;
use std::sync::Arc;

use crate::quota::command::{ToolCommand, ToolError, ToolRunner};

/// The filesystem inside each image.
pub(super) const FILESYSTEM: &str = "ext4";

/// What [`ImageTools::unmount_released`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Released {
    Unmounted,
    /// Something still holds the filesystem: it is mounted as before.
    Busy,
}

#[derive(Debug, Clone)]
pub(super) struct ImageTools {
    runner: Arc<dyn ToolRunner>,
}

fn arg(path: &Path) -> String {
    path.to_string_lossy().into_owned()
}

impl ImageTools {
    pub(super) fn new(runner: Arc<dyn ToolRunner>) -> Self {
        Self { runner }
    }

    fn run(&self, program: &str, args: &[String]) -> Result<String, ToolError> {
        self.runner
            .run(&ToolCommand::new(program, args.iter().cloned()))
    }

    /// An empty ext4 filesystem filling `image`. `metadata_csum_seed` lets a copy be given
    /// a UUID of its own at once (`tune2fs -U` rewrites no checksum); no blocks are
    /// reserved for root, so the whole size is the tenant's; an inode per 16 KiB at every
    /// size (mke2fs would give a volume under 512 MiB one per 4 KiB), so that what the
    /// filesystem keeps for itself is what the image's first size allows for.
    pub(super) fn make_filesystem(&self, image: &Path) -> Result<(), ToolError> {
        self.run(
            "mkfs.ext4",
            &[
                "-q".into(),
                "-F".into(),
                "-b".into(),
                "4096".into(),
                "-i".into(),
                "16384".into(),
                "-I".into(),
                "256".into(),
                "-m".into(),
                "0".into(),
                "-O".into(),
                "metadata_csum_seed".into(),
                "-E".into(),
                "nodiscard,lazy_itable_init=1,lazy_journal_init=1".into(),
                arg(image),
            ],
        )
        .map(drop)
    }

    /// Mounts `image` at `mountpoint` through a loop device that goes with the mount.
    /// Device files and setuid bits inside a tenant's filesystem mean nothing here.
    pub(super) fn mount(
        &self,
        image: &Path,
        mountpoint: &Path,
        read_only: bool,
    ) -> Result<(), ToolError> {
        let options = if read_only {
            "loop,nodev,nosuid,ro"
        } else {
            "loop,nodev,nosuid"
        };
        self.run(
            "mount",
            &[
                "-t".into(),
                FILESYSTEM.into(),
                "-o".into(),
                options.into(),
                arg(image),
                arg(mountpoint),
            ],
        )
        .map(drop)
    }

    /// Unmounts `mountpoint`; when something still holds it (an NFS server that has not
    /// yet dropped its export), detaches it now and lets the kernel finish once released.
    pub(super) fn unmount(&self, mountpoint: &Path) -> Result<(), ToolError> {
        match self.run("umount", &[arg(mountpoint)]) {
            Ok(_) => Ok(()),
            Err(e) if e.stderr().contains("busy") => self
                .run("umount", &["-l".into(), arg(mountpoint)])
                .map(drop),
            Err(e) => Err(e),
        }
    }

    /// Unmounts `mountpoint` for good, never lazily: a filesystem still held (an NFS
    /// server that has not yet let go of it) stays mounted and the answer is
    /// [`Released::Busy`], so that nothing changes its image beneath a live mount.
    pub(super) fn unmount_released(&self, mountpoint: &Path) -> Result<Released, ToolError> {
        match self.run("umount", &[arg(mountpoint)]) {
            Ok(_) => Ok(Released::Unmounted),
            Err(e) if e.stderr().contains("busy") => Ok(Released::Busy),
            Err(e) => Err(e),
        }
    }

    /// Checks the unmounted filesystem in `image` and repairs what it finds (an offline
    /// resize that was interrupted). Errors corrected are a success.
    pub(super) fn check(&self, image: &Path) -> Result<(), ToolError> {
        match self.run("e2fsck", &["-f".into(), "-y".into(), arg(image)]) {
            Ok(_) => Ok(()),
            // Exit 1: errors found and corrected.
            Err(ToolError::Failed { status, .. }) if status.ends_with("status: 1") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Gives the unmounted filesystem in `image` a new random UUID: an NFS server tells
    /// filesystems apart by it, and a copy keeping its original's would not be exported.
    pub(super) fn new_uuid(&self, image: &Path) -> Result<(), ToolError> {
        self.run("tune2fs", &["-U".into(), "random".into(), arg(image)])
            .map(drop)
    }

    /// The loop device mounted at `mountpoint`.
    pub(super) fn device_of(&self, mountpoint: &Path) -> Result<String, ToolError> {
        let out = self.run(
            "findmnt",
            &[
                "-n".into(),
                "-o".into(),
                "SOURCE".into(),
                "--mountpoint".into(),
                arg(mountpoint),
            ],
        )?;
        Ok(out.trim().to_owned())
    }

    /// Grows the mounted filesystem on `device` to its image's new size. The kernel lets
    /// only a process with `CAP_SYS_RESOURCE` resize a mounted ext4.
    pub(super) fn grow(&self, device: &str) -> Result<(), ToolError> {
        self.run("losetup", &["-c".into(), device.to_owned()])?;
        self.run("resize2fs", &[device.to_owned()]).map(drop)
    }

    /// Whether `error` of [`Self::grow`] is the kernel's refusal for want of privilege.
    pub(super) fn refused_for_privilege(error: &ToolError) -> bool {
        let said = error.stderr();
        said.contains("Permission denied") || said.contains("Operation not permitted")
    }

    /// Grows the unmounted filesystem in `image` to the image's size. Forced: a copy of
    /// a frozen filesystem is consistent but not marked as freshly checked.
    pub(super) fn grow_unmounted(&self, image: &Path) -> Result<(), ToolError> {
        self.run("resize2fs", &["-f".into(), arg(image)]).map(drop)
    }

    /// Holds every write to the filesystem at `mountpoint` (`thaw` releases them), so
    /// that its image reads as a clean, consistent filesystem.
    pub(super) fn freeze(&self, mountpoint: &Path) -> Result<(), ToolError> {
        self.run("fsfreeze", &["-f".into(), arg(mountpoint)])
            .map(drop)
    }

    pub(super) fn thaw(&self, mountpoint: &Path) -> Result<(), ToolError> {
        self.run("fsfreeze", &["-u".into(), arg(mountpoint)])
            .map(drop)
    }

    /// The superblock of the unmounted filesystem in `image`, as `dumpe2fs -h` prints it.
    pub(super) fn superblock(&self, image: &Path) -> Result<String, ToolError> {
        self.run("dumpe2fs", &["-h".into(), arg(image)])
    }
}

fn superblock_field(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
        .and_then(|value| value.trim().parse().ok())
}

/// Bytes and inodes in use, from a `dumpe2fs -h` superblock listing.
pub(super) fn superblock_usage(text: &str) -> Option<(u64, u64)> {
    let field = |name: &str| superblock_field(text, name);
    let block_size = field("Block size")?;
    let used_blocks = field("Block count")?.checked_sub(field("Free blocks")?)?;
    let used_inodes = field("Inode count")?.checked_sub(field("Free inodes")?)?;
    let reserved_inodes = field("First inode")?.saturating_sub(1);
    Some((
        used_blocks.saturating_mul(block_size),
        used_inodes.saturating_sub(reserved_inodes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_superblock_listing_gives_bytes_and_inodes_in_use() {
        let text = "Filesystem volume name:   <none>\nInode count:              65536\nBlock count:              262144\nFree blocks:              249000\nFree inodes:              65520\nFirst inode:              11\nBlock size:               4096\n";
        assert_eq!(
            superblock_usage(text),
            Some(((262_144 - 249_000) * 4096, 65_536 - 65_520 - 10))
        );
        assert_eq!(superblock_usage("Block size: 4096\n"), None);
    }
}
