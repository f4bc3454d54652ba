//! What one credential may reach: the part of the export root it acts on, the kinds of
//! operation it may ask for, and the NFS clients its exports may admit. A cluster is a
//! unit of compromise; a credential confined to its own prefix keeps a compromised
//! cluster's controller away from every other cluster's volumes, archives and
//! snapshots on the same agent.

use std::fmt;

use nfsprov_api_types::{Endpoint, ExportClient, ExportRequest, VolumePath};
use serde::{Deserialize, Serialize};

/// The kinds of operation a credential may ask for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Operations {
    /// Everything the API offers.
    #[default]
    All,
    /// Everything but deleting a volume, an archive or a snapshot (archiving a volume
    /// stops serving it, so it counts as a delete).
    NoDelete,
    /// Lists and lookups only: a monitoring identity.
    ReadOnly,
}

impl Operations {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Operations::All => "all",
            Operations::NoDelete => "no-delete",
            Operations::ReadOnly => "read-only",
        }
    }

    /// Whether a caller with these operations may call `endpoint`.
    pub(crate) fn allow(self, endpoint: Endpoint) -> bool {
        match (self, kind_of(endpoint)) {
            (_, Kind::Transfer) => false,
            (_, Kind::Read) | (Operations::All, _) => true,
            (Operations::NoDelete, Kind::Write) => true,
            (Operations::NoDelete, Kind::Delete) | (Operations::ReadOnly, _) => false,
        }
    }
}

impl fmt::Display for Operations {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

enum Kind {
    Read,
    Write,
    Delete,
    /// Reads of a granted snapshot: for a transfer grant's token, never a credential's.
    Transfer,
}

fn kind_of(endpoint: Endpoint) -> Kind {
    match endpoint {
        Endpoint::Healthz
        | Endpoint::Readyz
        | Endpoint::Metrics
        | Endpoint::Info
        | Endpoint::ListVolumes
        | Endpoint::GetVolume
        | Endpoint::ListArchives
        | Endpoint::GetArchive
        | Endpoint::ListSnapshots
        | Endpoint::GetSnapshot => Kind::Read,
        Endpoint::CreateVolume
        | Endpoint::ResizeVolume
        | Endpoint::AdoptVolume
        | Endpoint::CloneVolume
        | Endpoint::SetVolumeExport
        | Endpoint::CreateSnapshot
        | Endpoint::RestoreVolume
        | Endpoint::CreateTransfer
        | Endpoint::ReceiveReplica => Kind::Write,
        Endpoint::TransferManifest | Endpoint::TransferContent => Kind::Transfer,
        Endpoint::DeleteVolume
        | Endpoint::ArchiveVolume
        | Endpoint::DeleteArchive
        | Endpoint::DeleteSnapshot => Kind::Delete,
    }
}

/// How much one credential may make beneath its prefix; `None`: no bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    pub max_volumes: Option<u64>,
    /// The most capacity its volumes may add up to.
    pub max_bytes: Option<u64>,
    /// The most clones, snapshots and restores of its admitted at once.
    pub max_jobs: Option<usize>,
}

/// What one credential may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// The volumes it acts on lie beneath this path; `None`: the whole export root.
    prefix: Option<VolumePath>,
    operations: Operations,
    /// The clients its exports may admit lie within one of these; `None`: any.
    export_clients: Option<Vec<ExportClient>>,
}

/// Why a request falls outside its credential's scope. The message names only what the
/// caller sent and its own scope, never whether anything exists outside it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum OutOfScope {
    #[error("{path} is outside this credential's prefix {prefix}")]
    Path { path: String, prefix: VolumePath },
    #[error("this credential may not call {endpoint} (operations = {operations})")]
    Operation {
        endpoint: &'static str,
        operations: Operations,
    },
    #[error(
        "export client {client} is outside what this credential's exports may admit ({bounds})"
    )]
    ExportClient {
        client: ExportClient,
        bounds: String,
    },
    #[error("the metrics describe the whole agent: only a credential without a prefix reads them")]
    Metrics,
    #[error("{endpoint} reads a granted snapshot: it takes a transfer grant's token only")]
    NeedsGrant { endpoint: &'static str },
    #[error(
        "a transfer grant reads its own snapshot through the transfer endpoints only, not {endpoint}"
    )]
    GrantOnly { endpoint: &'static str },
}

impl Scope {
    /// The whole export root, every operation, any client: what a credential without a
    /// scope of its own has, as every credential had before scopes existed.
    pub(crate) fn whole_root() -> Self {
        Self::default()
    }

    pub(crate) fn new(
        prefix: Option<VolumePath>,
        operations: Operations,
        export_clients: Option<Vec<ExportClient>>,
    ) -> Self {
        Self {
            prefix,
            operations,
            export_clients,
        }
    }

    pub(crate) fn prefix(&self) -> Option<&VolumePath> {
        self.prefix.as_ref()
    }

