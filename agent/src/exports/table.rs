use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use nfsprov_api_types::{ExportManager, ExportRequest, Volume, VolumeExport, VolumePath};
use tokio::sync::{Mutex as ChangeLock, Notify, OwnedMutexGuard};

use super::settings::VolumeLayout;

use super::ganesha::Ganesha;
use super::knfsd::Knfsd;
use super::record::ExportRecord;
use super::server::{ExportError, NfsServer, Restored, Table};
use super::settings::ExportSettings;

/// The agent's export table and the NFS server it keeps in step with it.
///
/// Readers (a volume's GET, a list) read the published table, a snapshot swapped in
/// whole after each change the server accepted: they never wait for the server nor for
/// a change. Changes are serialized by a lock of their own (the server's own files,
/// ganesha's include list and knfsd's exports file, are rewritten whole, so two changes
/// must not interleave); a change waits for it at most the server time limit, and the
/// server's answer at most that limit again, so a server or bus that hangs costs the
/// change its 503, never anyone else their answer.
#[derive(Debug)]
pub struct Exports {
    server: Option<Arc<dyn NfsServer>>,
    /// The path clients mount for the export root (`nfs.path`).
    mount_root: String,
    ids: std::ops::RangeInclusive<u16>,
    /// What the server was last seen to accept: the table readers see.
    published: ArcSwap<Table>,
    /// Exports of volumes that were gone at start, still to be withdrawn from the
    /// server; changed only under the change lock.
    gone: ArcSwap<Vec<ExportRecord>>,
    /// Exports withdrawn from the server for a while and kept in the table
    /// ([`Exports::withhold`]); changed only under the change lock.
    withheld: ArcSwap<BTreeSet<VolumePath>>,
    changes: Arc<ChangeLock<()>>,
    /// Longest wait for the change lock and for each answer of the server.
    server_timeout: Duration,
    health: ArcSwap<ExportHealth>,
    /// Wakes the reconciler before its interval is up (after a change the server did
    /// not answer).
    pub(super) wake: Notify,
}

/// Whether the server serves what the table says, as far as the agent last knew.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExportHealth {
    /// The last change or reconciliation pass succeeded.
    Serving,
    /// The server or its bus did not answer or refused: exports may be missing until a
    /// pass of the reconciler repairs them.
    Degraded { reason: String, since: Instant },
}

impl ExportHealth {
    pub fn is_degraded(&self) -> bool {
        matches!(self, ExportHealth::Degraded { .. })
    }
}

/// The change lock, held: what a change of the table needs.
pub(super) type Held = OwnedMutexGuard<()>;

impl Exports {
    /// No manager: volumes carry no export of their own.
    pub fn none(mount_root: &str) -> Self {
        Self::with_server(None, mount_root, &ExportSettings::default())
    }

    /// The manager `settings` name, its table restored from what an earlier run
    /// recorded: exports of volumes that are gone are removed, the rest served again.
    ///
    /// A server or bus that does not answer does not stop the start: the table is
    /// read from the agent's own records, the exports are reported degraded and the
    /// reconciler repairs them when the server answers ([`Exports::health`]).
    /// `layout` is how the store's volumes sit on the export root's filesystem, which
    /// decides knfsd's options.
    pub fn open(
        settings: &ExportSettings,
        export_root: &Path,
        mount_root: &str,
        layout: VolumeLayout,
        volume_exists: impl Fn(&VolumePath) -> bool,
    ) -> Result<(Self, Restored), ExportError> {
        let server: Arc<dyn NfsServer> = match settings.manager {
            ExportManager::None | ExportManager::Unknown => {
                return Ok((Self::none(mount_root), Restored::default()));
            }
            ExportManager::Ganesha => Arc::new(Ganesha::new(settings, export_root, mount_root)?),
            ExportManager::Knfsd => Arc::new(Knfsd::new(settings, export_root, layout)),
        };
        Self::open_with(server, settings, mount_root, volume_exists)
    }

