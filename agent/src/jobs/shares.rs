//! Each credential's share of the jobs: a credential with `max_jobs` has at most that many
//! of its jobs (clones, snapshots and restores together) admitted at once, waiting or
//! running, so one cluster cannot take every slot the agent's clusters share. A request
//! past it starts nothing and is answered as a full queue is (429 `job_queue_full` with
//! `Retry-After`); a request that joins a job already admitted is never refused.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The jobs one credential has admitted, and how many it may.
#[derive(Debug, Clone)]
pub(crate) struct JobShare {
    credential: String,
    max: usize,
    admitted: Arc<AtomicUsize>,
}

/// One admitted job's part of its credential's share, given back when dropped.
#[derive(Debug)]
pub(super) struct ShareHold {
    admitted: Arc<AtomicUsize>,
}

impl JobShare {
    /// Takes one more of the share; refused (with why) when `max` jobs of the
    /// credential are in.
    pub(super) fn take(&self) -> Result<ShareHold, String> {
        self.admitted
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |admitted| {
                (admitted < self.max).then_some(admitted + 1)
            })
            .map_err(|_| {
                format!(
                    "credential {} has {} jobs admitted already (its max_jobs)",
                    self.credential, self.max
                )
            })?;
        Ok(ShareHold {
            admitted: self.admitted.clone(),
        })
    }
}

impl Drop for ShareHold {
    fn drop(&mut self) {
        self.admitted.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The shares of the credentials that have one, by name. A credential's counter outlives
/// a change of its limit, so jobs admitted before a change still count after it.
#[derive(Debug, Default)]
pub(crate) struct JobShares {
    /// Each credential's jobs admitted, and the `max_jobs` it last came with.
    admitted: Mutex<HashMap<String, (Arc<AtomicUsize>, usize)>>,
}

impl JobShares {
    /// The share of `credential`, whose `max_jobs` is `max`; `None` without a bound.
    pub(crate) fn share(&self, credential: &str, max: Option<usize>) -> Option<JobShare> {
        let max = max?;
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let entry = admitted
            .entry(credential.to_owned())
            .or_insert_with(|| (Arc::default(), max));
        entry.1 = max;
        let counter = entry.0.clone();
        Some(JobShare {
            credential: credential.to_owned(),
            max,
            admitted: counter,
        })
    }

    /// The jobs each credential with a share has admitted now, and its `max_jobs`.
    pub(crate) fn admitted(&self) -> Vec<(String, usize, usize)> {
        let admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        admitted
            .iter()
            .map(|(name, (counter, max))| (name.clone(), counter.load(Ordering::Acquire), *max))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_admits_up_to_its_max_and_gives_back_what_ends() {
        let shares = JobShares::default();
        assert!(shares.share("free", None).is_none());
        let share = shares.share("staging", Some(2)).unwrap();
        let first = share.take().unwrap();
        let _second = share.take().unwrap();
        let refused = share.take().unwrap_err();
        assert!(
            refused.contains("credential staging has 2 jobs"),
            "{refused}"
        );
        // Another request of the same credential sees the same count.
        assert!(shares.share("staging", Some(2)).unwrap().take().is_err());
        assert!(shares.share("production", Some(1)).unwrap().take().is_ok());
        drop(first);
        let _third = share.take().unwrap();
        let mut admitted = shares.admitted();
        admitted.sort();
        assert_eq!(
            admitted,
            vec![("production".into(), 0, 1), ("staging".into(), 2, 2)]
        );
    }
}
