//! Permanent provisioning failures already reported, so that a claim refused for what it or
//! its class asks gets one event and one failure count per version of both, however often
//! resyncs reconcile it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// After this long an unchanged claim's permanent failure is reported again; entries of
/// claims deleted meanwhile go with it.
const REPORT_AGAIN_AFTER: Duration = Duration::from_secs(24 * 60 * 60);

/// The permanent failures already reported, by claim: each one is reported (event and
/// metric) once per version of the claim and its class, whatever the resyncs.
#[derive(Debug)]
pub(crate) struct ReportedFailures {
    state: Mutex<ReportedState>,
}

#[derive(Debug)]
struct ReportedState {
    entries: HashMap<String, (String, Instant)>,
    last_sweep: Instant,
}

impl Default for ReportedFailures {
    fn default() -> Self {
        Self {
            state: Mutex::new(ReportedState {
                entries: HashMap::new(),
                last_sweep: Instant::now(),
            }),
        }
    }
}

impl ReportedFailures {
    /// Records `fingerprint` for `key`; true when it was not already the one on record.
    pub(crate) fn first_time(&self, key: &str, fingerprint: String) -> bool {
        let now = Instant::now();
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        // Claims deleted while failing are never reconciled again; their entries go here.
        if now.saturating_duration_since(state.last_sweep) >= REPORT_AGAIN_AFTER / 24 {
            state
                .entries
                .retain(|_, (_, at)| now.saturating_duration_since(*at) < REPORT_AGAIN_AFTER);
            state.last_sweep = now;
        }
        match state.entries.get(key) {
            Some((known, at))
                if *known == fingerprint
                    && now.saturating_duration_since(*at) < REPORT_AGAIN_AFTER =>
            {
                false
            }
            _ => {
                state.entries.insert(key.to_owned(), (fingerprint, now));
                true
            }
        }
    }

    /// Whether the failure on record for `key` was recorded under a fingerprint starting
    /// with `version` (and is still fresh): that version was refused already.
    pub(crate) fn holds_version(&self, key: &str, version: &str) -> bool {
        let state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        state.entries.get(key).is_some_and(|(known, at)| {
            known.starts_with(version) && at.elapsed() < REPORT_AGAIN_AFTER
        })
    }

    pub(crate) fn forget(&self, key: &str) {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .remove(key);
    }

    /// How many claims have a permanent failure on record.
    #[cfg(test)]
    pub(crate) fn tracked(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entries
            .len()
    }
}
