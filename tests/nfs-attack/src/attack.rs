//! The attacks: a client admitted to volume A (and, until revoked, C) forges handles
//! to reach B, the host filesystem's root and a file outside the export root. Each
//! attack's outcome is what the server let through, checked against the data itself.

use std::fmt;
use std::net::Ipv4Addr;

use crate::ganesha::{ExportSpec, Ganesha};
use crate::handle::{GaneshaHandle, KernelHandle};
use crate::kernel::name_to_handle;
use crate::layout::{Layout, Volume};
use crate::nfs4::{Client, NfsError, StateId, Status};
use crate::rpc::{AuthSys, Source, SourcePort};
use crate::setup::{Result, SetupError};

/// The attacker: admitted to A, and to C until C is revoked.
pub const ATTACKER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
/// A host admitted to nothing.
pub const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
/// Another tenant: admitted to B (and to C after the attacker lost it).
pub const TENANT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);

pub const EXPORT_A: u16 = 11;
pub const EXPORT_B: u16 = 12;
pub const EXPORT_C: u16 = 13;

const OPEN_READ_WRITE: u32 = 3;
const MARK: &[u8] = b"FORGED";

/// The exports of a layout: A and C to the attacker, B to the tenant.
pub fn exports(layout: &Layout, privileged_port: bool) -> Vec<ExportSpec> {
    [
        (EXPORT_A, &layout.a, ATTACKER),
        (EXPORT_B, &layout.b, TENANT),
        (EXPORT_C, &layout.c, ATTACKER),
    ]
    .into_iter()
    .map(|(id, volume, client)| export(id, volume, client, privileged_port))
    .collect()
}

fn export(id: u16, volume: &Volume, client: Ipv4Addr, privileged_port: bool) -> ExportSpec {
    ExportSpec {
        id,
        path: volume.path.clone(),
        pseudo: volume.pseudo_path(),
        clients: vec![client],
        privileged_port,
    }
}

/// Who the attacker is on one connection.
#[derive(Clone, Copy, Debug)]
pub struct Identity {
    pub port: SourcePort,
    pub uid: u32,
}

impl Identity {
    pub const ROOT_RESERVED: Identity = Identity {
        port: SourcePort::Reserved,
        uid: 0,
    };
    pub const NOBODY_UNPRIVILEGED: Identity = Identity {
        port: SourcePort::Unprivileged,
        uid: 65534,
    };

    fn auth(self) -> AuthSys {
        AuthSys::user(self.uid, self.uid)
    }
}

impl fmt::Display for Identity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let port = match self.port {
            SourcePort::Reserved => "reserved port",
            SourcePort::Unprivileged => "unprivileged port",
        };
        write!(f, "uid {}, {port}", self.uid)
    }
}

/// One step of an attack and what the server answered.
#[derive(Clone, Debug)]
pub struct Step {
    pub what: String,
    pub status: String,
    /// The step got at the target: listed its names, read its secret, wrote it.
    pub reached: bool,
}

#[derive(Clone, Debug)]
pub struct Finding {
    pub attack: &'static str,
    pub identity: Identity,
    pub steps: Vec<Step>,
}

impl Finding {
    pub fn reached(&self) -> bool {
        self.steps.iter().any(|s| s.reached)
    }

    /// The first status the server refused with, if any.
    pub fn refusal(&self) -> Option<&str> {
        self.steps
            .iter()
            .map(|s| s.status.as_str())
            .find(|s| !s.starts_with("NFS4_OK"))
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.reached() { "REACHED" } else { "refused" };
        write!(f, "{verdict:8} {} ({})", self.attack, self.identity)?;
        for step in &self.steps {
            write!(
                f,
                "\n           {}: {}{}",
                step.what,
                step.status,
                if step.reached { "  <- reached" } else { "" }
            )?;
        }
        Ok(())
    }
}

/// What the attacks showed.
#[derive(Debug)]
pub struct Report {
    /// The attacker's own volume, read and written as the attacks would (the control:
    /// the client and the anonymous stateid work).
    pub control: Vec<Finding>,
    pub attacks: Vec<Finding>,
    /// What a client admitted to nothing lists at the pseudo-root, or its refusal.
    pub stranger_sees: Listing,
    pub notes: Vec<String>,
}

impl Report {
    pub fn reached(&self) -> Vec<&Finding> {
        self.attacks.iter().filter(|f| f.reached()).collect()
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for finding in self.control.iter().chain(&self.attacks) {
            writeln!(f, "{finding}")?;
        }
        match &self.stranger_sees {
            Ok(names) => writeln!(f, "unadmitted client lists the pseudo-root: {names:?}")?,
            Err(status) => writeln!(f, "unadmitted client at the pseudo-root: {status}")?,
        }
        for note in &self.notes {
            writeln!(f, "note: {note}")?;
        }
        Ok(())
    }
}

