//! The `xfs_quota` command lines the backend runs, all pointed at one filesystem: expert
//! mode, foreign-filesystem mode for ext4, and no `/etc/projects` for the project
//! commands.

use super::parse::FilesystemKind;
use crate::quota::command::ToolCommand;

pub(super) const TOOL: &str = "xfs_quota";
/// Limits are set in whole KiB: the quota report counts KiB, so such a limit reads back
/// exactly instead of rounded down.
const LIMIT_UNIT: u64 = 1024;
/// The kernel rounds a limit up to whole filesystem blocks, which are at most this big.
pub(super) const MAX_BLOCK_SIZE: u64 = 64 * 1024;
/// Read by `xfs_quota -D` instead of `/etc/projects`: an operator's own entry there with
/// one of our ids would otherwise be tagged along with our directory.
const NO_PROJECTS_FILE: &str = "/dev/null";

/// The filesystem the commands act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Commands {
    pub mount_point: String,
    pub kind: FilesystemKind,
}

impl Commands {
    /// Without -v, xfs_quota prints nothing at all when project quotas are off.
    pub(super) fn state(&self) -> ToolCommand {
        self.xfs_quota("state -p -v".to_owned())
    }

    /// Gives `target` (and everything later made below it) the project id.
    pub(super) fn tag(&self, target: &str, id: u32) -> ToolCommand {
        self.project_command(format!("project -s -p {target} {id}"))
    }

    /// Lists what under `target` does not carry the project id.
    pub(super) fn check_tag(&self, target: &str, id: u32) -> ToolCommand {
        self.project_command(format!("project -c -p {target} {id}"))
    }

    pub(super) fn untag(&self, target: &str, id: u32) -> ToolCommand {
        self.project_command(format!("project -C -p {target} {id}"))
    }

    /// A bare number after `bhard=` means bytes.
    pub(super) fn set_hard_limit(&self, id: u32, limit_bytes: u64) -> ToolCommand {
        self.xfs_quota(format!("limit -p bhard={limit_bytes} {id}"))
    }

    pub(super) fn clear_limits(&self, id: u32) -> ToolCommand {
        self.xfs_quota(format!("limit -p bsoft=0 bhard=0 isoft=0 ihard=0 {id}"))
    }

    pub(super) fn quota_report(&self, id: u32) -> ToolCommand {
        // -v prints the record even when all its figures are zero, -n skips name lookups,
        // -N drops the header; blocks are counted in KiB.
        self.xfs_quota(format!("quota -p -v -N -n -b -i {id}"))
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
pub(super) fn limit_bytes(capacity_bytes: u64) -> u64 {
    // xfs_quota parses the number as a signed 64-bit value and clamps larger ones silently.
    let largest = i64::MAX as u64 / LIMIT_UNIT * LIMIT_UNIT;
    capacity_bytes
        .div_ceil(LIMIT_UNIT)
        .max(1)
        .saturating_mul(LIMIT_UNIT)
        .min(largest)
}
