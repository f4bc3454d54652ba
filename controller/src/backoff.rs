//! Per-object exponential backoff for the reconcilers' error policies.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Each consecutive failure of the same object doubles its wait, up to a maximum; a success
/// forgets it.
///
/// kube-runtime never reconciles an object once it is gone from the cache, so nothing says
/// "succeeded" for a claim deleted while it was still failing. Such entries are dropped
/// once they have gone `STALE_AFTER_MAX_WAITS` maximum waits without a failure: an object
/// that still exists and still fails is retried at least once per maximum wait, which
/// refreshes its entry.
#[derive(Debug)]
pub(crate) struct Backoff {
    base: Duration,
    max: Duration,
    state: Mutex<State>,
}

/// How many maximum waits an entry may go without a failure before it counts as the
/// entry of an object that is gone.
const STALE_AFTER_MAX_WAITS: u32 = 3;

#[derive(Debug)]
struct State {
    failures: HashMap<String, Failures>,
    /// The last time stale entries were looked for; at most once per maximum wait, so that
    /// a storm of failures stays linear.
    last_sweep: Instant,
}

#[derive(Debug, Clone, Copy)]
struct Failures {
    count: u32,
    last: Instant,
}

impl Backoff {
    pub(crate) fn new(base: Duration, max: Duration) -> Self {
        Self {
            base,
            max,
            state: Mutex::new(State {
                failures: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }

    /// Records a failure of `key` and returns how long to wait before the next attempt.
    pub(crate) fn failed(&self, key: &str) -> Duration {
        self.failed_at(key, Instant::now())
    }

    pub(crate) fn succeeded(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// How many objects currently have failures on record.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.lock().failures.len()
    }

    fn failed_at(&self, key: &str, now: Instant) -> Duration {
        let mut state = self.lock();
        let stale_after = self.max.saturating_mul(STALE_AFTER_MAX_WAITS);
        if now.saturating_duration_since(state.last_sweep) >= self.max {
            state
                .failures
                .retain(|_, f| now.saturating_duration_since(f.last) < stale_after);
            state.last_sweep = now;
        }
        let entry = state.failures.entry(key.to_owned()).or_insert(Failures {
            count: 0,
            last: now,
        });
        let delay = self
            .base
            .saturating_mul(2u32.saturating_pow(entry.count))
            .min(self.max);
        entry.count = entry.count.saturating_add(1);
        entry.last = now;
        delay
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is a cache of counters: one left half-updated by a panic is still usable.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(Duration::from_secs(1), Duration::from_secs(300))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: Duration = Duration::from_secs(1);
    const MAX: Duration = Duration::from_secs(300);

    #[test]
    fn waits_double_per_failure_up_to_the_maximum_and_success_resets_them() {
        let backoff = Backoff::new(BASE, MAX);
        let now = Instant::now();
        let waits: Vec<u64> = (0..11)
            .map(|_| backoff.failed_at("pvc/a/b", now).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        // Another object has its own count.
        assert_eq!(backoff.failed_at("pvc/a/c", now), BASE);
        backoff.succeeded("pvc/a/b");
        assert_eq!(backoff.failed_at("pvc/a/b", now), BASE);
    }

    #[test]
    fn entries_of_objects_that_stopped_failing_are_dropped() {
        let backoff = Backoff::new(BASE, MAX);
        let start = Instant::now();
        for i in 0..1000 {
            backoff.failed_at(&format!("pvc/ns/gone-{i}"), start);
        }
        // Still failing: retried at every maximum wait, so its entry keeps being refreshed.
        let mut now = start;
        for _ in 1..STALE_AFTER_MAX_WAITS {
            now += MAX;
            backoff.failed_at("pvc/ns/alive", now);
            assert_eq!(backoff.tracked(), 1001, "nothing is stale before its time");
        }
        now += MAX;
        backoff.failed_at("pvc/ns/alive", now);
        assert_eq!(
            backoff.tracked(),
            1,
            "only the object still failing is left"
        );
        assert_eq!(
            backoff.failed_at("pvc/ns/alive", now),
            BASE * 2u32.pow(STALE_AFTER_MAX_WAITS),
            "the object still failing kept its count"
        );
        // A deleted claim that comes back starts again from the base wait.
        assert_eq!(backoff.failed_at("pvc/ns/gone-7", now), BASE);
    }
}
