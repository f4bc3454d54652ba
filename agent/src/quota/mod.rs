//! Quota backends: how a volume's capacity is enforced by the filesystem under the
//! export root. The backend is chosen in the settings and probed once at start, so a
//! backend that cannot work there stops the agent with one line saying why.

pub mod btrfs;
pub mod command;
pub mod xfs;
pub mod zfs;

use std::ops::RangeInclusive;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::QuotaBackend;

use self::btrfs::Btrfs;
use self::command::{SystemRunner, ToolError, ToolRunner};
use self::xfs::{Xfs, XfsError};
use self::zfs::{Zfs, ZfsError};

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

/// The backend in use.
#[derive(Debug)]
pub enum Quota {
    /// Capacity is recorded, never enforced.
    None,
    Btrfs(Btrfs),
    Xfs(Xfs),
    Zfs(Zfs),
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

impl Quota {
    /// Sets up and probes the configured backend on the export root.
    pub fn open(settings: &QuotaSettings, export_root: &Path) -> Result<Self, String> {
        let runner: Arc<dyn ToolRunner> = Arc::new(SystemRunner::new(settings.command_timeout));
        let quota = match settings.backend {
            QuotaBackend::None => Quota::None,
            QuotaBackend::Btrfs => Quota::Btrfs(Btrfs::probe(runner, export_root)?),
            QuotaBackend::Xfs => Quota::Xfs(Xfs::probe(
                runner,
                export_root,
                settings.xfs_project_ids.clone(),
            )?),
            QuotaBackend::Zfs => {
                let dataset = settings
                    .zfs_dataset
                    .as_deref()
                    .ok_or("quota.zfs_dataset is not set")?;
                Quota::Zfs(Zfs::probe(runner, dataset, export_root)?)
            }
        };
        Ok(quota)
    }

    pub fn backend(&self) -> QuotaBackend {
        match self {
            Quota::None => QuotaBackend::None,
            Quota::Btrfs(_) => QuotaBackend::Btrfs,
            Quota::Xfs(_) => QuotaBackend::Xfs,
            Quota::Zfs(_) => QuotaBackend::Zfs,
        }
    }

    /// Whether volumes can be held to their capacity.
    pub fn can_enforce(&self) -> bool {
        !matches!(self, Quota::None)
    }
}
