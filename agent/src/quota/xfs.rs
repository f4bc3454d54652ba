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

use std::collections::BTreeSet;
use std::ops::RangeInclusive;
use std::os::fd::BorrowedFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use nfsprov_api_types::VolumeUsage;

use super::command::{ToolCommand, ToolError, ToolRunner, one_line, path_through_fd};

const TOOL: &str = "xfs_quota";
/// `statfs` magic numbers of the filesystems `xfs_quota` can manage project quotas on.
const XFS_SUPER_MAGIC: u32 = 0x5846_5342;
const EXT4_SUPER_MAGIC: u32 = 0xEF53;
/// Limits are set in whole KiB: the quota report counts KiB, so such a limit reads back
/// exactly instead of rounded down.
const LIMIT_UNIT: u64 = 1024;
/// The kernel rounds a limit up to whole filesystem blocks, which are at most this big.
const MAX_BLOCK_SIZE: u64 = 64 * 1024;
/// Read by `xfs_quota -D` instead of `/etc/projects`: an operator's own entry there with
/// one of our ids would otherwise be tagged along with our directory.
const NO_PROJECTS_FILE: &str = "/dev/null";

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
    mount_point: String,
    kind: FilesystemKind,
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
            mount_point: filesystem.mount_point,
            kind: filesystem.kind,
            ids,
            in_use: Mutex::new(BTreeSet::new()),
        };
        // Without -v, xfs_quota prints nothing at all when project quotas are off.
        let state = backend.xfs_quota("state -p -v".to_owned());
        let output = backend.runner.run(&state).map_err(|e| match e {
            ToolError::NotStarted { reason, .. } => {
                format!("cannot run {TOOL} ({reason}); install xfsprogs")
            }
            e => one_line(&format!(
                "cannot read the project quota state of {}: {e}",
                backend.mount_point
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
                backend.mount_point
            )),
        }
    }

    fn not_enabled(&self, device: &str) -> String {
        let mount = &self.mount_point;
        match self.kind {
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
        let mount = &self.mount_point;
        match self.kind {
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
        let command = self.quota_report_command(project_id);
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
        self.runner.run(&self.clear_limits_command(project_id))?;
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
            let command = self.quota_report_command(id);
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
        self.runner
            .run(&self.project_command(format!("project -s -p {target} {id}")))?;
        let check = self.project_command(format!("project -c -p {target} {id}"));
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
        self.runner
            .run(&self.xfs_quota(format!("limit -p bhard={limit} {id}")))?;
        let command = self.quota_report_command(id);
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
        let command = self.project_command(format!("project -C -p {target} {id}"));
        if let Err(e) = self.runner.run(&command) {
            tracing::warn!(project_id = id, error = %e, "could not remove the project tag after a failed creation");
        }
    }

    fn clear_limits_after_failure(&self, id: u32) {
        if let Err(e) = self.runner.run(&self.clear_limits_command(id)) {
            tracing::warn!(project_id = id, error = %e, "could not clear the project limit after a failed creation");
        }
    }

    fn clear_limits_command(&self, id: u32) -> ToolCommand {
        self.xfs_quota(format!("limit -p bsoft=0 bhard=0 isoft=0 ihard=0 {id}"))
    }

    fn quota_report_command(&self, id: u32) -> ToolCommand {
        // -v prints the record even when all its figures are zero, -n skips name lookups,
        // -N drops the header; blocks are counted in KiB.
        self.xfs_quota(format!("quota -p -v -N -n -b -i {id}"))
    }

    fn quota_record(&self, command: &ToolCommand) -> Result<Option<QuotaRecord>, XfsError> {
        let output = self.runner.run(command)?;
        parse_quota_record(&output).ok_or_else(|| XfsError::UnexpectedOutput {
            command: command.to_string(),
            output,
        })
    }

    fn xfs_quota(&self, subcommand: String) -> ToolCommand {
        self.command_with(&[], subcommand)
    }

    fn project_command(&self, subcommand: String) -> ToolCommand {
        self.command_with(&["-D", NO_PROJECTS_FILE], subcommand)
    }

    fn command_with(&self, options: &[&str], subcommand: String) -> ToolCommand {
        let mut args = vec!["-x".to_owned()];
        if self.kind == FilesystemKind::Ext4 {
            args.push("-f".to_owned());
        }
        args.extend(options.iter().map(|o| (*o).to_owned()));
        args.push("-c".to_owned());
        args.push(subcommand);
        args.push(self.mount_point.clone());
        ToolCommand::new(TOOL, args)
    }
}

/// The byte count handed to `limit -p bhard=`: a bare number there means bytes. Rounded up
/// to whole KiB, and never 0, because a hard limit of 0 means "no limit".
fn limit_bytes(capacity_bytes: u64) -> u64 {
    // xfs_quota parses the number as a signed 64-bit value and clamps larger ones silently.
    let largest = i64::MAX as u64 / LIMIT_UNIT * LIMIT_UNIT;
    capacity_bytes
        .div_ceil(LIMIT_UNIT)
        .max(1)
        .saturating_mul(LIMIT_UNIT)
        .min(largest)
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum FilesystemKind {
    Xfs,
    /// Driven through xfs_quota's foreign-filesystem mode.
    Ext4,
}

fn filesystem_kind(magic: u32) -> Option<FilesystemKind> {
    match magic {
        XFS_SUPER_MAGIC => Some(FilesystemKind::Xfs),
        EXT4_SUPER_MAGIC => Some(FilesystemKind::Ext4),
        _ => None,
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

#[derive(Debug, Clone, PartialEq, Eq)]
struct MountEntry {
    mount_point: PathBuf,
    fstype: String,
    source: String,
}

/// The mount `path` is reached through: among the entries of the device `major:minor`,
/// the one with the longest mount point above `path`, the later one when two are equal
/// (it was mounted over the other). Checking the device keeps a different filesystem
/// mounted on a parent directory from being taken for ours.
fn find_mount(mountinfo: &str, path: &Path, major: u32, minor: u32) -> Option<MountEntry> {
    let device = format!("{major}:{minor}");
    let mut best: Option<MountEntry> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 || fields[2] != device {
            continue;
        }
        let mount_point = PathBuf::from(unescape_mountinfo(fields[4]));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let after_separator = fields.iter().skip(6).skip_while(|f| **f != "-").skip(1);
        let mut after_separator = after_separator.map(|f| unescape_mountinfo(f));
        let fstype = after_separator.next().unwrap_or_default();
        let source = after_separator.next().unwrap_or_default();
        let deeper_or_later = best
            .as_ref()
            .is_none_or(|b| mount_point.components().count() >= b.mount_point.components().count());
        if deeper_or_later {
            best = Some(MountEntry {
                mount_point,
                fstype,
                source,
            });
        }
    }
    best
}

/// mountinfo writes space, tab, newline and backslash in names as octal escapes (`\040`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escape = bytes
            .get(i + 1..i + 4)
            .filter(|digits| bytes[i] == b'\\' && digits.iter().all(|d| (b'0'..=b'7').contains(d)));
        match escape {
            Some(digits) => {
                let value = digits
                    .iter()
                    .fold(0u32, |value, d| value * 8 + u32::from(d - b'0'));
                out.push(value as u8);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QuotaState {
    Enforced,
    Accounted {
        accounting: bool,
    },
    /// "Project quota are not enabled on <device>": the filesystem was mounted without it.
    NotEnabled,
    /// Nothing printed: xfs_quota did not find the mount (it says so on stderr only).
    Unrecognised,
}

/// Reads the answer of `state -p -v`.
fn parse_state(output: &str) -> QuotaState {
    let mut lines = output
        .lines()
        .map(str::trim)
        .skip_while(|line| !line.starts_with("Project quota state on"));
    if lines.next().is_none() {
        return if output.contains("quota are not enabled") {
            QuotaState::NotEnabled
        } else {
            QuotaState::Unrecognised
        };
    }
    let (mut accounting, mut enforcement) = (false, false);
    for line in lines {
        if let Some(value) = line.strip_prefix("Accounting:") {
            accounting = value.trim() == "ON";
        } else if let Some(value) = line.strip_prefix("Enforcement:") {
            enforcement = value.trim() == "ON";
        }
    }
    if accounting && enforcement {
        QuotaState::Enforced
    } else {
        QuotaState::Accounted { accounting }
    }
}

/// One project's line of `quota -p -v -N -n -b -i`, blocks in KiB.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct QuotaRecord {
    used_kib: u64,
    hard_kib: u64,
    used_inodes: u64,
}

/// `None` when the output is not a quota line; `Some(None)` when there is no record.
///
/// The line is: device, then for blocks and for inodes each "used soft hard warnings
/// [timer]", then the mount point. A long device name is followed by a line break. The
/// timer may contain spaces ("[6 days 23:59:58]") but is always in brackets.
fn parse_quota_record(output: &str) -> Option<Option<QuotaRecord>> {
    if output.trim().is_empty() {
        return Some(None);
    }
    let fields = report_fields(output);
    let number = |index: usize| fields.get(index)?.parse::<u64>().ok();
    let timer = |index: usize| fields.get(index).is_some_and(|f| f.starts_with('['));
    if !(timer(5) && timer(10) && fields.len() >= 12) {
        return None;
    }
    number(2)?;
    number(4)?;
    number(7)?;
    number(8)?;
    number(9)?;
    Some(Some(QuotaRecord {
        used_kib: number(1)?,
        hard_kib: number(3)?,
        used_inodes: number(6)?,
    }))
}

/// Splits on whitespace, keeping a bracketed field with spaces in it whole.
fn report_fields(text: &str) -> Vec<&str> {
    let mut fields = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let end = if rest.starts_with('[') {
            rest.find(']').map_or(rest.len(), |i| i + 1)
        } else {
            rest.find(char::is_whitespace).unwrap_or(rest.len())
        };
        fields.push(&rest[..end]);
        rest = rest[end..].trim_start();
    }
    fields
}

#[cfg(test)]
pub(crate) mod tests {
    use std::collections::HashMap;
    use std::os::fd::AsFd;

    use super::*;
    use crate::quota::command::MockToolRunner;

    const MOUNT: &str = "/srv/export";

    /// A backend driving `runner` as if the export root were on an XFS mount.
    pub(crate) fn xfs_backend_for_tests(runner: Arc<dyn ToolRunner>) -> Xfs {
        backend_with(runner, FilesystemKind::Xfs)
    }

    impl FakeXfsQuota {
        /// The hard block limit of a project, in KiB, if one is set.
        pub(crate) fn limit_kib(&self, id: u32) -> Option<u64> {
            self.limits_kib.lock().unwrap().get(&id).copied()
        }
    }

    fn backend_with(runner: Arc<dyn ToolRunner>, kind: FilesystemKind) -> Xfs {
        Xfs {
            runner,
            mount_point: MOUNT.to_owned(),
            kind,
            ids: 1000..=1999,
            in_use: Mutex::new(BTreeSet::new()),
        }
    }

    fn backend() -> (Arc<MockToolRunner>, Xfs) {
        let runner = Arc::new(MockToolRunner::default());
        let xfs = backend_with(runner.clone(), FilesystemKind::Xfs);
        (runner, xfs)
    }

    fn a_directory() -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        (dir, fd)
    }

    fn target_of(fd: &std::fs::File) -> String {
        path_through_fd(fd.as_fd(), Some(".")).display().to_string()
    }

    /// A line as `quota -p -v -N -n -b -i` prints it.
    fn quota_line(used_kib: u64, hard_kib: u64, inodes: u64) -> String {
        format!(
            "/dev/sdb1           {used_kib:>10} {:>10} {hard_kib:>10}   00 [--------] {inodes:>10} {:>10} {:>10}   00 [--------] {MOUNT}\n",
            0, 0, 0
        )
    }

    fn checked(target: &str, id: u32) -> String {
        format!(
            "Checking project {id} (path {target})...\n\
             Processed 1 (/dev/null and cmdline) paths for project {id} with recursion depth infinite (-1).\n"
        )
    }

    fn failed(command: &str, stderr: &str) -> ToolError {
        ToolError::Failed {
            command: command.to_owned(),
            status: "exit status: 1".to_owned(),
            stderr: stderr.to_owned(),
        }
    }

    /// The replies of a creation that goes through, for the mock's queue.
    fn queue_successful_creation(runner: &MockToolRunner, target: &str, id: u32, hard_kib: u64) {
        runner
            .reply(Ok(""))
            .reply(Ok(""))
            .reply(Ok(&checked(target, id)))
            .reply(Ok(""))
            .reply(Ok(&quota_line(0, hard_kib, 1)));
    }

    #[test]
    fn creating_tags_the_directory_then_limits_and_reads_both_back() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        let target = target_of(&fd);
        queue_successful_creation(&runner, &target, 1000, 1024);

        assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1000);
        assert_eq!(
            runner.calls(),
            [
                format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
                format!("xfs_quota -x -D /dev/null -c project -s -p {target} 1000 {MOUNT}"),
                format!("xfs_quota -x -D /dev/null -c project -c -p {target} 1000 {MOUNT}"),
                format!("xfs_quota -x -c limit -p bhard=1048576 1000 {MOUNT}"),
                format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
            ]
        );
        // The tool reaches the very directory the agent holds open, not a symlink to it.
        assert!(target.ends_with("/."), "{target}");
        assert!(
            target.starts_with(&format!("/proc/{}/fd/", std::process::id())),
            "{target}"
        );
    }

    #[test]
    fn ext4_is_driven_in_foreign_mode() {
        let runner = Arc::new(MockToolRunner::default());
        let xfs = backend_with(runner.clone(), FilesystemKind::Ext4);
        runner.reply(Ok(""));
        xfs.release(1234).unwrap();
        assert_eq!(
            runner.calls(),
            [format!(
                "xfs_quota -x -f -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1234 {MOUNT}"
            )]
        );
    }

    #[test]
    fn limits_are_whole_kib_and_never_zero() {
        assert_eq!(limit_bytes(0), 1024);
        assert_eq!(limit_bytes(1), 1024);
        assert_eq!(limit_bytes(1024), 1024);
        assert_eq!(limit_bytes(1025), 2048);
        assert_eq!(limit_bytes(5 << 30), 5 << 30);
        let huge = limit_bytes(u64::MAX);
        assert!(
            huge <= i64::MAX as u64 && huge.is_multiple_of(1024),
            "{huge}"
        );
    }

    #[test]
    fn resizing_sets_the_hard_limit_and_reads_it_back() {
        let (runner, xfs) = backend();
        // 3 GiB plus one byte is rounded up to the next KiB; the kernel may round further
        // up to a whole filesystem block (4 KiB here).
        let capacity = (3 << 30) + 1;
        runner
            .reply(Ok(""))
            .reply(Ok(&quota_line(52, (3 << 20) + 4, 7)));
        xfs.set_limit(1007, capacity).unwrap();
        assert_eq!(
            runner.calls(),
            [
                format!("xfs_quota -x -c limit -p bhard=3221226496 1007 {MOUNT}"),
                format!("xfs_quota -x -c quota -p -v -N -n -b -i 1007 {MOUNT}"),
            ]
        );
    }

    #[test]
    fn a_limit_that_does_not_read_back_is_an_error() {
        let (runner, xfs) = backend();
        // The tool exits 0 without setting anything when it cannot find the mount.
        runner.reply(Ok("")).reply(Ok(""));
        let err = xfs.set_limit(1007, 1 << 20).unwrap_err();
        assert!(matches!(err, XfsError::NotApplied { .. }), "{err}");
        assert!(err.to_string().contains("reads nothing"), "{err}");

        runner.reply(Ok("")).reply(Ok(&quota_line(0, 512, 0)));
        let err = xfs.set_limit(1007, 1 << 20).unwrap_err();
        assert!(
            err.to_string()
                .contains("reads 524288 bytes instead of 1048576"),
            "{err}"
        );
    }

    #[test]
    fn usage_comes_from_the_quota_report_in_kib() {
        let (runner, xfs) = backend();
        runner.reply(Ok(&quota_line(2_097_152, 4_194_304, 4812)));
        assert_eq!(
            xfs.usage(1003).unwrap(),
            VolumeUsage {
                used_bytes: 2 << 30,
                used_inodes: 4812,
            }
        );
        assert_eq!(
            runner.calls(),
            [format!(
                "xfs_quota -x -c quota -p -v -N -n -b -i 1003 {MOUNT}"
            )]
        );
    }

    #[test]
    fn quota_lines_with_long_devices_and_running_timers_are_read() {
        // A device name longer than its column pushes the figures onto the next line; a
        // soft limit overrun shows a timer with spaces; a hard limit overrun "[--none--]".
        let output = "/dev/mapper/vg0-export--data\n                    \
                      5242884    4194304    5242880   00 [--none--]         12         10          0   00 [6 days 23:59:58] /srv/nfs export\n";
        assert_eq!(
            parse_quota_record(output),
            Some(Some(QuotaRecord {
                used_kib: 5_242_884,
                hard_kib: 5_242_880,
                used_inodes: 12,
            }))
        );
        assert_eq!(parse_quota_record("\n"), Some(None));
        assert_eq!(parse_quota_record("xfs_quota: cannot find mount"), None);
        assert_eq!(
            parse_quota_record("/dev/sdb1 12 0 100 00 [--------] 3 0 0 00 [--------]"),
            None,
            "the mount point is missing"
        );
    }

    #[test]
    fn usage_without_a_record_or_with_garbage_is_an_error() {
        let (runner, xfs) = backend();
        runner.reply(Ok(""));
        let err = xfs.usage(1003).unwrap_err();
        assert!(
            err.to_string().contains("no quota record for project 1003"),
            "{err}"
        );
        runner.reply(Ok("Disk quotas for Project #1003 (1003)\n"));
        let err = xfs.usage(1003).unwrap_err();
        assert!(matches!(err, XfsError::UnexpectedOutput { .. }), "{err}");
    }

    #[test]
    fn release_clears_every_limit_and_frees_the_id() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        let target = target_of(&fd);
        queue_successful_creation(&runner, &target, 1000, 1024);
        assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1000);

        xfs.release(1000).unwrap();
        assert_eq!(
            runner.calls().last().unwrap(),
            &format!("xfs_quota -x -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1000 {MOUNT}")
        );
        queue_successful_creation(&runner, &target, 1000, 1024);
        assert_eq!(
            xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(),
            1000,
            "a freed id is reused"
        );
    }

    #[test]
    fn a_failed_release_keeps_the_id_reserved() {
        let (runner, xfs) = backend();
        xfs.mark_in_use([1000]);
        runner.reply(Err(failed(
            "xfs_quota",
            "xfs_quota: cannot set limits: Input/output error",
        )));
        let err = xfs.release(1000).unwrap_err();
        assert!(err.to_string().contains("Input/output error"), "{err}");
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1001);
    }

    #[test]
    fn ids_are_the_lowest_free_ones_in_the_range() {
        let (_runner, xfs) = backend();
        xfs.mark_in_use([1000, 1001, 1003, 5]);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1002);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1004);
        xfs.free(1001);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1001);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1005);
    }

    #[test]
    fn exhausted_ids_are_a_clear_error() {
        let runner = Arc::new(MockToolRunner::default());
        let xfs = Xfs {
            ids: 7..=8,
            ..backend_with(runner.clone(), FilesystemKind::Xfs)
        };
        xfs.mark_in_use([7]);
        let (_dir, fd) = a_directory();
        queue_successful_creation(&runner, &target_of(&fd), 8, 4);
        assert_eq!(xfs.limit_new(fd.as_fd(), 4096).unwrap(), 8);

        let calls_before = runner.calls().len();
        let err = xfs.limit_new(fd.as_fd(), 4096).unwrap_err();
        assert!(matches!(err, XfsError::IdsExhausted { .. }), "{err}");
        assert_eq!(
            err.to_string(),
            "every project id in 7-8 is in use; widen the configured id range"
        );
        assert_eq!(runner.calls().len(), calls_before, "nothing was run");
    }

    #[test]
    fn ids_charged_on_the_filesystem_are_skipped_this_time() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        let target = target_of(&fd);
        // Id 1000 has files charged to it that no volume of the agent accounts for.
        runner.reply(Ok(&quota_line(8, 0, 2)));
        queue_successful_creation(&runner, &target, 1001, 1024);
        assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1001);
        assert_eq!(
            runner.calls()[..2],
            [
                format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
                format!("xfs_quota -x -c quota -p -v -N -n -b -i 1001 {MOUNT}"),
            ]
        );
        // Not kept: the charge may be a deleted volume's files still being freed.
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1002);
    }

    #[test]
    fn running_out_while_skipping_charged_ids_frees_them() {
        let runner = Arc::new(MockToolRunner::default());
        let xfs = Xfs {
            ids: 7..=8,
            ..backend_with(runner.clone(), FilesystemKind::Xfs)
        };
        runner
            .reply(Ok(&quota_line(4, 0, 1)))
            .reply(Ok(&quota_line(0, 0, 3)));
        let (_dir, fd) = a_directory();
        let err = xfs.limit_new(fd.as_fd(), 4096).unwrap_err();
        assert!(matches!(err, XfsError::IdsExhausted { .. }), "{err}");
        assert_eq!(runner.calls().len(), 2, "only the two lookups ran");
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 7);
    }

    #[test]
    fn a_failed_limit_undoes_the_tag_and_frees_the_id() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        let target = target_of(&fd);
        runner
            .reply(Ok(""))
            .reply(Ok(""))
            .reply(Ok(&checked(&target, 1000)))
            .reply(Err(failed(
                "xfs_quota",
                "xfs_quota: cannot set limits: Function not implemented",
            )));
        let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
        assert!(
            err.to_string().contains("Function not implemented"),
            "{err}"
        );
        assert_eq!(
            runner.calls()[4..],
            [
                format!("xfs_quota -x -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1000 {MOUNT}"),
                format!("xfs_quota -x -D /dev/null -c project -C -p {target} 1000 {MOUNT}"),
            ]
        );
        assert_eq!(
            xfs.reserve_lowest_free().unwrap(),
            1000,
            "the id is free again"
        );
    }

    #[test]
    fn a_tag_that_did_not_take_is_undone_and_the_id_freed() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        let target = target_of(&fd);
        runner.reply(Ok("")).reply(Ok("")).reply(Ok(&format!(
            "Checking project 1000 (path {target})...\n\
             {target} - project identifier is not set (inode=0, tree=1000)\n\
             {target} - project inheritance flag is not set\n\
             Processed 1 (/dev/null and cmdline) paths for project 1000 with recursion depth infinite (-1).\n"
        )));
        let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
        assert!(matches!(err, XfsError::NotApplied { .. }), "{err}");
        assert!(
            err.to_string()
                .contains("project identifier is not set (inode=0, tree=1000)"),
            "{err}"
        );
        assert_eq!(
            runner.calls()[3..],
            [format!(
                "xfs_quota -x -D /dev/null -c project -C -p {target} 1000 {MOUNT}"
            )],
            "no limit was set, so none is cleared"
        );
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);

        // A check that never visited the path (stdout empty, complaint on stderr only).
        let (runner, xfs) = backend();
        runner.reply(Ok("")).reply(Ok("")).reply(Ok(""));
        let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
        assert!(err.to_string().contains("was not checked"), "{err}");
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
    }

    #[test]
    fn a_failing_quota_lookup_frees_the_id() {
        let (runner, xfs) = backend();
        let (_dir, fd) = a_directory();
        runner.reply(Err(ToolError::TimedOut {
            command: "xfs_quota".into(),
            seconds: 30,
        }));
        let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
        assert!(
            matches!(err, XfsError::Tool(ToolError::TimedOut { .. })),
            "{err}"
        );
        assert_eq!(runner.calls().len(), 1);
        assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
    }

    /// A stand-in for xfs_quota that keeps tags and limits, so that creations from many
    /// threads at once can run through the real command sequence.
    #[derive(Debug, Default)]
    pub(crate) struct FakeXfsQuota {
        limits_kib: Mutex<HashMap<u32, u64>>,
        tags: Mutex<HashMap<String, u32>>,
        /// Project ids whose next limit command fails.
        failing_limits: Mutex<BTreeSet<u32>>,
    }

    impl ToolRunner for FakeXfsQuota {
        fn run(&self, command: &ToolCommand) -> Result<String, ToolError> {
            // Lets other threads in between the steps of a creation.
            std::thread::yield_now();
            let position = command.args.iter().position(|a| a == "-c").unwrap();
            let words: Vec<&str> = command.args[position + 1].split(' ').collect();
            let id: u32 = words.last().unwrap().parse().unwrap();
            match words[..] {
                ["quota", ..] => Ok(self
                    .limits_kib
                    .lock()
                    .unwrap()
                    .get(&id)
                    .map(|kib| quota_line(0, *kib, 1))
                    .unwrap_or_default()),
                ["limit", "-p", bhard, _] => {
                    if self.failing_limits.lock().unwrap().remove(&id) {
                        return Err(failed("xfs_quota", "cannot set limits"));
                    }
                    let bytes: u64 = bhard.strip_prefix("bhard=").unwrap().parse().unwrap();
                    self.limits_kib.lock().unwrap().insert(id, bytes / 1024);
                    Ok(String::new())
                }
                ["limit", "-p", "bsoft=0", "bhard=0", "isoft=0", "ihard=0", _] => {
                    self.limits_kib.lock().unwrap().remove(&id);
                    Ok(String::new())
                }
                ["project", "-s", "-p", target, _] => {
                    // Keyed by the descriptor path, which a later directory may reuse.
                    self.tags.lock().unwrap().insert(target.to_owned(), id);
                    Ok(String::new())
                }
                ["project", "-c", "-p", target, _] => {
                    assert_eq!(self.tags.lock().unwrap().get(target), Some(&id));
                    Ok(checked(target, id))
                }
                ["project", "-C", "-p", target, _] => {
                    self.tags.lock().unwrap().remove(target);
                    Ok(String::new())
                }
                _ => panic!("unexpected command {command}"),
            }
        }
    }

    #[test]
    fn concurrent_creations_never_share_an_id() {
        const THREADS: usize = 16;
        const PER_THREAD: usize = 8;
        let fake = Arc::new(FakeXfsQuota::default());
        // Some creations fail half-way, freeing their id while others allocate.
        fake.failing_limits
            .lock()
            .unwrap()
            .extend([1003, 1010, 1050]);
        let xfs = backend_with(fake.clone(), FilesystemKind::Xfs);
        xfs.mark_in_use([1001, 1020]);
        let start = std::sync::Barrier::new(THREADS);
        let ids: Vec<u32> = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..THREADS)
                .map(|_| {
                    scope.spawn(|| {
                        let dirs: Vec<_> = (0..PER_THREAD).map(|_| a_directory()).collect();
                        start.wait();
                        dirs.iter()
                            .filter_map(|(_, fd)| xfs.limit_new(fd.as_fd(), 1 << 20).ok())
                            .collect::<Vec<u32>>()
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        let distinct: BTreeSet<u32> = ids.iter().copied().collect();
        assert_eq!(
            distinct.len(),
            ids.len(),
            "an id was handed out twice: {ids:?}"
        );
        assert_eq!(
            ids.len(),
            THREADS * PER_THREAD - 3,
            "only the three injected failures fail"
        );
        assert!(!distinct.contains(&1001) && !distinct.contains(&1020));
        // Ids freed by a failure went to later creations.
        assert!(distinct.contains(&1003) && distinct.contains(&1010));
        // Each created volume holds exactly its own tag and limit; failures left nothing.
        let tags = fake.tags.lock().unwrap();
        let tagged: BTreeSet<u32> = tags.values().copied().collect();
        assert_eq!(tagged, distinct);
        assert_eq!(tags.len(), distinct.len());
        let limited: BTreeSet<u32> = fake.limits_kib.lock().unwrap().keys().copied().collect();
        assert_eq!(limited, distinct);
    }

    #[test]
    fn probe_accepts_only_enforced_project_quotas() {
        let filesystem = |kind| QuotaFilesystem {
            mount_point: MOUNT.to_owned(),
            device: "/dev/sdb1".to_owned(),
            kind,
        };
        let probe_with = |kind, reply: Result<&str, ToolError>| {
            let runner = Arc::new(MockToolRunner::default());
            runner.reply(reply);
            let result = Xfs::on_filesystem(runner.clone(), filesystem(kind), 1000..=1999);
            (runner.calls(), result.map(|_| ()))
        };

        let on = "Project quota state on /srv/export (/dev/sdb1)\n  Accounting: ON\n  Enforcement: ON\n  \
                  Inode: #131 (2 blocks, 2 extents)\nBlocks grace time: [7 days]\nBlocks max warnings: 5\n\
                  Inodes grace time: [7 days]\nInodes max warnings: 5\nRealtime Blocks grace time: [7 days]\n";
        let (calls, result) = probe_with(FilesystemKind::Xfs, Ok(on));
        assert_eq!(result, Ok(()));
        assert_eq!(calls, [format!("xfs_quota -x -c state -p -v {MOUNT}")]);

        // What xfsprogs 6.1 prints for a filesystem mounted without prjquota.
        let (_, result) = probe_with(
            FilesystemKind::Xfs,
            Ok("Project quota are not enabled on /dev/sdb1\n"),
        );
        let err = result.unwrap_err();
        assert!(err.starts_with("project quotas are not enabled on /srv/export (/dev/sdb1, XFS): mount it with -o prjquota"), "{err}");

        let counted_only = on.replace("Enforcement: ON", "Enforcement: OFF");
        let (_, result) = probe_with(FilesystemKind::Xfs, Ok(&counted_only));
        let err = result.unwrap_err();
        assert!(err.contains("counted but not enforced"), "{err}");
        assert!(
            err.contains("xfs_quota -x -c 'enable -p' /srv/export"),
            "{err}"
        );

        let off = on
            .replace("Accounting: ON", "Accounting: OFF")
            .replace("Enforcement: ON", "Enforcement: OFF");
        let (_, result) = probe_with(FilesystemKind::Xfs, Ok(&off));
        assert!(result.unwrap_err().contains("not enabled"));

        let (calls, result) = probe_with(
            FilesystemKind::Ext4,
            Ok("Project quota are not enabled on /dev/sdb1\n"),
        );
        assert_eq!(calls, [format!("xfs_quota -x -f -c state -p -v {MOUNT}")]);
        assert!(result.unwrap_err().contains("tune2fs -O project,quota"));

        let (_, result) = probe_with(FilesystemKind::Xfs, Ok(""));
        assert!(
            result
                .unwrap_err()
                .contains("does not recognise /srv/export"),
            "empty output means the tool did not find the mount"
        );

        let (_, result) = probe_with(
            FilesystemKind::Xfs,
            Err(ToolError::NotStarted {
                command: "xfs_quota -x -c state -p -v /srv/export".into(),
                reason: "No such file or directory (os error 2)".into(),
            }),
        );
        assert_eq!(
            result.unwrap_err(),
            "cannot run xfs_quota (No such file or directory (os error 2)); install xfsprogs"
        );

        let (_, result) = probe_with(
            FilesystemKind::Xfs,
            Err(failed("xfs_quota", "line one\nline two")),
        );
        let err = result.unwrap_err();
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn probe_refuses_other_filesystems_in_one_line() {
        let runner = Arc::new(MockToolRunner::default());
        let err = Xfs::probe(runner.clone(), Path::new("/proc"), 1000..=1999).unwrap_err();
        assert!(
            err.starts_with("export root /proc is on proc, not XFS or ext4"),
            "{err}"
        );
        assert!(err.contains("mounted with prjquota"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert!(runner.calls().is_empty());

        assert_eq!(filesystem_kind(0x5846_5342), Some(FilesystemKind::Xfs));
        assert_eq!(filesystem_kind(0xEF53), Some(FilesystemKind::Ext4));
        assert_eq!(filesystem_kind(0x9123_683E), None, "btrfs");

        let err = Xfs::probe(runner, Path::new("/no/such/export"), 1000..=1999).unwrap_err();
        assert!(err.starts_with("export root /no/such/export: "), "{err}");
    }

    #[test]
    fn unusable_id_ranges_are_refused() {
        assert!(check_id_range(&(0..=10)).unwrap_err().contains("id 0"));
        #[allow(clippy::reversed_empty_ranges)]
        let empty = 10..=9;
        assert!(check_id_range(&empty).unwrap_err().contains("empty"));
        assert!(
            check_id_range(&(1..=u32::MAX))
                .unwrap_err()
                .contains("4294967295")
        );
        assert_eq!(check_id_range(&(1..=u32::MAX - 1)), Ok(()));
    }

    #[test]
    fn the_mount_is_the_deepest_one_of_the_same_device() {
        let mountinfo = "\
22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw
30 22 8:17 / /srv rw,relatime shared:5 - xfs /dev/sdb1 rw,attr2,inode64,prjquota
31 30 0:40 / /srv/export/tmp rw - tmpfs tmpfs rw
32 22 8:17 /export /mnt/nfs\\040export rw,relatime shared:5 - xfs /dev/sdb1 rw,prjquota
33 30 8:33 / /srv/export rw,relatime - xfs /dev/sdc1 rw,noquota
";
        let found = find_mount(mountinfo, Path::new("/srv/export/a"), 8, 17).unwrap();
        assert_eq!(found.mount_point, Path::new("/srv"));
        assert_eq!(
            (found.fstype.as_str(), found.source.as_str()),
            ("xfs", "/dev/sdb1")
        );

        // A bind mount with a space in its name.
        let found = find_mount(mountinfo, Path::new("/mnt/nfs export/v"), 8, 17).unwrap();
        assert_eq!(found.mount_point, Path::new("/mnt/nfs export"));

        // The filesystem mounted over /srv/export is found by its own device.
        let found = find_mount(mountinfo, Path::new("/srv/export"), 8, 33).unwrap();
        assert_eq!(found.mount_point, Path::new("/srv/export"));
        assert_eq!(found.source, "/dev/sdc1");

        // "/srvx" is not below "/srv".
        assert_eq!(find_mount(mountinfo, Path::new("/srvx"), 8, 17), None);

        // Mounted twice at the same place: the later mount is the visible one.
        let twice =
            "40 1 8:17 / /data rw - xfs /dev/old rw\n41 40 8:17 / /data rw - xfs /dev/new rw\n";
        assert_eq!(
            find_mount(twice, Path::new("/data/x"), 8, 17)
                .unwrap()
                .source,
            "/dev/new"
        );
    }

    #[test]
    fn mountinfo_escapes_are_decoded() {
        assert_eq!(unescape_mountinfo(r"/a\040b\011c\134d"), "/a b\tc\\d");
        assert_eq!(unescape_mountinfo(r"/plain\09"), r"/plain\09");
        assert_eq!(unescape_mountinfo("/end\\"), "/end\\");
    }
}
