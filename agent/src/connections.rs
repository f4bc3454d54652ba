//! Who gets a connection, whatever a client sends or does not send.
//!
//! A connection is a stranger until it authenticates: by a client certificate verified in
//! its handshake, or by a request with a valid bearer token. Strangers and authenticated
//! connections draw on separate budgets, so strangers can never take the places the
//! controller needs:
//!
//! - TLS handshakes in progress: at most `limits.max_tls_handshakes`; when full, the
//!   oldest one in progress from the source address with the most is dropped to make
//!   room (a flood makes room from its own; a real client with one handshake, done in
//!   milliseconds, is not touched while any source has more), and each must end within
//!   `limits.tls_handshake_timeout_seconds`.
//! - Unauthenticated connections (handshake done, nothing authenticated yet): at most
//!   `limits.max_unauthenticated_connections`, room made the same way; each closed
//!   `limits.unauthenticated_timeout_seconds` after its handshake, however much it sends
//!   (PINGs and health checks do not keep it open).
//! - Strangers from one source address, handshaking or not: at most
//!   `limits.max_unauthenticated_per_source`; one more is closed at once.
//! - Authenticated connections: at most `limits.max_connections`; never closed to make
//!   room for anyone.
//!
//! Any connection with no traffic in either direction for `limits.idle_timeout_seconds`
//! is closed as well (see [`Limited`]).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::time::{Instant, Sleep};

/// The budgets and deadlines of [`Admission`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AdmissionSettings {
    pub max_connections: usize,
    pub max_tls_handshakes: usize,
    pub tls_handshake_timeout: Duration,
    pub max_unauthenticated_connections: usize,
    pub max_unauthenticated_per_source: usize,
    pub unauthenticated_timeout: Duration,
    pub idle_timeout: Duration,
}

/// Why a connection was refused or closed by the agent (never what a client sent).
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum CloseReason {
    /// Its source address already had `max_unauthenticated_per_source` strangers.
    source_limit,
    /// Dropped, the oldest handshake in progress, to make room for a new one.
    handshake_evicted,
    /// Its handshake took longer than `tls_handshake_timeout_seconds`.
    handshake_timeout,
    /// Its handshake failed (bad certificate, not TLS, closed halfway).
    handshake_failed,
    /// Closed, the oldest unauthenticated connection, to make room for a new one.
    unauthenticated_evicted,
    /// Still unauthenticated `unauthenticated_timeout_seconds` after its handshake.
    unauthenticated_timeout,
    /// It authenticated while `max_connections` authenticated connections were open.
    authenticated_limit,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct CloseLabels {
    pub reason: CloseReason,
}

#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub(crate) enum Stage {
    handshake,
    unauthenticated,
    authenticated,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(crate) struct StageLabels {
    pub stage: Stage,
}

/// What admission reports: connections open by stage, and those refused or closed.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnectionMetrics {
    pub open: Family<StageLabels, Gauge>,
    pub closed: Family<CloseLabels, Counter>,
}

impl ConnectionMetrics {
    pub(crate) fn count(&self, reason: CloseReason) {
        self.closed.get_or_create(&CloseLabels { reason }).inc();
    }
}

/// Hands out the places of [`AdmissionSettings`]' budgets, one [`Ticket`] per connection.
#[derive(Debug, Clone)]
pub(crate) struct Admission {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    settings: AdmissionSettings,
    authenticated: Arc<Semaphore>,
    strangers: Mutex<Strangers>,
    metrics: ConnectionMetrics,
}

/// The connections not authenticated yet, by stage.
#[derive(Debug, Default)]
struct Strangers {
    next_id: u64,
    handshakes: StageMembers,
    unauthenticated: StageMembers,
}

impl Strangers {
    fn count_from(&self, source: IpAddr) -> usize {
        self.handshakes.count_from(source) + self.unauthenticated.count_from(source)
    }
}

/// The connections in one stage, by source address, oldest first (ids only grow).
#[derive(Debug, Default)]
struct StageMembers {
    len: usize,
    by_source: HashMap<IpAddr, BTreeMap<u64, Arc<Notify>>>,
}

