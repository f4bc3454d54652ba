use std::fmt::Write as _;

use nfsprov_api_types::{ExportRequest, VolumeExport, VolumePath};
use serde::{Deserialize, Serialize};

/// What one volume is exported to: the request as the agent last applied it, and the
/// names the export was given when it was first made, which never change after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportRecord {
    pub volume: VolumePath,
    /// ganesha's export id; knfsd has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<u16>,
    /// ganesha: the random name below the mount root the volume is served at (its
    /// `Pseudo` path), so that the pseudo-filesystem every client can browse shows no
    /// namespace or claim. Absent: served at its volume path, as exports made before
    /// opaque paths, or without asking for one, are (a PV's path cannot change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pseudo: Option<String>,
    /// knfsd, a volume that is a filesystem of its own: the UUID of its `fsid=`, so the
    /// kernel's file handles name the export rather than the device. Absent on shared
    /// filesystems, and on exports made before (a new fsid would make every handle a
    /// client holds stale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fsid: Option<String>,
    pub request: ExportRequest,
}

impl ExportRecord {
    /// The record of `request` for `volume`, its clients sorted and without repeats so
    /// that equal sets compare equal and render the same. Its names are the caller's
    /// to give ([`ExportRecord::named`]).
    pub fn new(volume: VolumePath, id: Option<u16>, mut request: ExportRequest) -> Self {
        request.clients.sort_unstable();
        request.clients.dedup();
        // Asked once, when the export is first made: what it decided is `pseudo`.
        request.opaque_path = false;
        Self {
            volume,
            id,
            pseudo: None,
            fsid: None,
            request,
        }
    }

    /// The record with the names `earlier` was given, or new ones when there is no
    /// earlier record: an opaque pseudo name when `opaque` and an fsid when `fsid`.
    pub fn named(
        mut self,
        earlier: Option<&ExportRecord>,
        opaque: bool,
        fsid: bool,
    ) -> std::io::Result<Self> {
        match earlier {
            Some(earlier) => {
                self.pseudo = earlier.pseudo.clone();
                self.fsid = earlier.fsid.clone();
            }
            None => {
                if opaque {
                    self.pseudo = Some(hex(&random::<16>()?));
                }
                if fsid {
                    self.fsid = Some(uuid(random::<16>()?));
                }
            }
        }
        Ok(self)
    }

    /// The export as the API reports it; `mount_root` is the path clients mount for
    /// the export root (`nfs.path`).
    pub fn to_volume_export(&self, mount_root: &str) -> VolumeExport {
        let request = &self.request;
        VolumeExport {
            path: self.mount_path(mount_root),
            clients: request.clients.clone(),
            access: request.access,
            squash: request.squash,
            anon_uid: request.anon_uid,
            anon_gid: request.anon_gid,
            sec: request.sec.clone(),
        }
    }

    /// The path clients mount: the opaque name below `mount_root` when the export has
    /// one (ganesha's `Pseudo` path), else the volume path below it, which a PV's
    /// `spec.nfs.path` already names (knfsd's clients mount the real path this way, the
    /// mount root being the export root as clients see it).
    pub fn mount_path(&self, mount_root: &str) -> String {
        let root = mount_root.trim_end_matches('/');
        match &self.pseudo {
            Some(name) => format!("{root}/{name}"),
            None => format!("{root}/{}", self.volume),
        }
    }

    /// Whether the names read back from a file are ones this agent gives: they are
    /// written into the NFS server's configuration and into paths.
    fn check_names(&self) -> Result<(), String> {
        if let Some(name) = &self.pseudo
            && !is_hex(name, 32)
        {
            return Err(format!(
                "the export of {} has a pseudo name that is not 32 hex digits: {name:?}",
                self.volume
            ));
        }
        if let Some(fsid) = &self.fsid
            && !is_uuid(fsid)
        {
            return Err(format!(
                "the export of {} has an fsid that is not a UUID: {fsid:?}",
                self.volume
            ));
        }
        Ok(())
    }
}

