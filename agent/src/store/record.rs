//! Volume records: what the agent knows of each volume it made or adopted (the settings it
//! was made with or found with, its owner claim and the quota holding it). A directory is
//! a volume only if the agent holds a record of it, so the agent never deletes or archives
//! a directory it did not create or was not explicitly asked to adopt.
//!
//! Directory volumes' records live where only the agent can write: in the agent's own
//! directory beneath the root (`.nfsprov/records`, mode 0700), one entry per volume, named
//! after the volume directory's identity (inode number and birth time), which renames
//! into staging, place, trash or archive do not change. Nothing a tenant writes inside a
//! volume, an extended attribute included, is ever read as a record.
//!
//! Each record is the target of a symbolic link: a link is created and renamed over the
//! old one in single metadata operations, so a crash leaves either the old record or the
//! new one, never a torn one. The shard directory holding it is synced with the rest of
//! the request's changes before the request answers (see `durable`).
//!
//! The store also keeps, in memory, the paths its records name in path order ([`PathIndex`]),
//! so a page of the volume list starts at its cursor instead of reading every record. It
//! is built from the records each time the store opens, so nothing about it has to
//! survive a crash, and changed with each record under the lock of the record's shard.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};

use nfsprov_api_types::{
    CloneOrigin, Mode, QuotaBackend, RestoreOrigin, Volume, VolumeOwner, VolumePath,
};
use rustix::fs::{AtFlags, StatxFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;

use super::confine::list_dir;
use super::error::{Result, StoreError, io_error};

/// Longest record a link can hold (its target is at most `PATH_MAX - 1` bytes).
const MAX_RECORD_BYTES: usize = 4095;

/// The record kept with each volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeRecord {
    pub mode: Mode,
    pub uid: u32,
    pub gid: u32,
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    pub created_at: String,
    /// The quota holding the volume to its capacity; absent when nothing enforces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quota: Option<QuotaRecord>,
    /// Set when the volume is archived: written just before the move, so an archive
    /// never exists without it. On a volume still at its path (the move failed) it means
    /// nothing and is replaced by the next archive.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archive: Option<ArchiveRecord>,
    /// The volume this one was cloned from, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneOrigin>,
    /// The snapshot this volume was restored from, and how.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreOrigin>,
}

/// When a volume was archived and how long its archive is kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveRecord {
    /// RFC 3339 UTC: the instant the archive's entry name carries.
    pub archived_at: String,
    /// Days to keep the archive, as the archive request asked; absent: the agent's
    /// default at the time of each sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_days: Option<u32>,
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
            clone: self.clone.clone(),
            export: None,
            restore: self.restore.clone(),
            condition: None,
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

pub(super) fn now_rfc3339() -> String {
    rfc3339(OffsetDateTime::now_utc())
}

pub(super) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

pub(super) fn parse_rfc3339(text: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339).ok()
}

/// What tells one directory from every other on the root's filesystem for as long as it
/// exists, whatever it is renamed to: its inode number, and its birth time where the
/// filesystem keeps one (every btrfs subvolume's root has inode 256).
///
/// A btrfs snapshot's root has the inode number and birth time of its source's root, so
/// a subvolume root is also told by its subvolume id. Records of subvolumes kept before
/// that id was part of the key are still found under the old key ([`Self::legacy_key`])
/// and move to the new one when next written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Identity {
    ino: u64,
    birth: Option<(i64, u32)>,
    subvolume: Option<u64>,
}

impl Identity {
    pub(super) fn of(dir: BorrowedFd<'_>) -> rustix::io::Result<Self> {
        let stat = rustix::fs::statx(
            dir,
            c"",
            AtFlags::EMPTY_PATH,
            StatxFlags::INO | StatxFlags::BTIME,
        )?;
        let birth = (stat.stx_mask & StatxFlags::BTIME.bits() != 0)
            .then_some((stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec));
        let subvolume = (stat.stx_ino == crate::subvolume::SUBVOLUME_ROOT_INODE)
            .then(|| crate::subvolume::subvolume_id(dir))
            .flatten();
        Ok(Self {
            ino: stat.stx_ino,
            birth,
            subvolume,
        })
    }