impl StageMembers {
    fn count_from(&self, source: IpAddr) -> usize {
        self.by_source.get(&source).map_or(0, BTreeMap::len)
    }

    fn insert(&mut self, source: IpAddr, id: u64, gone: Arc<Notify>) {
        self.by_source.entry(source).or_default().insert(id, gone);
        self.len += 1;
    }

    fn remove(&mut self, source: IpAddr, id: u64) -> bool {
        let Some(members) = self.by_source.get_mut(&source) else {
            return false;
        };
        let removed = members.remove(&id).is_some();
        if members.is_empty() {
            self.by_source.remove(&source);
        }
        if removed {
            self.len -= 1;
        }
        removed
    }

    /// Takes out the oldest connection of the source that has the most in this stage,
    /// and tells it to go: a flood from a few addresses makes room from its own, never
    /// from a client with one connection in progress.
    fn evict(&mut self) {
        let busiest = self
            .by_source
            .iter()
            .max_by_key(|(_, members)| {
                let oldest = members.keys().next().copied().unwrap_or(u64::MAX);
                (members.len(), std::cmp::Reverse(oldest))
            })
            .map(|(source, _)| *source);
        let Some(source) = busiest else { return };
        let oldest = self
            .by_source
            .get(&source)
            .and_then(|members| members.keys().next().copied());
        if let Some(id) = oldest
            && let Some(gone) = self
                .by_source
                .get(&source)
                .and_then(|m| m.get(&id))
                .cloned()
        {
            self.remove(source, id);
            gone.notify_one();
        }
    }
}

impl Admission {
    pub(crate) fn new(settings: AdmissionSettings, metrics: ConnectionMetrics) -> Self {
        Self {
            shared: Arc::new(Shared {
                authenticated: Arc::new(Semaphore::new(settings.max_connections)),
                settings,
                strangers: Mutex::default(),
                metrics,
            }),
        }
    }

    pub(crate) fn settings(&self) -> &AdmissionSettings {
        &self.shared.settings
    }

    pub(crate) fn metrics(&self) -> &ConnectionMetrics {
        &self.shared.metrics
    }

