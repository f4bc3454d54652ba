//! nfs-ganesha: one EXPORT block per volume, in a file of its own in a directory the
//! agent owns, applied through ganesha's D-Bus export manager. `exports.conf` in that
//! directory `%include`s one list per bucket of 256 export ids (`include-K.conf`), and
//! each list `%include`s the blocks of its ids, so ganesha restarted serves them all
//! again while a change rewrites one list of at most 256 lines, whatever the number of
//! exports.
//!
//! Changes that arrive together are taken together: their files are written and synced
//! once for the group, and ganesha is asked once for all of them, with a batch file that
//! `%include`s their blocks and the expression that picks every block in it (each of
//! `AddExport` and `UpdateExport` loads every block its expression picks). A batch
//! ganesha refuses is taken again one export at a time, so each refusal is its own.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};

use nfsprov_api_types::{ExportAccess, ExportClient, ExportManager, Squash, VolumePath};

use super::files;
use super::record::ExportRecord;
use super::server::{ExportError, NfsServer, Restored, Table};
use super::settings::ExportSettings;
use super::subvolume_mount::SubvolumeMounts;

const DESTINATION: &str = "org.ganesha.nfsd";
const OBJECT: &str = "/org/ganesha/nfsd/ExportMgr";
const INTERFACE: &str = "org.ganesha.nfsd.exportmgr";
/// The pause before connecting again to a bus that went away, to watch ganesha's restarts.
const RECONNECT_PAUSE: Duration = Duration::from_secs(5);
/// The file ganesha.conf includes.
pub(super) const INCLUDE_FILE: &str = "exports.conf";
/// How many export ids one include list covers: the longest list a change rewrites.
const BUCKET: u16 = 256;
/// The most exports named in one batched call to ganesha: its configuration parser
/// compares each token with every distinct token of the file before it (quadratic in
/// the exports of one parse, in ganesha 4), so batches stay small.
const BATCH: usize = 256;
/// Where the blocks of one batched call are named; removed after the call.
const BATCH_FILE: &str = ".batch";
/// The expression that picks every EXPORT block of a batch file.
const EVERY_EXPORT: &str = "EXPORT(Export_Id=*)";

/// One export as ganesha's `ShowExports` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShownExport {
    pub id: u16,
    pub path: String,
}

/// ganesha's answer to ShowExports: a timestamp, then per export its id, path, the
/// protocols it served so far and the time of its last use.
type Served = (String, bool);
type ShowExportsReply = (
    (u64, u64),
    Vec<(
        u16,
        String,
        (
            Served,
            Served,
            Served,
            Served,
            Served,
            Served,
            Served,
            Served,
        ),
        (u64, u64),
    )>,
);

/// A D-Bus connection to ganesha's export manager.
#[derive(Debug)]
pub struct GaneshaExport {
    address: Option<String>,
    /// Longest wait for the bus to accept a connection and for each answer.
    timeout: Duration,
    /// The connection, swapped whole: no lock is held while a call waits for ganesha.
    connection: ArcSwapOption<zbus::blocking::Connection>,
}

impl GaneshaExport {
    /// The export manager on the bus at `address` (the system bus when `None`); the
    /// connection is made at the first call and made again after a failed one, and no
    /// call or connection waits longer than `timeout`.
    pub fn new(address: Option<String>, timeout: Duration) -> Self {
        Self {
            address,
            timeout,
            connection: ArcSwapOption::empty(),
        }
    }

    fn connect(&self) -> Result<zbus::blocking::Connection, ExportError> {
        connect(self.address.clone(), self.timeout)
    }

    /// Calls `restarted` each time ganesha takes its name on the bus (a start or a
    /// restart), on a thread of its own, until `restarted` answers `false`. The bus is
    /// connected to again after it went away (which ganesha's restart with its bus may
    /// mean), and `restarted` called then too.
    pub fn watch_restarts(&self, restarted: Box<dyn Fn() -> bool + Send>) {
        let (address, timeout) = (self.address.clone(), self.timeout);
        let watch = move || {
            loop {
                if let Ok(connection) = connect(address.clone(), timeout) {
                    let signals =
                        zbus::blocking::fdo::DBusProxy::new(&connection).and_then(|bus| {
                            bus.receive_name_owner_changed_with_args(&[(0, DESTINATION)])
                        });
                    if let Ok(signals) = signals {
                        for signal in signals {
                            let owned = signal
                                .args()
                                .is_ok_and(|args| args.new_owner().as_ref().is_some());
                            if owned && !restarted() {
                                return;
                            }
                        }
                    }
                }
                // The bus is away: ganesha may come back with it.
                std::thread::sleep(RECONNECT_PAUSE);
                if !restarted() {
                    return;
                }
            }
        };
        if let Err(error) = std::thread::Builder::new()
            .name("ganesha-restarts".into())
            .spawn(watch)
        {
            tracing::warn!(%error, "cannot watch ganesha's restarts; the periodic pass finds them");
        }
    }

