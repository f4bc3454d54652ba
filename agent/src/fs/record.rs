//! Volume records: what the agent knows of each volume it made (the settings it was made
//! with, its owner claim and the quota holding it), and how directory volumes keep them in
//! an extended attribute. A directory is a volume only if it carries a record, so the
//! agent never deletes, archives or adopts a directory it did not create.

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use nfsprov_api_types::{Mode as VolumeMode, QuotaBackend, Volume, VolumeOwner, VolumePath};
use rustix::fs::XattrFlags;
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::confine::{list_dir, may_be_directory, open_child};
use super::error::{Result, StoreError, io_error};

/// Extended attribute holding a directory volume's record.
const RECORD_XATTR: &str = "user.nfsprov.volume";
/// Written and removed once at start to learn whether records can be kept at all.
const PROBE_XATTR: &str = "user.nfsprov.probe";

/// The record kept with each volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub mode: VolumeMode,
    pub uid: u32,
    pub gid: u32,
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    pub created_at: String,
    /// The quota holding the volume to its capacity; absent when nothing enforces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaRecord>,
}

/// Which quota enforces a volume's capacity, with what the backend needs to find it again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuotaRecord {
    pub backend: QuotaBackend,
    /// The XFS project id the volume's tree carries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<u32>,
}

impl QuotaRecord {
    pub fn of(backend: QuotaBackend) -> Self {
        Self {
            backend,
            project_id: None,
        }
    }
}

impl VolumeRecord {
    pub fn to_volume(&self, path: &VolumePath) -> Volume {
        Volume {
            path: path.clone(),
            mode: self.mode,
            uid: self.uid,
            gid: self.gid,
            capacity_bytes: self.capacity_bytes,
            quota_enforced: self.quota.is_some(),
            owner: self.owner.clone(),
            created_at: self.created_at.clone(),
            usage: None,
        }
    }

    /// Decodes a record; unreadable records are treated as foreign: better refuse than guess.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }

    pub fn encode(&self) -> serde_json::Result<String> {
        serde_json::to_string(self)
    }
}

pub fn now_rfc3339() -> String {
    OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

/// The record of the directory `dir`, if it carries one.
pub fn read_xattr_record(dir: BorrowedFd<'_>) -> rustix::io::Result<Option<VolumeRecord>> {
    let mut buf = vec![0u8; 4096];
    match rustix::fs::fgetxattr(dir, RECORD_XATTR, &mut buf[..]) {
        Ok(len) => {
            buf.truncate(len);
            Ok(VolumeRecord::decode(&buf))
        }
        // zfs-fuse has no extended attributes; its volumes keep records in properties.
        Err(Errno::NODATA | Errno::NOTSUP) => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn write_xattr_record(dir: BorrowedFd<'_>, record: &VolumeRecord) -> rustix::io::Result<()> {
    let encoded = record.encode().map_err(|_| Errno::INVAL)?;
    rustix::fs::fsetxattr(dir, RECORD_XATTR, encoded.as_bytes(), XattrFlags::empty())
}

/// Fails unless user extended attributes work in `dir`: directory records depend on them.
pub fn check_xattr_support(dir: BorrowedFd<'_>, root: &std::path::Path) -> Result<()> {
    match rustix::fs::fsetxattr(dir, PROBE_XATTR, b"1", XattrFlags::empty()) {
        Ok(()) => {
            let _ = rustix::fs::fremovexattr(dir, PROBE_XATTR);
            Ok(())
        }
        Err(e) => Err(StoreError::NotReady(format!(
            "the filesystem of {} does not support user extended attributes ({}); the agent keeps volume records in them",
            root.display(),
            io::Error::from(e)
        ))),
    }
}

/// Collects the quota records of the directory volumes at or below `dir`, descending at
/// most `depth` levels and never into a volume.
pub fn collect_quota_records(
    dir: BorrowedFd<'_>,
    depth: usize,
    found: &mut Vec<QuotaRecord>,
) -> Result<()> {
    if depth == 0 {
        return Ok(());
    }
    for (name, kind) in list_dir(dir).map_err(|e| io_error("scan for volume records", e))? {
        if !may_be_directory(kind) {
            continue;
        }
        let Ok(child) = open_child(dir, &name, false) else {
            continue;
        };
        match read_xattr_record(child.as_fd()) {
            Ok(Some(record)) => found.extend(record.quota),
            Ok(None) => collect_quota_records(child.as_fd(), depth - 1, found)?,
            Err(e) => return Err(io_error(format!("read the record of {name}"), e)),
        }
    }
    Ok(())
}
