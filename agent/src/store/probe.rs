//! A volume's directory looked at cheaply, for its condition: opened beneath the root the
//! way every operation opens it (never following a link out of it), then one `fstatvfs`.
//! A handful of syscalls per volume and no walk of its tree, so every volume can be looked
//! at on every pass of the agent.

use std::os::fd::AsFd;

use nfsprov_api_types::VolumePath;
use rustix::fs::StatVfsMountFlags;
use rustix::io::Errno;

use super::backend::{Layout, VolumeBackend};
use super::confine::{Root, open_or_create_dir};

/// What a filesystem of its own keeps back at most: writers meet ENOSPC while `statvfs`
/// still counts a little space available (ext4 holds back 2% of its clusters, at most
/// 4096 of them, for its metadata and delayed allocation).
const FULL_MARGIN_BYTES: u64 = 16 << 20;

/// Blocks available at or below which a filesystem of its own is full for its writers.
fn full_margin(vfs: &rustix::fs::StatVfs) -> u64 {
    (vfs.f_blocks / 50).min(FULL_MARGIN_BYTES / vfs.f_frsize.max(1))
}

/// What a look at a volume's directory found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Looked {
    /// The directory, or one of its parents, is not there (or is no longer a directory).
    Absent,
    /// Opening it or asking its filesystem failed: the filesystem itself is in trouble
    /// (EIO of a shut-down XFS, ESTALE, EUCLEAN of a corrupt one).
    /// The error, for people.
    Failing(String),
    Present(Found),
}

/// What the filesystem under a present volume says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Mounted read-only: every write fails.
    pub read_only: bool,
    /// Where the volume is a filesystem of its own: no block left for writers (within
    /// what the filesystem keeps back for itself).
    pub own_filesystem_full: bool,
    /// Where volumes are mounts: whether its filesystem is mounted (else the directory is
    /// a bare mountpoint and the volume is effectively gone).
    pub servable: bool,
}

/// Looks at the volume at `path` beneath `root`, held by `backend`.
pub(super) fn look(root: &Root, backend: &dyn VolumeBackend, path: &VolumePath) -> Looked {
    let mut dir = match root.reopen() {
        Ok(dir) => dir,
        Err(error) => return Looked::Failing(error.to_string()),
    };
    for component in path.components() {
        dir = match open_or_create_dir(dir.as_fd(), component, false) {
            Ok(next) => next,
            Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => return Looked::Absent,
            Err(error) => return Looked::Failing(std::io::Error::from(error).to_string()),
        };
    }
    let vfs = match rustix::fs::fstatvfs(&dir) {
        Ok(vfs) => vfs,
        Err(error) => return Looked::Failing(std::io::Error::from(error).to_string()),
    };
    let own_filesystem = backend.layout() == Layout::Mounts;
    Looked::Present(Found {
        read_only: vfs.f_flag.contains(StatVfsMountFlags::RDONLY),
        own_filesystem_full: own_filesystem && vfs.f_bavail <= full_margin(&vfs),
        servable: !own_filesystem || backend.is_servable(path),
    })
}