    fn call<B, R>(&self, method: &str, body: &B) -> Result<R, ExportError>
    where
        B: serde::Serialize + zbus::zvariant::DynamicType,
        R: for<'d> zbus::zvariant::DynamicDeserialize<'d>,
    {
        let connection = match self.connection.load_full() {
            Some(connection) => connection,
            None => {
                let connection = Arc::new(self.connect()?);
                self.connection.store(Some(connection.clone()));
                connection
            }
        };
        let reply =
            connection.call_method(Some(DESTINATION), OBJECT, Some(INTERFACE), method, body);
        let reply = match reply {
            Ok(reply) => reply,
            Err(error) => {
                let unanswered = unanswered(&error);
                // A broken bus connection is made again by the next call; an error
                // ganesha answered leaves it as it is.
                if !matches!(error, zbus::Error::MethodError(..)) {
                    self.connection.store(None);
                }
                let message = format!("{method}: {error}");
                return Err(if unanswered {
                    ExportError::Unavailable(message)
                } else {
                    ExportError::Server(message)
                });
            }
        };
        reply
            .body()
            .deserialize::<R>()
            .map_err(|e| ExportError::Server(format!("{method}: unexpected answer: {e}")))
    }

    pub fn add(&self, file: &Path, id: u16) -> Result<(), ExportError> {
        let _: String = self.call("AddExport", &(file_text(file), block_selector(id)))?;
        Ok(())
    }

    pub fn update(&self, file: &Path, id: u16) -> Result<(), ExportError> {
        let _: String = self.call("UpdateExport", &(file_text(file), block_selector(id)))?;
        Ok(())
    }

    /// Adds every export whose block `file` holds or includes, in one call.
    pub fn add_every(&self, file: &Path) -> Result<(), ExportError> {
        let _: String = self.call("AddExport", &(file_text(file), EVERY_EXPORT))?;
        Ok(())
    }

    /// Updates every export whose block `file` holds or includes, in one call.
    pub fn update_every(&self, file: &Path) -> Result<(), ExportError> {
        let _: String = self.call("UpdateExport", &(file_text(file), EVERY_EXPORT))?;
        Ok(())
    }

    pub fn remove(&self, id: u16) -> Result<(), ExportError> {
        self.call::<_, ()>("RemoveExport", &(id,))
    }

    pub fn show(&self) -> Result<Vec<ShownExport>, ExportError> {
        let (_, exports): ShowExportsReply = self.call("ShowExports", &())?;
        Ok(exports
            .into_iter()
            .map(|(id, path, _, _)| ShownExport { id, path })
            .collect())
    }
}

/// A new connection to the bus at `address` (the system bus when `None`) within
/// `timeout`. zbus has no limit on the handshake, and a stopped bus accepts the socket
/// and never answers: the connection is made on a thread of its own, left to end (or to
/// be dropped) when the bus answers at last.
fn connect(
    address: Option<String>,
    timeout: Duration,
) -> Result<zbus::blocking::Connection, ExportError> {
    let (made, connection) = std::sync::mpsc::sync_channel(1);
    let build = move || -> zbus::Result<zbus::blocking::Connection> {
        let builder = match &address {
            Some(address) => zbus::blocking::connection::Builder::address(address.as_str())?,
            None => zbus::blocking::connection::Builder::system()?,
        };
        // A ganesha that hangs fails the request instead of holding the volume's
        // lock and the export changes for good.
        builder.method_timeout(timeout).build()
    };
    std::thread::Builder::new()
        .name("ganesha-bus-connect".into())
        .spawn(move || {
            let _ = made.send(build());
        })
        .map_err(|e| {
            ExportError::Unavailable(format!("cannot start connecting to ganesha's D-Bus: {e}"))
        })?;
    match connection.recv_timeout(timeout) {
        Ok(Ok(connection)) => Ok(connection),
        Ok(Err(e)) => Err(ExportError::Unavailable(format!(
            "cannot reach ganesha's D-Bus: {e}"
        ))),
        Err(_) => Err(ExportError::Unavailable(format!(
            "ganesha's D-Bus did not accept a connection within {}s",
            timeout.as_secs()
        ))),
    }
}

/// Whether `error` says nobody answered (no ganesha on the bus, no reply in time, no
/// bus) rather than that ganesha refused.
fn unanswered(error: &zbus::Error) -> bool {
    const NOBODY: &[&str] = &[
        "org.freedesktop.DBus.Error.ServiceUnknown",
        "org.freedesktop.DBus.Error.NameHasNoOwner",
        "org.freedesktop.DBus.Error.NoReply",
        "org.freedesktop.DBus.Error.Timeout",
        "org.freedesktop.DBus.Error.TimedOut",
        "org.freedesktop.DBus.Error.Disconnected",
        "org.freedesktop.DBus.Error.NoServer",
        "org.freedesktop.DBus.Error.NoNetwork",
    ];
    match error {
        zbus::Error::MethodError(name, _, _) => NOBODY.contains(&name.as_str()),
        _ => true,
    }
}

fn file_text(file: &Path) -> String {
    file.to_string_lossy().into_owned()
}

/// The expression that picks the export's block out of its file.
fn block_selector(id: u16) -> String {
    format!("EXPORT(Export_Id={id})")
}

