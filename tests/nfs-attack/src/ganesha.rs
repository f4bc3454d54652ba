//! nfs-ganesha serving fixed exports on loopback, its export manager on a private
//! D-Bus so that an export can be changed the way the agent changes it (UpdateExport of
//! one export's file), stopped when dropped.

use std::fmt::Write as _;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::setup::{Result, SetupError, eventually, run};

/// One EXPORT block, as the agent writes them (FSAL VFS, NFSv4 over TCP, nobody but the
/// listed clients, root squashed).
#[derive(Clone, Debug)]
pub struct ExportSpec {
    pub id: u16,
    pub path: PathBuf,
    pub pseudo: String,
    /// Client addresses admitted read-write.
    pub clients: Vec<Ipv4Addr>,
    /// `PrivilegedPort = true`: only clients from a port below 1024.
    pub privileged_port: bool,
}

impl ExportSpec {
    fn block(&self) -> String {
        let mut text = String::new();
        let _ = writeln!(text, "EXPORT {{");
        let _ = writeln!(text, "  Export_Id = {};", self.id);
        let _ = writeln!(text, "  Path = \"{}\";", self.path.display());
        let _ = writeln!(text, "  Pseudo = \"{}\";", self.pseudo);
        let _ = writeln!(text, "  Protocols = 4;\n  Transports = TCP;");
        let _ = writeln!(text, "  Access_Type = None;\n  Squash = Root_Squash;");
        let _ = writeln!(text, "  SecType = sys;");
        if self.privileged_port {
            let _ = writeln!(text, "  PrivilegedPort = true;");
        }
        let _ = writeln!(text, "  FSAL {{ Name = VFS; }}");
        if !self.clients.is_empty() {
            let clients: Vec<String> = self.clients.iter().map(Ipv4Addr::to_string).collect();
            let _ = writeln!(
                text,
                "  CLIENT {{\n    Clients = {};\n    Access_Type = RW;\n  }}",
                clients.join(", ")
            );
        }
        let _ = writeln!(text, "}}");
        text
    }
}

/// A private system bus for ganesha's export manager; stopped when dropped.
struct PrivateBus {
    address: String,
    child: Child,
}

impl PrivateBus {
    fn start(dir: &Path) -> Result<Self> {
        let socket = dir.join("bus");
        let config = dir.join("bus.conf");
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
            .map_err(|e| SetupError::Failed(format!("cannot start dbus-daemon: {e}")))?;
        let bus = Self {
            address: format!("unix:path={}", socket.display()),
            child,
        };
        eventually("the private bus to listen", Duration::from_secs(20), || {
            socket.exists()
        })?;
        Ok(bus)
    }
}

impl Drop for PrivateBus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct Ganesha {
    port: u16,
    child: Child,
    bus: PrivateBus,
    work: tempfile::TempDir,
}

impl Ganesha {
    /// Starts ganesha serving `exports`, one include file each; waits until its export
    /// manager lists them all and its port answers.
    pub fn start(exports: &[ExportSpec]) -> Result<Self> {
        let work = tempfile::tempdir()?;
        let bus = PrivateBus::start(work.path())?;
        for export in exports {
            std::fs::write(export_file(work.path(), export.id), export.block())?;
        }
        let mut attempt = 0;
        let (port, child, served) = loop {
            attempt += 1;
            // Free a moment ago; another process may take it before ganesha binds it.
            let port = std::net::TcpListener::bind("127.0.0.1:0")?
                .local_addr()?
                .port();
            let mut config = core_config(port, work.path());
            for export in exports {
                let file = export_file(work.path(), export.id);
                let _ = writeln!(config, "%include \"{}\"", file.display());
            }
            std::fs::write(work.path().join("ganesha.conf"), config)?;
            let _ = std::fs::remove_file(work.path().join("ganesha.log"));
            let mut child = spawn(work.path(), &bus.address)?;
            match served_exports(&mut child, port, &bus.address, work.path())? {
                Some(served) => break (port, child, served),
                None if attempt < 5 => continue,
                None => {
                    return Err(SetupError::Failed(format!(
                        "ganesha found its port taken {attempt} times; its log:\n{}",
                        read_log(work.path())
                    )));
                }
            }
        };
        let ganesha = Self {
            port,
            child,
            bus,
            work,
        };
        let refused: Vec<u16> = exports
            .iter()
            .map(|e| e.id)
            .filter(|id| !served.contains(id))
            .collect();
        if !refused.is_empty() {
            return Err(SetupError::ExportsRefused {
                ids: refused,
                log: ganesha.log_text(),
            });
        }
        Ok(ganesha)
    }

