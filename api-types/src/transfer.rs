//! Replicas: a snapshot of one agent (the source) received by another (the target), file
//! by file, sending only what the target's previous replica lacks.
//!
//! The exchange, all of it over HTTPS:
//! 1. Whoever may act on the snapshot on the source (the controller) asks the source for a
//!    grant: `POST /v1/transfers/{snapshot}`. The answer holds a token that lets its
//!    bearer read that one snapshot, through the two transfer endpoints only, until it
//!    expires. The source keeps only the token's SHA-256.
//! 2. It hands the grant to the target: `PUT /v1/replicas/{name}` with the source's URL
//!    and CA. The target reads the snapshot's manifest (`GET /v1/transfer/manifest`),
//!    builds the replica from its own previous one (`base`) wherever a file's content is
//!    already there, and fetches every other file (`GET /v1/transfer/content?path=`).
//! 3. The target answers once the replica is complete and durable: a snapshot of its own,
//!    outside every volume, never exported, restorable like any other.
//!
//! The grant's token is a secret: it is never logged, and [`TransferGrant`] and
//! [`ReceiveReplicaRequest`] print it redacted.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::manifest::ManifestEntry;
use crate::snapshot::Snapshot;
use crate::snapshot_name::SnapshotName;

/// The longest a grant may live, and what one lives when the request says nothing.
pub const MAX_TRANSFER_TTL_SECONDS: u64 = 24 * 3600;
pub const DEFAULT_TRANSFER_TTL_SECONDS: u64 = 3600;

/// Body of `POST /v1/transfers/{snapshot}`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateTransferRequest {
    /// How long the grant lives; at most [`MAX_TRANSFER_TTL_SECONDS`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl_seconds: Option<u64>,
}

/// The answer to `POST /v1/transfers/{snapshot}`: what the target needs to read that one
/// snapshot.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TransferGrant {
    /// The bearer token of the transfer endpoints, for this snapshot only.
    pub token: String,
    pub snapshot: SnapshotName,
    /// RFC 3339 UTC time after which the token is refused.
    pub expires_at: String,
}

impl fmt::Debug for TransferGrant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TransferGrant")
            .field("token", &"<redacted>")
            .field("snapshot", &self.snapshot)
            .field("expires_at", &self.expires_at)
            .finish()
    }
}

/// One line of `GET /v1/transfer/manifest`: the snapshot first, then each entry of its
/// tree in manifest order, then the count of entries sent. A manifest without its `end`
/// line was cut short and is not used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum TransferManifestLine {
    Snapshot(Snapshot),
    Entry(ManifestEntry),
    End { entries: u64 },
}

/// The longest line of a manifest a receiver reads: an entry with many large extended
/// attributes is the longest there is.
pub const MAX_MANIFEST_LINE: usize = 8 << 20;

/// The query of `GET /v1/transfer/content`: one regular file of the granted snapshot, by
/// its manifest path, hex-encoded (a path is any bytes).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransferContentQuery {
    pub path: String,
}

/// Body of `PUT /v1/replicas/{name}`: receive the snapshot a grant names from its agent,
/// as this agent's snapshot `name`. The same request again is answered with the same
/// replica; a name taken by anything else is a `conflict`.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReceiveReplicaRequest {
    /// The source agent's base URL, `https://host:port`.
    pub source_url: String,
    /// PEM of the CA that signed the source agent's server certificate.
    pub source_ca_pem: String,
    /// What the source answered to the grant's request.
    pub grant: TransferGrant,
    /// An earlier replica on this agent to build from: files whose content it holds are
    /// taken from it, not sent again. Absent: everything is sent (the first run).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base: Option<SnapshotName>,
}

impl fmt::Debug for ReceiveReplicaRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReceiveReplicaRequest")
            .field("source_url", &self.source_url)
            .field("grant", &self.grant)
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// The answer to `PUT /v1/replicas/{name}`: the replica, and what its making cost.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReplicaOutcome {
    pub snapshot: Snapshot,
    /// Regular files whose content came over the network, and the bytes of data that
    /// came (holes are not sent).
    pub fetched_files: u64,
    pub fetched_bytes: u64,
    /// Regular files whose content was taken from the base replica (or kept from a
    /// receive cut short), and their sizes.
    pub reused_files: u64,
    pub reused_bytes: u64,
}
