//! The kernel NFS server: each change is made with `exportfs -o OPTIONS CLIENT:PATH` and
//! `exportfs -u CLIENT:PATH` (never `exportfs -ra`, which rereads every export), and each
//! exported volume is kept in a file of its own in the directory the NFS server's start
//! at boot reads (`exportfs -a` reads every `*.exports` file of /etc/exports.d/ whose name
//! does not start with a dot), so that a change writes one small file whatever the
//! number of exports.
//!
//! A volume's file is named from the SHA-256 of its path (`nfsprov-` and 32 hex digits,
//! then `.exports`): two volumes never share a file, and no volume path, however long or
//! whatever it holds, names a file elsewhere or one exportfs would skip. Each file holds
//! the volume's record as a comment and its export line.
//!
//! Agents before kept every export in one file (`exports.knfsd_exports_file`). Its
//! records are read once at start: each volume without a file of its own gets one, then
//! the old file is removed, in that order, so that a crash in between leaves both with
//! the same exports, and the per-volume file is the one read.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nfsprov_api_types::{ExportAccess, ExportClient, ExportManager, Squash, VolumePath};
use wait_timeout::ChildExt as _;

use super::settings::VolumeLayout;

use super::files;
use super::record::ExportRecord;
use super::server::{ExportError, NfsServer, Restored, Table};
use super::settings::ExportSettings;

/// Longest one `exportfs` may run before the change fails.
const EXPORTFS_TIMEOUT: Duration = Duration::from_secs(30);

/// How the name of a volume's file begins and ends; between them, [`NAME_HEX_DIGITS`]
/// hex digits of the SHA-256 of the volume path.
const FILE_PREFIX: &str = "nfsprov-";
const FILE_SUFFIX: &str = ".exports";
/// 128 bits of the hash: no two volume paths share a name in practice.
const NAME_HEX_DIGITS: usize = 32;

