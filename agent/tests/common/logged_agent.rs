//! The agent binary with its log kept in a file, so a test can read what it wrote, and
//! with its heap capped, so a test that makes an agent allocate without bound fails
//! instead of taking the machine's memory.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nfsprov_agent::init::files;

use super::agent_process::{Setup, agent_binary};

/// The heap an agent under test may have: far above what it needs, far below what a
/// runaway read would take.
const DATA_LIMIT_BYTES: u64 = 1 << 30;

/// The running agent, killed when dropped.
pub struct LoggedAgent {
    child: Child,
    log: PathBuf,
}

impl LoggedAgent {
    /// Starts `setup`'s agent with its log in `setup.etc`'s parent.
    pub fn spawn(setup: &Setup) -> Self {
        let log = setup.etc.with_file_name("agent.log");
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new("prlimit")
            .arg(format!("--data={DATA_LIMIT_BYTES}"))
            .arg("--")
            .arg(agent_binary())
            .args(["run", "--config"])
            .arg(setup.etc.join(files::CONFIG))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("prlimit (util-linux) must be installed");
        Self { child, log }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything the agent logged so far, as bytes (it may hold anything a tenant named).
    pub fn log(&self) -> Vec<u8> {
        std::fs::read(&self.log).unwrap()
    }

    /// Waits until the log holds `needle` at least `times` times.
    pub async fn await_log(&self, needle: &str, times: usize, limit: Duration) {
        let deadline = Instant::now() + limit;
        loop {
            let log = String::from_utf8_lossy(&self.log()).into_owned();
            if log.matches(needle).count() >= times {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the log never held {needle:?} {times} time(s); it holds:\n{}",
                log.chars().take(8000).collect::<String>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The agent's resident memory.
    pub fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).unwrap();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .expect("VmRSS in /proc/<pid>/status")
    }
}

impl Drop for LoggedAgent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A client that authenticates with the controller's certificate only (mTLS, no token).
pub fn mtls_client(setup: &Setup) -> nfsprov_api_types::client::AgentClient {
    nfsprov_api_types::client::AgentClient::new(&nfsprov_api_types::client::AgentConnectionConfig {
        name: "mtls".into(),
        url: format!("https://localhost:{}", setup.port),
        ca_file: setup.etc.join(files::CA_CERT),
        token_file: None,
        client_cert_file: Some(setup.etc.join(files::CONTROLLER_CERT)),
        client_key_file: Some(setup.etc.join(files::CONTROLLER_KEY)),
        timeout_seconds: 300,
        nfs_server: None,
        nfs_path: None,
        default: false,
    })
    .unwrap()
}

/// `work`'s result, or a failure naming `what` when it takes longer than a minute: a
/// hang detector, not a timing target.
pub async fn within_a_minute<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(60), work)
        .await
        .unwrap_or_else(|_| panic!("{what}: no answer within a minute"))
}

/// An HTTPS client speaking HTTP/1.1 only (whose header limits are the agent's own, not
/// HTTP/2's), trusting the agent's CA.
pub fn https_http1(setup: &Setup) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let ca = std::fs::read(setup.etc.join(files::CA_CERT)).unwrap();
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .http1_only()
        .build()
        .unwrap()
}
