//! The credentials file: bearer tokens, each with its scope, that `nfsprov-agent
//! credential` adds, rotates and revokes while the agent runs. The file holds each
//! token's SHA-256, never the token, so reading it lends nobody a credential. The agent
//! looks at the file several times a second and swaps the whole set at once: a
//! rotation or revocation holds within a second, and the credentials it did not touch
//! go on as they were.

use std::fmt::Write as _;
use std::io::Write as _;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

use arc_swap::ArcSwap;
use nfsprov_api_types::{ExportClient, VolumePath};
use serde::{Deserialize, Serialize};
use subtle::ConstantTimeEq;

use crate::private_file;
use crate::scope::{Limits, Operations, Scope};

/// Largest credentials file read: a few hundred bytes per credential.
const MAX_FILE_BYTES: u64 = 4 << 20;
/// How often the file is looked at (a stat; read only when it changed).
const POLL_INTERVAL: Duration = Duration::from_millis(200);

/// One credential as the file writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialEntry {
    /// Logged as the caller and used as its metrics label.
    pub name: String,
    /// Lowercase hex SHA-256 of the token.
    pub token_sha256: String,
    /// The volumes it acts on lie beneath this path; absent: the whole export root.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    #[serde(default, skip_serializing_if = "is_all")]
    pub operations: Operations,
    /// The clients its exports may admit lie within one of these; absent: any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub export_clients: Option<Vec<String>>,
    /// The most volumes beneath its prefix; absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_volumes: Option<u64>,
    /// The most capacity its volumes may add up to; absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bytes: Option<u64>,
    /// The most clones, snapshots and restores of its admitted at once; absent: no bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_jobs: Option<usize>,
}

fn is_all(operations: &Operations) -> bool {
    *operations == Operations::All
}

/// The file as written.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CredentialsFile {
    #[serde(default)]
    pub credentials: Vec<CredentialEntry>,
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Invalid { path: String, message: String },
}

/// One credential's scope and limits as written: a `[[tokens]]` or
/// `[[client_certificates]]` entry of the settings, or an entry of the credentials file.
#[derive(Debug, Clone, Copy)]
pub struct ScopeSettings<'a> {
    pub prefix: Option<&'a str>,
    pub operations: Operations,
    pub export_clients: Option<&'a [String]>,
    pub limits: Limits,
}

impl ScopeSettings<'_> {
    /// The scope, checked; why not, in the settings' words.
    pub(crate) fn scope(&self) -> Result<Scope, String> {
        scope_of(self.prefix, self.operations, self.export_clients)
    }
}

/// A scope's settings as written, checked.
fn scope_of(
    prefix: Option<&str>,
    operations: Operations,
    export_clients: Option<&[String]>,
) -> Result<Scope, String> {
    let prefix = prefix
        .map(|raw| {
            VolumePath::parse(raw.trim_end_matches('/')).map_err(|e| format!("prefix {raw:?}: {e}"))
        })
        .transpose()?;
    let export_clients = export_clients
        .map(|clients| {
            clients
                .iter()
                .map(|raw| {
                    let client: ExportClient =
                        raw.parse().map_err(|e| format!("export_clients: {e}"))?;
                    client
                        .refuse_unspecified()
                        .map_err(|e| format!("export_clients: {e}"))?;
                    Ok(client)
                })
                .collect::<Result<Vec<_>, String>>()
        })
        .transpose()?;
    Ok(Scope::new(prefix, operations, export_clients))
}

