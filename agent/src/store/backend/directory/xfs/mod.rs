//! Project quotas through `xfs_quota`: every volume directory carries a project id of its
//! own, inherited by everything created beneath it (the PROJINHERIT flag), and the project
//! has a hard block limit equal to the volume's capacity.
//!
//! XFS is the native case. ext4 keeps project quotas the same way and `xfs_quota` drives
//! it with the same commands in its foreign-filesystem mode (`-f`); without `-f` every
//! command silently does nothing on ext4.
//!
//! `xfs_quota` reports several failures on stderr while still exiting 0: a mount point it
//! cannot find, a path it decides to skip, a quota it cannot read. Each change is therefore
//! read back before it counts as done: the tag with `project -c`, the limit with `quota`.
//!
//! `commands` builds the tool's command lines, `parse` reads its output; this module
//! orchestrates: probing, id allocation, tagging and limiting with read-back.

mod commands;
mod parse;

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::os::fd::BorrowedFd;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nfsprov_api_types::VolumeUsage;

use self::commands::{Commands, MAX_BLOCK_SIZE, TOOL, limit_bytes};
use self::parse::{
    FilesystemKind, QuotaRecord, QuotaState, filesystem_kind, find_mount, parse_quota_record,
    parse_state,
};
use crate::quota::command::{ToolCommand, ToolError, ToolRunner, one_line, path_through_fd};

/// What went wrong while managing a project quota.
#[derive(Debug, Clone, thiserror::Error)]
pub enum XfsError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error("every project id in {first}-{last} is in use; widen the configured id range")]
    IdsExhausted { first: u32, last: u32 },
    /// The tool exited successfully, but reading back shows the change did not happen.
    #[error("`{command}` did not take effect: {problem}")]
    NotApplied { command: String, problem: String },
    #[error("`{command}` printed output that could not be read: {output:?}")]
    UnexpectedOutput { command: String, output: String },
}

/// The project quota backend of one filesystem, the one holding the export root.
///
/// Every method runs `xfs_quota` to its end and so blocks; call it off the async runtime.
#[derive(Debug)]
pub struct Xfs {
    runner: Arc<dyn ToolRunner>,
    commands: Commands,
    ids: RangeInclusive<u32>,
    /// Ids held by volumes, archives and creations in progress.
    in_use: Mutex<BTreeSet<u32>>,
}

impl Xfs {
    /// Checks that `export_root` is on XFS (or ext4) with project quota accounting and
    /// enforcement on, and that `ids` is usable. The error is one line saying what is
    /// wrong and how to fix it.
    pub fn probe(
        runner: Arc<dyn ToolRunner>,
        export_root: &Path,
        ids: RangeInclusive<u32>,
    ) -> Result<Self, String> {
        check_id_range(&ids)?;
        let filesystem = QuotaFilesystem::containing(export_root)?;
        Self::on_filesystem(runner, filesystem, ids)
    }

    fn on_filesystem(
        runner: Arc<dyn ToolRunner>,
        filesystem: QuotaFilesystem,
        ids: RangeInclusive<u32>,
    ) -> Result<Self, String> {
        let backend = Self {
            runner,
            commands: Commands {
                mount_point: filesystem.mount_point,
                kind: filesystem.kind,
            },
            ids,
            in_use: Mutex::new(BTreeSet::new()),
        };
        let state = backend.commands.state();
        let output = backend.runner.run(&state).map_err(|e| match e {
            ToolError::NotStarted { reason, .. } => {
                format!("cannot run {TOOL} ({reason}); install xfsprogs")
            }
            e => one_line(&format!(
                "cannot read the project quota state of {}: {e}",
                backend.commands.mount_point
            )),
        })?;
        match parse_state(&output) {
            QuotaState::Enforced => Ok(backend),
            QuotaState::NotEnabled | QuotaState::Accounted { accounting: false } => {
                Err(backend.not_enabled(&filesystem.device))
            }
            QuotaState::Accounted { accounting: true } => Err(backend.not_enforced()),
            QuotaState::Unrecognised => Err(format!(
                "{TOOL} does not recognise {} as a mounted filesystem (its state report was empty)",
                backend.commands.mount_point
            )),
        }
    }

    fn not_enabled(&self, device: &str) -> String {
        let mount = &self.commands.mount_point;
        match self.commands.kind {
            FilesystemKind::Xfs => format!(
                "project quotas are not enabled on {mount} ({device}, XFS): mount it with -o prjquota \
                 (for the root filesystem: rootflags=prjquota); if that mount is refused, the kernel \
                 lacks XFS quota support (CONFIG_XFS_QUOTA)"
            ),
            FilesystemKind::Ext4 => format!(
                "project quotas are not enabled on {mount} ({device}, ext4): run tune2fs -O project,quota \
                 on the unmounted device, then mount it with -o prjquota"
            ),
        }
    }

