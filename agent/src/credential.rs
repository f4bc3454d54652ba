//! `nfsprov-agent credential add|rotate|revoke|list`: the scoped credentials of the
//! credentials file, changed while the agent runs. `add` and `rotate` print the Secret
//! for the cluster that is to use the credential; the token itself is kept nowhere on
//! this host.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use crate::config::{DEFAULT_CONFIG_PATH, DEFAULT_CREDENTIALS_FILE, FileConfig};
use crate::credentials::{CredentialEntry, CredentialsError, CredentialsFile, check_name};
use crate::init::{SecretFor, random_token, secret_manifest};
use crate::scope::Operations;

#[derive(Debug, Args)]
pub struct CredentialArgs {
    /// The agent's settings file: where the credentials file and the CA are found.
    #[arg(long, short, env = "NFSPROV_AGENT_CONFIG", default_value = DEFAULT_CONFIG_PATH)]
    pub config: PathBuf,
    #[command(subcommand)]
    pub action: CredentialAction,
}

#[derive(Debug, Subcommand)]
pub enum CredentialAction {
    /// Add a credential and print the Secret for the cluster that uses it.
    Add {
        name: String,
        #[command(flatten)]
        scope: ScopeArgs,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Give a credential a new token (the old one stops at once) and print its Secret.
    Rotate {
        name: String,
        #[command(flatten)]
        secret: SecretArgs,
    },
    /// Remove a credential: its token stops at once.
    Revoke { name: String },
    /// List the credentials and their scopes (never their tokens).
    List,
}

#[derive(Debug, Args)]
pub struct ScopeArgs {
    /// The volumes it acts on lie beneath this path (e.g. `staging`); the controller's
    /// `pathPattern` must start with it.
    #[arg(long)]
    pub prefix: Option<String>,
    /// Lists and lookups only.
    #[arg(long, conflicts_with = "no_delete")]
    pub read_only: bool,
    /// Everything but deleting or archiving.
    #[arg(long)]
    pub no_delete: bool,
    /// A client (address, network or `*`) its exports may admit; repeat for several.
    /// Absent: any.
    #[arg(long = "export-clients", value_delimiter = ',')]
    pub export_clients: Vec<String>,
    /// The most volumes beneath its prefix.
    #[arg(long)]
    pub max_volumes: Option<u64>,
    /// The most capacity (bytes) its volumes may add up to.
    #[arg(long)]
    pub max_bytes: Option<u64>,
    /// The most clones, snapshots and restores of its running or waiting at once.
    #[arg(long)]
    pub max_jobs: Option<usize>,
}

#[derive(Debug, Args)]
pub struct SecretArgs {
    /// The agent's URL as the cluster reaches it (`https://nfs1.example.com:8443`).
    #[arg(long)]
    pub url: String,
    /// The agent's name in that cluster's controller settings.
    #[arg(long, default_value = "default")]
    pub agent_name: String,
    /// The namespace of the Secret.
    #[arg(long, default_value = "nfsprov")]
    pub namespace: String,
    /// The CA that signed the agent's certificate; absent: `tls.client_ca_file` of the
    /// settings (the one CA `init` makes).
    #[arg(long)]
    pub ca_file: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CredentialError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    File(#[from] CredentialsError),
    #[error("{path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Carries out `args`; answers what to print.
pub fn run(args: &CredentialArgs) -> Result<String, CredentialError> {
    let settings = Settings::read(&args.config)?;
    let mut file = CredentialsFile::read(&settings.credentials_file)?;
    let position = |file: &CredentialsFile, name: &str| {
        file.credentials.iter().position(|entry| entry.name == name)
    };
    match &args.action {
        CredentialAction::Add {
            name,
            scope,
            secret,
        } => {
            check_name(name).map_err(CredentialError::Invalid)?;
            if position(&file, name).is_some() {
                return Err(CredentialError::Invalid(format!(
                    "credential {name:?} exists already: rotate or revoke it"
                )));
            }
            let token = new_token()?;
            file.credentials.push(CredentialEntry {
                name: name.clone(),
                token_sha256: crate::credentials::token_sha256(token.as_bytes()),
                prefix: scope.prefix.clone(),
                operations: scope.operations(),
                export_clients: (!scope.export_clients.is_empty())
                    .then(|| scope.export_clients.clone()),
                max_volumes: scope.max_volumes,
                max_bytes: scope.max_bytes,
                max_jobs: scope.max_jobs,
            });
            let entry = file.credentials.last().cloned();
            entry
                .as_ref()
                .map(CredentialEntry::scope)
                .transpose()
                .map_err(|e| CredentialError::Invalid(format!("credential {name:?}: {e}")))?;
            file.write(&settings.credentials_file)?;
            settings.secret(secret, &token)
        }
        CredentialAction::Rotate { name, secret } => {
            let Some(at) = position(&file, name) else {
                return Err(no_such(name, &settings.credentials_file));
            };
            let token = new_token()?;
            file.credentials[at].token_sha256 = crate::credentials::token_sha256(token.as_bytes());
            file.write(&settings.credentials_file)?;
            settings.secret(secret, &token)
        }
        CredentialAction::Revoke { name } => {
            let Some(at) = position(&file, name) else {
                return Err(no_such(name, &settings.credentials_file));
            };
            file.credentials.remove(at);
            file.write(&settings.credentials_file)?;
            Ok(format!(
                "credential {name:?} revoked: the agent refuses its token within a second\n"
            ))
        }
        CredentialAction::List => Ok(list(&file)),
    }
}

impl ScopeArgs {
    fn operations(&self) -> Operations {
        if self.read_only {
            Operations::ReadOnly
        } else if self.no_delete {
            Operations::NoDelete
        } else {
            Operations::All
        }
    }
}

fn no_such(name: &str, file: &Path) -> CredentialError {
    CredentialError::Invalid(format!(
        "there is no credential {name:?} in {}",
        file.display()
    ))
}

fn new_token() -> Result<String, CredentialError> {
    random_token().map_err(|source| CredentialError::Read {
        path: "the system's random source".into(),
        source,
    })
}

fn list(file: &CredentialsFile) -> String {
    let mut out = String::from("NAME\tPREFIX\tOPERATIONS\tEXPORT CLIENTS\n");
    for entry in &file.credentials {
        out.push_str(&format!(
            "{}\t{}\t{}\t{}\n",
            entry.name,
            entry.prefix.as_deref().unwrap_or("(whole root)"),
            entry.operations,
            entry
                .export_clients
                .as_ref()
                .map_or_else(|| "(any)".to_owned(), |clients| clients.join(",")),
        ));
    }
    out
}

/// What the command reads of the agent's settings.
struct Settings {
    credentials_file: PathBuf,
    ca_file: Option<PathBuf>,
}

impl Settings {
    fn read(config: &Path) -> Result<Self, CredentialError> {
        let text = std::fs::read_to_string(config).map_err(|source| CredentialError::Read {
            path: config.to_owned(),
            source,
        })?;
        let file: FileConfig = toml::from_str(&text).map_err(|e| {
            CredentialError::Invalid(format!("{}: {}", config.display(), e.message()))
        })?;
        let base = config.parent().unwrap_or(Path::new("/"));
        let resolve = |p: &Path| base.join(p);
        Ok(Self {
            credentials_file: file
                .credentials_file
                .as_deref()
                .map_or_else(|| base.join(DEFAULT_CREDENTIALS_FILE), resolve),
            ca_file: file.tls.client_ca_file.as_deref().map(resolve),
        })
    }

    fn secret(&self, args: &SecretArgs, token: &str) -> Result<String, CredentialError> {
        let ca_file = args.ca_file.clone().or_else(|| self.ca_file.clone()).ok_or_else(|| {
            CredentialError::Invalid(
                "the settings name no CA (tls.client_ca_file): pass --ca-file with the CA that signed the agent's certificate".into(),
            )
        })?;
        let ca = std::fs::read_to_string(&ca_file).map_err(|source| CredentialError::Read {
            path: ca_file,
            source,
        })?;
        Ok(secret_manifest(
            &SecretFor {
                agent: &args.agent_name,
                namespace: &args.namespace,
                url: &args.url,
            },
            &ca,
            None,
            token,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(dir: &Path) -> PathBuf {
        std::fs::write(
            dir.join("ca.pem"),
            "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        )
        .unwrap();
        let config = dir.join("agent.toml");
        std::fs::write(
            &config,
            "export_root = \"/srv/nfs\"\n[tls]\ncert_file = \"server.pem\"\nkey_file = \"server-key.pem\"\nclient_ca_file = \"ca.pem\"\n",
        )
        .unwrap();
        config
    }

    fn secret() -> SecretArgs {
        SecretArgs {
            url: "https://nfs1.example.com:8443".into(),
            agent_name: "nfs1".into(),
            namespace: "nfsprov".into(),
            ca_file: None,
        }
    }

    fn token_of(manifest: &str) -> String {
        let mut lines = manifest.lines();
        lines.find(|line| line.trim() == "nfs1-token: |").unwrap();
        lines.next().unwrap().trim().to_owned()
    }

    #[test]
    fn add_rotate_and_revoke_change_only_their_credential() {
        let dir = tempfile::tempdir().unwrap();
        let config = settings(dir.path());
        let run_action = |action| {
            run(&CredentialArgs {
                config: config.clone(),
                action,
            })
        };
        let add = |name: &str, prefix: &str| {
            run_action(CredentialAction::Add {
                name: name.into(),
                scope: ScopeArgs {
                    prefix: Some(prefix.into()),
                    read_only: false,
                    no_delete: false,
                    export_clients: vec!["10.2.0.0/16".into()],
                    max_volumes: Some(10),
                    max_bytes: None,
                    max_jobs: Some(2),
                },
                secret: secret(),
            })
        };
        let staging = add("staging", "staging").unwrap();
        let production = add("production", "production").unwrap();
        assert!(staging.contains("name: nfsprov-agent-nfs1"), "{staging}");
        assert!(
            !staging.contains("tls.crt"),
            "a token-only Secret: {staging}"
        );
        let file_path = dir.path().join(DEFAULT_CREDENTIALS_FILE);
        let stored = std::fs::read_to_string(&file_path).unwrap();
        assert!(
            !stored.contains(&token_of(&staging)),
            "the token is never stored"
        );
        let read = || CredentialsFile::read(&file_path).unwrap();
        let before = read();
        let set = |file: &CredentialsFile| {
            crate::credentials::token_sha256(token_of(&staging).as_bytes())
                == file.credentials[0].token_sha256
        };
        assert!(set(&before));
        let refused = add("staging", "elsewhere").unwrap_err();
        assert!(refused.to_string().contains("exists already"), "{refused}");

        let rotated = run_action(CredentialAction::Rotate {
            name: "staging".into(),
            secret: secret(),
        })
        .unwrap();
        let after = read();
        assert_ne!(token_of(&rotated), token_of(&staging));
        assert!(!set(&after));
        assert_eq!(
            after.credentials[1], before.credentials[1],
            "production untouched"
        );
        assert_eq!(after.credentials[0].prefix.as_deref(), Some("staging"));

        run_action(CredentialAction::Revoke {
            name: "staging".into(),
        })
        .unwrap();
        let revoked = read();
        assert_eq!(revoked.credentials, vec![before.credentials[1].clone()]);
        assert!(production.contains("nfs1-token"));
        let listed = run_action(CredentialAction::List).unwrap();
        assert!(
            listed.contains("production\tproduction\tall\t10.2.0.0/16"),
            "{listed}"
        );
        let missing = run_action(CredentialAction::Revoke {
            name: "staging".into(),
        })
        .unwrap_err();
        assert!(missing.to_string().contains("no credential"), "{missing}");
    }

    #[test]
    fn a_bad_scope_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let config = settings(dir.path());
        let refused = run(&CredentialArgs {
            config,
            action: CredentialAction::Add {
                name: "x".into(),
                scope: ScopeArgs {
                    prefix: Some("../etc".into()),
                    read_only: true,
                    no_delete: false,
                    export_clients: Vec::new(),
                    max_volumes: None,
                    max_bytes: None,
                    max_jobs: None,
                },
                secret: secret(),
            },
        })
        .unwrap_err();
        assert!(refused.to_string().contains("prefix"), "{refused}");
        assert!(!dir.path().join(DEFAULT_CREDENTIALS_FILE).exists());
    }
}
