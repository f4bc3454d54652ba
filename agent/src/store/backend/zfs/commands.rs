//! The `zfs` command lines the backend runs. Building them apart from running them keeps
//! the arguments (and so what the tests expect) in one place.

use super::names::{META_PROPERTY, PATH_PROPERTY};
use crate::quota::command::ToolCommand;

pub(super) const ZFS: &str = "zfs";

/// `zfs get` of some properties of one dataset, in the form `parse_properties` reads.
pub(super) fn get_properties(properties: &[&str], name: &str) -> ToolCommand {
    ToolCommand::new(
        ZFS,
        [
            "get",
            "-H",
            "-p",
            "-o",
            "property,value,source",
            &properties.join(","),
            name,
        ],
    )
}

/// The children of `dataset` with the properties that classify them.
pub(super) fn get_children(dataset: &str) -> ToolCommand {
    get_child_properties(dataset, &format!("mounted,{PATH_PROPERTY},{META_PROPERTY}"))
}

/// The children of `dataset` with what describes an archive: where it is mounted, the
/// bytes it references, and the agent's marks.
pub(super) fn get_archives(dataset: &str) -> ToolCommand {
    get_child_properties(
        dataset,
        &format!("mountpoint,referenced,{PATH_PROPERTY},{META_PROPERTY}"),
    )
}

/// The children of `dataset` with the snapshot each was cloned from (`-` for none) and
/// the agent's mark; `-d 2` lists the children's snapshots too, whose names say which
/// children hold kept snapshots.
pub(super) fn get_origins(dataset: &str) -> ToolCommand {
    ToolCommand::new(
        ZFS,
        [
            "get",
            "-H",
            "-p",
            "-r",
            "-d",
            "2",
            "-o",
            "name,property,value,source",
            &format!("origin,{PATH_PROPERTY}"),
            dataset,
        ],
    )
}

/// The transaction group each snapshot of `name` was taken in (`-r -d 1` reaches a
/// dataset's snapshots; zfs-fuse's `zfs get` has no `-t`).
pub(super) fn get_snapshot_txgs(name: &str) -> ToolCommand {
    get_child_properties(name, "createtxg")
}

/// The size of every snapshot of `dataset`'s children: what only it holds (`used`) and
/// what it references; `-d 2` reaches the children's snapshots.
pub(super) fn get_child_snapshots(dataset: &str) -> ToolCommand {
    ToolCommand::new(
        ZFS,
        [
            "get",
            "-H",
            "-p",
            "-r",
            "-d",
            "2",
            "-o",
            "name,property,value,source",
            "used,referenced",
            dataset,
        ],
    )
}

/// `properties` (comma-separated) of `dataset`'s direct children, one line each.
fn get_child_properties(dataset: &str, properties: &str) -> ToolCommand {
    ToolCommand::new(
        ZFS,
        [
            "get",
            "-H",
            "-p",
            "-r",
            "-d",
            "1",
            "-o",
            "name,property,value,source",
            properties,
            dataset,
        ],
    )
}

/// A volume's dataset, marked as the agent's for `path`, mounted at `mountpoint`.
pub(super) fn create(
    name: &str,
    mountpoint: &str,
    path: &str,
    refquota: Option<&str>,
) -> ToolCommand {
    let mut args = volume_options("create", mountpoint, path, refquota);
    args.push(name.to_owned());
    ToolCommand::new(ZFS, args)
}

/// A clone of `snapshot`, made and marked like [`create`] makes a volume's dataset.
pub(super) fn clone(
    snapshot: &str,
    name: &str,
    mountpoint: &str,
    path: &str,
    refquota: Option<&str>,
) -> ToolCommand {
    let mut args = volume_options("clone", mountpoint, path, refquota);
    args.extend([snapshot.to_owned(), name.to_owned()]);
    ToolCommand::new(ZFS, args)
}

/// `subcommand` with the properties a volume's dataset is made with: set atomically with
/// the dataset, so it is marked as the agent's before it is mounted.
fn volume_options(
    subcommand: &str,
    mountpoint: &str,
    path: &str,
    refquota: Option<&str>,
) -> Vec<String> {
    let mut args = vec![
        subcommand.to_owned(),
        "-o".to_owned(),
        format!("mountpoint={mountpoint}"),
        "-o".to_owned(),
        format!("{PATH_PROPERTY}={path}"),
    ];
    if let Some(quota) = refquota {
        args.extend(["-o".to_owned(), format!("refquota={quota}")]);
    }
    args
}

/// `snapshot` is `<dataset>@<name>`.
pub(super) fn snapshot(snapshot: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["snapshot", snapshot])
}

/// Makes the clone `name` independent of its origin: the origin's snapshots up to the
/// one it was cloned from move onto it.
pub(super) fn promote(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["promote", name])
}

pub(super) fn set(name: &str, property: &str, value: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["set", &format!("{property}={value}"), name])
}

pub(super) fn rename(from: &str, to: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["rename", from, to])
}

/// The dataset with its snapshots and descendants.
pub(super) fn destroy(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["destroy", "-r", name])
}

/// One snapshot (`<dataset>@<name>`), refused while a clone depends on it.
pub(super) fn destroy_snapshot(snapshot: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["destroy", snapshot])
}

pub(super) fn mount(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["mount", name])
}

pub(super) fn unmount(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["umount", name])
}
