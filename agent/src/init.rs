//! `nfsprov-agent init`: generates the CA, the server certificate, the controller's client
//! certificate and a token, writes the agent's settings, and prints the Secret the
//! controller mounts to reach this agent.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use clap::Args;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use time::{Duration, OffsetDateTime};

use crate::config::DEFAULT_PORT;
use crate::root_filesystem::RootFilesystem;

#[derive(Debug, Clone, Args)]
pub struct InitArgs {
    /// Directory for the settings, certificates, keys and token.
    #[arg(long, default_value = "/etc/nfsprov")]
    pub dir: PathBuf,
    /// Directory exported over NFS under which volumes are created.
    #[arg(long)]
    pub export_root: PathBuf,
    /// DNS name(s) of this host for the server certificate (repeatable).
    #[arg(long = "hostname")]
    pub hostnames: Vec<String>,
    /// IP address(es) of this host for the server certificate (repeatable).
    #[arg(long = "ip")]
    pub ips: Vec<IpAddr>,
    /// Address the agent listens on.
    #[arg(long, default_value_t = format!("0.0.0.0:{DEFAULT_PORT}"))]
    pub listen: String,
    /// Agent name, as StorageClasses refer to it.
    #[arg(long, default_value = "default")]
    pub name: String,
    /// NFS server name clients mount (default: the first --hostname or --ip).
    #[arg(long)]
    pub nfs_server: Option<String>,
    /// Path clients mount for the export root (default: the export root).
    #[arg(long)]
    pub nfs_path: Option<String>,
    /// Namespace of the controller, for the printed Secret.
    #[arg(long, default_value = "nfsprov")]
    pub namespace: String,
    /// Replace existing files (keys included). Without it, init refuses to touch them.
    #[arg(long)]
    pub force: bool,
    /// Certificate lifetime in days.
    #[arg(long, default_value_t = 3650)]
    pub days: i64,
    /// Accept an export root that is not a filesystem of its own (a directory of the root
    /// filesystem, say). An NFS client that forges file handles can reach everything on
    /// that filesystem; without this flag init refuses such a root.
    #[arg(long)]
    pub shared_filesystem: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{0}")]
    Invalid(String),
    #[error("refusing to overwrite existing {}; pass --force to replace them", .0.join(", "))]
    Exists(Vec<String>),
    #[error("certificate generation failed: {0}")]
    Certificate(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// File names written into the init directory.
pub mod files {
    pub const CONFIG: &str = "agent.toml";
    pub const CA_CERT: &str = "ca.pem";
    pub const CA_KEY: &str = "ca-key.pem";
    pub const SERVER_CERT: &str = "server.pem";
    pub const SERVER_KEY: &str = "server-key.pem";
    pub const CONTROLLER_CERT: &str = "controller.pem";
    pub const CONTROLLER_KEY: &str = "controller-key.pem";
    pub const TOKEN: &str = "token";
    pub const SECRET: &str = "controller-secret.yaml";
    pub const ALL: [&str; 9] = [
        CONFIG,
        CA_CERT,
        CA_KEY,
        SERVER_CERT,
        SERVER_KEY,
        CONTROLLER_CERT,
        CONTROLLER_KEY,
        TOKEN,
        SECRET,
    ];
}

/// What `init` produced.
#[derive(Debug, Clone)]
pub struct InitOutput {
    pub dir: PathBuf,
    /// The URL the controller uses.
    pub url: String,
    /// The Secret manifest for the controller's namespace.
    pub secret_manifest: String,
}

pub fn run(args: &InitArgs) -> Result<InitOutput, InitError> {
    nfsprov_api_types::validate_component(&args.name)
        .map_err(|e| InitError::Invalid(format!("--name {:?}: {e}", args.name)))?;
    if args.hostnames.is_empty() && args.ips.is_empty() {
        return Err(InitError::Invalid(
            "give at least one --hostname or --ip: clients verify the server certificate against them".into(),
        ));
    }
    if !args.export_root.is_absolute() {
        return Err(InitError::Invalid(format!(
            "--export-root {} must be absolute",
            args.export_root.display()
        )));
    }
    if args.days <= 0 {
        return Err(InitError::Invalid("--days must be positive".into()));
    }
    if !args.shared_filesystem {
        refuse_shared_filesystem(&args.export_root)?;
    }
    let port = args
        .listen
        .parse::<std::net::SocketAddr>()
        .map_err(|_| InitError::Invalid(format!("--listen {:?} is not an IP:port", args.listen)))?
        .port();
    let existing: Vec<String> = files::ALL
        .iter()
        .filter(|name| args.dir.join(name).exists())
        .map(|name| args.dir.join(name).display().to_string())
        .collect();
    if !existing.is_empty() && !args.force {
        return Err(InitError::Exists(existing));
    }
    std::fs::create_dir_all(&args.dir).map_err(|source| InitError::Write {
        path: args.dir.clone(),
        source,
    })?;

    let not_before = OffsetDateTime::now_utc() - Duration::hours(1);
    let not_after = not_before + Duration::days(args.days);

    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::default();
    ca_params.distinguished_name = name("nfsprov agent CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    ca_params.not_before = not_before;
    ca_params.not_after = not_after;
    let ca = CertifiedIssuer::self_signed(ca_params, ca_key)?;

    let mut server_names = Vec::new();
    for host in &args.hostnames {
        server_names.push(SanType::DnsName(host.clone().try_into().map_err(|_| {
            InitError::Invalid(format!("--hostname {host:?} is not a valid DNS name"))
        })?));
    }
    server_names.extend(args.ips.iter().map(|ip| SanType::IpAddress(*ip)));
    let validity = (not_before, not_after);
    let (server_cert, server_key) = leaf_certificate(
        "nfsprov-agent",
        server_names,
        ExtendedKeyUsagePurpose::ServerAuth,
        validity,
        &ca,
    )?;
    let (client_cert, client_key) = leaf_certificate(
        "nfsprov-controller",
        Vec::new(),
        ExtendedKeyUsagePurpose::ClientAuth,
        validity,
        &ca,
    )?;

    let token = random_token().map_err(|source| InitError::Write {
        path: args.dir.join(files::TOKEN),
        source,
    })?;

    let host = args
        .hostnames
        .first()
        .cloned()
        .or_else(|| args.ips.first().map(url_host))
        .unwrap_or_default();
    let url = format!("https://{host}:{port}");
    let nfs_server = args.nfs_server.clone().unwrap_or_else(|| {
        args.hostnames
            .first()
            .cloned()
            .or_else(|| args.ips.first().map(ToString::to_string))
            .unwrap_or_default()
    });
    let nfs_path = args
        .nfs_path
        .clone()
        .unwrap_or_else(|| args.export_root.display().to_string());
    let config = agent_config(args, &nfs_server, &nfs_path);
    let secret_manifest = secret_manifest(
        &SecretFor {
            agent: &args.name,
            namespace: &args.namespace,
            url: &url,
        },
        &ca.pem(),
        Some((&client_cert.pem(), &client_key.serialize_pem())),
        &token,
    );

    let dir = &args.dir;
    let outputs = [
        (files::CA_CERT, ca.pem(), 0o644),
        (files::CA_KEY, ca.key().serialize_pem(), 0o600),
        (files::SERVER_CERT, server_cert.pem(), 0o644),
        (files::SERVER_KEY, server_key.serialize_pem(), 0o600),
        (files::CONTROLLER_CERT, client_cert.pem(), 0o644),
        (files::CONTROLLER_KEY, client_key.serialize_pem(), 0o600),
        (files::TOKEN, format!("{token}\n"), 0o600),
        (files::CONFIG, config, 0o600),
        (files::SECRET, secret_manifest.clone(), 0o600),
    ];
    for (file, contents, mode) in outputs {
        write_file(&dir.join(file), contents.as_bytes(), mode)?;
    }
    Ok(InitOutput {
        dir: dir.clone(),
        url,
        secret_manifest,
    })
}

/// A certificate for `common_name` signed by the CA, usable only for `usage`.
fn leaf_certificate(
    common_name: &str,
    subject_alt_names: Vec<SanType>,
    usage: ExtendedKeyUsagePurpose,
    (not_before, not_after): (OffsetDateTime, OffsetDateTime),
    ca: &CertifiedIssuer<'_, KeyPair>,
) -> Result<(rcgen::Certificate, KeyPair), InitError> {
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    params.distinguished_name = name(common_name);
    params.subject_alt_names = subject_alt_names;
    params.extended_key_usages = vec![usage];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.use_authority_key_identifier_extension = true;
    params.not_before = not_before;
    params.not_after = not_after;
    let certificate = params.signed_by(&key, ca)?;
    Ok((certificate, key))
}

fn name(common_name: &str) -> DistinguishedName {
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "nfsprov");
    dn
}

fn url_host(ip: &IpAddr) -> String {
    match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    }
}

pub(crate) fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(bytes.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    }))
}