    /// Where the record of this identity is kept in the store: one of 256 shards (so
    /// concurrent requests rarely wait for the same directory's lock), then the name.
    pub(super) fn key(&self) -> (usize, String) {
        let (shard, name) = self.key_without_subvolume();
        match self.subvolume {
            Some(id) => (shard, format!("{name}-subvolume{id}")),
            None => (shard, name),
        }
    }

    /// The key a subvolume's record had before subvolume ids were part of it.
    pub(super) fn legacy_key(&self) -> Option<(usize, String)> {
        self.subvolume.map(|_| self.key_without_subvolume())
    }

    fn key_without_subvolume(&self) -> (usize, String) {
        let shard = (self.ino % SHARDS as u64) as usize;
        let name = match self.birth {
            Some((seconds, nanos)) => format!("{}-{seconds}.{nanos:09}", self.ino),
            None => self.ino.to_string(),
        };
        (shard, name)
    }
}

/// Where a record is kept: its shard and its name there.
pub(super) type RecordKey = (usize, String);

/// A record as stored: the volume's record, the path it was made for, and the identity
/// of its directory (checked again on every read).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct StoredRecord {
    path: String,
    #[serde(flatten)]
    record: VolumeRecord,
    /// The directory's inode generation, where the filesystem keeps no birth time: an
    /// inode number is reused as soon as it is freed, its generation changes then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    generation: Option<u32>,
}

/// `FS_IOC_GETVERSION`: `_IOR('v', 1, long)`; the kernel writes an `int`.
const GET_VERSION: rustix::ioctl::Opcode = rustix::ioctl::opcode::read::<std::ffi::c_long>(b'v', 1);

/// The inode generation of `dir`, where the filesystem has one (ext4, XFS, btrfs).
#[allow(unsafe_code)]
fn generation_of(dir: BorrowedFd<'_>) -> Option<u32> {
    // SAFETY: the kernel writes one `int` (4 bytes) into the `u32` the getter holds.
    unsafe { rustix::ioctl::ioctl(dir, rustix::ioctl::Getter::<GET_VERSION, u32>::new()) }.ok()
}

/// The volume paths the records name, in path order, each with the number of records
/// naming it (an archive's record keeps the path its volume had, so several can). It
/// never lacks a path a record names: a path is counted before its record is linked and
/// uncounted after it is unlinked or replaced, under the shard's lock. A path counted
/// while nothing is at it (archived, or being removed) is passed over by the listing,
/// which checks every volume at its path.
#[derive(Debug, Default)]
struct PathIndex {
    paths: Mutex<BTreeMap<Box<str>, u32>>,
}

impl PathIndex {
    fn lock(&self) -> MutexGuard<'_, BTreeMap<Box<str>, u32>> {
        // The map is changed by whole inserts and removes, never left half-done.
        self.paths.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Only valid volume paths are counted, the one kind the listing could return.
    fn add(&self, path: &str) {
        if VolumePath::parse(path).is_ok() {
            *self.lock().entry(path.into()).or_insert(0) += 1;
        }
    }

    fn remove(&self, path: &str) {
        let mut paths = self.lock();
        if let Some(count) = paths.get_mut(path) {
            *count -= 1;
            if *count == 0 {
                paths.remove(path);
            }
        }
    }

    /// The first `keep` paths after `after`, and whether more follow.
    fn after(&self, after: Option<&VolumePath>, keep: usize) -> (Vec<VolumePath>, bool) {
        let paths = self.lock();
        let start = after.map_or(Bound::Unbounded, |after| Bound::Excluded(after.as_str()));
        let mut found = paths
            .range::<str, _>((start, Bound::Unbounded))
            .map(|(path, _)| path);
        let kept = found
            .by_ref()
            .take(keep)
            .filter_map(|path| VolumePath::parse(path).ok())
            .collect();
        (kept, found.next().is_some())
    }
}

