//! The agent as a real process: `init` into a temp dir, then the release-like binary
//! serving an export root beside it, reached over real HTTPS.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nfsprov_agent::init::{self, InitArgs, files};
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};

/// The binary under test: this tree's, or another build named by `NFSPROV_AGENT_BIN` (to
/// run the same attacks against a release build or an earlier version).
pub fn agent_binary() -> String {
    std::env::var("NFSPROV_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nfsprov-agent").to_owned())
}

/// The loopback address of source `n` of `sources` other than the usual client's
/// (127.0.0.2 onwards): many clients, as many pods would be.
pub fn other_source(n: usize, sources: usize) -> std::net::Ipv4Addr {
    std::net::Ipv4Addr::new(127, 0, 0, u8::try_from(2 + n % sources).unwrap())
}

pub struct Setup {
    _temp: tempfile::TempDir,
    pub root: PathBuf,
    pub etc: PathBuf,
    pub port: u16,
}

pub fn setup() -> Setup {
    let temp = tempfile::tempdir().unwrap();
    let root = temp.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let etc = temp.path().join("etc");
    // A port that was free a moment ago; the agent reports clearly if it is taken.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    init::run(&InitArgs {
        dir: etc.clone(),
        export_root: root.clone(),
        hostnames: vec!["localhost".into()],
        ips: vec!["127.0.0.1".parse().unwrap()],
        listen: format!("127.0.0.1:{port}"),
        name: "proc".into(),
        nfs_server: None,
        nfs_path: None,
        namespace: "nfsprov".into(),
        force: false,
        days: 1,
        // Test export roots are directories of a filesystem that holds more.
        shared_filesystem: true,
    })
    .unwrap();
    Setup {
        _temp: temp,
        root,
        etc,
        port,
    }
}

impl Setup {
    /// An HTTPS client that trusts the agent's CA (and presents no certificate).
    pub fn https(&self) -> reqwest::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let ca = std::fs::read(self.etc.join(files::CA_CERT)).unwrap();
        reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .build()
            .unwrap()
    }

    /// The bearer token `init` wrote.
    pub fn token(&self) -> String {
        std::fs::read_to_string(self.etc.join(files::TOKEN))
            .unwrap()
            .trim()
            .to_owned()
    }

    pub fn spawn(&self) -> Child {
        Command::new(agent_binary())
            .args(["run", "--config"])
            .arg(self.etc.join(files::CONFIG))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    /// The file of the debug-build hold `switch` (`NFSPROV_AGENT_HOLD_SNAPSHOTS`, ...),
    /// in the settings directory.
    fn hold_file(&self, switch: &str) -> PathBuf {
        self.etc.join(switch.to_lowercase())
    }

    /// Locks the file of the hold `switch`: an agent from [`Self::spawn_held`] keeps its
    /// finished copies waiting until the returned file is dropped.
    pub fn hold(&self, switch: &str) -> std::fs::File {
        let hold = std::fs::File::create(self.hold_file(switch)).unwrap();
        hold.lock().unwrap();
        hold
    }

    /// The agent as a process of its own whose jobs wait at the hold `switch` while the
    /// test holds the lock of [`Self::hold`].
    pub fn spawn_held(&self, switch: &str) -> Child {
        Command::new(agent_binary())
            .args(["run", "--config"])
            .arg(self.etc.join(files::CONFIG))
            .env(switch, self.hold_file(switch))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    }

    pub fn client(&self) -> AgentClient {
        AgentClient::new(&AgentConnectionConfig {
            name: "proc".into(),
            url: format!("https://localhost:{}", self.port),
            ca_file: self.etc.join(files::CA_CERT),
            token_file: Some(self.etc.join(files::TOKEN)),
            client_cert_file: None,
            client_key_file: None,
            timeout_seconds: 300,
            nfs_server: None,
            nfs_path: None,
            default: false,
        })
        .unwrap()
    }

    pub async fn wait_healthy(&self, client: &AgentClient) {
        for _ in 0..500 {
            if client.healthz().await.is_ok() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        panic!("the agent did not come up");
    }

    /// The agent's metrics, read with the token.
    pub async fn metrics(&self) -> String {
        self.https()
            .get(format!("https://localhost:{}/metrics", self.port))
            .bearer_auth(self.token())
            .send()
            .await
            .unwrap()
            .error_for_status()
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// A TLS connection to the agent offering the ALPN protocols `alpn` (none: the agent
    /// picks), handshake done, nothing sent yet.
    pub async fn tls_connection(
        &self,
        alpn: &[&[u8]],
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        self.tls_connection_from(std::net::Ipv4Addr::LOCALHOST, alpn)
            .await
    }

    /// Like [`Self::tls_connection`], from the loopback address `source` (the agent
    /// gives each source address only its share of unauthenticated connections).
    pub async fn tls_connection_from(
        &self,
        source: std::net::Ipv4Addr,
        alpn: &[&[u8]],
    ) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        use rustls_pki_types::CertificateDer;
        use rustls_pki_types::pem::PemObject;
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(self.etc.join(files::CA_CERT)).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let mut config = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
        let socket = tokio::net::TcpSocket::new_v4().unwrap();
        socket.bind((source, 0).into()).unwrap();
        let tcp = socket
            .connect((std::net::Ipv4Addr::LOCALHOST, self.port).into())
            .await
            .unwrap();
        connector
            .connect("localhost".try_into().unwrap(), tcp)
            .await
            .unwrap()
    }

    pub fn trash_entries(&self) -> usize {
        std::fs::read_dir(self.root.join(".nfsprov/trash")).map_or(0, |d| d.count())
    }
}
