//! The jobs of one kind in flight, by what they make: at most one job per key, joined by
//! every repeat of its request, admitted by its kind's queue, forgotten when it ends.
//! Also how far each job has come (its [`Fate`]), which a delete of what it makes reads
//! to cancel it, and the bounded wait for a job's outcome.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nfsprov_api_types::{ApiError, ErrorCode};
use tokio::sync::watch;

use super::queue::{JobQueue, Ticket};
use super::shares::JobShare;
use crate::store::snapshot::Stage;

#[derive(Debug)]
struct Job<R, O, I> {
    id: u64,
    request: R,
    started: Instant,
    /// What is said of the job while it runs.
    info: I,
    done: watch::Receiver<Option<O>>,
    fate: Arc<Fate>,
}

type Running<K, R, O, I> = Arc<Mutex<HashMap<K, Job<R, O, I>>>>;

/// Jobs by what they make, at most one per key; new ones admitted by their queue.
#[derive(Debug)]
pub(super) struct JobMap<K, R, O, I> {
    running: Running<K, R, O, I>,
    ids: AtomicU64,
    queue: JobQueue,
}

/// Why a request started no job and joined none.
#[derive(Debug)]
pub(crate) enum Refused<R> {
    /// A job runs another request at the key: this one.
    Other(R),
    /// The queue is full: why, for the answer.
    Full(ApiError),
}

impl<R> Refused<R> {
    /// The answer to the refused request: the queue's refusal, or a conflict that
    /// `conflict` describes from the other request.
    pub(crate) fn into_error(self, conflict: impl FnOnce(R) -> String) -> ApiError {
        match self {
            Refused::Full(full) => full,
            Refused::Other(other) => ApiError::new(ErrorCode::Conflict, conflict(other)),
        }
    }
}

/// A job joined or started: when it started, what is said of it while it runs, and its
/// outcome to wait for.
#[derive(Debug)]
pub(crate) struct Joined<O, I> {
    pub started: Instant,
    pub info: I,
    done: watch::Receiver<Option<O>>,
}

impl<T: Clone, I> Joined<Result<T, ApiError>, I> {
    /// The job's outcome when it ends within `wait`, `None` while it runs. A job that died
    /// without one (it panicked) is already forgotten, so the next request starts over;
    /// this one is told so, `job` naming what died.
    pub(crate) async fn outcome(
        &mut self,
        wait: Duration,
        job: &str,
    ) -> Option<Result<T, ApiError>> {
        let died = || {
            Err(ApiError::new(
                ErrorCode::Internal,
                format!("{job} ended without an outcome; retry"),
            ))
        };
        match tokio::time::timeout(wait, self.done.wait_for(Option::is_some)).await {
            Ok(Ok(outcome)) => Some(outcome.clone().unwrap_or_else(died)),
            Ok(Err(_)) => Some(died()),
            Err(_) => None,
        }
    }
}

impl<K, R, O, I> JobMap<K, R, O, I> {
    pub(super) fn new(queue: JobQueue) -> Self {
        Self {
            running: Arc::default(),
            ids: AtomicU64::new(0),
            queue,
        }
    }
}

impl<K, R, O, I> JobMap<K, R, O, I>
where
    K: Hash + Eq + Clone,
    R: PartialEq + Clone,
    I: Clone,
{
    /// Joins the job making `key` when it runs `request`, or starts one with `start`
    /// (given the job's end, its fate and its place in the queue) when the queue admits
    /// it. Refused with the other request when a job runs another one at `key`, or when
    /// the queue is full.
    pub(super) fn join_or_start(
        &self,
        key: &K,
        request: &R,
        info: I,
        share: Option<&JobShare>,
        start: impl FnOnce(JobEnd<K, R, O, I>, Arc<Fate>, Ticket),
    ) -> Result<Joined<O, I>, Refused<R>> {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        match running.get(key) {
            Some(job) if job.request == *request => Ok(Joined {
                started: job.started,
                info: job.info.clone(),
                done: job.done.clone(),
            }),
            Some(job) => Err(Refused::Other(job.request.clone())),
            None => {
                let ticket = self.queue.admit(share).map_err(Refused::Full)?;
                let (tell, done) = watch::channel(None);
                let id = self.ids.fetch_add(1, Ordering::Relaxed);
                let fate = Arc::new(Fate::default());
                let started = Instant::now();
                running.insert(
                    key.clone(),
                    Job {
                        id,
                        request: request.clone(),
                        started,
                        info: info.clone(),
                        done: done.clone(),
                        fate: fate.clone(),
                    },
                );
                start(
                    JobEnd {
                        running: self.running.clone(),
                        key: key.clone(),
                        id,
                        tell,
                    },
                    fate,
                    ticket,
                );
                Ok(Joined {
                    started,
                    info,
                    done,
                })
            }
        }
    }

    pub(super) fn info(&self, key: &K) -> Option<I> {
        self.running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(key)
            .map(|job| job.info.clone())
    }

    /// Cancels the job making `key` (see [`Fate::cancel`]) and forgets it, so a new
    /// request for `key` starts afresh (and waits for the old job's locks). Whether the
    /// cancel settled what the job makes; false without a job.
    pub(super) fn cancel(&self, key: &K) -> bool {
        let job = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
        job.is_some_and(|job| job.fate.cancel())
    }
}

/// How far a job has come, as a delete of what it makes sees it.
#[derive(Debug, Default)]
pub(crate) struct Fate(AtomicU8);

impl Fate {
    /// It has not yet looked whether what it makes is there already.
    const LOOKING: u8 = 0;
    /// It found nothing and makes it: nothing of it is recorded, or ever will be once
    /// it is cancelled.
    const MAKING: u8 = 1;
    /// It records what it made; a cancel no longer stops it.
    const RECORDING: u8 = 2;
    const CANCELLED: u8 = 3;

