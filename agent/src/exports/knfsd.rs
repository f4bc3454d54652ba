//! The kernel NFS server: each change is made with `exportfs -o OPTIONS CLIENT:PATH` and
//! `exportfs -u CLIENT:PATH` (never `exportfs -ra`, which rereads every export), and the
//! whole set is kept in one file under /etc/exports.d/ that the agent owns, which the
//! NFS server's start at boot reads back.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nfsprov_api_types::{ExportAccess, ExportClient, ExportManager, Squash};
use wait_timeout::ChildExt as _;

use super::settings::VolumeLayout;

use super::files;
use super::record::ExportRecord;
use super::server::{ExportError, NfsServer, Restored, Table};
use super::settings::ExportSettings;

/// Longest one `exportfs` may run before the change fails.
const EXPORTFS_TIMEOUT: Duration = Duration::from_secs(30);

/// The knfsd export manager.
#[derive(Debug)]
pub struct Knfsd {
    file: PathBuf,
    exportfs: PathBuf,
    export_root: PathBuf,
    /// `secure` (reserved source ports only) or `insecure`.
    secure: bool,
    /// How volumes sit on the export root's filesystem, which decides the options that
    /// confine a client to its export (see [`options`]).
    layout: VolumeLayout,
}

impl Knfsd {
    pub fn new(settings: &ExportSettings, export_root: &Path, layout: VolumeLayout) -> Self {
        Self {
            file: settings.knfsd_exports_file.clone(),
            exportfs: settings.knfsd_exportfs.clone(),
            export_root: export_root.to_owned(),
            secure: !settings.allow_unprivileged_ports,
            layout,
        }
    }

    fn path_of(&self, record: &ExportRecord) -> PathBuf {
        self.export_root.join(record.volume.as_str())
    }

    /// The exports file for `all`: each volume's record, then its line.
    pub fn file_text(&self, all: &Table) -> String {
        let mut text =
            String::from("# Written by nfsprov-agent, which replaces this file at each change.\n");
        for record in all.values() {
            text.push_str(&record.to_comment());
            if record.request.clients.is_empty() {
                continue;
            }
            let options = options(record, self.secure, self.layout);
            let _ = write!(text, "\"{}\"", self.path_of(record).display());
            for client in &record.request.clients {
                let _ = write!(text, " {}({options})", file_client(client));
            }
            text.push('\n');
        }
        text
    }

    fn write_file(&self, all: &Table) -> Result<(), ExportError> {
        files::replace(&self.file, self.file_text(all).as_bytes())
            .map_err(ExportError::io(format!("writing {}", self.file.display())))
    }

    fn exportfs(&self, args: &[String]) -> Result<(), ExportError> {
        let failed = |reason: String| {
            ExportError::Server(format!(
                "{} {}: {reason}",
                self.exportfs.display(),
                args.join(" ")
            ))
        };
        let mut child = Command::new(&self.exportfs)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| failed(e.to_string()))?;
        let status = match child.wait_timeout(EXPORTFS_TIMEOUT) {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(failed(format!("no answer within {EXPORTFS_TIMEOUT:?}")));
            }
            Err(e) => return Err(failed(e.to_string())),
        };
        if status.success() {
            return Ok(());
        }
        let mut stderr = String::new();
        if let Some(mut pipe) = child.stderr.take() {
            use std::io::Read as _;
            let _ = pipe.by_ref().take(4096).read_to_string(&mut stderr);
        }
        Err(failed(format!("{status}: {}", stderr.trim())))
    }

    fn change_kernel(
        &self,
        previous: Option<&ExportRecord>,
        next: &ExportRecord,
    ) -> Result<(), ExportError> {
        for client in &next.request.clients {
            self.export(next, client)?;
        }
        if let Some(previous) = previous {
            let kept: BTreeSet<&ExportClient> = next.request.clients.iter().collect();
            for client in previous
                .request
                .clients
                .iter()
                .filter(|c| !kept.contains(c))
            {
                self.unexport(previous, client)?;
            }
        }
        Ok(())
    }

    fn export(&self, record: &ExportRecord, client: &ExportClient) -> Result<(), ExportError> {
        self.exportfs(&[
            "-o".into(),
            options(record, self.secure, self.layout),
            target(client, &self.path_of(record)),
        ])
    }

    fn unexport(&self, record: &ExportRecord, client: &ExportClient) -> Result<(), ExportError> {
        self.exportfs(&["-u".into(), target(client, &self.path_of(record))])
    }
}