    /// A ticket for a new connection from `source`, at the handshake stage, or `None`
    /// when that source has as many strangers as it may (counted).
    pub(crate) fn admit(&self, source: IpAddr) -> Option<Arc<Ticket>> {
        let source = source.to_canonical();
        let settings = &self.shared.settings;
        let mut strangers = self.shared.lock();
        if strangers.count_from(source) >= settings.max_unauthenticated_per_source {
            drop(strangers);
            self.shared.metrics.count(CloseReason::source_limit);
            return None;
        }
        let id = strangers.next_id;
        strangers.next_id += 1;
        let gone = Arc::new(Notify::new());
        // In first, so that its own source counts it when room is made.
        strangers.handshakes.insert(source, id, gone.clone());
        let evicted = strangers.handshakes.len > settings.max_tls_handshakes;
        if evicted {
            strangers.handshakes.evict();
        }
        self.shared.update_gauges(&strangers);
        drop(strangers);
        if evicted {
            self.shared.metrics.count(CloseReason::handshake_evicted);
        }
        Some(Arc::new(Ticket {
            shared: self.shared.clone(),
            id,
            source,
            gone,
            authenticated: AtomicBool::new(false),
            permit: Mutex::new(None),
        }))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Strangers> {
        // Held only for map updates that cannot panic halfway; a poisoned lock still
        // holds consistent maps.
        self.strangers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn update_gauges(&self, strangers: &Strangers) {
        let set = |stage, value: usize| {
            self.metrics
                .open
                .get_or_create(&StageLabels { stage })
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        set(Stage::handshake, strangers.handshakes.len);
        set(Stage::unauthenticated, strangers.unauthenticated.len);
        set(
            Stage::authenticated,
            self.settings.max_connections - self.authenticated.available_permits(),
        );
    }
}

/// One connection's place: a stranger's until [`Ticket::authenticate`], then one of the
/// authenticated connections'. Dropping it gives the place back.
#[derive(Debug)]
pub(crate) struct Ticket {
    shared: Arc<Shared>,
    id: u64,
    source: IpAddr,
    /// Notified when the connection was evicted to make room.
    gone: Arc<Notify>,
    authenticated: AtomicBool,
    permit: Mutex<Option<OwnedSemaphorePermit>>,
}

impl Ticket {
    /// The handshake is done without a client certificate: the connection becomes an
    /// unauthenticated one (making room by closing the oldest if need be). `false` when
    /// it was evicted meanwhile.
    pub(crate) fn handshake_done(&self) -> bool {
        let mut strangers = self.shared.lock();
        if !strangers.handshakes.remove(self.source, self.id) {
            return false;
        }
        strangers
            .unauthenticated
            .insert(self.source, self.id, self.gone.clone());
        let evicted =
            strangers.unauthenticated.len > self.shared.settings.max_unauthenticated_connections;
        if evicted {
            strangers.unauthenticated.evict();
        }
        self.shared.update_gauges(&strangers);
        drop(strangers);
        if evicted {
            self.shared
                .metrics
                .count(CloseReason::unauthenticated_evicted);
        }
        true
    }

    /// The connection authenticated (a verified certificate, a valid token): it takes
    /// one of the authenticated places for the rest of its life, or is refused (counted)
    /// when they are all taken or it was evicted meanwhile.
    pub(crate) fn authenticate(&self) -> Result<(), CloseReason> {
        if self.is_authenticated() {
            return Ok(());
        }
        let Ok(permit) = self.shared.authenticated.clone().try_acquire_owned() else {
            self.shared.metrics.count(CloseReason::authenticated_limit);
            return Err(CloseReason::authenticated_limit);
        };
        let mut strangers = self.shared.lock();
        let was_stranger = strangers.handshakes.remove(self.source, self.id)
            || strangers.unauthenticated.remove(self.source, self.id);
        if !was_stranger {
            // Evicted already (counted then), or authenticated by a concurrent request.
            return if self.is_authenticated() {
                Ok(())
            } else {
                Err(CloseReason::unauthenticated_evicted)
            };
        }
        *self
            .permit
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(permit);
        self.authenticated.store(true, Ordering::Release);
        self.shared.update_gauges(&strangers);
        Ok(())
    }

    pub(crate) fn is_authenticated(&self) -> bool {
        self.authenticated.load(Ordering::Acquire)
    }

    /// Completes once the connection was evicted to make room for a newer stranger.
    pub(crate) async fn evicted(&self) {
        self.gone.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut strangers = self.shared.lock();
        strangers.handshakes.remove(self.source, self.id);
        strangers.unauthenticated.remove(self.source, self.id);
        // The permit goes back before the gauges are read.
        self.permit
            .get_mut()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        self.shared.update_gauges(&strangers);
    }
}

/// A stream that fails once idle too long: no traffic in either direction for the idle
/// timeout. Together with the header-read timeout (hyper's) and the deadlines of
/// strangers, a client cannot hold the agent's descriptors by connecting and going quiet.
pub(crate) struct Limited<S> {
    inner: S,
    idle: Duration,
    deadline: Pin<Box<Sleep>>,
}

impl<S> Limited<S> {
    pub(crate) fn new(inner: S, idle: Duration) -> Self {
        Self {
            inner,
            idle,
            deadline: Box::pin(tokio::time::sleep(idle)),
        }
    }

    fn touch(&mut self) {
        let next = Instant::now() + self.idle;
        self.deadline.as_mut().reset(next);
    }

    /// Pending I/O turns into an error once the deadline passed.
    fn check_idle(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        self.deadline.as_mut().poll(cx).is_ready().then(|| {
            io::Error::new(
                io::ErrorKind::TimedOut,
                "connection idle too long (limits.idle_timeout_seconds)",
            )
        })
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = &mut *self;
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(result) => {
                this.touch();
                Poll::Ready(result)
            }
            Poll::Pending => match this.check_idle(cx) {
                Some(error) => Poll::Ready(Err(error)),
                None => Poll::Pending,
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write(cx, data);
        if written.is_ready() {
            this.touch();
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let written = Pin::new(&mut this.inner).poll_write_vectored(cx, bufs);
        if written.is_ready() {
            this.touch();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings() -> AdmissionSettings {
        AdmissionSettings {
            max_connections: 2,
            max_tls_handshakes: 2,
            tls_handshake_timeout: Duration::from_secs(5),
            max_unauthenticated_connections: 2,
            max_unauthenticated_per_source: 3,
            unauthenticated_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(300),
        }
    }

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    fn closed(admission: &Admission, reason: CloseReason) -> u64 {
        admission
            .metrics()
            .closed
            .get_or_create(&CloseLabels { reason })
            .get()
    }

    #[tokio::test]
    async fn a_full_handshake_budget_evicts_the_oldest_handshake() {
        let admission = Admission::new(settings(), ConnectionMetrics::default());
        let first = admission.admit(ip(1)).unwrap();
        let _second = admission.admit(ip(2)).unwrap();
        let _third = admission.admit(ip(3)).unwrap();
        tokio::time::timeout(Duration::from_secs(5), first.evicted())
            .await
            .expect("the oldest handshake is told to go");
        assert!(
            !first.handshake_done(),
            "an evicted handshake goes no further"
        );
        assert_eq!(closed(&admission, CloseReason::handshake_evicted), 1);
    }

    #[tokio::test]
    async fn a_full_unauthenticated_budget_closes_the_oldest_and_spares_authenticated_ones() {
        let admission = Admission::new(settings(), ConnectionMetrics::default());
        let controller = admission.admit(ip(1)).unwrap();
        controller.authenticate().unwrap();
        let strangers: Vec<_> = (2..6)
            .map(|n| {
                let ticket = admission.admit(ip(n)).unwrap();
                assert!(ticket.handshake_done());
                ticket
            })
            .collect();
        for evicted in &strangers[..2] {
            tokio::time::timeout(Duration::from_secs(5), evicted.evicted())
                .await
                .expect("the oldest strangers are told to go");
        }
        assert_eq!(closed(&admission, CloseReason::unauthenticated_evicted), 2);
        assert!(controller.is_authenticated());
        // An evicted stranger cannot authenticate its way back in.
        assert_eq!(
            strangers[0].authenticate(),
            Err(CloseReason::unauthenticated_evicted)
        );
        // A newer one can, into the authenticated budget, which then is full.
        strangers[3].authenticate().unwrap();
        assert_eq!(
            strangers[2].authenticate(),
            Err(CloseReason::authenticated_limit)
        );
        drop(controller);
        strangers[2].authenticate().unwrap();
    }

    #[tokio::test]
    async fn room_is_made_from_the_busiest_source_not_from_a_lone_client() {
        let settings = AdmissionSettings {
            max_unauthenticated_per_source: 16,
            ..settings()
        };
        let admission = Admission::new(settings, ConnectionMetrics::default());
        let lone = admission.admit(ip(1)).unwrap();
        let flood_first = admission.admit(ip(9)).unwrap();
        let _flood_second = admission.admit(ip(9)).unwrap();
        tokio::time::timeout(Duration::from_secs(5), flood_first.evicted())
            .await
            .expect("the flood's own oldest handshake goes");
        assert!(lone.handshake_done(), "the lone client's handshake stays");
        let flood: Vec<_> = (0..3)
            .map(|_| {
                let ticket = admission.admit(ip(9)).unwrap();
                ticket.handshake_done();
                ticket
            })
            .collect();
        drop(flood);
        assert!(
            lone.authenticate().is_ok(),
            "the lone unauthenticated connection stayed through the flood"
        );
    }

    #[test]
    fn one_source_gets_only_its_share_of_strangers() {
        let settings = AdmissionSettings {
            max_tls_handshakes: 16,
            ..settings()
        };
        let admission = Admission::new(settings, ConnectionMetrics::default());
        let held: Vec<_> = (0..3).map(|_| admission.admit(ip(7)).unwrap()).collect();
        assert!(admission.admit(ip(7)).is_none());
        assert!(
            admission.admit(ip(8)).is_some(),
            "other sources are not refused"
        );
        assert_eq!(closed(&admission, CloseReason::source_limit), 1);
        // An authenticated connection no longer counts against its source.
        held[0].authenticate().unwrap();
        assert!(admission.admit(ip(7)).is_some());
        drop(held);
        assert!(admission.admit(ip(7)).is_some());
    }
}
