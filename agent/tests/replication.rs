//! Replicas between two real agents over real HTTPS (root required, for owners): a
//! snapshot of one agent received by the other file by file, restored there, and
//! compared entry by entry with the source as it was; a second snapshot received with
//! the first replica as its base sends only the files that changed. The grant that
//! lets the target read the snapshot reads that snapshot only, through the transfer
//! endpoints only, and not after it expires.

mod common;

use std::time::{Duration, Instant};

use common::agent_process::setup;
use common::backing::{btrfs_agent, btrfs_or_skip, root_or_skip, xfs_or_skip};
use common::jobs::restore_until_ready;
use common::tree::{manifest, write_fixture};
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::{AgentClient, ClientError};
use nfsprov_api_types::manifest::to_hex;
use nfsprov_api_types::{
    CreateSnapshotRequest, CreateTransferRequest, CreateVolumeRequest, ErrorCode, QuotaPolicy,
    ReceiveReplicaRequest, ReplicaOutcome, RestoreVolumeRequest, Snapshot, SnapshotMethod,
    SnapshotName, TransferGrant, VolumeOwner, VolumePath,
};

const GIB: u64 = 1 << 30;

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn name(n: &str) -> SnapshotName {
    SnapshotName::parse(n).unwrap()
}

fn owner(claim: &str) -> VolumeOwner {
    VolumeOwner {
        pvc_namespace: Some("team".into()),
        pvc_name: Some(claim.into()),
        pv_name: Some(format!("pvc-{claim}")),
    }
}

