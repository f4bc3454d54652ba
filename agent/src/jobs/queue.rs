//! How many jobs of each kind (clones, snapshots, restores) may wait for a slot. Jobs
//! outlive their requests and the slots bound only how many run, so without a bound on
//! those waiting, requests for ever new targets whose clients hang up at once would pile
//! up jobs, and memory, for as long as the slots stay busy.
//!
//! A job is not dropped when its clients go: the controller asks again for the same job
//! (each request waits a while and answers `202 Accepted`), with no client connected in
//! between, so "nobody waits now" never means "nobody will ask again". Instead each kind
//! counts the jobs admitted that do not hold a slot yet, and a request that would start
//! one more past `limits.max_queued_jobs` starts nothing: it is answered 429
//! `job_queue_full` with `Retry-After`, and the same request later is welcome. A request
//! that joins a job already admitted is never refused.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nfsprov_api_types::{ApiError, ErrorCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::shares::{JobShare, ShareHold};
use crate::metrics::{JobLabels, JobMetrics};

/// What a refusal asks a client to wait before the same request: about what a small copy
/// takes, so a queue that drains is refilled soon, and long enough that a refused client
/// costs the agent little.
pub(crate) const RETRY_AFTER: Duration = Duration::from_secs(5);

/// The kinds of jobs, each with a queue of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobKind {
    Clone,
    Snapshot,
    Restore,
}

impl JobKind {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            JobKind::Clone => "clone",
            JobKind::Snapshot => "snapshot",
            JobKind::Restore => "restore",
        }
    }
}

/// The jobs of one kind that wait for a slot: at most `limit` at once.
#[derive(Debug, Clone)]
pub(super) struct JobQueue {
    kind: JobKind,
    limit: usize,
    waiting: Arc<AtomicUsize>,
    queued: Gauge,
    running: Gauge,
    refused: Counter,
}

impl JobQueue {
    /// The queue of `kind` jobs, at most `limit` waiting, reported in `metrics`.
    pub(super) fn new(kind: JobKind, limit: usize, metrics: &JobMetrics) -> Self {
        let labels = JobLabels {
            kind: kind.as_str(),
        };
        metrics
            .limit
            .get_or_create(&labels)
            .set(i64::try_from(limit).unwrap_or(i64::MAX));
        Self {
            kind,
            limit,
            waiting: Arc::default(),
            queued: metrics.queued.get_or_create(&labels).clone(),
            running: metrics.running.get_or_create(&labels).clone(),
            refused: metrics.refused.get_or_create(&labels).clone(),
        }
    }

    /// Admits one more job, counted as waiting until [`Ticket::run`]; refused when
    /// `limit` jobs wait already, or when the `share` of the credential asking for it is
    /// taken.
    pub(super) fn admit(&self, share: Option<&JobShare>) -> Result<Ticket, ApiError> {
        let share = share.map(JobShare::take).transpose().map_err(|why| {
            ApiError::new(
                ErrorCode::JobQueueFull,
                format!(
                    "{why}; none was started: repeat the request in {} s",
                    RETRY_AFTER.as_secs()
                ),
            )
        })?;
        let admitted = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |waiting| {
                (waiting < self.limit).then_some(waiting + 1)
            });
        if admitted.is_err() {
            self.refused.inc();
            return Err(ApiError::new(
                ErrorCode::JobQueueFull,
                format!(
                    "{} {} jobs wait for a slot already (limits.max_queued_jobs); none was started: repeat the request in {} s",
                    self.limit,
                    self.kind.as_str(),
                    RETRY_AFTER.as_secs()
                ),
            ));
        }
        self.queued.inc();
        Ok(Ticket {
            queue: self.clone(),
            running: false,
            _share: share,
        })
    }
}

/// One admitted job's place: waiting, then running once it holds a slot; given back when
/// dropped, however the job ends.
#[derive(Debug)]
pub(super) struct Ticket {
    queue: JobQueue,
    running: bool,
    /// The job's part of its credential's share, held as long as the job.
    _share: Option<ShareHold>,
}

impl Ticket {
    /// The job holds its slot: it waits no more.
    pub(super) fn run(&mut self) {
        if !self.running {
            self.running = true;
            self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
            self.queue.queued.dec();
            self.queue.running.inc();
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if self.running {
            self.queue.running.dec();
        } else {
            self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
            self.queue.queued.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_admits_up_to_its_limit_and_counts_what_it_refuses() {
        let metrics = JobMetrics::default();
        let queue = JobQueue::new(JobKind::Snapshot, 2, &metrics);
        let labels = JobLabels { kind: "snapshot" };
        let gauge = |family: &prometheus_client::metrics::family::Family<JobLabels, Gauge>| {
            family.get_or_create(&labels).get()
        };
        let mut first = queue.admit(None).unwrap();
        let second = queue.admit(None).unwrap();
        let refused = queue.admit(None).unwrap_err();
        assert_eq!(refused.code, ErrorCode::JobQueueFull);
        assert!(
            refused.message.contains("2 snapshot jobs"),
            "{}",
            refused.message
        );
        assert_eq!(metrics.refused.get_or_create(&labels).get(), 1);
        assert_eq!(gauge(&metrics.queued), 2);
        assert_eq!(gauge(&metrics.limit), 2);

        // Running, the first no longer waits: one more is admitted.
        first.run();
        first.run();
        assert_eq!((gauge(&metrics.queued), gauge(&metrics.running)), (1, 1));
        let third = queue.admit(None).unwrap();
        assert!(queue.admit(None).is_err());
        assert_eq!(metrics.refused.get_or_create(&labels).get(), 2);

        // Jobs that end, waiting or running, give their places back.
        drop((first, second, third));
        assert_eq!((gauge(&metrics.queued), gauge(&metrics.running)), (0, 0));
        let _again = [queue.admit(None).unwrap(), queue.admit(None).unwrap()];
        // Other kinds have queues of their own.
        let clones = JobQueue::new(JobKind::Clone, 1, &metrics);
        let _clone = clones.admit(None).unwrap();
        assert!(queue.admit(None).is_err());
    }
}
