//! Volumes restored from archives over the real HTTPS API on real filesystems (root
//! required), one test per method: a copy on a plain directory, reflinks on a
//! loop-mounted XFS, a writable btrfs snapshot of the archived subvolume, a ZFS clone of
//! the archived dataset on a zfs-fuse pool. Each archives a volume holding a tree with
//! owners, modes, hard links, symlinks, holes and times, restores it twice and compares
//! each restore entry by entry with the tree as it was archived; the archive stays listed
//! and intact, and deleting it leaves the restores as they are (on ZFS also when the
//! retention sweep deletes it). Then hostile archive ids, a deletion racing a restore,
//! and a crash of the agent process during a copy restore.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent_process::setup;
use common::backing::{btrfs_agent, btrfs_or_skip, root_or_skip, xfs_or_skip};
use common::tree::{manifest, write_fixture, write_tree};
use common::zfs_pool::ZfsPool;
use nfsprov_agent::archive::retention::ArchiveSettings;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::{AgentClient, ClientError, CreateOutcome, RestoreOutcome};
use nfsprov_api_types::{
    ArchivePath, CloneMethod, CreateVolumeRequest, ErrorCode, QuotaPolicy, RestoreSource,
    RestoreVolumeRequest, VolumeOwner, VolumePath,
};

const GIB: u64 = 1 << 30;

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn owner(claim: &str) -> VolumeOwner {
    VolumeOwner {
        pvc_namespace: Some("team".into()),
        pvc_name: Some(claim.into()),
        pv_name: Some(format!("pvc-{claim}")),
    }
}

fn restore_request(
    archive: &ArchivePath,
    capacity_bytes: u64,
    quota: QuotaPolicy,
) -> RestoreVolumeRequest {
    RestoreVolumeRequest {
        quota,
        ..RestoreVolumeRequest::from_source(
            RestoreSource::Archive(archive.clone()),
            capacity_bytes,
            owner("restored"),
        )
    }
}

