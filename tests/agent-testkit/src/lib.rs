//! Test support for the nfsprov agent, kept out of the agent's production build: a real
//! agent serving an export root over HTTPS ([`TestAgent`]), loop-mounted filesystems
//! ([`LoopBtrfs`] for the btrfs quota backend, [`LoopXfs`] with reflinks), a zfs-fuse
//! pool ([`ZfsPool`]), nfs-ganesha on a private D-Bus ([`ganesha`]), the power-cut check
//! ([`power_cut`]), and the benchmark binaries
//! (agent requests, clones, power cuts).

mod agent;
mod command;
mod filesystems;
pub mod ganesha;
pub mod power_cut;
mod zfs;

pub use agent::TestAgent;
pub use command::run;
pub use filesystems::{LoopBtrfs, LoopExt4, LoopXfs};
pub use zfs::{PoolError, ZfsPool};

use std::time::{Duration, Instant};

/// A loopback TCP port that was free a moment ago.
pub fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Polls `condition` every 20 ms until it holds or `limit` passes.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut condition: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return Ok(());
        }
        if Instant::now() >= deadline {
            anyhow::bail!("timed out after {limit:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
