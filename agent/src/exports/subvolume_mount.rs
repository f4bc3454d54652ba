//! A btrfs volume mounted over its own path before ganesha exports it.
//!
//! ganesha's VFS layer serves one filesystem per export and finds it in the mount table:
//! a subvolume reached through its parent's mount is not one it can resolve, so it
//! refuses the export. Mounted by itself (`subvolid=`), at the very path it already has,
//! it is a filesystem of its own to ganesha, and the qgroup limit on it applies to writes
//! through NFS. The path clients mount and the path the store walks stay the same: the
//! store reaches the same subvolume (same identity) through the mount.
//!
//! Mounts live only in the kernel, so a reboot loses them; the export records are what
//! says which volumes need one, and the start-up restore makes them again.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nfsprov_api_types::VolumePath;
use rustix::fs::{AtFlags, Mode, OFlags, StatxAttributes, StatxFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, UnmountFlags};

use super::server::ExportError;
use crate::mountinfo::unescape;
use crate::subvolume::{is_btrfs_magic, is_subvolume, subvolume_id};

const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// The per-volume mounts of an export root on btrfs.
#[derive(Debug)]
pub(super) struct SubvolumeMounts {
    /// The export root with symlinks resolved, as the mount table names it.
    root: PathBuf,
    root_fd: OwnedFd,
    /// The block device btrfs was mounted from (what a new mount of it names).
    device: PathBuf,
}

/// One line of the mount table, the fields this module reads.
#[derive(Debug, PartialEq, Eq)]
struct MountEntry {
    point: PathBuf,
    fs_type: String,
    source: String,
}

impl SubvolumeMounts {
    /// The mounts of `export_root`'s volumes, or `None` when it is not on btrfs (nothing
    /// else needs them: knfsd crosses into subvolumes itself, ZFS datasets are mounted).
    pub(super) fn probe(export_root: &Path) -> Result<Option<Self>, ExportError> {
        let what = || format!("export root {}", export_root.display());
        let root_fd = match rustix::fs::open(
            export_root,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            // No root, no volume beneath it to mount: the store refuses to serve it anyway.
            Err(Errno::NOENT) => return Ok(None),
            Err(e) => return Err(ExportError::io(what())(e.into())),
        };
        let on_btrfs = rustix::fs::fstatfs(&root_fd).is_ok_and(|s| is_btrfs_magic(s.f_type));
        if !on_btrfs {
            return Ok(None);
        }
        let root = std::fs::canonicalize(export_root).map_err(ExportError::io(what()))?;
        let table = read_table()?;
        let device = containing_mount(&table, &root)
            .filter(|entry| entry.fs_type == "btrfs")
            .map(|entry| PathBuf::from(&entry.source))
            .ok_or_else(|| {
                ExportError::Corrupt(format!(
                    "no btrfs mount holding {} in {MOUNT_TABLE}",
                    root.display()
                ))
            })?;
        Ok(Some(Self {
            root,
            root_fd,
            device,
        }))
    }

    fn path_of(&self, volume: &VolumePath) -> PathBuf {
        self.root.join(volume.as_str())
    }