/// The ganesha export manager.
#[derive(Debug)]
pub struct Ganesha {
    dir: PathBuf,
    export_root: PathBuf,
    mount_root: String,
    ids: std::ops::RangeInclusive<u16>,
    bus: GaneshaExport,
    /// On btrfs: each subvolume volume mounted by itself, which ganesha needs to export it.
    mounts: Option<SubvolumeMounts>,
    /// `PrivilegedPort` of every block: requests from reserved source ports only.
    privileged_port: bool,
    /// Whether the top include list names the buckets' lists, for ganesha's own start
    /// (`exports.ganesha_reads_exports_at_start`).
    reads_at_start: bool,
    /// The ids the include lists name, as last written: a list is rewritten from its
    /// bucket's range of this set. Changed only under the export table's change lock.
    listed: ArcSwap<imbl::OrdSet<u16>>,
}

impl Ganesha {
    pub fn new(
        settings: &ExportSettings,
        export_root: &Path,
        mount_root: &str,
    ) -> Result<Self, ExportError> {
        // Both are written inside double quotes in ganesha's configuration.
        let export_root_text = export_root.to_string_lossy();
        for (what, text) in [
            ("export_root", &*export_root_text),
            ("nfs.path", mount_root),
        ] {
            if text.contains(['"', '\n', '\r']) {
                return Err(ExportError::Corrupt(format!(
                    "{what} {text:?} holds a quote or a line break, which ganesha's configuration cannot hold"
                )));
            }
        }
        let dir = settings.ganesha_config_dir.clone();
        std::fs::create_dir_all(&dir).map_err(ExportError::io(format!(
            "exports.ganesha_config_dir {}",
            dir.display()
        )))?;
        Ok(Self {
            dir,
            export_root: export_root.to_owned(),
            mount_root: mount_root.trim_end_matches('/').to_owned(),
            ids: settings.ganesha_export_ids.clone(),
            bus: GaneshaExport::new(
                settings.ganesha_dbus_address.clone(),
                settings.server_timeout,
            ),
            mounts: SubvolumeMounts::probe(export_root)?,
            privileged_port: !settings.allow_unprivileged_ports,
            reads_at_start: settings.ganesha_reads_exports_at_start,
            listed: ArcSwap::from_pointee(imbl::OrdSet::new()),
        })
    }

    fn file(&self, id: u16) -> PathBuf {
        self.dir.join(format!("export-{id}.conf"))
    }

    fn id_of(record: &ExportRecord) -> Result<u16, ExportError> {
        record.id.ok_or_else(|| {
            ExportError::Corrupt(format!("the export of {} has no export id", record.volume))
        })
    }

    /// The EXPORT block of `record`, after its record comment.
    pub fn block(&self, record: &ExportRecord, id: u16) -> String {
        let request = &record.request;
        let path = self.export_root.join(record.volume.as_str());
        let mut text = record.to_comment();
        let _ = writeln!(text, "EXPORT {{");
        let _ = writeln!(text, "  Export_Id = {id};");
        let _ = writeln!(text, "  Path = \"{}\";", path.display());
        // Where clients find it in the pseudo-filesystem, which every client can
        // browse: an opaque name, unless the export predates them (see the record).
        let _ = writeln!(
            text,
            "  Pseudo = \"{}\";",
            record.mount_path(&self.mount_root)
        );
        let _ = writeln!(text, "  Protocols = 4;");
        let _ = writeln!(text, "  Transports = TCP;");
        // A reserved source port needs root on the client: a process of a pod that
        // shares its node's address cannot forge NFS requests of its own.
        let _ = writeln!(text, "  PrivilegedPort = {};", self.privileged_port);
        // Nobody but the clients listed below.
        let _ = writeln!(text, "  Access_Type = None;");
        let squash = match request.squash {
            Squash::None => "No_Root_Squash",
            Squash::All => "All_Squash",
            // Validation refuses an unknown value before it gets here; squashing is
            // the safe reading of one anyway.
            Squash::Root | Squash::Unknown => "Root_Squash",
        };
        let _ = writeln!(text, "  Squash = {squash};");
        if let Some(uid) = request.anon_uid {
            let _ = writeln!(text, "  Anonymous_Uid = {uid};");
        }
        if let Some(gid) = request.anon_gid {
            let _ = writeln!(text, "  Anonymous_Gid = {gid};");
        }
        let sec: Vec<&str> = request.sec.iter().map(|flavor| flavor.as_str()).collect();
        let _ = writeln!(text, "  SecType = {};", sec.join(", "));
        let _ = writeln!(text, "  FSAL {{ Name = VFS; }}");
        if !request.clients.is_empty() {
            let access = match request.access {
                ExportAccess::ReadWrite => "RW",
                ExportAccess::ReadOnly | ExportAccess::Unknown => "RO",
            };
            let clients: Vec<String> = request.clients.iter().map(client_text).collect();
            let _ = writeln!(text, "  CLIENT {{");
            let _ = writeln!(text, "    Clients = {};", clients.join(", "));
            let _ = writeln!(text, "    Access_Type = {access};");
            let _ = writeln!(text, "  }}");
        }
        let _ = writeln!(text, "}}");
        text
    }

