//! nfs-ganesha with its D-Bus export manager on a private system bus: a `dbus-daemon`
//! of the test's own (open to every local user: it lives in the test's directory and
//! only ganesha and the agent use it), and ganesha
//! serving NFSv4 on loopback with no export but those its `%include` brings from the
//! directory the agent manages. Optionally ganesha runs in another mount namespace, where
//! a copy of a disk is mounted at the paths the original had, as after a reboot.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A private system bus; stopped when dropped.
pub struct PrivateBus {
    address: String,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl PrivateBus {
    pub async fn start() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("bus");
        let config = dir.path().join("bus.conf");
        std::fs::write(
            &config,
            format!(
                "<!DOCTYPE busconfig PUBLIC \"-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN\"\n \
                 \"http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd\">\n\
                 <busconfig>\n  <type>system</type>\n  <listen>unix:path={}</listen>\n  \
                 <auth>EXTERNAL</auth>\n  <policy context=\"default\">\n    <allow user=\"*\"/>\n    \
                 <allow own=\"org.ganesha.nfsd\"/>\n    <allow send_destination=\"*\" eavesdrop=\"false\"/>\n    \
                 <allow receive_sender=\"*\"/>\n  </policy>\n</busconfig>\n",
                socket.display()
            ),
        )?;
        let child = Command::new("dbus-daemon")
            .arg(format!("--config-file={}", config.display()))
            .arg("--nofork")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start dbus-daemon (Debian: dbus-daemon): {e}"))?;
        let bus = Self {
            address: format!("unix:path={}", socket.display()),
            child: Some(child),
            _dir: dir,
        };
        crate::eventually("the private bus to listen", Duration::from_secs(20), || {
            let ready = socket.exists();
            async move { ready }
        })
        .await?;
        Ok(bus)
    }

    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stops dbus-daemon (SIGSTOP) until the answer is resumed or dropped: the bus
    /// accepts connections and messages and answers none.
    pub fn pause(&self) -> anyhow::Result<Paused> {
        Paused::stop(self.child.as_ref(), "dbus-daemon")
    }
}

/// A process stopped with SIGSTOP; continued (SIGCONT) by [`Paused::resume`] or when
/// dropped, so a failing test leaves nothing stopped behind it.
pub struct Paused {
    pid: Option<rustix::process::Pid>,
}

impl Paused {
    fn stop(child: Option<&Child>, what: &str) -> anyhow::Result<Self> {
        let pid = child
            .and_then(|child| rustix::process::Pid::from_raw(child.id() as i32))
            .ok_or_else(|| anyhow::anyhow!("{what} is not running"))?;
        rustix::process::kill_process(pid, rustix::process::Signal::STOP)
            .map_err(|e| anyhow::anyhow!("cannot stop {what}: {e}"))?;
        Ok(Self { pid: Some(pid) })
    }

    /// Lets the process run again.
    pub fn resume(mut self) -> anyhow::Result<()> {
        self.cont()
    }

