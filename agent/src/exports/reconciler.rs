//! The export reconciler: one task that keeps what the NFS server serves in step with
//! the agent's export table, so that a server or bus that was down, restarted or lost
//! an export is repaired without anyone asking.
//!
//! - **What it compares**: the table (the agent's records, one per exported volume)
//!   with what the server serves: ganesha's `ShowExports` (ids and paths), knfsd's
//!   exports file.
//! - **What it repairs**: exports the server lacks are added, exports interrupted
//!   half-way are set back to their record, exports in the agent's id range that no
//!   record names are withdrawn, and the exports of volumes found gone at start are
//!   withdrawn (see [`NfsServer::reconcile`](super::NfsServer::reconcile)).
//! - **What it reports**: each pass as a [`Pass`] to the caller's callback (the agent
//!   counts them in its metrics), and the outcome as [`Exports::health`]: degraded, with
//!   the reason, until a pass succeeds.
//!
//! A pass runs every interval when the server can be compared in one query (ganesha),
//! on demand after a change the server did not answer, and, while the exports are
//! degraded, every few seconds until one succeeds.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::server::Restored;
use super::table::Exports;

/// The longest wait between passes while the exports are degraded.
const DEGRADED_RETRY: Duration = Duration::from_secs(5);

/// One reconciliation pass, as reported.
#[derive(Debug, Clone)]
pub struct Pass {
    /// What was found and repaired, or why the pass could not finish.
    pub outcome: Result<Restored, String>,
    pub took: Duration,
}

impl Pass {
    /// How many exports the pass changed on the server.
    pub fn repairs(&self) -> usize {
        self.outcome
            .as_ref()
            .map_or(0, |r| r.added + r.repaired + r.removed)
    }
}

/// The reconciler of one export table.
pub struct Reconciler {
    exports: Arc<Exports>,
    interval: Duration,
}

impl Reconciler {
    /// A reconciler of `exports` comparing every `interval` (when the server compares
    /// cheaply; otherwise only after failures).
    pub fn new(exports: Arc<Exports>, interval: Duration) -> Self {
        Self { exports, interval }
    }

    /// Runs passes for as long as the returned task is not aborted, each reported to
    /// `report`.
    pub fn spawn(
        self,
        report: impl Fn(&Pass) + Send + Sync + 'static,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let degraded = self.exports.health().is_degraded();
                let wait = match (degraded, self.exports.compares_cheaply()) {
                    (true, _) => Some(self.interval.min(DEGRADED_RETRY)),
                    (false, true) => Some(self.interval),
                    (false, false) => None,
                };
                let woken = self.exports.wake.notified();
                match wait {
                    Some(wait) => {
                        let _ = tokio::time::timeout(wait, woken).await;
                    }
                    None => woken.await,
                }
                let pass = self.pass().await;
                report(&pass);
            }
        })
    }

    /// One pass now: waits for the change in progress, if any, then compares and
    /// repairs on the blocking pool (the server may take its time limit to answer).
    pub async fn pass(&self) -> Pass {
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
        let pass = Pass {
            outcome,
            took: started.elapsed(),
        };
        match &pass.outcome {
            Ok(restored) if pass.repairs() > 0 => tracing::info!(
                added = restored.added,
                repaired = restored.repaired,
                removed = restored.removed,
                kept = restored.kept,
                "exports repaired"
            ),
            Ok(_) => tracing::debug!(
                took_ms = pass.took.as_millis() as u64,
                "exports as recorded"
            ),
            // Said once when it begins; the retries while it lasts are for debugging.
            Err(reason) if !was_degraded => {
                tracing::warn!(%reason, "exports degraded: the NFS server could not be reconciled")
            }
            Err(reason) => tracing::debug!(%reason, "exports still degraded"),
        }
        pass
    }
}
