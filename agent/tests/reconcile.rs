//! Start-up reconciliation of the record store with the disk, through the real binary:
//! a record whose volume a crash removed (a delete interrupted after the tree went) is
//! removed at the next start, counted in the metrics, and the path is free again.

mod common;

use common::agent_process::setup;
use common::volume_paths;
use nfsprov_api_types::{CreateVolumeRequest, VolumePath};

#[tokio::test]
async fn a_record_whose_volume_is_gone_is_removed_at_start_and_counted() {
    let setup = setup();
    let client = setup.client();
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 20,
        ..Default::default()
    };
    let gone = VolumePath::parse("team/gone").unwrap();
    let kept = VolumePath::parse("team/kept").unwrap();
    let mut agent = setup.spawn();
    setup.wait_healthy(&client).await;
    client.create_volume(&gone, &request, None).await.unwrap();
    client.create_volume(&kept, &request, None).await.unwrap();
    agent.kill().unwrap();
    agent.wait().unwrap();
    // What a crash during the delete left: the tree removed, the record not.
    std::fs::remove_dir(setup.root.join("team/gone")).unwrap();

    let mut agent = setup.spawn();
    setup.wait_healthy(&client).await;
    let metrics = setup.metrics().await;
    assert!(
        metrics
            .lines()
            .any(|line| line == "nfsprov_agent_stale_records_removed_total 1"),
        "{metrics}"
    );
    let listed = volume_paths(&client).await;
    assert_eq!(listed, ["team/kept"]);
    let again = client.create_volume(&gone, &request, None).await.unwrap();
    assert!(again.created);
    agent.kill().unwrap();
    agent.wait().unwrap();
}
