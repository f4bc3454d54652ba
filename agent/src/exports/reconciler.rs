//! The agent's one periodic pass: one task that keeps what the NFS server serves in step
//! with the agent's export table, so that a server or bus that was down, restarted or
//! lost an export is repaired without anyone asking, and then runs the steps the layers
//! above hand it (each volume's condition) on the same schedule.
//!
//! - **What it compares**: the table (the agent's records, one per exported volume)
//!   with what the server serves: ganesha's `ShowExports` (ids and paths), knfsd's
//!   exports files.
//! - **What it repairs**: exports the server lacks are added, exports interrupted
//!   half-way are set back to their record, exports in the agent's id range that no
//!   record names are withdrawn, and the exports of volumes found gone at start are
//!   withdrawn (see [`NfsServer::reconcile`](super::NfsServer::reconcile)).
//! - **What it reports**: each pass as a [`Pass`] to the caller's callback (the agent
//!   counts them in its metrics), with the volumes whose exports were served again, and
//!   the outcome as [`Exports::health`]: degraded, with the reason, until a pass succeeds.
//! - **What rides on it**: each [`PassStep`] (the volumes' conditions) runs after the
//!   export comparison of every pass, with what that comparison found. Work of a later
//!   kind that must visit every volume or export on a schedule is one more step, not one
//!   more task.
//!
//! A pass runs every interval. Its export comparison runs in it when the server can be
//! compared in one query (ganesha), and otherwise (knfsd) only in passes woken after a
//! change the server did not answer or while the exports are degraded, when passes come
//! every few seconds until one succeeds. An agent without an export manager runs the
//! steps alone.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use super::server::Restored;
use super::table::Exports;

/// The longest wait between passes while the exports are degraded.
const DEGRADED_RETRY: Duration = Duration::from_secs(5);

/// One pass, as reported.
#[derive(Debug, Clone)]
pub struct Pass {
    /// What the export comparison found and repaired, or why it could not finish;
    /// `None` when this pass did not compare (no export manager, or a server that is
    /// compared only after failures).
    pub exports: Option<Result<Restored, String>>,
    /// When the pass began (the server's listing is as of then) and when its export
    /// comparison ended.
    pub started_at: SystemTime,
    pub compared_at: SystemTime,
    /// How long the export comparison took.
    pub took: Duration,
}

impl Pass {
    /// How many exports the pass changed on the server.
    pub fn repairs(&self) -> usize {
        match &self.exports {
            Some(Ok(r)) => r.added + r.repaired + r.removed,
            _ => 0,
        }
    }

    /// Whether the export comparison ran and could not finish.
    pub fn failed(&self) -> bool {
        matches!(self.exports, Some(Err(_)))
    }
}

/// Work that runs in every pass after the export comparison, on the blocking pool.
pub trait PassStep: Send + Sync + 'static {
    fn run(&self, pass: &Pass);
}

/// The agent's one periodic pass over its exports and volumes.
pub struct Reconciler {
    exports: Arc<Exports>,
    interval: Duration,
    steps: Vec<Arc<dyn PassStep>>,
}

impl Reconciler {
    /// A pass every `interval`, comparing `exports` with the server when it compares
    /// cheaply (otherwise only after failures).
    pub fn new(exports: Arc<Exports>, interval: Duration) -> Self {
        Self {
            exports,
            interval,
            steps: Vec::new(),
        }
    }

    /// `step` runs in every pass, after the steps given before it.
    #[must_use]
    pub fn with_step(mut self, step: Arc<dyn PassStep>) -> Self {
        self.steps.push(step);
        self
    }

    /// Runs passes for as long as the returned task is not aborted, each reported to
    /// `report` once its steps ran.
    pub fn spawn(
        self,
        report: impl Fn(&Pass) + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let degraded = self.exports.health().is_degraded();
                let wait = if degraded {
                    self.interval.min(DEGRADED_RETRY)
                } else {
                    self.interval
                };
                let woken = self.exports.wake.notified();
                let woken = tokio::time::timeout(wait, woken).await.is_ok();
                let compare = self.exports.kind().per_volume()
                    && (woken || degraded || self.exports.compares_cheaply());
                let pass = self.pass(compare).await;
                report(&pass);
            }
        })
    }

    /// One pass now: the export comparison when `compare` (after the change in
    /// progress, if any), then every step, all on the blocking pool (the server may
    /// take its time limit to answer).
    pub async fn pass(&self, compare: bool) -> Pass {
        let started_at = SystemTime::now();
        let started = Instant::now();
        let exports = if compare {
            Some(self.compare().await)
        } else {
            None
        };
        let pass = Pass {
            exports,
            started_at,
            compared_at: SystemTime::now(),
            took: started.elapsed(),
        };
        let steps = self.steps.clone();
        tokio::task::spawn_blocking(move || {
            for step in &steps {
                step.run(&pass);
            }
            pass
        })
        .await
        .unwrap_or_else(|error| {
            tracing::error!(%error, "a step of the periodic pass failed");
            Pass {
                exports: None,
                started_at,
                compared_at: SystemTime::now(),
                took: started.elapsed(),
            }
        })
    }

    /// The export comparison and repair: waits for the change in progress, if any.
    async fn compare(&self) -> Result<Restored, String> {
        let was_degraded = self.exports.health().is_degraded();
        let held = self.exports.hold().await;
        let exports = self.exports.clone();
        let started = Instant::now();
        let outcome = tokio::task::spawn_blocking(move || {
            let outcome = exports.reconcile(&held).map_err(|e| e.to_string());
            drop(held);
            outcome
        })
        .await
        .unwrap_or_else(|e| Err(format!("the reconciliation task failed: {e}")));
        match &outcome {
            Ok(restored) if restored.added + restored.repaired + restored.removed > 0 => {
                tracing::info!(
                    added = restored.added,
                    repaired = restored.repaired,
                    removed = restored.removed,
                    kept = restored.kept,
                    volumes = ?restored.re_added,
                    "exports repaired"
                )
            }
            Ok(_) => tracing::debug!(
                took_ms = started.elapsed().as_millis() as u64,
                "exports as recorded"
            ),
            // Said once when it begins; the retries while it lasts are for debugging.
            Err(reason) if !was_degraded => {
                tracing::warn!(%reason, "exports degraded: the NFS server could not be reconciled")
            }
            Err(reason) => tracing::debug!(%reason, "exports still degraded"),
        }
        outcome
    }
}
