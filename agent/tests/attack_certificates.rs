//! Client certificates the CA signed but that must not open the agent: one without the
//! clientAuth extended key usage (a server's, or one with no stated purpose at all), and
//! one whose name is not on `tls.allowed_client_names`. Each refusal is a failed
//! handshake that the agent logs. Against the real agent binary over real HTTPS.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::agent_process::{Setup, agent_binary, setup};
use nfsprov_agent::init::files;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The agent process, killed when dropped.
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A client CA of the test's own, which the agent is told to trust for clients.
struct ClientCa(CertifiedIssuer<'static, KeyPair>);

impl ClientCa {
    fn new() -> Self {
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "test client CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        Self(CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap())
    }

    /// A leaf for `common_name` with exactly the extended key usages given, as PEM
    /// certificate followed by PEM key.
    fn leaf(&self, common_name: &str, usages: &[ExtendedKeyUsagePurpose]) -> Vec<u8> {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, common_name);
        params.extended_key_usages = usages.to_vec();
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = params.signed_by(&key, &self.0).unwrap();
        format!("{}{}", cert.pem(), key.serialize_pem()).into_bytes()
    }
}

/// Points the agent's client CA at `ca`, with `allowed` names when given, and starts it
/// with its log in a file.
async fn start(
    setup: &Setup,
    ca: &ClientCa,
    allowed: Option<&str>,
) -> (Process, std::path::PathBuf) {
    let ca_file = setup.etc.join("test-client-ca.pem");
    std::fs::write(&ca_file, ca.0.pem()).unwrap();
    let config = setup.etc.join(files::CONFIG);
    let text = std::fs::read_to_string(&config).unwrap();
    let mut tls = format!("client_ca_file = {:?}\n", ca_file.display().to_string());
    if let Some(allowed) = allowed {
        tls.push_str(&format!("allowed_client_names = [{allowed:?}]\n"));
    }
    let start = text
        .find("client_ca_file = ")
        .expect("init writes client_ca_file");
    let end = start + text[start..].find('\n').unwrap() + 1;
    std::fs::write(&config, format!("{}{tls}{}", &text[..start], &text[end..])).unwrap();

    let log = setup.etc.join("agent.log");
    let process = Process(
        Command::new(agent_binary())
            .args(["run", "--config"])
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    setup.wait_healthy(&setup.client()).await;
    (process, log)
}

/// How many failed handshakes the agent has logged so far.
fn refusals_logged(log: &std::path::Path) -> usize {
    std::fs::read_to_string(log)
        .unwrap()
        .matches("TLS handshake failed")
        .count()
}

/// Lists volumes presenting `identity` and no token: the status, or the error when the
/// connection was refused.
async fn list_with(setup: &Setup, identity: &[u8]) -> Result<u16, String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let server_ca = std::fs::read(setup.etc.join(files::CA_CERT)).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&server_ca).unwrap())
        .identity(reqwest::Identity::from_pem(identity).unwrap())
        .timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    client
        .get(format!("https://localhost:{}/v1/volumes", setup.port))
        .send()
        .await
        .map(|answer| answer.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

#[tokio::test(flavor = "multi_thread")]
async fn a_ca_signed_certificate_without_client_auth_is_refused() {
    let setup = setup();
    let ca = ClientCa::new();
    let (_process, log) = start(&setup, &ca, None).await;

    let client = ca.leaf("nfsprov-controller", &[ExtendedKeyUsagePurpose::ClientAuth]);
    assert_eq!(list_with(&setup, &client).await, Ok(200));

    let server = ca.leaf("nfsprov-controller", &[ExtendedKeyUsagePurpose::ServerAuth]);
    let refused = list_with(&setup, &server).await;
    assert!(
        refused.is_err(),
        "a server certificate opened the API: {refused:?}"
    );

    let no_purpose = ca.leaf("nfsprov-controller", &[]);
    let refused = list_with(&setup, &no_purpose).await;
    assert!(
        refused.is_err(),
        "a certificate without purpose opened the API: {refused:?}"
    );

    // The client may see the handshake fail before the agent has written its line.
    common::wait_for("both refusals in the log", Duration::from_secs(10), || {
        refusals_logged(&log) >= 2
    })
    .await;
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged
            .lines()
            .filter(|line| line.contains("TLS handshake failed"))
            .all(|line| line.contains("127.0.0.1:")),
        "each with the peer's address:\n{logged}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn only_allowed_client_names_are_accepted() {
    let setup = setup();
    let ca = ClientCa::new();
    let (_process, _log) = start(&setup, &ca, Some("nfsprov-controller")).await;

    let allowed = ca.leaf("nfsprov-controller", &[ExtendedKeyUsagePurpose::ClientAuth]);
    assert_eq!(list_with(&setup, &allowed).await, Ok(200));

    let other = ca.leaf("billing-service", &[ExtendedKeyUsagePurpose::ClientAuth]);
    let refused = list_with(&setup, &other).await;
    assert!(
        refused.is_err(),
        "a name off the list opened the API: {refused:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn failed_handshakes_are_logged_at_a_bounded_rate() {
    let setup = setup();
    let ca = ClientCa::new();
    let (_process, log) = start(&setup, &ca, None).await;
    let server = ca.leaf("nfsprov-controller", &[ExtendedKeyUsagePurpose::ServerAuth]);
    let started = std::time::Instant::now();
    for _ in 0..200 {
        assert!(list_with(&setup, &server).await.is_err());
    }
    common::wait_for("a refusal in the log", Duration::from_secs(10), || {
        refusals_logged(&log) >= 1
    })
    .await;
    let seconds = started.elapsed().as_secs() + 1;
    // At most 20 lines a second, plus one line a second counting the rest.
    let logged = std::fs::read_to_string(&log).unwrap();
    let lines = logged.matches("TLS handshake failed").count() as u64;
    assert!(
        lines <= 20 * (seconds + 1),
        "{lines} lines in {seconds} s:\n{logged}"
    );
    assert!(lines >= 1, "{logged}");
}
