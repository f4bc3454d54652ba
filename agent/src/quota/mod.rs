//! The settings of every quota backend, and `command`, which runs every filesystem tool
//! the store's backends drive (`btrfs`, `xfs_quota`, `zfs`, the image tools) with a time
//! limit and never through a shell. The tools themselves live beside the backend that uses
//! them, under `store::backend`.

pub mod command;

use std::ops::RangeInclusive;
use std::time::Duration;

use nfsprov_api_types::QuotaBackend;

/// The quota settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuotaSettings {
    pub backend: QuotaBackend,
    /// ZFS: the dataset mounted at the export root; volumes become its children.
    pub zfs_dataset: Option<String>,
    /// XFS: the project ids volumes may be given.
    pub xfs_project_ids: RangeInclusive<u32>,
    /// Longest a quota tool may run before it is killed and the request fails.
    pub command_timeout: Duration,
}

impl Default for QuotaSettings {
    fn default() -> Self {
        Self {
            backend: QuotaBackend::None,
            zfs_dataset: None,
            xfs_project_ids: 100_000..=199_999,
            command_timeout: Duration::from_secs(30),
        }
    }
}
