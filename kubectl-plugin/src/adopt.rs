//! `adopt`: takes over the PVs another provisioner made on an agent's export
//! (nfs-subdir-external-provisioner's shape: `spec.nfs.path` = the export path plus the
//! directory), so that from then on this project deletes, archives, expands and measures
//! them. For each PV: the agent records the existing directory as a volume (never moving
//! or changing it), then the PV gets this project's annotations and provisioner name.
//! `--dry-run` lists what would be adopted and why anything is skipped, and changes
//! nothing.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams};
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};
use nfsprov_api_types::{AdoptVolumeRequest, VolumeOwner, VolumePath};
use nfsprov_vocabulary::names::{
    ANN_AGENT, ANN_ON_DELETE, ANN_PATH, ANN_PROVISIONED_BY, ANN_QUOTA,
};
use nfsprov_vocabulary::params::{ClassParams, OnDelete};
use nfsprov_vocabulary::quantity::bytes;
use serde::Serialize;
use serde_json::json;

use crate::cluster::{Access, Target, annotation, list, provisioned_by};
use crate::table::Table;

/// What the operator asked for.
#[derive(Debug, Clone)]
pub(crate) struct AdoptOptions {
    /// Provisioner names whose PVs are taken over.
    pub from: Vec<String>,
    /// The agent whose export holds their directories.
    pub agent: String,
    /// The NFS server the PVs name; the agent's own when absent.
    pub nfs_server: Option<String>,
    /// The export path the PVs' paths start with; the agent's own when absent.
    pub nfs_path: Option<String>,
    /// Connection files instead of the agents' Secrets in the cluster.
    pub agents_dir: Option<std::path::PathBuf>,
    pub dry_run: bool,
}

/// One PV and what adoption does (or would do) with it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AdoptRow {
    pub pv: String,
    pub claim: Option<String>,
    pub phase: Option<String>,
    /// The directory below the agent's export root, when the PV's path is under it.
    pub path: Option<String>,
    pub on_delete: Option<String>,
    /// `adopt` (dry run), `adopted`, `skipped` or `failed`.
    pub action: String,
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct AdoptReport {
    pub agent: String,
    pub nfs_server: String,
    pub nfs_path: String,
    pub dry_run: bool,
    pub volumes: Vec<AdoptRow>,
}

/// A PV that can be adopted: where its directory is and what its class says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Candidate {
    pub pv: String,
    pub path: VolumePath,
    pub on_delete: OnDelete,
    pub capacity_bytes: u64,
    pub owner: VolumeOwner,
    pub resource_version: Option<String>,
    /// The PV's access modes are all `ReadOnlyMany`: on an agent with an export manager,
    /// the volume's own export is read-only.
    pub read_only: bool,
}

/// Decides, for every PV of the `from` provisioners on `server:export`, whether it can be
/// adopted; nothing is asked or changed here.
pub(crate) fn plan(
    volumes: &[PersistentVolume],
    classes: &[StorageClass],
    from: &[String],
    server: &str,
    export: &str,
) -> Vec<(AdoptRow, Option<Candidate>)> {
    let classes: BTreeMap<&str, &StorageClass> = classes
        .iter()
        .filter_map(|c| Some((c.metadata.name.as_deref()?, c)))
        .collect();
    let export = export.trim_end_matches('/');
    let mut planned: Vec<(AdoptRow, Option<Candidate>)> = volumes
        .iter()
        .filter(|pv| provisioned_by(pv).is_some_and(|p| from.iter().any(|f| f == p)))
        .map(|pv| plan_one(pv, &classes, server, export))
        .collect();
    planned.sort_by(|a, b| a.0.pv.cmp(&b.0.pv));
    planned
}