/// TOML string literal (quoted and escaped).
fn toml_str(value: &str) -> String {
    toml::Value::String(value.to_owned()).to_string()
}

fn agent_config(args: &InitArgs, nfs_server: &str, nfs_path: &str) -> String {
    let dir = &args.dir;
    let file = |name: &str| toml_str(&dir.join(name).display().to_string());
    format!(
        "# nfsprov agent settings, written by `nfsprov-agent init`.\n\
         listen = {listen}\n\
         export_root = {root}\n\
         log_format = \"text\"\n\
         \n\
         [nfs]\n\
         # What NFS clients mount: the PVs get server + path/<volume>.\n\
         server = {server}\n\
         path = {path}\n\
         \n\
         [tls]\n\
         cert_file = {cert}\n\
         key_file = {key}\n\
         # Client certificates signed by this CA are accepted (mTLS).\n\
         client_ca_file = {ca}\n\
         \n\
         # Bearer tokens; the file is re-read when it changes.\n\
         [[tokens]]\n\
         name = \"controller\"\n\
         file = {token}\n\
         \n\
         [limits]\n\
         max_body_bytes = 65536\n\
         request_timeout_seconds = 120\n\
         max_concurrent_requests = 256\n\
         shutdown_grace_seconds = 30\n\
         max_connections = 4096\n\
         max_tls_handshakes = 256\n\
         tls_handshake_timeout_seconds = 5\n\
         max_unauthenticated_connections = 512\n\
         max_unauthenticated_per_source = 128\n\
         unauthenticated_timeout_seconds = 5\n\
         header_read_timeout_seconds = 10\n\
         idle_timeout_seconds = 300\n\
         body_read_timeout_seconds = 10\n\
         # Warn past this ratio of provisioned capacity to the filesystem's size; refuse\n\
         # creates, clones, restores and expansions past max_overcommit_ratio (unset: never).\n\
         overcommit_warn_ratio = 1.0\n\
         # max_overcommit_ratio = 2.0\n\
         # Refuse a snapshot that would take its namespace's snapshots past this many\n\
         # bytes, each counted at what it referenced when taken (unset: never).\n\
         # max_snapshot_bytes_per_namespace = 107374182400\n\
         \n\
         [readiness]\n\
         min_free_bytes = 16777216\n\
         min_free_inodes = 256\n",
        listen = toml_str(&args.listen),
        root = toml_str(&args.export_root.display().to_string()),
        server = toml_str(nfs_server),
        path = toml_str(nfs_path),
        cert = file(files::SERVER_CERT),
        key = file(files::SERVER_KEY),
        ca = file(files::CA_CERT),
        token = file(files::TOKEN),
    )
}

