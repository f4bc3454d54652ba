//! An agent's connection as a Kubernetes Secret holds it (the Secret `nfsprov-agent init`
//! prints): the settings under a `*.toml` key, and the files they name as other keys of
//! the same Secret. Read through the API, so nothing is written to disk.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use super::{AgentConnectionConfig, Material};

/// The label selector of the Secrets that hold agents' connections: the label
/// `nfsprov-agent init` puts on the Secret it prints.
pub const AGENT_SECRET_SELECTOR: &str = "app.kubernetes.io/component=agent-credentials";

/// One agent read from a Secret: its settings and the material they name.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretAgent {
    /// The key the settings were read from.
    pub key: String,
    /// The settings; their file names are the keys the files were read from.
    pub config: AgentConnectionConfig,
    ca: Vec<u8>,
    client_pair: Option<(Vec<u8>, Vec<u8>)>,
    token: Option<String>,
}

impl std::fmt::Debug for SecretAgent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SecretAgent")
            .field("key", &self.key)
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl SecretAgent {
    pub(super) fn material(&self) -> Material<'_> {
        let label = |path: &Option<std::path::PathBuf>| {
            path.as_ref()
                .map(|p| format!("key {}", p.display()))
                .unwrap_or_default()
        };
        Material {
            ca: (&self.ca, format!("key {}", self.config.ca_file.display())),
            client: self.client_pair.as_ref().map(|(cert, key)| {
                (
                    (cert.as_slice(), label(&self.config.client_cert_file)),
                    (key.as_slice(), label(&self.config.client_key_file)),
                )
            }),
        }
    }

    pub(super) fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }
}

/// Why one `*.toml` key of a Secret does not make an agent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("key {key}: {message}")]
pub struct AgentSecretError {
    pub key: String,
    pub message: String,
}

/// Every agent of a Secret's data, one per `*.toml` key in key order, each read or the
/// reason it cannot be. No `*.toml` key gives an empty list.
pub fn agents_in_secret(
    data: &BTreeMap<String, Vec<u8>>,
) -> Vec<Result<SecretAgent, AgentSecretError>> {
    data.iter()
        .filter(|(key, _)| key.ends_with(".toml") && !key.starts_with('.'))
        .map(|(key, settings)| {
            read_agent(data, settings)
                .map_err(|message| AgentSecretError {
                    key: key.clone(),
                    message,
                })
                .map(|(config, ca, client_pair, token)| SecretAgent {
                    key: key.clone(),
                    config,
                    ca,
                    client_pair,
                    token,
                })
        })
        .collect()
}

type Read = (
    AgentConnectionConfig,
    Vec<u8>,
    Option<(Vec<u8>, Vec<u8>)>,
    Option<String>,
);

fn read_agent(data: &BTreeMap<String, Vec<u8>>, settings: &[u8]) -> Result<Read, String> {
    let text = std::str::from_utf8(settings).map_err(|_| "settings are not UTF-8".to_owned())?;
    let config = AgentConnectionConfig::parse(text)?;
    config.validate()?;
    let ca = lookup(data, "ca_file", &config.ca_file)?.to_vec();
    let client_pair = match (&config.client_cert_file, &config.client_key_file) {
        (Some(cert), Some(key)) => Some((
            lookup(data, "client_cert_file", cert)?.to_vec(),
            lookup(data, "client_key_file", key)?.to_vec(),
        )),
        _ => None,
    };
    let token = match &config.token_file {
        Some(file) => {
            let bytes = lookup(data, "token_file", file)?;
            let token = std::str::from_utf8(bytes)
                .map_err(|_| format!("token_file key {} is not UTF-8", file.display()))?
                .trim();
            if token.is_empty() {
                return Err(format!("token_file key {} is empty", file.display()));
            }
            Some(token.to_owned())
        }
        None => None,
    };
    Ok((config, ca, client_pair, token))
}

/// The value of the key a settings field names; in a Secret a file can only be another
/// key of the same Secret.
fn lookup<'a>(
    data: &'a BTreeMap<String, Vec<u8>>,
    field: &str,
    file: &Path,
) -> Result<&'a [u8], String> {
    let mut components = file.components();
    let key = match (components.next(), components.next()) {
        (Some(Component::Normal(key)), None) => key.to_string_lossy(),
        _ => {
            return Err(format!(
                "{field} {:?} must name another key of the same Secret",
                file.display().to_string()
            ));
        }
    };
    data.get(key.as_ref())
        .map(Vec::as_slice)
        .ok_or_else(|| format!("{field} names key {key}, which the Secret does not hold"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::AgentClient;

    fn data(entries: &[(&str, &str)]) -> BTreeMap<String, Vec<u8>> {
        entries
            .iter()
            .map(|(k, v)| ((*k).to_owned(), v.as_bytes().to_vec()))
            .collect()
    }

    const SETTINGS: &str = "name = \"nfs1\"\nurl = \"https://nfs1:8443\"\nca_file = \"nfs1-ca.pem\"\ntoken_file = \"nfs1-token\"\n";

    #[test]
    fn settings_and_the_keys_they_name() {
        let secret = data(&[
            ("nfs1.toml", SETTINGS),
            ("nfs1-ca.pem", "not a certificate\n"),
            ("nfs1-token", "  t0ken\n"),
        ]);
        let agents = agents_in_secret(&secret);
        assert_eq!(agents.len(), 1);
        let agent = agents[0].as_ref().unwrap();
        assert_eq!(agent.key, "nfs1.toml");
        assert_eq!(agent.config.name, "nfs1");
        assert_eq!(agent.token(), Some("t0ken"));
        assert!(!format!("{agent:?}").contains("t0ken"));
        // The material is the Secret's: a bad CA is named by its key.
        let err = AgentClient::from_secret(agent).unwrap_err().to_string();
        assert!(err.contains("key nfs1-ca.pem"), "{err}");
        assert!(agents_in_secret(&data(&[("nfs1-token", "t")])).is_empty());
    }

    #[test]
    fn what_a_secret_cannot_hold_is_named() {
        let cases = [
            (data(&[("a.toml", SETTINGS)]), "names key nfs1-ca.pem"),
            (
                data(&[
                    ("a.toml", &SETTINGS.replace("nfs1-ca.pem", "/etc/ca.pem")),
                    ("nfs1-token", "t"),
                ]),
                "must name another key",
            ),
            (
                data(&[
                    ("a.toml", SETTINGS),
                    ("nfs1-ca.pem", "x"),
                    ("nfs1-token", "\n"),
                ]),
                "is empty",
            ),
            (data(&[("a.toml", "name = 1")]), "invalid type"),
            (
                data(&[("a.toml", &SETTINGS.replace("https", "http"))]),
                "https://",
            ),
        ];
        for (secret, expected) in cases {
            let agents = agents_in_secret(&secret);
            let err = agents[0].as_ref().unwrap_err();
            assert_eq!(err.key, "a.toml");
            assert!(err.to_string().contains(expected), "{err}");
        }
    }
}