fn plan_one(
    pv: &PersistentVolume,
    classes: &BTreeMap<&str, &StorageClass>,
    server: &str,
    export: &str,
) -> (AdoptRow, Option<Candidate>) {
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let mut row = AdoptRow {
        pv: pv.metadata.name.clone().unwrap_or_default(),
        claim: crate::volumes::claim_of(pv),
        phase: pv.status.as_ref().and_then(|s| s.phase.clone()),
        path: None,
        on_delete: None,
        action: "skipped".to_owned(),
        reason: None,
    };
    let skip = |mut row: AdoptRow, reason: String| {
        row.reason = Some(reason);
        (row, None)
    };
    if annotation(&pv.metadata, ANN_AGENT).is_some() {
        return skip(row, "already adopted".to_owned());
    }
    let Some(nfs) = pv.spec.as_ref().and_then(|s| s.nfs.as_ref()) else {
        return skip(row, "not an NFS volume".to_owned());
    };
    if nfs.server != server {
        return skip(
            row,
            format!("on NFS server {}, not the agent's {server}", nfs.server),
        );
    }
    let Some(relative) = nfs
        .path
        .strip_prefix(export)
        .and_then(|rest| rest.strip_prefix('/'))
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|rest| !rest.is_empty())
    else {
        return skip(
            row,
            format!("path {} is not below the agent's export {export}", nfs.path),
        );
    };
    let path = match VolumePath::parse(relative) {
        Ok(path) => path,
        Err(e) => return skip(row, format!("{relative:?} is not a volume path: {e}")),
    };
    row.path = Some(path.to_string());
    let class_name = pv
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or_default();
    // The replaced provisioner's own parameters decide what happens to the data; only
    // onDelete and archiveOnDelete mean anything to both. No class: archive, as both do.
    let on_delete = match classes.get(class_name) {
        Some(class) => match ClassParams::on_delete_of(class.parameters.as_ref()) {
            Ok(on_delete) => on_delete,
            Err(e) => return skip(row, format!("StorageClass {class_name}: {e}")),
        },
        None => OnDelete::Archive,
    };
    row.on_delete = Some(on_delete.to_string());
    let Some(capacity_bytes) = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(bytes)
    else {
        return skip(row, "no readable spec.capacity.storage".to_owned());
    };
    row.action = "adopt".to_owned();
    let candidate = Candidate {
        pv: row.pv.clone(),
        path,
        on_delete,
        capacity_bytes,
        owner: VolumeOwner {
            pvc_namespace: claim_ref.and_then(|c| c.namespace.clone()),
            pvc_name: claim_ref.and_then(|c| c.name.clone()),
            pv_name: Some(row.pv.clone()),
        },
        resource_version: pv.metadata.resource_version.clone(),
        read_only: nfsprov_vocabulary::exports::read_only(
            pv.spec
                .as_ref()
                .and_then(|s| s.access_modes.as_deref())
                .unwrap_or_default(),
        ),
    };
    (row, Some(candidate))
}

