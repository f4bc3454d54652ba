//! Request, response and error bodies of the agent API (v1).

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::archive::ArchivePath;
use crate::export::{ExportManager, ExportRequest, VolumeExport};
use crate::path::VolumePath;
use crate::restore_source::RestoreSource;

/// Header carrying the request id from the controller to the agent's audit log.
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Permission bits of a volume directory, written in JSON as an octal string (`"0775"`);
/// a plain JSON number is read as the numeric value (`509` is `0775`).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Mode(u32);

impl Mode {
    /// The peers' default: any pod user can write without extra configuration.
    pub const DEFAULT: Mode = Mode(0o777);
    /// Highest value: permission bits plus setuid, setgid and sticky.
    pub const MAX: u32 = 0o7777;

    pub fn new(bits: u32) -> Result<Self, ModeError> {
        if bits > Self::MAX {
            return Err(ModeError::OutOfRange(bits));
        }
        Ok(Mode(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    /// Parses an octal string such as `"0775"` or `"775"`.
    pub fn parse_octal(raw: &str) -> Result<Self, ModeError> {
        let digits = raw.trim();
        let digits = digits.strip_prefix("0o").unwrap_or(digits);
        if digits.is_empty()
            || digits.len() > 5
            || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b))
        {
            return Err(ModeError::NotOctal(raw.to_owned()));
        }
        let bits =
            u32::from_str_radix(digits, 8).map_err(|_| ModeError::NotOctal(raw.to_owned()))?;
        Self::new(bits)
    }
}

impl Default for Mode {
    fn default() -> Self {
        Mode::DEFAULT
    }
}

impl fmt::Debug for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mode({:04o})", self.0)
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:04o}", self.0)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ModeError {
    #[error("mode {0:#o} is out of range (at most 07777)")]
    OutOfRange(u32),
    #[error("mode {0:?} is not an octal number such as \"0775\"")]
    NotOctal(String),
}

impl Serialize for Mode {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(u32),
            Text(String),
        }
        match Raw::deserialize(deserializer)? {
            Raw::Number(bits) => Mode::new(bits),
            Raw::Text(text) => Mode::parse_octal(&text),
        }
        .map_err(serde::de::Error::custom)
    }
}

/// Who a volume belongs to in the cluster. Recorded with the volume so that two claims can
/// never silently share a directory, and so an operator can tell what a directory is for.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VolumeOwner {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_namespace: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pvc_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pv_name: Option<String>,
}

impl VolumeOwner {
    /// Reads an owner in an answer, where fields a newer agent added are ignored; in a
    /// request the agent refuses them.
    fn from_answer<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Answered {
            #[serde(default)]
            pvc_namespace: Option<String>,
            #[serde(default)]
            pvc_name: Option<String>,
            #[serde(default)]
            pv_name: Option<String>,
        }
        let Answered {
            pvc_namespace,
            pvc_name,
            pv_name,
        } = Answered::deserialize(deserializer)?;
        Ok(VolumeOwner {
            pvc_namespace,
            pvc_name,
            pv_name,
        })
    }
}

/// Body of `PUT /v1/volumes/{path}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateVolumeRequest {
    /// Permission bits of the new directory (default `0777`).
    #[serde(default)]
    pub mode: Mode,
    /// Owner of the new directory; the agent's own user when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    /// Group of the new directory; the agent's own group when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
    /// Requested size in bytes (the claim's request).
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    /// Whether the capacity must, may or must not be enforced by a quota.
    #[serde(default)]
    pub quota: QuotaPolicy,
    /// Who may mount the volume. An agent with a per-volume export manager
    /// ([`Capabilities::exports`]) refuses a request without one (`invalid_body`), so no
    /// volume is left that nobody can mount by mistake; an agent without refuses a
    /// request with one (`unsupported`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// Body of `POST /v1/adoptions/{path}`: makes the directory already at `path` (say, one
/// nfs-subdir-external-provisioner made) a volume, as it is. Mode, uid and gid are read
/// from the directory, not asked for: adoption changes nothing on disk, it only records.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdoptVolumeRequest {
    /// Size in bytes (the claim's request), recorded; no quota enforces it.
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    /// Who may mount the volume. An agent with a per-volume export manager
    /// ([`Capabilities::exports`]) refuses a request without one (`invalid_body`), so no
    /// volume is left that nobody can mount by mistake; an agent without refuses a
    /// request with one (`unsupported`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// Body of `POST /v1/clones/{path}`: makes a new volume at `path` holding a copy of the
