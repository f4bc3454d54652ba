//! Reading what `zfs` prints: property lines, the children of the configured dataset and
//! what their names say, and the errors that mean "no such dataset".

use std::collections::{BTreeMap, HashMap};

use nfsprov_api_types::VolumePath;

use super::names::{ARCHIVE_NAME_PREFIX, HELD_NAME_PREFIX, META_PROPERTY, PATH_PROPERTY};
use crate::quota::command::ToolError;

/// Property values of one dataset; user properties only when set on it (not inherited).
pub(super) type Properties = HashMap<String, String>;

/// A direct child of the configured dataset, as a listing shows it.
#[derive(Debug)]
pub(super) struct Child {
    pub name: String,
    pub kind: ChildKind,
    pub properties: Properties,
}

#[derive(Debug, PartialEq, Eq)]
pub(super) enum ChildKind {
    Active(VolumePath),
    Archived,
    /// A deleted volume's dataset kept, unmounted, for its snapshots.
    Held,
    /// A name neither this module's volume nor archive naming produces.
    Other,
}

impl Child {
    pub(super) fn is_ours(&self) -> bool {
        match &self.kind {
            ChildKind::Active(path) => {
                self.properties.get(PATH_PROPERTY).map(String::as_str) == Some(path.as_str())
            }
            ChildKind::Archived | ChildKind::Held => self.properties.contains_key(PATH_PROPERTY),
            ChildKind::Other => false,
        }
    }

    pub(super) fn meta(&self) -> Option<&String> {
        self.properties.get(META_PROPERTY)
    }

    pub(super) fn is_mounted(&self) -> bool {
        self.properties.get("mounted").map(String::as_str) == Some("yes")
    }

    /// The snapshot it was cloned from, when it is a clone.
    pub(super) fn origin(&self) -> Option<&str> {
        self.properties
            .get("origin")
            .map(String::as_str)
            .filter(|origin| origin.contains('@'))
    }
}

/// A kept snapshot as ZFS lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptSnapshot {
    /// `<dataset>@nfsprov-snapshot-<name>`.
    pub full_name: String,
    /// Bytes only it holds.
    pub used: Option<u64>,
    /// Bytes it references: the data it holds.
    pub referenced: Option<u64>,
}

/// The agent's snapshots of the children of `dataset` (those named with
/// `SNAPSHOT_PREFIX`), each with the properties listed for it, in `zfs get -H -p -r -d 2
/// -o name,property,value,source` output.
pub(super) fn parse_kept_snapshots(output: &str, dataset: &str) -> BTreeMap<String, Properties> {
    let prefix = format!("{dataset}/");
    let mut found: BTreeMap<String, Properties> = BTreeMap::new();
    for line in output.lines() {
        let Some((name, rest)) = line.split_once('\t') else {
            continue;
        };
        let Some((child, snapshot)) = name
            .strip_prefix(&prefix)
            .and_then(|below| below.split_once('@'))
        else {
            continue;
        };
        if child.contains('/') || !snapshot.starts_with(super::names::SNAPSHOT_PREFIX) {
            continue;
        }
        let properties = found.entry(name.to_owned()).or_default();
        if let Some((property, value)) = parse_property_line(rest) {
            properties.insert(property, value);
        }
    }
    found
}

/// A snapshot of a dataset, by the whole name (`<dataset>@<snapshot>`).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Snapshot {
    pub name: String,
    /// The transaction group it was taken in: later snapshots have higher ones.
    pub createtxg: u64,
}

pub(super) fn classify(child: &str) -> ChildKind {
    if child.starts_with(ARCHIVE_NAME_PREFIX) {
        return ChildKind::Archived;
    }
    if child.starts_with(HELD_NAME_PREFIX) {
        return ChildKind::Held;
    }
    match VolumePath::parse(&child.replace(':', "/")) {
        Ok(path) => ChildKind::Active(path),
        Err(_) => ChildKind::Other,
    }
}

/// Reads `property<TAB>value<TAB>source` lines into a map.
pub(super) fn parse_properties(output: &str) -> Properties {
    output.lines().filter_map(parse_property_line).collect()
}

/// One `property<TAB>value<TAB>source` line. A user property counts only when set on
/// the dataset itself: an inherited or unset one is left out.
pub(super) fn parse_property_line(line: &str) -> Option<(String, String)> {
    let (property, rest) = line.split_once('\t')?;
    let (value, source) = rest.rsplit_once('\t')?;
    if property.contains(':') && source != "local" {
        return None;
    }
    Some((property.to_owned(), value.to_owned()))
}

pub(super) fn is_missing_dataset(error: &ToolError) -> bool {
    error.stderr().contains("dataset does not exist")
}

/// The direct children of `dataset` in `zfs get -H -p -r -d 1 -o name,property,value,source`
/// output; `Err` with the first line that cannot be read.
pub(super) fn parse_children(output: &str, dataset: &str) -> Result<Vec<Child>, String> {
    let prefix = format!("{dataset}/");
    let mut by_name: BTreeMap<String, Properties> = BTreeMap::new();
    for line in output.lines().filter(|l| !l.is_empty()) {
        let (name, rest) = line.split_once('\t').ok_or_else(|| line.to_owned())?;
        let Some(child) = name.strip_prefix(&prefix) else {
            continue;
        };
        // Snapshots and bookmarks (OpenZFS lists them with -r) are not children.
        if child.contains(['/', '@', '#']) {
            continue;
        }
        let properties = by_name.entry(name.to_owned()).or_default();
        if let Some((property, value)) = parse_property_line(rest) {
            properties.insert(property, value);
        }
    }
    Ok(by_name
        .into_iter()
        .map(|(name, properties)| Child {
            kind: classify(&name[prefix.len()..]),
            name,
            properties,
        })
        .collect())
}

/// The snapshots of `dataset` in `zfs get -H -p -r -d 1 -o name,property,value,source
/// createtxg` output, oldest first; `Err` with the first line that cannot be read.
pub(super) fn parse_snapshots(output: &str, dataset: &str) -> Result<Vec<Snapshot>, String> {
    let prefix = format!("{dataset}@");
    let mut snapshots = Vec::new();
    for line in output.lines().filter(|l| !l.is_empty()) {
        let mut fields = line.split('\t');
        let (Some(name), Some(property), Some(value)) =
            (fields.next(), fields.next(), fields.next())
        else {
            return Err(line.to_owned());
        };
        if !name.starts_with(&prefix) || property != "createtxg" {
            continue;
        }
        let createtxg = value.parse().map_err(|_| line.to_owned())?;
        snapshots.push(Snapshot {
            name: name.to_owned(),
            createtxg,
        });
    }
    snapshots.sort_by_key(|s| s.createtxg);
    Ok(snapshots)
}

#[cfg(test)]
#[path = "parse_tests.rs"]
mod tests;
