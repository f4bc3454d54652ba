//! Whether the export root has its filesystem to itself.
//!
//! NFS servers check that a file handle belongs to the *filesystem* of the export a
//! client was admitted to, not that it lies beneath the export's path (ganesha's FSAL
//! VFS; knfsd with `no_subtree_check`). A client that forges handles therefore reaches
//! everything on the export root's filesystem: when that filesystem also holds the
//! server's own files (the root filesystem, `/home`, another service's data), an export
//! of any volume exposes them. The agent finds out from the mount table at start, says
//! so, and refuses to make new per-volume exports on such a root unless the operator
//! accepts it by name (`exports.allow_shared_filesystem`).

use std::path::{Path, PathBuf};

use crate::mountinfo::unescape;

/// Where the export root's filesystem is mounted, and whether it holds anything else.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RootFilesystem {
    /// The mount point of the filesystem holding the export root.
    pub mount_point: PathBuf,
    /// Why the filesystem holds more than the export root's tree; `None`: it does not.
    pub shared: Option<String>,
}

impl RootFilesystem {
    /// The export root's filesystem, from this process's mount table.
    pub(crate) fn probe(export_root: &Path) -> std::io::Result<Self> {
        let export_root = export_root.canonicalize()?;
        let table = std::fs::read_to_string("/proc/self/mountinfo")?;
        Ok(Self::classify(&export_root, &table))
    }

    /// The filesystem of `export_root` (canonical) in the mount table `table`: the mount
    /// whose mount point is the export root's longest ancestor (the last one mounted
    /// there, which hides those before it). The root has the filesystem to itself only
    /// when it is that mount point and the mount shows the filesystem's own root, not a
    /// subdirectory of it (a bind mount, a btrfs `subvol=`).
    pub(crate) fn classify(export_root: &Path, table: &str) -> Self {
        let mut best: Option<(PathBuf, String)> = None;
        for line in table.lines() {
            let mut fields = line.split(' ');
            let (Some(root), Some(mount_point)) = (fields.nth(3), fields.next()) else {
                continue;
            };
            let mount_point = PathBuf::from(unescape(mount_point));
            if !export_root.starts_with(&mount_point) {
                continue;
            }
            let longer = best.as_ref().is_none_or(|(best, _)| {
                mount_point.components().count() >= best.components().count()
            });
            if longer {
                best = Some((mount_point, unescape(root)));
            }
        }
        let Some((mount_point, fs_root)) = best else {
            return Self {
                mount_point: PathBuf::from("/"),
                shared: Some("no mount in the mount table holds it".to_owned()),
            };
        };
        let shared = if mount_point != export_root {
            Some(format!(
                "it is a directory of the filesystem mounted at {}",
                mount_point.display()
            ))
        } else if fs_root != "/" {
            Some(format!(
                "it is {fs_root} of its filesystem (a bind or subvolume mount), not the whole of it"
            ))
        } else {
            None
        };
        Self {
            mount_point,
            shared,
        }
    }

    pub(crate) fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// The answer of `/v1/info`; `accepted`: the operator accepted a shared filesystem.
    pub(crate) fn to_info(&self, accepted: bool) -> nfsprov_api_types::ExportRootFilesystem {
        nfsprov_api_types::ExportRootFilesystem {
            mount_point: self.mount_point.display().to_string(),
            shared: self.shared.clone(),
            accepted,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TABLE: &str = "\
22 1 253:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
40 22 7:0 / /srv/nfs rw,relatime shared:20 - xfs /dev/loop0 rw
41 22 7:1 / /srv/nfs\\040two rw,relatime shared:21 - ext4 /dev/loop1 rw
42 22 0:50 /exports /srv/sub rw,relatime shared:22 - btrfs /dev/loop2 rw,subvol=/exports
43 22 253:0 /data /srv/bound rw,relatime shared:1 - ext4 /dev/vda rw
44 40 7:3 / /srv/nfs rw,relatime shared:23 - ext4 /dev/loop3 rw
";

    fn classify(root: &str) -> RootFilesystem {
        RootFilesystem::classify(Path::new(root), TABLE)
    }

    #[test]
    fn a_root_that_is_a_whole_filesystem_is_its_own() {
        let whole = classify("/srv/nfs");
        assert_eq!(whole.mount_point, Path::new("/srv/nfs"));
        assert_eq!(whole.shared, None);
        // Mount point names are unescaped before they are compared.
        assert_eq!(classify("/srv/nfs two").shared, None);
    }

    #[test]
    fn a_directory_of_a_filesystem_shares_it_with_everything_else_there() {
        for (root, mount_point) in [
            ("/srv/data", "/"),
            ("/srv/nfs/volumes", "/srv/nfs"),
            ("/srv/nfs two/x", "/srv/nfs two"),
            // A name that merely begins like a mount point is not beneath it.
            ("/srv/nfsx", "/"),
        ] {
            let found = classify(root);
            assert_eq!(found.mount_point, Path::new(mount_point), "{root}");
            assert!(
                found
                    .shared
                    .as_deref()
                    .is_some_and(|why| why.contains(mount_point)),
                "{root}: {found:?}"
            );
        }
    }

    #[test]
    fn a_bind_or_subvolume_mount_shows_part_of_a_filesystem_only() {
        for root in ["/srv/sub", "/srv/bound"] {
            let found = classify(root);
            assert_eq!(found.mount_point, Path::new(root));
            assert!(
                found
                    .shared
                    .as_deref()
                    .is_some_and(|why| why.contains("bind or subvolume")),
                "{root}: {found:?}"
            );
        }
    }

    #[test]
    fn the_last_mount_on_a_mount_point_is_the_one_that_serves() {
        let table = "40 22 7:0 /part /srv/nfs rw - xfs /dev/loop0 rw\n\
                     44 40 7:3 / /srv/nfs rw - ext4 /dev/loop3 rw\n";
        let found = RootFilesystem::classify(Path::new("/srv/nfs"), table);
        assert_eq!(found.shared, None);
        let hidden = "44 40 7:3 / /srv/nfs rw - ext4 /dev/loop3 rw\n\
                      40 22 7:0 /part /srv/nfs rw - xfs /dev/loop0 rw\n";
        assert!(RootFilesystem::classify(Path::new("/srv/nfs"), hidden).is_shared());
    }

    #[test]
    fn this_machines_own_table_classifies_a_temporary_directory() {
        let dir = tempfile::tempdir().unwrap();
        let found = RootFilesystem::probe(dir.path()).unwrap();
        // A fresh temporary directory is never a mount point of its own.
        assert!(found.is_shared(), "{found:?}");
    }
}