/// Serves `layout` with ganesha and runs every attack from `identities`.
pub fn attack(layout: &Layout, identities: &[Identity]) -> Result<Report> {
    let specs = exports(layout, false);
    let ganesha = Ganesha::start(&specs)?;
    let result = attack_served(layout, &ganesha, &specs, identities);
    result.map_err(|e| SetupError::Failed(format!("{e}\nganesha log:\n{}", ganesha.log_text())))
}

fn attack_served(
    layout: &Layout,
    ganesha: &Ganesha,
    specs: &[ExportSpec],
    identities: &[Identity],
) -> Result<Report> {
    let server = ganesha.addr();
    let connect = |addr: Ipv4Addr, identity: Identity| {
        Client::connect(
            server,
            Source {
                addr,
                port: identity.port,
            },
            identity.auth(),
        )
        .map_err(nfs_setup)
    };
    let mut report = Report {
        control: Vec::new(),
        attacks: Vec::new(),
        stranger_sees: Err("not tried".into()),
        notes: Vec::new(),
    };

    // Handles every party legitimately holds.
    let mut tenant = connect(TENANT, Identity::ROOT_RESERVED)?;
    let b_handle = tenant.lookup_path(&layout.b.pseudo).map_err(nfs_setup)?;
    let mut attacker = connect(ATTACKER, Identity::ROOT_RESERVED)?;
    let a_handle = attacker.lookup_path(&layout.a.pseudo).map_err(nfs_setup)?;
    let c_handle = attacker.lookup_path(&layout.c.pseudo).map_err(nfs_setup)?;
    let a = GaneshaHandle::parse(&a_handle).map_err(|e| SetupError::Failed(e.to_string()))?;
    report.notes.push(format!(
        "A's handle: export id {}, fsid type {}, fsid {:02x?}, kernel handle type {:#x}, {} bytes",
        a.export_id,
        a.fsal.fsid_type,
        a.fsal.fsid,
        a.fsal.kernel.handle_type,
        a.fsal.kernel.bytes.len()
    ));
    report.notes.push(format!(
        "filesystem UUIDs: A {}, B {}, host {}",
        Layout::uuid_of(&layout.a.path),
        Layout::uuid_of(&layout.b.path),
        Layout::uuid_of(layout.host_root())
    ));
    let attrs = attacker.attrs(&a_handle).map_err(nfs_setup)?;
    report.notes.push(format!(
        "GETATTR of A's root: type {:?}, fsid {:?}, fileid {:?}",
        attrs.kind, attrs.fsid, attrs.fileid
    ));
    let (a_kernel, _) = name_to_handle(&layout.a.path)?;
    if a_kernel != a.fsal.kernel {
        return Err(SetupError::Failed(format!(
            "ganesha's handle of A does not carry the kernel's handle: {:?} vs {a_kernel:?}",
            a.fsal.kernel
        )));
    }
    let kind = layout.mechanism.volume_kind();
    let (root_kernel, _) = name_to_handle(&layout.a_fs_root)?;
    if let Some(inode) = kind.root_inode() {
        let fixed = KernelHandle::ino32_gen(inode, 0);
        report.notes.push(format!(
            "root of A's {} filesystem: kernel handle type {:#x} {:02x?} ({} the 32-bit form of inode {inode}, generation 0)",
            kind.name(),
            root_kernel.handle_type,
            root_kernel.bytes,
            if root_kernel == fixed { "is" } else { "is not" }
        ));
    }

    report.control = control(&mut attacker, layout, &a_handle)?;

    // Revocation: C now admits the tenant only, as `PUT /v1/exports` would leave it.
    let c_spec = specs
        .iter()
        .find(|s| s.id == EXPORT_C)
        .ok_or_else(|| SetupError::Failed("no export C".into()))?;
    ganesha.update(&ExportSpec {
        clients: vec![TENANT],
        ..c_spec.clone()
    })?;
    drop(attacker);

    let (b_dir, _) = name_to_handle(&layout.b.path)?;
    let (b_file, _) = name_to_handle(&layout.b.file_path())?;
    let (outside, _) = name_to_handle(&layout.outside_file)?;
    let blind_root = match kind.root_inode() {
        Some(inode) => KernelHandle::ino32_gen(inode, 0),
        // btrfs: the root of the subvolume A lies on, as guessing it would find it.
        None => root_kernel.clone(),
    };
    let b_from_root: Vec<&str> = layout.b_from_root.iter().map(String::as_str).collect();
    for &identity in identities {
        let mut client = connect(ATTACKER, identity)?;
        let forged_b = GaneshaHandle::parse(&b_handle)
            .map_err(|e| SetupError::Failed(e.to_string()))?
            .with_export_id(EXPORT_A)
            .compose();
        report.attacks.push(Finding {
            attack: "B's whole handle under A's export id",
            identity,
            steps: probe_dir(&mut client, &forged_b, &layout.b),
        });
        report.attacks.push(Finding {
            attack: "B's kernel handle (directory) with A's export id and fsid",
            identity,
            steps: probe_dir(
                &mut client,
                &a.with_kernel(b_dir.clone()).compose(),
                &layout.b,
            ),
        });
        report.attacks.push(Finding {
            attack: "B's kernel handle (file) with A's export id and fsid",
            identity,
            steps: probe_file(
                &mut client,
                &a.with_kernel(b_file.clone()).compose(),
                &layout.b.file_path(),
                &layout.b.secret,
            ),
        });
        let root = a.with_kernel(blind_root.clone()).compose();
        let mut steps = walk_and_read(
            &mut client,
            &root,
            &layout.outside_from_root,
            &layout.outside_file,
            "ssh-ed25519 outside-the-export-root\n",
        );
        steps.extend(walk_and_read(
            &mut client,
            &root,
            &b_from_root,
            &layout.b.file_path(),
            &layout.b.secret,
        ));
        report.attacks.push(Finding {
            attack: "blind: the filesystem root's fixed handle with A's export id and fsid, walked by name",
            identity,
            steps,
        });
        report.attacks.push(Finding {
            attack: "a file outside the export root: its kernel handle with A's export id and fsid",
            identity,
            steps: probe_file(
                &mut client,
                &a.with_kernel(outside.clone()).compose(),
                &layout.outside_file,
                "ssh-ed25519 outside-the-export-root\n",
            ),
        });
        report.attacks.push(Finding {
            attack: "revoked: C's own handle after C was taken away",
            identity,
            steps: probe_dir(&mut client, &c_handle, &layout.c),
        });
        let grafted_c = GaneshaHandle::parse(&c_handle)
            .map_err(|e| SetupError::Failed(e.to_string()))?
            .with_export_id(EXPORT_A)
            .compose();
        report.attacks.push(Finding {
            attack: "revoked: C's handle grafted onto A's export id",
            identity,
            steps: probe_dir(&mut client, &grafted_c, &layout.c),
        });
    }

    let mut stranger = connect(STRANGER, Identity::ROOT_RESERVED)?;
    report.stranger_sees = stranger
        .list(None)
        .map_err(|e| e.status().map_or_else(|| e.to_string(), |s| s.to_string()));
    Ok(report)
}

