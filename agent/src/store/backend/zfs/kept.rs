//! Snapshots the API names, kept as ZFS snapshots of the volumes' datasets:
//! `<dataset>@nfsprov-snapshot-<name>` ([`SNAPSHOT_PREFIX`]). A name is unique per
//! agent, so a snapshot is found by it wherever it is now: a promotion moves it onto the
//! promoted clone, an archive renames its dataset.
//!
//! A dataset with snapshots cannot be destroyed without destroying them, so the rule is:
//! **the dataset of a volume deleted (or of an archive expired or deleted) while kept
//! snapshots of it remain is held, not destroyed**. It is unmounted, its mountpoint set
//! to `none` and renamed `:held:<guid>` ([`HELD_NAME_PREFIX`]): no longer a volume or an
//! archive, its path free for a new volume, never mounted again, but its blocks (which
//! the snapshots share) intact. When its last kept snapshot is deleted it is destroyed
//! like any dataset of the agent's. Archiving moves the snapshots with the dataset, which
//! stays mounted in the archive area as any archive.
//!
//! A volume restored from a snapshot is a ZFS clone of it and depends on it. Deleting
//! such a snapshot cannot destroy it: it is renamed to a clone snapshot's name
//! ([`CLONE_SNAPSHOT_PREFIX`]), which is no longer a kept snapshot (so it is gone for the
//! API at once), and it goes, as every clone snapshot of the agent's does, with the last
//! clone depending on it. Deleting the source first promotes such clones as for any
//! clone (see the module's "Clones"), which moves the snapshot onto the promoted clone.
//!
//! Space: a snapshot's `used` (what only it holds, freed when it goes) is charged to its
//! dataset's `used`, not to the volume's `refquota`, so snapshots never fill a volume.

use std::collections::BTreeMap;

use nfsprov_api_types::VolumePath;

use super::names::{
    ARCHIVE_NAME_PREFIX, HELD_NAME_PREFIX, MAX_DATASET_NAME_LEN, MAX_GUID_DIGITS, SNAPSHOT_PREFIX,
};
use super::parse::{KeptSnapshot, is_missing_dataset, parse_kept_snapshots, parse_snapshots};
use super::{
    VolumeDataset, Zfs, ZfsError, clone_snapshot_name, commands, foreign, quota_value, snapshot_of,
};

type Result<T> = std::result::Result<T, ZfsError>;

impl Zfs {
    /// Takes the kept snapshot `name` of the finished volume at `source`.
    pub fn take_snapshot(&self, source: &VolumePath, name: &str) -> Result<()> {
        let dataset = self.dataset_name(source)?;
        let snapshot = format!("{SNAPSHOT_PREFIX}{name}");
        // Snapshots move with archives and holds: they must fit below those names too.
        let moved = self.dataset.len()
            + 1
            + ARCHIVE_NAME_PREFIX.len().max(HELD_NAME_PREFIX.len())
            + MAX_GUID_DIGITS;
        let needed = dataset.len().max(moved) + 1 + snapshot.len();
        if needed > MAX_DATASET_NAME_LEN {
            return Err(ZfsError::Invalid(format!(
                "snapshot {name} of {source}: its ZFS name must fit below the volume's dataset name and an archived one, which takes {needed} characters, and ZFS allows {MAX_DATASET_NAME_LEN}; use a shorter path or name"
            )));
        }
        match self.volume_dataset(&dataset, source, &[])? {
            VolumeDataset::Finished(_) => {}
            VolumeDataset::Foreign => return Err(foreign(&dataset, source)),
            VolumeDataset::Absent | VolumeDataset::Unfinished(_) => {
                return Err(ZfsError::NotFound(format!(
                    "no volume at {source} to snapshot (no finished dataset {dataset} of the agent's)"
                )));
            }
        }
        self.run(&commands::snapshot(&format!("{dataset}@{snapshot}")))?;
        Ok(())
    }

    /// Every kept snapshot of the agent's datasets, by its API name.
    pub fn kept_snapshots(&self) -> Result<BTreeMap<String, KeptSnapshot>> {
        let output = self.run(&commands::get_child_snapshots(&self.dataset))?;
        Ok(parse_kept_snapshots(&output, &self.dataset)
            .into_iter()
            .filter_map(|(full_name, properties)| {
                let (_, snapshot) = full_name.split_once('@')?;
                let name = snapshot.strip_prefix(SNAPSHOT_PREFIX)?.to_owned();
                let figure = |p: &str| properties.get(p).and_then(|v| v.parse().ok());
                Some((
                    name,
                    KeptSnapshot {
                        used: figure("used"),
                        referenced: figure("referenced"),
                        full_name,
                    },
                ))
            })
            .collect())
    }

    /// The kept snapshot `name` of the volume at `source`, asked of that one snapshot
    /// (`<dataset>@nfsprov-snapshot-<name>`, where [`Self::take_snapshot`] takes it) with
    /// its `used` and `referenced`: `None` when it is not there.
    pub fn kept_snapshot_of(
        &self,
        source: &VolumePath,
        name: &str,
    ) -> Result<Option<KeptSnapshot>> {
        let full_name = format!("{}@{SNAPSHOT_PREFIX}{name}", self.dataset_name(source)?);
        let Some(properties) = self.properties(&full_name, &["used", "referenced"])? else {
            return Ok(None);
        };
        let figure = |p: &str| properties.get(p).and_then(|v| v.parse().ok());
        Ok(Some(KeptSnapshot {
            used: figure("used"),
            referenced: figure("referenced"),
            full_name,
        }))
    }

    /// The kept snapshot `name`, wherever it is now.
    pub fn kept_snapshot(&self, name: &str) -> Result<Option<KeptSnapshot>> {
        Ok(self.kept_snapshots()?.remove(name))
    }

