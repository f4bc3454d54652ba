//! The capacity the agent has promised, over the real HTTPS API of the agent as a real
//! process on a temp export root: creates, growths and deletions move the figure in
//! `/v1/info` and the metrics, a restart counts it again from the records, and with
//! `limits.max_overcommit_ratio` set a create or growth past it is refused with 507
//! `overcommit_limit`, naming the figures and the setting, and makes nothing. Likewise
//! `limits.max_snapshot_bytes_per_namespace` bounds what a namespace's snapshots hold:
//! past it a snapshot is refused with 507 `snapshot_limit`, and the metrics show the sums.

mod common;

use common::agent_process::{Setup, setup};
use common::logged_agent::LoggedAgent;
use nfsprov_agent::init::files;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{
    CreateSnapshotRequest, CreateVolumeRequest, ErrorCode, Provisioning, Snapshot, SnapshotName,
    VolumeOwner, VolumePath,
};

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn request(capacity_bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        ..Default::default()
    }
}

/// The agent's settings with `key = value` in `[limits]`, in place of any there.
fn limit(setup: &Setup, key: &str, value: &str) {
    let file = setup.etc.join(files::CONFIG);
    let settings = std::fs::read_to_string(&file).unwrap();
    assert!(settings.contains("\n[limits]\n"), "{settings}");
    let kept: Vec<&str> = settings
        .lines()
        .filter(|line| !line.starts_with(&format!("{key} =")))
        .collect();
    let settings =
        kept.join("\n")
            .replacen("\n[limits]\n", &format!("\n[limits]\n{key} = {value}\n"), 1);
    std::fs::write(&file, settings).unwrap();
}

async fn started(setup: &Setup) -> (LoggedAgent, AgentClient) {
    let agent = LoggedAgent::spawn(setup);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    (agent, client)
}

async fn provisioning(client: &AgentClient) -> (Provisioning, u64) {
    let info = client.info(None).await.unwrap();
    let provisioning = info
        .provisioning
        .expect("the agent reports its provisioning");
    (provisioning, info.filesystem.total_bytes)
}