impl CredentialsFile {
    /// Reads `path`; a missing file holds no credential. A file someone besides the
    /// agent's user could write (or replace) is refused: it grants credentials.
    pub fn read(path: &Path) -> Result<Self, CredentialsError> {
        if path.exists()
            && let Some(problem) = private_file::problem(path)
        {
            return Err(CredentialsError::Invalid {
                path: path.display().to_string(),
                message: problem,
            });
        }
        match nfsprov_api_types::read_bounded(path, MAX_FILE_BYTES) {
            Ok(bytes) => Self::parse(path, &bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(CredentialsError::Io {
                path: path.display().to_string(),
                source,
            }),
        }
    }

    fn parse(path: &Path, bytes: &[u8]) -> Result<Self, CredentialsError> {
        let invalid = |message: String| CredentialsError::Invalid {
            path: path.display().to_string(),
            message,
        };
        let text = std::str::from_utf8(bytes).map_err(|e| invalid(e.to_string()))?;
        let file: Self = toml::from_str(text).map_err(|e| invalid(e.to_string()))?;
        file.check().map_err(invalid)?;
        Ok(file)
    }

    /// Names unique and fit for a metrics label, hashes well formed, scopes valid.
    fn check(&self) -> Result<(), String> {
        let mut names = std::collections::BTreeSet::new();
        for entry in &self.credentials {
            check_name(&entry.name)?;
            if !names.insert(entry.name.as_str()) {
                return Err(format!("credential {:?} is listed twice", entry.name));
            }
            if entry.token_sha256.len() != 64
                || !entry
                    .token_sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
            {
                return Err(format!(
                    "credential {:?}: token_sha256 is not 64 lowercase hex digits",
                    entry.name
                ));
            }
            entry
                .scope()
                .map_err(|e| format!("credential {:?}: {e}", entry.name))?;
        }
        Ok(())
    }

    /// Writes the file whole and in its place at once, readable by its owner only.
    pub fn write(&self, path: &Path) -> Result<(), CredentialsError> {
        let error = |source| CredentialsError::Io {
            path: path.display().to_string(),
            source,
        };
        let mut text = String::from(
            "# The agent's scoped credentials, written by `nfsprov-agent credential`.\n\
             # Each token is kept as its SHA-256 only; the agent re-reads this file within a\n\
             # second of a change.\n\n",
        );
        text.push_str(
            &toml::to_string(self)
                .map_err(|e| error(std::io::Error::new(std::io::ErrorKind::InvalidData, e)))?,
        );
        let staged = path.with_extension("tmp-credential");
        let _ = std::fs::remove_file(&staged);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&staged)
            .map_err(error)?;
        file.write_all(text.as_bytes()).map_err(error)?;
        file.sync_all().map_err(error)?;
        std::fs::rename(&staged, path).map_err(error)?;
        if let Some(dir) = path.parent() {
            std::fs::File::open(dir)
                .and_then(|d| d.sync_all())
                .map_err(error)?;
        }
        Ok(())
    }
}

impl CredentialEntry {
    pub(crate) fn settings(&self) -> ScopeSettings<'_> {
        ScopeSettings {
            prefix: self.prefix.as_deref(),
            operations: self.operations,
            export_clients: self.export_clients.as_deref(),
            limits: Limits {
                max_volumes: self.max_volumes,
                max_bytes: self.max_bytes,
                max_jobs: self.max_jobs,
            },
        }
    }

    pub(crate) fn scope(&self) -> Result<Scope, String> {
        self.settings().scope()
    }
}

/// A credential name: what the audit log and the metrics call the caller, so a closed,
/// plain set of characters.
pub(crate) fn check_name(name: &str) -> Result<(), String> {
    let fits = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.');
    if fits {
        Ok(())
    } else {
        Err(format!(
            "credential name {name:?}: 1 to 63 of A-Z, a-z, 0-9, '-', '_' and '.'"
        ))
    }
}

/// The lowercase hex SHA-256 of `token`.
pub fn token_sha256(token: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, token);
    digest
        .as_ref()
        .iter()
        .fold(String::with_capacity(64), |mut out, b| {
            let _ = write!(out, "{b:02x}");
            out
        })
}

/// One credential of the set in memory.
#[derive(Debug)]
pub(crate) struct Credential {
    pub(crate) name: String,
    digest: [u8; 32],
    pub(crate) scope: Arc<Scope>,
    pub(crate) limits: Limits,
}

/// The credentials of the file as last read well.
#[derive(Debug, Default)]
pub(crate) struct CredentialSet {
    credentials: Vec<Credential>,
}

