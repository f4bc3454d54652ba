use std::collections::{BTreeSet, HashSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
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
/// after each change the server accepted (a persistent map: the next snapshot shares
/// all but the changed path with the last): they never wait for the server nor for a
/// change. Changes take turns under a lock of their own (ganesha's include lists are
/// shared by the exports of a bucket, so two changes must not interleave), and a turn
/// applies every change waiting for one ([`Exports::set`]); a change waits for its turn
/// at most the server time limit, and the server's answer at most that limit again, so
/// a server or bus that hangs costs the change its 503, never anyone else their answer.
#[derive(Debug)]
pub struct Exports {
    server: Option<Arc<dyn NfsServer>>,
    /// The path clients mount for the export root (`nfs.path`).
    mount_root: String,
    ids: std::ops::RangeInclusive<u16>,
    /// What the server was last seen to accept: the table readers see.
    published: ArcSwap<Table>,
    /// The export ids the published table gives, swapped with it: a free id is found
    /// without a walk of the table.
    published_ids: ArcSwap<imbl::OrdSet<u16>>,
    /// Exports of volumes that were gone at start, still to be withdrawn from the
    /// server; changed only under the change lock.
    gone: ArcSwap<Vec<ExportRecord>>,
    /// Exports withdrawn from the server for a while and kept in the table
    /// ([`Exports::withhold`]); changed only under the change lock.
    withheld: ArcSwap<BTreeSet<VolumePath>>,
    changes: Arc<ChangeLock<()>>,
    /// Changes of exports waiting to be applied together by whoever holds the change
    /// lock next (the group commit of [`Exports::set`]); held only to push or take.
    waiting: ChangeLock<Vec<Waiting>>,
    /// Numbers the waiting changes, so that one that gives up can take itself back.
    tickets: AtomicU64,
    /// Where the search for a free export id starts: after the last one given, so that
    /// giving ids costs no walk of the taken ones. Changed only under the change lock.
    next_id: AtomicU16,
    /// Longest wait for the change lock and for each answer of the server.
    server_timeout: Duration,
    health: ArcSwap<ExportHealth>,
    /// Wakes the reconciler before its interval is up (after a change the server did
    /// not answer).
    pub(super) wake: Arc<Notify>,
}

/// What a waiting change calls for.
enum Planned {
    Served(VolumeExport),
    Change {
        previous: Option<ExportRecord>,
        next: Box<ExportRecord>,
    },
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

/// How often a change waiting in the group looks whether the change lock is free to
/// apply the group itself: the holder may be a pass or a removal, which applies no
/// group, and it would otherwise wait out its time limit.
const WAITING_LOOK: Duration = Duration::from_millis(10);

/// A change of one export waiting for its group to be applied.
#[derive(Debug)]
struct Waiting {
    ticket: u64,
    volume: VolumePath,
    request: ExportRequest,
    answer: SyncSender<Result<VolumeExport, ExportError>>,
}

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
        let exports = Self::with_server(Some(server.clone()), mount_root, settings);
        // A server that restarted may have lost exports: a pass compares at once rather
        // than at the end of its interval.
        let wake = Arc::downgrade(&exports.wake);
        server.watch_restarts(Box::new(move || {
            wake.upgrade().map(|wake| wake.notify_one()).is_some()
        }));
        let ids: imbl::OrdSet<u16> = table.values().filter_map(|record| record.id).collect();
        // New ids are given on from the highest taken, not searched for from the first.
        if let Some(highest) = ids.get_max() {
            exports
                .next_id
                .store(highest.saturating_add(1), Ordering::Relaxed);
        }
        exports.published_ids.store(Arc::new(ids));
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
            published_ids: ArcSwap::from_pointee(imbl::OrdSet::new()),
            gone: ArcSwap::from_pointee(Vec::new()),
            withheld: ArcSwap::from_pointee(BTreeSet::new()),
            changes: Arc::new(ChangeLock::new(())),
            waiting: ChangeLock::new(Vec::new()),
            tickets: AtomicU64::new(0),
            next_id: AtomicU16::new(*settings.ganesha_export_ids.start()),
            server_timeout: settings.server_timeout,
            health: ArcSwap::from_pointee(ExportHealth::Serving),
            wake: Arc::new(Notify::new()),
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
    ///
    /// Changes asked for at the same time are applied as one group (a group commit):
    /// each waits in line, and whoever takes the change lock applies every change
    /// waiting, with one sync of the server's files and, where the server can, one call
    /// to it for all. A change waits for its group at most the server time limit before
    /// it has started; once started, the group is bounded by the server's time limit per
    /// call.
    pub fn set(
        &self,
        volume: &VolumePath,
        request: &ExportRequest,
    ) -> Result<VolumeExport, ExportError> {
        if self.server.is_none() {
            return Err(ExportError::NoManager);
        }
        if let Some(served) = self.served_as(volume, request) {
            return Ok(served);
        }
        let (answer, answered) = sync_channel(1);
        let ticket = self.tickets.fetch_add(1, Ordering::Relaxed);
        self.waiting_list().push(Waiting {
            ticket,
            volume: volume.clone(),
            request: request.clone(),
            answer,
        });
        let result = self.await_group(ticket, &answered);
        self.note(&result);
        result
    }

    /// Waits until the change `ticket` is applied, applying the waiting group itself
    /// whenever the change lock is free.
    fn await_group(
        &self,
        ticket: u64,
        answered: &Receiver<Result<VolumeExport, ExportError>>,
    ) -> Result<VolumeExport, ExportError> {
        let deadline = Instant::now() + self.server_timeout;
        loop {
            if let Ok(held) = self.changes.clone().try_lock_owned() {
                self.apply_waiting(&held);
            }
            match answered.recv_timeout(WAITING_LOOK) {
                Ok(result) => return result,
                Err(RecvTimeoutError::Timeout) => {
                    if Instant::now() >= deadline && self.take_back(ticket) {
                        return Err(ExportError::Unavailable(format!(
                            "another export change has waited for the NFS server for {}s (exports.server_timeout_seconds)",
                            self.server_timeout.as_secs()
                        )));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(ExportError::Corrupt(
                        "an export change was dropped unanswered".into(),
                    ));
                }
            }
        }
    }

    /// The list of waiting changes, locked only to push or take (never across I/O).
    fn waiting_list(&self) -> tokio::sync::MutexGuard<'_, Vec<Waiting>> {
        loop {
            if let Ok(list) = self.waiting.try_lock() {
                return list;
            }
            std::thread::yield_now();
        }
    }

    /// Takes the change `ticket` out of the line if no group has taken it yet.
    fn take_back(&self, ticket: u64) -> bool {
        let mut list = self.waiting_list();
        match list.iter().position(|waiting| waiting.ticket == ticket) {
            Some(at) => {
                list.remove(at);
                true
            }
            None => false,
        }
    }

    /// Applies every waiting change, group after group, until none waits.
    fn apply_waiting(&self, held: &Held) {
        loop {
            let group = std::mem::take(&mut *self.waiting_list());
            if group.is_empty() {
                return;
            }
            self.apply_group(held, group);
        }
    }

    /// Applies one group of waiting changes and answers each. A volume named twice in
    /// the group has its later change put back in line for the next group.
    fn apply_group(&self, held: &Held, group: Vec<Waiting>) {
        let Some(server) = self.server.as_ref() else {
            for waiting in group {
                let _ = waiting.answer.send(Err(ExportError::NoManager));
            }
            return;
        };
        let mut table = Table::clone(&self.published.load());
        let mut ids = imbl::OrdSet::clone(&self.published_ids.load());
        let mut seen = HashSet::new();
        let mut later = Vec::new();
        let mut planned: Vec<(Waiting, Option<ExportRecord>, ExportRecord)> = Vec::new();
        for waiting in group {
            if !seen.insert(waiting.volume.clone()) {
                later.push(waiting);
                continue;
            }
            match self.plan(held, server.as_ref(), &mut table, &mut ids, &waiting) {
                Ok(Planned::Served(served)) => {
                    let _ = waiting.answer.send(Ok(served));
                }
                Ok(Planned::Change { previous, next }) => planned.push((waiting, previous, *next)),
                Err(error) => {
                    let _ = waiting.answer.send(Err(error));
                }
            }
        }
        let changes: Vec<super::server::Change<'_>> = planned
            .iter()
            .map(|(_, previous, next)| (previous.as_ref(), next))
            .collect();
        let results = server.apply_all(&changes, &table);
        let mut answers = Vec::with_capacity(planned.len());
        for ((waiting, previous, next), result) in planned.into_iter().zip(results) {
            match result {
                Ok(()) => answers.push((waiting, Ok(next.to_volume_export(&self.mount_root)))),
                Err(error) => {
                    // What the server did not take is not published.
                    match previous {
                        Some(previous) => {
                            table.insert(next.volume.clone(), previous);
                        }
                        None => {
                            table.remove(&next.volume);
                            if let Some(id) = next.id {
                                ids.remove(&id);
                            }
                        }
                    }
                    answers.push((waiting, Err(error)));
                }
            }
        }
        self.published_ids.store(Arc::new(ids));
        self.published.store(Arc::new(table));
        for (waiting, answer) in answers {
            let _ = waiting.answer.send(answer);
        }
        if !later.is_empty() {
            let mut list = self.waiting_list();
            later.append(&mut list);
            *list = later;
        }
    }

    /// What one waiting change needs, with the group's table so far: nothing (served as
    /// asked already), or a change with the next record, put in `table`.
    fn plan(
        &self,
        held: &Held,
        server: &dyn NfsServer,
        table: &mut Table,
        ids: &mut imbl::OrdSet<u16>,
        waiting: &Waiting,
    ) -> Result<Planned, ExportError> {
        let volume = &waiting.volume;
        let request = &waiting.request;
        self.settle_gone(held, Some(volume))?;
        let previous = table.get(volume).cloned();
        if let Some(previous) = &previous {
            let served = previous.to_volume_export(&self.mount_root);
            if served.matches(request) {
                return Ok(Planned::Served(served));
            }
        }
        let id = match (&previous, server.needs_id()) {
            (Some(previous), _) => previous.id,
            (None, true) => {
                let id = self.free_id(ids)?;
                ids.insert(id);
                Some(id)
            }
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
        Ok(Planned::Change {
            previous,
            next: Box::new(next),
        })
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
            if let Some(id) = record.id {
                let mut ids = imbl::OrdSet::clone(&self.published_ids.load());
                ids.remove(&id);
                self.published_ids.store(Arc::new(ids));
            }
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

    /// A free export id, searched from after the last one given: `taken` holds every id
    /// of the table. Called under the change lock.
    fn free_id(&self, taken: &imbl::OrdSet<u16>) -> Result<u16, ExportError> {
        let (first, last) = (*self.ids.start(), *self.ids.end());
        let gone_holds = |id: u16| {
            // A gone volume's id stays taken until its export is withdrawn: its file and
            // perhaps the server still carry it.
            self.gone.load().iter().any(|record| record.id == Some(id))
        };
        let start = self.next_id.load(Ordering::Relaxed).clamp(first, last);
        let candidates = (start..=last).chain(first..start);
        for id in candidates {
            if !taken.contains(&id) && !gone_holds(id) {
                self.next_id
                    .store(if id == last { first } else { id + 1 }, Ordering::Relaxed);
                return Ok(id);
            }
        }
        Err(ExportError::NoFreeId)
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
        /// The size of each group `apply_all` was given.
        groups: Mutex<Vec<usize>>,
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
            // Taken: only the next apply waits.
            let gate = self.gate.lock().unwrap().take();
            if let Some((started, finish)) = gate {
                started.send(()).unwrap();
                finish.recv().unwrap();
            }
            Ok(())
        }
        fn apply_all(
            &self,
            changes: &[super::super::Change<'_>],
            all: &Table,
        ) -> Vec<Result<(), ExportError>> {
            self.groups.lock().unwrap().push(changes.len());
            changes
                .iter()
                .map(|(previous, next)| self.apply(*previous, next, all))
                .collect()
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
        hung.await.unwrap().unwrap();
        assert!(exports.get(&path("ns/hung")).is_some());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn changes_asked_while_one_is_applied_are_applied_together_as_one_group() {
        let server = Arc::new(MockServer::default());
        let (exports, _) = open(server.clone(), &[]);
        let (started_tx, started) = channel();
        let (finish, finish_rx) = channel();
        *server.gate.lock().unwrap() = Some((started_tx, finish_rx));
        let first = {
            let exports = exports.clone();
            tokio::task::spawn_blocking(move || {
                exports.set(&path("ns/first"), &ExportRequest::default())
            })
        };
        started.recv().unwrap();
        // Ten more while the first is with the server: they wait in line.
        let others: Vec<_> = (0..10)
            .map(|i| {
                let exports = exports.clone();
                tokio::task::spawn_blocking(move || {
                    exports.set(&path(&format!("ns/v{i}")), &ExportRequest::default())
                })
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while exports.waiting_list().len() < 10 {
            assert!(Instant::now() < deadline, "the ten never waited in line");
            tokio::task::yield_now().await;
        }
        finish.send(()).unwrap();
        first.await.unwrap().unwrap();
        let mut ids = BTreeSet::new();
        for other in others {
            other.await.unwrap().unwrap();
        }
        for i in 0..10 {
            let record = &exports.published.load()[&path(&format!("ns/v{i}"))];
            assert!(ids.insert(record.id.unwrap()), "an id given twice");
        }
        assert_eq!(*server.groups.lock().unwrap(), vec![1, 10]);
        assert_eq!(exports.len(), 11);
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
