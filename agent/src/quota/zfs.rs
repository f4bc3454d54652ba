//! ZFS quota backend: every volume is a dataset of its own, a child of one configured
//! dataset that is mounted at the export root, and its capacity is the dataset's
//! `refquota` (snapshots and descendants do not count against it).
//!
//! # Dataset names
//!
//! A volume's dataset is a *direct* child of the configured dataset, named by its path
//! with each `/` turned into `:`: `ns/claim` under `tank/export` is
//! `tank/export/ns:claim`, mounted at `<export root>/ns/claim`. The parent directories
//! (`ns`) are plain directories of the configured dataset. The mapping is injective
//! because `:` is a legal dataset-name character that volume paths cannot contain, and
//! flat names keep every volume one `zfs get -d 1` away. ZFS limits a whole name to 255
//! characters; a path whose name would be longer is refused with
//! [`ZfsError::Invalid`] (volume paths may be up to 1024 bytes, so long ones exist).
//!
//! An archived volume's dataset is renamed to `<dataset>/:archive:<guid>`, with its ZFS
//! guid (unique in the pool). Active names never start with `:`, so an archived dataset
//! can never be mistaken for a volume, and the archived name has a fixed length: any
//! volume that could be created can also be archived. Its `mountpoint` says where the
//! archive is and `nfsprov:path` still names the path it came from.
//!
//! # What marks a volume
//!
//! zfs-fuse has no extended attributes, so the metadata lives in user properties, read
//! only where set on the dataset itself (`-s local` semantics): user properties are
//! inherited, and one set on the parent by hand must not mark every child.
//! - `nfsprov:path` is set atomically by `zfs create`: the dataset is the agent's. A
//!   dataset without it is never modified or destroyed, whatever its name.
//! - `nfsprov:volume` (the caller's JSON) is set last: the volume is finished. A dataset
//!   that has the first but not the second is a crash leftover, destroyed by the next
//!   [`Zfs::create`] at its path or by [`Zfs::purge_leftovers`].
//!
//! # Running zfs
//!
//! Every call goes through the [`ToolRunner`] (a time limit, stderr in the error), with
//! arguments passed as they are, never through a shell. Output is read with `-H -p`.
//! zfs-fuse's `zfs list` has no `-p` and its `zfs get` no `-t`, so listings use
//! `zfs get -r -d 1` and drop snapshot and bookmark names themselves; this works on
//! OpenZFS too.
//!
//! # zfs-fuse quirks this module absorbs
//!
//! - `zfs rename` of a mounted dataset fails with "dataset is busy" (OpenZFS remounts by
//!   itself): [`Zfs::archive`] unmounts, points `mountpoint` at the archive, renames,
//!   then mounts. Setting `mountpoint` on an unmounted dataset does not mount it.
//! - After an unmount (also the one `zfs destroy` does itself), the daemon releases the
//!   dataset a few tens of milliseconds later; until then destroy and rename fail with
//!   "dataset is busy". Those calls are retried for a bounded time. A dataset that is
//!   really in use fails differently ("umount failed") and is reported at once.
//! - Changing `mountpoint` or destroying leaves the old mountpoint directory behind;
//!   this module removes it, and only when it is empty.
//! - `referenced` and the object count behind `statvfs` are those of the last committed
//!   transaction group, so [`Zfs::usage`] lags writes by up to a few seconds.
//!
//! # Interrupted operations
//!
//! Archiving is ordered so that every intermediate state is safe to retry: the
//! `mountpoint` is switched before the rename, so a dataset under an archive name always
//! knows where it belongs, and [`Zfs::purge_leftovers`] mounts finished datasets a crash
//! left unmounted. Calls for one path are not serialized here; the caller does that.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nfsprov_api_types::VolumePath;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::command::{ToolCommand, ToolError, ToolRunner, one_line};

const ZFS: &str = "zfs";
/// Marks the dataset as one the agent created; its value is the volume path.
pub const PATH_PROPERTY: &str = "nfsprov:path";
/// The volume's metadata JSON; its presence marks a finished volume.
pub const META_PROPERTY: &str = "nfsprov:volume";
/// Start of an archived dataset's name below the configured dataset.
pub const ARCHIVE_NAME_PREFIX: &str = ":archive:";
/// ZFS's limit on a whole dataset name.
const MAX_DATASET_NAME_LEN: usize = 255;
/// Longest user property value zfs accepts (zfs-fuse aborts on 8192 bytes).
const MAX_PROPERTY_VALUE_BYTES: usize = 8191;
/// Digits of the largest guid, for the archived name's length.
const MAX_GUID_DIGITS: usize = 20;
/// How long destroy and rename keep retrying while zfs calls a dataset busy.
const DEFAULT_BUSY_WAIT: Duration = Duration::from_secs(3);

/// What went wrong, in terms the API can map to its error codes.
#[derive(Debug, thiserror::Error)]
pub enum ZfsError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    /// The request cannot be expressed in ZFS (name too long, zero quota, metadata too
    /// large, archive path outside the root).
    #[error("{0}")]
    Invalid(String),
    /// Something is in the way: a finished volume, a dataset the agent did not create,
    /// or files in a mountpoint directory.
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
    /// zfs answered with something this module cannot read.
    #[error("unexpected output from zfs: {0}")]
    UnexpectedOutput(String),
}

type Result<T> = std::result::Result<T, ZfsError>;

/// The volumes' datasets below one configured dataset mounted at the export root.
#[derive(Debug)]
pub struct Zfs {
    runner: Arc<dyn ToolRunner>,
    dataset: String,
    export_root: PathBuf,
    busy_wait: Duration,
}

/// What is found under a volume's dataset name.
#[derive(Debug)]
enum VolumeDataset {
    Absent,
    /// Exists without `nfsprov:path` naming this path: not the agent's.
    Foreign,
    /// The agent's, without metadata yet.
    Unfinished(Properties),
    /// The agent's, with metadata.
    Finished(Properties),
}

/// Property values of one dataset; user properties only when set on it (not inherited).
type Properties = HashMap<String, String>;

/// A direct child of the configured dataset, as a listing shows it.
#[derive(Debug)]
struct Child {
    name: String,
    kind: ChildKind,
    properties: Properties,
}

#[derive(Debug, PartialEq, Eq)]
enum ChildKind {
    Active(VolumePath),
    Archived,
    /// A name neither this module's volume nor archive naming produces.
    Other,
}