/// finished volume `source` of the same agent, with everything in it as it is: owners,
/// modes, times, extended attributes, hard links, symlinks and holes. The new volume's
/// root keeps the source root's owner and mode; nothing is chowned or chmodded.
///
/// A clone the agent cannot finish within the request is answered `202 Accepted` with a
/// [`CloneProgress`] and goes on in the background; repeating the same request answers
/// `202` until it is done, then `201` (or `200` once it is seen finished again).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CloneVolumeRequest {
    /// The volume to copy, on this agent.
    pub source: VolumePath,
    /// Size in bytes of the new volume (its claim's request), at least the source's.
    pub capacity_bytes: u64,
    #[serde(default)]
    pub owner: VolumeOwner,
    #[serde(default)]
    pub quota: QuotaPolicy,
    /// Who may mount the volume. An agent with a per-volume export manager
    /// ([`Capabilities::exports`]) refuses a request without one (`invalid_body`), so no
    /// volume is left that nobody can mount by mistake; an agent without refuses a
    /// request with one (`unsupported`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<ExportRequest>,
}

/// How the agent made a clone: the fastest exact method the export root allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CloneMethod {
    /// A writable btrfs snapshot of the source's subvolume: instant, point in time.
    BtrfsSnapshot,
    /// A ZFS clone of a snapshot of the source's dataset: instant, point in time.
    ZfsClone,
    /// Every file's data shared by `FICLONE` reflinks; the tree is walked file by file.
    Reflink,
    /// A local copy, file by file, at disk speed.
    Copy,
    /// A method newer than this side knows: shown as `unknown`, never acted on.
    #[serde(other)]
    Unknown,
}

impl CloneMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            CloneMethod::BtrfsSnapshot => "btrfs-snapshot",
            CloneMethod::ZfsClone => "zfs-clone",
            CloneMethod::Reflink => "reflink",
            CloneMethod::Copy => "copy",
            CloneMethod::Unknown => "unknown",
        }
    }
}

impl fmt::Display for CloneMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Where a cloned volume's data came from, and how it was copied.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneOrigin {
    pub source: VolumePath,
    pub method: CloneMethod,
}

/// Where a restored volume's data came from, and how it was made (`Volume::restore`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOrigin {
    /// `"snapshot": NAME` or `"archive": ID`.
    #[serde(flatten)]
    pub source: RestoreSource,
    /// A btrfs snapshot of a btrfs snapshot, a ZFS clone of a ZFS snapshot, a reflink or
    /// a copy.
    pub method: CloneMethod,
}

/// Answer `202 Accepted` of `POST /v1/clones/{path}`: the clone is still being made. How
/// far a copy has come is in the agent's metrics (`nfsprov_agent_clone_copied_bytes_total`,
/// `nfsprov_agent_clone_pending_bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CloneProgress {
    pub source: VolumePath,
    /// Seconds since the agent started this clone.
    pub running_seconds: u64,
}

/// Whether a volume's capacity is enforced by a filesystem quota (StorageClass
/// parameter `quota`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QuotaPolicy {
    /// Fail the request when the agent cannot enforce the capacity.
    Enforce,
    /// Enforce the capacity when the agent can; record it otherwise.
    #[default]
    BestEffort,
    /// Record the capacity, never enforce it.
    Off,
    /// A policy newer than the agent knows: refused (`unsupported`), since an agent
    /// cannot tell what it would promise. Never parsed from a class parameter.
    #[serde(other)]
    Unknown,
}

impl QuotaPolicy {
    /// The StorageClass parameter's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaPolicy::Enforce => "enforce",
            QuotaPolicy::BestEffort => "bestEffort",
            QuotaPolicy::Off => "off",
            QuotaPolicy::Unknown => "unknown",
        }
    }
}

impl fmt::Display for QuotaPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for QuotaPolicy {
    type Err = String;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        [
            QuotaPolicy::Enforce,
            QuotaPolicy::BestEffort,
            QuotaPolicy::Off,
        ]
        .into_iter()
        .find(|policy| policy.as_str() == raw)
        .ok_or_else(|| format!("{raw:?} is not one of enforce, bestEffort, off"))
    }
}

/// Body of `PATCH /v1/volumes/{path}`: the new capacity. Only growth is accepted; the same
/// capacity again succeeds without change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResizeVolumeRequest {
    pub capacity_bytes: u64,
}

/// Space and inodes a volume uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeUsage {
    pub used_bytes: u64,
    pub used_inodes: u64,
}

/// A volume as the agent sees it (answer to create and get, element of the list).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Volume {
    pub path: VolumePath,
    pub mode: Mode,
    pub uid: u32,
    pub gid: u32,
    pub capacity_bytes: u64,
    /// Whether a filesystem quota holds the volume to `capacity_bytes`.
    #[serde(default)]
    pub quota_enforced: bool,
    #[serde(default, deserialize_with = "VolumeOwner::from_answer")]
    pub owner: VolumeOwner,
    /// RFC 3339 UTC time the agent created the directory.
    pub created_at: String,
    /// Present when the agent measured it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub usage: Option<VolumeUsage>,
    /// Present when the volume was made as a clone of another.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clone: Option<CloneOrigin>,
    /// The volume's own NFS export, on an agent with an export manager.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export: Option<VolumeExport>,
    /// Present when the volume was restored from a snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreOrigin>,
    /// Whether clients can use the volume as it is; absent from agents that do not
    /// check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub condition: Option<crate::condition::VolumeCondition>,
}

