//! The one runner of every kind's jobs. A job admitted by its kind's queue and kept in
//! its kind's map waits for a slot of those all kinds share, takes its locks, works on
//! the blocking pool and tells its outcome to whoever waits, counted as its kind counts
//! jobs. What a job locks, does and reports is its kind's own ([`JobTask`]).

use std::fmt::Display;
use std::future::Future;
use std::hash::Hash;
use std::sync::Arc;

use nfsprov_api_types::{ApiError, ErrorCode};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;

use super::map::{Fate, JobEnd, JobMap, Joined, Refused};
use super::queue::{JobKind, JobQueue, Ticket};
use super::shares::JobShare;
use super::slots::{SlotWaits, Slots};
use crate::config::AgentConfig;
use crate::metrics::{JobMetrics, Metrics};
use crate::store::{PathGuard, StoreError};

/// How a job ended: what it made, or why not.
pub(super) type Outcome<T> = Result<T, ApiError>;

/// One job's own part. Shown, it names its blocking task in the answer when that task
/// dies (`<what it makes>: the <kind> task`).
pub(crate) trait JobTask: Display + Send + Sync + 'static {
    /// What the job makes, told to every waiter.
    type Made: Clone + Send + Sync + 'static;

    /// Takes the job's locks once it holds its slot, in an order every job keeps, so
    /// that no two jobs wait on each other.
    fn lock(&self) -> impl Future<Output = Vec<PathGuard>> + Send;

    /// The work, on the blocking pool and under the locks; `fate` is how far the job has
    /// come, as a delete of what it makes sees it.
    fn run(&self, fate: &Fate) -> Result<Self::Made, StoreError>;

    /// Logs a failure of the work, with the job's own fields.
    fn warn(&self, error: &StoreError);

    /// Counts and logs what the job made.
    fn made(&self, made: &Self::Made);
}

/// What the runner counts of one kind's jobs, in that kind's own metrics.
#[derive(Debug, Clone, Default)]
pub(crate) struct Counters {
    /// Jobs holding their locks and working now.
    pub in_progress: Gauge,
    /// Jobs whose work failed or died; what a cancelled job leaves is no failure.
    pub failed: Counter,
    /// Jobs that had to wait for a slot, where the kind counts them.
    pub slot_waits: Option<SlotWaits>,
}

/// What every kind's jobs share: the slots they run in, and how many of each kind may
/// wait for one.
#[derive(Debug, Clone)]
pub(crate) struct JobRunner {
    slots: Slots,
    max_queued: usize,
    queues: JobMetrics,
}

impl JobRunner {
    /// The runner of `config`'s limits, its slots and queues shown in `metrics`.
    pub(crate) fn new(config: &AgentConfig, metrics: &Metrics) -> Self {
        Self {
            slots: Slots::new(config, &metrics.clones.slots),
            max_queued: config.max_queued_jobs,
            queues: metrics.jobs.clone(),
        }
    }

    /// The jobs of `kind`, with a queue of their own, counted in `counters`.
    pub(crate) fn jobs<K, R, T, I>(&self, kind: JobKind, counters: Counters) -> Jobs<K, R, T, I> {
        Jobs {
            map: JobMap::new(JobQueue::new(kind, self.max_queued, &self.queues)),
            slots: self.slots.clone(),
            counters,
        }
    }
}

/// The jobs of one kind: at most one by key `K` (what it makes), running request `R`,
/// making `T`, said to be `I` while it runs.
#[derive(Debug)]
pub(crate) struct Jobs<K, R, T, I> {
    map: JobMap<K, R, Outcome<T>, I>,
    slots: Slots,
    counters: Counters,
}