    fn bucket_file(&self, bucket: u16) -> PathBuf {
        self.dir.join(format!("include-{bucket}.conf"))
    }

    /// The buckets the agent's id range spans.
    fn buckets(&self) -> std::ops::RangeInclusive<u16> {
        self.ids.start() / BUCKET..=self.ids.end() / BUCKET
    }

    /// The include list of `bucket` as `listed` has it; `None` when it names nobody.
    fn bucket_text(&self, bucket: u16, listed: &imbl::OrdSet<u16>) -> Option<String> {
        let first = bucket.saturating_mul(BUCKET);
        let last = first.saturating_add(BUCKET - 1);
        let mut ids = listed.range(first..=last).peekable();
        ids.peek()?;
        let mut text =
            String::from("# Written by nfsprov-agent: the exports of one bucket of ids.\n");
        for id in ids {
            let _ = writeln!(text, "%include \"{}\"", self.file(*id).display());
        }
        Some(text)
    }

    /// The top include list: every bucket that names an export (none when ganesha's
    /// start is not to read them).
    fn top_text(&self, listed: &imbl::OrdSet<u16>) -> String {
        if !self.reads_at_start {
            return String::from(
                "# Written by nfsprov-agent, which serves its exports itself once ganesha is on\n\
                 # the bus (exports.ganesha_reads_exports_at_start = false).\n",
            );
        }
        let mut text =
            String::from("# Written by nfsprov-agent: one list per bucket of export ids.\n");
        for bucket in self.buckets() {
            let first = bucket.saturating_mul(BUCKET);
            let last = first.saturating_add(BUCKET - 1);
            if listed.range(first..=last).next().is_some() {
                let _ = writeln!(text, "%include \"{}\"", self.bucket_file(bucket).display());
            }
        }
        text
    }

    /// Rewrites, in `group`, the lists of the buckets of `changed` ids for `listed`, and
    /// the top list when a bucket began or ceased to name exports; `listed` becomes what
    /// the lists name.
    fn write_lists(
        &self,
        group: &mut files::Group<'_>,
        changed: impl IntoIterator<Item = u16>,
        listed: imbl::OrdSet<u16>,
    ) -> Result<(), ExportError> {
        let before = self.listed.load_full();
        let buckets: BTreeSet<u16> = changed.into_iter().map(|id| id / BUCKET).collect();
        let mut top_changed = false;
        for bucket in buckets {
            let file = self.bucket_file(bucket);
            let what = || format!("writing {}", file.display());
            let was_named = self.bucket_text(bucket, &before).is_some();
            let text = self.bucket_text(bucket, &listed);
            top_changed |= was_named != text.is_some();
            match text {
                Some(text) => group
                    .replace(&file, text.as_bytes())
                    .map_err(ExportError::io(what()))?,
                None => group.remove(&file).map_err(ExportError::io(what()))?,
            }
        }
        if top_changed {
            let path = self.dir.join(INCLUDE_FILE);
            group
                .replace(&path, self.top_text(&listed).as_bytes())
                .map_err(ExportError::io(format!("writing {}", path.display())))?;
        }
        self.listed.store(Arc::new(listed));
        Ok(())
    }

    /// Writes every include list `all` calls for that differs from the one on disk (at
    /// start and in each pass: a list changed by hand, or the single list of an earlier
    /// layout, is set right), and removes the lists of buckets that name nobody.
    fn write_includes(&self, all: &Table) -> Result<(), ExportError> {
        let listed: imbl::OrdSet<u16> = all.values().filter_map(|record| record.id).collect();
        let mut group = files::Group::new(&self.dir);
        let io = |path: &Path| ExportError::io(format!("writing {}", path.display()));
        for bucket in self.buckets() {
            let file = self.bucket_file(bucket);
            let on_disk = read_if_there(&file).map_err(io(&file))?;
            match self.bucket_text(bucket, &listed) {
                Some(text) if on_disk.as_deref() != Some(text.as_str()) => {
                    group.replace(&file, text.as_bytes()).map_err(io(&file))?
                }
                None if on_disk.is_some() => group.remove(&file).map_err(io(&file))?,
                _ => {}
            }
        }
        let top = self.dir.join(INCLUDE_FILE);
        let text = self.top_text(&listed);
        if read_if_there(&top).map_err(io(&top))?.as_deref() != Some(text.as_str()) {
            group.replace(&top, text.as_bytes()).map_err(io(&top))?;
        }
        group.sync().map_err(io(&self.dir))?;
        self.listed.store(Arc::new(listed));
        Ok(())
    }

    /// Asks ganesha to serve the exports of `ids` from their files: in batches, and one at
    /// a time for a batch it refuses. One result per id, in order.
    fn add_many(&self, ids: &[u16]) -> Vec<Result<(), ExportError>> {
        self.many(
            ids,
            |ids| {
                let files: Vec<PathBuf> = ids.iter().map(|id| self.file(*id)).collect();
                self.batch(&files, |batch| self.bus.add_every(batch))
            },
            |id| self.bus.add(&self.file(id), id),
            true,
        )
    }

