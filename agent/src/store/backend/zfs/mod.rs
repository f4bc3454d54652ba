//! ZFS datasets, the volumes of quota backend `zfs`: their whole lifecycle (create, clone,
//! snapshot, promote, archive, destroy, mount) through the `zfs` tool. Every volume is a
//! dataset of its own, a child of one configured dataset that is mounted at the export
//! root, and its capacity is the dataset's `refquota` (snapshots and descendants do not
//! count against it). `dataset_backend` (the store's `DatasetBackend`) makes these datasets
//! volumes.
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
//! - `nfsprov:path` is set atomically by `zfs create` (or `zfs clone`): the dataset is the
//!   agent's. A dataset without it is never modified or destroyed, whatever its name.
//! - `nfsprov:volume` (the caller's JSON) is set last: the volume is finished. A dataset
//!   that has the first but not the second is a crash leftover, destroyed by the next
//!   [`Zfs::create`] or [`Zfs::clone_volume`] at its path or by
//!   [`Zfs::purge_leftovers`].
//!
//! # Clones
//!
//! [`Zfs::clone_volume`] takes a snapshot of the source's dataset named
//! `nfsprov-clone-<ns since 1970>-<counter>` ([`CLONE_SNAPSHOT_PREFIX`]; never the same
//! twice, so a retry never meets an earlier one) and clones it with the target's
//! mountpoint, mark and quota given to `zfs clone -o`, so the clone is marked before it
//! is mounted. A clone does not copy its origin's user properties (checked on zfs-fuse:
//! `nfsprov:volume` of the clone reads `-`), so it is unfinished until the store writes
//! its own record. When `zfs clone` fails, the snapshot is destroyed again; a quota below
//! what the source references is refused by zfs as "out of space" and reported as
//! [`ZfsError::Invalid`] with the size needed.
//!
//! A clone depends on its origin snapshot, and the snapshot on its dataset: `zfs destroy
//! -r` refuses a dataset whose snapshots have clones. So destroying one of the agent's
//! datasets (active or archived, also as a leftover) first looks for clones of it among
//! the agent's datasets (the `origin` of the configured dataset's children). If there are
//! any, the one whose snapshot is the newest (highest `createtxg`) is promoted: the
//! snapshots up to that one move onto it, the other clones follow theirs, and the
//! dataset becomes a clone of the promoted one's snapshot, with no dependents left. After
//! the dataset is destroyed, the snapshot it then depended on goes too when it is one of
//! the agent's clone snapshots and no other child depends on it (it existed only for
//! this clone); a failure there is logged, not returned. Hence, for a source S and a
//! clone C of `S@p`:
//! - C destroyed first: then `S@p`.
//! - S destroyed first: C is promoted (`C@p` is now S's origin), S goes, then `C@p`; C is
//!   independent, and later destroyed alone.
//! - Clones C1 of `S@p1` and C2 of `S@p2`, S destroyed: C2 is promoted, `C2@p1` is now
//!   C1's origin and goes with C1, `C2@p2` goes with S.
//! - S archived: its clones are promoted the same way first (zfs-fuse cannot rename a
//!   dataset while a mounted clone depends on one of its snapshots: "dataset is busy",
//!   for as long as the clone stays mounted). The archive is a clone of C's snapshot,
//!   which goes when the archive is destroyed.
//!
//! Snapshots move with promotions and archives, so a clone is refused unless
//! `<name>@<snapshot>` fits ZFS's 255 characters for the source's, the target's and an
//! archived name, and a promotion unless every snapshot that moves fits below the
//! promoted name. A dataset with clones the agent did not make (no mark, or outside the
//! configured dataset) is not destroyed: zfs refuses, and that is a
//! [`ZfsError::Conflict`].
//!
//! Every step leaves a state that a retry finishes: a promotion changes no data, and a
//! dataset promoted over is destroyed or archived like any other. A crash between the
//! snapshot and the clone leaves the snapshot, which goes with the source's dataset; one
//! between destroying a dataset and its origin snapshot leaves the snapshot, which goes
//! with the dataset it is a snapshot of.
//!
//! # Kept snapshots
//!
//! Snapshots the API names are ZFS snapshots `nfsprov-snapshot-<name>` of the volumes'
//! datasets; a dataset that has them is held, unmounted, instead of destroyed, until its
//! last one goes. See `kept`.
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
//! - `zfs destroy -r` of a dataset with clones unmounts it before it refuses; it is
//!   mounted again.
//! - `zfs rename` of an unmounted dataset one of whose snapshots is the origin of a
//!   mounted clone fails with "dataset is busy" about every other time, and then for as
//!   long as the clone is mounted (mounting and unmounting the dataset again does not
//!   help): [`Zfs::archive`] promotes such clones of the agent's first, after which the
//!   rename goes through.
//! - `zfs promote` does not check that the snapshots it moves keep names within 255
//!   characters; with a longer one the daemon crashes, and again on every listing of the
//!   pool after a restart. Promotions are checked here first (see "Clones").
//! - `zfs get -r -d 1` of a dataset lists its snapshots (they are one level down), not
//!   those of its children.
//!
//! # Interrupted operations
//!
//! Archiving is ordered so that every intermediate state is safe to retry: the
//! `mountpoint` is switched before the rename, so a dataset under an archive name always
//! knows where it belongs, and [`Zfs::purge_leftovers`] mounts finished datasets a crash
//! left unmounted. Calls for one path are not serialized here; the caller does that.
//!
//! `commands` builds the `zfs` command lines, `parse` reads what it prints, `names` holds
//! the properties and limits both use; this module orchestrates.

