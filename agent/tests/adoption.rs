//! Adoption over real HTTPS: directories another provisioner made (nfs-subdir's
//! `<ns>-<claim>-<pv>` and pathPattern results) become volumes as they are, with nothing
//! inside read or changed, then behave like any volume; every refusal leaves the disk as
//! it was; a btrfs subvolume or directory is adopted without a quota and deleted without
//! touching one.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use common::{BindMount, bearer, call, curl, is_root, run, snapshot, url, volume_paths};
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::{LoopBtrfs, TestAgent};
use nfsprov_api_types::{AdoptVolumeRequest, ErrorCode, QuotaBackend, VolumeOwner, VolumePath};
use serde_json::json;

const LEGACY: &str = "default-data-pvc-0a1b2c3d";
const BODY: &str = r#"{"capacity_bytes":1073741824,"owner":{"pvc_namespace":"default","pvc_name":"data","pv_name":"pvc-0a1b2c3d"}}"#;

async fn agent() -> (tempfile::TempDir, TestAgent) {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    (root, agent)
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn adoption(claim: &str, capacity_bytes: u64) -> AdoptVolumeRequest {
    AdoptVolumeRequest {
        capacity_bytes,
        owner: VolumeOwner {
            pvc_namespace: Some("team".into()),
            pvc_name: Some(claim.into()),
            pv_name: Some(format!("pvc-{claim}")),
        },
        export: None,
    }
}

/// Everything about a tree that adoption must leave as it was: for each entry (the top
/// directory included) its kind, inode, mode, owner, size, modification and change times,
/// and a file's bytes or a link's target.
fn exact(top: &Path) -> BTreeMap<PathBuf, (String, Vec<u8>)> {
    let mut out = BTreeMap::new();
    let mut pending = vec![top.to_owned()];
    while let Some(entry) = pending.pop() {
        let meta = std::fs::symlink_metadata(&entry).unwrap();
        let content = if meta.file_type().is_symlink() {
            std::fs::read_link(&entry)
                .unwrap()
                .into_os_string()
                .into_encoded_bytes()
        } else if meta.is_file() {
            std::fs::read(&entry).unwrap()
        } else {
            Vec::new()
        };
        if meta.is_dir() {
            for child in std::fs::read_dir(&entry).unwrap() {
                pending.push(child.unwrap().path());
            }
        }
        let described = format!(
            "ino {} mode {:o} owner {}:{} size {} mtime {}.{} ctime {}.{}",
            meta.ino(),
            meta.mode(),
            meta.uid(),
            meta.gid(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.ctime(),
            meta.ctime_nsec()
        );
        out.insert(
            entry.strip_prefix(top).unwrap().to_owned(),
            (described, content),
        );
    }
    out
}

/// The bytes of every file beneath `top`.
fn contents(top: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    exact(top)
        .into_iter()
        .filter(|(entry, _)| top.join(entry).is_file() && !top.join(entry).is_symlink())
        .map(|(entry, (_, bytes))| (entry, bytes))
        .collect()
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// What nfs-subdir-external-provisioner leaves: a directory of the claim's user, with a
/// tree of that user's (and a second user's) files and a link.
fn legacy_tree(dir: &Path) {
    std::fs::create_dir_all(dir.join("db/wal")).unwrap();
    std::fs::write(dir.join("db/base"), vec![0x42u8; 70_000]).unwrap();
    std::fs::write(dir.join("db/wal/0001"), b"wal record").unwrap();
    std::fs::write(dir.join("README"), b"written by the app").unwrap();
    std::os::unix::fs::symlink("db/base", dir.join("current")).unwrap();
    for entry in [dir, &dir.join("db"), &dir.join("db/base")] {
        chown(entry, 1000, 1000);
    }
    chown(&dir.join("db/wal"), 1001, 1000);
    chown(&dir.join("db/wal/0001"), 1001, 1000);
    chmod(&dir.join("db/wal/0001"), 0o600);
    chmod(dir, 0o750);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_legacy_directory_is_adopted_as_it_is_and_then_behaves_like_any_volume() {
    if !is_root() {
        nfsprov_test_skip::skip(
            "a_legacy_directory_is_adopted_as_it_is_and_then_behaves_like_any_volume",
            "giving the directory another owner needs root",
        );
        return;
    }
    let (root, agent) = agent().await;
    let legacy = root.path().join(LEGACY);
    legacy_tree(&legacy);
    // A pathPattern result (`${.PVC.namespace}/${.PVC.name}`), below a plain directory.
    let patterned = root.path().join("team/postgres");
    legacy_tree(&patterned);
    let before = exact(&legacy);

    let adopted = call(
        &agent,
        "POST",
        &format!("/v1/adoptions/{LEGACY}"),
        Some(BODY),
    );
    assert_eq!(adopted.status, 201, "{adopted:?}");
    let volume = adopted.json();
    assert_eq!(volume["path"], LEGACY);
    assert_eq!(volume["mode"], "0750");
    assert_eq!(
        (volume["uid"].clone(), volume["gid"].clone()),
        (json!(1000), json!(1000))
    );
    assert_eq!(volume["capacity_bytes"], 1073741824u64);
    assert_eq!(volume["quota_enforced"], false);
    assert_eq!(
        volume["owner"],
        json!({"pvc_namespace":"default","pvc_name":"data","pv_name":"pvc-0a1b2c3d"})
    );
    assert_eq!(exact(&legacy), before, "adoption changed the tree");

    // Listed with its claim, and measured like any volume.
    let listed = call(&agent, "GET", "/v1/volumes", None);
    assert_eq!(listed.status, 200, "{listed:?}");
    let volumes = listed.json()["volumes"].as_array().unwrap().clone();
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert_eq!(volumes[0]["path"], LEGACY);
    assert_eq!(volumes[0]["owner"]["pvc_name"], "data");
    let got = call(&agent, "GET", &format!("/v1/volumes/{LEGACY}"), None);
    assert_eq!(got.status, 200, "{got:?}");
    assert_eq!(got.json()["usage"]["used_inodes"], 7, "{got:?}");
    assert!(got.json()["usage"]["used_bytes"].as_u64().unwrap() >= 70_000);

    // A retry is confirmed with the same answer; another claim or size is a conflict.
    let again = call(
        &agent,
        "POST",
        &format!("/v1/adoptions/{LEGACY}"),
        Some(BODY),
    );
    assert_eq!(again.status, 200, "{again:?}");
    assert_eq!(again.json(), volume);
    for (other, what) in [
        (BODY.replace("pvc-0a1b2c3d", "pvc-other"), "owner"),
        (BODY.replace("1073741824", "2147483648"), "capacity"),
    ] {
        let refused = call(
            &agent,
            "POST",
            &format!("/v1/adoptions/{LEGACY}"),
            Some(&other),
        );
        assert_eq!(
            (refused.status, refused.code()),
            (409, "conflict".to_owned()),
            "{what}: {refused:?}"
        );
        assert!(refused.body.contains(what), "{refused:?}");
    }
    // The typed client, on the pathPattern directory; then it is archived whole.
    let client = agent.client();
    let team = path("team/postgres");
    let outcome = client
        .adopt_volume(&team, &adoption("postgres", 1 << 30), Some("adopt-1"))
        .await
        .unwrap();
    assert!(outcome.created);
    assert_eq!(outcome.volume.mode.bits(), 0o750);
    assert_eq!((outcome.volume.uid, outcome.volume.gid), (1000, 1000));
    let retried = client
        .adopt_volume(&team, &adoption("postgres", 1 << 30), None)
        .await
        .unwrap();
    assert!(!retried.created);
    assert_eq!(retried.volume, outcome.volume);
    let conflict = client
        .adopt_volume(&team, &adoption("someone-else", 1 << 30), None)
        .await
        .unwrap_err();
    assert_eq!(conflict.code(), Some(ErrorCode::Conflict), "{conflict}");
    let patterned_before = (snapshot(&patterned), contents(&patterned));
    let archived = client.archive_volume(&team, Some(7), None).await.unwrap();
    assert!(!patterned.exists());
    let archive_dir = root.path().join(&archived.archive_path);
    assert_eq!(
        (snapshot(&archive_dir), contents(&archive_dir)),
        patterned_before,
        "the archive holds the tree as it was"
    );
    let [listed] = &client.list_archives(None).await.unwrap()[..] else {
        panic!("one archive");
    };
    assert_eq!(listed.path, team);
    assert_eq!(listed.owner.pvc_name.as_deref(), Some("postgres"));
    assert_eq!(listed.retention_days, Some(7));

    // Deleted through the trash like any volume; a second delete is still a success.
    let deleted = call(&agent, "DELETE", &format!("/v1/volumes/{LEGACY}"), None);
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert!(!legacy.exists());
    assert_eq!(
        call(&agent, "DELETE", &format!("/v1/volumes/{LEGACY}"), None).status,
        204
    );
    assert_eq!(
        call(&agent, "GET", &format!("/v1/volumes/{LEGACY}"), None).status,
        404
    );
    assert_eq!(
        std::fs::read_dir(root.path().join(".nfsprov/trash"))
            .unwrap()
            .count(),
        0
    );
    assert!(client.list_volumes(None).await.unwrap().is_empty());

    // Counted as an operation of its own, under a route template of its own.
    let metrics = curl(&agent, &["-H", &bearer(&agent), &url(&agent, "/metrics")]);
    for line in [
        r#"nfsprov_agent_volume_operations_total{operation="adopt",outcome="success"} 4"#,
        r#"nfsprov_agent_volume_operations_total{operation="adopt",outcome="rejected"} 3"#,
        r#"nfsprov_agent_http_requests_total{method="POST",route="/v1/adoptions/{*path}",status="201"} 2"#,
    ] {
        assert!(metrics.body.contains(line), "{line}\n{}", metrics.body);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn refusals_change_nothing_on_disk() {
    let (root, agent) = agent().await;
    let root = root.path();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("elsewhere")).unwrap();
    std::fs::write(outside.path().join("elsewhere/precious"), b"keep me").unwrap();
    std::os::unix::fs::symlink(outside.path().join("elsewhere"), root.join("escape")).unwrap();
    std::fs::create_dir(root.join("ns")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("ns/inner")).unwrap();
    std::fs::write(root.join("a-file"), b"not a directory").unwrap();
    let create = |p: &str| {
        let created = call(&agent, "PUT", &format!("/v1/volumes/{p}"), Some(BODY));
        assert_eq!(created.status, 201, "{created:?}");
    };
    create("vol");
    std::fs::create_dir(root.join("vol/inner")).unwrap();
    create("parent/child");
    std::fs::create_dir_all(root.join("deeper/a/b")).unwrap();
    create("deeper/a/b/c");
    let before = snapshot(root);
    let outside_before = snapshot(outside.path());

    let cases = [
        // What is not a directory of the export: a link (never followed), a file, nothing.
        ("escape", 400, "unsafe_path"),
        ("escape/precious", 400, "unsafe_path"),
        ("ns/inner", 400, "unsafe_path"),
        ("a-file", 409, "conflict"),
        ("missing", 404, "not_found"),
        ("no/such/parent", 404, "not_found"),
        // Nested either way.
        ("vol/inner", 409, "conflict"),
        ("parent", 409, "conflict"),
        ("deeper", 409, "conflict"),
        ("deeper/a", 409, "conflict"),
        // Hidden names and traversal never reach the store.
        (".nfsprov", 400, "invalid_path"),
        (".nfsprov/records", 400, "invalid_path"),
        (".nfsprov/trash", 400, "invalid_path"),
        (".archive", 400, "invalid_path"),
        ("..", 400, "invalid_path"),
        ("../etc", 400, "invalid_path"),
        ("ns/../..", 400, "invalid_path"),
        ("%2e%2e/x", 400, "invalid_path"),
        ("ns%2f..%2f..", 400, "invalid_path"),
        ("./vol", 400, "invalid_path"),
        ("ns//inner", 400, "invalid_path"),
        ("a%00b", 400, "invalid_path"),
    ];
    for (target, status, code) in cases {
        let refused = call(
            &agent,
            "POST",
            &format!("/v1/adoptions/{target}"),
            Some(BODY),
        );
        assert_eq!(
            (refused.status, refused.code()),
            (status, code.to_owned()),
            "{target}: {refused:?}"
        );
    }
    let nested = call(&agent, "POST", "/v1/adoptions/parent", Some(BODY));
    assert!(nested.body.contains("parent/child"), "{nested:?}");

    // Bodies: the directory's mode and owner are not asked for, and a capacity is needed.
    std::fs::create_dir(root.join("plain")).unwrap();
    let before = {
        let mut before = before;
        before.extend(
            snapshot(root)
                .into_iter()
                .filter(|(p, _)| p.starts_with("plain")),
        );
        before
    };
    for (body, status, code) in [
        (r#"{"capacity_bytes":1,"mode":"0777"}"#, 400, "invalid_body"),
        (r#"{"capacity_bytes":1,"uid":0}"#, 400, "invalid_body"),
        (r#"{"owner":{"pvc_name":"x"}}"#, 400, "invalid_body"),
        ("", 400, "invalid_body"),
    ] {
        let refused = call(&agent, "POST", "/v1/adoptions/plain", Some(body));
        assert_eq!(
            (refused.status, refused.code()),
            (status, code.to_owned()),
            "{body}: {refused:?}"
        );
    }
    // Only authenticated callers, only POST.
    let anonymous = curl(
        &agent,
        &[
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            BODY,
            &url(&agent, "/v1/adoptions/plain"),
        ],
    );
    assert_eq!(
        (anonymous.status, anonymous.code()),
        (401, "unauthenticated".to_owned()),
        "{anonymous:?}"
    );
    let wrong_token = curl(
        &agent,
        &[
            "-X",
            "POST",
            "-H",
            "Authorization: Bearer not-the-token",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            BODY,
            &url(&agent, "/v1/adoptions/plain"),
        ],
    );
    assert_eq!(wrong_token.status, 401, "{wrong_token:?}");
    let get = call(&agent, "GET", "/v1/adoptions/plain", None);
    assert_eq!(get.status, 405, "{get:?}");

    assert_eq!(snapshot(root), before, "a refusal changed the export root");
    assert_eq!(
        snapshot(outside.path()),
        outside_before,
        "a link was followed"
    );
    let listed = volume_paths(&agent.client()).await;
    assert_eq!(listed, ["deeper/a/b/c", "parent/child", "vol"]);
    // What was refused for being a plain directory is adoptable once asked for properly.
    let adopted = call(&agent, "POST", "/v1/adoptions/plain", Some(BODY));
    assert_eq!(adopted.status, 201, "{adopted:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_directory_at_holding_or_beneath_a_mount_point_is_not_adopted() {
    if !is_root() {
        nfsprov_test_skip::skip(
            "a_directory_at_holding_or_beneath_a_mount_point_is_not_adopted",
            "bind mounts need root",
        );
        return;
    }
    let (root, agent) = agent().await;
    let root = root.path();
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir(outside.path().join("inside")).unwrap();
    std::fs::write(outside.path().join("precious"), b"not the tenant's").unwrap();
    std::fs::create_dir_all(root.join("holding/mnt")).unwrap();
    std::fs::create_dir(root.join("bound")).unwrap();
    let holding_point = root.join("holding/mnt");
    let holding = BindMount::new(outside.path(), &holding_point);
    let bound_point = root.join("bound");
    let bound = BindMount::new(outside.path(), &bound_point);
    let before = snapshot(outside.path());

    for target in ["holding", "bound", "bound/inside"] {
        let refused = call(
            &agent,
            "POST",
            &format!("/v1/adoptions/{target}"),
            Some(BODY),
        );
        assert_eq!(
            (refused.status, refused.code()),
            (409, "conflict".to_owned()),
            "{target}: {refused:?}"
        );
        assert!(refused.body.contains("mount point"), "{refused:?}");
    }
    assert!(agent.client().list_volumes(None).await.unwrap().is_empty());
    assert_eq!(snapshot(outside.path()), before);

    drop(holding);
    drop(bound);
    let adopted = call(&agent, "POST", "/v1/adoptions/holding", Some(BODY));
    assert_eq!(adopted.status, 201, "after the unmount: {adopted:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn on_btrfs_a_directory_or_subvolume_is_adopted_without_a_quota_and_deleted_as_it_is() {
    if !is_root() {
        nfsprov_test_skip::skip(
            "on_btrfs_a_directory_or_subvolume_is_adopted_without_a_quota_and_deleted_as_it_is",
            "a loop-mounted btrfs needs root",
        );
        return;
    }
    let fs = LoopBtrfs::new(512, true).unwrap();
    let root = fs.root();
    std::fs::create_dir_all(root.join("legacy/sub")).unwrap();
    std::fs::write(root.join("legacy/sub/file"), vec![1u8; 100_000]).unwrap();
    // An operator may have made a claim's directory a subvolume of its own by hand.
    run(
        "btrfs",
        &["subvolume", "create", root.join("subvol").to_str().unwrap()],
    )
    .unwrap();
    std::fs::write(root.join("subvol/file"), vec![2u8; 100_000]).unwrap();
    let agent = TestAgent::start_with_quota(
        &root,
        QuotaSettings {
            backend: QuotaBackend::Btrfs,
            ..QuotaSettings::default()
        },
    )
    .await
    .unwrap();
    let client = agent.client();
    let info = client.info(None).await.unwrap();
    assert!(info.capabilities.quota_enforced);

    for (target, claim) in [("legacy", "a"), ("subvol", "b")] {
        let before = exact(&root.join(target));
        let outcome = client
            .adopt_volume(&path(target), &adoption(claim, 1 << 20), None)
            .await
            .unwrap();
        assert!(outcome.created, "{target}");
        assert!(
            !outcome.volume.quota_enforced,
            "{target}: adoption sets no quota, even where the agent could enforce one"
        );
        assert_eq!(exact(&root.join(target)), before, "{target}");
        let usage = client
            .get_volume(&path(target), None)
            .await
            .unwrap()
            .unwrap()
            .usage
            .expect("measured by a walk");
        assert!(usage.used_bytes >= 100_000, "{target}: {usage:?}");
    }
    fs.sync().unwrap();
    assert_eq!(
        fs.qgroup_limit(&root.join("subvol")).unwrap(),
        None,
        "no limit was set on the adopted subvolume"
    );

    for target in ["legacy", "subvol"] {
        client.delete_volume(&path(target), None).await.unwrap();
        assert!(!root.join(target).exists(), "{target}");
    }
    let subvolumes = fs.subvolumes().unwrap();
    assert!(
        !subvolumes.contains("subvol") && !subvolumes.contains("trash"),
        "the adopted subvolume is deleted as a subvolume: {subvolumes}"
    );
    assert_eq!(
        std::fs::read_dir(root.join(".nfsprov/trash"))
            .unwrap()
            .count(),
        0
    );
    // The agent holds the root open; stopped first, the filesystem can be unmounted.
    agent.stop().await.unwrap();
}