impl CredentialSet {
    fn from_file(file: &CredentialsFile) -> Self {
        let credentials = file
            .credentials
            .iter()
            .filter_map(|entry| {
                // Checked when read: neither fails here.
                let digest = decode_hex(&entry.token_sha256)?;
                let scope = entry.scope().ok()?;
                Some(Credential {
                    name: entry.name.clone(),
                    digest,
                    scope: Arc::new(scope),
                    limits: entry.settings().limits,
                })
            })
            .collect();
        Self { credentials }
    }

    /// The credential whose token is `presented`. Every credential is compared, and
    /// each comparison takes the same time, so the time taken tells nothing of which
    /// matched.
    pub(crate) fn find(&self, presented: &[u8]) -> Option<&Credential> {
        let digest = ring::digest::digest(&ring::digest::SHA256, presented);
        let mut found = None;
        for credential in &self.credentials {
            if bool::from(credential.digest.ct_eq(digest.as_ref())) && found.is_none() {
                found = Some(credential);
            }
        }
        found
    }

    pub(crate) fn len(&self) -> usize {
        self.credentials.len()
    }

    pub(crate) fn names(&self) -> impl Iterator<Item = &str> {
        self.credentials.iter().map(|c| c.name.as_str())
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Credential> {
        self.credentials.iter()
    }
}

fn decode_hex(hex: &str) -> Option<[u8; 32]> {
    let mut out = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The credentials file, watched: [`Self::current`] is the set as last read well.
#[derive(Debug)]
pub(crate) struct WatchedCredentials {
    shared: Arc<Shared>,
}

/// Told each set of credentials as it comes into force.
pub(crate) type OnChange = Box<dyn Fn(&CredentialSet) + Send + Sync>;

struct Shared {
    path: PathBuf,
    set: ArcSwap<CredentialSet>,
    on_change: OnChange,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("path", &self.path)
            .field("set", &self.set)
            .finish_non_exhaustive()
    }
}

/// What tells a changed file from the one read: a rename puts a new inode in place.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    size: u64,
    modified_ns: i128,
}

fn stamp(path: &Path) -> Option<Stamp> {
    let meta = std::fs::metadata(path).ok()?;
    Some(Stamp {
        inode: meta.ino(),
        size: meta.len(),
        modified_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
    })
}

impl WatchedCredentials {
    /// Reads `path` once (a missing file holds no credential; an unreadable or invalid
    /// one stops the start, with why), then watches it.
    pub(crate) fn open(path: PathBuf, on_change: OnChange) -> Result<Self, CredentialsError> {
        let seen = stamp(&path);
        let file = CredentialsFile::read(&path)?;
        let set = CredentialSet::from_file(&file);
        on_change(&set);
        let shared = Arc::new(Shared {
            set: ArcSwap::from_pointee(set),
            path,
            on_change,
        });
        if !file.credentials.is_empty() {
            tracing::info!(
                path = %shared.path.display(),
                credentials = file.credentials.len(),
                "scoped credentials loaded"
            );
        }
        let watched = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("credentials".into())
            .spawn(move || watch(watched, seen))
            .map_err(|source| CredentialsError::Io {
                path: "the credentials file's watcher".into(),
                source,
            })?;
        Ok(Self { shared })
    }

    pub(crate) fn current(&self) -> arc_swap::Guard<Arc<CredentialSet>> {
        self.shared.set.load()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.shared.path
    }
}

