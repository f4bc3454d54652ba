//! Strangers cannot take the controller's connections: floods of unauthenticated HTTP/2
//! connections kept alive by PINGs, of HTTP/1.1 keep-alive health checks, and of TLS
//! handshakes left half-open, each while an authenticated client (by token and by
//! certificate, on a new connection every time) gets every answer within a second.
//! Against the real agent binary over HTTPS. The floods come from other loopback
//! addresses than the authenticated client, as pods other than the controller's would.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::agent_process::{Setup, other_source};
use common::logged_agent::LoggedAgent;
use nfsprov_agent::init::files;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

/// One flood at a time: each needs the machine's cores to itself for its deadlines to
/// mean anything.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// How long the authenticated client probes while a flood goes on: longer than every
/// stranger's deadline, so the flood's re-opened connections are met too.
const PROBING: Duration = Duration::from_secs(20);
/// Each probe's limit: a hang detector with a wide margin over a loopback answer.
const PROBE_LIMIT: Duration = Duration::from_secs(1);

/// The descriptors the floods need, on both sides of loopback (the agent inherits it).
fn raise_open_file_limit() {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let limit = getrlimit(Resource::Nofile);
    let wanted = limit.maximum.unwrap_or(65_536).min(65_536);
    if limit.current.is_some_and(|current| current < wanted) {
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(wanted),
                maximum: limit.maximum,
            },
        )
        .unwrap();
    }
}

/// The address of the flood's source `n` of `sources` (never the authenticated
/// client's).
fn source(n: usize, sources: usize) -> SocketAddr {
    SocketAddr::new(IpAddr::V4(other_source(n, sources)), 0)
}

async fn connect_from(from: SocketAddr, port: u16) -> std::io::Result<TcpStream> {
    let socket = TcpSocket::new_v4()?;
    socket.bind(from)?;
    socket
        .connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))
        .await
}

fn tls_connector(setup: &Setup, alpn: &[u8]) -> tokio_rustls::TlsConnector {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(setup.etc.join(files::CA_CERT)).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let mut config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// The agent with `limits` changed as `edit` says, serving once it answers.
async fn agent(setup: &Setup, edit: impl Fn(String) -> String) -> LoggedAgent {
    let config = setup.etc.join(files::CONFIG);
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, edit(text)).unwrap();
    let agent = LoggedAgent::spawn(setup);
    setup.wait_healthy(&setup.client()).await;
    agent
}

/// Probes the agent for [`PROBING`] from its own thread and runtime (so the flood's
/// tasks cannot delay it): `/v1/info` by token and by client certificate in turn, each on
/// a new connection. The failures, each with how it failed.
fn probe_while_flooded(setup: &Setup) -> std::thread::JoinHandle<(usize, Duration, Vec<String>)> {
    let (port, etc) = (setup.port, setup.etc.clone());
    // A client of its own for each probe: a new connection every time.
    let client = move |by_certificate: bool| {
        nfsprov_api_types::client::AgentClient::new(
            &nfsprov_api_types::client::AgentConnectionConfig {
                name: "probe".into(),
                url: format!("https://localhost:{port}"),
                ca_file: etc.join(files::CA_CERT),
                token_file: (!by_certificate).then(|| etc.join(files::TOKEN)),
                client_cert_file: by_certificate.then(|| etc.join(files::CONTROLLER_CERT)),
                client_key_file: by_certificate.then(|| etc.join(files::CONTROLLER_KEY)),
                timeout_seconds: 60,
                nfs_server: None,
                nfs_path: None,
                default: false,
            },
        )
        .unwrap()
    };
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async move {
            let started = Instant::now();
            let mut probes = 0;
            let mut slowest = Duration::ZERO;
            let mut failures = Vec::new();
            while started.elapsed() < PROBING {
                let by_certificate = probes % 2 == 1;
                let how = if by_certificate {
                    "certificate"
                } else {
                    "token"
                };
                let client = client(by_certificate);
                probes += 1;
                let asked = Instant::now();
                match tokio::time::timeout(PROBE_LIMIT, client.info(None)).await {
                    Ok(Ok(_)) => slowest = slowest.max(asked.elapsed()),
                    Ok(Err(error)) => {
                        failures.push(format!("{how} probe at {:?}: {error}", started.elapsed()))
                    }
                    Err(_) => failures.push(format!(
                        "{how} probe at {:?}: no answer within {PROBE_LIMIT:?}",
                        started.elapsed()
                    )),
                }
                tokio::time::sleep(Duration::from_millis(200).saturating_sub(asked.elapsed()))
                    .await;
            }
            (probes, slowest, failures)
        })
    })
}