    /// Whether a mount sits at the volume's path: the directory opened there is the root
    /// of a mount (`statx`'s `STATX_ATTR_MOUNT_ROOT`), one call whatever the number of
    /// mounts. A kernel that does not tell (before Linux 5.8) has the mount table read.
    pub(super) fn is_mounted(&self, volume: &VolumePath) -> Result<bool, ExportError> {
        let Some(dir) = self.open_volume(volume)? else {
            return Ok(false);
        };
        let status = rustix::fs::statx(
            &dir,
            "",
            AtFlags::EMPTY_PATH | AtFlags::NO_AUTOMOUNT,
            StatxFlags::empty(),
        );
        match status {
            Ok(status)
                if status
                    .stx_attributes_mask
                    .contains(StatxAttributes::MOUNT_ROOT) =>
            {
                Ok(status.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
            }
            _ => {
                let path = self.path_of(volume);
                Ok(parse_table(&read_table()?).any(|entry| entry.point == path))
            }
        }
    }

    /// Mounts the volume's subvolume over its own path, unless it is mounted already or
    /// is no subvolume (a directory volume needs no mount of its own). Answers whether
    /// it made the mount.
    pub(super) fn mount(&self, volume: &VolumePath) -> Result<bool, ExportError> {
        if self.is_mounted(volume)? {
            return Ok(false);
        }
        self.mount_here(volume)
    }

    /// As [`Self::mount`] for many volumes, the mount table read once (a start with
    /// thousands of volumes would otherwise read it once per volume). Answers the
    /// volumes whose mount it made.
    pub(super) fn mount_all<'a>(
        &self,
        volumes: impl IntoIterator<Item = &'a VolumePath>,
    ) -> Result<Vec<&'a VolumePath>, ExportError> {
        let table = read_table()?;
        let mounted: std::collections::HashSet<PathBuf> =
            parse_table(&table).map(|entry| entry.point).collect();
        let mut made = Vec::new();
        for volume in volumes {
            if !mounted.contains(&self.path_of(volume)) && self.mount_here(volume)? {
                made.push(volume);
            }
        }
        Ok(made)
    }

    fn mount_here(&self, volume: &VolumePath) -> Result<bool, ExportError> {
        let Some(dir) = self.open_volume(volume)? else {
            return Err(ExportError::Corrupt(format!(
                "{volume}: no directory to mount its subvolume on"
            )));
        };
        if !is_subvolume(dir.as_fd()) {
            return Ok(false);
        }
        let id = subvolume_id(dir.as_fd()).ok_or_else(|| {
            ExportError::Corrupt(format!("{volume}: btrfs did not name its subvolume"))
        })?;
        let options = std::ffi::CString::new(format!("subvolid={id}"))
            .map_err(|e| ExportError::Corrupt(e.to_string()))?;
        // Through the descriptor the confined walk opened: the mount lands on that very
        // directory, whatever was renamed on the way since.
        let target = format!("/proc/self/fd/{}", rustix::fd::AsRawFd::as_raw_fd(&dir));
        rustix::mount::mount(
            &self.device,
            target.as_str(),
            "btrfs",
            MountFlags::NOSUID | MountFlags::NODEV,
            options.as_c_str(),
        )
        .map(|()| true)
        .map_err(|e| {
            ExportError::io(format!(
                "mounting the subvolume of {volume} at {}",
                self.path_of(volume).display()
            ))(e.into())
        })
    }

    /// Takes the volume's own mount away (nothing to do when there is none), so the
    /// volume can be renamed into the archive or deleted.
    pub(super) fn unmount(&self, volume: &VolumePath) -> Result<(), ExportError> {
        if !self.is_mounted(volume)? {
            return Ok(());
        }
        let path = self.path_of(volume);
        let what = || format!("unmounting {}", path.display());
        match rustix::mount::unmount(&path, UnmountFlags::NOFOLLOW) {
            Ok(()) => Ok(()),
            // ganesha can hold a descriptor a moment after the export is gone: detached
            // now, the path shows the subvolume through its parent again at once, and
            // the kernel lets the mount go when the last descriptor closes.
            Err(Errno::BUSY) => {
                rustix::mount::unmount(&path, UnmountFlags::NOFOLLOW | UnmountFlags::DETACH)
                    .map_err(|e| ExportError::io(what())(e.into()))
            }
            Err(e) => Err(ExportError::io(what())(e.into())),
        }
    }

    /// Opens the volume's directory one component at a time without following a
    /// symlink, so nothing outside the export root is ever mounted on.
    fn open_volume(&self, volume: &VolumePath) -> Result<Option<OwnedFd>, ExportError> {
        let mut dir: Option<OwnedFd> = None;
        for component in volume.as_str().split('/') {
            let base = dir.as_ref().map_or(self.root_fd.as_fd(), |fd| fd.as_fd());
            let next = rustix::fs::openat(
                base,
                component,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            );
            dir = match next {
                Ok(next) => Some(next),
                Err(Errno::NOENT) => return Ok(None),
                Err(e) => {
                    return Err(ExportError::io(format!("opening {volume}"))(e.into()));
                }
            };
        }
        Ok(dir)
    }
}

fn read_table() -> Result<String, ExportError> {
    std::fs::read_to_string(MOUNT_TABLE).map_err(ExportError::io(format!("reading {MOUNT_TABLE}")))
}

/// mountinfo: `id parent dev root point options [optional...] - type source super`.
fn parse_table(table: &str) -> impl Iterator<Item = MountEntry> + '_ {
    table.lines().filter_map(|line| {
        let (before, after) = line.split_once(" - ")?;
        let point = before.split(' ').nth(4)?;
        let mut after = after.split(' ');
        let fs_type = after.next()?;
        let source = after.next()?;
        Some(MountEntry {
            point: PathBuf::from(unescape(point)),
            fs_type: unescape(fs_type),
            source: unescape(source),
        })
    })
}

/// The mount `path` is on: the last listed whose point is the longest prefix of it
/// (later lines are mounted over earlier ones at the same point).
fn containing_mount(table: &str, path: &Path) -> Option<MountEntry> {
    let mut best: Option<MountEntry> = None;
    for entry in parse_table(table) {
        if !path.starts_with(&entry.point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|b| entry.point.as_os_str().len() >= b.point.as_os_str().len());
        if longer {
            best = Some(entry);
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 0:40 / /srv rw shared:5 - btrfs /dev/loop7 rw,space_cache=v2
31 30 0:41 /exports/ns/claim /srv/exports/ns/claim rw,nosuid,nodev - btrfs /dev/loop7 rw,subvolid=257
40 22 0:50 / /srv/with\\040space rw - btrfs /dev/mapper/a\\040b rw
";

    #[test]
    fn the_export_root_is_on_the_longest_mount_holding_it() {
        let entry = containing_mount(TABLE, Path::new("/srv/exports")).unwrap();
        assert_eq!(entry.point, Path::new("/srv"));
        assert_eq!(entry.source, "/dev/loop7");
        let spaced = containing_mount(TABLE, Path::new("/srv/with space/x")).unwrap();
        assert_eq!(spaced.source, "/dev/mapper/a b");
        let plain = containing_mount(TABLE, Path::new("/home")).unwrap();
        assert_eq!(plain.fs_type, "ext4");
    }

    #[test]
    fn a_volume_mount_is_found_by_its_exact_point() {
        let points: Vec<PathBuf> = parse_table(TABLE).map(|e| e.point).collect();
        assert!(points.contains(&PathBuf::from("/srv/exports/ns/claim")));
        assert!(!points.contains(&PathBuf::from("/srv/exports/ns")));
    }
}
