//! The `zfs` command lines the backend runs. Building them apart from running them keeps
//! the arguments (and so what the tests expect) in one place.

use super::names::{META_PROPERTY, PATH_PROPERTY};
use crate::quota::command::ToolCommand;

pub const ZFS: &str = "zfs";

/// `zfs get` of some properties of one dataset, in the form `parse_properties` reads.
pub fn get_properties(properties: &[&str], name: &str) -> ToolCommand {
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
pub fn get_children(dataset: &str) -> ToolCommand {
    get_child_properties(dataset, &format!("mounted,{PATH_PROPERTY},{META_PROPERTY}"))
}

/// The children of `dataset` with what describes an archive: where it is mounted, the
/// bytes it references, and the agent's marks.
pub fn get_archives(dataset: &str) -> ToolCommand {
    get_child_properties(
        dataset,
        &format!("mountpoint,referenced,{PATH_PROPERTY},{META_PROPERTY}"),
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
pub fn create(name: &str, mountpoint: &str, path: &str, refquota: Option<&str>) -> ToolCommand {
    let mut args = vec![
        "create".to_owned(),
        "-o".to_owned(),
        format!("mountpoint={mountpoint}"),
        "-o".to_owned(),
        format!("{PATH_PROPERTY}={path}"),
    ];
    if let Some(quota) = refquota {
        args.extend(["-o".to_owned(), format!("refquota={quota}")]);
    }
    args.push(name.to_owned());
    ToolCommand::new(ZFS, args)
}

pub fn set(name: &str, property: &str, value: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["set", &format!("{property}={value}"), name])
}

pub fn rename(from: &str, to: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["rename", from, to])
}

/// The dataset with its snapshots and descendants.
pub fn destroy(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["destroy", "-r", name])
}

pub fn mount(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["mount", name])
}

pub fn unmount(name: &str) -> ToolCommand {
    ToolCommand::new(ZFS, ["umount", name])
}
