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
    /// ganesha: whether its own start reads every export from the agent's include lists
    /// (the default). Off, the top list names none and the agent serves every export
    /// in batches once ganesha is on the bus: ganesha 4's configuration parser takes
    /// time quadratic in the exports of one parse (85 s at 10,000 on a 2-core machine), so at many
    /// thousands of exports its start is faster without them, at the price of serving
    /// nothing after a restart until the agent runs.
    pub ganesha_reads_exports_at_start: bool,
    /// knfsd: the directory of each exported volume's file (`nfsprov-*.exports`), which
    /// `exportfs -a` reads at boot.
    pub knfsd_exports_dir: PathBuf,
    /// knfsd: the one file of every export that agents before kept; its exports are
    /// moved to their own files at start and the file removed.
    pub knfsd_exports_file: PathBuf,
    /// knfsd: the `exportfs` command.
    pub knfsd_exportfs: PathBuf,
    /// Serve requests from source ports above 1023. Off by default: a reserved port is
    /// a root-owned socket on the client, so an unprivileged process (a pod sharing its
    /// node's address) cannot speak NFS to the server at all.
    pub allow_unprivileged_ports: bool,
    /// Make new per-volume exports although the export root shares its filesystem with
    /// other data, which a client forging file handles can then reach.
    pub allow_shared_filesystem: bool,
    /// Make per-volume exports on a backend whose volumes share a filesystem (the
    /// directory backends): the export then decides who mounts a volume by name, but a
    /// client forging file handles reaches every volume of that filesystem.
    pub mount_control_only: bool,
    /// Longest wait for the NFS server: for each answer of ganesha's export manager, for
    /// its bus to accept a connection, and for a change to get its turn.
    pub server_timeout: Duration,
    /// How often the reconciler compares what ganesha serves with the table (after a
    /// failure it tries again sooner).
    pub reconcile_interval: Duration,
}

/// How the volumes sit on the server, which decides what knfsd must check of a file
/// handle; the agent reads it from its store's backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VolumeLayout {
    /// Directories of one filesystem that every volume shares.
    SharedFilesystem,
    /// Each volume a filesystem of its own, mounted at its path.
    OwnFilesystem,
}

impl Default for ExportSettings {
    fn default() -> Self {
        Self {
            manager: ExportManager::None,
            ganesha_config_dir: "/etc/ganesha/nfsprov".into(),
            ganesha_dbus_address: None,
            // Clear of the ids operators usually give their own exports by hand.
            ganesha_export_ids: 1000..=65000,
            ganesha_reads_exports_at_start: true,
            knfsd_exports_dir: "/etc/exports.d".into(),
            knfsd_exports_file: "/etc/exports.d/nfsprov.exports".into(),
            knfsd_exportfs: "/usr/sbin/exportfs".into(),
            allow_unprivileged_ports: false,
            allow_shared_filesystem: false,
            mount_control_only: false,
            server_timeout: Duration::from_secs(10),
            reconcile_interval: Duration::from_secs(30),
        }
    }
}
