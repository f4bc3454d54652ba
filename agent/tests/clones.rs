//! Clones over the real HTTPS API on real filesystems (root required): a plain directory
//! root, where the tree is copied (or reflinked where the filesystem shares extents), and
//! a loop-mounted btrfs, where a limited volume is snapshotted. Each clone is compared
//! entry by entry with its source: type, mode, owner, times, size, data, holes, extended
//! attributes, link targets and hard links.

mod common;

use common::backing::{btrfs_agent, btrfs_or_skip, root_or_skip};
use common::tree::{manifest, write_fixture};

use std::os::fd::AsFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{Duration, Instant};

use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::{AgentClient, ClientError, CloneOutcome, CreateOutcome};
use nfsprov_api_types::{
    CloneMethod, CloneVolumeRequest, CreateVolumeRequest, ErrorCode, QuotaPolicy, VolumeOwner,
    VolumePath,
};

const MIB: u64 = 1 << 20;

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

fn clone_request(source: &str, capacity_bytes: u64, quota: QuotaPolicy) -> CloneVolumeRequest {
    CloneVolumeRequest {
        source: path(source),
        capacity_bytes,
        owner: owner("copy"),
        quota,
        export: None,
    }
}

/// Repeats the clone request, as the controller does, until the agent says it is there.
async fn clone_until_ready(
    client: &AgentClient,
    target: &VolumePath,
    request: &CloneVolumeRequest,
) -> Result<CreateOutcome, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match client.clone_volume(target, request, None).await? {
            CloneOutcome::Ready(outcome) => return Ok(outcome),
            CloneOutcome::InProgress(progress) => {
                assert_eq!(progress.source, request.source);
                assert!(Instant::now() < deadline, "clone still running after 120 s");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

/// The clone holds exactly what the source holds, in files of its own.
fn assert_same_tree(source: &Path, clone: &Path) {
    let (source_entries, source_links) = manifest(source);
    let (clone_entries, clone_links) = manifest(clone);
    assert_eq!(source_entries, clone_entries);
    assert_eq!(source_links, clone_links, "hard links kept");
    let source_root = std::fs::metadata(source).unwrap();
    let clone_root = std::fs::metadata(clone).unwrap();
    assert_eq!(
        (source_root.mode(), source_root.uid(), source_root.gid()),
        (clone_root.mode(), clone_root.uid(), clone_root.gid()),
        "the root keeps its source's mode and owner"
    );
    // A snapshot keeps inode numbers, on a device of its own.
    let identity = |meta: std::fs::Metadata| (meta.dev(), meta.ino());
    assert_ne!(
        identity(std::fs::metadata(source.join("data.bin")).unwrap()),
        identity(std::fs::metadata(clone.join("data.bin")).unwrap()),
        "the clone's files are its own"
    );
}

/// The source changes nothing in the clone, the clone nothing in the source, and the
/// clone outlives its source.
async fn assert_independent(client: &AgentClient, root: &Path, source: &str, clone: &str) {
    std::fs::write(root.join(clone).join("data.bin"), b"changed in the clone").unwrap();
    std::fs::write(root.join(clone).join("new-file"), b"only in the clone").unwrap();
    let source_data = std::fs::read(root.join(source).join("data.bin")).unwrap();
    assert_eq!(source_data.len(), 100 * 1024, "the source is unchanged");
    assert!(!root.join(source).join("new-file").exists());
    client.delete_volume(&path(source), None).await.unwrap();
    assert!(!root.join(source).exists());
    assert_eq!(
        std::fs::read(root.join(clone).join("sub/deeper/deepest/leaf.txt")).unwrap(),
        b"three levels down",
        "the clone survives its source"
    );
    assert!(
        client
            .get_volume(&path(clone), None)
            .await
            .unwrap()
            .is_some()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_volume_is_copied_exactly_and_independently() {
    if !root_or_skip(
        "a_directory_volume_is_copied_exactly_and_independently",
        "clones",
    ) {
        return;
    }
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let client = agent.client();
    let source = CreateVolumeRequest {
        capacity_bytes: 2 << 30,
        owner: owner("source"),
        ..CreateVolumeRequest::default()
    };
    client
        .create_volume(&path("team/source"), &source, None)
        .await
        .unwrap();
    write_fixture(&root.path().join("team/source"));

    let request = clone_request("team/source", 2 << 30, QuotaPolicy::BestEffort);
    let made = clone_until_ready(&client, &path("team/copy"), &request)
        .await
        .unwrap();
    let origin = made
        .volume
        .clone
        .clone()
        .expect("the answer says what it was cloned from");
    assert_eq!(origin.source, path("team/source"));
    let probe = std::fs::File::open(root.path().join(".nfsprov/staging")).unwrap();
    let expected = if nfsprov_agent::store::reflink_supported(probe.as_fd()) {
        CloneMethod::Reflink
    } else {
        CloneMethod::Copy
    };
    assert_eq!(origin.method, expected);
    assert!(!made.volume.quota_enforced);
    assert_same_tree(
        &root.path().join("team/source"),
        &root.path().join("team/copy"),
    );
    assert!(
        std::fs::read_dir(root.path().join(".nfsprov/staging"))
            .unwrap()
            .next()
            .is_none(),
        "nothing is left in staging"
    );

    // The same request again confirms it; another source or a smaller size is refused.
    let again = clone_until_ready(&client, &path("team/copy"), &request)
        .await
        .unwrap();
    assert!(!again.created);
    assert_eq!(again.volume.clone, Some(origin));
    client
        .create_volume(&path("team/other"), &source, None)
        .await
        .unwrap();
    let refused = |target: &'static str, source: &'static str, capacity_bytes, quota| {
        let client = &client;
        async move {
            let request = clone_request(source, capacity_bytes, quota);
            clone_until_ready(client, &path(target), &request)
                .await
                .unwrap_err()
        }
    };
    let other = refused("team/copy", "team/other", 2 << 30, QuotaPolicy::BestEffort).await;
    assert_eq!(other.code(), Some(ErrorCode::Conflict), "{other}");
    let small = refused(
        "team/small",
        "team/source",
        1 << 30,
        QuotaPolicy::BestEffort,
    )
    .await;
    assert_eq!(small.code(), Some(ErrorCode::Unsupported), "{small}");
    assert!(
        small.to_string().contains("at least its capacity"),
        "{small}"
    );
    let missing = refused("team/none", "team/absent", 2 << 30, QuotaPolicy::BestEffort).await;
    assert_eq!(missing.code(), Some(ErrorCode::NotFound), "{missing}");
    let itself = refused(
        "team/source",
        "team/source",
        2 << 30,
        QuotaPolicy::BestEffort,
    )
    .await;
    assert_eq!(itself.code(), Some(ErrorCode::Unsupported), "{itself}");
    let enforce = refused(
        "team/enforced",
        "team/source",
        2 << 30,
        QuotaPolicy::Enforce,
    )
    .await;
    assert_eq!(enforce.code(), Some(ErrorCode::Unsupported), "{enforce}");
    for refused in ["team/small", "team/none", "team/enforced"] {
        assert!(
            !root.path().join(refused).exists(),
            "{refused} was not made"
        );
    }

    assert_independent(&client, root.path(), "team/source", "team/copy").await;
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limited_btrfs_volume_is_snapshotted_and_an_unlimited_one_reflinked() {
    let test = "a_limited_btrfs_volume_is_snapshotted_and_an_unlimited_one_reflinked";
    if !root_or_skip(test, "clones") {
        return;
    }
    let Some(fs) = btrfs_or_skip(test) else {
        return;
    };
    let root = fs.root();
    let agent = btrfs_agent(&root).await;
    let client = agent.client();
    for (name, quota) in [
        ("team/limited", QuotaPolicy::Enforce),
        ("team/unlimited", QuotaPolicy::Off),
    ] {
        let request = CreateVolumeRequest {
            capacity_bytes: 256 * MIB,
            owner: owner(name),
            quota,
            ..CreateVolumeRequest::default()
        };
        client
            .create_volume(&path(name), &request, None)
            .await
            .unwrap();
        write_fixture(&root.join(name));
    }

    let snapshot = clone_until_ready(
        &client,
        &path("team/snapshot"),
        &clone_request("team/limited", 512 * MIB, QuotaPolicy::Enforce),
    )
    .await
    .unwrap();
    let origin = snapshot.volume.clone.clone().unwrap();
    assert_eq!(origin.method, CloneMethod::BtrfsSnapshot);
    assert!(snapshot.volume.quota_enforced);
    assert_eq!(
        std::fs::metadata(root.join("team/snapshot")).unwrap().ino(),
        256,
        "the clone is a subvolume of its own"
    );
    assert_eq!(
        fs.qgroup_limit(&root.join("team/snapshot")).unwrap(),
        Some(512 * MIB),
        "the clone's quota is its own claim's capacity"
    );
    assert_same_tree(&root.join("team/limited"), &root.join("team/snapshot"));

    let reflinked = clone_until_ready(
        &client,
        &path("team/reflinked"),
        &clone_request("team/unlimited", 256 * MIB, QuotaPolicy::Off),
    )
    .await
    .unwrap();
    assert_eq!(
        reflinked.volume.clone.as_ref().unwrap().method,
        CloneMethod::Reflink,
        "btrfs shares extents with FICLONE"
    );
    assert_same_tree(&root.join("team/unlimited"), &root.join("team/reflinked"));

    assert_independent(&client, &root, "team/limited", "team/snapshot").await;
    assert_independent(&client, &root, "team/unlimited", "team/reflinked").await;
    agent.stop().await.unwrap();
}