impl<K, R, T, I> Jobs<K, R, T, I>
where
    K: Hash + Eq + Clone + Send + 'static,
    R: PartialEq + Clone + Send + 'static,
    T: Clone + Send + Sync + 'static,
    I: Clone + Send + 'static,
{
    /// Joins the job making `key` when it runs `request`, or starts the one `task` makes
    /// when the kind's queue admits it; refused when a job runs another request at
    /// `key`, or when the queue is full.
    pub(crate) fn join_or_start<J: JobTask<Made = T>>(
        &self,
        key: &K,
        request: &R,
        info: I,
        share: Option<&JobShare>,
        task: impl FnOnce() -> J,
    ) -> Result<Joined<Outcome<T>, I>, Refused<R>> {
        self.map
            .join_or_start(key, request, info, share, |end, fate, ticket| {
                self.spawn(task(), end, fate, ticket);
            })
    }

    /// What is said of the job making `key`, while it runs.
    pub(crate) fn info(&self, key: &K) -> Option<I> {
        self.map.info(key)
    }

    /// Cancels the job making `key`: whether that settled what it makes (see
    /// [`JobMap::cancel`]).
    pub(crate) fn cancel(&self, key: &K) -> bool {
        self.map.cancel(key)
    }

    /// Runs `task` to its end, which `end` tells; the job leaves the map however it
    /// ends, also when it panics.
    fn spawn<J: JobTask<Made = T>>(
        &self,
        task: J,
        end: JobEnd<K, R, Outcome<T>, I>,
        fate: Arc<Fate>,
        mut ticket: Ticket,
    ) {
        let slots = self.slots.clone();
        let counters = self.counters.clone();
        tokio::spawn(async move {
            // The slot first and the locks after: a job holding a lock never waits for a
            // slot held by one that waits for that lock.
            let slot = slots.acquire(&task, counters.slot_waits.as_ref()).await;
            ticket.run();
            let locks = task.lock().await;
            counters.in_progress.inc();
            let task = Arc::new(task);
            let work = {
                let task = task.clone();
                let fate = fate.clone();
                tokio::task::spawn_blocking(move || task.run(&fate))
            };
            let outcome = job_outcome(
                work.await,
                fate.cancelled(),
                &counters.failed,
                format_args!("{task}"),
                |e| task.warn(e),
            );
            if let Ok(made) = &outcome {
                task.made(made);
            }
            counters.in_progress.dec();
            drop(locks);
            drop(slot);
            drop(ticket);
            end.finish(outcome);
        });
    }
}

