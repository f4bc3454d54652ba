//! The kernel NFS server: each change is made with `exportfs -o OPTIONS CLIENT:PATH` and
//! `exportfs -u CLIENT:PATH` (never `exportfs -ra`, which rereads every export), and the
//! whole set is kept in one file under /etc/exports.d/ that the agent owns, which the
//! NFS server's start at boot reads back.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use nfsprov_api_types::{ExportAccess, ExportClient, ExportManager, ExportRequest, Squash};
use wait_timeout::ChildExt as _;

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
}

impl Knfsd {
    pub fn new(settings: &ExportSettings, export_root: &Path) -> Self {
        Self {
            file: settings.knfsd_exports_file.clone(),
            exportfs: settings.knfsd_exportfs.clone(),
            export_root: export_root.to_owned(),
            secure: !settings.allow_unprivileged_ports,
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
            let options = options(&record.request, self.secure);
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
            options(&record.request, self.secure),
            target(client, &self.path_of(record)),
        ])
    }

    fn unexport(&self, record: &ExportRecord, client: &ExportClient) -> Result<(), ExportError> {
        self.exportfs(&["-u".into(), target(client, &self.path_of(record))])
    }
}

/// The options of every client of an export: what the request says, the rest fixed to
/// safe choices (writes on stable storage before the reply, no subtree checking, which
/// misbehaves on renames), and requests from privileged ports only unless `secure` is
/// lifted by `exports.allow_unprivileged_ports`.
pub fn options(request: &ExportRequest, secure: bool) -> String {
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
    options.extend(["sync", "no_subtree_check"].map(String::from));
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
