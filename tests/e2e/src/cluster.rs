//! The Kubernetes side of an end-to-end run: the API (the cluster of `E2E_KUBECONFIG`
//! when set, otherwise the simulator as a process) and controller processes.
//!
//! On a real cluster the controller runs with the credentials of
//! `E2E_CONTROLLER_KUBECONFIG` when set (the ServiceAccount of `deploy/`, so a verb
//! missing from its RBAC fails the scenario), while the scenarios act as the admin.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::binaries::binary;

/// The API server the system under test talks to.
pub struct KubeApi {
    kubeconfig: PathBuf,
    controller_kubeconfig: PathBuf,
    simulator: Option<Child>,
    _work: tempfile::TempDir,
}

impl KubeApi {
    /// A real cluster from `E2E_KUBECONFIG`, or a fresh simulator process.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_with(std::env::var_os("E2E_KUBECONFIG").map(PathBuf::from)).await
    }

    /// The cluster of `kubeconfig` when given, otherwise a fresh simulator process.
    pub async fn start_with(kubeconfig: Option<PathBuf>) -> anyhow::Result<Self> {
        let work = tempfile::tempdir()?;
        if let Some(kubeconfig) = kubeconfig {
            let controller_kubeconfig = std::env::var_os("E2E_CONTROLLER_KUBECONFIG")
                .map_or_else(|| kubeconfig.clone(), PathBuf::from);
            return Ok(Self {
                kubeconfig,
                controller_kubeconfig,
                simulator: None,
                _work: work,
            });
        }
        let kubeconfig = work.path().join("kubeconfig");
        let log = std::fs::File::create(work.path().join("kube-sim.log"))?;
        let child = Command::new(binary("nfsprov-kube-sim")?)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()?;
        let api = Self {
            controller_kubeconfig: kubeconfig.clone(),
            kubeconfig,
            simulator: Some(child),
            _work: work,
        };
        let path = api.kubeconfig.clone();
        crate::eventually(
            "the simulator's kubeconfig",
            Duration::from_secs(30),
            || {
                let path = path.clone();
                async move { path.exists() }
            },
        )
        .await?;
        Ok(api)
    }

    /// The simulator's address when the API is the simulator (for its `/_sim/` admin
    /// endpoints), read from the kubeconfig it wrote.
    pub fn simulator_url(&self) -> Option<SocketAddr> {
        self.simulator.as_ref()?;
        let text = std::fs::read_to_string(&self.kubeconfig).ok()?;
        text.lines()
            .find_map(|l| l.trim().strip_prefix("server:"))
            .map(|s| {
                s.trim()
                    .trim_matches('"')
                    .trim_start_matches("http://")
                    .to_owned()
            })
            .and_then(|hostport| hostport.trim_end_matches('/').parse().ok())
    }

    /// The admin's kubeconfig, which the scenarios act with.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubeconfig the controllers run with.
    pub fn controller_kubeconfig(&self) -> &Path {
        &self.controller_kubeconfig
    }

    /// A real cluster outlives the test and serves other tests, unlike a simulator.
    pub fn is_shared(&self) -> bool {
        self.simulator.is_none()
    }

    /// A stock kube client for this API.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(
            kubeconfig,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        Ok(kube::Client::try_from(config)?)
    }
}

impl Drop for KubeApi {
    fn drop(&mut self) {
        if let Some(mut child) = self.simulator.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A controller process; killed when dropped.
pub struct ControllerProcess {
    child: Option<Child>,
    http: SocketAddr,
    log: PathBuf,
    _work: tempfile::TempDir,
}

impl ControllerProcess {
    /// Starts `nfsprov-controller` against `api` with the agents of `agents_dir`.
    pub async fn start(
        api: &KubeApi,
        agents_dir: &Path,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_with(api, Some(agents_dir), extra_args).await
    }

    /// As [`ControllerProcess::start`]; without `agents_dir` the controller reads its
    /// agents from the labelled Secrets of its namespace, as the shipped Deployment runs.
    pub async fn start_with(
        api: &KubeApi,
        agents_dir: Option<&Path>,
        extra_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_within(api, agents_dir, extra_args, Duration::from_secs(60)).await
    }

    /// As [`ControllerProcess::start_with`], waiting up to `limit` for `/readyz`: a
    /// controller restarted among tens of thousands of objects lists them all first.
    pub async fn start_within(
        api: &KubeApi,
        agents_dir: Option<&Path>,
        extra_args: &[&str],
        limit: Duration,
    ) -> anyhow::Result<Self> {
        let work = tempfile::tempdir()?;
        let http: SocketAddr = format!("127.0.0.1:{}", crate::free_port()?).parse()?;
        let log = work.path().join("controller.log");
        let mut command = Command::new(binary("nfsprov-controller")?);
        command.arg("--kubeconfig").arg(api.controller_kubeconfig());
        if let Some(dir) = agents_dir {
            command.arg("--agents-dir").arg(dir);
        }
        let child = command
            .arg(format!("--http-addr={http}"))
            .args(extra_args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()?;
        let controller = Self {
            child: Some(child),
            http,
            log,
            _work: work,
        };
        crate::eventually("the controller to be ready", limit, || async {
            http_get(http, "/readyz").is_ok_and(|(status, _)| status == 200)
        })
        .await
        .map_err(|e| anyhow::anyhow!("{e}; controller log:\n{}", controller.log_text()))?;
        Ok(controller)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    pub fn metrics(&self) -> anyhow::Result<String> {
        Ok(http_get(self.http, "/metrics")?.1)
    }

    /// The process id while the process runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Peak resident memory so far (`VmHWM`), in bytes, while the process runs.
    pub fn peak_rss_bytes(&self) -> Option<u64> {
        self.memory_field("VmHWM:")
    }

    /// Resident memory now (`VmRSS`), in bytes, while the process runs.
    pub fn rss_bytes(&self) -> Option<u64> {
        self.memory_field("VmRSS:")
    }

    fn memory_field(&self, field: &str) -> Option<u64> {
        let pid = self.child.as_ref()?.id();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kib: u64 = status
            .lines()
            .find_map(|l| l.strip_prefix(field))?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        Some(kib * 1024)
    }

    /// SIGKILL, as a crash or an evicted pod.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for ControllerProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain HTTP/1.0 GET on loopback: status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    http_request(addr, "GET", path, "")
}

/// Calls one of the simulator's `/_sim/` admin endpoints; fails unless it answers 2xx.
pub fn sim_admin(addr: &SocketAddr, method: &str, path: &str, body: &str) -> anyhow::Result<()> {
    let (status, answer) = http_request(*addr, method, path, body)?;
    anyhow::ensure!(
        (200..300).contains(&status),
        "{method} {path}: {status} {answer}"
    );
    Ok(())
}

fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: &str,
) -> anyhow::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("no HTTP status in {response:?}"))?;
    let body = response
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_owned();
    Ok((status, body))
}