    /// As [`Exports::open`] with a server made by the caller.
    pub fn open_with(
        server: Arc<dyn NfsServer>,
        settings: &ExportSettings,
        mount_root: &str,
        volume_exists: impl Fn(&VolumePath) -> bool,
    ) -> Result<(Self, Restored), ExportError> {
        let mut table = Table::new();
        let mut gone = Vec::new();
        for record in server.load()? {
            if volume_exists(&record.volume) {
                table.insert(record.volume.clone(), record);
            } else {
                gone.push(record);
            }
        }
        let exports = Self::with_server(Some(server), mount_root, settings);
        exports.published.store(Arc::new(table));
        // The volume was deleted or archived by a run that crashed before it forgot
        // the export (or by hand): nothing may be served at its path any more.
        exports.gone.store(Arc::new(gone));
        let held = exports
            .changes
            .clone()
            .try_lock_owned()
            .map_err(|_| ExportError::Corrupt("the new export table is locked".into()))?;
        let restored = match exports.reconcile(&held) {
            Ok(restored) => restored,
            Err(error @ ExportError::Unavailable(_)) => {
                tracing::warn!(%error, "the NFS server does not answer; serving with exports degraded until it does");
                Restored::default()
            }
            Err(error) => return Err(error),
        };
        drop(held);
        Ok((exports, restored))
    }

    fn with_server(
        server: Option<Arc<dyn NfsServer>>,
        mount_root: &str,
        settings: &ExportSettings,
    ) -> Self {
        Self {
            server,
            mount_root: mount_root.to_owned(),
            ids: settings.ganesha_export_ids.clone(),
            published: ArcSwap::from_pointee(Table::new()),
            gone: ArcSwap::from_pointee(Vec::new()),
            withheld: ArcSwap::from_pointee(BTreeSet::new()),
            changes: Arc::new(ChangeLock::new(())),
            server_timeout: settings.server_timeout,
            health: ArcSwap::from_pointee(ExportHealth::Serving),
            wake: Notify::new(),
        }
    }

    pub fn kind(&self) -> ExportManager {
        self.server
            .as_ref()
            .map_or(ExportManager::None, |server| server.kind())
    }

