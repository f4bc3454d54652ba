//! Leader election on a `coordination.k8s.io/v1` Lease: only the leader reconciles.

use std::future::Future;

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tracing::{error, info};

#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    pub identity: String,
    pub duration_seconds: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    #[error("lease: {0}")]
    Lease(#[from] LeaseManagerError),
    #[error("lost the lease; stopped all work")]
    Lost,
    #[error("lease manager task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Waits for the lease, then runs `work` while holding it.
///
/// `work` must finish by itself once `shutdown` turns true; the lease is then released so a
/// standby replica takes over at once instead of after the lease expires. Losing the lease
/// drops `work` on the spot (cancelling every reconcile) and returns [`LeaderError::Lost`]:
/// a former leader must not keep acting, and restarting is the simplest way to rejoin.
pub async fn run_as_leader<Fut>(
    client: Client,
    settings: &LeaseSettings,
    shutdown: watch::Receiver<bool>,
    work: impl FnOnce() -> Fut,
) -> Result<(), LeaderError>
where
    Fut: Future<Output = ()>,
{
    run_standing_by(client, settings, shutdown, |mut leading| async move {
        if leading.wait_for(|leader| *leader).await.is_ok() {
            work().await;
        }
    })
    .await
}

/// Runs `work` from the start, telling it through the receiver it is given whether this
/// replica holds the lease (false until it does), so that it can prepare (fill its
/// caches) while standing by and act only once leading.
///
/// Shutdown while standing by drops `work` at once: it has done nothing that needs
/// finishing. Once leading, as [`run_as_leader`]: `work` finishes by itself on shutdown
/// and the lease is released, and losing the lease drops it on the spot and returns
/// [`LeaderError::Lost`].
pub async fn run_standing_by<Fut>(
    client: Client,
    settings: &LeaseSettings,
    mut shutdown: watch::Receiver<bool>,
    work: impl FnOnce(watch::Receiver<bool>) -> Fut,
) -> Result<(), LeaderError>
where
    Fut: Future<Output = ()>,
{
    // Renew well before expiry: a third of the duration, at least 2 s.
    let grace = (settings.duration_seconds / 3).max(2);
    let manager = LeaseManagerBuilder::new(client, &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration_seconds)
        .with_grace(grace)
        .build()
        .await?;
    let (mut leading, task) = manager.watch().await;
    // `work` gets a channel of its own: the manager releases the lease once every
    // receiver of its channel is dropped, which must not wait on clones inside `work`.
    let (tell_work, work_leading) = watch::channel(false);
    let mut work = Box::pin(work(work_leading));
    info!(lease = %settings.name, identity = %settings.identity, "waiting for the lease");
    loop {
        if *leading.borrow_and_update() {
            break;
        }
        tokio::select! {
            changed = leading.changed() => {
                if changed.is_err() {
                    // The manager task ended on its own: report why.
                    drop(work);
                    task.await??;
                    return Err(LeaderError::Lost);
                }
            }
            // The guard `wait_for` returns must not live across the awaits below.
            _ = async { drop(shutdown.wait_for(|stop| *stop).await) } => {
                drop(work);
                drop(leading);
                task.await??;
                return Ok(());
            }
            () = &mut work => {
                drop(leading);
                task.await??;
                return Ok(());
            }
        }
    }
    info!(lease = %settings.name, "acquired the lease; starting controllers");
    let _ = tell_work.send(true);
    let result = tokio::select! {
        _ = work => Ok(()),
        _ = async { drop(leading.wait_for(|leader| !*leader).await) } => {
            error!(lease = %settings.name, "lost the lease; stopping at once");
            Err(LeaderError::Lost)
        }
    };
    // Closing the channel makes the manager release the lease and stop.
    drop(leading);
    match task.await? {
        Ok(_) => info!(lease = %settings.name, "lease released"),
        Err(e) => error!(error = %e, "could not release the lease"),
    }
    result
}
