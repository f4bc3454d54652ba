//! Archives over real HTTPS: listing them with their origin, claim, time, expiry and
//! size, deleting one and only one, hostile archive ids, the retention sweep, and a
//! class's retention kept across a restart of the real binary.

mod common;

use std::path::Path;
use std::time::Duration;

use common::agent_process::setup;
use common::{call, snapshot, wait_for};
use nfsprov_agent::archive::retention::ArchiveSettings;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::{Archive, ArchivePath, CreateVolumeRequest, VolumeOwner, VolumePath};
use serde_json::Value;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

const STAMP: &str = "@20260102T030405.000000006Z";

async fn agent() -> (tempfile::TempDir, TestAgent) {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    (root, agent)
}

fn body(namespace: &str, claim: &str) -> String {
    format!(
        r#"{{"capacity_bytes":1048576,"owner":{{"pvc_namespace":"{namespace}","pvc_name":"{claim}","pv_name":"pvc-{claim}"}}}}"#
    )
}

/// Creates the volume at `path` for the claim, or fails the test.
fn create(agent: &TestAgent, path: &str, claim: &str) {
    let created = call(
        agent,
        "PUT",
        &format!("/v1/volumes/{path}"),
        Some(&body("team", claim)),
    );
    assert_eq!(created.status, 201, "{created:?}");
}

/// Archives the volume at `path` with the given body (none: as older controllers do).
fn archive(agent: &TestAgent, path: &str, body: Option<&str>) -> Value {
    let archived = call(agent, "POST", &format!("/v1/archives/{path}"), body);
    assert_eq!(archived.status, 201, "{archived:?}");
    archived.json()
}

fn list(agent: &TestAgent) -> Vec<Value> {
    let listed = call(agent, "GET", "/v1/archives", None);
    assert_eq!(listed.status, 200, "{listed:?}");
    listed.json()["archives"].as_array().unwrap().clone()
}

/// The id of the archive an archive answer names.
fn id_of(archived: &Value) -> String {
    archived["archive_path"]
        .as_str()
        .unwrap()
        .strip_prefix(".archive/")
        .unwrap()
        .to_owned()
}

fn time_of(text: &Value) -> OffsetDateTime {
    OffsetDateTime::parse(text.as_str().unwrap(), &Rfc3339).unwrap()
}

fn days(n: i64) -> time::Duration {
    time::Duration::days(n)
}

fn entries(dir: &Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |d| d.count())
}