/// The controller's Secret: one settings file per agent plus the files it refers to, all
/// under keys prefixed with the agent's name so several agents' Secrets can be projected
/// into one directory.
/// Which agent a controller's Secret is for, and where the Secret goes.
pub(crate) struct SecretFor<'a> {
    /// The agent's name in the controller's settings.
    pub(crate) agent: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) url: &'a str,
}

/// The Secret: the CA that signed the agent's certificate, the token, and the client
/// certificate and key when the controller gets one.
pub(crate) fn secret_manifest(
    to: &SecretFor<'_>,
    ca: &str,
    client_certificate: Option<(&str, &str)>,
    token: &str,
) -> String {
    let name = to.agent;
    let mut settings = format!(
        "name = {}\nurl = {}\nca_file = \"{name}-ca.pem\"\n",
        toml_str(name),
        toml_str(to.url),
    );
    if client_certificate.is_some() {
        let _ = write!(
            settings,
            "client_cert_file = \"{name}-tls.crt\"\nclient_key_file = \"{name}-tls.key\"\n"
        );
    }
    let _ = writeln!(settings, "token_file = \"{name}-token\"");
    let mut out = String::new();
    let _ = write!(
        out,
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: nfsprov-agent-{name}\n  namespace: {namespace}\n  labels:\n    app.kubernetes.io/name: nfsprov\n    app.kubernetes.io/component: agent-credentials\n    nfsprov.dev/agent: {name}\ntype: Opaque\nstringData:\n",
        namespace = to.namespace,
    );
    let mut entries = vec![
        (format!("{name}.toml"), settings.as_str()),
        (format!("{name}-ca.pem"), ca),
    ];
    if let Some((cert, key)) = client_certificate {
        entries.push((format!("{name}-tls.crt"), cert));
        entries.push((format!("{name}-tls.key"), key));
    }
    entries.push((format!("{name}-token"), token));
    for (key_name, value) in entries {
        let _ = writeln!(out, "  {key_name}: |");
        for line in value.trim_end().lines() {
            let _ = writeln!(out, "    {line}");
        }
    }
    out
}