/// The knfsd export manager.
#[derive(Debug)]
pub struct Knfsd {
    /// Where each exported volume has its file.
    dir: PathBuf,
    /// The one file of every export that agents before kept, read once and removed.
    legacy_file: PathBuf,
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
            dir: settings.knfsd_exports_dir.clone(),
            legacy_file: settings.knfsd_exports_file.clone(),
            exportfs: settings.knfsd_exportfs.clone(),
            export_root: export_root.to_owned(),
            secure: !settings.allow_unprivileged_ports,
            layout,
        }
    }

    /// The name of `volume`'s file in the exports directory.
    pub fn file_name(volume: &VolumePath) -> String {
        let digest = ring::digest::digest(&ring::digest::SHA256, volume.as_str().as_bytes());
        let mut name = String::from(FILE_PREFIX);
        for byte in &digest.as_ref()[..NAME_HEX_DIGITS / 2] {
            let _ = write!(name, "{byte:02x}");
        }
        name.push_str(FILE_SUFFIX);
        name
    }

    /// Whether `name` is that of a volume's file, which the agent owns: any other file of
    /// the directory is the operator's, and left alone.
    pub fn owns_file_name(name: &str) -> bool {
        name.strip_prefix(FILE_PREFIX)
            .and_then(|rest| rest.strip_suffix(FILE_SUFFIX))
            .is_some_and(|hex| {
                hex.len() == NAME_HEX_DIGITS
                    && hex
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            })
    }

    fn file_of(&self, volume: &VolumePath) -> PathBuf {
        self.dir.join(Self::file_name(volume))
    }

    fn path_of(&self, record: &ExportRecord) -> PathBuf {
        self.export_root.join(record.volume.as_str())
    }

    /// The file of one volume: its record, then its line.
    pub fn file_text(&self, record: &ExportRecord) -> String {
        let mut text = String::from(
            "# Written by nfsprov-agent, which replaces this file at each change of this export.\n",
        );
        text.push_str(&record.to_comment());
        if record.request.clients.is_empty() {
            return text;
        }
        let options = options(record, self.secure, self.layout);
        let _ = write!(text, "\"{}\"", self.path_of(record).display());
        for client in &record.request.clients {
            let _ = write!(text, " {}({options})", file_client(client));
        }
        text.push('\n');
        text
    }

    fn write_file(&self, record: &ExportRecord) -> Result<(), ExportError> {
        let file = self.file_of(&record.volume);
        files::replace(&file, self.file_text(record).as_bytes())
            .map_err(ExportError::io(format!("writing {}", file.display())))
    }

    /// Writes `record`'s file unless it holds that already: a start reads every file
    /// rather than writing each again.
    fn write_file_if_changed(&self, record: &ExportRecord) -> Result<(), ExportError> {
        let file = self.file_of(&record.volume);
        match std::fs::read(&file) {
            Ok(found) if found == self.file_text(record).as_bytes() => Ok(()),
            Ok(_) => self.write_file(record),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => self.write_file(record),
            Err(e) => Err(ExportError::io(format!("reading {}", file.display()))(e)),
        }
    }

    fn remove_file(&self, volume: &VolumePath) -> Result<(), ExportError> {
        let file = self.file_of(volume);
        files::remove(&file).map_err(ExportError::io(format!("removing {}", file.display())))
    }

    /// The names of the volumes' files in the directory; none when it is not there.
    fn owned_files(&self) -> Result<Vec<String>, ExportError> {
        let reading = ExportError::io(format!("reading {}", self.dir.display()));
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(reading(e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(ExportError::io(format!("reading {}", self.dir.display())))?;
            if let Some(name) = entry.file_name().to_str()
                && Self::owns_file_name(name)
            {
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    /// The record a volume's file holds: exactly one, of the volume the file is named for.
    fn read_file(&self, name: &str) -> Result<ExportRecord, ExportError> {
        let file = self.dir.join(name);
        let shown = file.display().to_string();
        let text =
            std::fs::read_to_string(&file).map_err(ExportError::io(format!("reading {shown}")))?;
        let mut records =
            ExportRecord::from_comments(&text, &shown).map_err(ExportError::Corrupt)?;
        let count = records.len();
        let (1, Some(record)) = (count, records.pop()) else {
            return Err(ExportError::Corrupt(format!(
                "{shown} holds {count} export records, where a volume's file holds one"
            )));
        };
        let expected = Self::file_name(&record.volume);
        if expected != name {
            return Err(ExportError::Corrupt(format!(
                "{shown} holds the export record of {}, whose file is {expected}",
                record.volume
            )));
        }
        Ok(record)
    }

    /// The records of the one file agents before kept, each given a file of its own
    /// unless it has one (written before a crash cut this short: the same record), then
    /// the old file removed.
    fn migrate(&self, records: &mut BTreeMap<VolumePath, ExportRecord>) -> Result<(), ExportError> {
        let shown = self.legacy_file.display().to_string();
        let text = match std::fs::read_to_string(&self.legacy_file) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(ExportError::io(format!("reading {shown}"))(e)),
        };
        let legacy = ExportRecord::from_comments(&text, &shown).map_err(ExportError::Corrupt)?;
        let mut moved = 0;
        for record in legacy {
            if records.contains_key(&record.volume) {
                continue;
            }
            self.write_file(&record)?;
            records.insert(record.volume.clone(), record);
            moved += 1;
        }
        files::remove(&self.legacy_file).map_err(ExportError::io(format!("removing {shown}")))?;
        tracing::info!(
            file = %shown,
            dir = %self.dir.display(),
            moved,
            "the exports of the single exports file are now each in a file of their own"
        );
        Ok(())
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
        let mut records = BTreeMap::new();
        for name in self.owned_files()? {
            let record = self.read_file(&name)?;
            records.insert(record.volume.clone(), record);
        }
        self.migrate(&mut records)?;
        Ok(records.into_values().collect())
    }

    fn apply(
        &self,
        previous: Option<&ExportRecord>,
        next: &ExportRecord,
        _all: &Table,
    ) -> Result<(), ExportError> {
        // The file first: a crash after it is repaired at start by exporting what it
        // says, and a reboot restores it.
        self.write_file(next)?;
        let Err(error) = self.change_kernel(previous, next) else {
            return Ok(());
        };
        // Refused: the file and the kernel go back to what was served, as far as
        // exportfs lets them.
        let _ = match previous {
            Some(previous) => self.write_file(previous),
            None => self.remove_file(&next.volume),
        };
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

    fn remove(&self, record: &ExportRecord, _all: &Table) -> Result<(), ExportError> {
        // The kernel first, so that nothing is served that no file names.
        for client in &record.request.clients {
            self.unexport(record, client)?;
        }
        self.remove_file(&record.volume)
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

    /// Every file rewritten that differs from its record, and the files of volumes no
    /// record names removed (a run that crashed before it removed one); then every
    /// recorded export exported again.
    fn restore(&self, all: &Table) -> Result<Restored, ExportError> {
        let recorded: BTreeSet<String> = all.keys().map(Self::file_name).collect();
        for name in self.owned_files()? {
            if !recorded.contains(&name) {
                let file = self.dir.join(&name);
                files::remove(&file)
                    .map_err(ExportError::io(format!("removing {}", file.display())))?;
            }
        }
        let mut restored = Restored::default();
        for record in all.values() {
            self.write_file_if_changed(record)?;
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
        let file = knfsd.file_text(&record);
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

    /// A knfsd manager whose exports directory and old single file are in `dir`.
    fn knfsd_in(dir: &Path) -> Knfsd {
        let settings = ExportSettings {
            manager: ExportManager::Knfsd,
            knfsd_exports_dir: dir.join("exports.d"),
            knfsd_exports_file: dir.join("exports.d/nfsprov.exports"),
            ..ExportSettings::default()
        };
        std::fs::create_dir(&settings.knfsd_exports_dir).unwrap();
        Knfsd::new(
            &settings,
            Path::new("/srv/nfs"),
            VolumeLayout::SharedFilesystem,
        )
    }

    fn record_of(volume: &str) -> ExportRecord {
        let request = ExportRequest {
            clients: vec!["10.0.0.2".parse().unwrap()],
            ..ExportRequest::default()
        };
        ExportRecord::new(VolumePath::parse(volume).unwrap(), None, request)
    }

    /// Every entry of `dir`, recursively, by its path relative to `top`.
    fn tree(top: &Path) -> BTreeSet<PathBuf> {
        let mut found = BTreeSet::new();
        let mut pending = vec![top.to_owned()];
        while let Some(dir) = pending.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    pending.push(path.clone());
                }
                found.insert(path.strip_prefix(top).unwrap().to_owned());
            }
        }
        found
    }

    #[test]
    fn no_volume_path_names_a_file_outside_the_exports_directory_or_one_exportfs_skips() {
        let top = tempfile::tempdir().unwrap();
        let knfsd = knfsd_in(top.path());
        let longest = vec!["a".repeat(126); 8].join("/");
        assert_eq!(longest.len(), 1015);
        let volumes = [
            "ns/claim",
            "ns-claim",
            "ns/claim.exports",
            "ns/x/..y",
            "..",
            "ns/../../etc/passwd",
            "a/b/c/d/e/f/g/h",
            "nfsprov-00000000000000000000000000000000.exports",
            longest.as_str(),
        ];
        let mut names = BTreeSet::new();
        for volume in volumes {
            // Paths the validator refuses never reach a record; the rest are written.
            let Ok(path) = VolumePath::parse(volume) else {
                assert!(volume.contains(".."), "{volume}");
                continue;
            };
            let name = Knfsd::file_name(&path);
            assert!(Knfsd::owns_file_name(&name), "{name}");
            assert!(name.len() < 100 && !name.starts_with('.'), "{name}");
            assert!(
                name.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.'),
                "{name}"
            );
            assert!(names.insert(name), "{volume} shares a name");
            knfsd.write_file(&record_of(volume)).unwrap();
        }
        assert_eq!(names.len(), 6);
        let expected: BTreeSet<PathBuf> = std::iter::once(PathBuf::from("exports.d"))
            .chain(names.iter().map(|name| Path::new("exports.d").join(name)))
            .collect();
        assert_eq!(tree(top.path()), expected);
        let loaded = knfsd.load().unwrap();
        assert_eq!(loaded.len(), 6);
        assert!(
            loaded
                .iter()
                .any(|record| record.volume.as_str() == longest)
        );
    }

    #[test]
    fn a_record_naming_a_path_outside_the_export_root_is_refused_and_nothing_written() {
        let top = tempfile::tempdir().unwrap();
        let knfsd = knfsd_in(top.path());
        let hostile =
            r#"# nfsprov-record {"volume":"../../etc/exports","request":{"clients":["10.0.0.2"]}}"#;
        let legacy = format!("{}{hostile}\n", record_of("ns/a").to_comment());
        std::fs::write(&knfsd.legacy_file, &legacy).unwrap();
        let refused = knfsd.load().unwrap_err().to_string();
        assert!(
            refused.contains("nfsprov.exports") && refused.contains("cannot be read"),
            "{refused}"
        );
        assert_eq!(
            tree(top.path()),
            BTreeSet::from(["exports.d".into(), "exports.d/nfsprov.exports".into()]),
            "the old file kept as it was, no file written"
        );
        assert_eq!(std::fs::read_to_string(&knfsd.legacy_file).unwrap(), legacy);

        // A volume's file holding another volume's record (copied by hand) is refused
        // too: a change of that volume would write a second file for it.
        std::fs::remove_file(&knfsd.legacy_file).unwrap();
        let a = record_of("ns/a");
        std::fs::write(
            knfsd.file_of(&VolumePath::parse("ns/b").unwrap()),
            knfsd.file_text(&a),
        )
        .unwrap();
        let refused = knfsd.load().unwrap_err().to_string();
        assert!(
            refused.contains("holds the export record of ns/a"),
            "{refused}"
        );
    }
}