/// The path a stored record names, read without the rest of it.
fn path_in(target: &[u8]) -> Option<String> {
    #[derive(Deserialize)]
    struct PathOnly {
        path: String,
    }
    serde_json::from_slice::<PathOnly>(target)
        .ok()
        .map(|p| p.path)
}

/// The agent's own store of directory volumes' records.
#[derive(Debug)]
pub(super) struct RecordStore {
    /// The shards, by the two hex digits of their name.
    shards: Vec<OwnedFd>,
    /// Held while a shard's links change, so `paths` changes with them.
    shard_locks: Vec<Mutex<()>>,
    paths: PathIndex,
    unique: AtomicU64,
}

/// Beneath the agent's state directory.
const RECORDS_DIR: &str = "records";
const SHARDS: usize = 256;

fn private_dir(parent: BorrowedFd<'_>, name: &str) -> Result<OwnedFd> {
    match rustix::fs::mkdirat(parent, name, rustix::fs::Mode::from_raw_mode(0o700)) {
        Ok(()) | Err(Errno::EXIST) => {}
        Err(e) => return Err(io_error("create the record store", e)),
    }
    let dir = super::confine::open_child(parent, name, false)?;
    // Whatever the umask or an earlier version left: the records are the agent's alone.
    rustix::fs::fchmod(&dir, rustix::fs::Mode::from_raw_mode(0o700))
        .map_err(|e| io_error("restrict the record store", e))?;
    Ok(dir)
}

impl RecordStore {
    /// Opens (making it when missing) the store in `state`, the agent's own directory.
    pub(super) fn open(state: BorrowedFd<'_>) -> Result<Self> {
        let top = private_dir(state, RECORDS_DIR)?;
        let shards: Vec<OwnedFd> = (0..SHARDS)
            .map(|n| private_dir(top.as_fd(), &format!("{n:02x}")))
            .collect::<Result<_>>()?;
        let paths = PathIndex::default();
        for shard in &shards {
            for (name, _) in list_dir(shard.as_fd()).map_err(|e| io_error("list records", e))? {
                // A replacement a crash interrupted, never counted.
                if name.starts_with('.') {
                    continue;
                }
                if let Some(path) = read_path(shard.as_fd(), &name)? {
                    paths.add(&path);
                }
            }
        }
        Ok(Self {
            shards,
            shard_locks: (0..SHARDS).map(|_| Mutex::new(())).collect(),
            paths,
            unique: AtomicU64::new(0),
        })
    }

