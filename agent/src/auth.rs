//! Who is calling: a verified client certificate (checked by rustls during the
//! handshake) or a bearer token compared in constant time against the token files, which
//! are re-read when they change so tokens rotate without a restart, or the SHA-256 of a
//! token of the credentials file (see `credentials`). A request only ever compares
//! against what is in memory: the files are watched and read off the request path (see
//! `ReloadingFile`), so no file put in a token's place can hold a request. Each caller
//! comes with its scope: what it may reach (see `scope`).

use std::fmt;
use std::sync::Arc;
use std::time::SystemTime;

use nfsprov_api_types::{Endpoint, MAX_TOKEN_BYTES, ReloadingFile, SnapshotName};
use subtle::ConstantTimeEq;

use crate::config::AuthConfig;
use crate::credentials::{CredentialSet, CredentialsError, ScopeSettings, WatchedCredentials};
use crate::scope::{Limits, OutOfScope, Scope};
use crate::store::PrefixLimit;
use crate::transfers::Grants;

/// Told the limits of every scoped or limited credential whenever they change.
pub(crate) type OnLimits = Box<dyn Fn(Vec<PrefixLimit>) + Send + Sync>;

/// The authenticated caller, as written to the audit log, and what it may reach. Never
/// holds a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller {
    identity: Identity,
    scope: Arc<Scope>,
    /// Its `max_jobs`.
    max_jobs: Option<usize>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Identity {
    Certificate(String),
    Token(String),
    /// A transfer grant's token: it reads this one snapshot, nothing else.
    Transfer(SnapshotName),
    /// Development mode without authentication.
    Anonymous,
}

impl Caller {
    pub(crate) fn scope(&self) -> &Scope {
        &self.scope
    }

    /// The most jobs of its admitted at once; `None`: no bound of its own.
    pub(crate) fn max_jobs(&self) -> Option<usize> {
        self.max_jobs
    }

    /// The credential's name alone: the label of its metrics.
    pub(crate) fn name(&self) -> &str {
        match &self.identity {
            Identity::Certificate(name) | Identity::Token(name) => name,
            Identity::Transfer(_) => "transfer",
            Identity::Anonymous => "anonymous",
        }
    }

    /// The snapshot a transfer grant's bearer reads; `None` for every other caller.
    pub(crate) fn granted_snapshot(&self) -> Option<&SnapshotName> {
        match &self.identity {
            Identity::Transfer(name) => Some(name),
            _ => None,
        }
    }

    /// Whether the caller may call `endpoint` at all: a grant's bearer the transfer
    /// endpoints only, every other caller what its scope's operations allow.
    pub(crate) fn check_endpoint(&self, endpoint: Endpoint) -> Result<(), OutOfScope> {
        match &self.identity {
            Identity::Transfer(_) => {
                if matches!(
                    endpoint,
                    Endpoint::TransferManifest | Endpoint::TransferContent
                ) {
                    Ok(())
                } else {
                    Err(OutOfScope::GrantOnly {
                        endpoint: endpoint.template(),
                    })
                }
            }
            _ => self.scope.check_endpoint(endpoint),
        }
    }