/// The value of the metric `name` (a line `name value`).
async fn metric(setup: &Setup, name: &str) -> f64 {
    let text = setup.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_resizes_and_deletes_move_the_figure_and_a_restart_counts_it_again() {
    let setup = setup();
    limit(&setup, "overcommit_warn_ratio", "1.5");
    let (agent, client) = started(&setup).await;
    let (empty, total) = provisioning(&client).await;
    assert_eq!(empty.provisioned_bytes, 0);
    assert_eq!(empty.overcommit_ratio, 0.0);
    assert_eq!((empty.warn_ratio, empty.max_ratio), (1.5, None));

    // Sparse volumes promise twice the filesystem: nothing refuses them without a maximum.
    client
        .create_volume(&path("a"), &request(total), None)
        .await
        .unwrap();
    client
        .create_volume(&path("team/b"), &request(total / 2), None)
        .await
        .unwrap();
    client
        .resize_volume(&path("team/b"), total, None)
        .await
        .unwrap();
    let (grown, _) = provisioning(&client).await;
    assert_eq!(grown.provisioned_bytes, 2 * total);
    assert_eq!(grown.overcommit_ratio, 2.0);
    assert!(grown.past_warning());
    assert_eq!(
        metric(&setup, "nfsprov_agent_provisioned_bytes").await,
        (2 * total) as f64
    );
    assert_eq!(metric(&setup, "nfsprov_agent_overcommit_ratio").await, 2.0);
    assert_eq!(
        metric(&setup, "nfsprov_agent_overcommit_warn_ratio").await,
        1.5
    );

    client.delete_volume(&path("a"), None).await.unwrap();
    let (deleted, _) = provisioning(&client).await;
    assert_eq!(deleted.provisioned_bytes, total);
    assert!(!deleted.past_warning());

    drop(agent);
    let (_agent, client) = started(&setup).await;
    let (restarted, _) = provisioning(&client).await;
    assert_eq!(
        restarted.provisioned_bytes, total,
        "counted again from the records"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn past_the_maximum_creates_and_growths_are_refused_and_make_nothing() {
    let setup = setup();
    limit(&setup, "max_overcommit_ratio", "1.5");
    let (_agent, client) = started(&setup).await;
    let (limits, total) = provisioning(&client).await;
    assert_eq!((limits.warn_ratio, limits.max_ratio), (1.0, Some(1.5)));
    client
        .create_volume(&path("a"), &request(total), None)
        .await
        .unwrap();

    let before = common::snapshot(&setup.root);
    let refused = client
        .create_volume(&path("team/big"), &request(total), None)
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(ErrorCode::OvercommitLimit),
        "{refused}"
    );
    assert!(refused.is_transient(), "retried later: {refused}");
    let message = refused.to_string();
    for part in [
        "507",
        "team/big",
        "limits.max_overcommit_ratio 1.5",
        &format!("{total} bytes are provisioned now"),
        &format!("filesystem's {total} bytes"),
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    let refused = client
        .resize_volume(&path("a"), 2 * total, None)
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(ErrorCode::OvercommitLimit),
        "{refused}"
    );
    assert_eq!(common::snapshot(&setup.root), before, "nothing made");
    assert_eq!(common::volume_paths(&client).await, ["a"]);
    let kept = client.get_volume(&path("a"), None).await.unwrap().unwrap();
    assert_eq!(
        kept.capacity_bytes, total,
        "the refused growth changed nothing"
    );
    assert_eq!(provisioning(&client).await.0.provisioned_bytes, total);

    // Up to the maximum is allowed, and freed capacity makes room again.
    client
        .create_volume(&path("team/big"), &request(total / 2), None)
        .await
        .unwrap();
    client.delete_volume(&path("a"), None).await.unwrap();
    client
        .resize_volume(&path("team/big"), total, None)
        .await
        .unwrap();
    assert_eq!(provisioning(&client).await.0.provisioned_bytes, total);
}

/// Takes the snapshot `name` of `source`, asking again while a copy runs.
async fn snapshot(client: &AgentClient, name: &str, source: &str) -> Result<Snapshot, ClientError> {
    let name = SnapshotName::parse(name).unwrap();
    let request = CreateSnapshotRequest {
        source: path(source),
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let taken = client.create_snapshot(&name, &request, None).await?;
        if taken.ready {
            return Ok(taken);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{name} never became ready"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_past_their_namespaces_limit_are_refused_and_the_metrics_show_the_sums() {
    const MIB: u64 = 1 << 20;
    let setup = setup();
    // Two snapshots of 1 MiB of data, with room for their metadata; not a third.
    limit(
        &setup,
        "max_snapshot_bytes_per_namespace",
        &(2 * MIB + MIB / 2).to_string(),
    );
    let (_agent, client) = started(&setup).await;
    for (volume, namespace) in [("team-a/app", "team-a"), ("team-b/app", "team-b")] {
        let request = CreateVolumeRequest {
            capacity_bytes: 10 * MIB,
            owner: VolumeOwner {
                pvc_namespace: Some(namespace.to_owned()),
                ..VolumeOwner::default()
            },
            ..Default::default()
        };
        client
            .create_volume(&path(volume), &request, None)
            .await
            .unwrap();
        std::fs::write(
            setup.root.join(volume).join("data"),
            vec![0x5a_u8; MIB as usize],
        )
        .unwrap();
    }
    let first = snapshot(&client, "a1", "team-a/app").await.unwrap();
    let second = snapshot(&client, "a2", "team-a/app").await.unwrap();
    let held = first.size_bytes.unwrap() + second.size_bytes.unwrap();
    let refused = snapshot(&client, "a3", "team-a/app").await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::SnapshotLimit), "{refused}");
    assert!(refused.is_transient(), "retried later: {refused}");
    let message = refused.to_string();
    for part in [
        "507",
        "namespace team-a",
        &format!("hold {held} bytes"),
        "limits.max_snapshot_bytes_per_namespace",
    ] {
        assert!(message.contains(part), "{part:?} not in {message:?}");
    }
    let absent = client
        .get_snapshot(&SnapshotName::parse("a3").unwrap(), None)
        .await
        .unwrap_err();
    assert_eq!(
        absent.code(),
        Some(ErrorCode::NotFound),
        "nothing of the refused snapshot: {absent}"
    );
    snapshot(&client, "b1", "team-b/app").await.unwrap();

    // Every family is declared once: two of one name make a scrape Prometheus refuses.
    let text = setup.metrics().await;
    let mut families: Vec<&str> = text
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|line| line.split(' ').next())
        .collect();
    let declared = families.len();
    families.sort_unstable();
    families.dedup();
    assert_eq!(
        families.len(),
        declared,
        "a family declared twice in:\n{text}"
    );
    let team_a = r#"nfsprov_agent_namespace_snapshot_bytes{namespace="team-a"}"#;
    assert_eq!(metric(&setup, team_a).await, held as f64);
    assert_eq!(
        metric(&setup, "nfsprov_agent_namespace_snapshot_bytes_limit").await,
        (2 * MIB + MIB / 2) as f64
    );
    // Deleting a snapshot gives its bytes back.
    client
        .delete_snapshot(&SnapshotName::parse("a1").unwrap(), None)
        .await
        .unwrap();
    assert_eq!(
        metric(&setup, team_a).await,
        second.size_bytes.unwrap() as f64
    );
    snapshot(&client, "a3", "team-a/app").await.unwrap();
}