    fn cont(&mut self) -> anyhow::Result<()> {
        match self.pid.take() {
            Some(pid) => rustix::process::kill_process(pid, rustix::process::Signal::CONT)
                .map_err(|e| anyhow::anyhow!("cannot continue process {pid:?}: {e}")),
            None => Ok(()),
        }
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        let _ = self.cont();
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// ganesha on a private bus, including the agent's exports; stopped when dropped.
pub struct Ganesha {
    port: u16,
    bus: String,
    config_dir: PathBuf,
    /// The mount namespace ganesha runs in (`/proc/PID/ns/mnt`); `None`: this one.
    namespace: Option<PathBuf>,
    work: tempfile::TempDir,
    child: Option<Child>,
}

impl Ganesha {
    /// Starts ganesha on `bus`, its exports those `config_dir/exports.conf` includes.
    pub async fn start(bus: &PrivateBus, config_dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(config_dir)?;
        let include = config_dir.join("exports.conf");
        if !include.exists() {
            std::fs::write(&include, "")?;
        }
        Self::launch(bus, config_dir, None).await
    }

    /// Starts ganesha on `bus` inside the mount namespace `namespace` (a
    /// `/proc/PID/ns/mnt`), reading `config_dir/exports.conf` as that namespace shows
    /// it, exactly as found: nothing is made there first.
    pub async fn start_in_namespace(
        bus: &PrivateBus,
        config_dir: &Path,
        namespace: &Path,
    ) -> anyhow::Result<Self> {
        Self::launch(bus, config_dir, Some(namespace.to_owned())).await
    }

    async fn launch(
        bus: &PrivateBus,
        config_dir: &Path,
        namespace: Option<PathBuf>,
    ) -> anyhow::Result<Self> {
        let mut ganesha = Self {
            port: crate::free_port()?,
            bus: bus.address().to_owned(),
            config_dir: config_dir.to_owned(),
            namespace,
            work: tempfile::tempdir()?,
            child: None,
        };
        ganesha.spawn_on_a_free_port().await?;
        Ok(ganesha)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        self.spawn_within(Duration::from_secs(60)).await
    }

    /// Starts ganesha, waiting at most `limit` for its export manager to answer.
    async fn spawn_within(&mut self, limit: Duration) -> anyhow::Result<()> {
        let config = self.work.path().join("ganesha.conf");
        std::fs::write(
            &config,
            format!(
                "{}%include \"{}\"\n",
                // Every loopback address, not only 127.0.0.1: each test node has its own.
                core_config(self.port, None, self.work.path()),
                self.config_dir.join("exports.conf").display()
            ),
        )?;
        let mut command = match &self.namespace {
            Some(namespace) => {
                let mut command = Command::new("nsenter");
                let mut flag = OsString::from("--mount=");
                flag.push(namespace);
                command.arg(flag).args(["--", "ganesha.nfsd"]);
                command
            }
            None => Command::new("ganesha.nfsd"),
        };
        command.env("DBUS_SYSTEM_BUS_ADDRESS", &self.bus);
        // No libblkid cache, as docs/exports.md asks for image volumes: the shared one can
        // give a reused loop device the UUID of the filesystem it held before.
        command.env("BLKID_FILE", "/dev/null");
        self.child = Some(spawn(command, self.work.path())?);
        let bus = self.bus.clone();
        let deadline = std::time::Instant::now() + limit;
        loop {
            let probe = bus.clone();
            let answers = tokio::task::spawn_blocking(move || show_exports(&probe).is_ok())
                .await
                .unwrap_or(false);
            if answers {
                return Ok(());
            }
            // Ended already: waiting on would only time out.
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                anyhow::bail!(
                    "ganesha ended ({status}) before its export manager answered; ganesha log:\n{}",
                    self.log_text()
                );
            }
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "timed out after {}s waiting for ganesha's export manager on the bus; ganesha log:\n{}",
                limit.as_secs(),
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Starts ganesha; on a port that another process took between [`crate::free_port`]
    /// and ganesha's bind (other tests run beside this one), again on another port.
    async fn spawn_on_a_free_port(&mut self) -> anyhow::Result<()> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match self.spawn().await {
                Err(_) if attempts < 3 && self.log_text().contains("Address already in use") => {
                    self.port = crate::free_port()?;
                    std::fs::remove_file(self.work.path().join("ganesha.log")).ok();
                }
                other => return other,
            }
        }
    }

    /// Stops ganesha (SIGKILL) and starts it again with the same configuration.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.restart_after(|| Ok(())).await
    }

    /// Stops ganesha (SIGKILL), does `while_stopped` (what a reboot changes before the
    /// NFS server starts), and starts ganesha again with the same configuration.
    pub async fn restart_after(
        &mut self,
        while_stopped: impl FnOnce() -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        self.stop();
        while_stopped()?;
        self.spawn().await
    }

    /// As [`Ganesha::restart`], waiting at most `limit` for the export manager: ganesha
    /// reads a long include list for minutes before it answers.
    pub async fn restart_within(&mut self, limit: Duration) -> anyhow::Result<()> {
        self.stop();
        self.spawn_within(limit).await
    }

    fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Stops ganesha (SIGSTOP) until the answer is resumed or dropped: its D-Bus
    /// export manager and its NFS service answer nothing meanwhile.
    pub fn pause(&self) -> anyhow::Result<Paused> {
        Paused::stop(self.child.as_ref(), "ganesha")
    }

