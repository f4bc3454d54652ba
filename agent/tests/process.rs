//! The agent as a real process: start-up errors, SIGTERM with a request in flight, and a
//! SIGKILL in the middle of deleting a large tree.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::agent_process::{agent_binary, setup};
use common::wait_for;
use nfsprov_agent::init::files;
use nfsprov_api_types::{CreateVolumeRequest, VolumePath};

/// Fills `dir` with `count` files spread over subdirectories of 1,000.
fn fill(dir: &Path, count: usize) {
    for i in 0..count {
        let sub = dir.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub).unwrap();
        }
        std::fs::write(sub.join(format!("f{i}")), b"data").unwrap();
    }
}

#[test]
fn misconfiguration_fails_at_start_with_one_line() {
    let setup = setup();
    let config = setup.etc.join(files::CONFIG);
    let original = std::fs::read_to_string(&config).unwrap();
    let cases = [
        (
            original.replace("server.pem", "absent.pem"),
            "tls.cert_file",
        ),
        (
            original.replace(&setup.root.display().to_string(), "/nonexistent/export"),
            "export_root /nonexistent/export",
        ),
        (
            original.replace(&format!("127.0.0.1:{}", setup.port), "localhost"),
            "listen address",
        ),
        (original.replace("server-key.pem", "ca.pem"), "tls.key_file"),
    ];
    for (text, expected) in cases {
        std::fs::write(&config, text).unwrap();
        let output = Command::new(agent_binary())
            .args(["run", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(expected),
            "expected {expected:?} in {stderr:?}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr:?}");
    }
    let missing = Command::new(agent_binary())
        .args(["run", "--config", "/nonexistent/agent.toml"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/agent.toml"));
}

#[tokio::test(flavor = "multi_thread")]
async fn sigterm_lets_an_in_flight_delete_finish() {
    let setup = setup();
    let mut agent = setup.spawn();
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let path = VolumePath::parse("busy").unwrap();
    let request = CreateVolumeRequest {
        capacity_bytes: 1,
        ..Default::default()
    };
    client.create_volume(&path, &request, None).await.unwrap();
    fill(&setup.root.join("busy"), 20_000);

    let deleting = tokio::spawn({
        let client = client.clone();
        let path = path.clone();
        async move { client.delete_volume(&path, None).await }
    });
    wait_for("the delete to start", Duration::from_secs(30), || {
        setup.trash_entries() > 0
    })
    .await;
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&agent),
        rustix::process::Signal::TERM,
    )
    .unwrap();
    deleting
        .await
        .unwrap()
        .expect("the in-flight delete completes during shutdown");
    let status = tokio::task::spawn_blocking(move || agent.wait())
        .await
        .unwrap()
        .unwrap();
    assert!(status.success(), "{status:?}");
    assert!(!setup.root.join("busy").exists());
    assert_eq!(setup.trash_entries(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn sigkill_during_a_large_delete_then_the_retry_completes() {
    let setup = setup();
    let mut agent = setup.spawn();
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let path = VolumePath::parse("ns/big").unwrap();
    let request = CreateVolumeRequest {
        capacity_bytes: 1,
        ..Default::default()
    };
    client.create_volume(&path, &request, None).await.unwrap();
    fill(&setup.root.join("ns/big"), 50_000);

    let deleting = tokio::spawn({
        let client = client.clone();
        let path = path.clone();
        async move { client.delete_volume(&path, None).await }
    });
    // Kill as soon as the tree is in the trash, i.e. while its files are being removed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while setup.trash_entries() == 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the delete never started"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    agent.kill().unwrap();
    agent.wait().unwrap();
    assert!(
        deleting.await.unwrap().is_err(),
        "the killed agent cannot have answered"
    );
    assert_eq!(setup.trash_entries(), 1, "the kill interrupted the removal");

    let mut restarted = setup.spawn();
    setup.wait_healthy(&client).await;
    client
        .delete_volume(&path, None)
        .await
        .expect("the retried DELETE answers 204");
    assert!(client.get_volume(&path, None).await.unwrap().is_none());
    assert!(!setup.root.join("ns/big").exists());
    wait_for(
        "the interrupted tree to be purged",
        Duration::from_secs(60),
        || setup.trash_entries() == 0,
    )
    .await;
    restarted.kill().unwrap();
    restarted.wait().unwrap();
}