    fn lock_shard(&self, shard: usize) -> MutexGuard<'_, ()> {
        self.shard_locks[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Unlinks the record `name` of shard `shard` (absent already is fine) and uncounts
    /// its path.
    fn unlink_counted(&self, shard: usize, name: &str) -> Result<()> {
        let _locked = self.lock_shard(shard);
        let fd = self.shards[shard].as_fd();
        let path = read_path(fd, name)?;
        unlink_record(fd, name)?;
        if let Some(path) = path {
            self.paths.remove(&path);
        }
        Ok(())
    }

    fn shard(&self, identity: &Identity) -> (BorrowedFd<'_>, String) {
        let (shard, name) = identity.key();
        (self.shards[shard].as_fd(), name)
    }

    /// The record of the volume whose directory is `dir`, with the path it was made for.
    pub(super) fn read(&self, dir: BorrowedFd<'_>) -> Result<Option<(String, VolumeRecord)>> {
        let identity = Identity::of(dir).map_err(|e| io_error("identify a directory", e))?;
        let (shard, name) = self.shard(&identity);
        let mut stored = read_stored(shard, &name)?;
        if stored.is_none()
            && let Some((shard, name)) = identity.legacy_key()
        {
            stored = read_stored(self.shards[shard].as_fd(), &name)?;
        }
        let Some(stored) = stored else {
            return Ok(None);
        };
        // Another directory that was given the recorded one's inode number after it was
        // removed (by hand: the agent removes a record before the directory).
        if let (Some(recorded), Some(now)) = (stored.generation, generation_of(dir))
            && recorded != now
        {
            return Ok(None);
        }
        Ok(Some((stored.path, stored.record)))
    }

    pub(super) fn read_identity(
        &self,
        identity: &Identity,
    ) -> Result<Option<(String, VolumeRecord)>> {
        let (shard, name) = self.shard(identity);
        if let Some(found) = read_link(shard, &name)? {
            return Ok(Some(found));
        }
        match identity.legacy_key() {
            Some((shard, name)) => read_link(self.shards[shard].as_fd(), &name),
            None => Ok(None),
        }
    }

    /// Moves the record of a subvolume kept under its legacy key to its own key, before
    /// the subvolume is snapshotted: the snapshot's legacy key is the same, and must not
    /// lead to its source's record.
    pub(super) fn settle(&self, dir: BorrowedFd<'_>) -> Result<()> {
        let identity = Identity::of(dir).map_err(|e| io_error("identify a directory", e))?;
        let Some((shard, legacy)) = identity.legacy_key() else {
            return Ok(());
        };
        let (_, name) = self.shard(&identity);
        if read_link(self.shards[shard].as_fd(), &name)?.is_some() {
            return Ok(());
        }
        if let Some((path, record)) = read_link(self.shards[shard].as_fd(), &legacy)? {
            self.write(dir, &path, &record)?;
        }
        Ok(())
    }

    /// Records (or replaces) the record of the volume whose directory is `dir`.
    pub(super) fn write(
        &self,
        dir: BorrowedFd<'_>,
        path: &str,
        record: &VolumeRecord,
    ) -> Result<()> {
        let identity = Identity::of(dir).map_err(|e| io_error("identify a directory", e))?;
        let stored = serde_json::to_string(&StoredRecord {
            path: path.to_owned(),
            record: record.clone(),
            generation: identity
                .birth
                .is_none()
                .then(|| generation_of(dir))
                .flatten(),
        })
        .map_err(|e| StoreError::Io {
            context: format!("encode the record of {path}"),
            source: std::io::Error::other(e),
        })?;
        if stored.len() > MAX_RECORD_BYTES {
            return Err(StoreError::Unsupported(format!(
                "the record of {path} would be {} bytes, more than the {MAX_RECORD_BYTES} a record can hold",
                stored.len()
            )));
        }
        // A new volume has no record yet: one operation. A changed one is replaced by a
        // rename, so a crash leaves the old record or the new one.
        self.write_identity(&identity, path, &stored)
    }

    /// Records (or replaces) the record, under the identity's own key; a record under
    /// its legacy key for the same path is then dropped, having moved.
    fn write_identity(&self, identity: &Identity, path: &str, stored: &str) -> Result<()> {
        let (number, name) = identity.key();
        let shard = self.shards[number].as_fd();
        let failed = |e| io_error(format!("write the record of {path}"), e);
        {
            let _locked = self.lock_shard(number);
            // Counted first: a page asked for meanwhile may list a path with no record
            // yet (and pass over it), never miss one that has a record.
            self.paths.add(path);
            let replaced = match rustix::fs::symlinkat(stored, shard, name.as_str()) {
                Ok(()) => Ok(None),
                Err(Errno::EXIST) => {
                    let old = read_path(shard, &name);
                    let temporary = format!(
                        ".new-{}-{}",
                        std::process::id(),
                        self.unique.fetch_add(1, Ordering::Relaxed)
                    );
                    old.and_then(|old| {
                        rustix::fs::symlinkat(stored, shard, temporary.as_str()).map_err(failed)?;
                        rustix::fs::renameat(shard, temporary.as_str(), shard, name.as_str())
                            .map_err(|e| {
                                let _ = rustix::fs::unlinkat(
                                    shard,
                                    temporary.as_str(),
                                    AtFlags::empty(),
                                );
                                failed(e)
                            })?;
                        Ok(old)
                    })
                }
                Err(e) => Err(failed(e)),
            };
            match replaced {
                Ok(old) => {
                    if let Some(old) = old {
                        self.paths.remove(&old);
                    }
                }
                Err(e) => {
                    self.paths.remove(path);
                    return Err(e);
                }
            }
        }
        if let Some((legacy_shard, legacy)) = identity.legacy_key()
            && matches!(read_link(self.shards[legacy_shard].as_fd(), &legacy)?, Some((at, _)) if at == path)
        {
            self.unlink_counted(legacy_shard, &legacy)?;
        }
        Ok(())
    }

    /// Forgets the record of `identity` (absent already is fine), under either key. A
    /// record under the legacy key for another path is a snapshot source's, and stays.
    pub(super) fn remove(&self, identity: &Identity) -> Result<()> {
        let (number, name) = identity.key();
        let own = read_link(self.shards[number].as_fd(), &name)?;
        self.unlink_counted(number, &name)?;
        if let Some((legacy_shard, legacy)) = identity.legacy_key() {
            let ours = match (&own, read_link(self.shards[legacy_shard].as_fd(), &legacy)?) {
                (_, None) => false,
                (None, Some(_)) => true,
                (Some((path, _)), Some((at, _))) => *path == at,
            };
            if ours {
                self.unlink_counted(legacy_shard, &legacy)?;
            }
        }
        Ok(())
    }

    /// Every record, with the path its volume was made for.
    pub(super) fn all(&self) -> Result<Vec<(String, VolumeRecord)>> {
        let mut records = Vec::new();
        for shard in &self.shards {
            for (name, _) in list_dir(shard.as_fd()).map_err(|e| io_error("list records", e))? {
                if name.starts_with('.') {
                    // A replacement a crash interrupted: the record it was to replace is
                    // intact.
                    let _ = rustix::fs::unlinkat(shard, name.as_str(), AtFlags::empty());
                    continue;
                }
                if let Some(found) = read_link(shard.as_fd(), &name)? {
                    records.push(found);
                }
            }
        }
        Ok(records)
    }

    /// The first `keep` distinct volume paths the records name after `after`, sorted,
    /// and whether more follow: read from the index, so the cost is the page's, whatever
    /// the number of records.
    pub(super) fn paths_after(
        &self,
        after: Option<&VolumePath>,
        keep: usize,
    ) -> Result<(Vec<VolumePath>, bool)> {
        Ok(self.paths.after(after, keep))
    }

    /// The shard directories where the record of the volume whose directory is `dir`
    /// is, or would be, kept: what to sync once it is written or removed.
    pub(super) fn dirs_of(&self, dir: BorrowedFd<'_>) -> Result<Vec<OwnedFd>> {
        let identity = Identity::of(dir).map_err(|e| io_error("identify a directory", e))?;
        let (shard, _) = identity.key();
        let mut shards = vec![shard];
        shards.extend(identity.legacy_key().map(|(legacy, _)| legacy));
        shards.dedup();
        shards
            .into_iter()
            .map(|n| {
                self.shards[n].try_clone().map_err(|source| StoreError::Io {
                    context: "keep a record shard to sync".into(),
                    source,
                })
            })
            .collect()
    }

    /// Every record with where it is kept (shard and name), for the reconciliation at
    /// start.
    pub(super) fn entries(&self) -> Result<Vec<(RecordKey, String, VolumeRecord)>> {
        let mut entries = Vec::new();
        for (n, shard) in self.shards.iter().enumerate() {
            for (name, _) in list_dir(shard.as_fd()).map_err(|e| io_error("list records", e))? {
                if name.starts_with('.') {
                    continue;
                }
                if let Some((path, record)) = read_link(shard.as_fd(), &name)? {
                    entries.push(((n, name), path, record));
                }
            }
        }
        Ok(entries)
    }

    /// Forgets the record kept at `key` (as [`Self::entries`] named it).
    pub(super) fn remove_entry(&self, key: &RecordKey) -> Result<()> {
        self.unlink_counted(key.0, &key.1)
    }

    /// Whether the store holds a record of the volume whose directory is `dir`.
    pub(super) fn contains(&self, dir: BorrowedFd<'_>) -> Result<bool> {
        Ok(self.read(dir)?.is_some())
    }
}

fn unlink_record(shard: BorrowedFd<'_>, name: &str) -> Result<()> {
    match rustix::fs::unlinkat(shard, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(e) => Err(io_error("remove a record", e)),
    }
}

/// The path the record `name` names; `None` when there is no such record, or it names
/// none (it is then not counted either).
fn read_path(shard: BorrowedFd<'_>, name: &str) -> Result<Option<String>> {
    match rustix::fs::readlinkat(shard, name, Vec::new()) {
        Ok(target) => Ok(path_in(target.as_bytes())),
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(io_error(format!("read record {name}"), e)),
    }
}

fn read_link(shard: BorrowedFd<'_>, name: &str) -> Result<Option<(String, VolumeRecord)>> {
    Ok(read_stored(shard, name)?.map(|stored| (stored.path, stored.record)))
}

fn read_stored(shard: BorrowedFd<'_>, name: &str) -> Result<Option<StoredRecord>> {
    match rustix::fs::readlinkat(shard, name, Vec::new()) {
        Ok(target) => {
            let stored: StoredRecord =
                serde_json::from_slice(target.as_bytes()).map_err(|e| StoreError::Io {
                    context: format!("read record {name}"),
                    source: std::io::Error::other(e),
                })?;
            Ok(Some(stored))
        }
        Err(Errno::NOENT) => Ok(None),
        Err(e) => Err(io_error(format!("read record {name}"), e)),
    }
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::*;
    use nfsprov_api_types::QuotaBackend;

    fn record(capacity_bytes: u64) -> VolumeRecord {
        VolumeRecord {
            mode: Mode::DEFAULT,
            uid: 1,
            gid: 1,
            capacity_bytes,
            owner: VolumeOwner::default(),
            created_at: String::new(),
            quota: Some(QuotaRecord::of(QuotaBackend::Btrfs)),
            archive: None,
            clone: None,
            restore: None,
        }
    }

    fn open(path: &std::path::Path) -> OwnedFd {
        rustix::fs::open(
            path,
            rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .unwrap()
    }

    fn btrfs(args: &[&str]) {
        let status = Command::new("btrfs").args(args).status().unwrap();
        assert!(status.success(), "btrfs {args:?}");
    }

    /// A snapshot's root has its source's inode number and birth time: its record must
    /// not be its source's, and a record kept under the old key must move before the
    /// source is snapshotted.
    #[test]
    fn a_snapshot_never_reads_or_replaces_its_sources_record() {
        const TEST: &str =
            "store::record::tests::a_snapshot_never_reads_or_replaces_its_sources_record";
        if !rustix::process::geteuid().is_root() {
            nfsprov_test_skip::skip(TEST, "a loop-mounted btrfs needs root");
            return;
        }
        let fs = match nfsprov_agent_testkit::LoopBtrfs::new(300, false) {
            Ok(fs) => fs,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("no loop-mounted btrfs: {e}"));
                return;
            }
        };
        let root = fs.root();
        std::fs::create_dir(root.join("state")).unwrap();
        let store = RecordStore::open(open(&root.join("state")).as_fd()).unwrap();
        let source = root.join("source");
        btrfs(&["subvolume", "create", source.to_str().unwrap()]);
        let source_dir = open(&source);
        let identity = Identity::of(source_dir.as_fd()).unwrap();
        assert!(identity.subvolume.is_some(), "{identity:?}");

        // A record of an earlier version, under the key without the subvolume id.
        let (shard, legacy) = identity.legacy_key().unwrap();
        let stored = serde_json::to_string(&StoredRecord {
            path: "team/source".into(),
            record: record(7),
            generation: None,
        })
        .unwrap();
        rustix::fs::symlinkat(
            stored.as_str(),
            store.shards[shard].as_fd(),
            legacy.as_str(),
        )
        .unwrap();
        assert_eq!(
            store.read(source_dir.as_fd()).unwrap().unwrap(),
            ("team/source".to_owned(), record(7)),
            "found under its old key"
        );
        store.settle(source_dir.as_fd()).unwrap();
        assert!(
            read_link(store.shards[shard].as_fd(), &legacy)
                .unwrap()
                .is_none()
        );
        assert_eq!(
            store.read(source_dir.as_fd()).unwrap().unwrap().1,
            record(7)
        );

        let snapshot = root.join("snapshot");
        btrfs(&[
            "subvolume",
            "snapshot",
            source.to_str().unwrap(),
            snapshot.to_str().unwrap(),
        ]);
        let snapshot_dir = open(&snapshot);
        let copy = Identity::of(snapshot_dir.as_fd()).unwrap();
        assert_eq!((copy.ino, copy.birth), (identity.ino, identity.birth));
        assert_ne!(copy.subvolume, identity.subvolume);
        assert!(store.read(snapshot_dir.as_fd()).unwrap().is_none());
        store
            .write(snapshot_dir.as_fd(), "team/copy", &record(9))
            .unwrap();
        store.remove(&copy).unwrap();
        assert_eq!(
            store.read(source_dir.as_fd()).unwrap().unwrap(),
            ("team/source".to_owned(), record(7)),
            "the source's record survives its snapshot's"
        );
        drop((source_dir, snapshot_dir));
        btrfs(&["subvolume", "delete", snapshot.to_str().unwrap()]);
        btrfs(&["subvolume", "delete", source.to_str().unwrap()]);
    }