impl Child {
    fn is_ours(&self) -> bool {
        match &self.kind {
            ChildKind::Active(path) => {
                self.properties.get(PATH_PROPERTY).map(String::as_str) == Some(path.as_str())
            }
            ChildKind::Archived => self.properties.contains_key(PATH_PROPERTY),
            ChildKind::Other => false,
        }
    }

    fn meta(&self) -> Option<&String> {
        self.properties.get(META_PROPERTY)
    }

    fn is_mounted(&self) -> bool {
        self.properties.get("mounted").map(String::as_str) == Some("yes")
    }
}

impl Zfs {
    /// Checks, once at start, that `dataset` exists, is a filesystem mounted at
    /// `export_root`, and that zfs answers. The error is one line saying what is wrong and
    /// how to fix it.
    pub fn probe(
        runner: Arc<dyn ToolRunner>,
        dataset: &str,
        export_root: &Path,
    ) -> std::result::Result<Self, String> {
        check_dataset_name(dataset)?;
        check_export_root(export_root)?;
        let zfs = Self::new(runner, dataset, export_root);
        let output = zfs
            .runner
            .run(&get_properties(&["type", "mounted", "mountpoint"], dataset))
            .map_err(|e| probe_failure(dataset, export_root, &e))?;
        let properties = parse_properties(&output);
        let root = export_root.display();
        let kind = properties.get("type").map_or("-", String::as_str);
        if kind != "filesystem" {
            return Err(format!(
                "ZFS dataset {dataset} is a {kind}, not a filesystem; configure the filesystem dataset mounted at {root} instead"
            ));
        }
        let mountpoint = properties.get("mountpoint").map_or("-", String::as_str);
        if !mountpoint.starts_with('/') || Path::new(mountpoint) != export_root {
            let or_move_the_root = if mountpoint.starts_with('/') {
                format!(" or configure {mountpoint} as the export root")
            } else {
                String::new()
            };
            return Err(format!(
                "ZFS dataset {dataset} has mountpoint {mountpoint}, not the export root {root}; run `zfs set mountpoint={root} {dataset}`{or_move_the_root}"
            ));
        }
        if properties.get("mounted").map(String::as_str) != Some("yes") {
            return Err(format!(
                "ZFS dataset {dataset} is not mounted; run `zfs mount {dataset}`"
            ));
        }
        Ok(zfs)
    }

    fn new(runner: Arc<dyn ToolRunner>, dataset: &str, export_root: &Path) -> Self {
        Self {
            runner,
            dataset: dataset.to_owned(),
            export_root: export_root.to_owned(),
            busy_wait: DEFAULT_BUSY_WAIT,
        }
    }

    /// How long destroy and rename retry while zfs reports the dataset busy.
    pub fn with_busy_wait(mut self, busy_wait: Duration) -> Self {
        self.busy_wait = busy_wait;
        self
    }

    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    pub fn export_root(&self) -> &Path {
        &self.export_root
    }

    /// The dataset name of the volume at `path`; refused when ZFS could not hold it.
    pub fn dataset_name(&self, path: &VolumePath) -> Result<String> {
        let name = format!("{}/{}", self.dataset, path.as_str().replace('/', ":"));
        if name.len() > MAX_DATASET_NAME_LEN {
            return Err(ZfsError::Invalid(format!(
                "{path} is too long for the ZFS backend: its dataset name would be {} characters, ZFS allows {MAX_DATASET_NAME_LEN} (the path may be at most {} bytes under {})",
                name.len(),
                MAX_DATASET_NAME_LEN.saturating_sub(self.dataset.len() + 1),
                self.dataset
            )));
        }
        Ok(name)
    }

    /// The metadata JSON recorded on the volume's dataset; `None` when there is no
    /// finished volume at `path` (no dataset, one without metadata, or not the agent's).
    pub fn read_meta(&self, path: &VolumePath) -> Result<Option<String>> {
        let name = self.dataset_name(path)?;
        Ok(match self.volume_dataset(&name, path, &[])? {
            VolumeDataset::Finished(mut properties) => properties.remove(META_PROPERTY),
            _ => None,
        })
    }

    /// Creates the dataset for `path`, mounted at `<export root>/<path>` (the caller made
    /// the parent directories), with `refquota` bytes or no quota. A leftover of an
    /// interrupted create at this path is destroyed first; a finished volume or a dataset
    /// the agent did not create is refused.
    pub fn create(&self, path: &VolumePath, refquota: Option<u64>) -> Result<()> {
        let name = self.dataset_name(path)?;
        let quota = quota_value(refquota)?;
        match self.volume_dataset(&name, path, &[])? {
            VolumeDataset::Absent => {}
            VolumeDataset::Unfinished(_) => self.destroy_dataset(&name)?,
            VolumeDataset::Finished(_) => {
                return Err(ZfsError::Conflict(format!(
                    "a volume already exists at {path} (dataset {name})"
                )));
            }
            VolumeDataset::Foreign => return Err(foreign(&name, path)),
        }
        let mut args = vec![
            "create".to_owned(),
            "-o".to_owned(),
            format!("mountpoint={}", self.mountpoint(path.as_str())?),
            "-o".to_owned(),
            format!("{PATH_PROPERTY}={path}"),
        ];
        if refquota.is_some() {
            args.extend(["-o".to_owned(), format!("refquota={quota}")]);
        }
        args.push(name);
        self.zfs(args)?;
        Ok(())
    }

    /// Records the metadata; called last, after the mounted directory is set up, so its
    /// presence marks a finished volume. Overwrites earlier metadata.
    pub fn write_meta(&self, path: &VolumePath, json: &str) -> Result<()> {
        check_meta(json)?;
        let name = self.existing_volume_dataset(path)?;
        self.zfs(["set", &format!("{META_PROPERTY}={json}"), &name])?;
        Ok(())
    }

    /// Sets the volume's capacity; `None` removes the limit. ZFS refuses a limit below
    /// what the volume already references.
    pub fn set_refquota(&self, path: &VolumePath, bytes: Option<u64>) -> Result<()> {
        let quota = quota_value(bytes)?;
        let name = self.existing_volume_dataset(path)?;
        self.zfs(["set", &format!("refquota={quota}"), &name])?;
        Ok(())
    }

    /// Destroys the volume's dataset (with its snapshots and any descendants) and the
    /// empty mountpoint directory zfs leaves behind. Nothing there is success.
    pub fn destroy(&self, path: &VolumePath) -> Result<()> {
        let name = self.dataset_name(path)?;
        match self.volume_dataset(&name, path, &[])? {
            VolumeDataset::Absent => {}
            VolumeDataset::Foreign => return Err(foreign(&name, path)),
            VolumeDataset::Unfinished(_) | VolumeDataset::Finished(_) => {
                self.destroy_dataset(&name)?
            }
        }
        self.remove_mountpoint_dir(path.as_str())
    }