/// Answer to `GET /v1/volumes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeList {
    pub volumes: Vec<Volume>,
    /// The `after` of the next page; absent on the last page and on an unpaged answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// Body of `POST /v1/archives/{path}`, optional: no body at all is the same as `{}`
/// (controllers that predate retention send none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArchiveRequest {
    /// Days the agent keeps the archive before deleting it (the class's retention);
    /// absent: the agent's default (`archive.retention_days`, or forever). At least 1: an
    /// archive that expires at once would be a delete under another name.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "retention_days"
    )]
    pub retention_days: Option<u32>,
}

fn retention_days<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<u32>, D::Error> {
    match Option::<u32>::deserialize(deserializer)? {
        Some(0) => Err(serde::de::Error::custom(
            "retention_days must be at least 1 (leave it out for the agent's default)",
        )),
        days => Ok(days),
    }
}

/// Answer to `POST /v1/archives/{path}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveResult {
    /// The volume path that was archived.
    pub path: VolumePath,
    /// Where the data now is, relative to the export root.
    pub archive_path: String,
    /// RFC 3339 UTC time of the archive.
    pub archived_at: String,
}

/// One archive (element of `GET /v1/archives`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Archive {
    /// What `DELETE /v1/archives/{id}` takes: `<path>/@<UTC time>`.
    pub id: ArchivePath,
    /// Where the data is, relative to the export root (`.archive/<id>`), as
    /// [`ArchiveResult::archive_path`] said.
    pub archive_path: String,
    /// The volume path it was archived from.
    pub path: VolumePath,
    /// The claim and PV the volume was made for, as far as the create request named them.
    #[serde(default, deserialize_with = "VolumeOwner::from_answer")]
    pub owner: VolumeOwner,
    /// RFC 3339 UTC time of the archive.
    pub archived_at: String,
    /// The retention the archive request asked for; absent: the agent's default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retention_days: Option<u32>,
    /// RFC 3339 UTC time after which the agent deletes the archive; absent: kept until
    /// deleted by hand.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<String>,
    /// Space the archive uses, when measured (cached; a listing waits a little for the
    /// first measurement, then answers without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// Inodes the archive uses, measured with `size_bytes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inodes: Option<u64>,
    /// The capacity the volume had when it was archived, where its record kept one: the
    /// least a restore from the archive may ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
}

/// Answer to `GET /v1/archives`, sorted by `id`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArchiveList {
    pub archives: Vec<Archive>,
    /// The `after` of the next page; absent on the last page and on an unpaged answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

/// The most entries one page of `GET /v1/volumes` or `GET /v1/archives` holds; a larger
/// `limit` is refused (`invalid_query`).
pub const MAX_PAGE_LIMIT: u32 = 1000;

/// The query of `GET /v1/volumes` and `GET /v1/archives`: `?limit=N&after=CURSOR`. Without
/// `limit` the whole list is answered (what controllers that predate paging ask for).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    /// Entries in the page, 1 to [`MAX_PAGE_LIMIT`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// The `next` of the previous page: the page starts after this volume path or
    /// archive id, in the list's order (by path, by id).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<String>,
}

/// A page asked for, its cursor validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PageRequest<C> {
    pub limit: usize,
    pub after: Option<C>,
}

impl ListQuery {
    /// The first page of `limit` entries.
    pub fn first(limit: u32) -> Self {
        Self {
            limit: Some(limit),
            after: None,
        }
    }

    /// The query string, without the `?`; empty for the whole list.
    pub fn to_query_string(&self) -> String {
        serde_urlencoded::to_string(self).unwrap_or_default()
    }

    /// Reads a request's query string (`None`: there was none). `Ok(None)` asks for the
    /// whole list; `cursor` validates `after`.
    pub fn parse<C, E: fmt::Display>(
        raw: Option<&str>,
        cursor: impl FnOnce(&str) -> Result<C, E>,
    ) -> Result<Option<PageRequest<C>>, String> {
        let query: ListQuery = match raw {
            None | Some("") => ListQuery::default(),
            Some(raw) => serde_urlencoded::from_str(raw).map_err(|e| {
                format!("invalid query: {e} (expected limit=1..{MAX_PAGE_LIMIT} and optionally after=<the previous page's next>)")
            })?,
        };
        let Some(limit) = query.limit else {
            if query.after.is_some() {
                return Err("invalid query: after needs a limit".into());
            }
            return Ok(None);
        };
        if limit == 0 || limit > MAX_PAGE_LIMIT {
            return Err(format!(
                "invalid query: limit must be 1 to {MAX_PAGE_LIMIT}, not {limit}"
            ));
        }
        let after = query
            .after
            .map(|raw| cursor(&raw).map_err(|e| format!("invalid query: after: {e}")))
            .transpose()?;
        Ok(Some(PageRequest {
            limit: limit as usize,
            after,
        }))
    }
}

/// The export NFS clients mount to reach the volumes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NfsExport {
    /// Host name or address clients use (`spec.nfs.server`).
    pub server: String,
    /// Path of the export root as clients mount it; a volume is at `path/volume-path`.
    pub path: String,
}