    /// The export ids ganesha serves, as its D-Bus ShowExports lists them, in order.
    pub fn export_ids(&self) -> anyhow::Result<Vec<u16>> {
        let mut ids = show_exports(&self.bus)?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Every export ganesha serves as ShowExports lists it: its id and path, by id.
    pub fn exports(&self) -> anyhow::Result<Vec<(u16, String)>> {
        let reply = dbus_send(&self.bus, "ShowExports", &[])?;
        let mut exports = shown_exports(&reply)?;
        exports.sort_unstable();
        Ok(exports)
    }

    /// The clients ganesha's `DisplayExport` lists for export `id`, as it writes them
    /// (`127.0.0.2/32`).
    pub fn clients(&self, id: u16) -> anyhow::Result<Vec<String>> {
        let reply = dbus_send(&self.bus, "DisplayExport", &[&format!("uint16:{id}")])?;
        Ok(reply
            .lines()
            .filter_map(|line| line.trim().strip_prefix("string \""))
            .filter_map(|rest| rest.strip_suffix('"'))
            .filter(|text| text.ends_with("/32"))
            .map(str::to_owned)
            .collect())
    }

    /// Asks ganesha to drop export `id`, behind the agent's back.
    pub fn remove_export(&self, id: u16) -> anyhow::Result<()> {
        dbus_send(&self.bus, "RemoveExport", &[&format!("uint16:{id}")]).map(drop)
    }

    /// The `[exports]` section of an agent's settings that hands this ganesha's exports
    /// to the agent's `ganesha` manager. Test export roots are directories of the
    /// machine's own filesystem, which the agent accepts only when told.
    pub fn agent_settings(&self) -> String {
        format!(
            "[exports]\nmanager = \"ganesha\"\nganesha_config_dir = {:?}\nganesha_dbus_address = {:?}\nallow_shared_filesystem = true\nmount_control_only = true\n",
            self.config_dir.display().to_string(),
            self.bus
        )
    }

    /// The port ganesha serves NFS on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// An NFSv4 URL of `path` on this server, for a client on any loopback address.
    pub fn url(&self, path: &str) -> String {
        nfs_url("127.0.0.1", self.port, path)
    }

    pub fn log_text(&self) -> String {
        log_text(self.work.path())
    }
}

/// The server-wide part of a ganesha configuration: NFSv4 over TCP on `port` (bound to
/// `bind` when given), no grace period, numeric owners, no attribute caching, its
/// recovery state in `work`.
pub fn core_config(port: u16, bind: Option<&str>, work: &Path) -> String {
    let bind = bind
        .map(|addr| format!("  Bind_Addr = {addr};\n"))
        .unwrap_or_default();
    format!(
        "NFS_CORE_PARAM {{\n  Protocols = 4;\n  NFS_Port = {port};\n{bind}  \
         Enable_NLM = false;\n  Enable_RQUOTA = false;\n  Enable_UDP = false;\n  Mount_Path_Pseudo = true;\n}}\n\
         NFSV4 {{\n  Graceless = true;\n  Lease_Lifetime = 10;\n  RecoveryRoot = \"{}\";\n  \
         Allow_Numeric_Owners = true;\n  Only_Numeric_Owners = true;\n}}\n\
         NFS_KRB5 {{ Active_krb5 = false; }}\n\
         # Attribute caching would hide changes the agent makes on the server side.\n\
         CACHEINODE {{ Attr_Expiration_Time = 0; }}\n",
        work.join("recovery").display()
    )
}

/// Starts `command` (ganesha.nfsd, perhaps behind nsenter) in the foreground on
/// `work/ganesha.conf`, its log and pid file in `work`.
pub fn spawn(mut command: Command, work: &Path) -> anyhow::Result<Child> {
    command
        .arg("-F")
        .arg("-f")
        .arg(work.join("ganesha.conf"))
        .arg("-L")
        .arg(work.join("ganesha.log"))
        .arg("-p")
        .arg(work.join("ganesha.pid"))
        .args(["-N", "NIV_EVENT"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            anyhow::anyhow!("cannot start ganesha.nfsd (Debian: nfs-ganesha, nfs-ganesha-vfs): {e}")
        })
}

/// What ganesha started by [`spawn`] in `work` has logged.
pub fn log_text(work: &Path) -> String {
    std::fs::read_to_string(work.join("ganesha.log")).unwrap_or_default()
}

/// An NFSv4 URL of `path` on `server`, for libnfs' tools and bindings.
pub fn nfs_url(server: &str, port: u16, path: &str) -> String {
    format!("nfs://{server}{path}?version=4&nfsport={port}")
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        self.stop();
    }
}

fn dbus_send(bus: &str, method: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new("dbus-send")
        .arg(format!("--bus={bus}"))
        .args([
            "--print-reply",
            "--dest=org.ganesha.nfsd",
            "/org/ganesha/nfsd/ExportMgr",
        ])
        .arg(format!("org.ganesha.nfsd.exportmgr.{method}"))
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "dbus-send {method}: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// ShowExports' answer as dbus-send prints it: per export a `uint16` id, then the
/// `string` of its path.
fn shown_exports(reply: &str) -> anyhow::Result<Vec<(u16, String)>> {
    let mut lines = reply.lines().map(str::trim);
    let mut exports = Vec::new();
    while let Some(line) = lines.next() {
        let Some(id) = line.strip_prefix("uint16 ") else {
            continue;
        };
        let path = lines
            .next()
            .and_then(|line| line.strip_prefix("string \""))
            .and_then(|rest| rest.strip_suffix('"'))
            .ok_or_else(|| anyhow::anyhow!("ShowExports: export {id} has no path"))?;
        exports.push((id.trim().parse()?, path.to_owned()));
    }
    Ok(exports)
}

/// The ids of ShowExports' answer: the `uint16` fields, one per export.
fn show_exports(bus: &str) -> anyhow::Result<Vec<u16>> {
    let reply = dbus_send(bus, "ShowExports", &[])?;
    reply
        .lines()
        .filter_map(|line| line.trim().strip_prefix("uint16 "))
        .map(|id| Ok(id.trim().parse()?))
        .collect()
}
