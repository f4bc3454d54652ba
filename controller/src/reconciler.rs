//! The one shape of every reconciled kind: what kube-runtime calls for an object (its
//! [`reconcile`] and [`error_policy`]), around the kind's own work, with per-object
//! backoff.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use tracing::warn;

use crate::context::{Context, Error};
use crate::objects::{
    CachedClaim, CachedVolume, claim_is_bound, claim_key, claim_state_key, volume_state_key,
};
use crate::{delete, expand, provision, schedules, snapshots};
use nfsprov_vocabulary::snapshots::{Snapshot, SnapshotSchedule};

/// A kind the controller reconciles: which work an object goes to, its key among the
/// per-object backoff, and how a failure is logged.
pub(crate) trait Reconciled: Send + Sync + 'static {
    /// The name of its controller in the logs.
    const CONTROLLER: &'static str;
    /// Whether a reconcile waits for the agents read from Secrets: no object is refused
    /// for an agent whose Secret is simply not read yet. Schedules talk to the API only
    /// (the Snapshots they make wait for the agents).
    const WAITS_FOR_AGENTS: bool;

    /// The key of its per-object backoff.
    fn backoff_key(&self) -> String;

    /// The kind's own work on this object.
    fn reconcile_object(&self, ctx: &Context)
    -> impl Future<Output = Result<Action, Error>> + Send;

    /// Logs a failed reconcile, tried again in `retry_in`.
    fn warn_failed(&self, error: &Error, retry_in: Duration);
}

/// Reconciles one object once this replica leads, forgetting its backoff on success.
pub(crate) async fn reconcile<K: Reconciled>(
    object: Arc<K>,
    ctx: Arc<Context>,
) -> Result<Action, Error> {
    ctx.leading().await;
    if K::WAITS_FOR_AGENTS {
        ctx.agents.ready().await;
    }
    let result = object.reconcile_object(&ctx).await;
    if result.is_ok() {
        ctx.backoff.succeeded(&object.backoff_key());
    }
    result
}

/// Retries a failed object after its next backoff delay.
pub(crate) fn error_policy<K: Reconciled>(
    object: Arc<K>,
    error: &Error,
    ctx: Arc<Context>,
) -> Action {
    let delay = ctx.backoff.failed(&object.backoff_key());
    object.warn_failed(error, delay);
    Action::requeue(delay)
}

/// A claim is provisioned when it is ours and unbound, and its volume expanded when it is
/// bound to one of ours and asks for more.
impl Reconciled for CachedClaim {
    const CONTROLLER: &'static str = "claim controller";
    const WAITS_FOR_AGENTS: bool = true;

    fn backoff_key(&self) -> String {
        claim_state_key(self)
    }

    async fn reconcile_object(&self, ctx: &Context) -> Result<Action, Error> {
        let pvc = self.to_claim();
        if claim_is_bound(&pvc) {
            expand::reconcile_bound_claim(&pvc, ctx).await
        } else {
            provision::reconcile_unbound_claim(&pvc, ctx).await
        }
    }

    fn warn_failed(&self, error: &Error, retry_in: Duration) {
        let work = if claim_is_bound(self) {
            "expansion"
        } else {
            "provisioning"
        };
        warn!(claim = %claim_key(self), %error, ?retry_in, "{work} failed");
    }
}

/// A released volume of ours whose reclaimPolicy is Delete is deleted (or archived).
impl Reconciled for CachedVolume {
    const CONTROLLER: &'static str = "volume controller";
    const WAITS_FOR_AGENTS: bool = true;

    fn backoff_key(&self) -> String {
        volume_state_key(self)
    }

    async fn reconcile_object(&self, ctx: &Context) -> Result<Action, Error> {
        delete::reconcile_volume(self, ctx).await
    }

    fn warn_failed(&self, error: &Error, retry_in: Duration) {
        warn!(volume = %self.name_any(), %error, ?retry_in, "deletion failed");
    }
}

/// A Snapshot is taken on its claim's agent, or deleted there.
impl Reconciled for Snapshot {
    const CONTROLLER: &'static str = "snapshot controller";
    const WAITS_FOR_AGENTS: bool = true;

    fn backoff_key(&self) -> String {
        snapshots::state_key(self)
    }

    async fn reconcile_object(&self, ctx: &Context) -> Result<Action, Error> {
        snapshots::reconcile_snapshot(self, ctx).await
    }

    fn warn_failed(&self, error: &Error, retry_in: Duration) {
        warn!(snapshot = %snapshots::state_key(self), %error, ?retry_in, "snapshot failed");
    }
}

/// A SnapshotSchedule is run when due, and what it made pruned.
impl Reconciled for SnapshotSchedule {
    const CONTROLLER: &'static str = "snapshot schedule controller";
    const WAITS_FOR_AGENTS: bool = false;

    fn backoff_key(&self) -> String {
        schedules::state_key(self)
    }

    async fn reconcile_object(&self, ctx: &Context) -> Result<Action, Error> {
        schedules::reconcile_schedule(self, ctx).await
    }

    fn warn_failed(&self, error: &Error, retry_in: Duration) {
        warn!(schedule = %schedules::state_key(self), %error, ?retry_in, "snapshot schedule failed");
    }
}