/// How capacity is enforced on this agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum QuotaBackend {
    /// Capacity is recorded but not enforced.
    None,
    Btrfs,
    Zfs,
    Xfs,
    /// Each volume a filesystem of its own in a sparse image file, loop-mounted at its
    /// path: its size is the quota, and a forged file handle cannot leave it.
    Image,
    /// A backend newer than the controller knows: shown as `unknown`; whether it
    /// enforces is what `quota_enforced` says.
    #[serde(other)]
    Unknown,
}

impl QuotaBackend {
    /// The backends an agent can be configured with.
    pub const KNOWN: [QuotaBackend; 5] = [
        QuotaBackend::None,
        QuotaBackend::Btrfs,
        QuotaBackend::Zfs,
        QuotaBackend::Xfs,
        QuotaBackend::Image,
    ];

    /// The settings' and the API's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaBackend::None => "none",
            QuotaBackend::Btrfs => "btrfs",
            QuotaBackend::Zfs => "zfs",
            QuotaBackend::Xfs => "xfs",
            QuotaBackend::Image => "image",
            QuotaBackend::Unknown => "unknown",
        }
    }

    /// One of [`QuotaBackend::KNOWN`] by its spelling (settings are strict: an unknown
    /// spelling is an error there, not [`QuotaBackend::Unknown`]).
    pub fn known(raw: &str) -> Option<Self> {
        Self::KNOWN.into_iter().find(|b| b.as_str() == raw)
    }
}

impl fmt::Display for QuotaBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capabilities {
    pub quota: QuotaBackend,
    /// Whether capacity limits are enforced by the filesystem.
    pub quota_enforced: bool,
    /// The agent can archive volumes (`POST /v1/archives`).
    pub archive: bool,
    /// Who exports volumes: with a per-volume manager, every create, clone and adoption
    /// carries an `export`, and `PUT /v1/exports/{path}` changes one. Absent from older
    /// agents, which have none.
    #[serde(default)]
    pub exports: ExportManager,
    /// The agent takes snapshots and restores volumes from them (`/v1/snapshots`,
    /// `/v1/restores`). Absent from older agents, which cannot.
    #[serde(default)]
    pub snapshots: bool,
    /// The agent makes volumes from its archives (`GET /v1/archives/{id}`, `/v1/restores`
    /// with an `archive`). Absent from older agents, which cannot.
    #[serde(default)]
    pub archive_restores: bool,
    /// New exports may be served at an opaque path (`opaque_path` of an export request):
    /// true with the ganesha manager. Absent from older agents, which serve each volume
    /// at its volume path.
    #[serde(default)]
    pub opaque_export_paths: bool,
}

/// Size and inode figures of the filesystem holding the export root.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct FilesystemStats {
    pub total_bytes: u64,
    pub free_bytes: u64,
    /// Free bytes available to unprivileged users.
    pub available_bytes: u64,
    pub total_inodes: u64,
    pub free_inodes: u64,
}

/// The capacity the agent has promised against the size of its filesystem. Volumes
/// are sparse or share blocks, and quotas cap without setting space aside, so the
/// promises can add up to more than the filesystem holds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Provisioning {
    /// The sum of every live volume's capacity, and of the source capacity of each
    /// snapshot that may come to hold it on its own (the `image` backend's); archives and
    /// other snapshots are not counted.
    pub provisioned_bytes: u64,
    /// `provisioned_bytes` over the filesystem's `total_bytes` (0 when it reports none).
    pub overcommit_ratio: f64,
    /// The ratio past which the agent warns (`limits.overcommit_warn_ratio`).
    pub warn_ratio: f64,
    /// The ratio past which creates, clones, restores and expansions are refused with
    /// `overcommit_limit` (`limits.max_overcommit_ratio`); absent: never refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_ratio: Option<f64>,
}

impl Provisioning {
    /// Whether the promises are past the warning ratio.
    pub fn past_warning(&self) -> bool {
        self.overcommit_ratio > self.warn_ratio
    }
}

/// Answer to `GET /v1/info`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentInfo {
    pub version: String,
    pub nfs: NfsExport,
    pub capabilities: Capabilities,
    pub filesystem: FilesystemStats,
    /// Provisioned capacity against the filesystem. Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning: Option<Provisioning>,
    /// Whether the export root has its filesystem to itself. Absent from older agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_root_filesystem: Option<ExportRootFilesystem>,
}

/// The filesystem holding the export root. NFS servers confine a client to the
/// filesystem of its export, not to the export's directory, so whatever else that
/// filesystem holds is reachable by a client that forges file handles.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRootFilesystem {
    /// Where it is mounted.
    pub mount_point: String,
    /// Why it holds more than the export root's tree; absent when it does not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared: Option<String>,
    /// The operator accepted a shared filesystem (`exports.allow_shared_filesystem`).
    #[serde(default)]
    pub accepted: bool,
}