    /// Moves the volume to the archive: afterwards its data is mounted at
    /// `<export root>/<archive_rel>` (the caller made the parent directories), its dataset
    /// is renamed to `:archive:<guid>` so the path is free for a new volume, and the old
    /// mountpoint directory is gone.
    pub fn archive(&self, path: &VolumePath, archive_rel: &str) -> Result<()> {
        let archive_mountpoint = self.mountpoint(archive_rel)?;
        let name = self.dataset_name(path)?;
        let properties = match self.volume_dataset(&name, path, &["mounted", "guid"])? {
            VolumeDataset::Absent => {
                return Err(ZfsError::NotFound(format!("no volume dataset at {path}")));
            }
            VolumeDataset::Foreign => return Err(foreign(&name, path)),
            VolumeDataset::Unfinished(p) | VolumeDataset::Finished(p) => p,
        };
        let guid = properties
            .get("guid")
            .filter(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| ZfsError::UnexpectedOutput(format!("no numeric guid for {name}")))?;
        let archived = format!("{}/{ARCHIVE_NAME_PREFIX}{guid}", self.dataset);
        // zfs-fuse cannot rename a mounted dataset, and switching the mountpoint while
        // unmounted does not mount it at the archive before the rename is done.
        if properties.get("mounted").map(String::as_str) == Some("yes") {
            self.unmount(&name)?;
        }
        self.zfs(["set", &format!("mountpoint={archive_mountpoint}"), &name])?;
        self.zfs_retrying_busy(["rename", &name, &archived])?;
        self.mount(&archived)?;
        self.remove_mountpoint_dir(path.as_str())
    }

    /// Every finished active volume with its metadata JSON, sorted by path.
    pub fn list(&self) -> Result<Vec<(VolumePath, String)>> {
        let mut volumes: Vec<_> = self
            .children()?
            .into_iter()
            .filter(Child::is_ours)
            .filter_map(
                |child| match (child.kind, child.properties.get(META_PROPERTY)) {
                    (ChildKind::Active(path), Some(meta)) => Some((path, meta.clone())),
                    _ => None,
                },
            )
            .collect();
        volumes.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(volumes)
    }

    /// Bytes the volume's dataset references, and its object count (files, directories
    /// and a few objects of ZFS's own) when the dataset is mounted where it belongs.
    pub fn usage(&self, path: &VolumePath) -> Result<(u64, Option<u64>)> {
        let name = self.dataset_name(path)?;
        let properties = self
            .properties(&name, &["referenced"])?
            .ok_or_else(|| ZfsError::NotFound(format!("no volume dataset at {path}")))?;
        let referenced = properties
            .get("referenced")
            .and_then(|v| v.parse::<u64>().ok())
            .ok_or_else(|| {
                ZfsError::UnexpectedOutput(format!("no byte count in `referenced` of {name}"))
            })?;
        Ok((referenced, self.mounted_object_count(path)))
    }

    /// Destroys the agent's active datasets without metadata (left by a crash between
    /// create and write_meta) and returns how many. Finished datasets a crash left
    /// unmounted (an interrupted archive) are mounted again; a failure to do so is
    /// logged, not returned, so one stuck dataset does not keep the agent down.
    pub fn purge_leftovers(&self) -> Result<usize> {
        let mut purged = 0;
        for child in self.children()?.into_iter().filter(Child::is_ours) {
            match (&child.kind, child.meta()) {
                (ChildKind::Active(path), None) => {
                    self.destroy_dataset(&child.name)?;
                    self.remove_mountpoint_dir(path.as_str())?;
                    purged += 1;
                }
                (ChildKind::Active(_), Some(_)) | (ChildKind::Archived, _)
                    if !child.is_mounted() =>
                {
                    match self.mount(&child.name) {
                        Ok(()) => {
                            tracing::info!(dataset = %child.name, "mounted a dataset an interrupted operation left unmounted")
                        }
                        Err(e) => {
                            tracing::warn!(dataset = %child.name, error = %e, "could not mount a dataset an interrupted operation left unmounted")
                        }
                    }
                }
                _ => {}
            }
        }
        Ok(purged)
    }

    /// Classifies the dataset under a volume's name, fetching `extra` properties too.
    fn volume_dataset(
        &self,
        name: &str,
        path: &VolumePath,
        extra: &[&str],
    ) -> Result<VolumeDataset> {
        let mut wanted = vec![PATH_PROPERTY, META_PROPERTY];
        wanted.extend_from_slice(extra);
        let Some(properties) = self.properties(name, &wanted)? else {
            return Ok(VolumeDataset::Absent);
        };
        if properties.get(PATH_PROPERTY).map(String::as_str) != Some(path.as_str()) {
            return Ok(VolumeDataset::Foreign);
        }
        Ok(if properties.contains_key(META_PROPERTY) {
            VolumeDataset::Finished(properties)
        } else {
            VolumeDataset::Unfinished(properties)
        })
    }

    /// The name of the agent's dataset at `path`, finished or not; an error otherwise.
    fn existing_volume_dataset(&self, path: &VolumePath) -> Result<String> {
        let name = self.dataset_name(path)?;
        match self.volume_dataset(&name, path, &[])? {
            VolumeDataset::Absent => {
                Err(ZfsError::NotFound(format!("no volume dataset at {path}")))
            }
            VolumeDataset::Foreign => Err(foreign(&name, path)),
            VolumeDataset::Unfinished(_) | VolumeDataset::Finished(_) => Ok(name),
        }
    }

