//! Snapshots and restores over the real HTTPS API on real filesystems (root required),
//! one test per method: a copy on a plain directory, reflinks on a loop-mounted XFS, a
//! read-only btrfs snapshot on a loop-mounted btrfs with quotas. Each takes a snapshot
//! of a tree with owners, modes, hard links, symlinks, holes and times, changes the
//! source, restores, and compares the restore entry by entry with the tree as it was.
//! Then the source goes (the snapshot and its restores stay) and the snapshot goes
//! (its data with it). A last test kills the agent process while a copy snapshot is
//! being made.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::agent_process::setup;
use common::backing::{btrfs_agent, btrfs_or_skip, root_or_skip, xfs_or_skip};
use common::tree::{manifest, write_fixture, write_tree};
use common::zfs_pool::ZfsPool;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::{AgentClient, ClientError, CreateOutcome, RestoreOutcome};
use nfsprov_api_types::{
    CloneMethod, CreateSnapshotRequest, CreateVolumeRequest, ErrorCode, QuotaPolicy, RestoreSource,
    RestoreVolumeRequest, Snapshot, SnapshotMethod, SnapshotName, VolumeOwner, VolumePath,
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

fn restore_request(
    snapshot: &str,
    capacity_bytes: u64,
    quota: QuotaPolicy,
) -> RestoreVolumeRequest {
    RestoreVolumeRequest {
        snapshot: Some(name(snapshot)),
        archive: None,
        capacity_bytes,
        owner: owner("restored"),
        quota,
        export: None,
    }
}

/// Repeats the snapshot request, as the controller does, until the snapshot is ready.
async fn snapshot_until_ready(
    client: &AgentClient,
    snapshot: &SnapshotName,
    source: &VolumePath,
) -> Result<Snapshot, ClientError> {
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let answer = client.create_snapshot(snapshot, &request, None).await?;
        assert_eq!(answer.name, *snapshot);
        assert_eq!(answer.source, *source);
        if answer.ready {
            return Ok(answer);
        }
        assert!(
            Instant::now() < deadline,
            "snapshot still being taken after 120 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Repeats the restore request until the agent says the volume is there.
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

/// Changes the source in every way a snapshot must not see.
fn change(volume: &Path) {
    std::fs::write(volume.join("data.bin"), b"changed after the snapshot").unwrap();
    std::fs::remove_file(volume.join("private.txt")).unwrap();
    std::fs::write(volume.join("new-file"), b"made after the snapshot").unwrap();
    std::fs::set_permissions(
        volume.join("shared"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
}

fn snapshot_data(root: &Path) -> PathBuf {
    root.join(".nfsprov/snapshots/data")
}

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

/// The whole life of a snapshot on one filesystem: taken with `method`, restored with
/// `restore_method`, outliving its source, then deleted.
async fn snapshot_life(
    agent: &TestAgent,
    root: &Path,
    quota: QuotaPolicy,
    method: SnapshotMethod,
    restore_method: CloneMethod,
) {
    let kept_by_zfs = method == SnapshotMethod::ZfsSnapshot;
    let trees: &[&str] = if kept_by_zfs { &[] } else { &["snap-1"] };
    let client = agent.client();
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: 2 * GIB,
        owner: owner("source"),
        quota,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_tree(&root.join("team/source"), !kept_by_zfs);
    let before = state_of(&root.join("team/source"));

    let snap = name("snap-1");
    let taken = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert_eq!(taken.method, method);
    assert_eq!(taken.restore_size_bytes, 2 * GIB);
    let size = taken
        .size_bytes
        .expect("a ready snapshot says its data bytes");
    assert!(
        (100 * 1024..64 << 20).contains(&size),
        "the data bytes count no holes: {size}"
    );
    assert_eq!(
        taken.exclusive_bytes.is_some(),
        method == SnapshotMethod::BtrfsSnapshot || kept_by_zfs,
        "exclusive bytes only where the filesystem counts them: {taken:?}"
    );
    let area = std::fs::metadata(root.join(".nfsprov/snapshots")).unwrap();
    assert_eq!(area.mode() & 0o777, 0o700, "only the agent enters the area");
    assert_eq!(entries(&snapshot_data(root)), trees);

    // The same request again finds it; the name of another source's is refused.
    let again = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert_eq!(again.created_at, taken.created_at);
    let repeated = common::call(
        agent,
        "PUT",
        "/v1/snapshots/snap-1",
        Some(r#"{"source":"team/source"}"#),
    );
    assert_eq!(repeated.status, 200, "{}", repeated.body);
    client
        .create_volume(&path("team/other"), &create, None)
        .await
        .unwrap();
    let taken_name = snapshot_until_ready(&client, &snap, &path("team/other"))
        .await
        .unwrap_err();
    assert_eq!(taken_name.code(), Some(ErrorCode::Conflict), "{taken_name}");
    let missing = snapshot_until_ready(&client, &name("snap-none"), &path("team/absent"))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing}");

    change(&root.join("team/source"));
    assert_ne!(state_of(&root.join("team/source")), before);

    // A restore reads exactly the snapshot's content.
    let request = restore_request("snap-1", 3 * GIB, quota);
    let restored = restore_until_ready(&client, &path("team/restored"), &request)
        .await
        .unwrap();
    assert!(restored.created);
    let origin = restored
        .volume
        .restore
        .clone()
        .expect("the restore says its origin");
    assert_eq!(origin.source, RestoreSource::Snapshot(snap.clone()));
    assert_eq!(origin.method, restore_method);
    assert_eq!(restored.volume.capacity_bytes, 3 * GIB);
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
    let repeat = restore_until_ready(&client, &path("team/restored"), &request)
        .await
        .unwrap();
    assert!(!repeat.created, "the same restore again finds it");

    // A restore smaller than the snapshot, of no snapshot, or over another restore.
    let small = restore_until_ready(
        &client,
        &path("team/small"),
        &restore_request("snap-1", GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(small.code(), Some(ErrorCode::InvalidBody), "{small}");
    assert!(small.to_string().contains("restore size"), "{small}");
    let nothing = restore_until_ready(
        &client,
        &path("team/nothing"),
        &restore_request("snap-none", 3 * GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(nothing.code(), Some(ErrorCode::NotFound), "{nothing}");
    for refused in ["team/small", "team/nothing"] {
        assert!(!root.join(refused).exists(), "{refused} was not made");
    }

    // Snapshots are neither volumes nor reachable through a volume path.
    let volumes = common::volume_paths(&client).await;
    assert_eq!(volumes, ["team/other", "team/restored", "team/source"]);
    let mut listed = Vec::new();
    client
        .for_each_snapshot_page(1, None, |page| listed.extend(page))
        .await
        .unwrap();
    // Exclusive bytes move as the source changes; everything else is as taken.
    let without_exclusive = |s: &Snapshot| Snapshot {
        exclusive_bytes: None,
        ..s.clone()
    };
    assert_eq!(
        listed.iter().map(without_exclusive).collect::<Vec<_>>(),
        [without_exclusive(&again)]
    );

    // The source goes: the snapshot and its restore stay, and restore again.
    client.delete_volume(&source, None).await.unwrap();
    let kept = client.get_snapshot(&snap, None).await.unwrap();
    assert!(kept.ready);
    assert_eq!(state_of(&root.join("team/restored")), before);
    let second = restore_until_ready(
        &client,
        &path("team/second"),
        &restore_request("snap-1", 2 * GIB, quota),
    )
    .await
    .unwrap();
    assert!(second.created);
    assert_eq!(state_of(&root.join("team/second")), before);
    std::fs::write(root.join("team/second/written"), b"a restore is writable").unwrap();

    // The snapshot goes: its data with it, its restores stay; gone again is fine.
    client.delete_snapshot(&snap, None).await.unwrap();
    let gone = client.get_snapshot(&snap, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    client.delete_snapshot(&snap, None).await.unwrap();
    assert!(entries(&snapshot_data(root)).is_empty());
    assert_eq!(state_of(&root.join("team/restored")), before);
    let after_delete = restore_until_ready(
        &client,
        &path("team/third"),
        &restore_request("snap-1", 2 * GIB, quota),
    )
    .await
    .unwrap_err();
    assert_eq!(after_delete.code(), Some(ErrorCode::NotFound));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_plain_directory_snapshot_is_an_exact_copy() {
    let test = "a_plain_directory_snapshot_is_an_exact_copy";
    if !root_or_skip(test, "snapshots") {
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
    assert!(
        agent
            .client()
            .info(None)
            .await
            .unwrap()
            .capabilities
            .snapshots
    );
    snapshot_life(
        &agent,
        root.path(),
        QuotaPolicy::BestEffort,
        SnapshotMethod::Copy,
        CloneMethod::Copy,
    )
    .await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn an_xfs_snapshot_shares_extents_by_reflink() {
    let test = "an_xfs_snapshot_shares_extents_by_reflink";
    if !root_or_skip(test, "snapshots") {
        return;
    }
    let Some(fs) = xfs_or_skip(test) else {
        return;
    };
    let agent = TestAgent::start(&fs.root()).await.unwrap();
    snapshot_life(
        &agent,
        &fs.root(),
        QuotaPolicy::BestEffort,
        SnapshotMethod::Reflink,
        CloneMethod::Reflink,
    )
    .await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_btrfs_volume_is_snapshotted_read_only() {
    let test = "a_btrfs_volume_is_snapshotted_read_only";
    if !root_or_skip(test, "snapshots") {
        return;
    }
    let Some(fs) = btrfs_or_skip(test) else {
        return;
    };
    let root = fs.root();
    let agent = btrfs_agent(&root).await;
    // The snapshot is a read-only subvolume of its own: nothing can change it.
    let client = agent.client();
    let watch = tokio::spawn({
        let data = snapshot_data(&root).join("snap-1");
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while !data.join("data.bin").exists() {
                assert!(Instant::now() < deadline, "no snapshot appeared");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let meta = std::fs::metadata(&data).unwrap();
            let written = std::fs::write(data.join("data.bin"), b"tampered");
            (meta.ino(), written.map_err(|e| e.raw_os_error()))
        }
    });
    snapshot_life(
        &agent,
        &root,
        QuotaPolicy::Enforce,
        SnapshotMethod::BtrfsSnapshot,
        CloneMethod::BtrfsSnapshot,
    )
    .await;
    let (ino, written) = watch.await.unwrap();
    assert_eq!(ino, 256, "the snapshot is a subvolume");
    assert_eq!(written, Err(Some(30)), "EROFS: the snapshot is read-only");
    assert_eq!(
        fs.qgroup_limit(&root.join("team/restored")).unwrap(),
        Some(3 * GIB),
        "the restore's quota is its own claim's capacity"
    );
    let subvolumes = fs.subvolumes().unwrap();
    assert!(
        !subvolumes.contains("snapshots/data"),
        "the deleted snapshot's subvolume is gone: {subvolumes}"
    );
    drop(client);
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zfs_volume_is_snapshotted_by_zfs_and_its_dataset_held_for_its_snapshots() {
    let test = "a_zfs_volume_is_snapshotted_by_zfs_and_its_dataset_held_for_its_snapshots";
    let Some(pool) = ZfsPool::create(test) else {
        return;
    };
    let root = pool.export_root().to_owned();
    let agent = TestAgent::start_with_quota(&root, pool.quota_settings())
        .await
        .unwrap();
    snapshot_life(
        &agent,
        &root,
        QuotaPolicy::Enforce,
        SnapshotMethod::ZfsSnapshot,
        CloneMethod::ZfsClone,
    )
    .await;
    let client = agent.client();
    let held = || {
        pool.child_datasets()
            .into_iter()
            .filter(|d| d.starts_with(":held:"))
            .count()
    };
    assert_eq!(held(), 0, "{:?}", pool.child_datasets());

    // The source of a snapshot nothing was restored from is deleted: its dataset is held
    // for the snapshot, out of the volumes' way, and the snapshot restores as it was.
    std::fs::write(root.join("team/other/kept.txt"), b"kept by the snapshot").unwrap();
    let other = path("team/other");
    let snap = name("snap-2");
    snapshot_until_ready(&client, &snap, &other).await.unwrap();
    std::fs::write(root.join("team/other/kept.txt"), b"changed").unwrap();
    client.delete_volume(&other, None).await.unwrap();
    assert!(!root.join("team/other").exists());
    assert_eq!(held(), 1, "{:?}", pool.child_datasets());
    assert!(client.get_snapshot(&snap, None).await.unwrap().ready);
    let from_held = restore_until_ready(
        &client,
        &path("team/from-held"),
        &restore_request("snap-2", 2 * GIB, QuotaPolicy::Enforce),
    )
    .await
    .unwrap();
    assert!(from_held.created);
    assert_eq!(
        std::fs::read(root.join("team/from-held/kept.txt")).unwrap(),
        b"kept by the snapshot"
    );
    // Its snapshot deleted, the held dataset goes too; the restore stays.
    client.delete_snapshot(&snap, None).await.unwrap();
    assert_eq!(held(), 0, "{:?}", pool.child_datasets());
    assert_eq!(
        std::fs::read(root.join("team/from-held/kept.txt")).unwrap(),
        b"kept by the snapshot"
    );

    // An archived source takes its snapshots along; they still restore.
    let snap = name("snap-3");
    snapshot_until_ready(&client, &snap, &path("team/from-held"))
        .await
        .unwrap();
    let archived = client
        .archive_volume(&path("team/from-held"), None, None)
        .await
        .unwrap();
    assert!(client.get_snapshot(&snap, None).await.unwrap().ready);
    let from_archive = restore_until_ready(
        &client,
        &path("team/from-archive"),
        &restore_request("snap-3", 2 * GIB, QuotaPolicy::Enforce),
    )
    .await
    .unwrap();
    assert!(from_archive.created);
    assert_eq!(
        std::fs::read(root.join("team/from-archive/kept.txt")).unwrap(),
        b"kept by the snapshot"
    );
    assert_eq!(
        std::fs::read(root.join(&archived.archive_path).join("kept.txt")).unwrap(),
        b"kept by the snapshot"
    );

    // Everything deleted, in an order that makes every rule work: nothing is left.
    client.delete_snapshot(&snap, None).await.unwrap();
    for archive in client.list_archives(None).await.unwrap() {
        client.delete_archive(&archive.id, None).await.unwrap();
    }
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

/// A tree whose data bytes differ from what a qgroup or dataset references (metadata,
/// a small file stored inline, a hole), so a size measured by a walk would not match.
fn write_sized_tree(volume: &Path) {
    std::fs::write(volume.join("data.bin"), vec![7u8; 3 << 20]).unwrap();
    for i in 0..200 {
        std::fs::write(volume.join(format!("small-{i}")), b"inline").unwrap();
    }
    let sparse = std::fs::File::create(volume.join("sparse")).unwrap();
    sparse.set_len(64 << 20).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_btrfs_snapshot_reports_its_qgroups_referenced_bytes() {
    let test = "a_btrfs_snapshot_reports_its_qgroups_referenced_bytes";
    if !root_or_skip(test, "snapshots") {
        return;
    }
    let Some(fs) = btrfs_or_skip(test) else {
        return;
    };
    let root = fs.root();
    let agent = btrfs_agent(&root).await;
    let client = agent.client();
    let source = path("team/sized");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        quota: QuotaPolicy::Enforce,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_sized_tree(&root.join("team/sized"));
    let snap = name("sized");
    let taken = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert_eq!(taken.method, SnapshotMethod::BtrfsSnapshot);
    fs.sync().unwrap();
    let (referenced, exclusive) = fs
        .qgroup_bytes(&snapshot_data(&root).join("sized"))
        .unwrap();
    assert!(
        referenced >= 3 << 20,
        "the qgroup counts the data: {referenced}"
    );
    assert_eq!(
        taken.size_bytes,
        Some(referenced),
        "size_bytes is the snapshot qgroup's referenced bytes"
    );
    // Read again, the record says the same; exclusive bytes are read afresh.
    let read = client.get_snapshot(&snap, None).await.unwrap();
    assert_eq!(read.size_bytes, Some(referenced));
    assert_eq!(read.exclusive_bytes, Some(exclusive));
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_zfs_snapshot_reports_its_referenced_and_used() {
    let test = "a_zfs_snapshot_reports_its_referenced_and_used";
    let Some(pool) = ZfsPool::create(test) else {
        return;
    };
    let root = pool.export_root().to_owned();
    let agent = TestAgent::start_with_quota(&root, pool.quota_settings())
        .await
        .unwrap();
    let client = agent.client();
    let source = path("team/sized");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        quota: QuotaPolicy::Enforce,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_sized_tree(&root.join("team/sized"));
    let snap = name("sized");
    let taken = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert_eq!(taken.method, SnapshotMethod::ZfsSnapshot);
    let full_name = format!("{}/team:sized@nfsprov-snapshot-sized", pool.dataset());
    let figure = |property: &str| -> u64 {
        pool.zfs(&["get", "-H", "-p", "-o", "value", property, &full_name])
            .trim()
            .parse()
            .unwrap()
    };
    let referenced = figure("referenced");
    assert!(
        referenced >= 3 << 20,
        "the snapshot references the data: {referenced}"
    );
    assert_eq!(taken.size_bytes, Some(referenced));
    assert_eq!(taken.exclusive_bytes, Some(figure("used")));
    let read = client.get_snapshot(&snap, None).await.unwrap();
    assert_eq!(read.size_bytes, Some(referenced));
    client.delete_snapshot(&snap, None).await.unwrap();
    client.delete_volume(&source, None).await.unwrap();
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_snapshot_names_are_refused() {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let body = r#"{"source":"team/source"}"#;
    for hostile in [
        "..",
        "..%2F..%2Fetc",
        "../records",
        ".stale-1",
        "-a",
        "UPPER",
        "a.b",
        "a%00b",
        "a/b",
        &"x".repeat(64),
    ] {
        for method in ["PUT", "GET", "DELETE"] {
            let body = (method == "PUT").then_some(body);
            let answer = common::call(&agent, method, &format!("/v1/snapshots/{hostile}"), body);
            assert_eq!(
                (answer.status, answer.code().as_str()),
                (400, "invalid_path"),
                "{method} {hostile}: {}",
                answer.body
            );
        }
    }
    let restore = common::call(
        &agent,
        "POST",
        "/v1/restores/team/restored",
        Some(r#"{"snapshot":"../../etc","capacity_bytes":1}"#),
    );
    assert_eq!(restore.status, 400, "{}", restore.body);
    assert_eq!(restore.code(), "invalid_body");
    assert!(!root.path().join("team/restored").exists());
    assert!(entries(&snapshot_data(root.path())).is_empty());
    agent.stop().await.unwrap();
}

/// The debug-build hold that keeps a finished copy from being placed while the test
/// holds its lock.
const HOLD_SNAPSHOTS: &str = "NFSPROV_AGENT_HOLD_SNAPSHOTS";

/// A volume `team/source` holding the fixture, on the agent of `setup`.
async fn source_volume(setup: &common::agent_process::Setup, client: &AgentClient) -> VolumePath {
    let source = path("team/source");
    let create = CreateVolumeRequest {
        capacity_bytes: GIB,
        ..CreateVolumeRequest::default()
    };
    client.create_volume(&source, &create, None).await.unwrap();
    write_fixture(&setup.root.join("team/source"));
    source
}

#[tokio::test(flavor = "multi_thread")]
async fn a_snapshot_deleted_while_being_made_is_never_ready() {
    if !root_or_skip(
        "a_snapshot_deleted_while_being_made_is_never_ready",
        "snapshots",
    ) {
        return;
    }
    let setup = setup();
    let hold = setup.hold(HOLD_SNAPSHOTS);
    let mut agent = setup.spawn_held(HOLD_SNAPSHOTS);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let source = source_volume(&setup, &client).await;
    let snap = name("snap-gone");
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let running = client.create_snapshot(&snap, &request, None).await.unwrap();
    assert!(!running.ready);
    assert_eq!(running.method, SnapshotMethod::Copy);
    client.delete_snapshot(&snap, None).await.unwrap();
    let gone = client.get_snapshot(&snap, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");

    // Let go: the job finds itself deleted and removes what it made.
    drop(hold);
    let data = snapshot_data(&setup.root);
    common::wait_for(
        "the deleted snapshot's copy to go",
        Duration::from_secs(60),
        || entries(&data).is_empty(),
    )
    .await;
    let gone = client.get_snapshot(&snap, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    let metrics = setup.metrics().await;
    assert!(
        metrics.contains("nfsprov_agent_snapshots_failed_total 0"),
        "a deleted snapshot is no failure:\n{metrics}"
    );
    // Taken again under the same name, it is made afresh.
    let taken = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert!(taken.ready);
    let metrics = setup.metrics().await;
    assert!(
        metrics.contains("nfsprov_agent_snapshots_total{method=\"copy\"} 1"),
        "{metrics}"
    );
    assert!(
        !metrics.contains("nfsprov_agent_snapshot_bytes_total 0\n"),
        "{metrics}"
    );
    agent.kill().unwrap();
    agent.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crash_during_a_copy_snapshot_leaves_no_snapshot() {
    if !root_or_skip(
        "a_crash_during_a_copy_snapshot_leaves_no_snapshot",
        "snapshots",
    ) {
        return;
    }
    let setup = setup();
    let hold = setup.hold(HOLD_SNAPSHOTS);
    let mut agent = setup.spawn_held(HOLD_SNAPSHOTS);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let source = source_volume(&setup, &client).await;

    let snap = name("snap-crash");
    let request = CreateSnapshotRequest {
        source: source.clone(),
    };
    let running = client.create_snapshot(&snap, &request, None).await.unwrap();
    assert!(!running.ready, "held: the snapshot is still being made");
    let pending = client.get_snapshot(&snap, None).await.unwrap();
    assert!(!pending.ready);
    let data = snapshot_data(&setup.root);
    common::wait_for(
        "the copy in the snapshot area",
        Duration::from_secs(60),
        || entries(&data).iter().any(|e| e.starts_with(".making")),
    )
    .await;
    agent.kill().unwrap();
    agent.wait().unwrap();

    // Without the hold: a restart finds no snapshot and clears what the copy left.
    drop(hold);
    let mut agent = setup.spawn_held(HOLD_SNAPSHOTS);
    setup.wait_healthy(&client).await;
    let gone = client.get_snapshot(&snap, None).await.unwrap_err();
    assert_eq!(gone.code(), Some(ErrorCode::NotFound), "{gone}");
    let mut listed = Vec::new();
    client
        .for_each_snapshot_page(10, None, |page| listed.extend(page))
        .await
        .unwrap();
    assert!(listed.is_empty(), "{listed:?}");
    common::wait_for(
        "the leftover to be removed",
        Duration::from_secs(60),
        || entries(&data).is_empty(),
    )
    .await;
    let taken = snapshot_until_ready(&client, &snap, &source).await.unwrap();
    assert_eq!(taken.method, SnapshotMethod::Copy);
    assert_eq!(entries(&data), ["snap-crash"]);
    agent.kill().unwrap();
    agent.wait().unwrap();
}
