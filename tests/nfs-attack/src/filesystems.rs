//! Filesystems in sparse image files, loop-mounted (root required): the host
//! filesystem of a test, and one per volume where a volume is a filesystem of its own.

use std::path::{Path, PathBuf};

use crate::setup::{Result, SetupError, run};

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FsKind {
    Ext4,
    Xfs,
    Btrfs,
    /// A zfs-fuse dataset (never made in an image here).
    Zfs,
}

impl FsKind {
    pub fn name(self) -> &'static str {
        match self {
            FsKind::Ext4 => "ext4",
            FsKind::Xfs => "xfs",
            FsKind::Btrfs => "btrfs",
            FsKind::Zfs => "zfs",
        }
    }

    /// The smallest size mkfs accepts, rounded up (xfsprogs wants 300 MiB).
    pub fn min_mib(self) -> u64 {
        match self {
            FsKind::Ext4 => 16,
            FsKind::Xfs => 300,
            FsKind::Btrfs => 128,
            FsKind::Zfs => 64,
        }
    }

    /// The inode of the filesystem's root directory, generation 0: fixed per kind.
    pub fn root_inode(self) -> Option<u32> {
        match self {
            FsKind::Ext4 => Some(2),
            FsKind::Xfs => Some(128),
            FsKind::Btrfs | FsKind::Zfs => None,
        }
    }
}

/// Makes a sparse image of `size_mib` at `image` and a `kind` filesystem in it (XFS with
/// reflinks, so that a copy of an image can share its extents; ext4 with its checksum
/// seed apart from its UUID, so that a copy can be given a UUID of its own at once).
pub fn make_image(image: &Path, kind: FsKind, size_mib: u64) -> Result<()> {
    std::fs::File::create(image)?.set_len(size_mib * MIB)?;
    let image = path_str(image)?;
    match kind {
        // The checksum seed apart from the UUID: a clone's UUID can then be changed at
        // once, where without it tune2fs rewrites every checksum and first wants the
        // filesystem freshly checked (it refused now and then right after an unmount).
        FsKind::Ext4 => run(
            "mkfs.ext4",
            &["-q", "-F", "-O", "metadata_csum_seed", image],
        ),
        FsKind::Xfs => run("mkfs.xfs", &["-q", "-f", "-m", "reflink=1", image]),
        FsKind::Btrfs => run("mkfs.btrfs", &["-q", "-f", image]),
        FsKind::Zfs => Err(SetupError::Failed("no zfs in an image".into())),
    }
    .map(drop)
}

/// A mount, unmounted when dropped.
pub struct Mounted {
    at: PathBuf,
}

impl Mounted {
    /// Mounts the filesystem in `image` at `at` through a loop device (freed on unmount).
    pub fn loop_image(image: &Path, at: &Path, options: &[&str]) -> Result<Self> {
        let mut all = vec!["loop"];
        all.extend_from_slice(options);
        Self::mount(image, at, &all.join(","))
    }

    /// Mounts `source` (a device or an image with `loop` among `options`) at `at`.
    pub fn mount(source: &Path, at: &Path, options: &str) -> Result<Self> {
        std::fs::create_dir_all(at)?;
        run("mount", &["-o", options, path_str(source)?, path_str(at)?])?;
        Ok(Self { at: at.to_owned() })
    }

    pub fn path(&self) -> &Path {
        &self.at
    }

    /// The device the mount is of (the loop device of an image).
    pub fn device(&self) -> Result<PathBuf> {
        let source = run(
            "findmnt",
            &["-n", "-o", "SOURCE", "--mountpoint", path_str(&self.at)?],
        )?;
        // btrfs shows `/dev/loopN[/subvolume]`.
        let device = source.trim().split('[').next().unwrap_or_default();
        Ok(PathBuf::from(device))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let Ok(at) = path_str(&self.at) else { return };
        if run("umount", &[at]).is_err() {
            // Still busy (a server shutting down holds a descriptor a moment longer):
            // detach now, the kernel finishes when the last descriptor closes.
            if let Err(e) = run("umount", &["--lazy", at]) {
                eprintln!("could not unmount {at}: {e}");
            }
        }
    }
}

pub fn path_str(path: &Path) -> Result<&str> {
    path.to_str()
        .ok_or_else(|| SetupError::Failed(format!("not UTF-8: {}", path.display())))
}
