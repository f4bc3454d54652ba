//! Attacks by anyone who can reach the agent's port, or write next to its settings:
//! unbounded metric labels, modes and owners a class should not get, secrets others can
//! read or replace, and authentication switched off by a flag. Each against the real
//! agent binary over real HTTPS.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent_process::{Setup, agent_binary, other_source, setup};
use nfsprov_agent::init::files;

/// The agent process, killed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/<pid>/status")
}

/// A method name of `len` letters, different for every `n`.
fn method(n: usize, len: usize) -> reqwest::Method {
    let mut name = format!("X{n}").into_bytes();
    name.resize(len, b'Q');
    for byte in &mut name[1..] {
        if byte.is_ascii_digit() {
            *byte = b'A' + (*byte - b'0');
        }
    }
    reqwest::Method::from_bytes(&name).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_unique_methods_leave_memory_and_metrics_bounded() {
    let setup = setup();
    let process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;
    let http = setup.https();
    let base = format!("https://localhost:{}", setup.port);
    // Warm up the paths a steady agent has run, so the comparison is about the flood.
    for _ in 0..200 {
        let _ = http.get(format!("{base}/healthz")).send().await;
    }
    let before = rss_kib(process.0.id());

    const REQUESTS: usize = 5_000;
    const WORKERS: usize = 8;
    let mut tasks = Vec::new();
    for worker in 0..WORKERS {
        let http = http.clone();
        let base = base.clone();
        tasks.push(tokio::spawn(async move {
            for i in (worker..REQUESTS).step_by(WORKERS) {
                let answer = http
                    .request(method(i, 2048), format!("{base}/v1/volumes/x"))
                    .send()
                    .await
                    .unwrap();
                assert!(answer.status().is_client_error(), "{}", answer.status());
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(300), task)
            .await
            .expect("the flood finishes")
            .unwrap();
    }
    let after = rss_kib(process.0.id());
    assert!(
        after < before + 8 * 1024,
        "RSS grew from {before} KiB to {after} KiB over {REQUESTS} unique methods"
    );

    let metrics = setup.metrics().await;
    assert!(
        metrics.len() < 64 * 1024,
        "{} bytes of metrics",
        metrics.len()
    );
    assert!(
        metrics.contains("method=\"other\""),
        "unknown methods count as other"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn modes_and_owners_outside_the_policy_are_refused_and_nothing_is_made() {
    let setup = setup();
    let _process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;
    let http = setup.https();
    let base = format!("https://localhost:{}", setup.port);
    for (path, body, needle) in [
        ("suid", r#"{"mode":"4777","capacity_bytes":1}"#, "setuid"),
        ("all", r#"{"mode":"7777","capacity_bytes":1}"#, "setuid"),
        (
            "sgid",
            r#"{"mode":"2775","capacity_bytes":1}"#,
            "policy.allow_setgid",
        ),
        (
            "root",
            r#"{"mode":"0770","uid":0,"capacity_bytes":1}"#,
            "policy.allow_root_owner",
        ),
        (
            "rootgroup",
            r#"{"mode":"0770","gid":0,"capacity_bytes":1}"#,
            "policy.allow_root_owner",
        ),
    ] {
        let answer = http
            .put(format!("{base}/v1/volumes/ns/{path}"))
            .bearer_auth(setup.token())
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 403, "{path}");
        let error: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(error["code"], "forbidden", "{error}");
        assert!(
            error["message"].as_str().unwrap().contains(needle),
            "{error}"
        );
        assert!(
            !setup.root.join("ns").join(path).exists(),
            "{path} was made"
        );
    }
    // The default path of a class without mode, uid or gid still provisions.
    let answer = http
        .put(format!("{base}/v1/volumes/ns/plain"))
        .bearer_auth(setup.token())
        .header("content-type", "application/json")
        .body(r#"{"capacity_bytes":1}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 201);
}

/// Starts the agent and expects it to refuse, with one line on stderr containing `needle`.
fn refuses_to_start(setup: &Setup, extra: &[&str], needle: &str) {
    use std::io::Read;
    use wait_timeout::ChildExt;
    let mut child = Process(
        Command::new(agent_binary())
            .args(["run", "--config"])
            .arg(setup.etc.join(files::CONFIG))
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // A refusal comes at once; an agent still running after this started after all.
    let status = child.0.wait_timeout(Duration::from_secs(20)).unwrap();
    let mut stderr = String::new();
    if status.is_some() {
        let _ = child.0.stderr.take().unwrap().read_to_string(&mut stderr);
    }
    assert!(
        status.is_some_and(|s| !s.success()),
        "the agent started instead of refusing ({needle}): {stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "one line: {stderr}");
    assert!(stderr.contains(needle), "{stderr}");
}

#[test]
fn secrets_others_can_read_or_replace_refuse_start() {
    let setup = setup();
    let chmod = |name: &str, mode: u32| {
        std::fs::set_permissions(setup.etc.join(name), std::fs::Permissions::from_mode(mode))
            .unwrap();
    };
    chmod(files::SERVER_KEY, 0o644);
    refuses_to_start(&setup, &[], "chmod 600");
    chmod(files::SERVER_KEY, 0o600);
    chmod(files::TOKEN, 0o666);
    refuses_to_start(&setup, &[], "token");
    chmod(files::TOKEN, 0o600);
    std::fs::set_permissions(&setup.etc, std::fs::Permissions::from_mode(0o777)).unwrap();
    refuses_to_start(&setup, &[], "directory is writable");
}

#[test]
fn a_flag_cannot_switch_off_configured_authentication() {
    let setup = setup();
    refuses_to_start(
        &setup,
        &["--insecure-dev-no-auth"],
        "would switch off the authentication",
    );
}

/// The agent with short connection timeouts, for the tests that wait for them.
fn short_timeouts(setup: &Setup) {
    let config = setup.etc.join(files::CONFIG);
    let text = std::fs::read_to_string(&config).unwrap();
    let text = text
        .replace(
            "request_timeout_seconds = 120\n",
            "request_timeout_seconds = 2\n",
        )
        .replace(
            "header_read_timeout_seconds = 10\n",
            "header_read_timeout_seconds = 2\n",
        )
        .replace("idle_timeout_seconds = 300\n", "idle_timeout_seconds = 3\n");
    std::fs::write(&config, text).unwrap();
}

/// Reads until the agent closes the connection; how long that took.
async fn closed_after(mut stream: impl tokio::io::AsyncRead + Unpin) -> Duration {
    use tokio::io::AsyncReadExt;
    let started = std::time::Instant::now();
    let mut buf = [0u8; 1024];
    let closed = tokio::time::timeout(Duration::from_secs(60), async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the agent kept the connection open for a minute"
    );
    started.elapsed()
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_and_slow_connections_are_closed_while_healthz_answers() {
    use tokio::io::AsyncWriteExt;
    let setup = setup();
    short_timeouts(&setup);
    let _process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;

    let silent = setup.tls_connection(&[]).await;
    let mut slow = setup.tls_connection(&[]).await;
    slow.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    slow.flush().await.unwrap();
    let silent = tokio::spawn(closed_after(silent));
    let slow = tokio::spawn(closed_after(slow));

    // Both hold their connection; the agent still answers others.
    setup.client().healthz().await.unwrap();

    let (silent, slow) = (silent.await.unwrap(), slow.await.unwrap());
    assert!(slow >= Duration::from_secs(1), "closed after {slow:?}");
    assert!(silent >= Duration::from_secs(1), "closed after {silent:?}");
    setup.client().healthz().await.unwrap();
}

/// Waits, without letting this thread's runtime run, until the kernel shows a client
/// socket to `port` in CLOSE_WAIT: the agent closed it and the client has not read that.
fn await_close_wait_towards(port: u16) {
    let remote = format!(":{port:04X} ");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        // Fields: sl, local_address, rem_address, st (08 = CLOSE_WAIT), ...
        let closed = table.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && format!("{} ", fields[2]).ends_with(&remote) && fields[3] == "08"
        });
        if closed {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the agent never closed the idle connection"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The agent closes a kept-alive connection left idle past its header-read timeout, while
/// the client's pool keeps it longer. A client whose runtime was busy when the close came
/// (this test's single thread is blocked) sends its next request on that connection; it
/// still gets its answer, the request going out once more on a new connection.
#[tokio::test(flavor = "current_thread")]
async fn a_client_busy_while_the_agent_closed_its_idle_connection_gets_its_next_answer() {
    let setup = setup();
    short_timeouts(&setup);
    let _process = Process(setup.spawn());
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let path = nfsprov_api_types::VolumePath::parse("ns/kept-alive").unwrap();
    assert_eq!(client.get_volume(&path, None).await.unwrap(), None);

    await_close_wait_towards(setup.port);
    let answer = client.get_volume(&path, None).await;
    assert!(
        matches!(answer, Ok(None)),
        "the request on the connection the agent closed failed: {answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_thousand_idle_connections_do_not_stop_healthz() {
    // Room for the connections in this process and in the agent, which inherits it.
    let wanted = rustix::process::Rlimit {
        current: Some(8192),
        maximum: Some(8192),
    };
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let raised = rustix::process::Rlimit {
        current: wanted.current.min(limit.maximum.or(wanted.maximum)),
        maximum: limit.maximum,
    };
    rustix::process::setrlimit(rustix::process::Resource::Nofile, raised).unwrap();

    let setup = setup();
    let _process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;
    // From many addresses, each within its share of strangers.
    let mut idle = Vec::new();
    for n in 0..1000 {
        idle.push(setup.tls_connection_from(other_source(n, 40), &[]).await);
    }
    setup
        .client()
        .healthz()
        .await
        .expect("healthz answers with 1,000 idle connections open");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread")]
async fn over_http2_refusals_arrive_as_json_not_as_resets() {
    let setup = setup();
    let _process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;
    let http = setup.https();
    let base = format!("https://localhost:{}", setup.port);
    // Larger than HTTP/2's initial flow-control window, so the client is still sending.
    let body = vec![b'{'; 512 * 1024];
    for _ in 0..20 {
        let answer = http
            .put(format!("{base}/v1/volumes/ns/h2"))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .expect("an answer, not a reset");
        assert_eq!(answer.version(), reqwest::Version::HTTP_2);
        assert_eq!(answer.status().as_u16(), 401);
        let error: serde_json::Value = answer.json().await.unwrap();
        assert_eq!(error["code"], "unauthenticated", "{error}");

        let oversized = http
            .put(format!("{base}/v1/volumes/ns/h2"))
            .bearer_auth(setup.token())
            .header("content-type", "application/json")
            .body(vec![b' '; 256 * 1024])
            .send()
            .await
            .expect("an answer, not a reset");
        assert_eq!(oversized.status().as_u16(), 413);
        let error: serde_json::Value = oversized.json().await.unwrap();
        assert_eq!(error["code"], "payload_too_large", "{error}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_concurrency_limit_holds_across_routes() {
    use tokio::io::AsyncWriteExt;
    let setup = setup();
    let config = setup.etc.join(files::CONFIG);
    let text = std::fs::read_to_string(&config).unwrap();
    assert!(text.contains("max_concurrent_requests = 256\n"));
    std::fs::write(
        &config,
        text.replace(
            "max_concurrent_requests = 256\n",
            "max_concurrent_requests = 1\n",
        ),
    )
    .unwrap();
    let _process = Process(setup.spawn());
    setup.wait_healthy(&setup.client()).await;

    // A create whose body is still on its way holds the only slot.
    let mut slow = setup.tls_connection(&[]).await;
    let body = br#"{"capacity_bytes":1}"#;
    slow.write_all(
        format!(
            "PUT /v1/volumes/held HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            setup.token(),
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    slow.write_all(&body[..5]).await.unwrap();
    slow.flush().await.unwrap();

    // Another route and method waits for it: the limit is the whole service's.
    let http = setup.https();
    let info = format!("https://localhost:{}/v1/info", setup.port);
    let waiting = tokio::spawn({
        let (http, info, token) = (http.clone(), info.clone(), setup.token());
        async move { http.get(info).bearer_auth(token).send().await }
    });
    let early = tokio::time::timeout(Duration::from_secs(2), async {
        while !waiting.is_finished() {
            tokio::task::yield_now().await;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        early.is_err(),
        "GET /v1/info was answered while the only slot was taken"
    );

    slow.write_all(&body[5..]).await.unwrap();
    slow.flush().await.unwrap();
    let answer = waiting.await.unwrap().unwrap();
    assert_eq!(answer.status().as_u16(), 200);
}
