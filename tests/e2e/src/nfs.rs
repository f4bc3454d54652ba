//! A real NFS server (nfs-ganesha with the VFS backend, NFSv4 over TCP on loopback) and a
//! real userspace NFS client (libnfs-utils: nfs-cp, nfs-cat, nfs-ls); no kernel mount.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nfsprov_agent_testkit::ganesha;

/// A running ganesha exporting some directories; killed when dropped.
pub struct NfsServer {
    port: u16,
    /// The NFSv3 mount protocol's port, when NFSv3 is served.
    mount_port: Option<u16>,
    child: Option<Child>,
    work: tempfile::TempDir,
}

impl NfsServer {
    /// Exports each directory read-write, without root squashing, at its own path.
    pub async fn start(exports: &[&Path]) -> anyhow::Result<Self> {
        Self::start_serving(exports, None).await
    }

    /// As [`NfsServer::start`], serving NFSv3 too, its mount protocol on a port of its
    /// own: libnfs-utils' `nfs-cp` writes a file of more than about 4 KB only over NFSv3.
    /// ganesha serves NFSv3 only when it can register it with a running rpcbind.
    pub async fn start_with_v3(exports: &[&Path]) -> anyhow::Result<Self> {
        Self::start_serving(exports, Some(crate::free_port()?)).await
    }

    async fn start_serving(exports: &[&Path], mount_port: Option<u16>) -> anyhow::Result<Self> {
        anyhow::ensure!(!exports.is_empty(), "nothing to export");
        let work = tempfile::tempdir()?;
        let port = crate::free_port()?;
        std::fs::write(
            work.path().join("ganesha.conf"),
            config_text(port, mount_port, exports, work.path()),
        )?;
        let child = ganesha::spawn(Command::new("ganesha.nfsd"), work.path())?;
        let server = Self {
            port,
            mount_port,
            child: Some(child),
            work,
        };
        let probe = server.url(&exports[0].display().to_string());
        crate::eventually(
            "the NFS export to be served",
            Duration::from_secs(60),
            || {
                let probe = probe.clone();
                async move {
                    tokio::task::spawn_blocking(move || nfs_ls(&probe).is_ok())
                        .await
                        .unwrap_or(false)
                }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}; ganesha log:\n{}", server.log_text()))?;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// URL of `path` (absolute, as clients mount it) on this server.
    pub fn url(&self, path: &str) -> String {
        nfs_url("127.0.0.1", self.port, path)
    }

    /// The NFSv3 URL of `path` on `server`, when NFSv3 is served.
    pub fn v3_url(&self, server: &str, path: &str) -> Option<String> {
        let mount_port = self.mount_port?;
        Some(format!(
            "nfs://{server}{path}?version=3&nfsport={}&mountport={mount_port}",
            self.port
        ))
    }

    pub fn log_text(&self) -> String {
        ganesha::log_text(self.work.path())
    }
}

impl Drop for NfsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// An NFSv4 URL for libnfs with an explicit port (no portmapper here).
pub use nfsprov_agent_testkit::ganesha::nfs_url;

fn config_text(port: u16, mount_port: Option<u16>, exports: &[&Path], work: &Path) -> String {
    let mut text = ganesha::core_config(port, Some("127.0.0.1"), work);
    let protocols = match mount_port {
        Some(mount_port) => {
            // The shared core says NFSv4 only; NFSv3 adds its mount protocol's port.
            let v3 = format!("Protocols = 3, 4;\n  MNT_Port = {mount_port};");
            text = text.replacen("Protocols = 4;", &v3, 1);
            "3, 4"
        }
        None => "4",
    };
    for (id, export) in exports.iter().enumerate() {
        let path = export.display();
        let _ = write!(
            text,
            "EXPORT {{\n  Export_Id = {};\n  Path = \"{path}\";\n  Pseudo = \"{path}\";\n  Protocols = {protocols};\n  \
             Transports = TCP;\n  Access_Type = RW;\n  Squash = No_Root_Squash;\n  SecType = sys;\n  \
             Attr_Expiration_Time = 0;\n  FSAL {{ Name = VFS; }}\n}}\n",
            id + 1
        );
    }
    text
}

fn with_identity(url: &str, uid: Option<u32>, gid: Option<u32>) -> String {
    let mut url = url.to_owned();
    if let Some(uid) = uid {
        let _ = write!(url, "&uid={uid}");
    }
    if let Some(gid) = gid {
        let _ = write!(url, "&gid={gid}");
    }
    url
}

fn run(command: &mut Command) -> anyhow::Result<Vec<u8>> {
    let output = command.stdin(Stdio::null()).output()?;
    anyhow::ensure!(
        output.status.success(),
        "{:?} failed ({}): {}",
        command,
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(output.stdout)
}

/// Writes a file over NFS as `uid`/`gid` (root when `None`).
pub fn nfs_write(
    url: &str,
    contents: &[u8],
    uid: Option<u32>,
    gid: Option<u32>,
) -> anyhow::Result<()> {
    let staged = tempfile::NamedTempFile::new()?;
    std::fs::write(staged.path(), contents)?;
    run(Command::new("nfs-cp")
        .arg(staged.path())
        .arg(with_identity(url, uid, gid)))
    .map(drop)
}

/// Reads a whole file over NFS.
pub fn nfs_read(url: &str) -> anyhow::Result<Vec<u8>> {
    run(Command::new("nfs-cat").arg(url))
}

/// Lists a directory over NFS (`ls -l` style lines).
pub fn nfs_ls(url: &str) -> anyhow::Result<String> {
    run(Command::new("nfs-ls").arg(url)).map(|out| String::from_utf8_lossy(&out).into_owned())
}