    #[cfg(test)]
    pub(crate) fn operations(&self) -> Operations {
        self.operations
    }

    /// Whether `path` is the caller's to act on.
    pub(crate) fn contains(&self, path: &VolumePath) -> bool {
        self.prefix
            .as_ref()
            .is_none_or(|prefix| path.is_beneath(prefix))
    }

    /// `path` when it is the caller's to act on.
    pub(crate) fn check_path(&self, path: &VolumePath) -> Result<(), OutOfScope> {
        match &self.prefix {
            Some(prefix) if !path.is_beneath(prefix) => Err(OutOfScope::Path {
                path: path.to_string(),
                prefix: prefix.clone(),
            }),
            _ => Ok(()),
        }
    }

    pub(crate) fn check_endpoint(&self, endpoint: Endpoint) -> Result<(), OutOfScope> {
        if endpoint == Endpoint::Metrics && self.prefix.is_some() {
            return Err(OutOfScope::Metrics);
        }
        if self.operations.allow(endpoint) {
            Ok(())
        } else if matches!(kind_of(endpoint), Kind::Transfer) {
            Err(OutOfScope::NeedsGrant {
                endpoint: endpoint.template(),
            })
        } else {
            Err(OutOfScope::Operation {
                endpoint: endpoint.template(),
                operations: self.operations,
            })
        }
    }

    /// Every client `export` admits lies within the bounds.
    pub(crate) fn check_export(&self, export: &ExportRequest) -> Result<(), OutOfScope> {
        let Some(bounds) = &self.export_clients else {
            return Ok(());
        };
        match export
            .clients
            .iter()
            .find(|client| !bounds.iter().any(|bound| client.is_within(bound)))
        {
            None => Ok(()),
            Some(client) => Err(OutOfScope::ExportClient {
                client: *client,
                bounds: bounds
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.prefix {
            Some(prefix) => write!(f, "prefix {prefix}")?,
            None => f.write_str("the whole export root")?,
        }
        write!(f, ", operations {}", self.operations)?;
        if let Some(bounds) = &self.export_clients {
            let bounds: Vec<String> = bounds.iter().map(ToString::to_string).collect();
            write!(f, ", exports within {}", bounds.join(", "))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(raw: &str) -> VolumePath {
        VolumePath::parse(raw).unwrap()
    }

    #[test]
    fn a_prefix_holds_the_paths_beneath_it_only() {
        let scope = Scope::new(Some(path("staging")), Operations::All, None);
        assert!(scope.contains(&path("staging/ns/app")));
        assert!(scope.check_path(&path("staging/app")).is_ok());
        for outside in ["production/app", "staging", "staging2/app", "stag"] {
            let refused = scope.check_path(&path(outside)).unwrap_err();
            assert_eq!(
                refused.to_string(),
                format!("{outside} is outside this credential's prefix staging")
            );
        }
        assert!(Scope::whole_root().contains(&path("anything/at/all")));
    }

    #[test]
    fn operations_bound_the_endpoints() {
        let read_only = Scope::new(None, Operations::ReadOnly, None);
        let no_delete = Scope::new(None, Operations::NoDelete, None);
        for endpoint in Endpoint::ALL {
            let kind = kind_of(endpoint);
            assert_eq!(
                read_only.check_endpoint(endpoint).is_ok(),
                matches!(kind, Kind::Read),
                "{endpoint:?}"
            );
            assert_eq!(
                no_delete.check_endpoint(endpoint).is_ok(),
                matches!(kind, Kind::Read | Kind::Write),
                "{endpoint:?}"
            );
            assert_eq!(
                Scope::whole_root().check_endpoint(endpoint).is_ok(),
                !matches!(kind, Kind::Transfer),
                "{endpoint:?}"
            );
        }
    }

    #[test]
    fn the_metrics_are_for_a_credential_without_a_prefix() {
        let scoped = Scope::new(Some(path("staging")), Operations::All, None);
        assert_eq!(
            scoped.check_endpoint(Endpoint::Metrics),
            Err(OutOfScope::Metrics)
        );
        let monitoring = Scope::new(None, Operations::ReadOnly, None);
        assert!(monitoring.check_endpoint(Endpoint::Metrics).is_ok());
    }

    #[test]
    fn exports_admit_only_clients_within_the_bounds() {
        let bounds = vec!["10.2.0.0/16".parse().unwrap()];
        let scope = Scope::new(None, Operations::All, Some(bounds));
        let export = |clients: &[&str]| ExportRequest {
            clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
            ..ExportRequest::default()
        };
        assert!(
            scope
                .check_export(&export(&["10.2.3.4", "10.2.9.0/24"]))
                .is_ok()
        );
        assert!(scope.check_export(&export(&[])).is_ok());
        for wide in ["*", "10.0.0.0/8", "10.3.0.1"] {
            let refused = scope
                .check_export(&export(&["10.2.3.4", wide]))
                .unwrap_err();
            assert!(refused.to_string().contains(wide), "{refused}");
        }
    }
}