async fn snapshot_until_ready(
    client: &AgentClient,
    snapshot: &str,
    source: &VolumePath,
) -> Snapshot {
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let answer = client
            .create_snapshot(&name(snapshot), &request, None)
            .await
            .unwrap();
        if answer.ready {
            return answer;
        }
        assert!(Instant::now() < deadline, "snapshot not ready after 120 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Repeats the receive, as a controller would, until the replica is there.
async fn receive_until_ready(
    target: &AgentClient,
    replica: &str,
    request: &ReceiveReplicaRequest,
) -> Result<ReplicaOutcome, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let answer = target
            .receive_replica(&name(replica), request, None)
            .await?;
        if answer.snapshot.ready {
            return Ok(answer);
        }
        assert!(
            Instant::now() < deadline,
            "replica not received after 300 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn receive_request(
    source: &TestAgent,
    grant: TransferGrant,
    base: Option<&str>,
) -> ReceiveReplicaRequest {
    let ca = std::fs::read_to_string(
        source
            .credentials_dir()
            .join(nfsprov_agent::init::files::CA_CERT),
    )
    .unwrap();
    ReceiveReplicaRequest {
        source_url: source.connection().url,
        source_ca_pem: ca,
        grant,
        base: base.map(name),
    }
}

async fn restore(target: &AgentClient, replica: &str, volume: &VolumePath) {
    let request = RestoreVolumeRequest {
        snapshot: Some(name(replica)),
        archive: None,
        capacity_bytes: GIB,
        owner: owner("restored"),
        quota: QuotaPolicy::BestEffort,
        export: None,
    };
    restore_until_ready(target, volume, &request).await.unwrap();
}

fn grant_request(ttl_seconds: u64) -> CreateTransferRequest {
    CreateTransferRequest {
        ttl_seconds: Some(ttl_seconds),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_is_replicated_to_another_agent_exactly_and_then_only_what_changed() {
    let test = "a_snapshot_is_replicated_to_another_agent_exactly_and_then_only_what_changed";
    if !root_or_skip(test, "owners of the replicated tree") {
        return;
    }
    let source_root = tempfile::tempdir().unwrap();
    let target_root = tempfile::tempdir().unwrap();
    let source = TestAgent::start(source_root.path()).await.unwrap();
    let target = TestAgent::start(target_root.path()).await.unwrap();
    replicate_twice(&source, source_root.path(), &target, target_root.path()).await;
    source.stop().await.unwrap();
    target.stop().await.unwrap();
}

/// From an XFS agent (snapshots by reflink) to a btrfs agent with quotas (volumes are
/// subvolumes, a replica a plain tree beside its snapshots): the replica is restored as
/// a subvolume volume, and the second run takes unchanged files from the first by
/// reflink.
#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_of_an_xfs_agent_is_replicated_to_a_btrfs_agent() {
    let test = "a_snapshot_of_an_xfs_agent_is_replicated_to_a_btrfs_agent";
    if !root_or_skip(test, "owners of the replicated tree") {
        return;
    }
    let Some(xfs) = xfs_or_skip(test) else {
        return;
    };
    let Some(btrfs) = btrfs_or_skip(test) else {
        return;
    };
    let source = TestAgent::start(&xfs.root()).await.unwrap();
    let target = btrfs_agent(&btrfs.root()).await;
    replicate_twice(&source, &xfs.root(), &target, &btrfs.root()).await;
    source.stop().await.unwrap();
    target.stop().await.unwrap();
}

/// Replicates a tree of every kind of entry from `source` to `target`, twice: the second
/// time with the first replica as base, after changes; each replica restored on the
/// target and compared with the source as it was.
async fn replicate_twice(
    source: &TestAgent,
    source_root: &std::path::Path,
    target: &TestAgent,
    target_root: &std::path::Path,
) {
    let (from, to) = (source.client(), target.client());

    let volume = path("team/app");
    from.create_volume(
        &volume,
        &CreateVolumeRequest {
            capacity_bytes: GIB,
            owner: owner("app"),
            ..CreateVolumeRequest::default()
        },
        None,
    )
    .await
    .unwrap();
    let tree = source_root.join("team/app");
    write_fixture(&tree);
    let as_first = manifest(&tree);
    snapshot_until_ready(&from, "snap-1", &volume).await;

    // The first run sends everything.
    let grant = from
        .create_transfer(&name("snap-1"), &grant_request(600), None)
        .await
        .unwrap();
    let first = receive_until_ready(&to, "replica-1", &receive_request(source, grant, None))
        .await
        .unwrap();
    assert_eq!(first.snapshot.method, SnapshotMethod::Replica);
    assert_eq!(first.snapshot.source, volume);
    assert_eq!(first.reused_files, 0, "{first:?}");
    // data.bin and its hard link are one inode: fetched once.
    assert_eq!(first.fetched_files, 5, "{first:?}");
    restore(&to, "replica-1", &path("team/restored-1")).await;
    assert_eq!(manifest(&target_root.join("team/restored-1")), as_first);
    // The replica is a snapshot of the target like any other, outside every volume.
    let listed = to.get_snapshot(&name("replica-1"), None).await.unwrap();
    assert!(listed.ready);

    // Change one file, add one, remove one, rename one: the second run sends the
    // changed and the new file only; the renamed one is found in the base.
    std::fs::write(tree.join("sub/deeper/deepest/leaf.txt"), b"changed since").unwrap();
    std::fs::write(tree.join("added.txt"), b"new since the first run").unwrap();
    std::fs::remove_file(tree.join("empty")).unwrap();
    std::fs::rename(tree.join("private.txt"), tree.join("renamed.txt")).unwrap();
    let as_second = manifest(&tree);
    snapshot_until_ready(&from, "snap-2", &volume).await;
    let grant = from
        .create_transfer(&name("snap-2"), &grant_request(600), None)
        .await
        .unwrap();
    let request = receive_request(source, grant.clone(), Some("replica-1"));
    let second = receive_until_ready(&to, "replica-2", &request)
        .await
        .unwrap();
    assert_eq!(second.fetched_files, 2, "{second:?}");
    assert_eq!(
        second.fetched_bytes,
        ("changed since".len() + "new since the first run".len()) as u64
    );
    assert_eq!(second.reused_files, 3, "{second:?}");
    restore(&to, "replica-2", &path("team/restored-2")).await;
    assert_eq!(manifest(&target_root.join("team/restored-2")), as_second);
    // The first replica is as it was.
    assert_eq!(manifest(&target_root.join("team/restored-1")), as_first);

    // The same request again finds the replica made.
    let again = to
        .receive_replica(&name("replica-2"), &request, None)
        .await
        .unwrap();
    assert_eq!(again.snapshot, second.snapshot);
    assert_eq!(again.fetched_files, 0);
    // The name taken by this replica is not another's.
    let other = receive_request(source, grant, Some("replica-1"));
    let mut other = other;
    other.source_url = "https://127.0.0.1:1".into();
    let refused = to
        .receive_replica(&name("replica-2"), &other, None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Conflict), "{refused}");
}

/// The grant's token as a whole-agent client would use it.
fn client_with_token(agent: &TestAgent, token: &str, dir: &std::path::Path) -> AgentClient {
    let file = dir.join("grant-token");
    std::fs::write(&file, token).unwrap();
    AgentClient::new(&agent.token_connection(&file)).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_grant_reads_its_own_snapshot_through_the_transfer_endpoints_only_until_it_expires() {
    let test =
        "a_grant_reads_its_own_snapshot_through_the_transfer_endpoints_only_until_it_expires";
    if !root_or_skip(test, "snapshots") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let scratch = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let client = agent.client();
    for claim in ["mine", "other"] {
        let volume = path(&format!("team/{claim}"));
        client
            .create_volume(
                &volume,
                &CreateVolumeRequest {
                    capacity_bytes: GIB,
                    owner: owner(claim),
                    ..CreateVolumeRequest::default()
                },
                None,
            )
            .await
            .unwrap();
        std::fs::write(root.path().join(format!("team/{claim}/file")), claim).unwrap();
        snapshot_until_ready(&client, &format!("snap-{claim}"), &volume).await;
    }
    let ca = std::fs::read_to_string(
        agent
            .credentials_dir()
            .join(nfsprov_agent::init::files::CA_CERT),
    )
    .unwrap();
    let url = agent.connection().url;
    let grant = client
        .create_transfer(&name("snap-mine"), &grant_request(600), None)
        .await
        .unwrap();
    assert_eq!(grant.snapshot, name("snap-mine"));
    let debug = format!("{grant:?}");
    assert!(
        !debug.contains(&grant.token),
        "a grant prints its token: {debug}"
    );

    // It reads its snapshot.
    let transfer = AgentClient::for_transfer(&url, &ca, &grant, Duration::from_secs(30)).unwrap();
    let mut manifest = transfer.transfer_manifest(None).await.unwrap();
    let mut text = Vec::new();
    while let Some(chunk) = manifest.chunk().await.unwrap() {
        text.extend_from_slice(&chunk);
    }
    let text = String::from_utf8(text).unwrap();
    assert!(text.lines().next().unwrap().contains("snap-mine"), "{text}");
    assert!(text.lines().last().unwrap().contains("\"end\""), "{text}");
    let mut content = transfer
        .transfer_content(&to_hex(b"file"), None)
        .await
        .unwrap();
    let mut framed = Vec::new();
    while let Some(chunk) = content.chunk().await.unwrap() {
        framed.extend_from_slice(&chunk);
    }
    assert!(
        framed.windows(4).any(|w| w == b"mine"),
        "the file's data is in its frames"
    );

    // Nothing else: no path outside its snapshot, no other endpoint.
    for hostile in [
        to_hex(b"../other/file"),
        to_hex(b"/etc/passwd"),
        to_hex(b""),
        "zz".to_owned(),
    ] {
        let refused = transfer.transfer_content(&hostile, None).await.unwrap_err();
        assert_eq!(
            refused.code(),
            Some(ErrorCode::InvalidPath),
            "{hostile}: {refused}"
        );
    }
    let missing = transfer
        .transfer_content(&to_hex(b"no-such-file"), None)
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing}");
    let as_credential = client_with_token(&agent, &grant.token, scratch.path());
    let refused = as_credential.list_volumes(None).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::OutOfScope), "{refused}");
    let refused = as_credential
        .get_snapshot(&name("snap-other"), None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::OutOfScope), "{refused}");
    let refused = as_credential
        .create_transfer(&name("snap-other"), &grant_request(60), None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::OutOfScope), "{refused}");
    // And the agent's own credentials do not read a snapshot without a grant.
    let whole = TransferGrant {
        token: std::fs::read_to_string(
            agent
                .credentials_dir()
                .join(nfsprov_agent::init::files::TOKEN),
        )
        .unwrap()
        .trim()
        .to_owned(),
        ..grant.clone()
    };
    let without_grant =
        AgentClient::for_transfer(&url, &ca, &whole, Duration::from_secs(30)).unwrap();
    let refused = without_grant.transfer_manifest(None).await.unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::OutOfScope), "{refused}");

    // A grant ends when it expires.
    let short = client
        .create_transfer(&name("snap-mine"), &grant_request(1), None)
        .await
        .unwrap();
    let short_lived =
        AgentClient::for_transfer(&url, &ca, &short, Duration::from_secs(30)).unwrap();
    assert!(short_lived.transfer_manifest(None).await.is_ok());
    let deadline = Instant::now() + Duration::from_secs(10);
    let expired = loop {
        match short_lived.transfer_manifest(None).await {
            Err(e) => break e,
            Ok(_) => {
                assert!(
                    Instant::now() < deadline,
                    "a 1 s grant still reads after 10 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    assert_eq!(
        expired.code(),
        Some(ErrorCode::Unauthenticated),
        "{expired}"
    );
    // And when its snapshot is deleted.
    client
        .delete_snapshot(&name("snap-mine"), None)
        .await
        .unwrap();
    let refused = transfer.transfer_manifest(None).await.unwrap_err();
    assert_eq!(
        refused.code(),
        Some(ErrorCode::Unauthenticated),
        "{refused}"
    );
    // A receive with a grant the source refuses says so (this agent is its own source
    // here), and makes nothing.
    let receive = ReceiveReplicaRequest {
        source_url: url.clone(),
        source_ca_pem: ca.clone(),
        grant: grant.clone(),
        base: None,
    };
    let refused = client
        .receive_replica(&name("replica-refused"), &receive, None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidBody), "{refused}");
    assert!(
        refused.to_string().contains("refused the grant"),
        "{refused}"
    );
    let absent = client
        .get_snapshot(&name("replica-refused"), None)
        .await
        .unwrap_err();
    assert_eq!(absent.code(), Some(ErrorCode::NotFound), "{absent}");
    // A grant is only for a ready snapshot the caller can see.
    let refused = client
        .create_transfer(&name("snap-mine"), &grant_request(60), None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::NotFound), "{refused}");
    let refused = client
        .create_transfer(&name("snap-other"), &grant_request(0), None)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::InvalidBody), "{refused}");

    agent.stop().await.unwrap();
}