/// The options of every client of an export: what the request says, the rest fixed to
/// safe choices: writes on stable storage before the reply (`sync`), requests from
/// privileged ports only (`secure`) unless lifted by `exports.allow_unprivileged_ports`,
/// and the confinement of a client to its export, which depends on `layout`:
///
/// - [`VolumeLayout::SharedFilesystem`]: each volume is a directory of one filesystem shared by
///   every volume. knfsd confines a handle to the export's filesystem, not to its
///   directory, so a client forging handles could reach every other volume;
///   `subtree_check` makes knfsd check that the object of each handle lies below the
///   export. Its cost, a handle going stale when a file open on one client is renamed
///   into another directory, is the price of that check.
/// - [`VolumeLayout::OwnFilesystem`]: each volume is a filesystem of its own, and the filesystem is
///   the confinement: `no_subtree_check` (the check would add nothing but the stale
///   handles), and an `fsid=` of the export's own (a UUID drawn when it was first made,
///   kept in its record) so that knfsd never needs the filesystem's device UUID, which
///   not every filesystem has, to make its handles. Exports recorded before keep none:
///   a new fsid would turn every handle their clients hold stale.
fn options(record: &ExportRecord, secure: bool, layout: VolumeLayout) -> String {
    let request = &record.request;
    let mut options = vec![
        match request.access {
            ExportAccess::ReadWrite => "rw",
            ExportAccess::ReadOnly | ExportAccess::Unknown => "ro",
        }
        .to_owned(),
    ];
    options.push(
        match request.squash {
            Squash::None => "no_root_squash",
            Squash::All => "all_squash",
            Squash::Root | Squash::Unknown => "root_squash",
        }
        .to_owned(),
    );
    if let Some(uid) = request.anon_uid {
        options.push(format!("anonuid={uid}"));
    }
    if let Some(gid) = request.anon_gid {
        options.push(format!("anongid={gid}"));
    }
    let sec: Vec<&str> = request.sec.iter().map(|flavor| flavor.as_str()).collect();
    options.push(format!("sec={}", sec.join(":")));
    options.push("sync".to_owned());
    match layout {
        VolumeLayout::SharedFilesystem => options.push("subtree_check".to_owned()),
        VolumeLayout::OwnFilesystem => {
            options.push("no_subtree_check".to_owned());
            if let Some(fsid) = &record.fsid {
                options.push(format!("fsid={fsid}"));
            }
        }
    }
    options.push(if secure { "secure" } else { "insecure" }.to_owned());
    options.join(",")
}

/// A client as exports(5) spells it.
fn file_client(client: &ExportClient) -> String {
    client.to_string()
}

/// `CLIENT:PATH` as exportfs takes it; an IPv6 client in brackets, since exportfs
/// splits at the colon.
fn target(client: &ExportClient, path: &Path) -> String {
    let host = match client {
        ExportClient::Host(address) if address.is_ipv6() => format!("[{address}]"),
        ExportClient::Network { address, prefix } if address.is_ipv6() => {
            format!("[{address}]/{prefix}")
        }
        other => other.to_string(),
    };
    format!("{host}:{}", path.display())
}

impl NfsServer for Knfsd {
    fn kind(&self) -> ExportManager {
        ExportManager::Knfsd
    }

    fn needs_id(&self) -> bool {
        false
    }

    fn gives_fsids(&self) -> bool {
        self.layout == VolumeLayout::OwnFilesystem
    }

    fn load(&self) -> Result<Vec<ExportRecord>, ExportError> {
        match std::fs::read_to_string(&self.file) {
            Ok(text) => ExportRecord::from_comments(&text, &self.file.display().to_string())
                .map_err(ExportError::Corrupt),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(ExportError::io(format!("reading {}", self.file.display()))(
                e,
            )),
        }
    }

