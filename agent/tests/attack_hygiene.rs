//! What a client or a tenant can make the agent write or read: a request id too long to
//! log, file names that would forge log lines or drive a terminal, and a token file
//! replaced by something that is not a small regular file. Each against the real agent
//! binary over HTTPS, with its log read back.

mod common;

use std::time::Duration;

use common::agent_process::setup;
use common::logged_agent::{LoggedAgent, https_http1, mtls_client, within_a_minute};
use common::{is_root, run};
use nfsprov_agent::init::files;
use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{CloneVolumeRequest, CreateVolumeRequest, VolumePath};

#[tokio::test(flavor = "multi_thread")]
async fn a_huge_request_id_is_replaced_not_logged() {
    let setup = setup();
    let agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;
    let http = https_http1(&setup);
    let url = format!("https://localhost:{}/v1/info", setup.port);

    let huge = "r".repeat(300_000);
    for _ in 0..20 {
        let answer = http
            .get(&url)
            .header("x-request-id", &huge)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401);
        let used = answer
            .headers()
            .get("x-request-id")
            .expect("the id used is sent back")
            .to_str()
            .unwrap();
        assert!(
            !used.is_empty() && used.len() <= 128,
            "{} bytes",
            used.len()
        );
    }
    // A well-formed id is kept, sent back as it came and logged (a create always is).
    let answer = http
        .put(format!(
            "https://localhost:{}/v1/volumes/ns/rid",
            setup.port
        ))
        .bearer_auth(setup.token())
        .header("x-request-id", "pvc-0d1e-17f3a9c2b4")
        .header("content-type", "application/json")
        .body(r#"{"capacity_bytes":1048576}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201);
    assert_eq!(answer.headers()["x-request-id"], "pvc-0d1e-17f3a9c2b4");

    agent
        .await_log("pvc-0d1e-17f3a9c2b4", 1, Duration::from_secs(60))
        .await;
    let log = agent.log();
    assert!(
        log.len() < 256 * 1024,
        "{} bytes of log for 21 requests",
        log.len()
    );
    assert!(!String::from_utf8_lossy(&log).contains(&"r".repeat(1000)));
}

/// A directory name that would end the log line, forge an audit line of its own, clear
/// the screen and retitle the terminal of whoever reads the log.
const EVIL: &str = "m\n2026-11-25T00:00:00.000000Z  INFO audit: forged request_id=\"x\" status=200\x1b[2J\x1b]0;owned\x07";

#[tokio::test(flavor = "multi_thread")]
async fn a_tenant_file_name_reaches_the_log_escaped() {
    if !is_root() {
        nfsprov_test_skip::skip(
            "a_tenant_file_name_reaches_the_log_escaped",
            "the failure that names the file needs a mount point, which needs root",
        );
        return;
    }
    let setup = setup();
    let agent = LoggedAgent::spawn(&setup);
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let source = VolumePath::parse("tenants/source").unwrap();
    client
        .create_volume(
            &source,
            &CreateVolumeRequest {
                capacity_bytes: 1 << 20,
                ..Default::default()
            },
            None,
        )
        .await
        .unwrap();
    // A mount point inside the volume: a clone refuses it and names it.
    let point = setup.root.join("tenants/source").join(EVIL);
    std::fs::create_dir(&point).unwrap();
    let outside = tempfile::tempdir().unwrap();
    run(
        "mount",
        &[
            "--bind",
            outside.path().to_str().unwrap(),
            point.to_str().unwrap(),
        ],
    )
    .unwrap();
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = run("umount", &[self.0.to_str().unwrap()]);
        }
    }
    let _unmount = Unmount(point.clone());

    let refused = client
        .clone_volume(
            &VolumePath::parse("tenants/copy").unwrap(),
            &CloneVolumeRequest {
                source: source.clone(),
                capacity_bytes: 1 << 20,
                owner: Default::default(),
                quota: Default::default(),
                export: None,
            },
            None,
        )
        .await;
    let message = match refused {
        Err(ClientError::Api { error, .. }) => error.message,
        other => panic!("the clone should be refused for the mount point: {other:?}"),
    };
    agent
        .await_log("clone failed", 1, Duration::from_secs(60))
        .await;
    let log = agent.log();
    let text = String::from_utf8_lossy(&log);
    for line in text.lines() {
        assert!(
            !line.starts_with("2026-11-25T00:00:00.000000Z"),
            "a forged line in the log:\n{text}"
        );
    }
    assert!(text.contains("\\n2026-11-25"), "{text}");
    // No clear-screen, title or bell for whoever reads the log (no colours either: it is
    // not a terminal).
    assert!(
        !log.iter().any(|b| *b == 0x1b || *b == 0x07),
        "a terminal control byte in the log:\n{text}"
    );

    // The answer (and so the claim's event) says it the same way.
    assert!(message.contains("mount point"), "{message}");
    assert!(!message.chars().any(char::is_control), "{message:?}");
    assert!(message.contains("\\n2026-11-25"), "{message:?}");
}