    pub fn addr(&self) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::LOCALHOST, self.port)
    }

    pub fn log_text(&self) -> String {
        read_log(self.work.path())
    }

    /// Rewrites `export`'s file and has ganesha reread it, as the agent changes an export.
    pub fn update(&self, export: &ExportSpec) -> Result<()> {
        let file = export_file(self.work.path(), export.id);
        std::fs::write(&file, export.block())?;
        self.dbus(
            "UpdateExport",
            &[
                &format!("string:{}", file.display()),
                &format!("string:EXPORT(Export_Id={})", export.id),
            ],
        )
        .map(drop)
    }

    /// The ids of the exports ganesha serves (0 is its pseudo-root).
    pub fn export_ids(&self) -> Result<Vec<u16>> {
        export_ids(&self.bus.address)
    }

    fn dbus(&self, method: &str, args: &[&str]) -> Result<String> {
        dbus(&self.bus.address, method, args)
    }
}

fn export_ids(bus: &str) -> Result<Vec<u16>> {
    let reply = dbus(bus, "ShowExports", &[])?;
    Ok(reply
        .lines()
        .filter_map(|line| line.trim().strip_prefix("uint16 "))
        .filter_map(|id| id.trim().parse().ok())
        .collect())
}

fn dbus(bus: &str, method: &str, args: &[&str]) -> Result<String> {
    let mut all = vec![
        format!("--bus={bus}"),
        "--print-reply".into(),
        "--dest=org.ganesha.nfsd".into(),
        "/org/ganesha/nfsd/ExportMgr".into(),
        format!("org.ganesha.nfsd.exportmgr.{method}"),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    run("dbus-send", &all)
}

/// Starts ganesha in the foreground on `work/ganesha.conf`, its log and pid file in `work`.
fn spawn(work: &Path, bus: &str) -> Result<Child> {
    Command::new("ganesha.nfsd")
        .env("DBUS_SYSTEM_BUS_ADDRESS", bus)
        // ganesha takes a filesystem's fsid from libblkid, whose shared cache
        // (/run/blkid) can hold the UUID of whatever a loop device held before: a cache
        // of its own, empty, makes it read the filesystems as they are.
        .env("BLKID_FILE", work.join("blkid.tab"))
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
            SetupError::Failed(format!(
                "cannot start ganesha.nfsd (Debian: nfs-ganesha, nfs-ganesha-vfs): {e}"
            ))
        })
}

/// Waits until ganesha's export manager answers and its port connects: the exports it
/// serves then (it reads them all before its export manager answers, so one missing is
/// one it refused). `None` when it stopped because its port was taken meanwhile.
fn served_exports(
    child: &mut Child,
    port: u16,
    bus: &str,
    work: &Path,
) -> Result<Option<Vec<u16>>> {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(status) = child.try_wait()? {
            let log = read_log(work);
            if log.contains("Address already in use") {
                return Ok(None);
            }
            return Err(SetupError::Failed(format!(
                "ganesha stopped ({status}); its log:\n{log}"
            )));
        }
        if let Ok(ids) = export_ids(bus)
            && std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            return Ok(Some(ids));
        }
        if std::time::Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(SetupError::Failed(format!(
                "ganesha's export manager and port did not answer in 60 s; its log:\n{}",
                read_log(work)
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn read_log(work: &Path) -> String {
    std::fs::read_to_string(work.join("ganesha.log")).unwrap_or_default()
}

impl Drop for Ganesha {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn export_file(work: &Path, id: u16) -> PathBuf {
    work.join(format!("export-{id}.conf"))
}

/// NFSv4 over TCP on every loopback address (each test client has its own), no grace
/// period.
fn core_config(port: u16, work: &Path) -> String {
    format!(
        "NFS_CORE_PARAM {{\n  Protocols = 4;\n  NFS_Port = {port};\n  Enable_NLM = false;\n  \
         Enable_RQUOTA = false;\n  Enable_UDP = false;\n  Mount_Path_Pseudo = true;\n}}\n\
         NFSV4 {{\n  Graceless = true;\n  Lease_Lifetime = 10;\n  RecoveryRoot = \"{}\";\n  \
         Allow_Numeric_Owners = true;\n  Only_Numeric_Owners = true;\n}}\n\
         NFS_KRB5 {{ Active_krb5 = false; }}\n",
        work.join("recovery").display()
    )
}