    fn apply(
        &self,
        previous: Option<&ExportRecord>,
        next: &ExportRecord,
        all: &Table,
    ) -> Result<(), ExportError> {
        // The file first: a crash after it is repaired at start by exporting what it
        // says, and a reboot restores it.
        self.write_file(all)?;
        let Err(error) = self.change_kernel(previous, next) else {
            return Ok(());
        };
        // Refused: the file and the kernel go back to what was served, as far as
        // exportfs lets them.
        let mut before = all.clone();
        match previous {
            Some(previous) => {
                before.insert(previous.volume.clone(), previous.clone());
            }
            None => {
                before.remove(&next.volume);
            }
        }
        let _ = self.write_file(&before);
        let old: BTreeSet<&ExportClient> = previous
            .map(|previous| previous.request.clients.iter().collect())
            .unwrap_or_default();
        for client in next.request.clients.iter().filter(|c| !old.contains(c)) {
            let _ = self.unexport(next, client);
        }
        if let Some(previous) = previous {
            for client in &previous.request.clients {
                let _ = self.export(previous, client);
            }
        }
        Err(error)
    }

    fn remove(&self, record: &ExportRecord, all: &Table) -> Result<(), ExportError> {
        // The kernel first, so that nothing is served that the file no longer names.
        for client in &record.request.clients {
            self.unexport(record, client)?;
        }
        self.write_file(all)
    }

    /// The kernel stops serving it; the file keeps it, so a reboot serves it again.
    fn suspend(&self, record: &ExportRecord) -> Result<(), ExportError> {
        for client in &record.request.clients {
            self.unexport(record, client)?;
        }
        Ok(())
    }

    fn resume(&self, record: &ExportRecord) -> Result<(), ExportError> {
        for client in &record.request.clients {
            self.export(record, client)?;
        }
        Ok(())
    }

    fn restore(&self, all: &Table) -> Result<Restored, ExportError> {
        self.write_file(all)?;
        let mut restored = Restored::default();
        for record in all.values() {
            for client in &record.request.clients {
                // Exporting again what is exported already only refreshes its options.
                self.export(record, client)?;
            }
            restored.kept += 1;
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::{ExportRequest, VolumePath};

    use super::*;

    fn knfsd(layout: VolumeLayout) -> Knfsd {
        let settings = ExportSettings {
            manager: ExportManager::Knfsd,
            ..ExportSettings::default()
        };
        Knfsd::new(&settings, Path::new("/srv/nfs"), layout)
    }

    fn record(knfsd: &Knfsd) -> ExportRecord {
        let request = ExportRequest {
            clients: vec!["10.0.0.2".parse().unwrap()],
            // knfsd has no pseudo paths of its own: asked, nothing changes.
            opaque_path: true,
            ..ExportRequest::default()
        };
        ExportRecord::new(VolumePath::parse("ns/claim").unwrap(), None, request)
            .named(None, knfsd.serves_opaque_paths(), knfsd.gives_fsids())
            .unwrap()
    }

    #[test]
    fn volumes_sharing_a_filesystem_are_exported_with_subtree_checking_and_no_fsid() {
        let knfsd = knfsd(VolumeLayout::SharedFilesystem);
        let record = record(&knfsd);
        assert_eq!(record.fsid, None);
        assert_eq!(
            options(&record, true, VolumeLayout::SharedFilesystem),
            "rw,root_squash,sec=sys,sync,subtree_check,secure"
        );
        let table: Table = [(record.volume.clone(), record)].into_iter().collect();
        let file = knfsd.file_text(&table);
        assert!(
            file.contains(
                "\"/srv/nfs/ns/claim\" 10.0.0.2(rw,root_squash,sec=sys,sync,subtree_check,secure)\n"
            ),
            "{file}"
        );
    }

    #[test]
    fn a_volume_that_is_its_own_filesystem_gets_an_fsid_of_its_own_and_keeps_it() {
        let knfsd = knfsd(VolumeLayout::OwnFilesystem);
        let record = record(&knfsd);
        let fsid = record.fsid.clone().expect("a new export gets an fsid");
        assert_eq!(
            options(&record, true, VolumeLayout::OwnFilesystem),
            format!("rw,root_squash,sec=sys,sync,no_subtree_check,fsid={fsid},secure")
        );
        assert_eq!(record.pseudo, None, "clients mount the real path");
        assert_eq!(
            record.to_volume_export("/srv/nfs").path,
            "/srv/nfs/ns/claim"
        );
        let other = super::tests::record(&knfsd);
        assert_ne!(other.fsid, record.fsid, "each export its own");
        // A record from before fsids keeps the kernel's own handles.
        let mut legacy = record.clone();
        legacy.fsid = None;
        assert_eq!(
            options(&legacy, true, VolumeLayout::OwnFilesystem),
            "rw,root_squash,sec=sys,sync,no_subtree_check,secure"
        );
    }
}