fn replace_token(setup: &common::agent_process::Setup, make: impl FnOnce(&std::path::Path)) {
    let staged = setup.etc.join("token.staged");
    let _ = std::fs::remove_file(&staged);
    make(&staged);
    std::fs::rename(&staged, setup.etc.join(files::TOKEN)).unwrap();
}

/// Token and mTLS callers and `/healthz` are all answered; the token is the last good one.
async fn all_served(setup: &common::agent_process::Setup, token: &str) {
    let http = setup.https();
    let info = format!("https://localhost:{}/v1/info", setup.port);
    let by_token: Vec<_> = (0..8)
        .map(|_| {
            let request = http.get(&info).bearer_auth(token).send();
            tokio::spawn(request)
        })
        .collect();
    let mtls = mtls_client(setup);
    let (by_certificate, health) = within_a_minute("mTLS /v1/info and /healthz", async {
        tokio::join!(mtls.info(None), mtls.healthz())
    })
    .await;
    by_certificate.expect("mTLS /v1/info");
    health.expect("/healthz");
    for answer in by_token {
        let answer = within_a_minute("token /v1/info", answer)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(answer.status().as_u16(), 200);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_token_file_that_is_no_small_regular_file_is_refused_and_the_last_good_token_stays() {
    let setup = setup();
    let agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;
    let token = setup.token();
    all_served(&setup, &token).await;
    const NOTICE: &str = "keeping the last good content";

    // A FIFO: opening it for reading would wait for a writer that never comes.
    replace_token(&setup, |staged| {
        run("mkfifo", &[staged.to_str().unwrap()]).unwrap();
    });
    all_served(&setup, &token).await;
    agent.await_log(NOTICE, 1, Duration::from_secs(60)).await;
    all_served(&setup, &token).await;

    // Endless zeros: a read without a cap would take all memory.
    let before = agent.rss_kib();
    replace_token(&setup, |staged| {
        std::os::unix::fs::symlink("/dev/zero", staged).unwrap();
    });
    agent.await_log(NOTICE, 2, Duration::from_secs(60)).await;
    all_served(&setup, &token).await;
    // A regular file far larger than any token.
    replace_token(&setup, |staged| {
        std::fs::write(staged, vec![b'a'; 4 << 20]).unwrap();
    });
    agent.await_log(NOTICE, 3, Duration::from_secs(60)).await;
    all_served(&setup, &token).await;
    let after = agent.rss_kib();
    assert!(
        after < before + 32 * 1024,
        "RSS grew from {before} KiB to {after} KiB"
    );

    // A good token again takes over from the old one.
    replace_token(&setup, |staged| {
        std::fs::write(staged, "rotated-token-0123456789\n").unwrap();
    });
    let http = setup.https();
    let info = format!("https://localhost:{}/v1/info", setup.port);
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let answer = http
            .get(&info)
            .bearer_auth("rotated-token-0123456789")
            .send()
            .await
            .unwrap();
        if answer.status().as_u16() == 200 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the rotated token was never accepted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let old = http.get(&info).bearer_auth(&token).send().await.unwrap();
    assert_eq!(old.status().as_u16(), 401);
}
