//! Quota tools: how the filesystem under the export root is asked to enforce a volume's
//! capacity (btrfs qgroups, XFS project quotas), each a thin layer over its command-line
//! tool, and the settings of every quota backend. `command` runs those tools (and `zfs`,
//! whose datasets are a backend of their own, not only a quota). The volume store's
//! backends (`store`) decide when to call them.

pub(crate) mod btrfs;
pub mod command;
pub mod xfs;

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
