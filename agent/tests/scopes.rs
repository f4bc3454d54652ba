//! Two clusters on one agent, each with a credential confined to its own prefix, made
//! by the real `nfsprov-agent credential` command and used over real HTTPS against the
//! real binary: every endpoint of the table, called by one credential on the other's
//! objects, is refused and leaks nothing (the answer is the same as for an object that
//! does not exist), and a rotation or revocation holds within a second.

mod common;

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use common::agent_process::{Setup, agent_binary, setup};
use nfsprov_agent::init::files;
use serde_json::Value;

const CREATE: &str = r#"{"mode":"0770","capacity_bytes":1048576,"owner":{"pvc_namespace":"ns","pvc_name":"claim","pv_name":"pvc-1"}}"#;

/// The agent, stopped when dropped.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `nfsprov-agent credential ARGS` against the setup's settings; its output.
fn credential(setup: &Setup, args: &[&str]) -> String {
    let output = Command::new(agent_binary())
        .arg("credential")
        .arg("--config")
        .arg(setup.etc.join(files::CONFIG))
        .args(args)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "credential {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

/// The token in a printed Secret.
fn token_of(secret: &str) -> String {
    let mut lines = secret.lines();
    lines
        .find(|line| line.trim_end().ends_with("-token: |"))
        .expect("a token key");
    lines.next().unwrap().trim().to_owned()
}

fn add(setup: &Setup, name: &str, prefix: &str) -> String {
    token_of(&credential(
        setup,
        &[
            "add",
            name,
            "--prefix",
            prefix,
            "--url",
            &format!("https://localhost:{}", setup.port),
        ],
    ))
}

/// One answer: its status and JSON body (`null` when it has none).
#[derive(Debug, Clone, PartialEq)]
struct Answer {
    status: u16,
    body: Value,
}

struct Caller<'a> {
    setup: &'a Setup,
    http: reqwest::Client,
    token: String,
}

impl Caller<'_> {
    async fn call(&self, method: &str, path: &str, body: Option<&str>) -> Answer {
        let url = format!("https://localhost:{}{path}", self.setup.port);
        let mut request = self
            .http
            .request(method.parse().unwrap(), url)
            .bearer_auth(&self.token);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body.to_owned());
        }
        let response = request.send().await.unwrap();
        let status = response.status().as_u16();
        let text = response.text().await.unwrap();
        Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
        }
    }

    async fn ok(&self, method: &str, path: &str, body: Option<&str>) -> Value {
        let answer = self.call(method, path, body).await;
        assert!(
            (200..300).contains(&answer.status),
            "{method} {path}: {answer:?}"
        );
        answer.body
    }
}

async fn start(setup: &Setup) -> Running {
    let running = Running(setup.spawn());
    setup.wait_healthy(&setup.client()).await;
    running
}

