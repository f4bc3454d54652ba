//! Availability against clients that announce a body and never send it: an
//! unauthenticated one is refused at once without holding anything authenticated work
//! needs, an authenticated one is cut off by its own short deadline, and the health
//! endpoints never wait behind either. Each against the real agent binary over HTTPS.

mod common;

use common::agent_process::{other_source, setup};
use common::logged_agent::{LoggedAgent, mtls_client, within_a_minute};
use nfsprov_agent::init::files;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The default `limits.max_concurrent_requests`: as many stalled requests as permits.
const STALLED: usize = 256;

/// The status line and headers of the first answer on `stream`.
async fn answer_head(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> String {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = stream.read(&mut buf).await.unwrap();
        assert!(
            n > 0,
            "closed before an answer: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// Authenticated work and the health endpoints answer: a token caller, an mTLS caller,
/// `/healthz` and `/readyz`.
async fn everyone_else_is_served(setup: &common::agent_process::Setup) {
    let token = setup.client();
    let mtls = mtls_client(setup);
    let (by_token, by_certificate, health, ready) = within_a_minute(
        "token /v1/info, mTLS /v1/info, /healthz and /readyz",
        async {
            tokio::join!(
                token.info(None),
                mtls.info(None),
                token.healthz(),
                token.readyz()
            )
        },
    )
    .await;
    by_token.expect("token /v1/info");
    by_certificate.expect("mTLS /v1/info");
    health.expect("/healthz");
    ready.expect("/readyz");
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_bodies_that_never_come_stall_nothing_over_http1() {
    let setup = setup();
    let _agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;

    // From as many addresses as it takes: each gets only its share of strangers.
    let mut stalled = Vec::new();
    for n in 0..STALLED {
        let mut connection = setup
            .tls_connection_from(other_source(n, 16), &[b"http/1.1"])
            .await;
        connection
            .write_all(
                b"PUT /v1/volumes/x HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n",
            )
            .await
            .unwrap();
        connection.flush().await.unwrap();
        stalled.push(connection);
    }

    everyone_else_is_served(&setup).await;

    // Each was refused without the agent waiting for its body.
    for connection in &mut stalled {
        let head =
            within_a_minute("the refusal of a body never sent", answer_head(connection)).await;
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn unauthenticated_bodies_that_never_come_stall_nothing_over_http2() {
    let setup = setup();
    let _agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;

    // Two connections of 128 streams each: headers announcing a body, never a byte of it.
    let mut answers = Vec::new();
    let mut bodies = Vec::new();
    for _ in 0..2 {
        let tls = setup.tls_connection(&[b"h2"]).await;
        let (mut client, mut connection) = h2::client::handshake(tls).await.unwrap();
        let mut ping_pong = connection.ping_pong().unwrap();
        tokio::spawn(connection);
        for _ in 0..STALLED / 2 {
            client = client.ready().await.unwrap();
            let request =
                http::Request::put(format!("https://localhost:{}/v1/volumes/x", setup.port))
                    .header("content-type", "application/json")
                    .header("content-length", "100")
                    .body(())
                    .unwrap();
            let (answer, body) = client.send_request(request, false).unwrap();
            answers.push(answer);
            bodies.push(body);
        }
        // The agent answers a PING after it has read every frame sent before it.
        within_a_minute(
            "the PING after the streams",
            ping_pong.ping(h2::Ping::opaque()),
        )
        .await
        .unwrap();
    }

    everyone_else_is_served(&setup).await;

    for answer in answers {
        let answer = within_a_minute("the refusal of a body never sent", answer)
            .await
            .expect("an answer, not a reset");
        assert_eq!(answer.status().as_u16(), 401);
    }
    drop(bodies);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_authenticated_body_that_never_comes_gets_408_at_its_own_deadline() {
    let setup = setup();
    let config = setup.etc.join(files::CONFIG);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace(
            "idle_timeout_seconds = 300\n",
            "idle_timeout_seconds = 300\nbody_read_timeout_seconds = 2\n",
        )
        .replace("\nbody_read_timeout_seconds = 10\n", "\n"),
    )
    .unwrap();
    let _agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;

    let mut connection = setup.tls_connection(&[b"http/1.1"]).await;
    connection
        .write_all(
            format!(
                "PUT /v1/volumes/slow HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{\"capa",
                setup.token()
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    connection.flush().await.unwrap();
    // The request deadline is two minutes; the body's own comes long before it.
    let head = within_a_minute(
        "the 408 of a body that stopped",
        answer_head(&mut connection),
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 408"), "{head}");
    let mut rest = Vec::new();
    // The connection closes after the answer: the rest of the body is never read.
    let _ = within_a_minute("the rest of the 408", connection.read_to_end(&mut rest)).await;
    let answer = format!("{head}{}", String::from_utf8_lossy(&rest));
    assert!(answer.contains("\"code\":\"timeout\""), "{answer}");
    assert!(!setup.root.join("slow").exists());
    everyone_else_is_served(&setup).await;
}

/// An unauthenticated upload too big to be read before the answer still gets its 401 as
/// JSON, over HTTP/1.1 and HTTP/2, from the real curl.
#[tokio::test(flavor = "multi_thread")]
async fn curl_sees_the_401_of_an_unread_upload() {
    let setup = setup();
    let _agent = LoggedAgent::spawn(&setup);
    setup.wait_healthy(&setup.client()).await;
    let upload = setup.etc.with_file_name("upload.json");
    std::fs::write(&upload, vec![b' '; 8 << 20]).unwrap();
    let url = format!("https://localhost:{}/v1/volumes/big", setup.port);
    for version in ["--http1.1", "--http2"] {
        for expect in ["Expect:", "Expect: 100-continue"] {
            let output = std::process::Command::new("curl")
                .args([
                    "-sS",
                    "--max-time",
                    "60",
                    "-o",
                    "-",
                    "-w",
                    "\n%{http_code}",
                    version,
                ])
                .arg("--cacert")
                .arg(setup.etc.join(files::CA_CERT))
                .args([
                    "-X",
                    "PUT",
                    "-H",
                    "Content-Type: application/json",
                    "-H",
                    expect,
                ])
                .arg("--data-binary")
                .arg(format!("@{}", upload.display()))
                .arg(&url)
                .output()
                .expect("curl must be installed");
            let stdout = String::from_utf8_lossy(&output.stdout);
            let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
            assert_eq!(
                status,
                "401",
                "{version} {expect}: {stdout} {}",
                String::from_utf8_lossy(&output.stderr)
            );
            let error: serde_json::Value = serde_json::from_str(body).unwrap();
            assert_eq!(error["code"], "unauthenticated", "{version} {expect}");
        }
    }
}