    /// Asks ganesha to serve each export of `staged` (its staged file and id) as that
    /// file says: in batches, and one at a time for a batch it refuses.
    fn update_many(&self, staged: &[(PathBuf, u16)]) -> Vec<Result<(), ExportError>> {
        let ids: Vec<u16> = staged.iter().map(|(_, id)| *id).collect();
        let by_id: BTreeMap<u16, &PathBuf> = staged.iter().map(|(file, id)| (*id, file)).collect();
        let file_of = |id: u16| {
            by_id
                .get(&id)
                .map_or_else(|| self.file(id), |file| (*file).clone())
        };
        self.many(
            &ids,
            |ids| {
                let files: Vec<PathBuf> = ids.iter().map(|id| file_of(*id)).collect();
                self.batch(&files, |batch| self.bus.update_every(batch))
            },
            |id| self.bus.update(&file_of(id), id),
            false,
        )
    }

    /// `ids` in batches of [`BATCH`] through `batched`; a batch ganesha refused is taken
    /// again one id at a time through `single` (after an add, skipping the ids the
    /// refused batch added before its refusal); a server that does not answer fails the
    /// rest unasked.
    fn many(
        &self,
        ids: &[u16],
        batched: impl Fn(&[u16]) -> Result<(), ExportError>,
        single: impl Fn(u16) -> Result<(), ExportError>,
        adding: bool,
    ) -> Vec<Result<(), ExportError>> {
        let mut results = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(BATCH) {
            if let Some(Err(ExportError::Unavailable(why))) = results.last() {
                let why = why.clone();
                results.extend(
                    chunk
                        .iter()
                        .map(|_| Err(ExportError::Unavailable(why.clone()))),
                );
                continue;
            }
            let outcome = match chunk {
                [id] => single(*id),
                _ => batched(chunk),
            };
            match outcome {
                Ok(()) => results.extend(chunk.iter().map(|_| Ok(()))),
                Err(ExportError::Unavailable(why)) => results.extend(
                    chunk
                        .iter()
                        .map(|_| Err(ExportError::Unavailable(why.clone()))),
                ),
                Err(refused) if chunk.len() == 1 => results.push(Err(refused)),
                Err(refused) => {
                    tracing::debug!(%refused, exports = chunk.len(), "ganesha refused a batch; taking its exports one at a time");
                    let served: BTreeSet<u16> = if adding {
                        match self.bus.show() {
                            Ok(shown) => shown.iter().map(|shown| shown.id).collect(),
                            Err(error) => {
                                let why = error.to_string();
                                results.extend(
                                    chunk
                                        .iter()
                                        .map(|_| Err(ExportError::Unavailable(why.clone()))),
                                );
                                continue;
                            }
                        }
                    } else {
                        BTreeSet::new()
                    };
                    let mut unanswered: Option<String> = None;
                    for &id in chunk {
                        let result = match &unanswered {
                            _ if served.contains(&id) => Ok(()),
                            // A server that stopped answering is not asked again for
                            // each export: each would wait out its time limit.
                            Some(why) => Err(ExportError::Unavailable(why.clone())),
                            None => single(id),
                        };
                        if let Err(ExportError::Unavailable(why)) = &result {
                            unanswered = Some(why.clone());
                        }
                        results.push(result);
                    }
                }
            }
        }
        results
    }

    /// Calls `call` with a batch file that `%include`s `files`, removed after.
    fn batch(
        &self,
        files: &[PathBuf],
        call: impl FnOnce(&Path) -> Result<(), ExportError>,
    ) -> Result<(), ExportError> {
        let mut text = String::from("# A batch of exports for one call to ganesha.\n");
        for file in files {
            let _ = writeln!(text, "%include \"{}\"", file.display());
        }
        let path = self.dir.join(BATCH_FILE);
        std::fs::write(&path, text)
            .map_err(ExportError::io(format!("writing {}", path.display())))?;
        let result = call(&path);
        let _ = std::fs::remove_file(&path);
        result
    }

    fn ours(&self, id: u16) -> bool {
        self.ids.contains(&id)
    }

    /// Whether a mount was made (`false` when none is needed or it is there already).
    fn mount(&self, record: &ExportRecord) -> Result<bool, ExportError> {
        match &self.mounts {
            Some(mounts) => mounts.mount(&record.volume),
            None => Ok(false),
        }
    }

    /// Asks ganesha to stop serving export `id`, which it may no longer serve.
    fn withdraw(&self, id: u16) -> Result<(), ExportError> {
        match self.bus.remove(id) {
            Ok(()) => Ok(()),
            Err(error @ ExportError::Unavailable(_)) => Err(error),
            // Refused because ganesha does not serve it (restarted without it, say)
            // is what was wanted; listing the exports tells that from a real failure
            // without paying for the list on every removal.
            Err(error) => {
                if self.bus.show()?.iter().any(|shown| shown.id == id) {
                    return Err(error);
                }
                Ok(())
            }
        }
    }