mod commands;
pub(in crate::store) mod dataset_backend;
mod kept;
mod names;
mod parse;

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nfsprov_api_types::VolumePath;
use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use self::parse::{
    Child, ChildKind, Properties, is_missing_dataset, parse_children, parse_properties,
    parse_snapshots,
};
use crate::quota::command::{ToolCommand, ToolError, ToolRunner, one_line};

pub(crate) use self::names::{
    ARCHIVE_NAME_PREFIX, CLONE_SNAPSHOT_PREFIX, META_PROPERTY, PATH_PROPERTY, SNAPSHOT_PREFIX,
};
use self::names::{MAX_DATASET_NAME_LEN, MAX_GUID_DIGITS, MAX_PROPERTY_VALUE_BYTES};
pub(crate) use self::parse::KeptSnapshot;

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
    /// Counts the commands run that may change datasets: a listing taken while it
    /// stayed the same is still what a new listing would find (see [`Zfs::changes`]).
    changes: std::sync::atomic::AtomicU64,
}

/// An archived volume's dataset of the agent's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchivedDataset {
    pub name: String,
    /// Where it is mounted, relative to the export root (`.archive/<path>/@<time>`).
    pub location: String,
    /// The volume path it was archived from (its `nfsprov:path`).
    pub path: VolumePath,
    /// The volume's metadata JSON.
    pub meta: Option<String>,
    /// Bytes it references.
    pub referenced: Option<u64>,
}