/// Looks at the file until its [`WatchedCredentials`] is dropped. A file that cannot be
/// read or is invalid leaves the last good set in force (the log says why): a typo in a
/// hand edit must not lock every cluster out. A removed file holds no credential.
fn watch(watched: Weak<Shared>, mut seen: Option<Stamp>) {
    loop {
        std::thread::sleep(POLL_INTERVAL);
        let Some(shared) = watched.upgrade() else {
            return;
        };
        let now = stamp(&shared.path);
        if now == seen {
            continue;
        }
        seen = now;
        match CredentialsFile::read(&shared.path) {
            Ok(file) => {
                let set = CredentialSet::from_file(&file);
                tracing::info!(
                    path = %shared.path.display(),
                    credentials = set.len(),
                    names = %set.names().collect::<Vec<_>>().join(","),
                    "scoped credentials reloaded"
                );
                (shared.on_change)(&set);
                shared.set.store(Arc::new(set));
            }
            Err(e) => {
                tracing::error!(error = %e, "the credentials file is not usable; the credentials read before stay in force");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn entry(name: &str, token: &str, prefix: Option<&str>) -> CredentialEntry {
        CredentialEntry {
            name: name.into(),
            token_sha256: token_sha256(token.as_bytes()),
            prefix: prefix.map(Into::into),
            operations: Operations::All,
            export_clients: None,
            max_volumes: None,
            max_bytes: None,
            max_jobs: None,
        }
    }

    #[test]
    fn the_file_round_trips_and_finds_each_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.toml");
        let file = CredentialsFile {
            credentials: vec![
                entry("production", "p-token", Some("production")),
                CredentialEntry {
                    operations: Operations::ReadOnly,
                    export_clients: Some(vec!["10.2.0.0/16".into()]),
                    ..entry("monitoring", "m-token", None)
                },
            ],
        };
        file.write(&path).unwrap();
        let read = CredentialsFile::read(&path).unwrap();
        assert_eq!(read, file);
        let set = CredentialSet::from_file(&read);
        let found = set.find(b"p-token").unwrap();
        assert_eq!(found.name, "production");
        assert_eq!(found.scope.prefix().unwrap().as_str(), "production");
        assert_eq!(
            set.find(b"m-token").unwrap().scope.operations(),
            Operations::ReadOnly
        );
        assert!(set.find(b"p-toke").is_none());
        assert!(set.find(b"").is_none());
        assert!(!std::fs::read_to_string(&path).unwrap().contains("p-token"));
        assert_eq!(
            std::fs::metadata(&path).unwrap().mode() & 0o777,
            0o600,
            "readable by its owner only"
        );
    }

    #[test]
    fn a_bad_file_is_refused_with_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.toml");
        assert_eq!(
            CredentialsFile::read(&path).unwrap(),
            CredentialsFile::default()
        );
        let digest = token_sha256(b"t");
        for (text, why) in [
            (
                format!("[[credentials]]\nname = \"a b\"\ntoken_sha256 = \"{digest}\"\n"),
                "credential name",
            ),
            (
                "[[credentials]]\nname = \"a\"\ntoken_sha256 = \"ABC\"\n".to_owned(),
                "64 lowercase hex",
            ),
            (
                format!(
                    "[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\nprefix = \"../x\"\n"
                ),
                "prefix",
            ),
            (
                format!(
                    "[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\nexport_clients = [\"0.0.0.0/0\"]\n"
                ),
                "unspecified",
            ),
            (
                format!(
                    "[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\n[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\n"
                ),
                "twice",
            ),
            (
                format!(
                    "[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\nscope = \"x\"\n"
                ),
                "unknown field",
            ),
        ] {
            std::fs::write(&path, &text).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
            let err = CredentialsFile::read(&path).unwrap_err().to_string();
            assert!(err.contains(why), "{text}: {err}");
        }
        // A file others could write grants credentials to them: refused whole.
        std::fs::write(
            &path,
            format!("[[credentials]]\nname = \"a\"\ntoken_sha256 = \"{digest}\"\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = CredentialsFile::read(&path).unwrap_err().to_string();
        assert!(err.contains("group or others"), "{err}");
    }

    #[test]
    fn a_change_to_the_file_holds_within_a_second() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("credentials.toml");
        let watched = WatchedCredentials::open(path.clone(), Box::new(|_| {})).unwrap();
        assert!(watched.current().find(b"one").is_none());
        CredentialsFile {
            credentials: vec![entry("one", "one", Some("one"))],
        }
        .write(&path)
        .unwrap();
        let written = std::time::Instant::now();
        while watched.current().find(b"one").is_none() {
            assert!(
                written.elapsed() < Duration::from_secs(5),
                "never picked up"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        std::fs::remove_file(&path).unwrap();
        let removed = std::time::Instant::now();
        while watched.current().find(b"one").is_some() {
            assert!(removed.elapsed() < Duration::from_secs(5), "never revoked");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}