/// Waits for the prober and fails the test with its failures, if any.
async fn assert_every_probe_answered(
    prober: std::thread::JoinHandle<(usize, Duration, Vec<String>)>,
) {
    let (probes, slowest, failures) = tokio::task::spawn_blocking(move || prober.join().unwrap())
        .await
        .unwrap();
    assert!(probes >= 20, "only {probes} probes were made");
    assert!(
        failures.is_empty(),
        "{} of {probes} authenticated probes failed during the flood:\n{}",
        failures.len(),
        failures.join("\n")
    );
    eprintln!("{probes} authenticated probes, every one answered; the slowest in {slowest:?}");
}

/// A value of the agent's metrics (0 when absent).
async fn metric(setup: &Setup, series: &str) -> f64 {
    let text = setup.metrics().await;
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread")]
async fn thousands_of_http2_connections_kept_alive_by_pings_lock_nobody_out() {
    const CONNECTIONS: usize = 4096;
    /// A few pods, each with far more connections than its share.
    const SOURCES: usize = 4;
    /// Far more often than any idle timeout, so only a deadline that PINGs do not reset
    /// can close them.
    const PING_EVERY: Duration = Duration::from_secs(5);
    let _alone = ONE_AT_A_TIME.lock().await;
    raise_open_file_limit();
    let setup = common::agent_process::setup();
    let _agent = agent(&setup, |text| text).await;

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    // Bounds the flood's own cost: handshakes this side in flight at once.
    let connecting = Arc::new(tokio::sync::Semaphore::new(64));
    let connector = tls_connector(&setup, b"h2");
    let port = setup.port;
    let mut flood = tokio::task::JoinSet::new();
    for n in 0..CONNECTIONS {
        let (stop, opened, connecting, connector) = (
            stop.clone(),
            opened.clone(),
            connecting.clone(),
            connector.clone(),
        );
        flood.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let connection = async {
                    let _turn = connecting.acquire().await.ok()?;
                    let tcp = connect_from(source(n, SOURCES), port).await.ok()?;
                    let tls = connector
                        .connect("localhost".try_into().unwrap(), tcp)
                        .await
                        .ok()?;
                    h2::client::handshake(tls).await.ok()
                };
                if let Some((client, mut connection)) = connection.await {
                    // Held: a connection whose handles are all gone closes itself.
                    let _requests = client;
                    let mut ping_pong = connection.ping_pong().unwrap();
                    let driver = tokio::spawn(connection);
                    let mut answered = false;
                    // Open as long as PINGs are answered.
                    while !stop.load(Ordering::Relaxed)
                        && ping_pong.ping(h2::Ping::opaque()).await.is_ok()
                    {
                        if !answered {
                            answered = true;
                            opened.fetch_add(1, Ordering::Relaxed);
                        }
                        tokio::time::sleep(PING_EVERY).await;
                    }
                    driver.abort();
                }
                // Re-opened, as an attacker would, at a pace this side can afford.
                tokio::time::sleep(Duration::from_millis(2000 + (n as u64 % 1000))).await;
            }
        });
    }
    // The flood is in full swing before the probing starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    while opened.load(Ordering::Relaxed) < 512 {
        assert!(
            Instant::now() < deadline,
            "the flood opened only {} connections",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_every_probe_answered(probe_while_flooded(&setup)).await;
    stop.store(true, Ordering::Relaxed);
    flood.abort_all();
    eprintln!(
        "HTTP/2 connections opened and answering PINGs: {}",
        opened.load(Ordering::Relaxed)
    );
    let closed_for_deadline = metric(
        &setup,
        "nfsprov_agent_connections_closed_total{reason=\"unauthenticated_timeout\"}",
    )
    .await;
    assert!(
        closed_for_deadline > 0.0,
        "no stranger's connection was closed for its deadline, PINGs or not"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn http1_keep_alive_health_checks_hold_no_place() {
    const CONNECTIONS: usize = 300;
    const SOURCES: usize = 10;
    const POLL_EVERY: Duration = Duration::from_secs(8);
    let _alone = ONE_AT_A_TIME.lock().await;
    raise_open_file_limit();
    let setup = common::agent_process::setup();
    // As many places as keep-alive connections: on an agent that lets strangers keep
    // them, the controller finds none left.
    let _agent = agent(&setup, |text| {
        text.replace("max_connections = 4096", "max_connections = 300")
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let answered = Arc::new(AtomicUsize::new(0));
    let closed_by_agent = Arc::new(AtomicUsize::new(0));
    let connector = tls_connector(&setup, b"http/1.1");
    let port = setup.port;
    let mut flood = tokio::task::JoinSet::new();
    for n in 0..CONNECTIONS {
        let (stop, answered, closed_by_agent, connector) = (
            stop.clone(),
            answered.clone(),
            closed_by_agent.clone(),
            connector.clone(),
        );
        flood.spawn(async move {
            // Spread over the polling period, as independent clients would be.
            tokio::time::sleep(POLL_EVERY.mul_f64(n as f64 / CONNECTIONS as f64)).await;
            let mut open = None;
            while !stop.load(Ordering::Relaxed) {
                if open.is_none() {
                    open = async {
                        let tcp = connect_from(source(n, SOURCES), port).await.ok()?;
                        connector
                            .connect("localhost".try_into().unwrap(), tcp)
                            .await
                            .ok()
                    }
                    .await;
                }
                if let Some(connection) = open.as_mut() {
                    match health_check(connection).await {
                        Some(kept_alive) => {
                            answered.fetch_add(1, Ordering::Relaxed);
                            if !kept_alive {
                                closed_by_agent.fetch_add(1, Ordering::Relaxed);
                                open = None;
                            }
                        }
                        None => open = None,
                    }
                }
                tokio::time::sleep(POLL_EVERY).await;
            }
        });
    }
    // Every connection had its first answer before the probing starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    while answered.load(Ordering::Relaxed) < CONNECTIONS {
        assert!(
            Instant::now() < deadline,
            "only {} health checks were answered",
            answered.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_every_probe_answered(probe_while_flooded(&setup)).await;
    stop.store(true, Ordering::Relaxed);
    flood.abort_all();
    eprintln!(
        "health checks answered: {}, connections the agent closed after one: {}",
        answered.load(Ordering::Relaxed),
        closed_by_agent.load(Ordering::Relaxed)
    );
}

/// Sends `GET /healthz` on a kept-alive HTTP/1.1 connection and reads the answer:
/// whether the connection stays open after it, `None` when no answer came.
async fn health_check(connection: &mut tokio_rustls::client::TlsStream<TcpStream>) -> Option<bool> {
    connection
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\nConnection: keep-alive\r\n\r\n")
        .await
        .ok()?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 1024];
    let head_end = loop {
        if let Some(end) = answer.windows(4).position(|w| w == b"\r\n\r\n") {
            break end + 4;
        }
        let n = connection.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        answer.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&answer[..head_end]).to_ascii_lowercase();
    if !head.starts_with("http/1.1 200") {
        return None;
    }
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|value| value.trim().parse().ok())?;
    while answer.len() < head_end + length {
        let n = connection.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    Some(!head.lines().any(|line| line.trim() == "connection: close"))
}

#[tokio::test(flavor = "multi_thread")]
async fn half_open_tls_handshakes_reopened_fast_lock_nobody_out() {
    /// Connections opened each second, each sending the start of a ClientHello and
    /// nothing more.
    const RATE: u64 = 345;
    const SOURCES: usize = 16;
    /// The most this side keeps open: the oldest is closed to open a new one.
    const HELD: usize = 4096;
    let _alone = ONE_AT_A_TIME.lock().await;
    raise_open_file_limit();
    let setup = common::agent_process::setup();
    // Fewer places than the flood opens in a few seconds, so an agent that counts
    // handshakes against them is full long before the probing ends.
    let _agent = agent(&setup, |text| {
        text.replace("max_connections = 4096", "max_connections = 1024")
    })
    .await;

    let stop = Arc::new(AtomicBool::new(false));
    let opened = Arc::new(AtomicUsize::new(0));
    let flood = tokio::spawn({
        let (stop, opened) = (stop.clone(), opened.clone());
        let port = setup.port;
        async move {
            let mut held = std::collections::VecDeque::new();
            let mut tick = tokio::time::interval(Duration::from_micros(1_000_000 / RATE));
            while !stop.load(Ordering::Relaxed) {
                tick.tick().await;
                let n = opened.load(Ordering::Relaxed);
                let Ok(mut tcp) = connect_from(source(n, SOURCES), port).await else {
                    continue;
                };
                // A TLS record header announcing a 512-byte handshake message, and the
                // first bytes of it: the agent waits for the rest.
                if tcp
                    .write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01])
                    .await
                    .is_ok()
                {
                    opened.fetch_add(1, Ordering::Relaxed);
                    held.push_back(tcp);
                    if held.len() > HELD {
                        held.pop_front();
                    }
                }
            }
        }
    });
    // The flood has opened more than the agent has places before the probing starts.
    let deadline = Instant::now() + Duration::from_secs(120);
    while opened.load(Ordering::Relaxed) <= 1024 {
        assert!(
            Instant::now() < deadline && !flood.is_finished(),
            "the flood opened only {} handshakes",
            opened.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_every_probe_answered(probe_while_flooded(&setup)).await;
    stop.store(true, Ordering::Relaxed);
    flood.await.unwrap();
    eprintln!(
        "half-open handshakes opened: {}",
        opened.load(Ordering::Relaxed)
    );
    let evicted = metric(
        &setup,
        "nfsprov_agent_connections_closed_total{reason=\"handshake_evicted\"}",
    )
    .await;
    let refused = metric(
        &setup,
        "nfsprov_agent_connections_closed_total{reason=\"source_limit\"}",
    )
    .await;
    assert!(
        evicted + refused > 0.0,
        "the handshake budget was never full"
    );
}