    #[cfg(test)]
    pub(crate) fn token(name: &str, scope: Scope) -> Self {
        Self {
            identity: Identity::Token(name.into()),
            scope: Arc::new(scope),
            max_jobs: None,
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.identity {
            Identity::Certificate(name) => write!(f, "cert:{name}"),
            Identity::Token(name) => write!(f, "token:{name}"),
            Identity::Transfer(name) => write!(f, "transfer:{name}"),
            Identity::Anonymous => f.write_str("anonymous"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AuthSetupError {
    #[error("token {name:?} file {path}: {source}")]
    TokenFile {
        name: String,
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("token {name:?} file {path} is empty")]
    EmptyToken { name: String, path: String },
    #[error("token {name:?}: {message}")]
    Scope { name: String, message: String },
    #[error("scoped credentials: {0}")]
    Credentials(#[from] CredentialsError),
}

struct NamedToken {
    name: String,
    file: ReloadingFile,
    scope: Arc<Scope>,
    max_jobs: Option<usize>,
}

/// Decides who a request comes from, and what it may reach.
pub(crate) struct Authenticator {
    tokens: Vec<NamedToken>,
    certificate_scopes: Vec<(String, Arc<Scope>, Option<usize>)>,
    credentials: WatchedCredentials,
    /// The transfer grants alive, issued through the API.
    pub(crate) grants: Grants,
    whole_root: Arc<Scope>,
    disabled: bool,
}

impl fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.tokens.iter().map(|t| t.name.as_str()).collect();
        f.debug_struct("Authenticator")
            .field("tokens", &names)
            .field("credentials_file", &self.credentials.path())
            .field("disabled", &self.disabled)
            .finish()
    }
}

impl Authenticator {
    /// The authenticator of `config`; `on_limits` is told the credentials' limits now
    /// and each time the credentials file brings others.
    pub(crate) fn new(config: &AuthConfig, on_limits: OnLimits) -> Result<Self, AuthSetupError> {
        let mut tokens = Vec::with_capacity(config.tokens.len());
        let mut fixed_limits = Vec::new();
        for token in &config.tokens {
            let path = token.file.display().to_string();
            let file = ReloadingFile::open(&token.file, MAX_TOKEN_BYTES).map_err(|source| {
                AuthSetupError::TokenFile {
                    name: token.name.clone(),
                    path: path.clone(),
                    source,
                }
            })?;
            if file.trimmed().map(|t| t.is_empty()).unwrap_or(true) {
                return Err(AuthSetupError::EmptyToken {
                    name: token.name.clone(),
                    path,
                });
            }
            let scope = scoped(&token.name, token.settings(), &mut fixed_limits)?;
            tokens.push(NamedToken {
                name: token.name.clone(),
                file,
                scope,
                max_jobs: token.max_jobs,
            });
        }
        let mut certificate_scopes = Vec::with_capacity(config.certificate_scopes.len());
        for certificate in &config.certificate_scopes {
            let scope = scoped(&certificate.name, certificate.settings(), &mut fixed_limits)?;
            certificate_scopes.push((certificate.name.clone(), scope, certificate.max_jobs));
        }
        let on_change = move |set: &CredentialSet| {
            let mut limits = fixed_limits.clone();
            limits.extend(
                set.iter()
                    .filter_map(|c| limit_of(&c.name, &c.scope, c.limits)),
            );
            on_limits(limits);
        };
        Ok(Self {
            tokens,
            certificate_scopes,
            credentials: WatchedCredentials::open(
                config.credentials_file.clone(),
                Box::new(on_change),
            )?,
            grants: Grants::default(),
            whole_root: Arc::new(Scope::whole_root()),
            disabled: config.disabled,
        })
    }

    /// The caller, or `None` when the request carries no valid credential.
    pub(crate) fn authenticate(
        &self,
        peer_certificate: Option<&str>,
        authorization: Option<&[u8]>,
    ) -> Option<Caller> {
        if let Some(name) = peer_certificate {
            let (scope, max_jobs) = self
                .certificate_scopes
                .iter()
                .find(|(named, _, _)| named == name)
                .map_or((&self.whole_root, None), |(_, scope, max_jobs)| {
                    (scope, *max_jobs)
                });
            return Some(Caller {
                identity: Identity::Certificate(name.to_owned()),
                scope: scope.clone(),
                max_jobs,
            });
        }
        if let Some(presented) = authorization.and_then(bearer_token)
            && let Some(caller) = self.match_token(presented)
        {
            return Some(caller);
        }
        self.disabled.then(|| Caller {
            identity: Identity::Anonymous,
            scope: self.whole_root.clone(),
            max_jobs: None,
        })
    }

    /// Compares against every token without stopping early, so the time taken does not
    /// reveal which token (or how much of one) matched.
    fn match_token(&self, presented: &[u8]) -> Option<Caller> {
        let mut matched = None;
        for token in &self.tokens {
            let current = match token.file.trimmed() {
                Ok(current) if !current.is_empty() => current,
                // A removed or emptied file accepts nothing; the file's watcher logs why,
                // never the content.
                _ => continue,
            };
            if bool::from(current.as_bytes().ct_eq(presented)) && matched.is_none() {
                matched = Some(Caller {
                    identity: Identity::Token(token.name.clone()),
                    scope: token.scope.clone(),
                    max_jobs: token.max_jobs,
                });
            }
        }
        let credentials = self.credentials.current();
        let scoped = credentials.find(presented).map(|credential| Caller {
            identity: Identity::Token(credential.name.clone()),
            scope: credential.scope.clone(),
            max_jobs: credential.limits.max_jobs,
        });
        matched.or(scoped).or_else(|| {
            let grant = self.grants.find(presented, SystemTime::now())?;
            Some(Caller {
                identity: Identity::Transfer(grant.snapshot),
                scope: self.whole_root.clone(),
                max_jobs: None,
            })
        })
    }
}

/// The scope of the credential `name` of the settings, its limits added to `limits`.
fn scoped(
    name: &str,
    settings: ScopeSettings<'_>,
    limits: &mut Vec<PrefixLimit>,
) -> Result<Arc<Scope>, AuthSetupError> {
    let scope = settings.scope().map_err(|message| AuthSetupError::Scope {
        name: name.to_owned(),
        message,
    })?;
    limits.extend(limit_of(name, &scope, settings.limits));
    Ok(Arc::new(scope))
}

/// What the store is to count and bound for a credential: every one with a prefix (its
/// figures are reported), and one of the whole root only when it has limits.
fn limit_of(name: &str, scope: &Scope, limits: Limits) -> Option<PrefixLimit> {
    let limited = limits.max_volumes.is_some() || limits.max_bytes.is_some();
    (scope.prefix().is_some() || limited).then(|| PrefixLimit {
        credential: name.to_owned(),
        prefix: scope.prefix().cloned(),
        max_volumes: limits.max_volumes,
        max_bytes: limits.max_bytes,
    })
}

fn bearer_token(header: &[u8]) -> Option<&[u8]> {
    let scheme = header.get(..7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = header[7..].trim_ascii();
    (!token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::TokenSection;

    fn token(name: &str) -> Caller {
        Caller::token(name, Scope::whole_root())
    }

    #[test]
    fn tokens_match_exactly_and_rotate() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "s3cret-token\n").unwrap();
        let auth = Authenticator::new(
            &AuthConfig {
                client_ca_file: None,
                allowed_client_names: Vec::new(),
                tokens: vec![TokenSection::whole_root("controller", file.clone())],
                certificate_scopes: Vec::new(),
                credentials_file: dir.path().join("credentials.toml"),
                disabled: false,
            },
            Box::new(|_| {}),
        )
        .unwrap();
        let caller = |h: &str| auth.authenticate(None, Some(h.as_bytes()));
        assert_eq!(caller("Bearer s3cret-token"), Some(token("controller")));
        assert_eq!(caller("bearer s3cret-token"), Some(token("controller")));
        for wrong in [
            "Bearer s3cret-toke",
            "Bearer s3cret-token2",
            "Basic s3cret-token",
            "Bearer ",
            "s3cret-token",
        ] {
            assert_eq!(caller(wrong), None, "{wrong}");
        }
        assert_eq!(auth.authenticate(None, None), None);
        assert_eq!(
            auth.authenticate(Some("cn=controller"), None),
            Some(Caller {
                identity: Identity::Certificate("cn=controller".into()),
                scope: Arc::new(Scope::whole_root()),
                max_jobs: None,
            })
        );
        let staged = dir.path().join("token.new");
        std::fs::write(&staged, "rotated\n").unwrap();
        std::fs::rename(&staged, &file).unwrap();
        // The file's watcher picks the new token up within a few seconds.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while caller("Bearer rotated").is_none() {
            assert!(std::time::Instant::now() < deadline, "never rotated");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        assert_eq!(caller("Bearer s3cret-token"), None);
        assert_eq!(caller("Bearer rotated"), Some(token("controller")));
    }

    #[test]
    fn empty_token_file_is_refused_at_start() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("token");
        std::fs::write(&file, "\n").unwrap();
        let err = Authenticator::new(
            &AuthConfig {
                client_ca_file: None,
                allowed_client_names: Vec::new(),
                tokens: vec![TokenSection::whole_root("c", file)],
                certificate_scopes: Vec::new(),
                credentials_file: dir.path().join("credentials.toml"),
                disabled: false,
            },
            Box::new(|_| {}),
        )
        .unwrap_err();
        assert!(err.to_string().contains("is empty"), "{err}");
    }
}