/// The answer with `name` written as `NAME`, so that answers about two objects compare.
fn anonymised(answer: &Answer, names: &[&str]) -> Answer {
    let mut text = answer.body.to_string();
    for name in names {
        text = text.replace(name, "NAME");
    }
    Answer {
        status: answer.status,
        body: serde_json::from_str(&text).unwrap(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_credential_reaches_nothing_of_anothers_and_learns_nothing_of_it() {
    let setup = setup();
    let production_token = add(&setup, "production", "production");
    let staging_token = add(&setup, "staging", "staging");
    let _agent = start(&setup).await;
    let caller = |token: &str| Caller {
        setup: &setup,
        http: setup.https(),
        token: token.to_owned(),
    };
    let operator = caller(&setup.token());
    let production = caller(&production_token);
    let staging = caller(&staging_token);

    // Production's objects: a volume, a snapshot of it, and an archive.
    production
        .ok("PUT", "/v1/volumes/production/ns/app", Some(CREATE))
        .await;
    std::fs::write(setup.root.join("production/ns/app/data"), b"production's").unwrap();
    production
        .ok(
            "PUT",
            "/v1/snapshots/snap-prod",
            Some(r#"{"source":"production/ns/app"}"#),
        )
        .await;
    production
        .ok("PUT", "/v1/volumes/production/ns/old", Some(CREATE))
        .await;
    let archived = production
        .ok("POST", "/v1/archives/production/ns/old", None)
        .await;
    let archive = archived["archive_path"]
        .as_str()
        .and_then(|path| path.strip_prefix(".archive/"))
        .unwrap()
        .to_owned();
    let ghost_archive = archive.replace("production/ns/old", "production/ns/ghost");
    // Staging's own volume, the target of its clones and restores.
    staging
        .ok("PUT", "/v1/volumes/staging/ns/app", Some(CREATE))
        .await;

    let clone_of = |source: &str| format!(r#"{{"source":"{source}","capacity_bytes":1048576}}"#);
    let restore_of_snapshot =
        |name: &str| format!(r#"{{"snapshot":"{name}","capacity_bytes":1048576}}"#);
    let restore_of_archive = |id: &str| format!(r#"{{"archive":"{id}","capacity_bytes":1048576}}"#);
    let snapshot_of = |source: &str| format!(r#"{{"source":"{source}"}}"#);
    // Each endpoint that names an object, called by staging on production's object and
    // on one that does not exist: (endpoint, method, path and body on the object, on
    // the absent one, the status expected).
    type Probe = (
        &'static str,
        &'static str,
        String,
        Option<String>,
        String,
        Option<String>,
        u16,
    );
    let probes: Vec<Probe> = vec![
        (
            "GetVolume",
            "GET",
            "/v1/volumes/production/ns/app".into(),
            None,
            "/v1/volumes/production/ns/ghost".into(),
            None,
            403,
        ),
        (
            "CreateVolume",
            "PUT",
            "/v1/volumes/production/ns/app".into(),
            Some(CREATE.into()),
            "/v1/volumes/production/ns/ghost".into(),
            Some(CREATE.into()),
            403,
        ),
        (
            "ResizeVolume",
            "PATCH",
            "/v1/volumes/production/ns/app".into(),
            Some(r#"{"capacity_bytes":2097152}"#.into()),
            "/v1/volumes/production/ns/ghost".into(),
            Some(r#"{"capacity_bytes":2097152}"#.into()),
            403,
        ),
        (
            "DeleteVolume",
            "DELETE",
            "/v1/volumes/production/ns/app".into(),
            None,
            "/v1/volumes/production/ns/ghost".into(),
            None,
            403,
        ),
        (
            "AdoptVolume",
            "POST",
            "/v1/adoptions/production/ns/app".into(),
            Some(r#"{"capacity_bytes":1048576}"#.into()),
            "/v1/adoptions/production/ns/ghost".into(),
            Some(r#"{"capacity_bytes":1048576}"#.into()),
            403,
        ),
        (
            "CloneVolume (target)",
            "POST",
            "/v1/clones/production/ns/app".into(),
            Some(clone_of("staging/ns/app")),
            "/v1/clones/production/ns/ghost".into(),
            Some(clone_of("staging/ns/app")),
            403,
        ),
        (
            "CloneVolume (source)",
            "POST",
            "/v1/clones/staging/ns/copy".into(),
            Some(clone_of("production/ns/app")),
            "/v1/clones/staging/ns/copy".into(),
            Some(clone_of("production/ns/ghost")),
            403,
        ),
        (
            "SetVolumeExport",
            "PUT",
            "/v1/exports/production/ns/app".into(),
            Some(r#"{"clients":["10.0.0.1"]}"#.into()),
            "/v1/exports/production/ns/ghost".into(),
            Some(r#"{"clients":["10.0.0.1"]}"#.into()),
            403,
        ),
        (
            "ArchiveVolume",
            "POST",
            "/v1/archives/production/ns/app".into(),
            None,
            "/v1/archives/production/ns/ghost".into(),
            None,
            403,
        ),
        (
            "GetArchive",
            "GET",
            format!("/v1/archives/{archive}"),
            None,
            format!("/v1/archives/{ghost_archive}"),
            None,
            403,
        ),
        (
            "DeleteArchive",
            "DELETE",
            format!("/v1/archives/{archive}"),
            None,
            format!("/v1/archives/{ghost_archive}"),
            None,
            403,
        ),
        (
            "GetSnapshot",
            "GET",
            "/v1/snapshots/snap-prod".into(),
            None,
            "/v1/snapshots/snap-ghost".into(),
            None,
            404,
        ),
        (
            "CreateSnapshot (source)",
            "PUT",
            "/v1/snapshots/snap-staging".into(),
            Some(snapshot_of("production/ns/app")),
            "/v1/snapshots/snap-staging".into(),
            Some(snapshot_of("production/ns/ghost")),
            403,
        ),
        (
            "DeleteSnapshot",
            "DELETE",
            "/v1/snapshots/snap-prod".into(),
            None,
            "/v1/snapshots/snap-ghost".into(),
            None,
            204,
        ),
        (
            "RestoreVolume (target)",
            "POST",
            "/v1/restores/production/ns/app".into(),
            Some(restore_of_snapshot("snap-prod")),
            "/v1/restores/production/ns/ghost".into(),
            Some(restore_of_snapshot("snap-ghost")),
            403,
        ),
        (
            "RestoreVolume (snapshot)",
            "POST",
            "/v1/restores/staging/ns/restored".into(),
            Some(restore_of_snapshot("snap-prod")),
            "/v1/restores/staging/ns/restored".into(),
            Some(restore_of_snapshot("snap-ghost")),
            404,
        ),
        (
            "RestoreVolume (archive)",
            "POST",
            "/v1/restores/staging/ns/restored".into(),
            Some(restore_of_archive(&archive)),
            "/v1/restores/staging/ns/restored".into(),
            Some(restore_of_archive(&ghost_archive)),
            403,
        ),
    ];
    let before = common::snapshot(&setup.root);
    println!("| endpoint | on production's object | on an absent one | same answer |");
    println!("|---|---|---|---|");
    for (endpoint, method, on_object, object_body, on_absent, absent_body, status) in &probes {
        let object = staging
            .call(method, on_object, object_body.as_deref())
            .await;
        let absent = staging
            .call(method, on_absent, absent_body.as_deref())
            .await;
        assert_eq!(
            object.status, *status,
            "{endpoint} on production's: {object:?}"
        );
        let names = [
            "production/ns/app",
            "production/ns/ghost",
            "snap-prod",
            "snap-ghost",
            archive.as_str(),
            ghost_archive.as_str(),
            "production/ns/old",
        ];
        assert_eq!(
            anonymised(&object, &names),
            anonymised(&absent, &names),
            "{endpoint}: the answer tells production's object from an absent one"
        );
        let code = object.body["code"].as_str().unwrap_or("-").to_owned();
        println!(
            "| {endpoint} | {} {code} | {} | yes |",
            object.status, absent.status
        );
    }
    assert_eq!(
        common::snapshot(&setup.root),
        before,
        "a refused request changed the export root"
    );
    // Production's objects are as they were.
    production
        .ok("GET", "/v1/volumes/production/ns/app", None)
        .await;
    production.ok("GET", "/v1/snapshots/snap-prod", None).await;
    production
        .ok("GET", &format!("/v1/archives/{archive}"), None)
        .await;

    // Lists hold each scope's own; the operator's token sees both.
    let names = |list: &Value, key: &str, field: &str| -> Vec<String> {
        list[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|entry| entry[field].as_str().unwrap().to_owned())
            .collect()
    };
    for limit in ["", "?limit=1"] {
        let mut seen = Vec::new();
        let mut query = limit.to_owned();
        loop {
            let page = staging
                .ok("GET", &format!("/v1/volumes{query}"), None)
                .await;
            seen.extend(names(&page, "volumes", "path"));
            match page["next"].as_str() {
                Some(next) => {
                    assert!(
                        next.starts_with("staging/"),
                        "a cursor of another scope: {next}"
                    );
                    query = format!("?limit=1&after={next}");
                }
                None => break,
            }
        }
        assert_eq!(seen, vec!["staging/ns/app"], "{limit}");
    }
    let everything = operator.ok("GET", "/v1/volumes", None).await;
    assert_eq!(
        names(&everything, "volumes", "path"),
        vec!["production/ns/app", "staging/ns/app"]
    );
    let listed = production.ok("GET", "/v1/volumes", None).await;
    assert_eq!(names(&listed, "volumes", "path"), vec!["production/ns/app"]);
    let archives = staging.ok("GET", "/v1/archives", None).await;
    assert!(names(&archives, "archives", "id").is_empty(), "{archives}");
    let archives = production.ok("GET", "/v1/archives", None).await;
    assert_eq!(names(&archives, "archives", "id"), vec![archive.clone()]);
    let snapshots = staging.ok("GET", "/v1/snapshots", None).await;
    assert!(
        names(&snapshots, "snapshots", "name").is_empty(),
        "{snapshots}"
    );
    let snapshots = production.ok("GET", "/v1/snapshots", None).await;
    assert_eq!(names(&snapshots, "snapshots", "name"), vec!["snap-prod"]);

    // A snapshot name held by another scope is refused without naming its source.
    let taken = staging
        .call(
            "PUT",
            "/v1/snapshots/snap-prod",
            Some(&snapshot_of("staging/ns/app")),
        )
        .await;
    assert_eq!(taken.status, 409, "{taken:?}");
    assert!(!taken.body.to_string().contains("production"), "{taken:?}");

    // The figures of the whole agent are the operator's; a scoped credential is told
    // its own.
    let info = staging.ok("GET", "/v1/info", None).await;
    assert_eq!(
        info["provisioning"]["provisioned_bytes"], 1_048_576,
        "staging's own one volume: {info}"
    );
    assert!(info.get("export_root_filesystem").is_none(), "{info}");
    let whole = operator.ok("GET", "/v1/info", None).await;
    assert_eq!(
        whole["provisioning"]["provisioned_bytes"],
        2 * 1_048_576,
        "production's live volume and staging's: {whole}"
    );
    let metrics = staging.call("GET", "/metrics", None).await;
    assert_eq!(metrics.status, 403, "{metrics:?}");
    let metrics = setup.metrics().await;
    let refused: f64 = metrics
        .lines()
        .find(|line| {
            line.starts_with("nfsprov_agent_refused_out_of_scope_total{credential=\"staging\"}")
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no refusal counted for staging:\n{metrics}"));
    assert!(refused >= 15.0, "{refused}");
    assert_eq!(
        figure(
            &metrics,
            "nfsprov_agent_refused_out_of_scope_total",
            "production"
        ),
        None,
        "production was refused nothing"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotation_or_revocation_holds_within_a_second_and_touches_no_other() {
    let setup = setup();
    let one = add(&setup, "one", "one");
    let other = add(&setup, "other", "other");
    let _agent = start(&setup).await;
    let caller = |token: &str| Caller {
        setup: &setup,
        http: setup.https(),
        token: token.to_owned(),
    };
    caller(&one).ok("GET", "/v1/volumes", None).await;
    caller(&other).ok("GET", "/v1/volumes", None).await;

    // Added while the agent runs: usable within a second.
    let third = add(&setup, "third", "third");
    let added = Instant::now();
    let until_answer = |token: String, status: u16| {
        let caller = caller(&token);
        async move {
            let started = Instant::now();
            while caller.call("GET", "/v1/volumes", None).await.status != status {
                assert!(
                    started.elapsed() < Duration::from_secs(1),
                    "no {status} within a second"
                );
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            started.elapsed()
        }
    };
    until_answer(third.clone(), 200).await;
    println!("added: usable after {:?}", added.elapsed());

    let rotated = token_of(&credential(
        &setup,
        &[
            "rotate",
            "one",
            "--url",
            &format!("https://localhost:{}", setup.port),
        ],
    ));
    let old_refused = until_answer(one.clone(), 401).await;
    let new_accepted = until_answer(rotated.clone(), 200).await;
    println!(
        "rotated: old token refused after {old_refused:?}, new accepted after {new_accepted:?}"
    );
    caller(&other).ok("GET", "/v1/volumes", None).await;

    credential(&setup, &["revoke", "one"]);
    let revoked = until_answer(rotated, 401).await;
    println!("revoked: refused after {revoked:?}");
    caller(&other).ok("GET", "/v1/volumes", None).await;
    caller(&third).ok("GET", "/v1/volumes", None).await;
    caller(&setup.token()).ok("GET", "/v1/volumes", None).await;
    let listed = credential(&setup, &["list"]);
    assert!(!listed.contains("one\t"), "{listed}");
    assert!(listed.contains("other\tother\tall"), "{listed}");
}

/// The metric `name{credential="CREDENTIAL"}` in `metrics`.
fn figure(metrics: &str, name: &str, credential: &str) -> Option<f64> {
    let key = format!("{name}{{credential=\"{credential}\"}} ");
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(&key)?.parse().ok())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_credential_makes_no_more_volumes_or_capacity_than_its_limits() {
    const MIB: u64 = 1 << 20;
    let setup = setup();
    let limited = token_of(&credential(
        &setup,
        &[
            "add",
            "limited",
            "--prefix",
            "limited",
            "--max-volumes",
            "2",
            "--max-bytes",
            &(3 * MIB).to_string(),
            "--url",
            &format!("https://localhost:{}", setup.port),
        ],
    ));
    let free = add(&setup, "free", "free");
    let mut agent = start(&setup).await;
    let caller = |token: &str| Caller {
        setup: &setup,
        http: setup.https(),
        token: token.to_owned(),
    };
    let (limited, free) = (caller(&limited), caller(&free));
    let create = |mib: u64| {
        format!(
            r#"{{"mode":"0770","capacity_bytes":{},"owner":{{"pvc_namespace":"ns","pvc_name":"claim","pv_name":"pvc-1"}}}}"#,
            mib * MIB
        )
    };
    limited
        .ok("PUT", "/v1/volumes/limited/a", Some(&create(1)))
        .await;
    limited
        .ok("PUT", "/v1/volumes/limited/b", Some(&create(1)))
        .await;
    // The same create again is confirmed at the limit.
    limited
        .ok("PUT", "/v1/volumes/limited/b", Some(&create(1)))
        .await;
    let refused = limited
        .call("PUT", "/v1/volumes/limited/c", Some(&create(1)))
        .await;
    assert_eq!(refused.status, 507, "{refused:?}");
    assert_eq!(refused.body["code"], "credential_limit", "{refused:?}");
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("max_volumes"),
        "{refused:?}"
    );
    let clone = format!(r#"{{"source":"limited/a","capacity_bytes":{MIB}}}"#);
    let refused = limited
        .call("POST", "/v1/clones/limited/c", Some(&clone))
        .await;
    assert_eq!(refused.status, 507, "a clone counts too: {refused:?}");
    // Growth within the bytes passes; past them is refused.
    let grow = |mib: u64| format!(r#"{{"capacity_bytes":{}}}"#, mib * MIB);
    limited
        .ok("PATCH", "/v1/volumes/limited/a", Some(&grow(2)))
        .await;
    let refused = limited
        .call("PATCH", "/v1/volumes/limited/a", Some(&grow(3)))
        .await;
    assert_eq!(refused.status, 507, "{refused:?}");
    assert!(
        refused.body["message"]
            .as_str()
            .unwrap()
            .contains("max_bytes"),
        "{refused:?}"
    );
    // Another credential is not bound by it.
    for n in 0..3 {
        free.ok("PUT", &format!("/v1/volumes/free/v{n}"), Some(&create(2)))
            .await;
    }
    let metrics = setup.metrics().await;
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_volumes", "limited"),
        Some(2.0)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_bytes", "limited"),
        Some((3 * MIB) as f64)
    );
    assert_eq!(
        figure(
            &metrics,
            "nfsprov_agent_credential_volumes_limit",
            "limited"
        ),
        Some(2.0)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_bytes_limit", "limited"),
        Some((3 * MIB) as f64)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_volumes", "free"),
        Some(3.0)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_volumes_limit", "free"),
        None
    );

    // A new start counts the volumes again from their records.
    drop(agent);
    agent = start(&setup).await;
    let refused = limited
        .call("PUT", "/v1/volumes/limited/c", Some(&create(1)))
        .await;
    assert_eq!(refused.status, 507, "after a restart: {refused:?}");
    // A deleted volume gives its place back; an archived one too.
    limited.ok("DELETE", "/v1/volumes/limited/b", None).await;
    limited
        .ok("PUT", "/v1/volumes/limited/c", Some(&create(1)))
        .await;
    limited.ok("POST", "/v1/archives/limited/c", None).await;
    limited
        .ok("PUT", "/v1/volumes/limited/d", Some(&create(1)))
        .await;
    drop(agent);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_credential_runs_no_more_jobs_than_its_share() {
    const SWITCH: &str = "NFSPROV_AGENT_HOLD_CLONES";
    let setup = setup();
    let busy = token_of(&credential(
        &setup,
        &[
            "add",
            "busy",
            "--prefix",
            "busy",
            "--max-jobs",
            "1",
            "--url",
            &format!("https://localhost:{}", setup.port),
        ],
    ));
    let other = add(&setup, "other", "other");
    let hold = setup.hold(SWITCH);
    let _agent = Running(setup.spawn_held(SWITCH));
    setup.wait_healthy(&setup.client()).await;
    let caller = |token: &str| Caller {
        setup: &setup,
        http: setup.https(),
        token: token.to_owned(),
    };
    let (busy, other) = (caller(&busy), caller(&other));
    busy.ok("PUT", "/v1/volumes/busy/source", Some(CREATE))
        .await;
    other
        .ok("PUT", "/v1/volumes/other/source", Some(CREATE))
        .await;
    let clone_of = |source: &str| format!(r#"{{"source":"{source}","capacity_bytes":1048576}}"#);
    let first = busy
        .call(
            "POST",
            "/v1/clones/busy/one",
            Some(&clone_of("busy/source")),
        )
        .await;
    assert_eq!(first.status, 202, "held: {first:?}");
    // Its share is taken: a second job starts nothing, a repeat of the first joins it.
    let second = busy
        .call(
            "POST",
            "/v1/clones/busy/two",
            Some(&clone_of("busy/source")),
        )
        .await;
    assert_eq!(second.status, 429, "{second:?}");
    assert_eq!(second.body["code"], "job_queue_full", "{second:?}");
    assert!(
        second.body["message"]
            .as_str()
            .unwrap()
            .contains("max_jobs"),
        "{second:?}"
    );
    let again = busy
        .call(
            "POST",
            "/v1/clones/busy/one",
            Some(&clone_of("busy/source")),
        )
        .await;
    assert_eq!(again.status, 202, "a repeat joins its job: {again:?}");
    // Another credential's jobs are not held back by it.
    let others = other
        .call(
            "POST",
            "/v1/clones/other/one",
            Some(&clone_of("other/source")),
        )
        .await;
    assert_eq!(others.status, 202, "{others:?}");
    let metrics = setup.metrics().await;
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_jobs", "busy"),
        Some(1.0)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_jobs_limit", "busy"),
        Some(1.0)
    );
    assert_eq!(
        figure(&metrics, "nfsprov_agent_credential_jobs", "other"),
        None
    );

    // Once the first ends, its share is free again.
    drop(hold);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = busy
            .call(
                "POST",
                "/v1/clones/busy/one",
                Some(&clone_of("busy/source")),
            )
            .await;
        if done.status == 200 || done.status == 201 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first clone never ended: {done:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let second = busy
        .call(
            "POST",
            "/v1/clones/busy/two",
            Some(&clone_of("busy/source")),
        )
        .await;
    assert!(
        (200..=202).contains(&second.status),
        "the share is free again: {second:?}"
    );
}