/// What a job's waiters are told of its blocking task. A failure is counted in `failed`
/// and logged by `warn`, with the job's own fields, unless the job was `cancelled`: then
/// what it made was deleted, which is no failure. A task that died (it panicked) is
/// counted too, and named by `task` in the answer.
fn job_outcome<T>(
    joined: Result<Result<T, StoreError>, tokio::task::JoinError>,
    cancelled: bool,
    failed: &Counter,
    task: std::fmt::Arguments<'_>,
    warn: impl FnOnce(&StoreError),
) -> Outcome<T> {
    match joined {
        Ok(Ok(made)) => Ok(made),
        Ok(Err(e)) if cancelled => Err(e.to_api_error()),
        Ok(Err(e)) => {
            failed.inc();
            warn(&e);
            Err(e.to_api_error())
        }
        Err(e) => {
            failed.inc();
            Err(ApiError::new(
                ErrorCode::Internal,
                format!("{task} failed: {e}"),
            ))
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::fmt;
    use std::sync::Mutex;
    use std::sync::mpsc;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::jobs::slots::Slots;

    /// Polls `holds` until it does, failing after a minute.
    pub(in crate::jobs) async fn until(what: &str, holds: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while !holds() {
            assert!(Instant::now() < deadline, "waited a minute for {what}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// How a test ends a mock job: dropped unsent, the job dies.
    type Release = mpsc::Sender<Result<u32, StoreError>>;

    /// A mock job: it works until its test lets it go, then ends as told.
    struct MockTask {
        name: &'static str,
        release: Mutex<mpsc::Receiver<Result<u32, StoreError>>>,
        warned: Arc<Mutex<Vec<String>>>,
        made: Arc<Mutex<Vec<u32>>>,
    }

    impl fmt::Display for MockTask {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "{}: the mock task", self.name)
        }
    }

    impl JobTask for MockTask {
        type Made = u32;

        async fn lock(&self) -> Vec<PathGuard> {
            Vec::new()
        }

        fn run(&self, _: &Fate) -> Result<u32, StoreError> {
            let release = self.release.lock().unwrap();
            release
                .recv()
                .expect("the test dropped the job's release: it dies")
        }

        fn warn(&self, error: &StoreError) {
            self.warned.lock().unwrap().push(error.to_string());
        }

        fn made(&self, made: &u32) {
            self.made.lock().unwrap().push(*made);
        }
    }

    struct Kind {
        jobs: Jobs<&'static str, u32, u32, ()>,
        counters: Counters,
        warned: Arc<Mutex<Vec<String>>>,
        made: Arc<Mutex<Vec<u32>>>,
    }

    impl Kind {
        fn new(runner: &JobRunner, kind: JobKind, counters: Counters) -> Self {
            Self {
                jobs: runner.jobs(kind, counters.clone()),
                counters,
                warned: Arc::default(),
                made: Arc::default(),
            }
        }

        /// Starts the job making `key`, and the sender that ends it.
        fn start(&self, key: &'static str) -> (Joined<Outcome<u32>, ()>, Release) {
            let (end, release) = mpsc::channel();
            let joined = self
                .jobs
                .join_or_start(&key, &1, (), None, || MockTask {
                    name: key,
                    release: Mutex::new(release),
                    warned: self.warned.clone(),
                    made: self.made.clone(),
                })
                .unwrap();
            (joined, end)
        }
    }

    fn runner(slots: usize) -> JobRunner {
        JobRunner {
            slots: Slots::exactly(slots, &Gauge::default()),
            max_queued: 8,
            queues: JobMetrics::default(),
        }
    }

    const WAIT: Duration = Duration::from_secs(60);

    #[tokio::test(flavor = "multi_thread")]
    async fn every_kind_counts_what_it_made_and_its_failures_alike() {
        let runner = runner(2);
        let kind = Kind::new(&runner, JobKind::Clone, Counters::default());
        let (mut made, end) = kind.start("made");
        end.send(Ok(7)).unwrap();
        assert_eq!(made.outcome(WAIT, "made").await.unwrap().unwrap(), 7);
        assert_eq!(*kind.made.lock().unwrap(), [7]);

        let (mut refused, end) = kind.start("refused");
        end.send(Err(StoreError::NotFound("gone".into()))).unwrap();
        let refused = refused.outcome(WAIT, "refused").await.unwrap();
        assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(kind.counters.failed.get(), 1);
        assert_eq!(kind.warned.lock().unwrap().len(), 1);

        // A job that dies is a failure its waiters are told of.
        let (mut died, end) = kind.start("died");
        drop(end);
        let died = died.outcome(WAIT, "died").await.unwrap().unwrap_err();
        assert_eq!(died.code, ErrorCode::Internal);
        assert!(
            died.message.starts_with("died: the mock task failed: "),
            "{}",
            died.message
        );
        assert_eq!(kind.counters.failed.get(), 2);
        assert_eq!(kind.counters.in_progress.get(), 0);
        // Ended, each job left the map: the same key starts afresh.
        until("the jobs to leave the map", || {
            kind.jobs.info(&"made").is_none()
        })
        .await;
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn every_kind_waits_for_the_slots_all_kinds_share() {
        let runner = runner(1);
        let clones = Kind::new(
            &runner,
            JobKind::Clone,
            Counters {
                slot_waits: Some(SlotWaits::default()),
                ..Counters::default()
            },
        );
        let snapshots = Kind::new(&runner, JobKind::Snapshot, Counters::default());
        let (mut snapshot, end_snapshot) = snapshots.start("snapshot");
        until("the snapshot job to work", || {
            snapshots.counters.in_progress.get() == 1
        })
        .await;
        // The one slot is the snapshot's: the clone waits, and says so.
        let (mut clone, end_clone) = clones.start("clone");
        let waits = clones.counters.slot_waits.clone().unwrap();
        until("the clone job to wait", || waits.waiting.get() == 1).await;
        assert_eq!(clones.counters.in_progress.get(), 0);
        assert!(clone.outcome(Duration::ZERO, "clone").await.is_none());

        end_snapshot.send(Ok(1)).unwrap();
        assert_eq!(
            snapshot.outcome(WAIT, "snapshot").await.unwrap().unwrap(),
            1
        );
        end_clone.send(Ok(2)).unwrap();
        assert_eq!(clone.outcome(WAIT, "clone").await.unwrap().unwrap(), 2);
        assert_eq!((waits.waited.get(), waits.waiting.get()), (1, 0));
    }

    #[tokio::test]
    async fn a_job_counts_and_logs_its_failures_but_not_its_cancellation() {
        let failed = Counter::default();
        let mut warned = Vec::new();
        let failure = || Ok(Err::<(), _>(StoreError::NotFound("gone".into())));

        let made = job_outcome(Ok(Ok(7)), false, &failed, format_args!("t"), |_| {
            panic!("nothing failed")
        });
        assert_eq!(made.unwrap(), 7);

        let cancelled = job_outcome(failure(), true, &failed, format_args!("t"), |e| {
            warned.push(e.to_string())
        });
        assert_eq!(cancelled.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(failed.get(), 0);
        assert!(warned.is_empty());

        let refused = job_outcome(failure(), false, &failed, format_args!("t"), |e| {
            warned.push(e.to_string())
        });
        assert_eq!(refused.unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(failed.get(), 1);
        assert_eq!(warned.len(), 1);

        let died: Result<(), _> = tokio::spawn(async { panic!("the task dies") }).await;
        let died = job_outcome::<()>(
            died.map(Ok),
            false,
            &failed,
            format_args!("snapshot s: the snapshot task"),
            |_| panic!("a dead task is no refusal"),
        );
        let died = died.unwrap_err();
        assert_eq!(died.code, ErrorCode::Internal);
        assert!(
            died.message
                .starts_with("snapshot s: the snapshot task failed: "),
            "{}",
            died.message
        );
        assert_eq!(failed.get(), 2);
    }
}