    fn listed(store: &RecordStore, after: Option<&str>, keep: usize) -> (Vec<String>, bool) {
        let after = after.map(|a| VolumePath::parse(a).unwrap());
        let (paths, more) = store.paths_after(after.as_ref(), keep).unwrap();
        (paths.iter().map(ToString::to_string).collect(), more)
    }

    /// The index of paths answers what the links say at every step: a record made,
    /// rewritten for another path, two records of one path (a volume and its archive)
    /// and one of them removed, a record removed by its key, and, after a crash (the store
    /// opened again, a replacement left half-done), the same from the links alone.
    #[test]
    fn the_paths_in_order_follow_the_records_and_survive_a_reopening() {
        let base = tempfile::tempdir().unwrap();
        let state = base.path().join("state");
        std::fs::create_dir(&state).unwrap();
        let store = RecordStore::open(open(&state).as_fd()).unwrap();
        let dir = |name: &str| {
            let path = base.path().join(name);
            std::fs::create_dir(&path).unwrap();
            open(&path)
        };
        let (a, b, c, archived) = (dir("a"), dir("b"), dir("c"), dir("archived"));
        store.write(b.as_fd(), "team/b", &record(1)).unwrap();
        store.write(a.as_fd(), "team-x/a", &record(1)).unwrap();
        store.write(c.as_fd(), "team/c", &record(1)).unwrap();
        assert_eq!(
            listed(&store, None, 10),
            (
                vec!["team-x/a".into(), "team/b".into(), "team/c".into()],
                false
            ),
            "in the paths' text order"
        );
        assert!(listed(&store, None, 2).1, "more follow the first two");
        assert_eq!(
            listed(&store, Some("team-x/a"), 1),
            (vec!["team/b".into()], true)
        );
        assert_eq!(listed(&store, Some("team/c"), 5), (vec![], false));

        // Rewritten (replaced by a rename) under another path: the old one is gone.
        store.write(c.as_fd(), "team/d", &record(2)).unwrap();
        assert_eq!(
            listed(&store, Some("team/b"), 5),
            (vec!["team/d".into()], false)
        );
        // The same path twice: removing one record keeps it.
        store.write(archived.as_fd(), "team/b", &record(1)).unwrap();
        store.remove(&Identity::of(b.as_fd()).unwrap()).unwrap();
        assert_eq!(listed(&store, None, 5).0, ["team-x/a", "team/b", "team/d"]);
        store
            .remove(&Identity::of(archived.as_fd()).unwrap())
            .unwrap();
        // Removed again: nothing to uncount twice.
        store
            .remove(&Identity::of(archived.as_fd()).unwrap())
            .unwrap();
        assert_eq!(listed(&store, None, 5).0, ["team-x/a", "team/d"]);
        let (key, _, _) = store
            .entries()
            .unwrap()
            .into_iter()
            .find(|(_, path, _)| path == "team-x/a")
            .unwrap();
        store.remove_entry(&key).unwrap();
        assert_eq!(listed(&store, None, 5).0, ["team/d"]);

        // A crash between a replacement's link and its rename leaves the temporary link.
        let (shard, _) = Identity::of(c.as_fd()).unwrap().key();
        let half_done = serde_json::to_string(&StoredRecord {
            path: "team/half-done".into(),
            record: record(1),
            generation: None,
        })
        .unwrap();
        rustix::fs::symlinkat(half_done.as_str(), store.shards[shard].as_fd(), ".new-1-1").unwrap();
        store.write(a.as_fd(), "team/a", &record(1)).unwrap();
        drop(store);
        let reopened = RecordStore::open(open(&state).as_fd()).unwrap();
        assert_eq!(
            listed(&reopened, None, 5),
            (vec!["team/a".into(), "team/d".into()], false)
        );
    }