/// The attacker's own volume, reached as every attack tries: listed, its file read and
/// written with the anonymous stateid, and opened and read by an OPEN's stateid.
fn control(client: &mut Client, layout: &Layout, a_handle: &[u8]) -> Result<Vec<Finding>> {
    let steps = probe_dir(client, a_handle, &layout.a);
    let file = client
        .lookup_from(a_handle, &[&layout.a.file])
        .map_err(nfs_setup)?;
    let mut file_steps = probe_file(client, &file, &layout.a.file_path(), &layout.a.secret);
    let opened = client
        .open(a_handle, &layout.a.file, OPEN_READ_WRITE)
        .and_then(|stateid| client.read(&file, stateid, 4096));
    file_steps.push(match opened {
        Ok(data) => Step {
            what: "OPEN by name, READ with its stateid".into(),
            status: Status::OK.to_string(),
            reached: data.starts_with(MARK) || data == layout.a.secret.as_bytes(),
        },
        Err(e) => failed("OPEN by name, READ with its stateid", &e),
    });
    let identity = Identity::ROOT_RESERVED;
    let findings = vec![
        Finding {
            attack: "control: A's own directory",
            identity,
            steps,
        },
        Finding {
            attack: "control: A's own file",
            identity,
            steps: file_steps,
        },
    ];
    for finding in &findings {
        if let Some(step) = finding.steps.iter().find(|s| !s.reached) {
            return Err(SetupError::Failed(format!(
                "the attacker cannot use its own volume, so no refusal would mean anything: {}: {}",
                step.what, step.status
            )));
        }
    }
    Ok(findings)
}

/// Lists the directory of `handle`, then opens and reads `target`'s file in it.
fn probe_dir(client: &mut Client, handle: &[u8], target: &Volume) -> Vec<Step> {
    let mut steps = Vec::new();
    match client.list(Some(handle)) {
        Ok(names) => steps.push(Step {
            what: "PUTFH, READDIR".into(),
            status: Status::OK.to_string(),
            reached: names.contains(&target.file),
        }),
        Err(e) => steps.push(failed("PUTFH, READDIR", &e)),
    }
    match client.lookup_from(handle, &[&target.file]) {
        Ok(file) => steps.extend(probe_file(
            client,
            &file,
            &target.file_path(),
            &target.secret,
        )),
        Err(e) => steps.push(failed("PUTFH, LOOKUP the file", &e)),
    }
    match client.open(handle, &target.file, OPEN_READ_WRITE) {
        Ok(_) => steps.push(Step {
            what: "PUTFH, OPEN the file read-write".into(),
            status: Status::OK.to_string(),
            reached: true,
        }),
        Err(e) => steps.push(failed("PUTFH, OPEN the file read-write", &e)),
    }
    steps
}

