//! The store's errors, in terms the API maps to its error codes. Every part of the store
//! (confinement, records, backends) reports through these, so one mapping in the API
//! covers them all.
//!
//! Messages are built around names a tenant chose (an entry of a volume being copied or
//! removed): they are shown escaped and bounded wherever they go, the API's answer, the
//! log and, through the controller, the claim's events.

use std::io;

use nfsprov_api_types::logsafe::Clean;
use nfsprov_api_types::{ApiError, ErrorCode, VolumePath};
use rustix::io::Errno;

use super::backend::directory::xfs::XfsError;
use super::backend::zfs::ZfsError;
use crate::quota::command::ToolError;

/// What went wrong, in terms the API maps to its error codes.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A symlink or non-directory where a directory must be.
    #[error("{}", Clean(.0))]
    Unsafe(String),
    #[error("{}", Clean(.0))]
    Conflict(String),
    #[error("{}", Clean(.0))]
    NotFound(String),
    #[error("{}", Clean(.0))]
    NoSpace(String),
    #[error("{}", Clean(.0))]
    NotReady(String),
    /// A new promise of capacity past `limits.max_overcommit_ratio`.
    #[error("{}", Clean(.0))]
    Overcommitted(String),
    /// A snapshot past `limits.max_snapshot_bytes_per_namespace`.
    #[error("{}", Clean(.0))]
    SnapshotLimit(String),
    /// A volume or capacity past what the credential's limits allow beneath its prefix.
    #[error("{}", Clean(.0))]
    CredentialLimit(String),
    /// A quota the backend cannot give, or a shrink.
    #[error("{}", Clean(.0))]
    Unsupported(String),
    /// A request that can never succeed as it is (a restore smaller than its snapshot).
    #[error("{}", Clean(.0))]
    Invalid(String),
    /// A quota operation failed.
    #[error("{}: {}", Clean(.context), Clean(&.source.to_string()))]
    Quota {
        context: String,
        #[source]
        source: QuotaError,
    },
    #[error("{}: {}", Clean(.context), Clean(&.source.to_string()))]
    Io {
        context: String,
        #[source]
        source: io::Error,
    },
}

impl StoreError {
    /// The API's error code for it.
    pub fn code(&self) -> ErrorCode {
        match self {
            StoreError::Unsafe(_) => ErrorCode::UnsafePath,
            StoreError::Conflict(_) => ErrorCode::Conflict,
            StoreError::NotFound(_) => ErrorCode::NotFound,
            StoreError::NoSpace(_) => ErrorCode::InsufficientStorage,
            StoreError::NotReady(_) => ErrorCode::NotReady,
            StoreError::Overcommitted(_) => ErrorCode::OvercommitLimit,
            StoreError::SnapshotLimit(_) => ErrorCode::SnapshotLimit,
            StoreError::CredentialLimit(_) => ErrorCode::CredentialLimit,
            StoreError::Unsupported(_) => ErrorCode::Unsupported,
            StoreError::Invalid(_) => ErrorCode::InvalidBody,
            StoreError::Quota { source, .. } if source.timed_out() => ErrorCode::Timeout,
            StoreError::Quota { .. } | StoreError::Io { .. } => ErrorCode::Internal,
        }
    }

    /// The API's error answer for it.
    pub fn to_api_error(&self) -> ApiError {
        ApiError::new(self.code(), self.to_string())
    }
}

/// A quota operation that failed.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error(transparent)]
    Tool(#[from] ToolError),
    #[error(transparent)]
    Xfs(#[from] XfsError),
    #[error(transparent)]
    Zfs(#[from] ZfsError),
}

impl QuotaError {
    /// Whether a tool was killed for running too long (worth retrying later).
    pub fn timed_out(&self) -> bool {
        matches!(
            self,
            QuotaError::Tool(ToolError::TimedOut { .. })
                | QuotaError::Xfs(XfsError::Tool(ToolError::TimedOut { .. }))
                | QuotaError::Zfs(ZfsError::Tool(ToolError::TimedOut { .. }))
        )
    }
}

pub type Result<T> = std::result::Result<T, StoreError>;

pub(super) fn quota_error(context: impl Into<String>, source: impl Into<QuotaError>) -> StoreError {
    StoreError::Quota {
        context: context.into(),
        source: source.into(),
    }
}

/// A failed system call; a full filesystem or quota becomes [`StoreError::NoSpace`].
pub(crate) fn io_error(context: impl Into<String>, errno: Errno) -> StoreError {
    let context = context.into();
    match errno {
        Errno::NOSPC | Errno::DQUOT => StoreError::NoSpace(format!("{context}: no space left")),
        _ => StoreError::Io {
            context,
            source: errno.into(),
        },
    }
}

pub(super) fn not_found(path: &VolumePath) -> StoreError {
    StoreError::NotFound(format!("no volume at {path}"))
}

/// A step of a walk that met a symlink or a non-directory is refused, never followed.
pub(super) fn walk_error(walked: &str, errno: Errno) -> StoreError {
    match errno {
        Errno::LOOP | Errno::NOTDIR | Errno::MLINK => StoreError::Unsafe(format!(
            "{walked} is a symlink or not a directory; the agent never follows links"
        )),
        e => io_error(format!("open {walked}"), e),
    }
}
