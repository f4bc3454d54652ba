//! Mount points beneath a directory, from the kernel's mount table of this process: a
//! volume holding one (a filesystem or a bind mount a tenant or an admin placed inside it)
//! is never deleted, because removing its tree would reach into the mounted directory, and
//! a directory at, beneath or holding one is never adopted, so no volume spans a mount.
//!
//! The table is read again only when the kernel says it changed (the file signals
//! `POLLPRI` after a mount or unmount), so a delete costs one `poll` rather than a read
//! of the whole table.

use std::io::{self, Read, Seek};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use rustix::event::{PollFd, PollFlags};

use crate::mountinfo::mount_points;

const MOUNT_TABLE: &str = "/proc/self/mountinfo";

/// The mount points below one directory (the export root), kept current.
#[derive(Debug)]
pub(super) struct MountTable {
    below: PathBuf,
    state: Mutex<Option<Cached>>,
}

#[derive(Debug)]
struct Cached {
    file: std::fs::File,
    points: Vec<PathBuf>,
}

impl MountTable {
    /// Watches the mount points below `dir` (an absolute path without symlinks).
    pub(super) fn new(dir: &Path) -> Self {
        Self {
            below: dir.to_owned(),
            state: Mutex::new(None),
        }
    }

    /// The mount points strictly below `dir`, which must lie below the watched directory.
    pub(super) fn mount_points_below(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.matching(|point| is_below(dir, point))
    }

    /// The mount points a tree at `dir` would span: below `dir`, at it, or on the way to
    /// it. The watched directory itself does not count (an export root is often a mount).
    pub(super) fn mount_points_around(&self, dir: &Path) -> io::Result<Vec<PathBuf>> {
        self.matching(|point| is_around(&self.below, dir, point))
    }

    fn matching(&self, keep: impl Fn(&Path) -> bool) -> io::Result<Vec<PathBuf>> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let stale = match state.as_ref() {
            None => true,
            Some(cached) => changed(&cached.file)?,
        };
        if stale {
            // Opened before it is read, so a change during the read is signalled too.
            let mut file = match state.take() {
                Some(cached) => cached.file,
                None => std::fs::File::open(MOUNT_TABLE)?,
            };
            file.rewind()?;
            let mut table = String::new();
            file.read_to_string(&mut table)?;
            let points = mount_points(&table)
                .filter(|point| point.starts_with(&self.below))
                .collect();
            *state = Some(Cached { file, points });
        }
        let points = state.as_ref().map_or(&[][..], |c| &c.points[..]);
        Ok(points.iter().filter(|p| keep(p)).cloned().collect())
    }
}

fn is_below(dir: &Path, point: &Path) -> bool {
    point != dir && point.starts_with(dir)
}

fn is_around(watched: &Path, dir: &Path, point: &Path) -> bool {
    point != watched && (point.starts_with(dir) || dir.starts_with(point))
}

/// Whether the kernel signalled a change of the table since it was last read.
fn changed(file: &std::fs::File) -> io::Result<bool> {
    let mut fds = [PollFd::new(file, PollFlags::PRI)];
    let ready = rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default()))?;
    Ok(ready > 0 && fds[0].revents().intersects(PollFlags::PRI | PollFlags::ERR))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped_and_only_those_below_count() {
        let table = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
40 22 8:1 /data /srv/nfs/ns/v1/in\\040there rw - ext4 /dev/sda1 rw
41 22 0:50 / /srv/nfs/ns/v10 rw - tmpfs tmpfs rw
42 22 0:51 / /srv/nfs/ns/v1 rw - tmpfs tmpfs rw
";
        let below: Vec<PathBuf> = mount_points(table)
            .filter(|p| is_below(Path::new("/srv/nfs/ns/v1"), p))
            .collect();
        assert_eq!(below, [PathBuf::from("/srv/nfs/ns/v1/in there")]);
    }

    #[test]
    fn around_a_directory_are_the_mounts_at_below_and_above_it_but_not_the_root() {
        let table = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
30 22 8:2 / /srv/nfs rw - ext4 /dev/sda2 rw
40 30 8:2 /data /srv/nfs/ns/v1/in\\040there rw - ext4 /dev/sda1 rw
41 30 0:50 / /srv/nfs/ns/v10 rw - tmpfs tmpfs rw
42 30 0:51 / /srv/nfs/other rw - tmpfs tmpfs rw
";
        let watched = Path::new("/srv/nfs");
        let around = |dir: &str| -> Vec<PathBuf> {
            mount_points(table)
                .filter(|p| p.starts_with(watched) && is_around(watched, Path::new(dir), p))
                .collect()
        };
        assert_eq!(
            around("/srv/nfs/ns/v1"),
            [PathBuf::from("/srv/nfs/ns/v1/in there")]
        );
        assert_eq!(
            around("/srv/nfs/ns/v10"),
            [PathBuf::from("/srv/nfs/ns/v10")]
        );
        assert_eq!(
            around("/srv/nfs/other/deep"),
            [PathBuf::from("/srv/nfs/other")]
        );
        assert_eq!(around("/srv/nfs/ns").len(), 2);
        assert!(around("/srv/nfs/plain").is_empty());
    }

    #[test]
    fn the_table_is_read_again_after_a_change() {
        let table = MountTable::new(Path::new("/"));
        let first = table.mount_points_below(Path::new("/")).unwrap();
        assert!(!first.is_empty(), "some mount is below /");
        // Nothing changed: the cached list answers the same.
        assert_eq!(table.mount_points_below(Path::new("/")).unwrap(), first);
    }
}