/// What a dataset depends on once [`Zfs::free_from_clones`] is done with it.
#[derive(Debug)]
struct Freed {
    /// The snapshot it is a clone of, if any.
    origin: Option<String>,
    /// Whether another child of the configured dataset is a clone of that snapshot too.
    shared: bool,
    /// Whether it has kept snapshots, and so is held rather than destroyed.
    holds_kept: bool,
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
            .run(&commands::get_properties(
                &["type", "mounted", "mountpoint"],
                dataset,
            ))
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
            changes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// How many commands that may change datasets have finished: unchanged between two
    /// reads, no dataset of the agent's changed through it meanwhile.
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Counts `command` among the changes unless it only reads (`zfs get`, `zfs list`).
    fn count_change(&self, command: &ToolCommand) {
        let reads = matches!(
            command.args.first().map(String::as_str),
            Some("get" | "list")
        );
        if !reads {
            self.changes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// A backend driving `runner` without probing a pool, for the store's tests.
    #[cfg(test)]
    pub(crate) fn for_tests(
        runner: Arc<dyn ToolRunner>,
        dataset: &str,
        export_root: &Path,
    ) -> Self {
        Self::new(runner, dataset, export_root)
    }

    /// How long destroy and rename retry while zfs reports the dataset busy.
    #[must_use]
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
        self.clear_the_way(&name, path)?;
        let mountpoint = self.mountpoint(path.as_str())?;
        let refquota = refquota.is_some().then_some(quota.as_str());
        self.run(&commands::create(
            &name,
            &mountpoint,
            path.as_str(),
            refquota,
        ))?;
        Ok(())
    }

    /// Makes the dataset for `path` a clone of the finished volume at `source`: a new
    /// snapshot of the source's dataset is cloned, mounted at `<export root>/<path>` and
    /// marked like [`Zfs::create`] makes a dataset, with `refquota` bytes or no quota. The
    /// target is handled like `create`'s. The clone shares the source's blocks until
    /// either is written, depends on the snapshot (see "Clones" above), and is
    /// unfinished until [`Zfs::write_meta`]. A quota below what the source references is
    /// refused.
    pub fn clone_volume(
        &self,
        source: &VolumePath,
        path: &VolumePath,
        refquota: Option<u64>,
    ) -> Result<()> {
        let source_name = self.dataset_name(source)?;
        let finished = |zfs: &Self| match zfs.volume_dataset(&source_name, source, &[])? {
            VolumeDataset::Finished(_) => Ok(()),
            _ => Err(ZfsError::NotFound(format!(
                "no volume at {source} to clone (no finished dataset {source_name} of the agent's)"
            ))),
        };
        self.clone_dataset(&source_name, source.as_str(), path, refquota, finished)
    }

    /// Makes the dataset for `path` a clone of the archived dataset mounted at `location`
    /// (relative to the export root), as [`Zfs::clone_volume`] clones a volume's: a new
    /// clone snapshot of the archive, cloned. The archive stays as it is; deleting it
    /// later promotes the clone first, as deleting any clone's source does (see
    /// "Clones").
    pub fn clone_archive(
        &self,
        location: &str,
        path: &VolumePath,
        refquota: Option<u64>,
    ) -> Result<()> {
        let archive = self
            .archives()?
            .into_iter()
            .find(|archive| archive.location == location)
            .ok_or_else(|| {
                ZfsError::NotFound(format!(
                    "no archived dataset at {location} to restore {path} from"
                ))
            })?;
        self.clone_dataset(&archive.name, location, path, refquota, |_| Ok(()))
    }

    /// Clones a new clone snapshot of the agent's dataset `source_name` (called `source`
    /// in messages) as the dataset for `path`, once the names fit and `check_source`
    /// finds the source fit to clone.
    fn clone_dataset(
        &self,
        source_name: &str,
        source: &str,
        path: &VolumePath,
        refquota: Option<u64>,
        check_source: impl FnOnce(&Self) -> Result<()>,
    ) -> Result<()> {
        let name = self.dataset_name(path)?;
        let quota = quota_value(refquota)?;
        let snapshot_name = clone_snapshot_name();
        self.check_clone_names(source, path, &[source_name, &name], &snapshot_name)?;
        let snapshot = format!("{source_name}@{snapshot_name}");
        let mountpoint = self.mountpoint(path.as_str())?;
        check_source(self)?;
        self.clear_the_way(&name, path)?;
        self.run(&commands::snapshot(&snapshot))?;
        let refquota_value = refquota.is_some().then_some(quota.as_str());
        if let Err(error) = self.run(&commands::clone(
            &snapshot,
            &name,
            &mountpoint,
            path.as_str(),
            refquota_value,
        )) {
            let error = self.clone_failure(error, source, &snapshot, refquota);
            self.undo_clone(&name, path, &snapshot);
            return Err(error);
        }
        Ok(())
    }

    /// Records the metadata; called last, after the mounted directory is set up, so its
    /// presence marks a finished volume. Overwrites earlier metadata.
    pub fn write_meta(&self, path: &VolumePath, json: &str) -> Result<()> {
        check_meta(json)?;
        let name = self.existing_volume_dataset(path)?;
        self.run(&commands::set(&name, META_PROPERTY, json))?;
        Ok(())
    }

    /// Sets the volume's capacity; `None` removes the limit. ZFS refuses a limit below
    /// what the volume already references.
    pub fn set_refquota(&self, path: &VolumePath, bytes: Option<u64>) -> Result<()> {
        let quota = quota_value(bytes)?;
        let name = self.existing_volume_dataset(path)?;
        self.run(&commands::set(&name, "refquota", &quota))?;
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
    /// mountpoint directory is gone. Clones of it are promoted first (see "Clones").
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
        // zfs-fuse cannot rename a dataset whose snapshot a mounted clone depends on.
        self.free_from_clones(&name)?;
        // zfs-fuse cannot rename a mounted dataset, and switching the mountpoint while
        // unmounted does not mount it at the archive before the rename is done.
        if properties.get("mounted").map(String::as_str) == Some("yes") {
            self.unmount(&name)?;
        }
        self.run(&commands::set(&name, "mountpoint", &archive_mountpoint))?;
        self.run_retrying_busy(&commands::rename(&name, &archived))?;
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

    /// Every archived dataset of the agent's mounted beneath the export root, sorted by
    /// where it is mounted.
    pub fn archives(&self) -> Result<Vec<ArchivedDataset>> {
        let output = self.run(&commands::get_archives(&self.dataset))?;
        let children =
            parse_children(&output, &self.dataset).map_err(ZfsError::UnexpectedOutput)?;
        let mut archives: Vec<ArchivedDataset> = children
            .into_iter()
            .filter(|child| child.kind == ChildKind::Archived && child.is_ours())
            .filter_map(|child| {
                let mountpoint = Path::new(child.properties.get("mountpoint")?);
                let location = mountpoint.strip_prefix(&self.export_root).ok()?.to_str()?;
                Some(ArchivedDataset {
                    location: location.to_owned(),
                    path: VolumePath::parse(child.properties.get(PATH_PROPERTY)?).ok()?,
                    meta: child.meta().cloned(),
                    referenced: child
                        .properties
                        .get("referenced")
                        .and_then(|v| v.parse().ok()),
                    name: child.name,
                })
            })
            .collect();
        archives.sort_by(|a, b| a.location.cmp(&b.location));
        Ok(archives)
    }

    /// Destroys the archived dataset mounted at `location` (relative to the export root)
    /// and the empty directory it leaves. No archived dataset there is success, and then
    /// nothing is touched.
    pub fn destroy_archive(&self, location: &str) -> Result<()> {
        let Some(archive) = self
            .archives()?
            .into_iter()
            .find(|archive| archive.location == location)
        else {
            return Ok(());
        };
        self.destroy_dataset(&archive.name)?;
        self.remove_mountpoint_dir(location)
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
        match self.runner.run(&commands::get_properties(properties, name)) {
            Ok(output) => Ok(Some(parse_properties(&output))),
            Err(e) if is_missing_dataset(&e) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// The direct children of the configured dataset with the properties that classify
    /// them.
    fn children(&self) -> Result<Vec<Child>> {
        let output = self.run(&commands::get_children(&self.dataset))?;
        parse_children(&output, &self.dataset).map_err(ZfsError::UnexpectedOutput)
    }

    /// Frees `path`'s dataset name for a new dataset: a leftover of an interrupted create
    /// or clone there is destroyed; a finished volume or a dataset the agent did not
    /// create is refused.
    fn clear_the_way(&self, name: &str, path: &VolumePath) -> Result<()> {
        match self.volume_dataset(name, path, &[])? {
            VolumeDataset::Absent => Ok(()),
            VolumeDataset::Unfinished(_) => self.destroy_dataset(name),
            VolumeDataset::Finished(_) => Err(ZfsError::Conflict(format!(
                "a volume already exists at {path} (dataset {name})"
            ))),
            VolumeDataset::Foreign => Err(foreign(name, path)),
        }
    }

    /// Refuses a clone whose snapshot could not be named, or could not move with a
    /// promotion or an archive: `<dataset>@<snapshot>` must fit ZFS's limit below the
    /// source's and the target's names and below an archived name. zfs-fuse refuses a
    /// rename that would make a snapshot's name too long, but lets a promotion do it and
    /// then crashes on every listing of the pool.
    fn check_clone_names(
        &self,
        source: &str,
        path: &VolumePath,
        names: &[&str],
        snapshot_name: &str,
    ) -> Result<()> {
        let archived = self.dataset.len() + 1 + ARCHIVE_NAME_PREFIX.len() + MAX_GUID_DIGITS;
        let longest = names.iter().map(|n| n.len()).fold(archived, usize::max);
        let needed = longest + 1 + snapshot_name.len();
        if needed > MAX_DATASET_NAME_LEN {
            return Err(ZfsError::Invalid(format!(
                "{path} cannot be a ZFS clone of {source}: the snapshot the clone depends on, `@{snapshot_name}`, must fit below either volume's dataset name and an archived one, which takes {needed} characters, and ZFS allows {MAX_DATASET_NAME_LEN}; use shorter paths"
            )));
        }
        Ok(())
    }

    /// What to report for a failed `zfs clone`: a quota below the source's size is
    /// refused by zfs as "out of space", which is said plainly here.
    fn clone_failure(
        &self,
        error: ZfsError,
        source: &str,
        snapshot: &str,
        refquota: Option<u64>,
    ) -> ZfsError {
        let (ZfsError::Tool(tool), Some(bytes)) = (&error, refquota) else {
            return error;
        };
        if !tool.stderr().contains("out of space") {
            return error;
        }
        let referenced = self
            .properties(snapshot, &["referenced"])
            .ok()
            .flatten()
            .and_then(|p| p.get("referenced")?.parse::<u64>().ok());
        match referenced {
            Some(referenced) if bytes < referenced => ZfsError::Invalid(format!(
                "a clone of {source} needs a capacity of at least {referenced} bytes, what the source's data takes now (ZFS refuses a quota below it); {bytes} bytes were asked for"
            )),
            _ => error,
        }
    }

    /// Destroys the snapshot of a failed clone, and the clone too when zfs made it before
    /// failing (to mount it, say). Failures are logged: the clone's error is the answer,
    /// and what stays is an unfinished leftover that goes with the next create or clone at
    /// the path, or at the next start.
    fn undo_clone(&self, name: &str, path: &VolumePath, snapshot: &str) {
        let error = match self.run_retrying_busy(&commands::destroy_snapshot(snapshot)) {
            Ok(_) => return,
            Err(ZfsError::Tool(e)) if is_missing_dataset(&e) => return,
            Err(e) => e,
        };
        let made = matches!(&error, ZfsError::Tool(e) if e.stderr().contains("dependent clones"))
            && matches!(
                self.volume_dataset(name, path, &[]),
                Ok(VolumeDataset::Unfinished(_))
            );
        let undone = if made {
            // Its snapshot goes with it.
            self.destroy_dataset(name)
        } else {
            Err(error)
        };
        if let Err(e) = undone {
            tracing::warn!(%snapshot, dataset = %name, error = %e, "could not remove what a failed clone left; it goes with the next create at its path or at the next start");
        }
    }

    /// Destroys a snapshot the agent took for a clone, once nothing needs it; a failure
    /// is logged, not returned (the caller's work is done without it). It stays while a
    /// clone depends on it, and goes with its dataset at the latest.
    fn destroy_clone_snapshot(&self, snapshot: &str) {
        match self.run_retrying_busy(&commands::destroy_snapshot(snapshot)) {
            Ok(_) => {}
            Err(ZfsError::Tool(e)) if is_missing_dataset(&e) => {}
            Err(ZfsError::Tool(e)) if e.stderr().contains("dependent clones") => {
                tracing::info!(%snapshot, "a clone's snapshot stays while a clone depends on it");
            }
            Err(e) => {
                tracing::warn!(%snapshot, error = %e, "could not destroy a clone's snapshot; it goes when its dataset is destroyed");
            }
        }
    }

    /// Destroys one of the agent's datasets (a direct child of the configured dataset)
    /// with its snapshots and anything below it; already gone is success. Clones of it
    /// among the agent's datasets survive (see [`Zfs::free_from_clones`]), and the agent's
    /// snapshot it was cloned from goes after it once no other dataset depends on that.
    /// See "Clones" above.
    ///
    /// A dataset that still has kept snapshots is held instead (see `kept`).
    fn destroy_dataset(&self, name: &str) -> Result<()> {
        let freed = self.free_from_clones(name)?;
        if freed.holds_kept {
            return self.hold(name);
        }
        match self.run_retrying_busy(&commands::destroy(name)) {
            Ok(_) => {}
            Err(ZfsError::Tool(e)) if is_missing_dataset(&e) => {}
            Err(ZfsError::Tool(e)) if e.stderr().contains("dependent clones") => {
                // zfs-fuse unmounts the dataset before it finds the clones.
                if let Err(mount) = self.mount(name) {
                    tracing::warn!(dataset = %name, error = %mount, "could not mount again a dataset zfs refused to destroy");
                }
                return Err(ZfsError::Conflict(format!(
                    "cannot destroy {name}: datasets the agent did not make are clones of its snapshots; promote or destroy them first ({})",
                    one_line(e.stderr())
                )));
            }
            Err(e) => return Err(e),
        }
        if let Some(origin) = freed.origin
            && is_clone_snapshot(&origin)
            && !freed.shared
        {
            self.destroy_clone_snapshot(&origin);
        }
        Ok(())
    }

    /// Makes sure no clone of the agent's depends on a snapshot of `name` (a direct child
    /// of the configured dataset), so that it can be destroyed or renamed: if any does,
    /// the one of the newest snapshot is promoted. Answers what `name` depends on then.
    fn free_from_clones(&self, name: &str) -> Result<Freed> {
        let (children, snapshots) = self.origins()?;
        let own_origin = children
            .iter()
            .find(|c| c.name == name)
            .and_then(Child::origin);
        let dependents: Vec<&Child> = children
            .iter()
            .filter(|c| c.is_ours() && c.origin().is_some_and(|o| snapshot_of(o) == Some(name)))
            .collect();
        // The snapshot `name` depends on once the clones are taken care of: as listed now,
        // and by its name afterwards.
        let kept_prefix = format!("{name}@{SNAPSHOT_PREFIX}");
        let (listed, origin, promoted, holds_kept) = if dependents.is_empty() {
            let holds_kept = snapshots.iter().any(|s| s.starts_with(&kept_prefix));
            (own_origin, own_origin.map(str::to_owned), None, holds_kept)
        } else {
            let (promoted, listed, holds_kept) = self.promote_newest_clone(name, &dependents)?;
            // The snapshot moved onto the promoted clone, and `name` is its clone now.
            let moved = format!("{promoted}{}", &listed[name.len()..]);
            (Some(listed), Some(moved), Some(promoted), holds_kept)
        };
        let shared = listed.is_some()
            && children.iter().any(|c| {
                c.name != name && Some(c.name.as_str()) != promoted && c.origin() == listed
            });
        Ok(Freed {
            origin,
            shared,
            holds_kept,
        })
    }

    /// Promotes the clone in `dependents` (clones of snapshots of `name`) whose snapshot
    /// is the newest, so that `name` has no dependents left: the snapshots up to that one
    /// move onto it, and the other clones follow theirs. Answers the promoted clone, the
    /// snapshot it was cloned from, as named before, and whether `name` still holds kept
    /// snapshots (newer ones, which stay).
    fn promote_newest_clone<'c>(
        &self,
        name: &str,
        dependents: &[&'c Child],
    ) -> Result<(&'c str, &'c str, bool)> {
        let output = self.run(&commands::get_snapshot_txgs(name))?;
        let snapshots = parse_snapshots(&output, name).map_err(ZfsError::UnexpectedOutput)?;
        let txg = |snapshot: &str| {
            snapshots
                .iter()
                .find(|s| s.name == snapshot)
                .map(|s| s.createtxg)
        };
        let (newest, newest_txg) = dependents
            .iter()
            .filter_map(|c| Some((*c, txg(c.origin()?)?)))
            .max_by_key(|(_, txg)| *txg)
            .ok_or_else(|| {
                ZfsError::UnexpectedOutput(format!(
                    "the snapshots of {name} that its clones depend on are not listed"
                ))
            })?;
        for moved in snapshots.iter().filter(|s| s.createtxg <= newest_txg) {
            let renamed = newest.name.len() + moved.name.len() - name.len();
            if renamed > MAX_DATASET_NAME_LEN {
                return Err(ZfsError::Conflict(format!(
                    "{name} cannot be destroyed or archived before its clone {} takes over its snapshot {}, whose name would then be {renamed} characters, and ZFS allows {MAX_DATASET_NAME_LEN}; destroy or rename that snapshot first",
                    newest.name, moved.name
                )));
            }
        }
        self.run_retrying_busy(&commands::promote(&newest.name))?;
        tracing::info!(dataset = %name, clone = %newest.name, "promoted a clone so that the dataset it was cloned from can go");
        let kept_prefix = format!("{name}@{SNAPSHOT_PREFIX}");
        let holds_kept = snapshots
            .iter()
            .any(|s| s.createtxg > newest_txg && s.name.starts_with(&kept_prefix));
        Ok((
            newest.name.as_str(),
            newest.origin().unwrap_or_default(),
            holds_kept,
        ))
    }

    /// The direct children of the configured dataset with their origins and marks, and
    /// the names of their snapshots.
    fn origins(&self) -> Result<(Vec<Child>, Vec<String>)> {
        let output = self.run(&commands::get_origins(&self.dataset))?;
        let children =
            parse_children(&output, &self.dataset).map_err(ZfsError::UnexpectedOutput)?;
        let mut snapshots: Vec<String> = output
            .lines()
            .filter_map(|line| line.split_once('\t').map(|(name, _)| name))
            .filter(|name| name.contains('@'))
            .map(str::to_owned)
            .collect();
        snapshots.dedup();
        Ok((children, snapshots))
    }

    fn unmount(&self, name: &str) -> Result<()> {
        match self.run(&commands::unmount(name)) {
            Err(ZfsError::Tool(e)) if e.stderr().contains("not currently mounted") => Ok(()),
            other => other.map(drop),
        }
    }

    fn mount(&self, name: &str) -> Result<()> {
        match self.run_retrying_busy(&commands::mount(name)) {
            Err(ZfsError::Tool(e)) if e.stderr().contains("already mounted") => Ok(()),
            other => other.map(drop),
        }
    }

    fn run(&self, command: &ToolCommand) -> Result<String> {
        let result = self.runner.run(command);
        // Counted once it is done, whatever its outcome: a listing made while it ran
        // may or may not show it, and is not reused after.
        self.count_change(command);
        Ok(result?)
    }

    /// Runs a command that zfs-fuse refuses as "busy" for a moment after an unmount,
    /// until it gets through or the busy wait is over.
    fn run_retrying_busy(&self, command: &ToolCommand) -> Result<String> {
        let deadline = Instant::now() + self.busy_wait;
        let mut pause = Duration::from_millis(10);
        loop {
            let result = self.runner.run(command);
            self.count_change(command);
            match result {
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

/// A new name for the snapshot a clone is made from: the time and a counter, so that no
/// two are alike, in this process or after a restart.
fn clone_snapshot_name() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let count = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("{CLONE_SNAPSHOT_PREFIX}{nanos}-{count}")
}

/// The dataset a snapshot (`<dataset>@<snapshot>`) is of.
fn snapshot_of(snapshot: &str) -> Option<&str> {
    snapshot.split_once('@').map(|(dataset, _)| dataset)
}

/// Whether `snapshot` is one the agent took to clone a volume.
fn is_clone_snapshot(snapshot: &str) -> bool {
    snapshot
        .split_once('@')
        .is_some_and(|(_, name)| name.starts_with(CLONE_SNAPSHOT_PREFIX))
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
mod tests;
