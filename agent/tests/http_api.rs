//! The agent over real HTTPS on loopback, with a real export root in a temp dir, driven
//! by the real `curl` binary and the typed client.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use common::{bearer, call, curl, is_root, snapshot, url, volume_paths, wait_for};
use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, Mode, VolumePath};

async fn agent() -> (tempfile::TempDir, TestAgent) {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    (root, agent)
}

const BODY: &str = r#"{"mode":"0770","capacity_bytes":1048576,"owner":{"pvc_namespace":"ns","pvc_name":"claim","pv_name":"pvc-1"}}"#;

#[tokio::test(flavor = "multi_thread")]
async fn curl_probes_health_and_readiness() {
    let (_root, agent) = agent().await;
    for probe in ["/healthz", "/readyz"] {
        let result = curl(&agent, &[&url(&agent, probe)]);
        assert_eq!(result.status, 200, "{probe}: {result:?}");
        assert_eq!(result.json()["status"], "ok");
    }
}

/// Clears the immutable flag even when an assertion fails, so the temp dir can go.
struct Immutable<'a>(&'a std::path::Path);

impl Drop for Immutable<'_> {
    fn drop(&mut self) {
        let _ = std::process::Command::new("chattr")
            .arg("-i")
            .arg(self.0)
            .status();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn readiness_fails_with_a_reason_when_the_root_is_unwritable_or_gone() {
    let (root, agent) = agent().await;
    // The reason is for authenticated callers; anyone else learns only that it is not ready.
    let auth = bearer(&agent);
    let readyz = || curl(&agent, &["-H", &auth, &url(&agent, "/readyz")]);
    let anonymous = || curl(&agent, &[&url(&agent, "/readyz")]);

    // Root cannot write into an immutable directory: a real unwritable export.
    let chattr = std::process::Command::new("chattr")
        .arg("+i")
        .arg(root.path())
        .status()
        .unwrap();
    assert!(
        chattr.success(),
        "chattr +i must work on the test filesystem"
    );
    let guard = Immutable(root.path());
    wait_for(
        "readyz to report the unwritable root",
        Duration::from_secs(10),
        || {
            let r = readyz();
            r.status == 503
                && r.json()["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("not writable")
        },
    )
    .await;
    let told = anonymous();
    assert_eq!(told.status, 503);
    assert!(
        !told.body.contains(&root.path().display().to_string()),
        "the export path is not told to anyone: {told:?}"
    );
    drop(guard);
    wait_for("readyz to recover", Duration::from_secs(10), || {
        readyz().status == 200
    })
    .await;

    let moved = root.path().with_extension("moved");
    std::fs::rename(root.path(), &moved).unwrap();
    wait_for(
        "readyz to report the missing root",
        Duration::from_secs(10),
        || {
            let r = readyz();
            r.status == 503
                && r.json()["reason"]
                    .as_str()
                    .unwrap_or("")
                    .contains("missing")
        },
    )
    .await;
    // Mutations are refused too, rather than landing in the detached directory.
    let refused = call(&agent, "PUT", "/v1/volumes/late", Some(BODY));
    assert_eq!(
        (refused.status, refused.code()),
        (503, "not_ready".to_owned()),
        "{refused:?}"
    );
    assert!(!moved.join("late").exists());
    std::fs::rename(&moved, root.path()).unwrap();
    wait_for("readyz to recover", Duration::from_secs(10), || {
        readyz().status == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn only_authenticated_callers_get_in() {
    let (_root, agent) = agent().await;
    let info = url(&agent, "/v1/info");

    let none = curl(&agent, &[&info]);
    assert_eq!(
        (none.status, none.code()),
        (401, "unauthenticated".to_owned())
    );
    let wrong = curl(
        &agent,
        &["-H", "Authorization: Bearer not-the-token", &info],
    );
    assert_eq!(wrong.status, 401);
    let metrics = curl(&agent, &[&url(&agent, "/metrics")]);
    assert_eq!(metrics.status, 401);

    let token = curl(&agent, &["-H", &bearer(&agent), &info]);
    assert_eq!(token.status, 200, "{token:?}");
    assert_eq!(token.json()["nfs"]["server"], "127.0.0.1");

    let dir = agent.credentials_dir();
    let cert = curl(
        &agent,
        &[
            "--cert",
            dir.join(files::CONTROLLER_CERT).to_str().unwrap(),
            "--key",
            dir.join(files::CONTROLLER_KEY).to_str().unwrap(),
            &info,
        ],
    );
    assert_eq!(cert.status, 200, "{cert:?}");

    // A certificate from another CA fails the TLS handshake itself, token or not.
    let other = tempfile::tempdir().unwrap();
    init::run(&InitArgs {
        dir: other.path().to_owned(),
        export_root: "/srv".into(),
        hostnames: vec!["localhost".into()],
        ips: vec![],
        listen: "127.0.0.1:8443".into(),
        name: "other".into(),
        nfs_server: None,
        nfs_path: None,
        namespace: "nfsprov".into(),
        force: false,
        days: 1,
        // Test export roots are directories of a filesystem that holds more.
        shared_filesystem: true,
    })
    .unwrap();
    let foreign = curl(
        &agent,
        &[
            "--cert",
            other.path().join(files::CONTROLLER_CERT).to_str().unwrap(),
            "--key",
            other.path().join(files::CONTROLLER_KEY).to_str().unwrap(),
            "-H",
            &bearer(&agent),
            &info,
        ],
    );
    assert_eq!(foreign.status, 0, "{foreign:?}");
    assert_ne!(foreign.exit_code, 0, "{foreign:?}");

    // Plain HTTP gets no HTTP answer at all.
    let plain = curl(
        &agent,
        &[&format!("http://127.0.0.1:{}/healthz", agent.addr().port())],
    );
    assert_eq!(plain.status, 0, "{plain:?}");
    assert_ne!(plain.exit_code, 0, "{plain:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn rotated_token_takes_effect_without_restart() {
    let (_root, agent) = agent().await;
    let token_file = agent.credentials_dir().join(files::TOKEN);
    let old = bearer(&agent);
    let staged = token_file.with_extension("new");
    std::fs::write(&staged, "fresh-token-value\n").unwrap();
    std::fs::rename(&staged, &token_file).unwrap();
    let info = url(&agent, "/v1/info");
    // The file is watched off the request path: the new token takes over within seconds.
    wait_for(
        "the rotated token accepted",
        Duration::from_secs(30),
        || {
            curl(
                &agent,
                &["-H", "Authorization: Bearer fresh-token-value", &info],
            )
            .status
                == 200
        },
    )
    .await;
    assert_eq!(curl(&agent, &["-H", &old, &info]).status, 401);
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_paths_are_rejected_and_change_nothing() {
    let (root, agent) = agent().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"keep me").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
    std::fs::create_dir(root.path().join("ns")).unwrap();
    std::os::unix::fs::symlink(outside.path(), root.path().join("ns").join("inner")).unwrap();
    let before = snapshot(root.path());
    let outside_before = snapshot(outside.path());

    let long = "n".repeat(256);
    let cases: Vec<(String, &str)> = vec![
        ("/v1/volumes/..".into(), "invalid_path"),
        ("/v1/volumes/../../etc".into(), "invalid_path"),
        ("/v1/volumes/a/../../etc".into(), "invalid_path"),
        ("/v1/volumes//etc/passwd".into(), "invalid_path"),
        ("/v1/volumes/a//b".into(), "invalid_path"),
        ("/v1/volumes/./a".into(), "invalid_path"),
        ("/v1/volumes/a/.".into(), "invalid_path"),
        ("/v1/volumes/.nfsprov/trash".into(), "invalid_path"),
        ("/v1/volumes/.archive".into(), "invalid_path"),
        ("/v1/volumes/a%00b".into(), "invalid_path"),
        ("/v1/volumes/%2e%2e/x".into(), "invalid_path"),
        ("/v1/volumes/a%2f..%2fb".into(), "invalid_path"),
        ("/v1/volumes/%ff".into(), "invalid_path"),
        (format!("/v1/volumes/{long}"), "invalid_path"),
        ("/v1/volumes/escape".into(), "unsafe_path"),
        ("/v1/volumes/escape/x".into(), "unsafe_path"),
        ("/v1/volumes/ns/inner".into(), "unsafe_path"),
        ("/v1/volumes/ns/inner/deeper".into(), "unsafe_path"),
    ];
    for (path, code) in &cases {
        for method in ["PUT", "DELETE", "GET"] {
            let result = call(&agent, method, path, (method == "PUT").then_some(BODY));
            assert_eq!(result.status, 400, "{method} {path}: {result:?}");
            if method != "GET" || *code == "invalid_path" {
                assert_eq!(&result.code(), code, "{method} {path}");
            }
        }
        let archive = path.replace("/v1/volumes/", "/v1/archives/");
        let result = call(&agent, "POST", &archive, None);
        assert_eq!(
            (result.status, result.code()),
            (400, code.to_string()),
            "POST {archive}"
        );
    }
    assert_eq!(snapshot(root.path()), before, "the export root changed");
    assert_eq!(
        snapshot(outside.path()),
        outside_before,
        "the symlink target changed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_tree_removes_links_not_their_targets() {
    let (root, agent) = agent().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"keep me").unwrap();
    assert_eq!(
        call(&agent, "PUT", "/v1/volumes/vol", Some(BODY)).status,
        201
    );
    let vol = root.path().join("vol");
    std::fs::create_dir_all(vol.join("sub/deeper")).unwrap();
    std::os::unix::fs::symlink(outside.path(), vol.join("sub/link-to-dir")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("precious"), vol.join("link-to-file")).unwrap();
    std::fs::write(vol.join("sub/deeper/file"), b"x").unwrap();

    let deleted = call(&agent, "DELETE", "/v1/volumes/vol", None);
    assert_eq!(deleted.status, 204, "{deleted:?}");
    assert!(!vol.exists());
    assert_eq!(
        std::fs::read(outside.path().join("precious")).unwrap(),
        b"keep me"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    // Nothing left behind in the agent's own areas either.
    assert_eq!(
        std::fs::read_dir(root.path().join(".nfsprov/trash"))
            .unwrap()
            .count(),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_and_oversized_bodies_are_rejected() {
    let (root, agent) = agent().await;
    let before = snapshot(root.path());
    let cases = [
        ("{", "invalid_body"),
        ("[]", "invalid_body"),
        (r#"{"capacity_bytes":-1}"#, "invalid_body"),
        (r#"{"capacity_bytes":1,"mode":"0999"}"#, "invalid_body"),
        (r#"{"capacity_bytes":1,"mode":"17777"}"#, "invalid_body"),
        (r#"{"capacity_bytes":1,"uid":-5}"#, "invalid_body"),
        (r#"{"capacity_bytes":1,"surprise":true}"#, "invalid_body"),
        (r#"{"mode":"0777"}"#, "invalid_body"),
        ("", "invalid_body"),
    ];
    for (body, code) in cases {
        let result = call(&agent, "PUT", "/v1/volumes/v", Some(body));
        assert_eq!(
            (result.status, result.code()),
            (400, code.to_owned()),
            "{body:?}: {result:?}"
        );
    }
    let huge = format!(
        r#"{{"capacity_bytes":1,"owner":{{"pvc_name":"{}"}}}}"#,
        "x".repeat(200 * 1024)
    );
    let huge_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(huge_file.path(), huge).unwrap();
    let result = call(
        &agent,
        "PUT",
        "/v1/volumes/v",
        Some(&format!("@{}", huge_file.path().display())),
    );
    assert_eq!(
        (result.status, result.code()),
        (413, "payload_too_large".to_owned()),
        "{result:?}"
    );
    let form = curl(
        &agent,
        &[
            "-X",
            "PUT",
            "-H",
            &bearer(&agent),
            "-d",
            BODY,
            &url(&agent, "/v1/volumes/v"),
        ],
    );
    assert_eq!(form.status, 415, "{form:?}");
    assert_eq!(snapshot(root.path()), before);
}

/// A controller newer than the agent may send a quota policy the agent does not know: it
/// is refused as unsupported (a permanent answer naming the cause), and nothing is made.
#[tokio::test(flavor = "multi_thread")]
async fn a_quota_policy_newer_than_the_agent_is_refused_as_unsupported() {
    let (_root, agent) = agent().await;
    for (method, path, body) in [
        (
            "PUT",
            "/v1/volumes/v",
            r#"{"capacity_bytes":1,"quota":"strict"}"#,
        ),
        (
            "POST",
            "/v1/clones/v",
            r#"{"source":"src","capacity_bytes":1,"quota":"strict"}"#,
        ),
    ] {
        if method == "POST" {
            let made = call(
                &agent,
                "PUT",
                "/v1/volumes/src",
                Some(r#"{"capacity_bytes":1}"#),
            );
            assert_eq!(made.status, 201, "{made:?}");
        }
        let result = call(&agent, method, path, Some(body));
        assert_eq!(
            (result.status, result.code()),
            (422, "unsupported".to_owned()),
            "{method} {path}: {result:?}"
        );
        assert!(
            result.json()["message"]
                .as_str()
                .unwrap_or("")
                .contains("quota policy this agent does not know"),
            "{result:?}"
        );
    }
    let volumes = agent.client().list_volumes(None).await.unwrap();
    assert_eq!(
        volumes.iter().map(|v| v.path.as_str()).collect::<Vec<_>>(),
        ["src"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_without_an_export_manager_refuses_to_export_and_makes_nothing() {
    let (root, agent) = agent().await;
    let info = agent.client().info(None).await.unwrap();
    assert_eq!(info.capabilities.exports.as_str(), "none");
    let export = r#""export":{"clients":["127.0.0.2"],"squash":"all"}"#;
    let made = call(
        &agent,
        "PUT",
        "/v1/volumes/src",
        Some(r#"{"capacity_bytes":1}"#),
    );
    assert_eq!(made.status, 201, "{made:?}");
    for (method, path, body) in [
        (
            "PUT",
            "/v1/volumes/v",
            format!(r#"{{"capacity_bytes":1,{export}}}"#),
        ),
        (
            "POST",
            "/v1/adoptions/src",
            format!(r#"{{"capacity_bytes":1,{export}}}"#),
        ),
        (
            "POST",
            "/v1/clones/c",
            format!(r#"{{"source":"src","capacity_bytes":1,{export}}}"#),
        ),
        ("PUT", "/v1/exports/src", r#"{"clients":["*"]}"#.to_owned()),
    ] {
        let result = call(&agent, method, path, Some(&body));
        assert_eq!(
            (result.status, result.code()),
            (422, "unsupported".to_owned()),
            "{method} {path}: {result:?}"
        );
        assert!(
            result.json()["message"]
                .as_str()
                .unwrap_or("")
                .contains("no export manager"),
            "{result:?}"
        );
    }
    // A client spelling no NFS server takes is refused before anything else.
    let bad = call(
        &agent,
        "PUT",
        "/v1/exports/src",
        Some(r#"{"clients":["10.1.2.3/24"]}"#),
    );
    assert_eq!(
        (bad.status, bad.code()),
        (400, "invalid_body".to_owned()),
        "{bad:?}"
    );
    assert!(!root.path().join("v").exists());
    assert!(!root.path().join("c").exists());
    let volumes = agent.client().list_volumes(None).await.unwrap();
    assert_eq!(
        volumes
            .iter()
            .map(|v| (v.path.as_str(), v.export.is_some()))
            .collect::<Vec<_>>(),
        [("src", false)]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn create_applies_mode_and_ownership_exactly() {
    if !is_root() {
        nfsprov_test_skip::skip(
            "create_applies_mode_and_ownership_exactly",
            "setting ownership needs root",
        );
        return;
    }
    // Setgid and root owners are what the policy is opened for here.
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start_with(
        root.path(),
        Default::default(),
        nfsprov_agent::policy::Policy {
            allow_setgid: true,
            allow_root_owner: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    for (path, mode, uid, gid) in [
        ("a", 0o2775u32, 1234u32, 5678u32),
        ("b/c", 0o700, 65534, 0),
        ("d", 0o1777, 0, 100),
    ] {
        let body = format!(r#"{{"mode":"{mode:o}","uid":{uid},"gid":{gid},"capacity_bytes":10}}"#);
        let result = call(&agent, "PUT", &format!("/v1/volumes/{path}"), Some(&body));
        assert_eq!(result.status, 201, "{result:?}");
        let meta = std::fs::metadata(root.path().join(path)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, mode, "{path}");
        assert_eq!((meta.uid(), meta.gid()), (uid, gid), "{path}");
        assert_eq!(result.json()["mode"], format!("{mode:04o}"));
    }
    // Without a mode, the peers' default 0777 (not narrowed by the agent's umask).
    let result = call(
        &agent,
        "PUT",
        "/v1/volumes/e",
        Some(r#"{"capacity_bytes":1}"#),
    );
    assert_eq!(result.status, 201);
    let meta = std::fs::metadata(root.path().join("e")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o777);
}

#[tokio::test(flavor = "multi_thread")]
async fn creates_are_idempotent_and_conflicts_are_reported() {
    let (root, agent) = agent().await;
    let first = call(&agent, "PUT", "/v1/volumes/ns/claim", Some(BODY));
    assert_eq!(first.status, 201, "{first:?}");
    let again = call(&agent, "PUT", "/v1/volumes/ns/claim", Some(BODY));
    assert_eq!(again.status, 200);
    assert_eq!(
        again.json(),
        first.json(),
        "a retry reports the same volume"
    );

    for (change, what) in [
        (BODY.replace("0770", "0700"), "mode"),
        (BODY.replace("1048576", "2097152"), "capacity"),
        (BODY.replace("pvc-1", "pvc-2"), "owner"),
    ] {
        let result = call(&agent, "PUT", "/v1/volumes/ns/claim", Some(&change));
        assert_eq!(
            (result.status, result.code()),
            (409, "conflict".to_owned()),
            "{what}"
        );
        assert!(
            result.json()["message"].as_str().unwrap().contains(what),
            "{result:?}"
        );
    }
    // A create never takes over a directory the agent did not make.
    std::fs::create_dir(root.path().join("ns").join("foreign")).unwrap();
    let foreign = call(&agent, "PUT", "/v1/volumes/ns/foreign", Some(BODY));
    assert_eq!(foreign.status, 409, "{foreign:?}");
    assert_eq!(
        call(&agent, "DELETE", "/v1/volumes/ns/foreign", None).status,
        409
    );
    assert!(root.path().join("ns/foreign").is_dir());
    // A volume inside a volume is refused.
    assert_eq!(
        call(&agent, "PUT", "/v1/volumes/ns/claim/inner", Some(BODY)).status,
        409
    );

    let got = call(&agent, "GET", "/v1/volumes/ns/claim", None);
    assert_eq!(
        (got.status, got.json()["owner"]["pv_name"].clone()),
        (200, "pvc-1".into())
    );
    assert_eq!(call(&agent, "GET", "/v1/volumes/ns/none", None).status, 404);
    assert_eq!(
        call(&agent, "DELETE", "/v1/volumes/ns/claim", None).status,
        204
    );
    assert_eq!(
        call(&agent, "DELETE", "/v1/volumes/ns/claim", None).status,
        204
    );
    assert_eq!(
        call(&agent, "DELETE", "/v1/volumes/never/was", None).status,
        204
    );
    assert!(!root.path().join("ns/claim").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn archiving_twice_after_recreation_keeps_both_archives() {
    let (root, agent) = agent().await;
    let mut archives = Vec::new();
    for round in 0..2 {
        assert_eq!(
            call(&agent, "PUT", "/v1/volumes/team/data", Some(BODY)).status,
            201
        );
        std::fs::write(root.path().join("team/data/file"), format!("round {round}")).unwrap();
        let archived = call(&agent, "POST", "/v1/archives/team/data", None);
        assert_eq!(archived.status, 201, "{archived:?}");
        // A retry after success reports the same archive.
        let retried = call(&agent, "POST", "/v1/archives/team/data", None);
        assert_eq!(retried.status, 200);
        assert_eq!(retried.json(), archived.json());
        archives.push(archived.json()["archive_path"].as_str().unwrap().to_owned());
    }
    assert_ne!(archives[0], archives[1]);
    for (round, archive) in archives.iter().enumerate() {
        assert!(archive.starts_with(".archive/team/data/@"), "{archive}");
        let content = std::fs::read_to_string(root.path().join(archive).join("file")).unwrap();
        assert_eq!(content, format!("round {round}"));
    }
    assert!(!root.path().join("team/data").exists());
    let never = call(&agent, "POST", "/v1/archives/team/other", None);
    assert_eq!((never.status, never.code()), (404, "not_found".to_owned()));
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_mixed_requests_leave_a_consistent_tree() {
    let (root, agent) = agent().await;
    let client = agent.client();
    let paths: Vec<VolumePath> = ["p/a", "p/b", "q", "p/c/d", "r"]
        .iter()
        .map(|p| VolumePath::parse(p).unwrap())
        .collect();
    let request = CreateVolumeRequest {
        mode: Mode::new(0o750).unwrap(),
        uid: None,
        gid: None,
        capacity_bytes: 1 << 20,
        ..Default::default()
    };
    let mut tasks = Vec::new();
    for i in 0..50usize {
        let client = client.clone();
        let path = paths[i % paths.len()].clone();
        let request = request.clone();
        let operation = (i / paths.len()) % 4;
        tasks.push(tokio::spawn(async move {
            match operation {
                0 => client
                    .create_volume(&path, &request, None)
                    .await
                    .map(|_| ()),
                1 => client.delete_volume(&path, None).await,
                2 => match client.archive_volume(&path, None, None).await {
                    Err(e) if e.code() == Some(ErrorCode::NotFound) => Ok(()),
                    other => other.map(|_| ()),
                },
                _ => client.get_volume(&path, None).await.map(|_| ()),
            }
        }));
    }
    for task in tasks {
        task.await
            .unwrap()
            .expect("every request on a valid path succeeds");
    }
    // Each path is either absent or a volume the API reports; nothing is half-made.
    let listed = volume_paths(&client).await;
    for path in &paths {
        let on_disk = root.path().join(path.as_str()).is_dir();
        let via_api = client.get_volume(path, None).await.unwrap().is_some();
        assert_eq!(on_disk, via_api, "{path}");
        assert_eq!(listed.contains(&path.to_string()), on_disk, "{path}");
    }
    for area in [".nfsprov/staging", ".nfsprov/trash"] {
        assert_eq!(
            std::fs::read_dir(root.path().join(area)).unwrap().count(),
            0,
            "{area}"
        );
    }
}

/// Clones, snapshots and restores run as jobs of one runner: a job that fails is
/// answered as its request would be and counted as a failure of its kind.
#[tokio::test(flavor = "multi_thread")]
async fn clone_snapshot_and_restore_jobs_that_fail_are_counted_alike() {
    let (_root, agent) = agent().await;
    let clone = call(
        &agent,
        "POST",
        "/v1/clones/team/copy",
        Some(r#"{"source":"team/missing","capacity_bytes":1048576}"#),
    );
    assert_eq!((clone.status, clone.code()), (404, "not_found".to_owned()));
    let snapshot = call(
        &agent,
        "PUT",
        "/v1/snapshots/snap-1",
        Some(r#"{"source":"team/missing"}"#),
    );
    assert_eq!(
        (snapshot.status, snapshot.code()),
        (404, "not_found".to_owned())
    );
    let restore = call(
        &agent,
        "POST",
        "/v1/restores/team/restored",
        Some(r#"{"snapshot":"snap-missing","capacity_bytes":1048576}"#),
    );
    assert_eq!(
        (restore.status, restore.code()),
        (404, "not_found".to_owned())
    );
    let metrics = curl(&agent, &["-H", &bearer(&agent), &url(&agent, "/metrics")]);
    for failed in [
        "nfsprov_agent_clones_failed_total 1",
        "nfsprov_agent_snapshots_failed_total 1",
        "nfsprov_agent_restores_failed_total 1",
    ] {
        assert!(
            metrics.body.lines().any(|line| line == failed),
            "{failed} not in:\n{}",
            metrics.body
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn request_ids_are_echoed_and_metrics_count_requests() {
    let (_root, agent) = agent().await;
    let result = curl(
        &agent,
        &[
            "-D",
            "-",
            "-H",
            "x-request-id: trace-42",
            "-H",
            &bearer(&agent),
            &url(&agent, "/v1/info"),
        ],
    );
    assert!(
        result
            .body
            .to_ascii_lowercase()
            .contains("x-request-id: trace-42"),
        "{result:?}"
    );
    let metrics = curl(&agent, &["-H", &bearer(&agent), &url(&agent, "/metrics")]);
    assert_eq!(metrics.status, 200);
    assert!(
        metrics.body.contains(
            r#"nfsprov_agent_http_requests_total{method="GET",route="/v1/info",status="200"} 1"#
        ),
        "{}",
        metrics.body
    );
    let unknown = call(&agent, "GET", "/v2/anything", None);
    assert_eq!(
        (unknown.status, unknown.code()),
        (404, "not_found".to_owned())
    );
    let wrong_method = call(&agent, "POST", "/v1/volumes/x", None);
    assert_eq!(wrong_method.status, 405);
    for bad_resize in [
        r#"{}"#,
        r#"{"capacity_bytes":-1}"#,
        r#"{"capacity_bytes":1,"x":2}"#,
    ] {
        let result = call(&agent, "PATCH", "/v1/volumes/x", Some(bad_resize));
        assert_eq!(
            (result.status, result.code()),
            (400, "invalid_body".to_owned()),
            "{bad_resize}"
        );
    }
    let absent = call(
        &agent,
        "PATCH",
        "/v1/volumes/x",
        Some(r#"{"capacity_bytes":1}"#),
    );
    assert_eq!(
        (absent.status, absent.code()),
        (404, "not_found".to_owned())
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_large_delete_does_not_hold_up_other_requests() {
    let (root, agent) = agent().await;
    let client = agent.client();
    let big = VolumePath::parse("big").unwrap();
    let request = CreateVolumeRequest {
        capacity_bytes: 1,
        ..Default::default()
    };
    client.create_volume(&big, &request, None).await.unwrap();
    for d in 0..50 {
        let sub = root.path().join(format!("big/d{d}"));
        std::fs::create_dir(&sub).unwrap();
        for f in 0..1000 {
            std::fs::write(sub.join(format!("f{f}")), b"x").unwrap();
        }
    }
    let deleting = tokio::spawn({
        let client = client.clone();
        async move { client.delete_volume(&big, None).await }
    });
    let trash = root.path().join(".nfsprov/trash");
    wait_for("the delete to start", Duration::from_secs(30), || {
        std::fs::read_dir(&trash).unwrap().count() > 0
    })
    .await;
    let other = VolumePath::parse("other").unwrap();
    client.healthz().await.unwrap();
    assert!(
        client
            .create_volume(&other, &request, None)
            .await
            .unwrap()
            .created
    );
    assert!(client.get_volume(&other, None).await.unwrap().is_some());
    assert!(
        !deleting.is_finished(),
        "other requests were answered while the tree was still being removed"
    );
    deleting.await.unwrap().unwrap();
    assert!(!root.path().join("big").exists());
}

/// `du`'s figure for `dir`: allocated bytes, or inodes with `--inodes`.
fn du(dir: &std::path::Path, inodes: bool) -> u64 {
    let mut command = std::process::Command::new("du");
    command.args(["-s", "-x"]);
    command.arg(if inodes { "--inodes" } else { "--block-size=1" });
    let output = command.arg(dir).output().unwrap();
    assert!(output.status.success());
    String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn usage_matches_du_on_a_tree_of_ten_thousand_files() {
    let (root, agent) = agent().await;
    let client = agent.client();
    let path = VolumePath::parse("ns/data").unwrap();
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    client.create_volume(&path, &request, None).await.unwrap();
    let dir = root.path().join("ns/data");
    for i in 0..10_000usize {
        let sub = dir
            .join(format!("d{}", i / 500))
            .join(format!("e{}", i % 7));
        std::fs::create_dir_all(&sub).unwrap();
        std::fs::write(sub.join(format!("f{i}")), vec![b'x'; (i * 37) % 20_000]).unwrap();
    }
    std::fs::hard_link(dir.join("d0/e1/f1"), dir.join("hard-link")).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("big"), vec![0u8; 1 << 20]).unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.join("link-out")).unwrap();

    let usage = client
        .get_volume(&path, None)
        .await
        .unwrap()
        .unwrap()
        .usage
        .expect("the first GET waits for the walk of a 10,000-file tree");
    let (bytes, inodes) = (du(&dir, false), du(&dir, true));
    let off_by = |ours: u64, truth: u64| (ours as f64 - truth as f64).abs() / truth as f64;
    assert!(
        off_by(usage.used_bytes, bytes) <= 0.01,
        "bytes: ours {} du {bytes}",
        usage.used_bytes
    );
    assert!(
        off_by(usage.used_inodes, inodes) <= 0.01,
        "inodes: ours {} du {inodes}",
        usage.used_inodes
    );

    // Deleting forgets the figure; a new volume at the path is measured afresh.
    client.delete_volume(&path, None).await.unwrap();
    client.create_volume(&path, &request, None).await.unwrap();
    let fresh = client
        .get_volume(&path, None)
        .await
        .unwrap()
        .unwrap()
        .usage
        .unwrap();
    assert_eq!(fresh.used_inodes, 1);
}

/// An operator reading the controller's event must tell a stopped agent from a wrong CA
/// from a hung one; each of these is the typed client's whole message.
#[tokio::test(flavor = "multi_thread")]
async fn the_client_says_why_the_agent_cannot_be_reached() {
    let (_root, agent) = agent().await;
    let (_other_root, other) = self::agent().await;

    // Another agent's CA: the handshake fails on the server certificate.
    let mut wrong_ca = agent.connection();
    wrong_ca.ca_file = other.credentials_dir().join(files::CA_CERT);
    let error = AgentClient::new(&wrong_ca)
        .unwrap()
        .info(None)
        .await
        .unwrap_err();
    let message = error.to_string();
    assert!(error.is_transient(), "{message}");
    assert!(
        message.starts_with(&format!(
            "agent unreachable: cannot connect to {}/v1/info: ",
            agent.connection().url
        )) && message.contains("certificate"),
        "{message}"
    );

    // Accepts connections but never answers.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut hung = agent.connection();
    hung.url = format!("https://127.0.0.1:{}", silent.local_addr().unwrap().port());
    hung.timeout_seconds = 1;
    let message = AgentClient::new(&hung)
        .unwrap()
        .healthz()
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        message,
        format!(
            "agent unreachable: {}/healthz did not answer within the time limit (the agent's timeout_seconds)",
            hung.url
        )
    );

    // Stopped: nothing listens on its port any more.
    let closed_port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut stopped = agent.connection();
    stopped.url = format!("https://127.0.0.1:{closed_port}");
    let message = AgentClient::new(&stopped)
        .unwrap()
        .healthz()
        .await
        .unwrap_err()
        .to_string();
    assert!(
        message.starts_with(&format!(
            "agent unreachable: cannot connect to {}/healthz: ",
            stopped.url
        )) && message.to_lowercase().contains("connection refused"),
        "{message}"
    );
}
