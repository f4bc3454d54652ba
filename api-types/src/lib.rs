//! The contract between the nfsprov controller and agent: the agent API's types, the volume
//! path validator both sides call, and (feature `client`) a typed HTTPS client.
//!
//! This crate depends on neither kube nor axum, so either side can change its framework
//! without touching the contract.

mod archive;
pub mod endpoints;
pub mod logsafe;
mod path;
mod reloading_file;
mod types;

#[cfg(feature = "client")]
pub mod client;

pub use archive::{
    ARCHIVE_ENTRY_PREFIX, ArchiveEntry, ArchivePath, ArchivePathError, MAX_ARCHIVE_SUFFIX,
};
pub use endpoints::{API_PREFIX, Endpoint};
pub use path::{
    MAX_COMPONENT_BYTES, MAX_COMPONENTS, MAX_PATH_BYTES, PathError, VolumePath, validate_component,
};
pub use reloading_file::{MAX_PEM_BYTES, MAX_TOKEN_BYTES, ReloadingFile, read_bounded};
pub use types::*;
