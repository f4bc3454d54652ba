use std::ops::RangeInclusive;
use std::path::PathBuf;
use std::time::Duration;

use nfsprov_api_types::ExportManager;

/// The `[exports]` settings, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExportSettings {
    pub manager: ExportManager,
    /// ganesha: the directory of the agent's EXPORT blocks and of the `exports.conf`
    /// that `%include`s them all.
    pub ganesha_config_dir: PathBuf,
    /// ganesha: the D-Bus address of its bus; `None`: the system bus.
    pub ganesha_dbus_address: Option<String>,
    /// ganesha: the export ids volumes may be given (ganesha's ids are 16 bits).
    pub ganesha_export_ids: RangeInclusive<u16>,
    /// knfsd: the exports file the agent owns, read by `exportfs -ra` at boot.
    pub knfsd_exports_file: PathBuf,
    /// knfsd: the `exportfs` command.
    pub knfsd_exportfs: PathBuf,
    /// Longest wait for the NFS server: for each answer of ganesha's export manager, for
    /// its bus to accept a connection, and for a change to get its turn.
    pub server_timeout: Duration,
    /// How often the reconciler compares what ganesha serves with the table (after a
    /// failure it tries again sooner).
    pub reconcile_interval: Duration,
}

impl Default for ExportSettings {
    fn default() -> Self {
        Self {
            manager: ExportManager::None,
            ganesha_config_dir: "/etc/ganesha/nfsprov".into(),
            ganesha_dbus_address: None,
            // Clear of the ids operators usually give their own exports by hand.
            ganesha_export_ids: 1000..=65000,
            knfsd_exports_file: "/etc/exports.d/nfsprov.exports".into(),
            knfsd_exportfs: "/usr/sbin/exportfs".into(),
            server_timeout: Duration::from_secs(10),
            reconcile_interval: Duration::from_secs(30),
        }
    }
}
