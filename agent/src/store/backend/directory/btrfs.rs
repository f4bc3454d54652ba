//! btrfs: each volume is a subvolume whose qgroup limits the bytes it references.
//!
//! A subvolume can be renamed like a directory as long as it stays inside the same parent
//! subvolume, and the agent's staging, trash and archive areas live in the export root's
//! subvolume, so creation keeps its set-up-then-rename shape. Deletion uses
//! `btrfs subvolume delete`, which hands the tree to the kernel's cleaner at once; the
//! kernel drops the qgroup of a fully cleaned subvolume by itself.

use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::Arc;

use crate::quota::command::{ToolCommand, ToolError, ToolRunner, path_through_fd};
use crate::subvolume::is_btrfs_magic;

/// What a subvolume snapshot is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SnapshotKind {
    /// A new volume (a clone or a restore): written from then on.
    Writable,
    /// A kept snapshot. Nothing can change it afterwards, not even a rename into another
    /// directory (its root's `..` would change), so it is made in the directory it stays
    /// in.
    ReadOnly,
}

#[derive(Debug, Clone)]
pub(crate) struct Btrfs {
    runner: Arc<dyn ToolRunner>,
}

impl Btrfs {
    /// Checks that the export root is on btrfs with quotas enabled.
    pub(crate) fn probe(runner: Arc<dyn ToolRunner>, export_root: &Path) -> Result<Self, String> {
        let stats = rustix::fs::statfs(export_root)
            .map_err(|e| format!("cannot statfs {}: {e}", export_root.display()))?;
        if !is_btrfs_magic(stats.f_type) {
            return Err(format!(
                "{} is not on a btrfs filesystem (statfs type {:#x})",
                export_root.display(),
                stats.f_type
            ));
        }
        let backend = Self { runner };
        match backend.btrfs(&["qgroup", "show", "--raw"], export_root) {
            Ok(_) => Ok(backend),
            Err(e) if e.stderr().contains("not enabled") => Err(format!(
                "quotas are not enabled on the btrfs filesystem holding {}; run `btrfs quota enable` on its mount point",
                export_root.display()
            )),
            Err(e) => Err(e.to_string()),
        }
    }

    /// A backend driving `runner` without probing a filesystem, for the store's tests.
    #[cfg(test)]
    pub(crate) fn for_tests(runner: Arc<dyn ToolRunner>) -> Self {
        Self { runner }
    }

