//! The slots jobs run in, one set shared by every kind, since each job holds as many
//! descriptors as a copy. Jobs outlive their requests, so the request limits do not bound
//! them: the slots do. A job waits for a slot before it takes any lock or descriptor, and
//! the request that started it still gets its `202 Accepted` meanwhile. There are
//! `limits.max_clone_jobs` slots, or fewer when the process's descriptor limit cannot hold
//! that many copies at their deepest (each takes at most [`COPY_DESCRIPTORS`]) beside what
//! connections, requests and usage walks may hold; never fewer than one.

use std::fmt::Display;
use std::sync::Arc;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::config::AgentConfig;
use crate::store::{COPY_DESCRIPTORS, MAX_USAGE_DEPTH};

/// Usage walks at once: two for volumes and one for archives.
const USAGE_WALKS: usize = 3;
/// Most descriptors one request holds: a deletion's threads emptying directories, with
/// the parents walked to reach the volume.
const REQUEST_DESCRIPTORS: usize = 24;
/// The agent's own: listener, logs, records, certificates, the export root and its areas.
const BASE_DESCRIPTORS: u64 = 64;
/// What a job opens besides its copy: the source, staging and parent directories.
const JOB_DESCRIPTORS: usize = 32;

/// The jobs that found every slot taken, and those waiting for one now.
#[derive(Debug, Clone, Default)]
pub(crate) struct SlotWaits {
    pub waited: Counter,
    pub waiting: Gauge,
}

/// The slots of every kind's jobs.
#[derive(Debug, Clone)]
pub(super) struct Slots(Arc<Semaphore>);

impl Slots {
    /// As many slots as `config` allows beside its connection and request limits, their
    /// number shown in `count`.
    pub(super) fn new(config: &AgentConfig, count: &Gauge) -> Self {
        let descriptors = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
        let slots = slots(
            config.max_clone_jobs,
            // Every connection the admission budgets allow at once holds a descriptor.
            config.max_connections
                + config.max_tls_handshakes
                + config.max_unauthenticated_connections
                + config.max_concurrent_requests * REQUEST_DESCRIPTORS,
            descriptors,
        );
        Self::exactly(slots, count)
    }

    /// Exactly `slots` slots, shown in `count`.
    pub(super) fn exactly(slots: usize, count: &Gauge) -> Self {
        count.set(i64::try_from(slots).unwrap_or(i64::MAX));
        Self(Arc::new(Semaphore::new(slots)))
    }

    /// A slot for `job`, once one is free; a wait for it is counted in `waits`.
    pub(super) async fn acquire<J: Display + Sync + ?Sized>(
        &self,
        job: &J,
        waits: Option<&SlotWaits>,
    ) -> OwnedSemaphorePermit {
        if let Ok(slot) = self.0.clone().try_acquire_owned() {
            return slot;
        }
        let _waiting = waits.map(Waiting::new);
        tracing::debug!(%job, "a job waits for a slot");
        self.0
            .clone()
            .acquire_owned()
            .await
            .expect("the job slots are never closed")
    }
}

/// Counts a job as waiting for as long as it waits for a slot, however the wait ends.
struct Waiting<'a>(&'a SlotWaits);

impl<'a> Waiting<'a> {
    fn new(waits: &'a SlotWaits) -> Self {
        waits.waited.inc();
        waits.waiting.inc();
        Self(waits)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.waiting.dec();
    }
}

/// How many jobs may run at once: `wanted`, less when the descriptor limit (`None`:
/// unlimited) cannot hold that many deep copies beside what connections and requests may
/// hold (`requests`), the usage walks and the agent's own.
fn slots(wanted: usize, requests: usize, descriptors: Option<u64>) -> usize {
    let wanted = wanted.max(1);
    let Some(limit) = descriptors else {
        return wanted;
    };
    let others = requests + USAGE_WALKS * (MAX_USAGE_DEPTH + 1);
    let reserved = BASE_DESCRIPTORS.saturating_add(others as u64);
    let per_job = (COPY_DESCRIPTORS + JOB_DESCRIPTORS) as u64;
    let fit = usize::try_from(limit.saturating_sub(reserved) / per_job).unwrap_or(usize::MAX);
    if fit >= wanted {
        return wanted;
    }
    let slots = fit.max(1);
    tracing::warn!(
        descriptor_limit = limit,
        max_clone_jobs = wanted,
        clone_jobs = slots,
        descriptors_per_clone = per_job,
        descriptors_reserved = reserved,
        "the descriptor limit (LimitNOFILE=) cannot hold limits.max_clone_jobs clones at once beside the connections and requests allowed; fewer run at once and the rest wait"
    );
    slots
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_setting_where_descriptors_allow() {
        // The shipped unit's LimitNOFILE= with the default limits.
        let requests = 4096 + 256 * REQUEST_DESCRIPTORS;
        assert_eq!(slots(2, requests, Some(65_536)), 2);
        assert_eq!(slots(2, requests, None), 2);
        assert_eq!(slots(0, requests, None), 1);
        // Room for three copies and a half beyond what everything else may take.
        let reserved = BASE_DESCRIPTORS as usize + requests + USAGE_WALKS * (MAX_USAGE_DEPTH + 1);
        let per_job = COPY_DESCRIPTORS + JOB_DESCRIPTORS;
        let limit = (reserved + 3 * per_job + per_job / 2) as u64;
        assert_eq!(slots(8, requests, Some(limit)), 3);
        // Not even one fits: one still runs, rather than none ever.
        assert_eq!(slots(2, requests, Some(1024)), 1);
    }

    #[tokio::test]
    async fn a_wait_for_a_slot_is_counted_while_it_lasts() {
        let count = Gauge::default();
        let slots = Slots::exactly(1, &count);
        assert_eq!(count.get(), 1);
        let waits = SlotWaits::default();
        let first = slots.acquire("first", Some(&waits)).await;
        assert_eq!(waits.waited.get(), 0, "a free slot is no wait");
        let second = tokio::spawn({
            let slots = slots.clone();
            let waits = waits.clone();
            async move { slots.acquire("second", Some(&waits)).await }
        });
        crate::jobs::runner::tests::until("the second job to wait", || waits.waiting.get() == 1)
            .await;
        assert_eq!(waits.waited.get(), 1);
        drop(first);
        let second = second.await.unwrap();
        assert_eq!((waits.waited.get(), waits.waiting.get()), (1, 0));
        drop(second);
    }
}
