//! Helpers shared by the agent's integration tests: the real `curl` binary and a
//! snapshot of a directory tree to prove that nothing changed on disk, running a system
//! tool, and a real ZFS pool.

#![allow(dead_code)]

pub mod agent_process;
pub mod backing;
pub mod jobs;
pub mod logged_agent;
pub mod tree;
pub mod zfs_pool;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nfsprov_agent::init::files;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::AgentClient;

/// What `curl` reported: the HTTP status (0 when no response), body and exit code.
#[derive(Debug)]
pub struct CurlResult {
    pub status: u16,
    pub body: String,
    pub exit_code: i32,
}

impl CurlResult {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| {
            panic!(
                "not JSON ({e}); status {}, curl exit {}: {:?}",
                self.status, self.exit_code, self.body
            )
        })
    }

    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// Runs the real curl with `args` and the agent's CA trusted.
pub fn curl(agent: &TestAgent, args: &[&str]) -> CurlResult {
    let ca = agent.credentials_dir().join(files::CA_CERT);
    let mut command = Command::new("curl");
    command
        .args([
            "-sS",
            "--max-time",
            "60",
            "-o",
            "-",
            "-w",
            "\n%{http_code}",
            "--cacert",
        ])
        .arg(&ca)
        .args(args);
    let output = command.output().expect("curl must be installed");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    let (body, status) = stdout.rsplit_once('\n').unwrap_or(("", &stdout));
    CurlResult {
        status: status.trim().parse().unwrap_or(0),
        body: body.to_owned(),
        exit_code: output.status.code().unwrap_or(-1),
    }
}

pub fn url(agent: &TestAgent, path: &str) -> String {
    format!("https://localhost:{}{path}", agent.addr().port())
}

pub fn bearer(agent: &TestAgent) -> String {
    let token = std::fs::read_to_string(agent.credentials_dir().join(files::TOKEN)).unwrap();
    format!("Authorization: Bearer {}", token.trim())
}

/// An authenticated curl call with the bearer token.
pub fn call(agent: &TestAgent, method: &str, path: &str, body: Option<&str>) -> CurlResult {
    let auth = bearer(agent);
    let target = url(agent, path);
    let mut args = vec!["--path-as-is", "-X", method, "-H", &auth];
    if let Some(body) = body {
        args.extend([
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            body,
        ]);
    }
    args.push(&target);
    curl(agent, &args)
}

/// Every entry beneath `root` (kind, mode, owner, size, link target), keyed by path.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let meta = std::fs::symlink_metadata(&path).unwrap();
        let kind = if meta.file_type().is_symlink() {
            format!("link->{}", std::fs::read_link(&path).unwrap().display())
        } else if meta.is_dir() {
            "dir".to_owned()
        } else {
            format!("file:{}", meta.len())
        };
        out.insert(
            path.strip_prefix(root).unwrap().to_owned(),
            format!("{kind} {:o} {}:{}", meta.mode(), meta.uid(), meta.gid()),
        );
        if meta.is_dir() {
            walk(root, &path, out);
        }
    }
}

/// Polls `condition` until it holds, failing the test after `limit`.
pub async fn wait_for(what: &str, limit: Duration, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

pub use nfsprov_agent_testkit::run;

/// The paths of the volumes the agent lists.
pub async fn volume_paths(client: &AgentClient) -> Vec<String> {
    client
        .list_volumes(None)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.path.to_string())
        .collect()
}

/// `source` bind-mounted on `point` until dropped.
pub struct BindMount<'a>(&'a Path);

impl<'a> BindMount<'a> {
    pub fn new(source: &Path, point: &'a Path) -> Self {
        run(
            "mount",
            &["--bind", source.to_str().unwrap(), point.to_str().unwrap()],
        )
        .unwrap();
        Self(point)
    }
}

impl Drop for BindMount<'_> {
    fn drop(&mut self) {
        let _ = run("umount", &[self.0.to_str().unwrap()]);
    }
}
