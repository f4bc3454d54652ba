//! Repeating a call the agent answered as still running.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::ensure;

/// Repeats `call` until it answers something, as a client repeats a clone, snapshot or
/// restore the agent answered as still running.
pub(super) async fn until_ready<T, F, Fut>(what: &str, mut call: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Some(done) = call().await? {
            return Ok(done);
        }
        ensure!(Instant::now() < deadline, "{what} never finished");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