/// Reads the file of `handle`, then writes a mark at its start, with the anonymous
/// stateid; a write counts as reached only if the server's file shows it.
fn probe_file(
    client: &mut Client,
    handle: &[u8],
    path: &std::path::Path,
    secret: &str,
) -> Vec<Step> {
    let mut steps = Vec::new();
    match client.read(handle, StateId::ANONYMOUS, 4096) {
        Ok(data) => steps.push(Step {
            what: "PUTFH, READ (anonymous stateid)".into(),
            status: Status::OK.to_string(),
            reached: data == secret.as_bytes(),
        }),
        Err(e) => steps.push(failed("PUTFH, READ (anonymous stateid)", &e)),
    }
    match client.write(handle, StateId::ANONYMOUS, 0, MARK) {
        Ok(_) => {
            let written = std::fs::read(path).is_ok_and(|data| data.starts_with(MARK));
            // Put the secret back, so that later attacks read what they expect.
            let _ = std::fs::write(path, secret);
            steps.push(Step {
                what: "PUTFH, WRITE (anonymous stateid)".into(),
                status: Status::OK.to_string(),
                reached: written,
            });
        }
        Err(e) => steps.push(failed("PUTFH, WRITE (anonymous stateid)", &e)),
    }
    steps
}

/// From `root`, LOOKUP `path` and read and write the file found.
fn walk_and_read(
    client: &mut Client,
    root: &[u8],
    path: &[&str],
    file: &std::path::Path,
    secret: &str,
) -> Vec<Step> {
    match client.lookup_from(root, path) {
        Ok(handle) => {
            let mut steps = vec![Step {
                what: format!("PUTFH, LOOKUP {}", path.join("/")),
                status: Status::OK.to_string(),
                reached: false,
            }];
            steps.extend(probe_file(client, &handle, file, secret));
            steps
        }
        Err(e) => vec![failed(&format!("PUTFH, LOOKUP {}", path.join("/")), &e)],
    }
}

fn failed(what: &str, error: &NfsError) -> Step {
    Step {
        what: what.to_owned(),
        status: error
            .status()
            .map_or_else(|| error.to_string(), |s| s.to_string()),
        reached: false,
    }
}

fn nfs_setup(e: NfsError) -> SetupError {
    SetupError::Failed(e.to_string())
}

/// The names a listing returned, or the status that refused it.
pub type Listing = std::result::Result<Vec<String>, String>;

/// How A's export, required to be reached from a reserved port, answered.
#[derive(Debug)]
pub struct PortOutcomes {
    /// From a reserved port, A looked up by name and listed.
    pub reserved: Listing,
    /// From an unprivileged port, A looked up by name and listed.
    pub unprivileged_by_name: Listing,
    /// From an unprivileged port, A's handle (got from a reserved port) listed.
    pub unprivileged_by_handle: Listing,
}

/// Serves `layout` with every export requiring a reserved source port
/// (`PrivilegedPort = true`) and lists A from a reserved and an unprivileged port.
pub fn privileged_port_outcomes(layout: &Layout) -> Result<PortOutcomes> {
    let specs = exports(layout, true);
    let ganesha = Ganesha::start(&specs)?;
    let connect = |identity: Identity| {
        Client::connect(
            ganesha.addr(),
            Source {
                addr: ATTACKER,
                port: identity.port,
            },
            identity.auth(),
        )
        .map_err(nfs_setup)
    };
    let status = |e: NfsError| e.status().map_or_else(|| e.to_string(), |s| s.to_string());
    let mut reserved = connect(Identity::ROOT_RESERVED)?;
    let handle = reserved.lookup_path(&layout.a.pseudo).map_err(nfs_setup)?;
    let reserved = reserved.list(Some(&handle)).map_err(status);
    let mut unprivileged = connect(Identity::NOBODY_UNPRIVILEGED)?;
    let unprivileged_by_name = unprivileged
        .lookup_path(&layout.a.pseudo)
        .and_then(|handle| unprivileged.list(Some(&handle)))
        .map_err(status);
    let unprivileged_by_handle = unprivileged.list(Some(&handle)).map_err(status);
    Ok(PortOutcomes {
        reserved,
        unprivileged_by_name,
        unprivileged_by_handle,
    })
}
