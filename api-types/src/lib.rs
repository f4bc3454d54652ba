//! The contract between the nfsprov controller and agent: the agent API's types, the volume
//! path validator both sides call, and (feature `client`) a typed HTTPS client.
//!
//! This crate depends on neither kube nor axum, so either side can change its framework
//! without touching the contract.
//!
//! Every endpoint's method, path, request and answer types are in [`endpoints`]: the agent
//! routes from that table and labels its metrics with its templates, the client sends
//! every request through one generic call over its types.
//!
//! # Version skew
//!
//! A controller and an agent one minor version apart work together, whichever is newer.
//! What each side reads from the other is read leniently where the other may be newer:
//!
//! - A newer agent may add fields to its answers (an older controller ignores them), add
//!   values to the enums it answers with ([`QuotaBackend`], [`CloneMethod`],
//!   [`ErrorCode`], [`ExportManager`], [`SnapshotMethod`]; an older controller reads them as `Unknown`, shows them as
//!   `unknown`, never acts on them, and judges an unknown error code by its HTTP
//!   status), and add endpoints.
//! - A newer agent may not remove or rename a field, endpoint or enum value, change a
//!   field's type or meaning, make an answer field optional that was always sent, change
//!   an endpoint's method, path or success status, or require a request field an older
//!   controller does not send.
//! - The agent reads requests strictly: an unknown field is refused (`invalid_body`), and
//!   an unknown [`QuotaPolicy`] is refused as `unsupported`. So a newer controller sends
//!   a new request field only when it is set (as `retention_days` of an archive), and an
//!   older agent then refuses that one request with a permanent, named error instead of
//!   ignoring what was asked.

#![warn(unreachable_pub)]

mod answer;
mod archive;
mod condition;
pub mod endpoints;
mod export;
pub mod logsafe;
pub mod manifest;
mod path;
mod reloading_file;
mod restore_source;
mod snapshot;
mod snapshot_name;
mod transfer;
mod types;

#[cfg(feature = "client")]
pub mod client;

pub use answer::{CloneOutcome, CreateOutcome, JobOutcome, ReadAnswer, RestoreOutcome};
pub use archive::{
    ARCHIVE_ENTRY_PREFIX, ArchiveEntry, ArchivePath, ArchivePathError, MAX_ARCHIVE_SUFFIX,
};
pub use condition::{AbnormalReason, RepairedCondition, VolumeCondition};
pub use endpoints::{API_PREFIX, Endpoint};
pub use export::{
    ExportAccess, ExportClient, ExportClientError, ExportManager, ExportRequest,
    ExportRequestError, MAX_EXPORT_CLIENTS, SecFlavor, Squash, VolumeExport,
};
pub use manifest::{
    EntryKind, ManifestEntry, ManifestError, ManifestValidator, WireBytes, Xattr, validate_entry,
};
pub use path::{
    MAX_COMPONENT_BYTES, MAX_COMPONENTS, MAX_PATH_BYTES, PathError, VolumePath, validate_component,
};
pub use reloading_file::{MAX_PEM_BYTES, MAX_TOKEN_BYTES, ReloadingFile, read_bounded};
pub use restore_source::RestoreSource;
pub use snapshot::{
    CreateSnapshotRequest, RestoreProgress, RestoreVolumeRequest, Snapshot, SnapshotList,
    SnapshotMethod,
};
pub use snapshot_name::{MAX_SNAPSHOT_NAME, SnapshotName, SnapshotNameError};
pub use transfer::{
    CreateTransferRequest, DEFAULT_TRANSFER_TTL_SECONDS, MAX_MANIFEST_LINE,
    MAX_TRANSFER_TTL_SECONDS, ReceiveReplicaRequest, ReplicaOutcome, TransferContentQuery,
    TransferGrant, TransferManifestLine,
};
pub use types::*;
