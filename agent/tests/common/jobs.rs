//! Repeating a clone or restore request, as the controller does, until the agent answers
//! that the volume is there.

use std::time::{Duration, Instant};

use nfsprov_api_types::client::{
    AgentClient, ClientError, CloneOutcome, CreateOutcome, RestoreOutcome,
};
use nfsprov_api_types::{CloneVolumeRequest, RestoreVolumeRequest, VolumePath};

const LIMIT: Duration = Duration::from_secs(120);

pub async fn clone_until_ready(
    client: &AgentClient,
    target: &VolumePath,
    request: &CloneVolumeRequest,
) -> Result<CreateOutcome, ClientError> {
    let deadline = Instant::now() + LIMIT;
    loop {
        match client.clone_volume(target, request, None).await? {
            CloneOutcome::Ready(outcome) => return Ok(outcome),
            CloneOutcome::InProgress(_) => {
                assert!(
                    Instant::now() < deadline,
                    "clone still running after {LIMIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

pub async fn restore_until_ready(
    client: &AgentClient,
    target: &VolumePath,
    request: &RestoreVolumeRequest,
) -> Result<CreateOutcome, ClientError> {
    let deadline = Instant::now() + LIMIT;
    loop {
        match client.restore_volume(target, request, None).await? {
            RestoreOutcome::Ready(outcome) => return Ok(outcome),
            RestoreOutcome::InProgress(_) => {
                assert!(
                    Instant::now() < deadline,
                    "restore still running after {LIMIT:?}"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}