const HOLD_RECEIVES: &str = "NFSPROV_AGENT_HOLD_RECEIVES";

/// An agent process, killed (as a crash would) when dropped, also when the test fails.
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The target agent killed in the middle of a receive: the replica is not there after
/// its restart, and the same request then finishes it, fetching only the files the
/// first receive had not completed; a receive cut and never resumed goes with its
/// name's deletion.
#[tokio::test(flavor = "multi_thread")]
async fn a_receive_cut_by_a_crash_of_the_target_is_invisible_and_resumes_where_it_was() {
    let test = "a_receive_cut_by_a_crash_of_the_target_is_invisible_and_resumes_where_it_was";
    if !root_or_skip(test, "owners of the replicated tree") {
        return;
    }
    let source_root = tempfile::tempdir().unwrap();
    let source = TestAgent::start(source_root.path()).await.unwrap();
    let from = source.client();
    let volume = path("team/many");
    from.create_volume(
        &volume,
        &CreateVolumeRequest {
            capacity_bytes: GIB,
            owner: owner("many"),
            ..CreateVolumeRequest::default()
        },
        None,
    )
    .await
    .unwrap();
    let tree = source_root.path().join("team/many");
    for n in 0..20 {
        std::fs::write(
            tree.join(format!("file-{n:02}")),
            format!("content of {n}").repeat(100),
        )
        .unwrap();
    }
    let as_taken = manifest(&tree);
    snapshot_until_ready(&from, "snap-many", &volume).await;
    let grant = from
        .create_transfer(&name("snap-many"), &grant_request(600), None)
        .await
        .unwrap();
    let request = receive_request(&source, grant, None);

    let target = setup();
    let hold = target.hold(HOLD_RECEIVES);
    let agent = Killed(target.spawn_held(HOLD_RECEIVES));
    let to = target.client();
    target.wait_healthy(&to).await;
    let running = to
        .receive_replica(&name("replica-many"), &request, None)
        .await
        .unwrap();
    assert!(
        !running.snapshot.ready,
        "held: the replica is still being received"
    );
    assert_eq!(running.fetched_files, 1, "{running:?}");
    drop(agent);

    drop(hold);
    let agent = Killed(target.spawn());
    target.wait_healthy(&to).await;
    let gone = to
        .get_snapshot(&name("replica-many"), None)
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    let mut listed = Vec::new();
    to.for_each_snapshot_page(10, None, |page| listed.extend(page))
        .await
        .unwrap();
    assert!(
        listed.is_empty(),
        "a half-received replica is listed: {listed:?}"
    );

    let done = receive_until_ready(&to, "replica-many", &request)
        .await
        .unwrap();
    assert_eq!(done.fetched_files, 19, "{done:?}");
    assert_eq!(done.reused_files, 1, "{done:?}");
    restore(&to, "replica-many", &path("team/restored")).await;
    assert_eq!(manifest(&target.root.join("team/restored")), as_taken);
    drop(agent);

    // A receive cut and never resumed goes when its name is deleted.
    let hold = target.hold(HOLD_RECEIVES);
    let agent = Killed(target.spawn_held(HOLD_RECEIVES));
    target.wait_healthy(&to).await;
    let running = to
        .receive_replica(&name("replica-dropped"), &request, None)
        .await
        .unwrap();
    assert!(!running.snapshot.ready);
    drop(agent);
    drop(hold);
    let agent = Killed(target.spawn());
    target.wait_healthy(&to).await;
    let area = target.root.join(".nfsprov/snapshots/data");
    assert!(area.join(".receiving-replica-dropped").exists());
    to.delete_snapshot(&name("replica-dropped"), None)
        .await
        .unwrap();
    assert!(!area.join(".receiving-replica-dropped").exists());
    drop(agent);
    source.stop().await.unwrap();
}