    /// Takes back the file and mount of an add that failed.
    fn undo_add(&self, group: &mut files::Group<'_>, record: &ExportRecord, id: u16) {
        let _ = self.unmount(record);
        let _ = group.remove(&self.file(id));
    }

    fn unmount(&self, record: &ExportRecord) -> Result<(), ExportError> {
        match &self.mounts {
            Some(mounts) => mounts.unmount(&record.volume),
            None => Ok(()),
        }
    }
}

/// The contents of `path`, or `None` when there is no such file.
fn read_if_there(path: &Path) -> std::io::Result<Option<String>> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

fn client_text(client: &ExportClient) -> String {
    // Bare: ganesha's parser reads addresses, networks and `*` as tokens of their own
    // and refuses a quoted string where it expects a client.
    client.to_string()
}

impl NfsServer for Ganesha {
    fn kind(&self) -> ExportManager {
        ExportManager::Ganesha
    }

    fn needs_id(&self) -> bool {
        true
    }

    fn serves_opaque_paths(&self) -> bool {
        true
    }

    fn load(&self) -> Result<Vec<ExportRecord>, ExportError> {
        let entries = std::fs::read_dir(&self.dir)
            .map_err(ExportError::io(format!("reading {}", self.dir.display())))?;
        let mut records = Vec::new();
        for entry in entries {
            let entry =
                entry.map_err(ExportError::io(format!("reading {}", self.dir.display())))?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            let Some(id) = name
                .strip_prefix("export-")
                .and_then(|rest| rest.strip_suffix(".conf"))
                .and_then(|id| id.parse::<u16>().ok())
            else {
                continue;
            };
            let path = entry.path();
            let text = std::fs::read_to_string(&path)
                .map_err(ExportError::io(format!("reading {}", path.display())))?;
            let found = ExportRecord::from_comments(&text, &path.display().to_string())
                .map_err(ExportError::Corrupt)?;
            match found.as_slice() {
                [record] if record.id == Some(id) => records.push(record.clone()),
                _ => {
                    return Err(ExportError::Corrupt(format!(
                        "{} does not hold exactly one export record with id {id}",
                        path.display()
                    )));
                }
            }
        }
        Ok(records)
    }

    fn apply(
        &self,
        previous: Option<&ExportRecord>,
        next: &ExportRecord,
        all: &Table,
    ) -> Result<(), ExportError> {
        self.apply_all(&[(previous, next)], all)
            .pop()
            .unwrap_or_else(|| Err(ExportError::Corrupt("no result for a change".into())))
    }