    /// Whether new exports can be given an opaque path (`opaque_path` of a request).
    pub fn opaque_paths(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|server| server.serves_opaque_paths())
    }

    /// How many volumes are exported.
    pub fn len(&self) -> usize {
        self.published.load().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the server serves the table, as the last change or pass found.
    pub fn health(&self) -> Arc<ExportHealth> {
        self.health.load_full()
    }

    /// The volume's export, as served.
    pub fn get(&self, volume: &VolumePath) -> Option<VolumeExport> {
        self.published
            .load()
            .get(volume)
            .map(|record| record.to_volume_export(&self.mount_root))
    }

    /// Fills in `volume.export`.
    pub fn describe(&self, volume: &mut Volume) {
        if self.server.is_some() {
            volume.export = self.get(&volume.path);
        }
    }

    /// Makes the NFS server serve `request` for `volume`, in place of what it served.
    /// Asking again for what is served already changes nothing and calls no server.
    /// Called from a blocking thread: it may wait for the server.
    pub fn set(
        &self,
        volume: &VolumePath,
        request: &ExportRequest,
    ) -> Result<VolumeExport, ExportError> {
        let server = self.server.as_ref().ok_or(ExportError::NoManager)?;
        if let Some(served) = self.served_as(volume, request) {
            return Ok(served);
        }
        let held = self.begin_change()?;
        let result = self.settle_gone(&held, Some(volume)).and_then(|_| {
            // Again under the lock: a change that ran meanwhile may have made it so.
            if let Some(served) = self.served_as(volume, request) {
                return Ok(served);
            }
            let mut table = Table::clone(&self.published.load());
            let previous = table.get(volume).cloned();
            let id = match (&previous, server.needs_id()) {
                (Some(previous), _) => previous.id,
                (None, true) => Some(self.free_id(&table)?),
                (None, false) => None,
            };
            let next = ExportRecord::new(volume.clone(), id, request.clone())
                .named(
                    previous.as_ref(),
                    request.opaque_path && server.serves_opaque_paths(),
                    server.gives_fsids(),
                )
                .map_err(ExportError::io("drawing the export's names"))?;
            table.insert(volume.clone(), next.clone());
            server.apply(previous.as_ref(), &next, &table)?;
            self.published.store(Arc::new(table));
            Ok(next.to_volume_export(&self.mount_root))
        });
        self.note(&result);
        result
    }

    fn served_as(&self, volume: &VolumePath, request: &ExportRequest) -> Option<VolumeExport> {
        let served = self
            .published
            .load()
            .get(volume)?
            .to_volume_export(&self.mount_root);
        served.matches(request).then_some(served)
    }

    /// Withdraws the export of `volume` from the server and serves it again as recorded:
    /// for a volume whose filesystem was mounted after the server may have resolved its
    /// path, which it would otherwise go on serving as the directory beneath the mount.
    pub fn serve_again(&self, volume: &VolumePath) -> Result<(), ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        if !self.published.load().contains_key(volume) {
            return Ok(());
        }
        let held = self.begin_change()?;
        let table = self.published.load_full();
        let result = match table.get(volume) {
            Some(record) => {
                let mut without = Table::clone(&table);
                without.remove(volume);
                server
                    .remove(record, &without)
                    .and_then(|()| server.apply(None, record, &table))
            }
            None => Ok(()),
        };
        drop(held);
        self.note(&result);
        result
    }

    /// Withdraws the export of `volume` from the server and keeps its record, for a
    /// volume whose filesystem the server must let go of for a while (an image volume
    /// grown unmounted): the API still reports the export, the reconciler leaves the
    /// server alone until [`Exports::serve_withheld`], and a restart of the agent serves
    /// it again from its record. Answers whether there was an export to withdraw. Called
    /// from a blocking thread, under the volume's lock.
    pub fn withhold(&self, volume: &VolumePath) -> Result<bool, ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(false);
        };
        if !self.published.load().contains_key(volume) {
            return Ok(false);
        }
        let held = self.begin_change()?;
        let Some(record) = self.published.load().get(volume).cloned() else {
            return Ok(false);
        };
        let result = server.suspend(&record);
        if result.is_ok() {
            let mut withheld = BTreeSet::clone(&self.withheld.load());
            withheld.insert(volume.clone());
            self.withheld.store(Arc::new(withheld));
        }
        drop(held);
        self.note(&result);
        result.map(|()| true)
    }

    /// Serves again, as recorded, the export [`Exports::withhold`] withdrew. When the
    /// server does not take it the exports are degraded and the reconciler serves it
    /// once the server answers.
    pub fn serve_withheld(&self, volume: &VolumePath) -> Result<(), ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        if !self.withheld.load().contains(volume) {
            return Ok(());
        }
        let held = self.begin_change()?;
        let result = match self.published.load().get(volume) {
            Some(record) => server.resume(record),
            None => Ok(()),
        };
        // Withheld no longer, served or not: a reconciler's pass compares it with the
        // server from now on and repairs what the server did not take.
        let mut withheld = BTreeSet::clone(&self.withheld.load());
        withheld.remove(volume);
        self.withheld.store(Arc::new(withheld));
        drop(held);
        if let Err(error) = &result {
            self.degrade(error.to_string());
            self.wake.notify_one();
        }
        result
    }

    /// Leaves the export [`Exports::withhold`] withdrew unserved, because its volume
    /// cannot be served (its filesystem is not mounted): the exports are degraded, for
    /// `why`, and reconciliation postponed, until a start mounts the volume and serves
    /// it again from its record.
    pub fn keep_withheld(&self, volume: &VolumePath, why: &str) {
        if self.withheld.load().contains(volume) {
            self.degrade(format!(
                "the export of {volume} is withheld: {why}; restart the agent once it can mount the volume"
            ));
        }
    }

    /// Whether `volume`'s export is withdrawn for a while ([`Exports::withhold`]).
    pub fn is_withheld(&self, volume: &VolumePath) -> bool {
        self.withheld.load().contains(volume)
    }

    /// Stops exporting `volume` (nothing to do when it is not exported).
    pub fn remove(&self, volume: &VolumePath) -> Result<(), ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        let owed = self
            .gone
            .load()
            .iter()
            .any(|record| record.volume == *volume);
        if !owed && !self.published.load().contains_key(volume) {
            return Ok(());
        }
        let held = self.begin_change()?;
        let result = self.settle_gone(&held, Some(volume)).and_then(|_| {
            let mut table = Table::clone(&self.published.load());
            let Some(record) = table.remove(volume) else {
                return Ok(());
            };
            server.remove(&record, &table)?;
            self.published.store(Arc::new(table));
            Ok(())
        });
        self.note(&result);
        result
    }

    /// Takes the change lock within the server time limit. Called from a blocking
    /// thread (the change then talks to the server on it).
    fn begin_change(&self) -> Result<Held, ExportError> {
        if let Ok(held) = self.changes.clone().try_lock_owned() {
            return Ok(held);
        }
        let limit = self.server_timeout;
        let wait = tokio::time::timeout(limit, self.changes.clone().lock_owned());
        let held = match tokio::runtime::Handle::try_current() {
            Ok(runtime) => runtime.block_on(wait),
            // Outside the agent's runtime (a tool or test driving the table directly)
            // nothing can hang behind the lock but its own other threads.
            Err(_) => Ok(self.changes.clone().blocking_lock_owned()),
        };
        held.map_err(|_| {
            ExportError::Unavailable(format!(
                "another export change has waited for the NFS server for {}s (exports.server_timeout_seconds)",
                limit.as_secs()
            ))
        })
    }

    /// Takes the change lock for a pass of the reconciler, waiting as long as a change
    /// holds it (each change is bounded by the server time limit).
    pub(super) async fn hold(&self) -> Held {
        self.changes.clone().lock_owned().await
    }

    /// Records what a change found of the server, and wakes the reconciler when the
    /// server did not answer: what the change left undone may need repair.
    fn note<T>(&self, result: &Result<T, ExportError>) {
        if let Err(error @ ExportError::Unavailable(_)) = result {
            self.degrade(error.to_string());
            self.wake.notify_one();
        }
    }

    fn degrade(&self, reason: String) {
        let since = match &**self.health.load() {
            ExportHealth::Degraded { since, .. } => *since,
            ExportHealth::Serving => Instant::now(),
        };
        self.health
            .store(Arc::new(ExportHealth::Degraded { reason, since }));
    }

    /// One reconciliation, under the change lock: the exports of gone volumes withdrawn,
    /// then the server's exports compared with the table and what is missing or
    /// differs served again (see [`NfsServer::reconcile`]).
    pub(super) fn reconcile(&self, held: &Held) -> Result<Restored, ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(Restored::default());
        };
        if !self.withheld.load().is_empty() {
            // A pass would serve a withheld export again while its filesystem is away;
            // the one who withheld it serves it again, and wakes the next pass.
            tracing::debug!("reconciliation postponed: an export is withheld");
            return Ok(Restored::default());
        }
        let result = self.settle_gone(held, None).and_then(|removed| {
            let table = self.published.load_full();
            server.reconcile(&table).map(|mut restored| {
                restored.removed += removed;
                restored
            })
        });
        match &result {
            Ok(_) => self.health.store(Arc::new(ExportHealth::Serving)),
            Err(error) => self.degrade(error.to_string()),
        }
        result
    }

    /// Whether passes are cheap enough to run on a timer as well as after a failure.
    pub(super) fn compares_cheaply(&self) -> bool {
        self.server
            .as_ref()
            .is_some_and(|server| server.compares_cheaply())
    }

    /// Withdraws the exports of gone volumes (only `volume`'s when given); how many.
    fn settle_gone(&self, _held: &Held, volume: Option<&VolumePath>) -> Result<usize, ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(0);
        };
        let mut removed = 0;
        loop {
            let gone = self.gone.load_full();
            let Some(at) = gone
                .iter()
                .position(|record| volume.is_none_or(|volume| record.volume == *volume))
            else {
                return Ok(removed);
            };
            server.remove(&gone[at], &self.published.load())?;
            let mut rest = Vec::clone(&gone);
            rest.swap_remove(at);
            self.gone.store(Arc::new(rest));
            removed += 1;
        }
    }

    fn free_id(&self, table: &Table) -> Result<u16, ExportError> {
        // A gone volume's id stays taken until its export is withdrawn: its file and
        // perhaps the server still carry it.
        let used: BTreeSet<u16> = table
            .values()
            .chain(self.gone.load().iter())
            .filter_map(|record| record.id)
            .collect();
        self.ids
            .clone()
            .find(|id| !used.contains(id))
            .ok_or(ExportError::NoFreeId)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;
    use std::sync::mpsc::{Receiver, Sender, channel};

    use super::*;

    /// A mock NFS server: records what it is asked, answers `apply` only when the test
    /// lets it, and fails `reconcile` while told to.
    #[derive(Debug, Default)]
    struct MockServer {
        recorded: Vec<ExportRecord>,
        /// When set, each `apply` says it started and waits for a word to finish.
        gate: Mutex<Option<(Sender<()>, Receiver<()>)>>,
        unreachable: std::sync::atomic::AtomicBool,
        removed: Mutex<Vec<u16>>,
        suspended: Mutex<Vec<u16>>,
        restores: std::sync::atomic::AtomicUsize,
    }

    impl NfsServer for MockServer {
        fn kind(&self) -> ExportManager {
            ExportManager::Ganesha
        }
        fn needs_id(&self) -> bool {
            true
        }
        fn load(&self) -> Result<Vec<ExportRecord>, ExportError> {
            Ok(self.recorded.clone())
        }
        fn apply(
            &self,
            _: Option<&ExportRecord>,
            _: &ExportRecord,
            _: &Table,
        ) -> Result<(), ExportError> {
            if let Some((started, finish)) = &*self.gate.lock().unwrap() {
                started.send(()).unwrap();
                finish.recv().unwrap();
            }
            Ok(())
        }
        fn remove(&self, record: &ExportRecord, _: &Table) -> Result<(), ExportError> {
            self.reachable()?;
            self.removed.lock().unwrap().extend(record.id);
            Ok(())
        }
        fn suspend(&self, record: &ExportRecord) -> Result<(), ExportError> {
            self.reachable()?;
            self.suspended.lock().unwrap().extend(record.id);
            Ok(())
        }
        fn resume(&self, record: &ExportRecord) -> Result<(), ExportError> {
            self.reachable()?;
            self.suspended
                .lock()
                .unwrap()
                .retain(|id| Some(*id) != record.id);
            Ok(())
        }
        fn restore(&self, all: &Table) -> Result<Restored, ExportError> {
            self.reachable()?;
            self.restores
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            Ok(Restored {
                kept: all.len(),
                ..Restored::default()
            })
        }
    }

    impl MockServer {
        fn reachable(&self) -> Result<(), ExportError> {
            if self.unreachable.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(ExportError::Unavailable("mock: no answer".into()));
            }
            Ok(())
        }
    }

    fn path(name: &str) -> VolumePath {
        VolumePath::parse(name).unwrap()
    }

    fn settings() -> ExportSettings {
        ExportSettings {
            manager: ExportManager::Ganesha,
            server_timeout: Duration::from_millis(200),
            ganesha_export_ids: 1000..=1010,
            ..ExportSettings::default()
        }
    }

    fn open(server: Arc<MockServer>, exists: &[&str]) -> (Arc<Exports>, Restored) {
        let exists: Vec<VolumePath> = exists.iter().map(|name| path(name)).collect();
        let (exports, restored) =
            Exports::open_with(server, &settings(), "/exports", |v| exists.contains(v)).unwrap();
        (Arc::new(exports), restored)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn reads_are_answered_while_a_change_waits_for_the_server_and_a_second_change_gives_up() {
        let server = Arc::new(MockServer::default());
        let (exports, _) = open(server.clone(), &[]);
        let request = ExportRequest::default();
        exports.set(&path("ns/served"), &request).unwrap();

        let (started_tx, started) = channel();
        let (finish, finish_rx) = channel();
        *server.gate.lock().unwrap() = Some((started_tx, finish_rx));
        let hung = {
            let exports = exports.clone();
            let request = request.clone();
            tokio::task::spawn_blocking(move || exports.set(&path("ns/hung"), &request))
        };
        started.recv().unwrap();
        // The change holds its turn and waits for the server: reads see the table.
        assert!(exports.get(&path("ns/served")).is_some());
        assert!(exports.get(&path("ns/hung")).is_none(), "not served yet");
        assert_eq!(exports.len(), 1);
        // Another change waits for its turn no longer than the server time limit.
        let waiting = {
            let exports = exports.clone();
            tokio::task::spawn_blocking(move || exports.set(&path("ns/other"), &request))
        };
        let refused = waiting.await.unwrap();
        assert!(
            matches!(&refused, Err(ExportError::Unavailable(why)) if why.contains("another export change")),
            "{refused:?}"
        );
        finish.send(()).unwrap();
        *server.gate.lock().unwrap() = None;
        hung.await.unwrap().unwrap();
        assert!(exports.get(&path("ns/hung")).is_some());
    }

    #[tokio::test]
    async fn a_start_without_the_server_is_degraded_until_a_pass_reaches_it() {
        let gone = ExportRecord::new(path("ns/gone"), Some(1000), ExportRequest::default());
        let kept = ExportRecord::new(path("ns/kept"), Some(1001), ExportRequest::default());
        let server = Arc::new(MockServer {
            recorded: vec![gone, kept],
            ..MockServer::default()
        });
        server
            .unreachable
            .store(true, std::sync::atomic::Ordering::SeqCst);
        let (exports, restored) = open(server.clone(), &["ns/kept"]);
        assert_eq!(restored, Restored::default());
        assert!(exports.health().is_degraded());
        assert!(
            exports.get(&path("ns/kept")).is_some(),
            "the table from the records"
        );
        // The gone volume's id is not given to another until its export is withdrawn.
        let new = exports
            .set(&path("ns/new"), &ExportRequest::default())
            .unwrap();
        assert_eq!(new.path, "/exports/ns/new");
        assert_eq!(exports.published.load()[&path("ns/new")].id, Some(1002));

        let reconciler = super::super::Reconciler::new(exports.clone(), Duration::from_secs(60));
        let failed = reconciler.pass(true).await;
        assert!(failed.failed(), "{failed:?}");
        assert!(exports.health().is_degraded());
        server
            .unreachable
            .store(false, std::sync::atomic::Ordering::SeqCst);
        let pass = reconciler.pass(true).await;
        let restored = pass.exports.clone().unwrap().unwrap();
        assert_eq!((restored.kept, restored.removed), (2, 1), "{pass:?}");
        assert_eq!(*server.removed.lock().unwrap(), vec![1000]);
        assert_eq!(*exports.health(), ExportHealth::Serving);
    }

    #[tokio::test]
    async fn a_withheld_export_stays_in_the_table_and_no_pass_serves_it_until_it_is_served_again() {
        let server = Arc::new(MockServer::default());
        let (exports, _) = open(server.clone(), &[]);
        let volume = path("ns/grown");
        exports.set(&volume, &ExportRequest::default()).unwrap();
        let id = exports.published.load()[&volume].id.unwrap();

        assert!(exports.withhold(&volume).unwrap());
        assert_eq!(*server.suspended.lock().unwrap(), vec![id]);
        assert!(exports.is_withheld(&volume));
        assert!(
            exports.get(&volume).is_some(),
            "still reported and recorded"
        );
        assert!(server.removed.lock().unwrap().is_empty(), "not forgotten");

        let reconciler = super::super::Reconciler::new(exports.clone(), Duration::from_secs(60));
        let restores = || server.restores.load(std::sync::atomic::Ordering::SeqCst);
        let before = restores();
        reconciler.pass(true).await.exports.unwrap().unwrap();
        assert_eq!(
            restores(),
            before,
            "a pass leaves the server alone meanwhile"
        );

        exports.serve_withheld(&volume).unwrap();
        assert!(server.suspended.lock().unwrap().is_empty(), "served again");
        assert!(!exports.is_withheld(&volume));
        reconciler.pass(true).await.exports.unwrap().unwrap();
        assert_eq!(restores(), before + 1, "and passes compare it again");
        // Nothing withheld: nothing to do.
        assert!(!exports.withhold(&path("ns/unexported")).unwrap());

        // A volume that could not be mounted again stays withheld, the exports degraded.
        assert!(exports.withhold(&volume).unwrap());
        exports.keep_withheld(&volume, "its filesystem could not be mounted again");
        assert!(
            matches!(&*exports.health(), ExportHealth::Degraded { reason, .. } if reason.contains("ns/grown")),
            "{:?}",
            exports.health()
        );
        let before = restores();
        reconciler.pass(true).await.exports.unwrap().unwrap();
        assert_eq!(restores(), before, "no pass serves it");
        assert!(exports.health().is_degraded());
        assert_eq!(*server.suspended.lock().unwrap(), vec![id]);
    }
}
