use nfsprov_api_types::{ExportRequest, VolumeExport, VolumePath};
use serde::{Deserialize, Serialize};

/// What one volume is exported to: the request as the agent last applied it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRecord {
    pub volume: VolumePath,
    /// ganesha's export id; knfsd has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    pub request: ExportRequest,
}

impl ExportRecord {
    /// The record of `request` for `volume`, its clients sorted and without repeats so
    /// that equal sets compare equal and render the same.
    pub fn new(volume: VolumePath, id: Option<u16>, mut request: ExportRequest) -> Self {
        request.clients.sort_unstable();
        request.clients.dedup();
        Self {
            volume,
            id,
            request,
        }
    }

    /// The export as the API reports it; `mount_root` is the path clients mount for
    /// the export root (`nfs.path`).
    pub fn to_volume_export(&self, mount_root: &str) -> VolumeExport {
        let request = &self.request;
        VolumeExport {
            path: mount_path(mount_root, &self.volume),
            clients: request.clients.clone(),
            access: request.access,
            squash: request.squash,
            anon_uid: request.anon_uid,
            anon_gid: request.anon_gid,
            sec: request.sec.clone(),
        }
    }
}

/// The path clients mount for `volume`: the one a PV's `spec.nfs.path` already names.
pub fn mount_path(mount_root: &str, volume: &VolumePath) -> String {
    format!("{}/{volume}", mount_root.trim_end_matches('/'))
}

/// Marks the line of a server configuration file that carries an export's record.
const RECORD_PREFIX: &str = "# nfsprov-record ";

impl ExportRecord {
    /// The record as a comment line of the NFS server's configuration.
    pub fn to_comment(&self) -> String {
        // Compact JSON has no line break, and a comment runs to the end of its line in
        // both ganesha's and exportfs's syntax.
        let json = serde_json::to_string(self).unwrap_or_default();
        format!("{RECORD_PREFIX}{json}\n")
    }

    /// The records the comment lines of `text` carry.
    pub fn from_comments(text: &str, file: &str) -> Result<Vec<Self>, String> {
        text.lines()
            .filter_map(|line| line.strip_prefix(RECORD_PREFIX))
            .map(|json| {
                serde_json::from_str(json)
                    .map_err(|e| format!("{file}: an export record cannot be read: {e}"))
            })
            .collect()
    }
}