    /// Moves the job on to `stage`; false once it is cancelled.
    pub(crate) fn reach(&self, stage: Stage) -> bool {
        let (from, to) = match stage {
            Stage::Making => (Self::LOOKING, Self::MAKING),
            Stage::Recording => (Self::MAKING, Self::RECORDING),
        };
        self.0
            .compare_exchange(from, to, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
    }

    /// Cancels the job unless it records already. Whether that settles it: it was
    /// making something it will now never record.
    fn cancel(&self) -> bool {
        let before = self
            .0
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |now| {
                (now != Self::RECORDING).then_some(Self::CANCELLED)
            });
        before == Ok(Self::MAKING)
    }

    pub(crate) fn cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst) == Self::CANCELLED
    }
}

/// The end of a job: dropped, also when the job panics, it takes the job out of the
/// running ones, unless a newer job runs at its key already (it was cancelled). Only the
/// job itself does, so a waiter never removes a newer job that a retry started.
pub(super) struct JobEnd<K: Hash + Eq, R, O, I> {
    running: Running<K, R, O, I>,
    key: K,
    id: u64,
    tell: watch::Sender<Option<O>>,
}

impl<K: Hash + Eq, R, O, I> JobEnd<K, R, O, I> {
    /// Leaves the running jobs, then tells `outcome` to whoever waits, so a request after
    /// the outcome never joins the finished job.
    pub(super) fn finish(self, outcome: O) {
        let tell = self.tell.clone();
        drop(self);
        let _ = tell.send(Some(outcome));
    }
}

impl<K: Hash + Eq, R, O, I> Drop for JobEnd<K, R, O, I> {
    fn drop(&mut self) {
        let mut running = self.running.lock().unwrap_or_else(|e| e.into_inner());
        if running.get(&self.key).is_some_and(|job| job.id == self.id) {
            running.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::queue::JobKind;
    use crate::metrics::JobMetrics;

    fn queue(limit: usize) -> JobQueue {
        JobQueue::new(JobKind::Snapshot, limit, &JobMetrics::default())
    }

    #[test]
    fn a_full_queue_refuses_new_jobs_but_not_repeats_of_admitted_ones() {
        let jobs: JobMap<&str, u32, u32, ()> = JobMap::new(queue(1));
        let mut tickets = Vec::new();
        let mut ends = Vec::new();
        let first = jobs.join_or_start(&"a", &1, (), None, |end, _, ticket| {
            ends.push(end);
            tickets.push(ticket);
        });
        assert!(first.is_ok());
        // Another key is a new job: refused, and nothing of it is kept.
        match jobs.join_or_start(&"b", &1, (), None, |_, _, _| {
            panic!("started past the limit")
        }) {
            Err(Refused::Full(full)) => assert_eq!(full.code, ErrorCode::JobQueueFull),
            other => panic!("not refused as full: {other:?}"),
        }
        assert!(jobs.info(&"b").is_none());
        // A repeat of the admitted job joins it.
        assert!(
            jobs.join_or_start(&"a", &1, (), None, |_, _, _| panic!("a second job at a"))
                .is_ok()
        );
        // Once the first holds its slot, another may wait.
        tickets[0].run();
        let second = jobs.join_or_start(&"b", &1, (), None, |end, _, ticket| {
            ends.push(end);
            tickets.push(ticket);
        });
        assert!(second.is_ok());
    }

    #[test]
    fn a_cancelled_job_leaves_a_newer_one_at_its_key() {
        let jobs: JobMap<&str, u32, u32, ()> = JobMap::new(queue(8));
        let mut ends = Vec::new();
        let mut fates = Vec::new();
        let first = jobs.join_or_start(&"a", &1, (), None, |end, fate, _| {
            fates.push(fate);
            ends.push(end);
        });
        assert!(first.is_ok());
        assert!(matches!(
            jobs.join_or_start(&"a", &2, (), None, |_, _, _| {}),
            Err(Refused::Other(1))
        ));
        // Still looking, so not settled by the cancel; forgotten all the same.
        assert!(!jobs.cancel(&"a"));
        assert!(jobs.info(&"a").is_none());
        assert!(!jobs.cancel(&"a"));
        jobs.join_or_start(&"a", &2, (), None, |end, fate, _| {
            fates.push(fate);
            ends.push(end);
        })
        .unwrap();
        assert!(fates[0].cancelled());
        assert!(!fates[1].cancelled());
        // The cancelled job ends: the newer one stays.
        ends.remove(0).finish(7);
        assert!(jobs.info(&"a").is_some());
        // Making what it found unrecorded, the newer one is settled by a cancel.
        assert!(fates[1].reach(Stage::Making));
        assert!(jobs.cancel(&"a"));
        ends.remove(0).finish(8);
        assert!(jobs.info(&"a").is_none());
    }

    #[test]
    fn a_cancel_settles_a_job_only_while_it_makes_what_it_found_unrecorded() {
        // Before it looks, the snapshot may be recorded: the delete must wait for the
        // job, which makes nothing more.
        let looking = Fate::default();
        assert!(!looking.cancel());
        assert!(looking.cancelled());
        assert!(!looking.reach(Stage::Making));

        let making = Fate::default();
        assert!(making.reach(Stage::Making));
        assert!(making.cancel());
        assert!(making.cancelled());
        assert!(!making.reach(Stage::Recording));

        // Recording, it cannot be stopped: the delete waits and removes the snapshot.
        let recording = Fate::default();
        assert!(recording.reach(Stage::Making));
        assert!(recording.reach(Stage::Recording));
        assert!(!recording.cancel());
        assert!(!recording.cancelled());
    }
}