    fn apply_all(
        &self,
        changes: &[super::server::Change<'_>],
        _all: &Table,
    ) -> Vec<Result<(), ExportError>> {
        let mut results: Vec<Option<Result<(), ExportError>>> =
            changes.iter().map(|_| None).collect();
        let mut group = files::Group::new(&self.dir);
        let mut adds = Vec::new();
        let mut updates = Vec::new();
        for (at, (previous, next)) in changes.iter().enumerate() {
            let id = match Self::id_of(next) {
                Ok(id) => id,
                Err(error) => {
                    results[at] = Some(Err(error));
                    continue;
                }
            };
            let file = self.file(id);
            let text = self.block(next, id);
            let what = || format!("writing {}", file.display());
            if previous.is_none() {
                // Recorded first: a crash before ganesha heard of it is repaired at
                // start by adding what the record says. Mounted after the record is
                // written and before ganesha is asked: a crash in between leaves a
                // record the start-up mounts and exports.
                let made = group
                    .replace(&file, text.as_bytes())
                    .map_err(ExportError::io(what()))
                    .and_then(|()| self.mount(next))
                    .map(|_| super::fault::crash_if_asked(super::fault::FaultPoint::AfterMount));
                match made {
                    Ok(()) => adds.push((at, id)),
                    Err(error) => {
                        self.undo_add(&mut group, next, id);
                        results[at] = Some(Err(error));
                    }
                }
            } else {
                // ganesha reads the new block from beside the record, which stays the
                // old one until ganesha has it: a leftover staged file at start means
                // ganesha may serve either, and it is set back to the record.
                match group.stage(&file, text.as_bytes()) {
                    Ok(staged) => updates.push((at, id, staged)),
                    Err(error) => results[at] = Some(Err(ExportError::io(what())(error))),
                }
            }
        }

        let add_ids: Vec<u16> = adds.iter().map(|(_, id)| *id).collect();
        let mut listed = imbl::OrdSet::clone(&self.listed.load());
        let mut added = Vec::new();
        for ((at, id), result) in adds.iter().zip(self.add_many(&add_ids)) {
            if result.is_ok() {
                listed.insert(*id);
                added.push(*id);
            } else if let Some((_, next)) = changes.get(*at) {
                self.undo_add(&mut group, next, *id);
            }
            results[*at] = Some(result);
        }

        let staged: Vec<(PathBuf, u16)> = updates
            .iter()
            .map(|(_, id, staged)| (staged.clone(), *id))
            .collect();
        for ((at, id, staged), result) in updates.iter().zip(self.update_many(&staged)) {
            let file = self.file(*id);
            let result = result.and_then(|()| {
                group
                    .commit(staged, &file)
                    .map_err(ExportError::io(format!("writing {}", file.display())))
            });
            if result.is_err() {
                let _ = group.remove(staged);
            }
            results[*at] = Some(result);
        }

        // The include lists name the new exports, so a restart of ganesha serves them.
        let durable = self.write_lists(&mut group, added, listed).and_then(|()| {
            group
                .sync()
                .map_err(ExportError::io(format!("syncing {}", self.dir.display())))
        });
        results
            .into_iter()
            .map(|result| {
                let result = result.unwrap_or_else(|| {
                    Err(ExportError::Corrupt("a change was left unanswered".into()))
                });
                match (&durable, result) {
                    (Err(error), Ok(())) => Err(ExportError::Corrupt(format!(
                        "served, but not made durable: {error}"
                    ))),
                    (_, result) => result,
                }
            })
            .collect()
    }

    fn remove(&self, record: &ExportRecord, _all: &Table) -> Result<(), ExportError> {
        let id = Self::id_of(record)?;
        self.withdraw(id)?;
        // Unmounted before the record goes: a crash in between leaves a record, and the
        // start-up mounts and exports the volume again (or removes both if it is gone).
        self.unmount(record)?;
        let file = self.file(id);
        let mut group = files::Group::new(&self.dir);
        group
            .remove(&file)
            .map_err(ExportError::io(format!("removing {}", file.display())))?;
        if let Ok(staged) = files::staged_name(&file) {
            let _ = group.remove(&staged);
        }
        let mut listed = imbl::OrdSet::clone(&self.listed.load());
        listed.remove(&id);
        self.write_lists(&mut group, [id], listed)?;
        group
            .sync()
            .map_err(ExportError::io(format!("syncing {}", self.dir.display())))
    }

    /// Only ganesha's export goes: the file, the include list and a btrfs volume's
    /// own mount stay, so a restart serves it again.
    fn suspend(&self, record: &ExportRecord) -> Result<(), ExportError> {
        self.withdraw(Self::id_of(record)?)
    }

    fn resume(&self, record: &ExportRecord) -> Result<(), ExportError> {
        let id = Self::id_of(record)?;
        self.bus.add(&self.file(id), id)
    }

    fn compares_cheaply(&self) -> bool {
        // One ShowExports lists everything ganesha serves.
        true
    }

    fn watch_restarts(&self, restarted: Box<dyn Fn() -> bool + Send>) {
        self.bus.watch_restarts(restarted);
    }

    fn restore(&self, all: &Table) -> Result<Restored, ExportError> {
        self.write_includes(all)?;
        let served: BTreeSet<u16> = self.bus.show()?.iter().map(|shown| shown.id).collect();
        let by_volume: BTreeMap<u16, &VolumePath> = all
            .values()
            .filter_map(|record| record.id.map(|id| (id, &record.volume)))
            .collect();
        let by_id: BTreeSet<u16> = by_volume.keys().copied().collect();
        let mut restored = Restored::default();
        for &id in served.iter().filter(|id| self.ours(**id)) {
            if !by_id.contains(&id) {
                // In the agent's range but recorded nowhere: a change that crashed
                // after ganesha took it and before its record was written.
                self.bus.remove(id)?;
                restored.removed += 1;
            }
        }
        // After a reboot (or a crash between mount and export) a record's mount may be
        // missing: made before ganesha is asked to serve it.
        let mut remounted = BTreeSet::new();
        if let Some(mounts) = &self.mounts {
            for volume in mounts.mount_all(all.keys())? {
                remounted.extend(all.get(volume).and_then(|record| record.id));
            }
        }
        let mut missing = Vec::new();
        for &id in &by_id {
            let file = self.file(id);
            let staged = files::staged_name(&file)
                .map_err(ExportError::io(format!("naming beside {}", file.display())))?;
            let interrupted = staged.exists();
            if !served.contains(&id) {
                missing.push(id);
            } else if interrupted || remounted.contains(&id) {
                // A served export whose mount was missing serves the parent's view of the
                // path; updated, ganesha resolves it to the new mount.
                self.bus.update(&file, id)?;
                restored.repaired += 1;
            } else {
                restored.kept += 1;
            }
            if interrupted {
                files::remove(&staged)
                    .map_err(ExportError::io(format!("removing {}", staged.display())))?;
            }
        }
        // What ganesha lacks (all of it after its restart) is added in batches.
        for (id, result) in missing.iter().zip(self.add_many(&missing)) {
            let volume = by_volume.get(id).map(|volume| (*volume).clone());
            match result {
                Ok(()) => {
                    restored.added += 1;
                    restored.re_added.extend(volume);
                }
                // The bus or ganesha itself is away: the pass fails and is retried.
                Err(error @ ExportError::Unavailable(_)) => return Err(error),
                // Refused for this export alone (its directory gone, say): the others
                // are still served again, and this one is reported unserved.
                Err(error) => {
                    tracing::warn!(export_id = id, volume = ?volume, %error, "ganesha refused to serve a recorded export again");
                    restored.unserved.extend(volume);
                }
            }
        }
        Ok(restored)
    }
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::{ExportRequest, SecFlavor, VolumePath};

    use super::*;

    fn ganesha(dir: &Path) -> Ganesha {
        let settings = ExportSettings {
            manager: ExportManager::Ganesha,
            ganesha_config_dir: dir.join("ganesha.d"),
            ..ExportSettings::default()
        };
        Ganesha::new(&settings, Path::new("/srv/nfs"), "/exports/").unwrap()
    }

    #[test]
    fn a_block_admits_only_the_listed_clients_with_the_requested_options() {
        let dir = tempfile::tempdir().unwrap();
        let ganesha = ganesha(dir.path());
        let record = ExportRecord::new(
            VolumePath::parse("ns/claim").unwrap(),
            Some(1234),
            ExportRequest {
                clients: vec!["10.0.0.0/8".parse().unwrap(), "127.0.0.2".parse().unwrap()],
                access: ExportAccess::ReadOnly,
                squash: Squash::All,
                anon_uid: Some(2000),
                anon_gid: Some(3000),
                sec: vec![SecFlavor::Krb5p, SecFlavor::Sys],
                opaque_path: false,
            },
        );
        let block = ganesha.block(&record, 1234);
        for line in [
            "  Export_Id = 1234;",
            "  Path = \"/srv/nfs/ns/claim\";",
            "  Pseudo = \"/exports/ns/claim\";",
            "  Access_Type = None;",
            "  PrivilegedPort = true;",
            "  Squash = All_Squash;",
            "  Anonymous_Uid = 2000;",
            "  Anonymous_Gid = 3000;",
            "  SecType = krb5p, sys;",
            "    Clients = 127.0.0.2, 10.0.0.0/8;",
            "    Access_Type = RO;",
        ] {
            assert!(
                block.lines().any(|l| l == line),
                "{line:?} missing:\n{block}"
            );
        }
        let read_back = ExportRecord::from_comments(&block, "test").unwrap();
        assert_eq!(read_back, vec![record]);
    }

    #[test]
    fn an_opaque_export_is_found_in_the_pseudo_filesystem_by_a_name_that_tells_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ganesha = ganesha(dir.path());
        let asked = ExportRequest {
            clients: vec!["127.0.0.2".parse().unwrap()],
            opaque_path: true,
            ..ExportRequest::default()
        };
        let record =
            ExportRecord::new(VolumePath::parse("team-a/data").unwrap(), Some(1000), asked)
                .named(None, ganesha.serves_opaque_paths(), ganesha.gives_fsids())
                .unwrap();
        let name = record.pseudo.clone().expect("ganesha names new exports");
        let block = ganesha.block(&record, 1000);
        let pseudo = format!("  Pseudo = \"/exports/{name}\";");
        assert!(
            block.lines().any(|l| l == pseudo),
            "{pseudo:?} missing:\n{block}"
        );
        // The data stays where it is; only what clients browse changes.
        assert!(
            block.contains("  Path = \"/srv/nfs/team-a/data\";\n"),
            "{block}"
        );
        assert!(!block.contains("fsid"), "ganesha gives no fsids: {block}");
        assert_eq!(
            record.to_volume_export("/exports/").path,
            format!("/exports/{name}")
        );
        let read_back = ExportRecord::from_comments(&block, "test").unwrap();
        assert_eq!(read_back, vec![record]);
    }