/// Repeats the restore request, as the controller does, until the agent says the volume
/// is there.
async fn restore_until_ready(
    client: &AgentClient,
    target: &VolumePath,
    request: &RestoreVolumeRequest,
) -> Result<CreateOutcome, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match client.restore_volume(target, request, None).await? {
            RestoreOutcome::Ready(outcome) => return Ok(outcome),
            RestoreOutcome::InProgress(progress) => {
                assert_eq!(Ok(progress.source), request.source());
                assert!(
                    Instant::now() < deadline,
                    "restore still running after 120 s"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

type Manifest = (BTreeMap<PathBuf, String>, Vec<Vec<PathBuf>>);

/// A tree's manifest with its root's mode and owner.
fn state_of(root: &Path) -> (Manifest, (u32, u32, u32)) {
    let meta = std::fs::metadata(root).unwrap();
    (manifest(root), (meta.mode(), meta.uid(), meta.gid()))
}

/// The id of the archive an archive request answered.
fn archive_id(archive_path: &str) -> ArchivePath {
    ArchivePath::parse(archive_path.strip_prefix(".archive/").unwrap()).unwrap()
}

/// An archive id of `team/source` that no archive has.
fn unknown_id() -> ArchivePath {
    ArchivePath::parse("team/source/@20000101T000000.000000000Z").unwrap()
}

/// The whole life of a restore from an archive on one filesystem: `team/source` is
/// archived, restored twice with `method`, and the archive deleted.
async fn archive_restore_life(
    agent: &TestAgent,
    root: &Path,
    quota: QuotaPolicy,
    method: CloneMethod,
) {
    let zfs = method == CloneMethod::ZfsClone;
    let client = agent.client();
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: 2 * GIB,
        owner: owner("source"),
        quota,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_tree(&root.join("team/source"), !zfs);
    let before = state_of(&root.join("team/source"));
    let archived = client
        .archive_volume(&source, Some(30), None)
        .await
        .unwrap();
    let id = archive_id(&archived.archive_path);
    let archive_dir = root.join(&archived.archive_path);
    assert_eq!(state_of(&archive_dir), before, "an archive only moves");

    // One archive, by its id: the capacity its volume had; an unknown id is not found.
    let described = client.get_archive(&id, None).await.unwrap();
    assert_eq!(described.id, id);
    assert_eq!(described.capacity_bytes, Some(2 * GIB));
    assert_eq!(described.retention_days, Some(30));
    assert_eq!(described.owner, owner("source"));
    let unknown = client.get_archive(&unknown_id(), None).await.unwrap_err();
    assert_eq!(unknown.code(), Some(ErrorCode::NotFound), "{unknown}");

    // A restore reads exactly the archived content.
    let request = restore_request(&id, 3 * GIB, quota);
    let restored = restore_until_ready(&client, &path("team/restored"), &request)
        .await
        .unwrap();
    assert!(restored.created);
    let origin = restored
        .volume
        .restore
        .clone()
        .expect("the restore says its origin");
    assert_eq!(origin.source, RestoreSource::Archive(id.clone()));
    assert_eq!(origin.method, method);
    assert_eq!(restored.volume.capacity_bytes, 3 * GIB);
    assert_eq!(restored.volume.owner, owner("restored"));
    assert_eq!(
        restored.volume.quota_enforced,
        quota == QuotaPolicy::Enforce
    );
    assert_eq!(state_of(&root.join("team/restored")), before);
    let found = client
        .get_volume(&path("team/restored"), None)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.restore, Some(origin));

    // The same request again finds it (200); another one at that path is a conflict.
    let repeated = common::call(
        agent,
        "POST",
        "/v1/restores/team/restored",
        Some(&serde_json::to_string(&request).unwrap()),
    );
    assert_eq!(repeated.status, 200, "{}", repeated.body);
    let other = restore_until_ready(
        &client,
        &path("team/restored"),
        &restore_request(&id, 4 * GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(other.code(), Some(ErrorCode::Conflict), "{other}");

    // Smaller than the archived volume, or of no archive: refused, nothing made.
    let small = restore_until_ready(
        &client,
        &path("team/small"),
        &restore_request(&id, GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(small.code(), Some(ErrorCode::InvalidBody), "{small}");
    assert!(small.to_string().contains("capacity"), "{small}");
    let nothing = restore_until_ready(
        &client,
        &path("team/nothing"),
        &restore_request(&unknown_id(), 3 * GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(nothing.code(), Some(ErrorCode::NotFound), "{nothing}");
    for refused in ["team/small", "team/nothing"] {
        assert!(!root.join(refused).exists(), "{refused} was not made");
    }

    // The archive is kept as it was, and restores again, here at the path it was made
    // of: a second restore is a volume of its own, and writing to it leaves the archive
    // and the first restore alone.
    let listed = client.list_archives(None).await.unwrap();
    assert_eq!(
        listed.iter().map(|a| &a.id).collect::<Vec<_>>(),
        [&id],
        "{listed:?}"
    );
    assert_eq!(listed[0].retention_days, Some(30));
    assert_eq!(client.get_archive(&id, None).await.unwrap(), listed[0]);
    assert_eq!(state_of(&archive_dir), before);
    let second = restore_until_ready(
        &client,
        &path("team/source"),
        &restore_request(&id, 2 * GIB, quota),
    )
    .await
    .unwrap();
    assert!(second.created);
    assert_eq!(state_of(&root.join("team/source")), before);
    std::fs::write(root.join("team/source/written"), b"a restore is writable").unwrap();
    std::fs::write(root.join("team/restored/data.bin"), b"changed").unwrap();
    assert_eq!(state_of(&archive_dir), before);
    let volumes = common::volume_paths(&client).await;
    assert_eq!(volumes, ["team/restored", "team/source"]);

    // The archive goes; its restores stay as they were, and no restore is made from it.
    let second_state = state_of(&root.join("team/source"));
    let restored_state = state_of(&root.join("team/restored"));
    client.delete_archive(&id, None).await.unwrap();
    let gone = client.get_archive(&id, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    assert!(client.list_archives(None).await.unwrap().is_empty());
    assert!(!archive_dir.exists());
    assert_eq!(state_of(&root.join("team/source")), second_state);
    assert_eq!(state_of(&root.join("team/restored")), restored_state);
    assert_eq!(
        std::fs::read(root.join("team/restored/data.bin")).unwrap(),
        b"changed"
    );
    assert_eq!(
        std::fs::read(root.join("team/source/written")).unwrap(),
        b"a restore is writable"
    );
    let after_delete = restore_until_ready(
        &client,
        &path("team/third"),
        &restore_request(&id, 2 * GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(after_delete.code(), Some(ErrorCode::NotFound));
    assert!(!root.join("team/third").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_directory_archive_is_restored_by_an_exact_copy() {
    let test = "a_plain_directory_archive_is_restored_by_an_exact_copy";
    if !root_or_skip(test, "restores") {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let probe = std::fs::File::open(root.path()).unwrap();
    if nfsprov_agent::store::reflink_supported(std::os::fd::AsFd::as_fd(&probe)) {
        nfsprov_test_skip::skip(
            test,
            "the temporary directory's filesystem shares extents; the XFS test covers reflinks",
        );
        return;
    }
    let agent = TestAgent::start(root.path()).await.unwrap();
    archive_restore_life(
        &agent,
        root.path(),
        QuotaPolicy::BestEffort,
        CloneMethod::Copy,
    )
    .await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_xfs_archive_is_restored_by_reflinks() {
    let test = "an_xfs_archive_is_restored_by_reflinks";
    if !root_or_skip(test, "restores") {
        return;
    }
    let Some(fs) = xfs_or_skip(test) else {
        return;
    };
    let agent = TestAgent::start(&fs.root()).await.unwrap();
    archive_restore_life(
        &agent,
        &fs.root(),
        QuotaPolicy::BestEffort,
        CloneMethod::Reflink,
    )
    .await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_btrfs_archive_is_restored_by_a_writable_snapshot() {
    let test = "a_btrfs_archive_is_restored_by_a_writable_snapshot";
    if !root_or_skip(test, "restores") {
        return;
    }
    let Some(fs) = btrfs_or_skip(test) else {
        return;
    };
    let root = fs.root();
    let agent = btrfs_agent(&root).await;
    archive_restore_life(
        &agent,
        &root,
        QuotaPolicy::Enforce,
        CloneMethod::BtrfsSnapshot,
    )
    .await;
    for restored in ["team/restored", "team/source"] {
        let meta = std::fs::metadata(root.join(restored)).unwrap();
        assert_eq!(meta.ino(), 256, "{restored} is a subvolume of its own");
    }
    assert_eq!(
        fs.qgroup_limit(&root.join("team/restored")).unwrap(),
        Some(3 * GIB),
        "the restore's quota is its own claim's capacity"
    );
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zfs_archive_is_restored_by_a_clone_that_outlives_it() {
    let test = "a_zfs_archive_is_restored_by_a_clone_that_outlives_it";
    let Some(pool) = ZfsPool::create(test) else {
        return;
    };
    let root = pool.export_root().to_owned();
    let agent = TestAgent::start_with_quota(&root, pool.quota_settings())
        .await
        .unwrap();
    archive_restore_life(&agent, &root, QuotaPolicy::Enforce, CloneMethod::ZfsClone).await;
    // The archive's dataset is gone, not held: its clones took over what they share.
    let datasets = pool.child_datasets();
    assert_eq!(
        datasets
            .iter()
            .filter(|d| d.starts_with(":archive:") || d.starts_with(":held:"))
            .count(),
        0,
        "{datasets:?}"
    );
    let client = agent.client();
    for volume in client.list_volumes(None).await.unwrap() {
        client.delete_volume(&volume.path, None).await.unwrap();
    }
    assert!(
        pool.child_datasets().is_empty(),
        "{:?}",
        pool.child_datasets()
    );
    let snapshots = pool.zfs(&[
        "list",
        "-H",
        "-o",
        "name",
        "-t",
        "snapshot",
        "-r",
        pool.dataset(),
    ]);
    assert!(snapshots.trim().is_empty(), "{snapshots}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zfs_archive_the_retention_sweep_deletes_leaves_its_restores() {
    let test = "a_zfs_archive_the_retention_sweep_deletes_leaves_its_restores";
    let Some(pool) = ZfsPool::create(test) else {
        return;
    };
    let root = pool.export_root().to_owned();
    // Kept until deleted by hand at first; restored from; then an agent whose default
    // retention has run out for every archive sweeps it.
    let keep = ArchiveSettings {
        default_retention: None,
        sweep_interval: Duration::from_millis(50),
    };
    let agent =
        TestAgent::start_with_archive(&root, pool.quota_settings(), Default::default(), keep)
            .await
            .unwrap();
    let client = agent.client();
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        quota: QuotaPolicy::Enforce,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_tree(&root.join("team/source"), false);
    let before = state_of(&root.join("team/source"));
    let archived = client.archive_volume(&source, None, None).await.unwrap();
    let id = archive_id(&archived.archive_path);
    let request = restore_request(&id, GIB, QuotaPolicy::Enforce);
    let made = restore_until_ready(&client, &path("team/restored"), &request)
        .await
        .unwrap();
    assert_eq!(made.volume.restore.unwrap().method, CloneMethod::ZfsClone);
    agent.stop().await.unwrap();

    let expire = ArchiveSettings {
        default_retention: Some(Duration::ZERO),
        sweep_interval: Duration::from_millis(50),
    };
    let agent =
        TestAgent::start_with_archive(&root, pool.quota_settings(), Default::default(), expire)
            .await
            .unwrap();
    let client = agent.client();
    let archive_dir = root.join(&archived.archive_path);
    common::wait_for(
        "the sweep to delete the expired archive",
        Duration::from_secs(60),
        || !archive_dir.exists(),
    )
    .await;
    assert!(client.list_archives(None).await.unwrap().is_empty());
    assert_eq!(state_of(&root.join("team/restored")), before);
    let datasets = pool.child_datasets();
    assert!(
        !datasets
            .iter()
            .any(|d| d.starts_with(":archive:") || d.starts_with(":held:")),
        "{datasets:?}"
    );
    let metrics = common::call(&agent, "GET", "/metrics", None).body;
    assert!(
        metrics.contains("nfsprov_agent_archives_expired_total 1\n")
            && metrics.contains("nfsprov_agent_archive_deletions_failed_total 0\n"),
        "{metrics}"
    );
    client
        .delete_volume(&path("team/restored"), None)
        .await
        .unwrap();
    assert!(
        pool.child_datasets().is_empty(),
        "{:?}",
        pool.child_datasets()
    );
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archive_ids_are_refused_before_anything_is_touched() {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let before = common::snapshot(root.path());
    for hostile in [
        "../../etc/@20260101T000000.000000000Z",
        "team/../../etc/@20260101T000000.000000000Z",
        "/team/source/@20260101T000000.000000000Z",
        ".archive/team/source/@20260101T000000.000000000Z",
        "team/source/@../../etc",
        "team/source",
        "team/source/@20260101T000000.000000000Z/..",
        "team/source/@20260101T000000.000000000Z\u{0}",
    ] {
        let body = serde_json::json!({"archive": hostile, "capacity_bytes": 1}).to_string();
        let restore = common::call(&agent, "POST", "/v1/restores/team/restored", Some(&body));
        assert_eq!(
            (restore.status, restore.code().as_str()),
            (400, "invalid_body"),
            "{hostile}: {}",
            restore.body
        );
    }
    for hostile in [
        "..%2F..%2Fetc%2F@20260101T000000.000000000Z",
        "team/../../etc/@20260101T000000.000000000Z",
        "team/source/@..",
        "team/source/plain",
        "team/source/@20260101T000000.000000000Z%00",
    ] {
        let answer = common::call(&agent, "GET", &format!("/v1/archives/{hostile}"), None);
        assert_eq!(
            (answer.status, answer.code().as_str()),
            (400, "invalid_path"),
            "GET {hostile}: {}",
            answer.body
        );
    }
    // Both sources, or none: not one restore.
    let both = common::call(
        &agent,
        "POST",
        "/v1/restores/team/restored",
        Some(
            r#"{"snapshot":"snap-1","archive":"team/source/@20260101T000000.000000000Z","capacity_bytes":1}"#,
        ),
    );
    assert_eq!((both.status, both.code().as_str()), (400, "invalid_body"));
    assert_eq!(common::snapshot(root.path()), before, "nothing was touched");
    agent.stop().await.unwrap();
}

/// The debug-build hold that keeps a finished copy from being placed while the test
/// holds its lock.
const HOLD_RESTORES: &str = "NFSPROV_AGENT_HOLD_RESTORES";

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_during_a_copy_restore_leaves_no_volume() {
    if !root_or_skip("a_crash_during_a_copy_restore_leaves_no_volume", "restores") {
        return;
    }
    let setup = setup();
    let hold = setup.hold(HOLD_RESTORES);
    let mut agent = setup.spawn_held(HOLD_RESTORES);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_fixture(&setup.root.join("team/source"));
    let before = state_of(&setup.root.join("team/source"));
    let archived = client.archive_volume(&source, None, None).await.unwrap();
    let id = archive_id(&archived.archive_path);

    let target = path("team/restored");
    let request = restore_request(&id, GIB, QuotaPolicy::BestEffort);
    match client
        .restore_volume(&target, &request, None)
        .await
        .unwrap()
    {
        RestoreOutcome::InProgress(progress) => {
            assert_eq!(progress.source, RestoreSource::Archive(id.clone()));
        }
        RestoreOutcome::Ready(outcome) => panic!("held, yet made: {outcome:?}"),
    }
    let staging = setup.root.join(".nfsprov/staging");
    common::wait_for(
        "the restore's copy in staging",
        Duration::from_secs(60),
        || !entries(&staging).is_empty(),
    )
    .await;
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert!(!setup.root.join("team/restored").exists());

    // Without the hold: a restart finds no volume there and clears what the copy left.
    drop(hold);
    let mut agent = setup.spawn_held(HOLD_RESTORES);
    setup.wait_healthy(&client).await;
    assert!(client.get_volume(&target, None).await.unwrap().is_none());
    assert!(common::volume_paths(&client).await.is_empty());
    common::wait_for(
        "the leftover to be removed",
        Duration::from_secs(60),
        || entries(&staging).is_empty(),
    )
    .await;
    // The archive is still there, whole, and the same request now makes the volume.
    assert_eq!(client.get_archive(&id, None).await.unwrap().id, id);
    assert_eq!(state_of(&setup.root.join(&archived.archive_path)), before);
    let made = restore_until_ready(&client, &target, &request)
        .await
        .unwrap();
    assert!(made.created);
    assert_eq!(state_of(&setup.root.join("team/restored")), before);
    let method = made.volume.restore.unwrap().method;
    let metrics = setup.metrics().await;
    let counted = format!(
        "nfsprov_agent_restores_total{{source=\"archive\",method=\"{}\"}} 1",
        method.as_str()
    );
    assert!(metrics.contains(&counted), "{counted}:\n{metrics}");
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_deleted_during_a_restore_goes_only_once_the_restore_is_made() {
    if !root_or_skip(
        "an_archive_deleted_during_a_restore_goes_only_once_the_restore_is_made",
        "restores",
    ) {
        return;
    }
    let setup = setup();
    let hold = setup.hold(HOLD_RESTORES);
    let mut agent = setup.spawn_held(HOLD_RESTORES);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_fixture(&setup.root.join("team/source"));
    let before = state_of(&setup.root.join("team/source"));
    let archived = client.archive_volume(&source, None, None).await.unwrap();
    let id = archive_id(&archived.archive_path);
    let target = path("team/restored");
    let request = restore_request(&id, GIB, QuotaPolicy::BestEffort);
    let running = client
        .restore_volume(&target, &request, None)
        .await
        .unwrap();
    assert!(matches!(running, RestoreOutcome::InProgress(_)), "held");

    // The deletion waits for the restore, which holds the archive's path.
    let mut deleting = tokio::spawn({
        let client = client.clone();
        let id = id.clone();
        async move { client.delete_archive(&id, None).await }
    });
    let waited = tokio::time::timeout(Duration::from_millis(500), &mut deleting).await;
    assert!(waited.is_err(), "deleted under a restore: {waited:?}");
    assert_eq!(client.get_archive(&id, None).await.unwrap().id, id);

    drop(hold);
    let made = restore_until_ready(&client, &target, &request)
        .await
        .unwrap();
    assert_eq!(state_of(&setup.root.join("team/restored")), before);
    assert_eq!(
        made.volume.restore.unwrap().source,
        RestoreSource::Archive(id.clone())
    );
    deleting.await.unwrap().unwrap();
    let gone = client.get_archive(&id, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    assert!(!setup.root.join(&archived.archive_path).exists());
    assert_eq!(state_of(&setup.root.join("team/restored")), before);
    agent.kill().unwrap();
    agent.wait().unwrap();
}