    /// Deletes the kept snapshot `name`: destroyed, or, while restored volumes depend on
    /// it, renamed to a clone snapshot that goes with the last of them. A held dataset
    /// left without kept snapshots is destroyed. Whether there was such a snapshot.
    pub fn drop_snapshot(&self, name: &str) -> Result<bool> {
        let Some(kept) = self.kept_snapshot(name)? else {
            return Ok(false);
        };
        let dataset = snapshot_of(&kept.full_name).unwrap_or_default().to_owned();
        match self.run_retrying_busy(&commands::destroy_snapshot(&kept.full_name)) {
            Ok(_) => {}
            Err(ZfsError::Tool(e)) if is_missing_dataset(&e) => {}
            Err(ZfsError::Tool(e)) if e.stderr().contains("dependent clones") => {
                let deferred = format!("{dataset}@{}", clone_snapshot_name());
                self.run_retrying_busy(&commands::rename(&kept.full_name, &deferred))?;
                tracing::info!(snapshot = %name, zfs_snapshot = %deferred, "a deleted snapshot stays while volumes restored from it depend on it");
            }
            Err(e) => return Err(e),
        }
        let held = dataset
            .strip_prefix(&format!("{}/", self.dataset))
            .is_some_and(|child| child.starts_with(HELD_NAME_PREFIX));
        if held && !self.holds_kept_snapshots(&dataset)? {
            self.destroy_dataset(&dataset)?;
            tracing::info!(dataset = %dataset, "destroyed a deleted volume's dataset with its last snapshot");
        }
        Ok(true)
    }

    /// Makes the dataset for `path` a clone of the kept snapshot `name`, mounted and
    /// marked as [`Zfs::clone_volume`] makes one, with `refquota` bytes or no quota.
    pub fn clone_snapshot(
        &self,
        name: &str,
        path: &VolumePath,
        refquota: Option<u64>,
    ) -> Result<()> {
        let kept = self.kept_snapshot(name)?.ok_or_else(|| {
            ZfsError::NotFound(format!("no snapshot {name} to restore {path} from"))
        })?;
        let target = self.dataset_name(path)?;
        let quota = quota_value(refquota)?;
        let snapshot_len = kept.full_name.len() - snapshot_of(&kept.full_name).unwrap_or("").len();
        // A promotion of the restore moves the snapshot below its name.
        if target.len() + snapshot_len > MAX_DATASET_NAME_LEN {
            return Err(ZfsError::Invalid(format!(
                "{path} cannot be restored from snapshot {name}: the snapshot may move below its dataset name, which would take {} characters, and ZFS allows {MAX_DATASET_NAME_LEN}; use a shorter path",
                target.len() + snapshot_len
            )));
        }
        let mountpoint = self.mountpoint(path.as_str())?;
        self.clear_the_way(&target, path)?;
        let refquota_value = refquota.is_some().then_some(quota.as_str());
        if let Err(error) = self.run(&commands::clone(
            &kept.full_name,
            &target,
            &mountpoint,
            path.as_str(),
            refquota_value,
        )) {
            let error = match (&error, refquota, kept.referenced) {
                (ZfsError::Tool(tool), Some(bytes), Some(referenced))
                    if tool.stderr().contains("out of space") && bytes < referenced =>
                {
                    ZfsError::Invalid(format!(
                        "a restore of snapshot {name} needs a capacity of at least {referenced} bytes, what its data takes (ZFS refuses a quota below it); {bytes} bytes were asked for"
                    ))
                }
                _ => error,
            };
            if matches!(
                self.volume_dataset(&target, path, &[]),
                Ok(VolumeDataset::Unfinished(_))
            ) && let Err(e) = self.destroy_dataset(&target)
            {
                tracing::warn!(dataset = %target, error = %e, "could not remove what a failed restore left; it goes with the next create at its path or at the next start");
            }
            return Err(error);
        }
        Ok(())
    }

    /// Whether `dataset` has kept snapshots.
    pub(super) fn holds_kept_snapshots(&self, dataset: &str) -> Result<bool> {
        let output = match self.runner.run(&commands::get_snapshot_txgs(dataset)) {
            Ok(output) => output,
            Err(e) if is_missing_dataset(&e) => return Ok(false),
            Err(e) => return Err(e.into()),
        };
        let snapshots = parse_snapshots(&output, dataset).map_err(ZfsError::UnexpectedOutput)?;
        Ok(snapshots.iter().any(|s| {
            s.name
                .split_once('@')
                .is_some_and(|(_, short)| short.starts_with(SNAPSHOT_PREFIX))
        }))
    }

    /// Holds `name` for its kept snapshots instead of destroying it: unmounted, never to
    /// be mounted again, renamed out of the volumes' and archives' names.
    pub(super) fn hold(&self, name: &str) -> Result<()> {
        let properties = self
            .properties(name, &["mounted", "guid"])?
            .ok_or_else(|| ZfsError::NotFound(format!("no dataset {name} to hold")))?;
        let guid = properties
            .get("guid")
            .filter(|g| !g.is_empty() && g.bytes().all(|b| b.is_ascii_digit()))
            .ok_or_else(|| ZfsError::UnexpectedOutput(format!("no numeric guid for {name}")))?;
        let held = format!("{}/{HELD_NAME_PREFIX}{guid}", self.dataset);
        if properties.get("mounted").map(String::as_str) == Some("yes") {
            self.unmount(name)?;
        }
        self.run(&commands::set(name, "mountpoint", "none"))?;
        if name != held {
            self.run_retrying_busy(&commands::rename(name, &held))?;
        }
        tracing::info!(dataset = %name, held = %held, "kept a deleted volume's dataset, unmounted, for its snapshots");
        Ok(())
    }
}