#[tokio::test(flavor = "multi_thread")]
async fn the_listing_shows_origin_claim_time_expiry_and_size() {
    let (root, agent) = agent().await;
    create(&agent, "ns/claim", "claim");
    std::fs::write(root.path().join("ns/claim/data"), vec![7u8; 256 * 1024]).unwrap();
    let with_retention = archive(&agent, "ns/claim", Some(r#"{"retention_days":7}"#));
    create(&agent, "other/vol", "other");
    let without = archive(&agent, "other/vol", None);
    create(&agent, "live/vol", "live");

    let listed = list(&agent);
    assert_eq!(
        listed.len(),
        2,
        "only archives, never a live volume: {listed:?}"
    );
    let first = &listed[0];
    assert_eq!(first["id"], id_of(&with_retention));
    assert_eq!(first["archive_path"], with_retention["archive_path"]);
    assert_eq!(first["path"], "ns/claim");
    assert_eq!(
        first["owner"],
        serde_json::json!({"pvc_namespace":"team","pvc_name":"claim","pv_name":"pvc-claim"})
    );
    assert_eq!(first["archived_at"], with_retention["archived_at"]);
    assert_eq!(first["retention_days"], 7);
    assert_eq!(
        time_of(&first["expires_at"]),
        time_of(&first["archived_at"]) + days(7)
    );
    let size = first["size_bytes"].as_u64().expect("measured");
    assert!(size >= 256 * 1024, "{first}");
    assert!(first["inodes"].as_u64().unwrap() >= 2, "{first}");

    // Without a retention of its own, the agent's default applies: here, forever.
    let second = &listed[1];
    assert_eq!(second["id"], id_of(&without));
    assert_eq!(second["owner"]["pvc_name"], "other");
    assert!(second.get("retention_days").is_none(), "{second}");
    assert!(second.get("expires_at").is_none(), "{second}");

    // The typed client reads the same.
    let typed: Vec<Archive> = agent.client().list_archives(None).await.unwrap();
    assert_eq!(typed.len(), 2);
    assert_eq!(typed[0].id.to_string(), id_of(&with_retention));
    assert_eq!(typed[0].owner.pv_name.as_deref(), Some("pvc-claim"));

    let metrics = call(&agent, "GET", "/metrics", None).body;
    assert!(metrics.contains("nfsprov_agent_archives 2\n"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_removes_one_archive_and_only_that_one() {
    let (root, agent) = agent().await;
    let mut archived = Vec::new();
    for round in 0..2 {
        create(&agent, "team/data", "data");
        std::fs::write(root.path().join("team/data/file"), format!("round {round}")).unwrap();
        archived.push(archive(&agent, "team/data", None));
    }
    create(&agent, "team/other", "other");
    archived.push(archive(&agent, "team/other", None));
    // A live volume at the path of two archives.
    create(&agent, "team/data", "data");
    std::fs::write(root.path().join("team/data/file"), b"live").unwrap();

    let doomed = id_of(&archived[0]);
    let deleted = call(&agent, "DELETE", &format!("/v1/archives/{doomed}"), None);
    assert_eq!(deleted.status, 204, "{deleted:?}");
    let left: Vec<String> = list(&agent)
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(left, [id_of(&archived[1]), id_of(&archived[2])]);
    assert!(
        !root
            .path()
            .join(archived[0]["archive_path"].as_str().unwrap())
            .exists()
    );
    let second = root
        .path()
        .join(archived[1]["archive_path"].as_str().unwrap());
    assert_eq!(
        std::fs::read_to_string(second.join("file")).unwrap(),
        "round 1"
    );
    assert_eq!(
        std::fs::read(root.path().join("team/data/file")).unwrap(),
        b"live"
    );
    assert_eq!(entries(&root.path().join(".nfsprov/trash")), 0);

    // Gone already: still 204, and nothing else moves.
    let before = snapshot(root.path());
    let again = call(&agent, "DELETE", &format!("/v1/archives/{doomed}"), None);
    assert_eq!(again.status, 204, "{again:?}");
    assert_eq!(snapshot(root.path()), before);

    // The last archives of a path take their empty directories with them.
    let client = agent.client();
    for archived in &archived[1..] {
        let id = ArchivePath::parse(&id_of(archived)).unwrap();
        client.delete_archive(&id, None).await.unwrap();
    }
    assert!(list(&agent).is_empty());
    assert!(!root.path().join(".archive/team").exists());
    assert!(root.path().join(".archive").is_dir());
    assert!(
        client
            .get_volume(&VolumePath::parse("team/data").unwrap(), None)
            .await
            .unwrap()
            .is_some()
    );
    let metrics = call(&agent, "GET", "/metrics", None).body;
    assert!(
        metrics.contains(
            r#"nfsprov_agent_volume_operations_total{operation="delete_archive",outcome="success"} 4"#
        ),
        "{metrics}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn archive_bodies_are_checked_before_anything_moves() {
    let (root, agent) = agent().await;
    create(&agent, "v", "v");
    let before = snapshot(root.path());
    for (body, status, code) in [
        (r#"{"retention_days":0}"#, 400, "invalid_body"),
        (r#"{"retention_days":-1}"#, 400, "invalid_body"),
        (r#"{"retention_days":"7"}"#, 400, "invalid_body"),
        (r#"{"retention":7}"#, 400, "invalid_body"),
        ("{", 400, "invalid_body"),
    ] {
        let result = call(&agent, "POST", "/v1/archives/v", Some(body));
        assert_eq!(
            (result.status, result.code()),
            (status, code.to_owned()),
            "{body}: {result:?}"
        );
    }
    let form = common::curl(
        &agent,
        &[
            "-X",
            "POST",
            "-H",
            &common::bearer(&agent),
            "-d",
            r#"{"retention_days":7}"#,
            &common::url(&agent, "/v1/archives/v"),
        ],
    );
    assert_eq!(form.status, 415, "{form:?}");
    assert_eq!(snapshot(root.path()), before, "nothing moved");
    // An empty JSON object is the agent's default, as no body at all is.
    let archived = archive(&agent, "v", Some("{}"));
    assert_eq!(list(&agent)[0]["id"], id_of(&archived));
    assert!(list(&agent)[0].get("retention_days").is_none());
}

#[tokio::test(flavor = "multi_thread")]
async fn hostile_archive_ids_are_refused_and_touch_nothing() {
    let (root, agent) = agent().await;
    create(&agent, "ns/claim", "claim");
    std::fs::write(root.path().join("ns/claim/data"), b"live").unwrap();
    create(&agent, "ns/other", "other");
    let real = id_of(&archive(&agent, "ns/other", None));
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(outside.path().join(format!("x/{STAMP}"))).unwrap();
    std::fs::write(outside.path().join(format!("x/{STAMP}/precious")), b"keep").unwrap();
    let area = root.path().join(".archive");
    // Planted where only the agent writes: a link out of the area, a link as an entry,
    // and a directory no record names.
    std::os::unix::fs::symlink(outside.path(), area.join("escape")).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join(format!("x/{STAMP}")),
        area.join(format!("ns/{STAMP}")),
    )
    .unwrap();
    std::fs::create_dir_all(area.join(format!("foreign/{STAMP}"))).unwrap();
    std::fs::write(area.join(format!("foreign/{STAMP}/file")), b"not ours").unwrap();
    let before = snapshot(root.path());
    let outside_before = snapshot(outside.path());

    let cases: Vec<(String, u16, &str)> = vec![
        ("..".into(), 400, "invalid_path"),
        (format!("../../etc/{STAMP}"), 400, "invalid_path"),
        (format!("ns/../../{STAMP}"), 400, "invalid_path"),
        (format!("%2e%2e/{STAMP}"), 400, "invalid_path"),
        (format!("/etc/{STAMP}"), 400, "invalid_path"),
        (format!(".archive/ns/other/{STAMP}"), 400, "invalid_path"),
        (format!(".nfsprov/trash/{STAMP}"), 400, "invalid_path"),
        (format!("{real}/.."), 400, "invalid_path"),
        (format!("{real}/x"), 400, "invalid_path"),
        (STAMP.into(), 400, "invalid_path"),
        // A live volume's path is no archive id.
        ("ns/claim".into(), 400, "invalid_path"),
        ("ns".into(), 400, "invalid_path"),
        (format!("ns/claim/{STAMP}-0"), 400, "invalid_path"),
        (format!("ns/claim/{STAMP}-100"), 400, "invalid_path"),
        ("ns/claim/@yesterday".into(), 400, "invalid_path"),
        (format!("ns/claim/{}", &STAMP[..20]), 400, "invalid_path"),
        (format!("ns/claim/{STAMP}%00"), 400, "invalid_path"),
        // Links are refused, never followed.
        (format!("escape/x/{STAMP}"), 400, "unsafe_path"),
        (format!("ns/{STAMP}"), 400, "unsafe_path"),
        // Not an archive the agent made.
        (format!("foreign/{STAMP}"), 409, "conflict"),
        // A live volume's path with an entry: nothing is there in the archive area.
        (format!("ns/claim/{STAMP}"), 204, ""),
        (format!("ns%2fclaim/{STAMP}"), 204, ""),
    ];
    for (id, status, code) in &cases {
        let result = call(&agent, "DELETE", &format!("/v1/archives/{id}"), None);
        assert_eq!(result.status, *status, "DELETE {id}: {result:?}");
        if !code.is_empty() {
            assert_eq!(&result.code(), code, "DELETE {id}");
        }
    }
    // An archive id is no volume path on the volume endpoints, nor for a new archive.
    for (method, endpoint) in [
        ("DELETE", format!("/v1/volumes/{real}")),
        ("GET", format!("/v1/volumes/{real}")),
        ("POST", format!("/v1/archives/{real}")),
    ] {
        let result = call(&agent, method, &endpoint, None);
        assert_eq!(
            (result.status, result.code()),
            (400, "invalid_path".to_owned()),
            "{method} {endpoint}"
        );
    }
    let listed: Vec<String> = list(&agent)
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, [real]);
    assert_eq!(snapshot(root.path()), before, "the export root changed");
    assert_eq!(
        snapshot(outside.path()),
        outside_before,
        "a link target changed"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_sweep_deletes_expired_archives_and_nothing_else() {
    let root = tempfile::tempdir().unwrap();
    // A default retention of nothing at all: an archive without a retention of its own
    // expires as it is made, and the next sweep (soon) deletes it.
    let agent = TestAgent::start_with_archive(
        root.path(),
        Default::default(),
        Default::default(),
        ArchiveSettings {
            default_retention: Some(Duration::ZERO),
            sweep_interval: Duration::from_millis(50),
        },
    )
    .await
    .unwrap();
    create(&agent, "live", "live");
    std::fs::write(root.path().join("live/data"), b"live").unwrap();
    create(&agent, "kept", "kept");
    let kept = archive(&agent, "kept", Some(r#"{"retention_days":1}"#));
    create(&agent, "doomed", "doomed");
    let doomed = archive(&agent, "doomed", None);

    let doomed_dir = root.path().join(doomed["archive_path"].as_str().unwrap());
    wait_for(
        "the sweep to delete the expired archive",
        Duration::from_secs(30),
        || !doomed_dir.exists(),
    )
    .await;
    let listed: Vec<String> = list(&agent)
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(listed, [id_of(&kept)]);
    assert!(
        root.path()
            .join(kept["archive_path"].as_str().unwrap())
            .is_dir()
    );
    assert_eq!(
        std::fs::read(root.path().join("live/data")).unwrap(),
        b"live"
    );
    let volume = call(&agent, "GET", "/v1/volumes/live", None);
    assert_eq!(volume.status, 200, "{volume:?}");
    assert!(!root.path().join(".archive/doomed").exists());
    let metrics = call(&agent, "GET", "/metrics", None).body;
    assert!(
        metrics.contains("nfsprov_agent_archives_expired_total 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("nfsprov_agent_archive_deletions_failed_total 0\n"),
        "{metrics}"
    );
}

/// The agent process, killed when dropped (also when a test fails).
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_retention_overrides_the_default_and_survives_a_restart() {
    let setup = setup();
    let config = setup.etc.join(nfsprov_agent::init::files::CONFIG);
    let settings = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        format!("{settings}\n[archive]\nretention_days = 3\n"),
    )
    .unwrap();
    let agent = Process(setup.spawn());
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let request = |claim: &str| CreateVolumeRequest {
        capacity_bytes: 1,
        owner: VolumeOwner {
            pvc_name: Some(claim.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    let (classy, plain) = (
        VolumePath::parse("classy").unwrap(),
        VolumePath::parse("plain").unwrap(),
    );
    client
        .create_volume(&classy, &request("classy"), None)
        .await
        .unwrap();
    client
        .create_volume(&plain, &request("plain"), None)
        .await
        .unwrap();
    client
        .archive_volume(&classy, Some(10), None)
        .await
        .unwrap();
    client.archive_volume(&plain, None, None).await.unwrap();

    let expiry_days = |archives: &[Archive]| -> Vec<(String, i64, Option<u32>)> {
        archives
            .iter()
            .map(|a| {
                let archived = OffsetDateTime::parse(&a.archived_at, &Rfc3339).unwrap();
                let expires =
                    OffsetDateTime::parse(a.expires_at.as_deref().unwrap(), &Rfc3339).unwrap();
                assert_eq!((expires - archived).subsec_nanoseconds(), 0);
                (
                    a.path.to_string(),
                    (expires - archived).whole_days(),
                    a.retention_days,
                )
            })
            .collect()
    };
    let first = client.list_archives(None).await.unwrap();
    assert_eq!(
        expiry_days(&first),
        [("classy".into(), 10, Some(10)), ("plain".into(), 3, None)]
    );

    // Restarted with another default: the class's retention was recorded with its
    // archive and stays; the default is the agent's and follows its settings.
    drop(agent);
    std::fs::write(
        &config,
        format!("{settings}\n[archive]\nretention_days = 5\n"),
    )
    .unwrap();
    let _agent = Process(setup.spawn());
    setup.wait_healthy(&client).await;
    let second = client.list_archives(None).await.unwrap();
    assert_eq!(
        expiry_days(&second),
        [("classy".into(), 10, Some(10)), ("plain".into(), 5, None)]
    );
    assert_eq!(
        first.iter().map(|a| &a.archived_at).collect::<Vec<_>>(),
        second.iter().map(|a| &a.archived_at).collect::<Vec<_>>()
    );
}