/// The agent's client, from connection files or from the cluster's agent Secrets.
pub(crate) async fn agent_client(
    target: &Target,
    name: &str,
    agents_dir: Option<&Path>,
) -> anyhow::Result<AgentClient> {
    if let Some(dir) = agents_dir {
        let configs = AgentConnectionConfig::from_dir(dir)
            .with_context(|| format!("cannot read agent connection files in {}", dir.display()))?;
        let config = configs.iter().find(|c| c.name == name).with_context(|| {
            format!(
                "no connection file for agent {name:?} in {} (found: {})",
                dir.display(),
                configs
                    .iter()
                    .map(|c| c.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })?;
        return AgentClient::new(config).map_err(|e| anyhow::anyhow!("agent {name}: {e}"));
    }
    let deployment = target.deployment().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    agents.client(name).cloned()
}

pub(crate) async fn run(target: &Target, options: &AdoptOptions) -> anyhow::Result<AdoptReport> {
    anyhow::ensure!(
        !options.from.is_empty(),
        "name the provisioner whose volumes to adopt with --from"
    );
    let client = agent_client(target, &options.agent, options.agents_dir.as_deref()).await?;
    let info = client
        .info(None)
        .await
        .with_context(|| format!("cannot ask agent {} where its export is", options.agent))?;
    let per_volume = info.capabilities.exports.per_volume();
    let server = options.nfs_server.clone().unwrap_or(info.nfs.server);
    let export = options.nfs_path.clone().unwrap_or(info.nfs.path);

    let pv_api = Api::<PersistentVolume>::all(target.client.clone());
    let volumes = list(
        &pv_api,
        &ListParams::default(),
        Access {
            verb: "list",
            group: "",
            resource: "persistentvolumes",
            namespace: None,
        },
    )
    .await?;
    let classes = list(
        &Api::<StorageClass>::all(target.client.clone()),
        &ListParams::default(),
        Access {
            verb: "list",
            group: "storage.k8s.io",
            resource: "storageclasses",
            namespace: None,
        },
    )
    .await?;

    let mut rows = Vec::new();
    for (mut row, candidate) in plan(&volumes, &classes, &options.from, &server, &export) {
        if let (Some(candidate), false) = (candidate, options.dry_run) {
            let adopting = Adopting {
                agent: &options.agent,
                client: &client,
                per_volume,
            };
            match adopt_one(target, &pv_api, &adopting, &candidate).await {
                Ok(()) => row.action = "adopted".to_owned(),
                Err(e) => {
                    row.action = "failed".to_owned();
                    row.reason = Some(format!("{e:#}"));
                }
            }
        }
        rows.push(row);
    }
    Ok(AdoptReport {
        agent: options.agent.clone(),
        nfs_server: server,
        nfs_path: export,
        dry_run: options.dry_run,
        volumes: rows,
    })
}

/// The agent adopting, and whether it exports each volume by itself.
struct Adopting<'a> {
    agent: &'a str,
    client: &'a AgentClient,
    per_volume: bool,
}

/// The agent first: until it records the directory, the PV must not claim to be ours (a
/// deletion would find no volume). A PV patch that fails leaves an adopted directory that
/// a second run adopts again (the agent answers the same) and then marks the PV.
///
/// On an agent with an export manager the volume gets an export of its own admitting
/// every host, as the share it came from did: its old class's parameters are another
/// provisioner's, so nothing narrower can be read from them.
async fn adopt_one(
    target: &Target,
    api: &Api<PersistentVolume>,
    adopting: &Adopting<'_>,
    candidate: &Candidate,
) -> anyhow::Result<()> {
    let Adopting {
        agent,
        client,
        per_volume,
    } = *adopting;
    let export = per_volume.then(|| {
        nfsprov_vocabulary::exports::export_request(
            &nfsprov_vocabulary::params::ClassParams::default(),
            candidate.read_only,
            vec![nfsprov_api_types::ExportClient::Everyone],
        )
    });
    client
        .adopt_volume(
            &candidate.path,
            &AdoptVolumeRequest {
                capacity_bytes: candidate.capacity_bytes,
                owner: candidate.owner.clone(),
                export,
            },
            None,
        )
        .await
        .with_context(|| format!("agent {agent} did not adopt {}", candidate.path))?;
    let patch = json!({
        "metadata": {
            "resourceVersion": candidate.resource_version,
            "annotations": {
                ANN_PROVISIONED_BY: target.provisioner,
                ANN_AGENT: agent,
                ANN_PATH: candidate.path.as_str(),
                ANN_ON_DELETE: candidate.on_delete.to_string(),
                // The agent holds an adopted directory to no quota.
                ANN_QUOTA: "off",
            },
        }
    });
    api.patch(
        &candidate.pv,
        &PatchParams::default(),
        &Patch::Merge(&patch),
    )
    .await
    .map_err(|e| {
        Access {
            verb: "patch",
            group: "",
            resource: "persistentvolumes",
            namespace: None,
        }
        .error(e)
    })?;
    Ok(())
}

impl crate::report::Report for AdoptReport {
    fn table(&self) -> String {
        let mut out = format!(
            "{} PVs on {}:{} for agent {}{}\n",
            self.volumes.len(),
            self.nfs_server,
            self.nfs_path,
            self.agent,
            if self.dry_run {
                " (dry run: nothing changed)"
            } else {
                ""
            }
        );
        if self.volumes.is_empty() {
            return out;
        }
        let mut table = Table::new(&["pv", "claim", "phase", "path", "on-delete", "action"]);
        for row in &self.volumes {
            let action = match &row.reason {
                Some(reason) => format!("{}: {reason}", row.action),
                None => row.action.clone(),
            };
            table.row([
                row.pv.clone(),
                row.claim.clone().unwrap_or_else(|| "-".into()),
                row.phase.clone().unwrap_or_else(|| "-".into()),
                row.path.clone().unwrap_or_else(|| "-".into()),
                row.on_delete.clone().unwrap_or_else(|| "-".into()),
                action,
            ]);
        }
        out.push_str(&table.render());
        out
    }

    fn exit_code(&self) -> i32 {
        i32::from(self.volumes.iter().any(|row| row.action == "failed"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FROM: &str = "k8s-sigs.io/nfs-subdir-external-provisioner";

    fn pv(name: &str, server: &str, path: &str, class: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {
                "name": name,
                "resourceVersion": "7",
                "annotations": {"pv.kubernetes.io/provisioned-by": FROM},
            },
            "spec": {
                "capacity": {"storage": "2Gi"},
                "nfs": {"server": server, "path": path},
                "storageClassName": class,
                "persistentVolumeReclaimPolicy": "Delete",
                "claimRef": {"namespace": "team-a", "name": name.trim_start_matches("pvc-")},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    fn class(name: &str, parameters: serde_json::Value) -> StorageClass {
        serde_json::from_value(json!({
            "metadata": {"name": name}, "provisioner": FROM, "parameters": parameters,
        }))
        .unwrap()
    }

    #[test]
    fn the_plan_adopts_what_lies_below_the_agents_export_and_says_why_not_the_rest() {
        let mut adopted = pv("pvc-done", "nfs1", "/srv/nfs/x", "kept");
        adopted
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_AGENT.into(), "nfs1".into());
        let mut other = pv("pvc-other", "nfs1", "/srv/nfs/y", "kept");
        other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_PROVISIONED_BY.into(), "example.com/else".into());
        let mut read_only = pv("pvc-a", "nfs1", "/srv/nfs/team-a-a-pvc-a", "kept");
        read_only.spec.as_mut().unwrap().access_modes = Some(vec!["ReadOnlyMany".into()]);
        let volumes = [
            read_only,
            pv("pvc-b", "nfs1", "/srv/nfs/team-a/b/", "gone"),
            pv("pvc-c", "nfs2", "/srv/nfs/team-a-c-pvc-c", "kept"),
            pv("pvc-d", "nfs1", "/srv/nfsother/d", "kept"),
            pv("pvc-e", "nfs1", "/srv/nfs/../etc", "kept"),
            pv("pvc-f", "nfs1", "/srv/nfs/f", "odd"),
            adopted,
            other,
        ];
        let classes = [
            class("kept", json!({"archiveOnDelete": "false"})),
            class("odd", json!({"onDelete": "shred"})),
        ];
        let planned = plan(&volumes, &classes, &[FROM.to_owned()], "nfs1", "/srv/nfs/");
        let summary: Vec<(&str, &str, Option<&str>)> = planned
            .iter()
            .map(|(row, _)| {
                (
                    row.pv.as_str(),
                    row.action.as_str(),
                    row.on_delete.as_deref(),
                )
            })
            .collect();
        assert_eq!(
            summary,
            [
                ("pvc-a", "adopt", Some("delete")),
                // No class any more: archive, as both provisioners do by default.
                ("pvc-b", "adopt", Some("archive")),
                ("pvc-c", "skipped", None),
                ("pvc-d", "skipped", None),
                ("pvc-done", "skipped", None),
                ("pvc-e", "skipped", None),
                ("pvc-f", "skipped", None),
            ]
        );
        let reason = |pv: &str| {
            planned
                .iter()
                .find(|(row, _)| row.pv == pv)
                .and_then(|(row, _)| row.reason.clone())
                .unwrap_or_default()
        };
        assert!(
            reason("pvc-c").contains("NFS server nfs2"),
            "{}",
            reason("pvc-c")
        );
        assert!(reason("pvc-d").contains("not below"), "{}", reason("pvc-d"));
        assert!(reason("pvc-done").contains("already adopted"));
        assert!(
            reason("pvc-e").contains("not a volume path"),
            "{}",
            reason("pvc-e")
        );
        assert!(reason("pvc-f").contains("onDelete"), "{}", reason("pvc-f"));
        let candidate = planned[1].1.clone().unwrap();
        assert_eq!(candidate.path.as_str(), "team-a/b");
        assert_eq!(candidate.capacity_bytes, 2 << 30);
        assert_eq!(candidate.owner.pvc_namespace.as_deref(), Some("team-a"));
        assert_eq!(candidate.owner.pvc_name.as_deref(), Some("b"));
        assert_eq!(candidate.owner.pv_name.as_deref(), Some("pvc-b"));
        assert_eq!(candidate.resource_version.as_deref(), Some("7"));
        assert!(!candidate.read_only);
        assert!(
            planned[0].1.as_ref().unwrap().read_only,
            "a ReadOnlyMany volume"
        );
    }
}