    /// Without birth times a directory is known by its inode number alone, which the
    /// next new directory is likely to get once it is freed: a record left behind must
    /// not become that directory's.
    #[test]
    fn a_directory_given_a_removed_volumes_inode_number_is_not_that_volume() {
        const TEST: &str = "store::record::tests::a_directory_given_a_removed_volumes_inode_number_is_not_that_volume";
        if !rustix::process::geteuid().is_root() {
            nfsprov_test_skip::skip(TEST, "a loop-mounted ext4 needs root");
            return;
        }
        // 128-byte inodes have no room for a birth time.
        let fs = match nfsprov_agent_testkit::LoopExt4::with_options(64, &["-I", "128"]) {
            Ok(fs) => fs,
            Err(e) => {
                nfsprov_test_skip::skip(TEST, &format!("no loop-mounted ext4: {e}"));
                return;
            }
        };
        let root = fs.root();
        std::fs::create_dir(root.join("state")).unwrap();
        let store = RecordStore::open(open(&root.join("state")).as_fd()).unwrap();
        let volume = root.join("volume");
        std::fs::create_dir(&volume).unwrap();
        let dir = open(&volume);
        let identity = Identity::of(dir.as_fd()).unwrap();
        assert_eq!(
            identity.birth, None,
            "ext4 with 128-byte inodes keeps no birth time"
        );
        store.write(dir.as_fd(), "volume", &record(1)).unwrap();
        assert!(store.read(dir.as_fd()).unwrap().is_some());
        drop(dir);
        // Removed by hand, its record left behind.
        std::fs::remove_dir(&volume).unwrap();
        let reused = (0..100)
            .map(|n| {
                let path = root.join(format!("new-{n}"));
                std::fs::create_dir(&path).unwrap();
                open(&path)
            })
            .find(|dir| Identity::of(dir.as_fd()).unwrap() == identity)
            .expect("ext4 hands out a freed inode number again");
        assert_eq!(store.read(reused.as_fd()).unwrap(), None);
    }
}