/// Answer to `GET /healthz` and `GET /readyz`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `"ok"` or `"unavailable"`.
    pub status: String,
    /// Why the agent is not ready, when it is not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Stable error codes. Clients match on these, never on messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The volume path failed validation.
    InvalidPath,
    /// The body is not valid JSON for this endpoint, or a field is out of range.
    InvalidBody,
    /// The query string is malformed or out of range (a list's `limit` or `after`).
    InvalidQuery,
    /// A symlink or a non-directory was found where a volume or one of its parents should be.
    UnsafePath,
    Unauthenticated,
    Forbidden,
    /// The request reaches outside its credential's scope: a path beneath another
    /// prefix, an operation the credential may not ask for, or an export client past its
    /// bounds. Sent as 403, the same whether or not anything exists there.
    OutOfScope,
    NotFound,
    MethodNotAllowed,
    /// The volume exists with other settings or owner, or the path is not a volume.
    Conflict,
    /// The request needs a quota the agent cannot enforce, or asks to shrink a volume.
    Unsupported,
    PayloadTooLarge,
    UnsupportedMediaType,
    Timeout,
    InsufficientStorage,
    /// The create, clone, restore or expansion would take the capacity the agent has
    /// promised past `limits.max_overcommit_ratio` times its filesystem's size: nothing
    /// was made or changed. Sent as 507; the same request is welcome once capacity is
    /// freed, the filesystem grown or the limit raised.
    OvercommitLimit,
    /// The snapshot would take the bytes its namespace's snapshots hold past
    /// `limits.max_snapshot_bytes_per_namespace`: nothing of it was kept. Sent as 507;
    /// the same request is welcome once snapshots of the namespace are deleted or the
    /// limit raised.
    SnapshotLimit,
    /// The create, clone, restore or expansion would take the volumes or capacity beneath
    /// a credential's prefix past its `max_volumes` or `max_bytes`: nothing was made or
    /// changed. Sent as 507; the same request is welcome once the prefix's volumes are
    /// deleted or the limit raised.
    CredentialLimit,
    NotReady,
    /// The NFS server (or the bus the agent reaches it by) did not answer an export
    /// change in time; the change was not made and may be asked for again.
    NfsServerUnavailable,
    /// Too many jobs of this kind (clones, snapshots or restores) wait already: the agent
    /// started none for this request. Sent as 429 with `Retry-After`; the same request
    /// later is welcome.
    JobQueueFull,
    Internal,
    /// A code newer than the controller knows: the answer's HTTP status says what it is
    /// (see `client::ClientError::is_transient`).
    #[serde(other)]
    Unknown,
}

impl ErrorCode {
    /// The HTTP status this code is sent with.
    pub fn http_status(self) -> u16 {
        match self {
            ErrorCode::InvalidPath
            | ErrorCode::InvalidBody
            | ErrorCode::InvalidQuery
            | ErrorCode::UnsafePath => 400,
            ErrorCode::Unauthenticated => 401,
            ErrorCode::Forbidden | ErrorCode::OutOfScope => 403,
            ErrorCode::NotFound => 404,
            ErrorCode::MethodNotAllowed => 405,
            ErrorCode::Timeout => 408,
            ErrorCode::Conflict => 409,
            ErrorCode::Unsupported => 422,
            ErrorCode::PayloadTooLarge => 413,
            ErrorCode::UnsupportedMediaType => 415,
            ErrorCode::JobQueueFull => 429,
            // Never sent: the agent knows its own codes.
            ErrorCode::Internal | ErrorCode::Unknown => 500,
            ErrorCode::NotReady | ErrorCode::NfsServerUnavailable => 503,
            ErrorCode::InsufficientStorage
            | ErrorCode::OvercommitLimit
            | ErrorCode::SnapshotLimit
            | ErrorCode::CredentialLimit => 507,
        }
    }