/// Writes a file with exactly `mode`, replacing any old one without ever leaving it
/// readable with looser permissions.
fn write_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), InitError> {
    let error = |source| InitError::Write {
        path: path.to_owned(),
        source,
    };
    let staged = path.with_extension("tmp-init");
    let _ = std::fs::remove_file(&staged);
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(&staged)
        .map_err(error)?;
    file.write_all(contents).map_err(error)?;
    file.sync_all().map_err(error)?;
    // The process umask may have narrowed the mode; set it exactly.
    std::fs::set_permissions(&staged, std::os::unix::fs::PermissionsExt::from_mode(mode))
        .map_err(error)?;
    std::fs::rename(&staged, path).map_err(error)
}

/// Refuses an export root that is not the mount point of a filesystem of its own: the
/// first step of an install is that filesystem, and init is the moment to say so.
fn refuse_shared_filesystem(export_root: &Path) -> Result<(), InitError> {
    const ACCEPT: &str = "make the export root the mount point of a filesystem that holds nothing else, or pass --shared-filesystem to accept that an NFS client forging file handles can reach everything on that filesystem";
    let found = RootFilesystem::probe(export_root).map_err(|e| {
        InitError::Invalid(format!(
            "--export-root {}: {e}; {ACCEPT}",
            export_root.display()
        ))
    })?;
    match found.shared {
        None => Ok(()),
        Some(why) => Err(InitError::Invalid(format!(
            "--export-root {} is not a filesystem of its own ({why}); {ACCEPT}",
            export_root.display()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn args(dir: &Path) -> InitArgs {
        InitArgs {
            dir: dir.to_owned(),
            export_root: "/srv/nfs".into(),
            hostnames: vec!["nfs1.example.com".into()],
            ips: vec!["192.0.2.10".parse().unwrap()],
            listen: "0.0.0.0:8443".into(),
            name: "nfs1".into(),
            nfs_server: None,
            nfs_path: None,
            namespace: "nfsprov".into(),
            force: false,
            days: 30,
            // /srv/nfs need not exist here; the check has a test of its own.
            shared_filesystem: true,
        }
    }

    #[test]
    fn an_export_root_that_is_not_a_filesystem_of_its_own_is_refused_unless_accepted() {
        let dir = tempfile::tempdir().unwrap();
        let root = tempfile::tempdir().unwrap();
        for (export_root, needle) in [
            (root.path().to_owned(), "is not a filesystem of its own"),
            (root.path().join("missing"), "No such file"),
        ] {
            let refused = run(&InitArgs {
                export_root,
                shared_filesystem: false,
                ..args(dir.path())
            })
            .unwrap_err()
            .to_string();
            assert!(
                refused.contains(needle) && refused.contains("--shared-filesystem"),
                "{refused}"
            );
            assert!(
                std::fs::read_dir(dir.path()).unwrap().next().is_none(),
                "a refused init wrote files"
            );
        }
        run(&InitArgs {
            export_root: root.path().to_owned(),
            ..args(dir.path())
        })
        .unwrap();
    }

    #[test]
    fn writes_private_files_and_refuses_to_overwrite() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(&args(dir.path())).unwrap();
        assert_eq!(out.url, "https://nfs1.example.com:8443");
        for (file, mode) in [
            (files::CA_KEY, 0o600),
            (files::SERVER_KEY, 0o600),
            (files::CONTROLLER_KEY, 0o600),
            (files::TOKEN, 0o600),
            (files::CONFIG, 0o600),
            (files::SECRET, 0o600),
            (files::CA_CERT, 0o644),
        ] {
            let meta = std::fs::metadata(dir.path().join(file)).unwrap();
            assert_eq!(meta.permissions().mode() & 0o777, mode, "{file}");
        }
        let key_before = std::fs::read(dir.path().join(files::SERVER_KEY)).unwrap();
        let err = run(&args(dir.path())).unwrap_err().to_string();
        assert!(
            err.contains("refusing to overwrite") && err.contains("server-key.pem"),
            "{err}"
        );
        assert_eq!(
            std::fs::read(dir.path().join(files::SERVER_KEY)).unwrap(),
            key_before
        );
        let mut forced = args(dir.path());
        forced.force = true;
        run(&forced).unwrap();
        assert_ne!(
            std::fs::read(dir.path().join(files::SERVER_KEY)).unwrap(),
            key_before
        );
    }

    #[test]
    fn secret_settings_parse_as_the_controller_reads_them() {
        let dir = tempfile::tempdir().unwrap();
        let out = run(&args(dir.path())).unwrap();
        let token = std::fs::read_to_string(dir.path().join(files::TOKEN)).unwrap();
        assert_eq!(token.trim().len(), 64);
        assert!(
            out.secret_manifest
                .contains(&format!("    {}", token.trim()))
        );
        // Pull the settings file out of the manifest and load it the controller's way.
        let settings: String = out
            .secret_manifest
            .split("  nfs1.toml: |\n")
            .nth(1)
            .unwrap()
            .lines()
            .take_while(|l| l.starts_with("    "))
            .map(|l| format!("{}\n", &l[4..]))
            .collect();
        let mounted = tempfile::tempdir().unwrap();
        std::fs::write(mounted.path().join("nfs1.toml"), settings).unwrap();
        let agents =
            nfsprov_api_types::client::AgentConnectionConfig::from_dir(mounted.path()).unwrap();
        assert_eq!(agents[0].name, "nfs1");
        assert_eq!(agents[0].url, "https://nfs1.example.com:8443");
        assert_eq!(agents[0].ca_file, mounted.path().join("nfs1-ca.pem"));
    }

    #[test]
    fn needs_a_name_for_the_certificate() {
        let dir = tempfile::tempdir().unwrap();
        let mut bad = args(dir.path());
        bad.hostnames.clear();
        bad.ips.clear();
        assert!(
            run(&bad)
                .unwrap_err()
                .to_string()
                .contains("--hostname or --ip")
        );
        let mut bad = args(dir.path());
        bad.name = "../x".into();
        assert!(run(&bad).unwrap_err().to_string().contains("--name"));
    }
}