/// `N` random bytes from the kernel.
fn random<const N: usize>() -> std::io::Result<[u8; N]> {
    let mut bytes = [0u8; N];
    let mut filled = 0;
    while filled < N {
        filled +=
            rustix::rand::getrandom(&mut bytes[filled..], rustix::rand::GetRandomFlags::empty())?;
    }
    Ok(bytes)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// A random (version 4) UUID as exports(5) takes it: `8-4-4-4-12` hex digits.
fn uuid(mut bytes: [u8; 16]) -> String {
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let text = hex(&bytes);
    format!(
        "{}-{}-{}-{}-{}",
        &text[..8],
        &text[8..12],
        &text[12..16],
        &text[16..20],
        &text[20..]
    )
}

fn is_hex(text: &str, len: usize) -> bool {
    text.len() == len
        && text
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn is_uuid(text: &str) -> bool {
    let parts: Vec<&str> = text.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(part, len)| is_hex(part, len))
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
                let record: Self = serde_json::from_str(json)
                    .map_err(|e| format!("{file}: an export record cannot be read: {e}"))?;
                record.check_names().map_err(|e| format!("{file}: {e}"))?;
                Ok(record)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> ExportRecord {
        let request = ExportRequest {
            opaque_path: true,
            ..ExportRequest::default()
        };
        ExportRecord::new(
            VolumePath::parse("team-a/data").unwrap(),
            Some(1000),
            request,
        )
    }

    #[test]
    fn a_new_opaque_export_is_mounted_at_a_random_name_that_names_nothing_of_the_volume() {
        let first = record().named(None, true, false).unwrap();
        let second = record().named(None, true, false).unwrap();
        let name = first.pseudo.clone().unwrap();
        assert!(is_hex(&name, 32), "{name}");
        assert_ne!(first.pseudo, second.pseudo, "each export its own name");
        let path = first.to_volume_export("/exports/").path;
        assert_eq!(path, format!("/exports/{name}"));
        assert!(!path.contains("team-a") && !path.contains("data"), "{path}");
        assert!(
            !first.request.opaque_path,
            "the record keeps the answer, not the ask"
        );
    }

    #[test]
    fn the_names_stay_what_the_first_export_chose() {
        let first = record().named(None, true, true).unwrap();
        let changed = ExportRequest {
            clients: vec!["10.0.0.1".parse().unwrap()],
            ..ExportRequest::default()
        };
        let next = ExportRecord::new(first.volume.clone(), first.id, changed)
            .named(Some(&first), true, true)
            .unwrap();
        assert_eq!((&next.pseudo, &next.fsid), (&first.pseudo, &first.fsid));
        // A record made before opaque names keeps its volume path for good.
        let legacy = record();
        let updated = record().named(Some(&legacy), true, true).unwrap();
        assert_eq!((updated.pseudo, updated.fsid), (None, None));
        assert_eq!(
            legacy.to_volume_export("/exports").path,
            "/exports/team-a/data"
        );
    }

    #[test]
    fn an_fsid_is_a_uuid_and_names_round_trip_through_the_comment() {
        let record = record().named(None, true, true).unwrap();
        let fsid = record.fsid.clone().unwrap();
        assert!(is_uuid(&fsid), "{fsid}");
        assert_eq!(&fsid[14..15], "4", "version 4");
        let read = ExportRecord::from_comments(&record.to_comment(), "test").unwrap();
        assert_eq!(read, vec![record]);
    }

    #[test]
    fn a_record_without_names_reads_as_one_served_at_its_volume_path() {
        let old = r#"# nfsprov-record {"volume":"ns/claim","id":1000,"request":{"clients":[],"access":"read-write","squash":"root","sec":["sys"]}}"#;
        let read = ExportRecord::from_comments(old, "test").unwrap();
        assert_eq!(
            (read[0].pseudo.as_ref(), read[0].fsid.as_ref()),
            (None, None)
        );
        assert_eq!(read[0].mount_path("/srv/nfs"), "/srv/nfs/ns/claim");
    }

    #[test]
    fn names_that_could_leave_their_place_in_a_file_are_refused() {
        for (field, value) in [
            ("pseudo", "../../etc\\\";"),
            ("pseudo", "team-a"),
            ("fsid", "1,rw"),
        ] {
            let text = format!(
                r#"# nfsprov-record {{"volume":"ns/claim","{field}":"{value}","request":{{"clients":[]}}}}"#
            );
            let read = ExportRecord::from_comments(&text, "test");
            assert!(read.is_err(), "{field} {value:?}: {read:?}");
        }
    }
}