    /// Whether retrying the same request later can succeed without anyone changing it;
    /// `false` for [`ErrorCode::Unknown`], whose answer's status decides instead.
    pub fn is_transient(self) -> bool {
        matches!(
            self,
            ErrorCode::Timeout
                | ErrorCode::NotReady
                | ErrorCode::NfsServerUnavailable
                | ErrorCode::JobQueueFull
                | ErrorCode::Internal
                | ErrorCode::InsufficientStorage
                | ErrorCode::OvercommitLimit
                | ErrorCode::SnapshotLimit
                | ErrorCode::CredentialLimit
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        f.write_str(&text)
    }
}

/// Every error answer: `{"code": "...", "message": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_reads_octal_strings_and_numbers() {
        let req: CreateVolumeRequest =
            serde_json::from_str(r#"{"mode":"0750","capacity_bytes":1}"#).unwrap();
        assert_eq!(req.mode.bits(), 0o750);
        let req: CreateVolumeRequest =
            serde_json::from_str(r#"{"mode":488,"capacity_bytes":1}"#).unwrap();
        assert_eq!(req.mode.bits(), 0o750);
        let req: CreateVolumeRequest = serde_json::from_str(r#"{"capacity_bytes":1}"#).unwrap();
        assert_eq!(req.mode, Mode::DEFAULT);
        assert_eq!(
            serde_json::to_string(&Mode::new(0o2775).unwrap()).unwrap(),
            "\"2775\""
        );
        for bad in [r#""0999""#, r#""rwx""#, "65535", r#""""#, "-1"] {
            let body = format!(r#"{{"mode":{bad},"capacity_bytes":1}}"#);
            assert!(
                serde_json::from_str::<CreateVolumeRequest>(&body).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn quota_policy_defaults_to_best_effort_and_parses_the_class_spelling() {
        let req: CreateVolumeRequest = serde_json::from_str(r#"{"capacity_bytes":1}"#).unwrap();
        assert_eq!(req.quota, QuotaPolicy::BestEffort);
        let req: CreateVolumeRequest =
            serde_json::from_str(r#"{"capacity_bytes":1,"quota":"enforce"}"#).unwrap();
        assert_eq!(req.quota, QuotaPolicy::Enforce);
        for policy in [
            QuotaPolicy::Enforce,
            QuotaPolicy::BestEffort,
            QuotaPolicy::Off,
        ] {
            assert_eq!(policy.as_str().parse::<QuotaPolicy>(), Ok(policy));
            assert_eq!(
                serde_json::to_string(&policy).unwrap(),
                format!("\"{policy}\"")
            );
        }
        assert!("Enforce".parse::<QuotaPolicy>().is_err());
        assert!("".parse::<QuotaPolicy>().is_err());
    }

    #[test]
    fn archive_requests_may_be_empty_and_never_ask_for_zero_days() {
        let empty: ArchiveRequest = serde_json::from_str("{}").unwrap();
        assert_eq!(empty.retention_days, None);
        let null: ArchiveRequest = serde_json::from_str(r#"{"retention_days":null}"#).unwrap();
        assert_eq!(null.retention_days, None);
        let week: ArchiveRequest = serde_json::from_str(r#"{"retention_days":7}"#).unwrap();
        assert_eq!(week.retention_days, Some(7));
        assert_eq!(
            serde_json::to_string(&week).unwrap(),
            r#"{"retention_days":7}"#
        );
        assert_eq!(serde_json::to_string(&empty).unwrap(), "{}");
        for bad in [
            r#"{"retention_days":0}"#,
            r#"{"retention_days":-1}"#,
            r#"{"retention_days":1.5}"#,
            r#"{"retention_days":"7"}"#,
            r#"{"retention_days":4294967296}"#,
            r#"{"retention":7}"#,
        ] {
            assert!(
                serde_json::from_str::<ArchiveRequest>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn adoption_requests_need_a_capacity_and_nothing_a_directory_already_has() {
        let req: AdoptVolumeRequest = serde_json::from_str(
            r#"{"capacity_bytes":5,"owner":{"pvc_namespace":"ns","pvc_name":"c","pv_name":"pv"}}"#,
        )
        .unwrap();
        assert_eq!(req.capacity_bytes, 5);
        assert_eq!(req.owner.pv_name.as_deref(), Some("pv"));
        let bare: AdoptVolumeRequest = serde_json::from_str(r#"{"capacity_bytes":1}"#).unwrap();
        assert_eq!(bare.owner, VolumeOwner::default());
        assert_eq!(
            serde_json::to_string(&bare).unwrap(),
            r#"{"capacity_bytes":1,"owner":{}}"#
        );
        // Mode, uid and gid are the directory's own: asking for them is refused, not ignored.
        for bad in [
            "{}",
            r#"{"capacity_bytes":-1}"#,
            r#"{"capacity_bytes":1,"mode":"0777"}"#,
            r#"{"capacity_bytes":1,"uid":0}"#,
            r#"{"capacity_bytes":1,"quota":"enforce"}"#,
            r#"{"capacity_bytes":1,"owner":{"pvc":"x"}}"#,
        ] {
            assert!(
                serde_json::from_str::<AdoptVolumeRequest>(bad).is_err(),
                "{bad}"
            );
        }
    }

    #[test]
    fn clone_requests_name_a_valid_source_and_answers_say_the_method() {
        let req: CloneVolumeRequest =
            serde_json::from_str(r#"{"source":"team/data","capacity_bytes":5}"#).unwrap();
        assert_eq!(req.source.as_str(), "team/data");
        assert_eq!(req.quota, QuotaPolicy::BestEffort);
        for hostile in ["../etc", "/abs", "team/.nfsprov", ""] {
            let body = format!(r#"{{"source":"{hostile}","capacity_bytes":5}}"#);
            assert!(
                serde_json::from_str::<CloneVolumeRequest>(&body).is_err(),
                "{hostile:?} accepted as a source"
            );
        }
        let methods = [
            CloneMethod::BtrfsSnapshot,
            CloneMethod::ZfsClone,
            CloneMethod::Reflink,
            CloneMethod::Copy,
        ];
        for method in methods {
            assert_eq!(
                serde_json::to_value(method).unwrap(),
                serde_json::Value::String(method.to_string()),
            );
        }
        // A volume from an agent that predates clones reads as no clone, and a volume
        // that is no clone says nothing of it.
        let volume: Volume = serde_json::from_str(
            r#"{"path":"a","mode":"0777","uid":1,"gid":1,"capacity_bytes":1,"created_at":"x"}"#,
        )
        .unwrap();
        assert_eq!(volume.clone, None);
        assert!(!serde_json::to_string(&volume).unwrap().contains("clone"));
    }

    /// What an agent one version newer may send: values and fields this side does not
    /// know. Answers are read, unknown values as `Unknown`, unknown fields ignored.
    #[test]
    fn an_older_side_reads_a_newer_agents_answers() {
        let info: AgentInfo = serde_json::from_str(
            r#"{"version":"0.2.0","nfs":{"server":"s","path":"/p","port":2049},
                "capabilities":{"quota":"lvm-thin","quota_enforced":true,"archive":true,"snapshots":true},
                "filesystem":{"total_bytes":9,"free_bytes":8,"available_bytes":7,"total_inodes":6,"free_inodes":5,"reserved_bytes":1},
                "uptime_seconds":3}"#,
        )
        .unwrap();
        assert_eq!(info.capabilities.quota, QuotaBackend::Unknown);
        assert_eq!(info.capabilities.quota.to_string(), "unknown");
        assert!(info.capabilities.quota_enforced);
        assert_eq!(info.filesystem.available_bytes, 7);

        let volume: Volume = serde_json::from_str(
            r#"{"path":"a/b","mode":"0770","uid":1,"gid":2,"capacity_bytes":3,"created_at":"t",
                "owner":{"pvc_name":"c","workload":"statefulset/db"},
                "clone":{"source":"a/src","method":"block-clone","took_seconds":4},
                "labels":{"x":"y"}}"#,
        )
        .unwrap();
        let origin = volume.clone.as_ref().unwrap();
        assert_eq!(origin.method, CloneMethod::Unknown);
        assert_eq!(origin.method.to_string(), "unknown");
        assert_eq!(volume.owner.pvc_name.as_deref(), Some("c"));

        let archives: ArchiveList = serde_json::from_str(
            r#"{"archives":[{"id":"a/b/@20260101T000000.000000000Z","archive_path":".archive/a/b/@20260101T000000.000000000Z",
                "path":"a/b","owner":{"pv_name":"pv","workload":"w"},"archived_at":"t","compressed":true}],"next":null}"#,
        )
        .unwrap();
        assert_eq!(archives.archives[0].owner.pv_name.as_deref(), Some("pv"));

        let error: ApiError =
            serde_json::from_str(r#"{"code":"volume_busy","message":"m","retry_after_seconds":5}"#)
                .unwrap();
        assert_eq!(error.code, ErrorCode::Unknown);
        assert!(!error.code.is_transient());
        assert_eq!(error.code.to_string(), "unknown");

        let progress: CloneProgress =
            serde_json::from_str(r#"{"source":"a","running_seconds":1,"copied_bytes":2}"#).unwrap();
        assert_eq!(progress.running_seconds, 1);
        let result: ArchiveResult = serde_json::from_str(
            r#"{"path":"a","archive_path":".archive/x","archived_at":"t","expires_at":"u"}"#,
        )
        .unwrap();
        assert_eq!(result.archive_path, ".archive/x");
    }

    /// What an agent from before snapshots and archive restores sends: the capabilities
    /// it could not name read as the ones it lacks.
    #[test]
    fn an_older_agents_info_reads_as_without_snapshots_or_archive_restores() {
        let info: AgentInfo = serde_json::from_str(
            r#"{"version":"0.1.0","nfs":{"server":"s","path":"/p"},
                "capabilities":{"quota":"xfs","quota_enforced":true,"archive":true},
                "filesystem":{"total_bytes":9,"free_bytes":8,"available_bytes":7,"total_inodes":6,"free_inodes":5}}"#,
        )
        .unwrap();
        assert!(info.capabilities.archive);
        assert!(!info.capabilities.snapshots);
        assert!(!info.capabilities.archive_restores);
        assert_eq!(info.capabilities.exports, ExportManager::default());
        assert_eq!(info.provisioning, None);
    }

    /// The agent reads requests strictly: a new field is refused, never silently
    /// dropped; a new quota policy reads as `Unknown`, which the agent refuses.
    #[test]
    fn requests_stay_strict_and_an_unknown_policy_is_never_a_class_spelling() {
        let request: CreateVolumeRequest =
            serde_json::from_str(r#"{"capacity_bytes":1,"quota":"strict"}"#).unwrap();
        assert_eq!(request.quota, QuotaPolicy::Unknown);
        assert!(
            serde_json::from_str::<CreateVolumeRequest>(
                r#"{"capacity_bytes":1,"owner":{"workload":"w"}}"#
            )
            .is_err()
        );
        assert!("unknown".parse::<QuotaPolicy>().is_err());
        assert_eq!(QuotaBackend::known("unknown"), None);
        assert_eq!(QuotaBackend::known("xfs"), Some(QuotaBackend::Xfs));
        assert_eq!(QuotaBackend::known("image"), Some(QuotaBackend::Image));
        for backend in QuotaBackend::KNOWN {
            assert_eq!(QuotaBackend::known(backend.as_str()), Some(backend));
        }
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<CreateVolumeRequest>(r#"{"capacity_bytes":1,"size":2}"#)
            .unwrap_err();
        assert!(err.to_string().contains("unknown field"), "{err}");
    }

    #[test]
    fn error_codes_are_stable_strings() {
        let body = serde_json::to_string(&ApiError::new(ErrorCode::InvalidPath, "x")).unwrap();
        assert_eq!(body, r#"{"code":"invalid_path","message":"x"}"#);
        assert_eq!(
            ErrorCode::InsufficientStorage.to_string(),
            "insufficient_storage"
        );
        assert_eq!(ErrorCode::InsufficientStorage.http_status(), 507);
        let full: ApiError =
            serde_json::from_str(r#"{"code":"job_queue_full","message":"m"}"#).unwrap();
        assert_eq!(full.code, ErrorCode::JobQueueFull);
        assert_eq!(full.code.http_status(), 429);
        assert!(full.code.is_transient());
        let overcommitted: ApiError =
            serde_json::from_str(r#"{"code":"overcommit_limit","message":"m"}"#).unwrap();
        assert_eq!(overcommitted.code, ErrorCode::OvercommitLimit);
        assert_eq!(overcommitted.code.http_status(), 507);
        assert!(overcommitted.code.is_transient());
        let limited: ApiError =
            serde_json::from_str(r#"{"code":"snapshot_limit","message":"m"}"#).unwrap();
        assert_eq!(limited.code, ErrorCode::SnapshotLimit);
        assert_eq!(limited.code.http_status(), 507);
        assert!(limited.code.is_transient());
    }

    #[test]
    fn provisioning_reads_without_a_maximum_and_says_when_past_the_warning() {
        let info: Provisioning = serde_json::from_str(
            r#"{"provisioned_bytes":30,"overcommit_ratio":1.5,"warn_ratio":1.0}"#,
        )
        .unwrap();
        assert_eq!(info.max_ratio, None);
        assert!(info.past_warning());
        assert!(!serde_json::to_string(&info).unwrap().contains("max_ratio"));
        let within = Provisioning {
            overcommit_ratio: 1.0,
            ..info
        };
        assert!(
            !within.past_warning(),
            "at the warning ratio is not past it"
        );
    }

    fn volume_page(raw: Option<&str>) -> Result<Option<PageRequest<VolumePath>>, String> {
        ListQuery::parse(raw, VolumePath::parse)
    }

    #[test]
    fn no_limit_asks_for_the_whole_list() {
        assert_eq!(volume_page(None), Ok(None));
        assert_eq!(volume_page(Some("")), Ok(None));
    }

    #[test]
    fn a_page_query_reads_its_limit_and_cursor() {
        assert_eq!(
            volume_page(Some("limit=50")),
            Ok(Some(PageRequest {
                limit: 50,
                after: None
            }))
        );
        assert_eq!(
            volume_page(Some("after=team%2Fdata-2&limit=1000")),
            Ok(Some(PageRequest {
                limit: 1000,
                after: Some(VolumePath::parse("team/data-2").unwrap())
            }))
        );
        let id = "team/data/@20260101T000000.000000000Z";
        let query = ListQuery {
            limit: Some(7),
            after: Some(id.into()),
        };
        let page = ListQuery::parse(Some(&query.to_query_string()), ArchivePath::parse).unwrap();
        assert_eq!(page.unwrap().after.unwrap().to_string(), id);
        assert_eq!(ListQuery::default().to_query_string(), "");
    }

    #[test]
    fn bad_page_queries_are_refused_saying_why() {
        for (raw, says) in [
            ("limit=0", "limit must be 1 to 1000, not 0"),
            ("limit=1001", "limit must be 1 to 1000, not 1001"),
            ("limit=-1", "invalid query"),
            ("limit=ten", "invalid query"),
            ("limit=99999999999", "invalid query"),
            ("after=a", "after needs a limit"),
            ("limit=5&after=..%2Fetc", "after:"),
            ("limit=5&after=", "after:"),
            ("limit=5&offset=3", "unknown field"),
        ] {
            let error = volume_page(Some(raw)).unwrap_err();
            assert!(error.contains(says), "{raw}: {error}");
        }
        assert!(
            ListQuery::parse(Some("limit=5&after=team%2Fdata"), ArchivePath::parse)
                .unwrap_err()
                .contains("after:")
        );
    }

    #[test]
    fn lists_from_older_agents_read_without_next() {
        let list: VolumeList = serde_json::from_str(r#"{"volumes":[]}"#).unwrap();
        assert_eq!(list.next, None);
        assert_eq!(
            serde_json::to_string(&ArchiveList::default()).unwrap(),
            r#"{"archives":[]}"#
        );
    }
}