    /// Makes `name` in `dir` a new, empty subvolume.
    pub(crate) fn create_subvolume(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<(), ToolError> {
        self.btrfs(&["subvolume", "create"], &path_through_fd(dir, Some(name)))
            .map(drop)
    }

    /// Makes `name` in `dir` a snapshot of the subvolume `source`, of `kind`.
    pub(crate) fn snapshot_subvolume(
        &self,
        source: BorrowedFd<'_>,
        dir: BorrowedFd<'_>,
        name: &str,
        kind: SnapshotKind,
    ) -> Result<(), ToolError> {
        let mut args = vec!["subvolume".to_owned(), "snapshot".to_owned()];
        if kind == SnapshotKind::ReadOnly {
            args.push("-r".to_owned());
        }
        args.push(path_through_fd(source, None).display().to_string());
        args.push(path_through_fd(dir, Some(name)).display().to_string());
        self.runner.run(&ToolCommand::new("btrfs", args)).map(drop)
    }

    /// Limits the bytes the subvolume `volume` references (its data and metadata).
    pub(crate) fn set_limit(
        &self,
        volume: BorrowedFd<'_>,
        capacity_bytes: u64,
    ) -> Result<(), ToolError> {
        self.btrfs(
            &["qgroup", "limit", &capacity_bytes.to_string()],
            &path_through_fd(volume, None),
        )
        .map(drop)
    }

    /// Bytes the subvolume references, as its qgroup counts them (updated by the kernel at
    /// each transaction commit).
    pub(crate) fn used_bytes(&self, volume: BorrowedFd<'_>) -> Result<u64, ToolError> {
        let command = ["qgroup", "show", "--raw", "-r", "-f"];
        let report = self.btrfs(&command, &path_through_fd(volume, None))?;
        parse_referenced(&report).ok_or_else(|| ToolError::Failed {
            command: format!("btrfs {}", command.join(" ")),
            status: "unexpected output".to_owned(),
            stderr: report.chars().take(500).collect(),
        })
    }

    /// Bytes only the subvolume references (its qgroup's exclusive count): what deleting
    /// it would free.
    pub(crate) fn exclusive_bytes(&self, volume: BorrowedFd<'_>) -> Result<u64, ToolError> {
        let command = ["qgroup", "show", "--raw", "-f"];
        let report = self.btrfs(&command, &path_through_fd(volume, None))?;
        parse_level_zero(&report, 1).ok_or_else(|| ToolError::Failed {
            command: format!("btrfs {}", command.join(" ")),
            status: "unexpected output".to_owned(),
            stderr: report.chars().take(500).collect(),
        })
    }

    /// Deletes the subvolume `name` in `dir` with everything in it.
    pub(crate) fn delete_subvolume(
        &self,
        dir: BorrowedFd<'_>,
        name: &str,
    ) -> Result<(), ToolError> {
        self.btrfs(&["subvolume", "delete"], &path_through_fd(dir, Some(name)))
            .map(drop)
    }

    fn btrfs(&self, args: &[&str], path: &Path) -> Result<String, ToolError> {
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        all.push(path.display().to_string());
        self.runner.run(&ToolCommand::new("btrfs", all))
    }
}

/// The referenced bytes of the level-0 qgroup in `btrfs qgroup show --raw -f` output.
fn parse_referenced(report: &str) -> Option<u64> {
    parse_level_zero(report, 0)
}

/// The figure in column `column` after the id (0: referenced, 1: exclusive) of the
/// level-0 qgroup in `btrfs qgroup show --raw -f` output.
fn parse_level_zero(report: &str, column: usize) -> Option<u64> {
    report.lines().find_map(|line| {
        let mut fields = line.split_whitespace();
        let id = fields.next()?;
        if !id.starts_with("0/") {
            return None;
        }
        fields.nth(column)?.parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;
    use crate::quota::command::MockToolRunner;

    #[test]
    fn commands_name_the_directory_through_the_agents_descriptor() {
        let runner = Arc::new(MockToolRunner::default());
        let backend = Btrfs {
            runner: runner.clone(),
        };
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let fd = path_through_fd(dir.as_fd(), None).display().to_string();
        backend.create_subvolume(dir.as_fd(), "new-1").unwrap();
        backend.set_limit(dir.as_fd(), 1 << 30).unwrap();
        runner.reply(Ok("Qgroupid Referenced Exclusive Max referenced Path\n\
             -------- ---------- --------- -------------- ----\n\
             0/257 4096 4096 1073741824 exp/ns/claim\n"));
        assert_eq!(backend.used_bytes(dir.as_fd()).unwrap(), 4096);
        backend
            .snapshot_subvolume(dir.as_fd(), dir.as_fd(), "snap-1", SnapshotKind::ReadOnly)
            .unwrap();
        runner.reply(Ok("Qgroupid Referenced Exclusive Max referenced Path\n\
             0/258 8192 1024 none .nfsprov/snapshots/snap-1\n"));
        assert_eq!(backend.exclusive_bytes(dir.as_fd()).unwrap(), 1024);
        backend.delete_subvolume(dir.as_fd(), "del-1").unwrap();
        assert_eq!(
            runner.calls(),
            [
                format!("btrfs subvolume create {fd}/new-1"),
                format!("btrfs qgroup limit 1073741824 {fd}"),
                format!("btrfs qgroup show --raw -r -f {fd}"),
                format!("btrfs subvolume snapshot -r {fd} {fd}/snap-1"),
                format!("btrfs qgroup show --raw -f {fd}"),
                format!("btrfs subvolume delete {fd}/del-1"),
            ]
        );
    }

    #[test]
    fn usage_report_without_a_level_zero_qgroup_is_an_error() {
        let runner = Arc::new(MockToolRunner::default());
        let backend = Btrfs {
            runner: runner.clone(),
        };
        runner.reply(Ok("Qgroupid Referenced\n1/0 5 \n"));
        let dir = std::fs::File::open(std::env::temp_dir()).unwrap();
        let err = backend.used_bytes(dir.as_fd()).unwrap_err();
        assert!(err.to_string().contains("unexpected output"), "{err}");
    }

    #[test]
    fn probe_refuses_a_root_not_on_btrfs() {
        // The temporary directory is on the test machine's root filesystem, not btrfs.
        let dir = tempfile::tempdir().unwrap();
        let err = Btrfs::probe(Arc::new(MockToolRunner::default()), dir.path()).unwrap_err();
        assert!(err.contains("is not on a btrfs filesystem"), "{err}");
    }
}