    fn not_enforced(&self) -> String {
        let mount = &self.commands.mount_point;
        match self.commands.kind {
            FilesystemKind::Xfs => format!(
                "project quotas on {mount} are counted but not enforced: run {TOOL} -x -c 'enable -p' {mount}, \
                 and mount it with prjquota instead of pqnoenforce"
            ),
            FilesystemKind::Ext4 => format!(
                "project quotas on {mount} are counted but not enforced: mount it with -o prjquota"
            ),
        }
    }

    /// Records ids that existing volumes and archives carry, so they are never handed out.
    pub fn mark_in_use(&self, ids: impl IntoIterator<Item = u32>) {
        self.in_use().extend(ids);
    }

    /// Gives the new, still empty directory `dir` a project id of its own and limits the
    /// project to `capacity_bytes`; returns the id. On failure the id is free again and
    /// neither the tag nor a limit is left behind.
    pub fn limit_new(&self, dir: BorrowedFd<'_>, capacity_bytes: u64) -> Result<u32, XfsError> {
        // "/." makes the tool open the directory itself: given the bare /proc path it sees a
        // symlink, skips it as a special file, and still exits 0. The path has no spaces
        // either, which matters because xfs_quota splits its -c command on whitespace.
        let target = path_through_fd(dir, Some(".")).display().to_string();
        let id = self.allocate()?;
        if let Err(e) = self.tag(id, &target) {
            self.untag_after_failure(id, &target);
            self.free(id);
            return Err(e);
        }
        if let Err(e) = self.apply_limit(id, capacity_bytes) {
            self.clear_limits_after_failure(id);
            self.untag_after_failure(id, &target);
            self.free(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Sets the project's hard block limit to `capacity_bytes` (rounded up to whole KiB).
    pub fn set_limit(&self, project_id: u32, capacity_bytes: u64) -> Result<(), XfsError> {
        self.apply_limit(project_id, capacity_bytes)
    }

    /// Space and inodes charged to the project, from the quota report.
    pub fn usage(&self, project_id: u32) -> Result<VolumeUsage, XfsError> {
        let command = self.commands.quota_report(project_id);
        match self.quota_record(&command)? {
            Some(record) => Ok(VolumeUsage {
                used_bytes: record.used_kib.saturating_mul(1024),
                used_inodes: record.used_inodes,
            }),
            // A project that carries a limit always has a record; none means the limit
            // was removed behind the agent's back, or the mount vanished.
            None => Err(XfsError::NotApplied {
                command: command.to_string(),
                problem: format!("no quota record for project {project_id}"),
            }),
        }
    }

    /// Once the volume's tree is gone: removes the project's limits and frees its id. When
    /// the limits cannot be cleared, the id stays reserved so it is not reused meanwhile.
    pub fn release(&self, project_id: u32) -> Result<(), XfsError> {
        self.runner.run(&self.commands.clear_limits(project_id))?;
        self.free(project_id);
        Ok(())
    }

    /// Reserves the lowest id that is neither known to be in use nor charged on the
    /// filesystem. A charged id is skipped only this time: files of a deleted volume can
    /// stay charged for a moment while the kernel finishes freeing them in the background.
    fn allocate(&self) -> Result<u32, XfsError> {
        let mut skipped = Vec::new();
        let allocated = loop {
            let id = match self.reserve_lowest_free() {
                Ok(id) => id,
                Err(e) => break Err(e),
            };
            let command = self.commands.quota_report(id);
            match self.quota_record(&command) {
                Ok(Some(record)) if record.used_kib > 0 || record.used_inodes > 0 => {
                    tracing::warn!(
                        project_id = id,
                        used_kib = record.used_kib,
                        used_inodes = record.used_inodes,
                        "project id is charged on the filesystem but no volume claims it; skipping it \
                         (if this persists, something else uses ids of the configured range)"
                    );
                    skipped.push(id);
                }
                Ok(_) => break Ok(id),
                Err(e) => {
                    self.free(id);
                    break Err(e);
                }
            }
        };
        for id in skipped {
            self.free(id);
        }
        allocated
    }

    fn reserve_lowest_free(&self) -> Result<u32, XfsError> {
        let (first, last) = (*self.ids.start(), *self.ids.end());
        let mut in_use = self.in_use();
        let mut candidate = first;
        // The set iterates in ascending order, so the first gap is the lowest free id.
        for &taken in in_use.range(first..=last) {
            if taken != candidate {
                break;
            }
            candidate += 1;
        }
        // `last` < u32::MAX (see check_id_range), so the increment above cannot overflow.
        if candidate > last {
            return Err(XfsError::IdsExhausted { first, last });
        }
        in_use.insert(candidate);
        Ok(candidate)
    }

    fn free(&self, id: u32) {
        self.in_use().remove(&id);
    }

    fn in_use(&self) -> MutexGuard<'_, BTreeSet<u32>> {
        // The set is valid after any panic: every change is a single insert or remove.
        self.in_use.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn tag(&self, id: u32, target: &str) -> Result<(), XfsError> {
        self.runner.run(&self.commands.tag(target, id))?;
        let check = self.commands.check_tag(target, id);
        let report = self.runner.run(&check)?;
        // The check names every inode whose id or inheritance flag is wrong, and says
        // "Checking project" only once it found the path on the filesystem. It cannot tell
        // a path it skipped as a symlink; the "/." of the target rules that case out.
        let wrong: Vec<&str> = report
            .lines()
            .filter(|line| line.contains(" is not set"))
            .collect();
        if !report.contains("Checking project") || !wrong.is_empty() {
            let problem = if wrong.is_empty() {
                format!("{target} was not checked")
            } else {
                wrong.join("; ")
            };
            return Err(XfsError::NotApplied {
                command: check.to_string(),
                problem,
            });
        }
        Ok(())
    }

    fn apply_limit(&self, id: u32, capacity_bytes: u64) -> Result<(), XfsError> {
        let limit = limit_bytes(capacity_bytes);
        self.runner.run(&self.commands.set_hard_limit(id, limit))?;
        let command = self.commands.quota_report(id);
        let applied = self
            .quota_record(&command)?
            .map(|record| record.hard_kib.saturating_mul(1024));
        match applied {
            Some(hard) if hard >= limit && hard - limit < MAX_BLOCK_SIZE => Ok(()),
            other => Err(XfsError::NotApplied {
                command: command.to_string(),
                problem: format!(
                    "the hard limit of project {id} reads {} instead of {limit} bytes",
                    other.map_or_else(|| "nothing".to_owned(), |hard| format!("{hard} bytes"))
                ),
            }),
        }
    }

    fn untag_after_failure(&self, id: u32, target: &str) {
        let command = self.commands.untag(target, id);
        if let Err(e) = self.runner.run(&command) {
            tracing::warn!(project_id = id, error = %e, "could not remove the project tag after a failed creation");
        }
    }

    fn clear_limits_after_failure(&self, id: u32) {
        if let Err(e) = self.runner.run(&self.commands.clear_limits(id)) {
            tracing::warn!(project_id = id, error = %e, "could not clear the project limit after a failed creation");
        }
    }

    fn quota_record(&self, command: &ToolCommand) -> Result<Option<QuotaRecord>, XfsError> {
        let output = self.runner.run(command)?;
        parse_quota_record(&output).ok_or_else(|| XfsError::UnexpectedOutput {
            command: command.to_string(),
            output,
        })
    }
}

fn check_id_range(ids: &RangeInclusive<u32>) -> Result<(), String> {
    let (first, last) = (*ids.start(), *ids.end());
    if first == 0 {
        Err("project id 0 is the default project and never limited; start the id range at 1 or above".into())
    } else if first > last {
        Err(format!("the project id range {first}-{last} is empty"))
    } else if last == u32::MAX {
        Err(format!(
            "project id {} is reserved as \"invalid\" by xfs_quota; end the id range below it",
            u32::MAX
        ))
    } else {
        Ok(())
    }
}

/// The filesystem holding the export root, as `xfs_quota` must be pointed at it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QuotaFilesystem {
    mount_point: String,
    device: String,
    kind: FilesystemKind,
}

impl QuotaFilesystem {
    fn containing(export_root: &Path) -> Result<Self, String> {
        let shown = export_root.display();
        let root =
            std::fs::canonicalize(export_root).map_err(|e| format!("export root {shown}: {e}"))?;
        let status = rustix::fs::stat(&root).map_err(|e| format!("export root {shown}: {e}"))?;
        let magic = rustix::fs::statfs(&root)
            .map_err(|e| format!("export root {shown}: {e}"))?
            .f_type as u32;
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo")
            .map_err(|e| format!("cannot read /proc/self/mountinfo: {e}"))?;
        let mount = find_mount(
            &mountinfo,
            &root,
            rustix::fs::major(status.st_dev),
            rustix::fs::minor(status.st_dev),
        );
        let Some(kind) = filesystem_kind(magic) else {
            let what = mount.as_ref().map_or_else(
                || format!("filesystem type {magic:#x}"),
                |m| m.fstype.clone(),
            );
            return Err(format!(
                "export root {shown} is on {what}, not XFS or ext4: project quotas need the export root \
                 on XFS mounted with prjquota (or ext4 with the project and quota features)"
            ));
        };
        let mount = mount.ok_or_else(|| {
            format!("cannot find the mount point of export root {shown} in /proc/self/mountinfo")
        })?;
        let mount_point = mount
            .mount_point
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| {
                format!(
                    "the mount point {} of export root {shown} is not UTF-8",
                    mount.mount_point.display()
                )
            })?;
        Ok(Self {
            mount_point,
            device: mount.source,
            kind,
        })
    }
}

#[cfg(test)]
pub(crate) mod tests;