    /// The properties of one dataset, `None` when it does not exist.
    fn properties(&self, name: &str, properties: &[&str]) -> Result<Option<Properties>> {
        match self.runner.run(&get_properties(properties, name)) {
            Ok(output) => Ok(Some(parse_properties(&output))),
            Err(e) if is_missing_dataset(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The direct children of the configured dataset with the properties that classify
    /// them.
    fn children(&self) -> Result<Vec<Child>> {
        let output = self.zfs([
            "get",
            "-H",
            "-p",
            "-r",
            "-d",
            "1",
            "-o",
            "name,property,value,source",
            &format!("mounted,{PATH_PROPERTY},{META_PROPERTY}"),
            &self.dataset,
        ])?;
        let prefix = format!("{}/", self.dataset);
        let mut by_name: BTreeMap<String, Properties> = BTreeMap::new();
        for line in output.lines().filter(|l| !l.is_empty()) {
            let (name, rest) = line
                .split_once('\t')
                .ok_or_else(|| ZfsError::UnexpectedOutput(line.to_owned()))?;
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

    /// Destroys a dataset and what is below it; already gone is success.
    fn destroy_dataset(&self, name: &str) -> Result<()> {
        match self.zfs_retrying_busy(["destroy", "-r", name]) {
            Err(ZfsError::Tool(e)) if is_missing_dataset(&e) => Ok(()),
            other => other.map(drop),
        }
    }

    fn unmount(&self, name: &str) -> Result<()> {
        match self.zfs(["umount", name]) {
            Err(ZfsError::Tool(e)) if e.stderr().contains("not currently mounted") => Ok(()),
            other => other.map(drop),
        }
    }

    fn mount(&self, name: &str) -> Result<()> {
        match self.zfs_retrying_busy(["mount", name]) {
            Err(ZfsError::Tool(e)) if e.stderr().contains("already mounted") => Ok(()),
            other => other.map(drop),
        }
    }

    fn zfs<S: Into<String>>(&self, args: impl IntoIterator<Item = S>) -> Result<String> {
        Ok(self.runner.run(&ToolCommand::new(ZFS, args))?)
    }

    /// Runs a command that zfs-fuse refuses as "busy" for a moment after an unmount,
    /// until it gets through or the busy wait is over.
    fn zfs_retrying_busy<S: Into<String>>(
        &self,
        args: impl IntoIterator<Item = S>,
    ) -> Result<String> {
        let command = ToolCommand::new(ZFS, args);
        let deadline = Instant::now() + self.busy_wait;
        let mut pause = Duration::from_millis(10);
        loop {
            match self.runner.run(&command) {
                Err(e) if e.stderr().contains("dataset is busy") && Instant::now() < deadline => {
                    std::thread::sleep(
                        pause.min(deadline.saturating_duration_since(Instant::now())),
                    );
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                other => return Ok(other?),
            }
        }
    }

    /// `<export root>/<relative>` as the text zfs takes as a mountpoint; `relative` must
    /// stay beneath the root.
    fn mountpoint(&self, relative: &str) -> Result<String> {
        let beneath = !relative.is_empty()
            && !relative.contains('\0')
            && Path::new(relative)
                .components()
                .all(|c| matches!(c, Component::Normal(_)));
        if !beneath {
            return Err(ZfsError::Invalid(format!(
                "{relative:?} is not a relative path beneath the export root"
            )));
        }
        let joined = self.export_root.join(relative);
        joined
            .to_str()
            .map(str::to_owned)
            .ok_or_else(|| ZfsError::Invalid(format!("{} is not valid UTF-8", joined.display())))
    }

    /// Removes the directory a dataset was mounted on, if it is still there and empty.
    /// It is reached from the root without following symlinks.
    fn remove_mountpoint_dir(&self, relative: &str) -> Result<()> {
        let components: Vec<&str> = relative.split('/').collect();
        let (leaf, parents) = components
            .split_last()
            .ok_or_else(|| ZfsError::Invalid("empty mountpoint path".into()))?;
        let parent = match open_beneath(&self.export_root, parents) {
            Ok(parent) => parent,
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(io_failure(format!("open the parent of {relative}"), e)),
        };
        let deadline = Instant::now() + self.busy_wait;
        loop {
            match rustix::fs::unlinkat(&parent, *leaf, AtFlags::REMOVEDIR) {
                Ok(()) | Err(Errno::NOENT) => return Ok(()),
                Err(Errno::NOTEMPTY) | Err(Errno::EXIST) => {
                    return Err(ZfsError::Conflict(format!(
                        "the directory {relative} under the export root still holds files that are not on the volume's dataset (written while it was not mounted); move them away"
                    )));
                }
                // A FUSE unmount can take a moment to let go of the directory.
                Err(Errno::BUSY) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => return Err(io_failure(format!("remove the directory {relative}"), e)),
            }
        }
    }

    /// Objects in use on the dataset mounted at the volume's path, from its `statvfs`;
    /// `None` unless the directory there is a mountpoint (else the figures would be the
    /// parent dataset's).
    fn mounted_object_count(&self, path: &VolumePath) -> Option<u64> {
        let components: Vec<&str> = path.components().collect();
        let (leaf, parents) = components.split_last()?;
        let parent = open_beneath(&self.export_root, parents).ok()?;
        let dir = open_beneath_from(parent.as_fd(), leaf).ok()?;
        let parent_dev = rustix::fs::fstat(&parent).ok()?.st_dev;
        if rustix::fs::fstat(&dir).ok()?.st_dev == parent_dev {
            return None;
        }
        let vfs = rustix::fs::fstatvfs(&dir).ok()?;
        Some(vfs.f_files.saturating_sub(vfs.f_ffree))
    }
}

fn classify(child: &str) -> ChildKind {
    if child.starts_with(ARCHIVE_NAME_PREFIX) {
        return ChildKind::Archived;
    }
    match VolumePath::parse(&child.replace(':', "/")) {
        Ok(path) => ChildKind::Active(path),
        Err(_) => ChildKind::Other,
    }
}

/// Reads `property<TAB>value<TAB>source` lines into a map.
/// `zfs get` of some properties of one dataset, in the form [`parse_properties`] reads.
fn get_properties(properties: &[&str], name: &str) -> ToolCommand {
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

fn parse_properties(output: &str) -> Properties {
    output.lines().filter_map(parse_property_line).collect()
}

/// One `property<TAB>value<TAB>source` line. A user property counts only when set on
/// the dataset itself: an inherited or unset one is left out.
fn parse_property_line(line: &str) -> Option<(String, String)> {
    let (property, rest) = line.split_once('\t')?;
    let (value, source) = rest.rsplit_once('\t')?;
    if property.contains(':') && source != "local" {
        return None;
    }
    Some((property.to_owned(), value.to_owned()))
}

fn is_missing_dataset(error: &ToolError) -> bool {
    error.stderr().contains("dataset does not exist")
}

fn foreign(name: &str, path: &VolumePath) -> ZfsError {
    ZfsError::Conflict(format!(
        "dataset {name} exists but was not created by the agent for {path} (its {PATH_PROPERTY} property is not {path}); refusing to touch it"
    ))
}

/// The `refquota` value for a capacity. ZFS reads 0 as "no quota", so a zero capacity
/// is refused rather than silently unlimited.
fn quota_value(bytes: Option<u64>) -> Result<String> {
    match bytes {
        None => Ok("none".to_owned()),
        Some(0) => Err(ZfsError::Invalid(
            "a ZFS quota cannot be 0 bytes (ZFS reads 0 as no limit); ask for a capacity of at least 1 byte".into(),
        )),
        Some(bytes) => Ok(bytes.to_string()),
    }
}

/// Metadata must survive `zfs get -H` (one line per property, tab-separated) and fit a
/// user property.
fn check_meta(json: &str) -> Result<()> {
    if json.is_empty() || json == "-" {
        return Err(ZfsError::Invalid("volume metadata is empty".into()));
    }
    if json.len() > MAX_PROPERTY_VALUE_BYTES {
        return Err(ZfsError::Invalid(format!(
            "volume metadata is {} bytes; a ZFS user property holds at most {MAX_PROPERTY_VALUE_BYTES}",
            json.len()
        )));
    }
    if json.chars().any(char::is_control) {
        return Err(ZfsError::Invalid(
            "volume metadata contains control characters (tabs or line breaks); store it as compact JSON".into(),
        ));
    }
    Ok(())
}

fn check_dataset_name(dataset: &str) -> std::result::Result<(), String> {
    let valid = !dataset.is_empty()
        && !dataset.starts_with('/')
        && !dataset.ends_with('/')
        && !dataset.contains("//")
        && dataset
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':' | '/'));
    if !valid {
        return Err(format!(
            "ZFS dataset {dataset:?} is not a filesystem name (pool/dataset, letters, digits and _-.: only)"
        ));
    }
    let archived_len = dataset.len() + 1 + ARCHIVE_NAME_PREFIX.len() + MAX_GUID_DIGITS;
    if archived_len > MAX_DATASET_NAME_LEN {
        return Err(format!(
            "ZFS dataset {dataset:?} is too long: archived volumes below it would need {archived_len} characters and ZFS allows {MAX_DATASET_NAME_LEN}; use a dataset with a shorter name"
        ));
    }
    Ok(())
}

fn check_export_root(export_root: &Path) -> std::result::Result<(), String> {
    let normal = export_root.is_absolute()
        && export_root
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)));
    if !normal || export_root.to_str().is_none() {
        return Err(format!(
            "export root {} must be an absolute UTF-8 path without `.` or `..` to be used as a ZFS mountpoint",
            export_root.display()
        ));
    }
    Ok(())
}

/// Why `probe`'s query failed, as one line with the fix.
fn probe_failure(dataset: &str, export_root: &Path, error: &ToolError) -> String {
    let root = export_root.display();
    match error {
        ToolError::NotStarted { reason, .. } => format!(
            "cannot run zfs ({reason}); install the ZFS utilities and make sure `zfs` is on the agent's PATH"
        ),
        ToolError::TimedOut { seconds, .. } => format!(
            "zfs did not answer within {seconds} s; check that ZFS is loaded (kernel module or zfs-fuse daemon) and the pool is healthy"
        ),
        ToolError::Failed { .. } if is_missing_dataset(error) => format!(
            "ZFS dataset {dataset} does not exist; create it with `zfs create -o mountpoint={root} {dataset}` or configure the dataset mounted at {root} instead"
        ),
        ToolError::Failed { stderr, .. } => format!(
            "zfs cannot read dataset {dataset}: {}; check that ZFS is running and the pool is imported",
            one_line(stderr)
        ),
    }
}

fn io_failure(context: String, errno: Errno) -> ZfsError {
    ZfsError::Io {
        context,
        source: errno.into(),
    }
}

/// Opens `components` below `root` as directories, never following a symlink on the way.
fn open_beneath(root: &Path, components: &[&str]) -> rustix::io::Result<OwnedFd> {
    let mut dir = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    for component in components {
        dir = open_beneath_from(dir.as_fd(), component)?;
    }
    Ok(dir)
}

fn open_beneath_from(dir: std::os::fd::BorrowedFd<'_>, name: &str) -> rustix::io::Result<OwnedFd> {
    rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quota::command::MockToolRunner;

    const DATASET: &str = "tank/export";

    struct Fixture {
        runner: Arc<MockToolRunner>,
        zfs: Zfs,
        root: tempfile::TempDir,
    }

    fn fixture() -> Fixture {
        let runner = Arc::new(MockToolRunner::default());
        let root = tempfile::tempdir().unwrap();
        let zfs = Zfs::new(runner.clone(), DATASET, root.path())
            .with_busy_wait(Duration::from_millis(500));
        Fixture { runner, zfs, root }
    }

    impl Fixture {
        /// A command line with the fixture's export root written as `<root>`.
        fn calls(&self) -> Vec<String> {
            let root = self.root.path().to_str().unwrap();
            self.runner
                .calls()
                .into_iter()
                .map(|c| c.replace(root, "<root>"))
                .collect()
        }
    }

    fn path(p: &str) -> VolumePath {
        VolumePath::parse(p).unwrap()
    }

    fn failed(stderr: &str) -> ToolError {
        ToolError::Failed {
            command: "zfs".into(),
            status: "exit status: 1".into(),
            stderr: stderr.into(),
        }
    }

    fn missing() -> ToolError {
        failed("cannot open 'tank/export/x': dataset does not exist")
    }

    /// `zfs get -o property,value,source` output for a volume dataset.
    fn volume_properties(path: Option<&str>, meta: Option<&str>, extra: &str) -> String {
        let user = |name: &str, value: Option<&str>| match value {
            Some(v) => format!("{name}\t{v}\tlocal\n"),
            None => format!("{name}\t-\t-\n"),
        };
        format!(
            "{}{}{extra}",
            user(PATH_PROPERTY, path),
            user(META_PROPERTY, meta)
        )
    }

    const GET_VOLUME: &str =
        "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume tank/export/ns:claim";

    #[test]
    fn create_makes_one_dataset_with_mountpoint_owner_mark_and_quota() {
        let f = fixture();
        f.runner.reply(Err(missing()));
        f.zfs.create(&path("ns/claim"), Some(1 << 20)).unwrap();
        assert_eq!(
            f.calls(),
            [
                GET_VOLUME,
                "zfs create -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=1048576 tank/export/ns:claim",
            ]
        );

        let f = fixture();
        f.runner.reply(Err(missing()));
        f.zfs.create(&path("solo"), None).unwrap();
        assert_eq!(
            f.calls()[1],
            "zfs create -o mountpoint=<root>/solo -o nfsprov:path=solo tank/export/solo"
        );
    }

    #[test]
    fn create_destroys_an_unfinished_leftover_first() {
        let f = fixture();
        f.runner
            .reply(Ok(&volume_properties(Some("ns/claim"), None, "")));
        f.zfs.create(&path("ns/claim"), Some(5)).unwrap();
        assert_eq!(
            f.calls(),
            [
                GET_VOLUME,
                "zfs destroy -r tank/export/ns:claim",
                "zfs create -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=5 tank/export/ns:claim",
            ]
        );
    }

    #[test]
    fn create_refuses_finished_volumes_and_datasets_of_others() {
        let cases = [
            (volume_properties(Some("ns/claim"), Some("{}"), ""), "already exists"),
            (volume_properties(None, None, ""), "not created by the agent"),
            // A mark inherited from the parent is not a mark.
            (
                "nfsprov:path\tns/claim\tinherited from tank/export\nnfsprov:volume\t{}\tinherited from tank/export\n"
                    .to_owned(),
                "not created by the agent",
            ),
            (volume_properties(Some("other"), None, ""), "not created by the agent"),
        ];
        for (reply, expected) in cases {
            let f = fixture();
            f.runner.reply(Ok(&reply));
            let err = f.zfs.create(&path("ns/claim"), Some(5)).unwrap_err();
            assert!(
                matches!(err, ZfsError::Conflict(ref m) if m.contains(expected)),
                "{reply:?}: {err}"
            );
            assert_eq!(f.calls(), [GET_VOLUME], "nothing is changed");
        }
    }

    #[test]
    fn impossible_requests_are_refused_before_running_zfs() {
        let f = fixture();
        let err = f.zfs.create(&path("a"), Some(0)).unwrap_err();
        assert!(
            matches!(err, ZfsError::Invalid(ref m) if m.contains("0 bytes")),
            "{err}"
        );

        // "tank/export/" takes 12 of the 255 characters, leaving 243 for the path.
        let fits = "a".repeat(243);
        assert_eq!(f.zfs.dataset_name(&path(&fits)).unwrap().len(), 255);
        let long = format!("{}/b", "a".repeat(242));
        let err = f.zfs.create(&path(&long), None).unwrap_err();
        assert!(
            matches!(err, ZfsError::Invalid(ref m) if m.contains("too long") && m.contains("256 characters")),
            "{err}"
        );

        for bad in ["", "-", "{\n}", "{\"a\":\"\t\"}"] {
            let err = f.zfs.write_meta(&path("a"), bad).unwrap_err();
            assert!(matches!(err, ZfsError::Invalid(_)), "{bad:?}: {err}");
        }
        let err = f
            .zfs
            .write_meta(&path("a"), &"x".repeat(MAX_PROPERTY_VALUE_BYTES + 1))
            .unwrap_err();
        assert!(
            matches!(err, ZfsError::Invalid(ref m) if m.contains("8191")),
            "{err}"
        );

        for bad in ["", "/abs", "../up", "a/../../b", "./a"] {
            let err = f.zfs.archive(&path("a"), bad).unwrap_err();
            assert!(matches!(err, ZfsError::Invalid(_)), "{bad:?}: {err}");
        }
        assert!(f.calls().is_empty(), "{:?}", f.calls());
    }

    #[test]
    fn distinct_paths_get_distinct_names() {
        let f = fixture();
        let names: std::collections::HashSet<String> =
            ["a/b", "a-b", "a.b", "a_b", "ab", "a/b/c", "a/bc"]
                .into_iter()
                .map(|p| f.zfs.dataset_name(&path(p)).unwrap())
                .collect();
        assert_eq!(names.len(), 7);
        assert_eq!(
            f.zfs.dataset_name(&path("a/b/c")).unwrap(),
            "tank/export/a:b:c"
        );
        for name in names {
            let child = name.strip_prefix("tank/export/").unwrap();
            assert!(matches!(classify(child), ChildKind::Active(_)), "{name}");
        }
        assert_eq!(classify(":archive:123"), ChildKind::Archived);
        assert_eq!(classify(".hidden"), ChildKind::Other);
    }

    #[test]
    fn write_meta_and_set_refquota_set_one_property_on_the_agents_dataset() {
        let f = fixture();
        let ours = volume_properties(Some("ns/claim"), None, "");
        f.runner.reply(Ok(&ours));
        f.zfs
            .write_meta(&path("ns/claim"), r#"{"mode":"777","owner":{"a":"b c=d"}}"#)
            .unwrap();
        f.runner.reply(Ok(&ours));
        f.zfs
            .set_refquota(&path("ns/claim"), Some(2 << 30))
            .unwrap();
        f.runner.reply(Ok(&ours));
        f.zfs.set_refquota(&path("ns/claim"), None).unwrap();
        assert_eq!(
            f.calls(),
            [
                GET_VOLUME,
                r#"zfs set nfsprov:volume={"mode":"777","owner":{"a":"b c=d"}} tank/export/ns:claim"#,
                GET_VOLUME,
                "zfs set refquota=2147483648 tank/export/ns:claim",
                GET_VOLUME,
                "zfs set refquota=none tank/export/ns:claim",
            ]
        );

        let f = fixture();
        f.runner.reply(Err(missing()));
        let err = f.zfs.set_refquota(&path("ns/claim"), Some(1)).unwrap_err();
        assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
        f.runner.reply(Ok(&volume_properties(None, None, "")));
        let err = f.zfs.write_meta(&path("ns/claim"), "{}").unwrap_err();
        assert!(matches!(err, ZfsError::Conflict(_)), "{err}");
        assert_eq!(f.calls(), [GET_VOLUME, GET_VOLUME]);
    }

    #[test]
    fn zfs_failures_keep_their_stderr() {
        let f = fixture();
        f.runner
            .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
            .reply(Err(failed(
                "cannot set property for 'tank/export/ns:claim': size is less than current used or reserved space",
            )));
        let err = f.zfs.set_refquota(&path("ns/claim"), Some(1)).unwrap_err();
        assert!(err.to_string().contains("less than current used"), "{err}");
    }

    #[test]
    fn destroy_removes_the_dataset_then_its_empty_mountpoint_directory() {
        let f = fixture();
        let dir = f.root.path().join("ns/claim");
        std::fs::create_dir_all(&dir).unwrap();
        f.runner
            .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
            // zfs-fuse needs a moment after its own unmount.
            .reply(Err(failed(
                "cannot destroy 'tank/export/ns:claim': dataset is busy",
            )));
        f.zfs.destroy(&path("ns/claim")).unwrap();
        assert_eq!(
            f.calls(),
            [
                GET_VOLUME,
                "zfs destroy -r tank/export/ns:claim",
                "zfs destroy -r tank/export/ns:claim",
            ]
        );
        assert!(!dir.exists());
        assert!(
            f.root.path().join("ns").is_dir(),
            "parents are the caller's"
        );

        // Gone already: success, and nothing but the lookup.
        let f = fixture();
        f.runner.reply(Err(missing()));
        f.zfs.destroy(&path("ns/claim")).unwrap();
        assert_eq!(f.calls(), [GET_VOLUME]);

        // Files that are not on the dataset are never removed.
        let f = fixture();
        std::fs::create_dir_all(f.root.path().join("ns/claim")).unwrap();
        std::fs::write(f.root.path().join("ns/claim/stray"), b"x").unwrap();
        f.runner.reply(Err(missing()));
        let err = f.zfs.destroy(&path("ns/claim")).unwrap_err();
        assert!(
            matches!(err, ZfsError::Conflict(ref m) if m.contains("still holds files")),
            "{err}"
        );
        assert!(f.root.path().join("ns/claim/stray").exists());
    }

    #[test]
    fn a_dataset_that_stays_busy_is_reported_after_the_busy_wait() {
        let runner = Arc::new(MockToolRunner::default());
        let zfs = Zfs::new(runner.clone(), DATASET, Path::new("/nonexistent"))
            .with_busy_wait(Duration::from_millis(50));
        runner.reply(Ok(&volume_properties(Some("a"), Some("{}"), "")));
        for _ in 0..1000 {
            runner.reply(Err(failed(
                "cannot destroy 'tank/export/a': dataset is busy",
            )));
        }
        let started = Instant::now();
        let err = zfs.destroy(&path("a")).unwrap_err();
        assert!(err.to_string().contains("dataset is busy"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(
            runner.calls().len() < 20,
            "retries are paced: {}",
            runner.calls().len()
        );
    }

    #[test]
    fn archive_unmounts_moves_the_mountpoint_renames_and_mounts() {
        let f = fixture();
        let dir = f.root.path().join("ns/claim");
        std::fs::create_dir_all(&dir).unwrap();
        f.runner.reply(Ok(&volume_properties(
            Some("ns/claim"),
            Some("{}"),
            "mounted\tyes\t-\nguid\t5691047184416807748\t-\n",
        )));
        f.zfs
            .archive(
                &path("ns/claim"),
                ".archive/ns/claim/@20261122T083958.123456789Z",
            )
            .unwrap();
        assert_eq!(
            f.calls(),
            [
                "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume,mounted,guid tank/export/ns:claim",
                "zfs umount tank/export/ns:claim",
                "zfs set mountpoint=<root>/.archive/ns/claim/@20261122T083958.123456789Z tank/export/ns:claim",
                "zfs rename tank/export/ns:claim tank/export/:archive:5691047184416807748",
                "zfs mount tank/export/:archive:5691047184416807748",
            ]
        );
        assert!(!dir.exists());

        // An interrupted archive left it unmounted: no second unmount.
        let f = fixture();
        f.runner.reply(Ok(&volume_properties(
            Some("a"),
            Some("{}"),
            "mounted\tno\t-\nguid\t42\t-\n",
        )));
        f.zfs.archive(&path("a"), ".archive/a/@x").unwrap();
        assert!(
            !f.calls().iter().any(|c| c.contains("umount")),
            "{:?}",
            f.calls()
        );

        let f = fixture();
        f.runner.reply(Err(missing()));
        let err = f.zfs.archive(&path("a"), ".archive/a/@x").unwrap_err();
        assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
    }

    /// A listing of the configured dataset's children, as `zfs get -r -d 1` prints it.
    fn listing() -> String {
        [
            // The configured dataset itself.
            "tank/export\tmounted\tyes\t-",
            "tank/export\tnfsprov:path\t-\t-",
            "tank/export\tnfsprov:volume\t-\t-",
            // Finished volumes.
            "tank/export/b\tmounted\tyes\t-",
            "tank/export/b\tnfsprov:path\tb\tlocal",
            "tank/export/b\tnfsprov:volume\t{\"n\":\"b\"}\tlocal",
            "tank/export/a:c\tmounted\tyes\t-",
            "tank/export/a:c\tnfsprov:path\ta/c\tlocal",
            "tank/export/a:c\tnfsprov:volume\t{\"n\":\"a c\"}\tlocal",
            // Unfinished: created, never given metadata.
            "tank/export/half\tmounted\tyes\t-",
            "tank/export/half\tnfsprov:path\thalf\tlocal",
            "tank/export/half\tnfsprov:volume\t-\t-",
            // Someone else's, with a metadata-looking inherited value.
            "tank/export/scratch\tmounted\tyes\t-",
            "tank/export/scratch\tnfsprov:path\t-\t-",
            "tank/export/scratch\tnfsprov:volume\t{}\tinherited from tank",
            // Marked for another path than its name says.
            "tank/export/x:y\tmounted\tyes\t-",
            "tank/export/x:y\tnfsprov:path\tx\tlocal",
            "tank/export/x:y\tnfsprov:volume\t{}\tlocal",
            // Archived, left unmounted by a crash.
            "tank/export/:archive:77\tmounted\tno\t-",
            "tank/export/:archive:77\tnfsprov:path\tb\tlocal",
            "tank/export/:archive:77\tnfsprov:volume\t{\"n\":\"old b\"}\tlocal",
            // A snapshot, as OpenZFS lists them with -r.
            "tank/export/b@daily\tmounted\t-\t-",
            "tank/export/b@daily\tnfsprov:path\tb\tlocal",
            "tank/export/b@daily\tnfsprov:volume\t{}\tlocal",
        ]
        .join("\n")
            + "\n"
    }

    const LIST_CHILDREN: &str = "zfs get -H -p -r -d 1 -o name,property,value,source mounted,nfsprov:path,nfsprov:volume tank/export";

    #[test]
    fn list_returns_exactly_the_finished_active_volumes() {
        let f = fixture();
        f.runner.reply(Ok(&listing()));
        let listed = f.zfs.list().unwrap();
        assert_eq!(
            listed,
            [
                (path("a/c"), r#"{"n":"a c"}"#.to_owned()),
                (path("b"), r#"{"n":"b"}"#.to_owned()),
            ]
        );
        assert_eq!(f.calls(), [LIST_CHILDREN]);

        let f = fixture();
        f.runner.reply(Ok("garbage-without-tabs\n"));
        assert!(matches!(f.zfs.list(), Err(ZfsError::UnexpectedOutput(_))));
    }

    #[test]
    fn purge_destroys_unfinished_datasets_and_remounts_unmounted_ones() {
        let f = fixture();
        std::fs::create_dir(f.root.path().join("half")).unwrap();
        f.runner.reply(Ok(&listing()));
        assert_eq!(f.zfs.purge_leftovers().unwrap(), 1);
        assert_eq!(
            f.calls(),
            [
                LIST_CHILDREN,
                "zfs mount tank/export/:archive:77",
                "zfs destroy -r tank/export/half",
            ]
        );
        assert!(!f.root.path().join("half").exists());
    }

    #[test]
    fn read_meta_sees_only_the_agents_finished_volumes() {
        let f = fixture();
        f.runner
            .reply(Ok(&volume_properties(
                Some("ns/claim"),
                Some(r#"{"uid":1}"#),
                "",
            )))
            .reply(Ok(&volume_properties(Some("ns/claim"), None, "")))
            .reply(Ok(&volume_properties(None, Some("{}"), "")))
            .reply(Err(missing()));
        let claim = path("ns/claim");
        assert_eq!(
            f.zfs.read_meta(&claim).unwrap().as_deref(),
            Some(r#"{"uid":1}"#)
        );
        assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);
        assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);
        assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);

        f.runner.reply(Err(failed("internal error: out of memory")));
        let err = f.zfs.read_meta(&claim).unwrap_err();
        assert!(err.to_string().contains("out of memory"), "{err}");
    }

    #[test]
    fn usage_reads_referenced_bytes() {
        let f = fixture();
        f.runner.reply(Ok("referenced\t5242880\t-\n"));
        // Nothing is mounted at the path in this test, so there is no object count.
        assert_eq!(f.zfs.usage(&path("ns/claim")).unwrap(), (5_242_880, None));
        assert_eq!(
            f.calls(),
            ["zfs get -H -p -o property,value,source referenced tank/export/ns:claim"]
        );

        f.runner.reply(Ok("referenced\t5M\t-\n"));
        assert!(matches!(
            f.zfs.usage(&path("ns/claim")),
            Err(ZfsError::UnexpectedOutput(_))
        ));
        f.runner.reply(Err(missing()));
        assert!(matches!(
            f.zfs.usage(&path("ns/claim")),
            Err(ZfsError::NotFound(_))
        ));
    }

    fn probe_with(
        reply: std::result::Result<&str, ToolError>,
        dataset: &str,
        root: &str,
    ) -> std::result::Result<Zfs, String> {
        let runner = Arc::new(MockToolRunner::default());
        runner.reply(reply);
        Zfs::probe(runner, dataset, Path::new(root))
    }

    const GOOD_PROBE: &str =
        "type\tfilesystem\t-\nmounted\tyes\t-\nmountpoint\t/srv/export\tlocal\n";

    #[test]
    fn probe_accepts_the_dataset_mounted_at_the_root() {
        let runner = Arc::new(MockToolRunner::default());
        runner.reply(Ok(GOOD_PROBE));
        let zfs = Zfs::probe(runner.clone(), DATASET, Path::new("/srv/export/")).unwrap();
        assert_eq!(zfs.dataset(), DATASET);
        assert_eq!(
            runner.calls(),
            ["zfs get -H -p -o property,value,source type,mounted,mountpoint tank/export"]
        );
    }

    #[test]
    fn probe_failures_say_what_is_wrong_and_how_to_fix_it_in_one_line() {
        let not_started = ToolError::NotStarted {
            command: "zfs get".into(),
            reason: "No such file or directory (os error 2)".into(),
        };
        let timed_out = ToolError::TimedOut {
            command: "zfs get".into(),
            seconds: 30,
        };
        let long_dataset = "t".repeat(230);
        // What zfs answers, the dataset and export root configured, what the message says.
        type Case<'a> = (
            std::result::Result<&'a str, ToolError>,
            &'a str,
            &'a str,
            &'a [&'a str],
        );
        let cases: Vec<Case> = vec![
            (
                Err(not_started),
                DATASET,
                "/srv/export",
                &["cannot run zfs", "PATH"],
            ),
            (
                Err(timed_out),
                DATASET,
                "/srv/export",
                &["did not answer within 30 s"],
            ),
            (
                Err(failed("cannot open 'tank/export': dataset does not exist")),
                DATASET,
                "/srv/export",
                &[
                    "does not exist",
                    "zfs create -o mountpoint=/srv/export tank/export",
                ],
            ),
            (
                Err(failed(
                    "connect: Connection refused\nPlease make sure that the zfs-fuse daemon is running.",
                )),
                DATASET,
                "/srv/export",
                &["Connection refused; Please make sure"],
            ),
            (
                Ok("type\tvolume\t-\nmounted\t-\t-\nmountpoint\t-\t-\n"),
                DATASET,
                "/srv/export",
                &["is a volume, not a filesystem"],
            ),
            (
                Ok("type\tfilesystem\t-\nmounted\tyes\t-\nmountpoint\t/tank/export\tdefault\n"),
                DATASET,
                "/srv/export",
                &[
                    "mountpoint /tank/export",
                    "zfs set mountpoint=/srv/export tank/export",
                ],
            ),
            (
                Ok("type\tfilesystem\t-\nmounted\tno\t-\nmountpoint\tlegacy\tlocal\n"),
                DATASET,
                "/srv/export",
                &[
                    "mountpoint legacy, not the export root /srv/export; run `zfs set mountpoint=/srv/export tank/export`",
                ],
            ),
            (
                Ok("type\tfilesystem\t-\nmounted\tno\t-\nmountpoint\t/srv/export\tlocal\n"),
                DATASET,
                "/srv/export",
                &["not mounted", "zfs mount tank/export"],
            ),
            (
                Ok(GOOD_PROBE),
                "tank/export@snap",
                "/srv/export",
                &["not a filesystem name"],
            ),
            (
                Ok(GOOD_PROBE),
                "/tank",
                "/srv/export",
                &["not a filesystem name"],
            ),
            (Ok(GOOD_PROBE), &long_dataset, "/srv/export", &["too long"]),
            (Ok(GOOD_PROBE), DATASET, "srv/export", &["absolute"]),
            (Ok(GOOD_PROBE), DATASET, "/srv/../export", &["absolute"]),
        ];
        for (reply, dataset, root, expected) in cases {
            let shown = format!("{reply:?} {dataset} {root}");
            let message = probe_with(reply, dataset, root).unwrap_err();
            assert!(!message.contains('\n'), "{shown}: {message}");
            for part in expected {
                assert!(
                    message.contains(part),
                    "{shown}: {message:?} lacks {part:?}"
                );
            }
        }
    }
}
