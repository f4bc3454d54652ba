//! Snapshots: a volume's content at one point in time, kept by the agent outside every
//! volume (no tenant can mount it), and volumes restored from them.
//!
//! A snapshot is named by the controller (one name per Kubernetes `Snapshot` object), so
//! a create retried after a lost answer finds the snapshot it made instead of making a
//! second one.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::export::ExportRequest;
use crate::path::VolumePath;
use crate::types::{CloneMethod, QuotaPolicy, VolumeOwner};

/// The longest snapshot name, in bytes: a DNS label, so a name made of a Kubernetes
/// object's UID with a short prefix fits.
pub const MAX_SNAPSHOT_NAME: usize = 63;

/// A snapshot's name: 1 to [`MAX_SNAPSHOT_NAME`] lowercase ASCII letters, digits and
/// `-`, starting and ending with a letter or digit. No `/`, `.` or `..`, so a name is
/// always one plain directory entry wherever the agent keeps it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SnapshotName(String);

/// Why a string is not a [`SnapshotName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotNameError {
    #[error("a snapshot name must not be empty")]
    Empty,
    #[error("a snapshot name is at most {MAX_SNAPSHOT_NAME} bytes, not {0}")]
    TooLong(usize),
    #[error(
        "a snapshot name holds only lowercase letters, digits and '-', and starts and ends with a letter or digit"
    )]
    Invalid,
}

impl SnapshotName {
    pub fn parse(raw: &str) -> Result<Self, SnapshotNameError> {
        if raw.is_empty() {
            return Err(SnapshotNameError::Empty);
        }
        if raw.len() > MAX_SNAPSHOT_NAME {
            return Err(SnapshotNameError::TooLong(raw.len()));
        }
        let allowed = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let bytes = raw.as_bytes();
        let ends_ok = allowed(bytes[0]) && allowed(bytes[bytes.len() - 1]);
        if !ends_ok || !bytes.iter().all(|&c| allowed(c) || c == b'-') {
            return Err(SnapshotNameError::Invalid);
        }
        Ok(SnapshotName(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SnapshotName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SnapshotName {
    type Err = SnapshotNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for SnapshotName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        SnapshotName::parse(&raw).map_err(serde::de::Error::custom)
    }
}

/// Body of `PUT /v1/snapshots/{name}`. The same request again is answered with the same
/// snapshot (running or done); the name taken by a snapshot of another volume is a
/// `conflict`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateSnapshotRequest {
    /// The volume whose content is kept, on this agent.
    pub source: VolumePath,
}

/// How the agent keeps a snapshot: the fastest exact method the source volume allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SnapshotMethod {
    /// A read-only btrfs snapshot of the source's subvolume: instant, point in time.
    BtrfsSnapshot,
    /// A ZFS snapshot of the source's dataset: instant, point in time.
    ZfsSnapshot,
    /// Every file's data shared by `FICLONE` reflinks; the tree is walked file by file.
    Reflink,
    /// A local copy, file by file, at disk speed.
    Copy,
    /// A method newer than this side knows: shown as `unknown`, never acted on.
    #[serde(other)]
    Unknown,
}

impl SnapshotMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotMethod::BtrfsSnapshot => "btrfs-snapshot",
            SnapshotMethod::ZfsSnapshot => "zfs-snapshot",
            SnapshotMethod::Reflink => "reflink",
            SnapshotMethod::Copy => "copy",
            SnapshotMethod::Unknown => "unknown",
        }
    }
}

impl fmt::Display for SnapshotMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A snapshot as the agent sees it: the answer to create and get, an element of the list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    pub name: SnapshotName,
    /// The volume it was taken of. The snapshot outlives it: deleting or archiving the
    /// source leaves its snapshots and their restores as they are.
    pub source: VolumePath,
    pub method: SnapshotMethod,
    /// `false` while a reflink or copy snapshot is still being made; such a snapshot is
    /// not listed as ready and cannot be restored from yet.
    pub ready: bool,
    /// RFC 3339 UTC time of the point in time the snapshot holds (for a reflink or copy,
    /// when its walk began).
    pub created_at: String,
    /// The source's capacity when the snapshot was taken: the least a restore may ask for.
    pub restore_size_bytes: u64,
    /// Bytes of file data the snapshot holds (holes not counted), once ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Bytes only this snapshot holds, which deleting it would free, where the
    /// filesystem knows them (btrfs with quotas, ZFS `used`); absent elsewhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exclusive_bytes: Option<u64>,
}

/// Answer to `GET /v1/snapshots`, sorted by name; paged by the same query as volumes
/// ([`ListQuery`](crate::ListQuery), `after` a snapshot name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotList {
    pub snapshots: Vec<Snapshot>,
    /// The `after` of the next page; absent on the last page and on an unpaged answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Body of `POST /v1/restores/{path}`: make the volume at `path` from a ready snapshot.
/// Answered as a clone is: `201` with the volume when made by this call, `200` when it
/// was there already (the same snapshot, capacity and owner), `202` with a
/// [`RestoreProgress`] while a reflink or copy runs (repeat the same request later).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreVolumeRequest {
    pub snapshot: SnapshotName,
    /// Size in bytes of the new volume, at least the snapshot's `restore_size_bytes`
    /// (`invalid_body` otherwise).
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    #[serde(default)]
    pub quota: QuotaPolicy,
    /// Who may mount the volume, as for a create.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// Answer `202 Accepted` of `POST /v1/restores/{path}`: the restore is still being made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreProgress {
    pub snapshot: SnapshotName,
    /// Seconds since the agent started this restore.
    pub running_seconds: u64,
}

/// Where a restored volume's data came from, and how it was made (`Volume::restore`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOrigin {
    pub snapshot: SnapshotName,
    /// A btrfs snapshot of a btrfs snapshot, a ZFS clone of a ZFS snapshot, a reflink or
    /// a copy.
    pub method: CloneMethod,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in [
            "a",
            "9",
            "snap-0f8e1c2a-5b7d-4e0f-9a1b-2c3d4e5f6a7b",
            &"x".repeat(MAX_SNAPSHOT_NAME),
        ] {
            let name = SnapshotName::parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(name.as_str(), ok);
        }
    }

    #[test]
    fn refuses_anything_else() {
        for (bad, error) in [
            ("", SnapshotNameError::Empty),
            (
                &"x".repeat(MAX_SNAPSHOT_NAME + 1)[..],
                SnapshotNameError::TooLong(MAX_SNAPSHOT_NAME + 1),
            ),
            ("-a", SnapshotNameError::Invalid),
            ("a-", SnapshotNameError::Invalid),
            ("A", SnapshotNameError::Invalid),
            ("a/b", SnapshotNameError::Invalid),
            ("..", SnapshotNameError::Invalid),
            ("a.b", SnapshotNameError::Invalid),
            ("a b", SnapshotNameError::Invalid),
            ("é", SnapshotNameError::Invalid),
        ] {
            assert_eq!(SnapshotName::parse(bad), Err(error), "{bad:?}");
        }
    }

    #[test]
    fn a_name_is_checked_when_read_from_json() {
        assert!(serde_json::from_str::<SnapshotName>("\"../etc\"").is_err());
        let name: SnapshotName = serde_json::from_str("\"snap-1\"").unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"snap-1\"");
    }

    #[test]
    fn an_older_side_reads_a_newer_method_as_unknown() {
        let method: SnapshotMethod = serde_json::from_str("\"lvm-thin\"").unwrap();
        assert_eq!(method, SnapshotMethod::Unknown);
    }
}
