//! End-to-end harness: the project's binaries run as real processes, a real NFS server
//! (nfs-ganesha) exports their export roots on loopback, and a real userspace NFS client
//! (libnfs-utils) reads and writes through it. Every process started here is stopped
//! when its handle is dropped, also when a test fails.

pub mod agent;
pub mod api_proxy;
pub mod binaries;
pub mod bind_shim;
pub mod cluster;
pub mod ganesha_dbus;
// libnfs is a C library: its bindings are the one place this crate needs `unsafe`.
#[allow(unsafe_code)]
pub mod libnfs;
pub mod nfs;
pub mod placement;
pub mod quota;
pub mod requirements;
pub mod system;

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