    #[test]
    fn a_block_without_clients_admits_nobody() {
        let dir = tempfile::tempdir().unwrap();
        let ganesha = ganesha(dir.path());
        let record = ExportRecord::new(
            VolumePath::parse("ns/claim").unwrap(),
            Some(1000),
            ExportRequest::default(),
        );
        let block = ganesha.block(&record, 1000);
        assert!(!block.contains("CLIENT"), "{block}");
        assert!(block.contains("  Access_Type = None;\n"), "{block}");
        assert!(block.contains("  Squash = Root_Squash;\n"), "{block}");
    }

    #[test]
    fn unprivileged_ports_are_served_only_when_the_operator_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let settings = ExportSettings {
            manager: ExportManager::Ganesha,
            ganesha_config_dir: dir.path().join("ganesha.d"),
            allow_unprivileged_ports: true,
            ..ExportSettings::default()
        };
        let ganesha = Ganesha::new(&settings, Path::new("/srv/nfs"), "/exports/").unwrap();
        let record = ExportRecord::new(
            VolumePath::parse("ns/claim").unwrap(),
            Some(1000),
            ExportRequest::default(),
        );
        let block = ganesha.block(&record, 1000);
        assert!(block.contains("  PrivilegedPort = false;\n"), "{block}");
    }

    #[test]
    fn a_quote_in_the_export_root_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let settings = ExportSettings {
            manager: ExportManager::Ganesha,
            ganesha_config_dir: dir.path().join("ganesha.d"),
            ..ExportSettings::default()
        };
        let refused = Ganesha::new(&settings, Path::new("/srv/\"nfs"), "/srv/nfs");
        assert!(refused.is_err());
    }
}
