//! Reading what `xfs_quota` and the kernel print: the quota state, a project's quota
//! line, the filesystem kind and the mount holding a path. Pure functions of text, so
//! every quirk of the output is tested on its own.

use std::path::{Path, PathBuf};

use crate::mountinfo::unescape;

/// `statfs` magic numbers of the filesystems `xfs_quota` can manage project quotas on.
const XFS_SUPER_MAGIC: u32 = 0x5846_5342;
const EXT4_SUPER_MAGIC: u32 = 0xEF53;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FilesystemKind {
    Xfs,
    /// Driven through xfs_quota's foreign-filesystem mode.
    Ext4,
}

pub(super) fn filesystem_kind(magic: u32) -> Option<FilesystemKind> {
    match magic {
        XFS_SUPER_MAGIC => Some(FilesystemKind::Xfs),
        EXT4_SUPER_MAGIC => Some(FilesystemKind::Ext4),
        _ => None,
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct MountEntry {
    pub mount_point: PathBuf,
    pub fstype: String,
    pub source: String,
}

/// The mount `path` is reached through: among the entries of the device `major:minor`,
/// the one with the longest mount point above `path`, the later one when two are equal
/// (it was mounted over the other). Checking the device keeps a different filesystem
/// mounted on a parent directory from being taken for ours.
pub(super) fn find_mount(
    mountinfo: &str,
    path: &Path,
    major: u32,
    minor: u32,
) -> Option<MountEntry> {
    let device = format!("{major}:{minor}");
    let mut best: Option<MountEntry> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - fstype source super-options
        let fields: Vec<&str> = line.split(' ').collect();
        if fields.len() < 5 || fields[2] != device {
            continue;
        }
        let mount_point = PathBuf::from(unescape(fields[4]));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let after_separator = fields.iter().skip(6).skip_while(|f| **f != "-").skip(1);
        let mut after_separator = after_separator.map(|f| unescape(f));
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum QuotaState {
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
pub(super) fn parse_state(output: &str) -> QuotaState {
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
pub(super) struct QuotaRecord {
    pub used_kib: u64,
    pub hard_kib: u64,
    pub used_inodes: u64,
}

/// `None` when the output is not a quota line; `Some(None)` when there is no record.
///
/// The line is: device, then for blocks and for inodes each "used soft hard warnings
/// [timer]", then the mount point. A long device name is followed by a line break. The
/// timer may contain spaces ("[6 days 23:59:58]") but is always in brackets.
pub(super) fn parse_quota_record(output: &str) -> Option<Option<QuotaRecord>> {
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
#[path = "parse_tests.rs"]
mod tests;
