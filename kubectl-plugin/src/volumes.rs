//! `volumes`: the PVs of this provisioner with their claim, agent, path, capacity, the
//! usage the agent measured, the condition it reports (normal, or why not), and what each
//! volume made from other data was made from (the claim of a clone, the Snapshot or archive
//! of a restore).

use k8s_openapi::api::core::v1::PersistentVolume;
use nfsprov_api_types::VolumePath;
use nfsprov_api_types::client::ClientError;
use nfsprov_vocabulary::names::{
    ANN_AGENT, ANN_CLONE_METHOD, ANN_CLONED_FROM, ANN_PATH, ANN_RESTORED_FROM_ARCHIVE,
};
use nfsprov_vocabulary::snapshots::ANN_RESTORED_FROM;
use serde::Serialize;

use crate::cluster::{Target, annotation};
use crate::credentials::Agents;
use crate::table::{Table, human_bytes};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct VolumeRow {
    /// `namespace/name` of the claim the PV is bound to.
    pub claim: Option<String>,
    pub pv: String,
    pub phase: Option<String>,
    pub agent: Option<String>,
    pub path: Option<String>,
    /// The PV's `spec.capacity.storage` as written.
    pub capacity: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub used_bytes: Option<u64>,
    pub quota_enforced: Option<bool>,
    /// `namespace/name` of the claim this volume was cloned from, and how (also how a
    /// restored one was made).
    pub cloned_from: Option<String>,
    pub clone_method: Option<String>,
    /// What a restored volume was made from: `snapshot namespace/name` or
    /// `archive agent:id`.
    pub restored_from: Option<String>,
    /// The clients the volume's own export admits; `None` where the agent has no export
    /// manager (its share decides) or was not read.
    pub clients: Option<Vec<String>>,
    /// `normal`, or the reason the agent reports the volume abnormal (`missing` when it has
    /// no such volume); `None` when the agent was not read or does not check.
    pub condition: Option<String>,
    /// What the agent found, when abnormal.
    pub condition_message: Option<String>,
    /// Why the agent's figures are missing.
    pub error: Option<String>,
    /// The error is the agent's: its Secret made no client, or it did not answer.
    #[serde(skip)]
    pub agent_unchecked: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct VolumesReport {
    pub volumes: Vec<VolumeRow>,
    /// Agents whose Secret made no client or that did not answer, with the reason: the
    /// usage of their volumes is unknown.
    pub unchecked_agents: Vec<(String, String)>,
}

/// The claim a PV is bound to, as `namespace/name`.
pub(crate) fn claim_of(pv: &PersistentVolume) -> Option<String> {
    let claim = pv.spec.as_ref()?.claim_ref.as_ref()?;
    Some(format!(
        "{}/{}",
        claim.namespace.as_deref().unwrap_or(""),
        claim.name.as_deref().unwrap_or("")
    ))
}

/// The row of one PV before the agent is asked.
pub(crate) fn base_row(pv: &PersistentVolume) -> VolumeRow {
    let capacity = pv
        .spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"));
    VolumeRow {
        claim: claim_of(pv),
        pv: pv.metadata.name.clone().unwrap_or_default(),
        phase: pv.status.as_ref().and_then(|s| s.phase.clone()),
        agent: annotation(&pv.metadata, ANN_AGENT).map(str::to_owned),
        path: annotation(&pv.metadata, ANN_PATH).map(str::to_owned),
        capacity: capacity.map(|q| q.0.clone()),
        capacity_bytes: capacity.and_then(nfsprov_vocabulary::quantity::bytes),
        used_bytes: None,
        quota_enforced: None,
        cloned_from: annotation(&pv.metadata, ANN_CLONED_FROM).map(str::to_owned),
        clone_method: annotation(&pv.metadata, ANN_CLONE_METHOD).map(str::to_owned),
        restored_from: annotation(&pv.metadata, ANN_RESTORED_FROM)
            .map(|snapshot| format!("snapshot {snapshot}"))
            .or_else(|| {
                annotation(&pv.metadata, ANN_RESTORED_FROM_ARCHIVE)
                    .map(|archive| format!("archive {archive}"))
            }),
        clients: None,
        condition: None,
        condition_message: None,
        error: None,
        agent_unchecked: false,
    }
}

async fn with_usage(mut row: VolumeRow, agents: &Agents) -> VolumeRow {
    let (Some(agent), Some(path)) = (&row.agent, &row.path) else {
        row.error = Some("the PV has no nfsprov.dev/agent or nfsprov.dev/path annotation".into());
        return row;
    };
    let Some(configured) = agents.get(agent) else {
        row.error = Some(format!("agent {agent} is not configured"));
        return row;
    };
    let client = match &configured.client {
        Ok(client) => client,
        Err(e) => {
            row.error = Some(e.clone());
            row.agent_unchecked = true;
            return row;
        }
    };
    let path = match VolumePath::parse(path) {
        Ok(p) => p,
        Err(e) => {
            row.error = Some(format!("invalid path annotation: {e}"));
            return row;
        }
    };
    match client.get_volume(&path, None).await {
        Ok(Some(volume)) => {
            row.used_bytes = volume.usage.map(|u| u.used_bytes);
            row.quota_enforced = Some(volume.quota_enforced);
            row.capacity_bytes = row.capacity_bytes.or(Some(volume.capacity_bytes));
            row.clients = volume
                .export
                .map(|e| e.clients.iter().map(ToString::to_string).collect());
            if let Some(condition) = volume.condition {
                match condition.abnormal {
                    Some(reason) => {
                        row.condition = Some(reason.as_str().to_owned());
                        row.condition_message = Some(condition.message);
                    }
                    None => row.condition = Some("normal".to_owned()),
                }
            }
        }
        Ok(None) => {
            row.condition = Some(
                nfsprov_api_types::AbnormalReason::Missing
                    .as_str()
                    .to_owned(),
            );
            row.error = Some(format!("agent {agent} has no volume at this path"));
        }
        Err(e) => {
            row.agent_unchecked = matches!(e, ClientError::Transport(_));
            row.error = Some(e.to_string());
        }
    }
    row
}

pub(crate) async fn run(target: &Target) -> anyhow::Result<VolumesReport> {
    let deployment = target.deployment().await?;
    let volumes = target.volumes().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    let rows =
        futures::future::join_all(volumes.iter().map(|pv| with_usage(base_row(pv), &agents))).await;
    let mut unchecked: std::collections::BTreeMap<String, String> = Default::default();
    for row in rows.iter().filter(|r| r.agent_unchecked) {
        if let (Some(agent), Some(error)) = (&row.agent, &row.error) {
            unchecked
                .entry(agent.clone())
                .or_insert_with(|| error.clone());
        }
    }
    Ok(VolumesReport {
        volumes: rows,
        unchecked_agents: unchecked.into_iter().collect(),
    })
}

/// An export's clients in one cell: a `nodes` export of a large cluster is counted.
fn clients_cell(clients: &[String]) -> String {
    match clients.len() {
        0 => "none".to_owned(),
        n if n > 3 => format!("{n} clients"),
        _ => clients.join(","),
    }
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

impl crate::report::Report for VolumesReport {
    fn table(&self) -> String {
        if self.volumes.is_empty() {
            return "No PV of this provisioner.\n".to_owned();
        }
        let mut table = Table::new(&[
            "claim",
            "pv",
            "status",
            "agent",
            "path",
            "capacity",
            "used",
            "enforced",
            "clients",
            "condition",
            "origin",
        ]);
        for v in &self.volumes {
            let used = match (v.used_bytes, &v.error) {
                (Some(bytes), _) => human_bytes(bytes),
                (None, Some(_)) => "?".to_owned(),
                (None, None) => "not measured yet".to_owned(),
            };
            table.row([
                or_dash(v.claim.clone()),
                v.pv.clone(),
                or_dash(v.phase.clone()),
                or_dash(v.agent.clone()),
                or_dash(v.path.clone()),
                or_dash(v.capacity.clone()),
                used,
                or_dash(
                    v.quota_enforced
                        .map(|e| if e { "yes" } else { "no" }.to_owned()),
                ),
                or_dash(v.clients.as_deref().map(clients_cell)),
                or_dash(v.condition.clone()),
                or_dash(v.cloned_from.clone().or_else(|| v.restored_from.clone())),
            ]);
        }
        let mut out = table.render();
        for v in &self.volumes {
            if let Some(error) = &v.error {
                out.push_str(&format!("{}: {error}\n", v.pv));
            } else if let (Some(reason), Some(message)) = (&v.condition, &v.condition_message) {
                out.push_str(&format!("{}: {reason}: {message}\n", v.pv));
            }
        }
        for (agent, reason) in &self.unchecked_agents {
            out.push_str(&format!("agent {agent} not checked: {reason}\n"));
        }
        out
    }

    /// 1 when an agent could not be read or reached: the usage shown is incomplete.
    fn exit_code(&self) -> i32 {
        i32::from(!self.unchecked_agents.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use serde_json::json;

    fn pv(annotations: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": "pvc-2", "annotations": annotations},
            "spec": {
                "capacity": {"storage": "2Gi"},
                "claimRef": {"namespace": "ns", "name": "copy"},
            },
            "status": {"phase": "Bound"},
        }))
        .unwrap()
    }

    #[test]
    fn the_condition_column_shows_normal_the_reason_or_a_dash_and_the_agents_message() {
        let row = |name: &str, condition: Option<&str>, message: Option<&str>| {
            let mut row = base_row(&pv(json!({ANN_AGENT: "nfs1", ANN_PATH: "ns/copy"})));
            row.pv = name.into();
            row.condition = condition.map(str::to_owned);
            row.condition_message = message.map(str::to_owned);
            row
        };
        let table = VolumesReport {
            volumes: vec![
                row("pvc-1", Some("normal"), None),
                row(
                    "pvc-2",
                    Some("read_only"),
                    Some("the filesystem is mounted read-only"),
                ),
                row("pvc-3", None, None),
            ],
            unchecked_agents: Vec::new(),
        }
        .table();
        let conditions: Vec<&str> = table
            .lines()
            .take(4)
            .map(|l| {
                let cells: Vec<&str> = l.split_whitespace().collect();
                cells[cells.len() - 2]
            })
            .collect();
        assert_eq!(
            conditions,
            ["CONDITION", "normal", "read_only", "-"],
            "{table}"
        );
        assert!(
            table.contains("pvc-2: read_only: the filesystem is mounted read-only\n"),
            "{table}"
        );
        assert!(!table.contains("pvc-1:"), "{table}");
    }

    #[test]
    fn a_clone_names_its_origin_and_other_volumes_a_dash() {
        let clone = base_row(&pv(json!({
            ANN_AGENT: "nfs1",
            ANN_PATH: "ns/copy",
            ANN_CLONED_FROM: "ns/data",
            ANN_CLONE_METHOD: "reflink",
        })));
        assert_eq!(clone.cloned_from.as_deref(), Some("ns/data"));
        assert_eq!(clone.clone_method.as_deref(), Some("reflink"));
        let plain = base_row(&pv(json!({ANN_AGENT: "nfs1", ANN_PATH: "ns/copy"})));
        assert_eq!(
            (plain.cloned_from.as_deref(), plain.clone_method.as_deref()),
            (None, None)
        );

        let mut exported = plain.clone();
        exported.pv = "pvc-3".into();
        exported.clients = Some(vec!["10.0.0.2".into(), "10.0.0.3".into()]);
        let mut nobody = plain.clone();
        nobody.pv = "pvc-4".into();
        nobody.clients = Some(Vec::new());
        let mut many = plain.clone();
        many.pv = "pvc-5".into();
        many.clients = Some((1..=40).map(|i| format!("10.0.1.{i}")).collect());
        let archive = "nfs1:ns/data/@20260101T000000.000000000Z";
        let mut from_snapshot = base_row(&pv(json!({
            ANN_AGENT: "nfs1",
            ANN_PATH: "ns/r1",
            ANN_RESTORED_FROM: "ns/nightly",
            ANN_CLONE_METHOD: "reflink",
        })));
        from_snapshot.pv = "pvc-6".into();
        let mut from_archive = base_row(&pv(json!({
            ANN_AGENT: "nfs1",
            ANN_PATH: "ns/r2",
            ANN_RESTORED_FROM_ARCHIVE: archive,
            ANN_CLONE_METHOD: "copy",
        })));
        from_archive.pv = "pvc-7".into();
        assert_eq!(
            (
                from_snapshot.restored_from.as_deref(),
                from_archive.restored_from.as_deref(),
                plain.restored_from.as_deref(),
            ),
            (
                Some("snapshot ns/nightly"),
                Some(format!("archive {archive}").as_str()),
                None
            )
        );
        let table = VolumesReport {
            volumes: vec![
                clone,
                plain,
                exported,
                nobody,
                many,
                from_snapshot,
                from_archive,
            ],
            unchecked_agents: Vec::new(),
        }
        .table();
        let origins: Vec<&str> = table
            .lines()
            .map(|l| l.split_whitespace().last().unwrap_or_default())
            .collect();
        assert_eq!(
            origins,
            [
                "ORIGIN",
                "ns/data",
                "-",
                "-",
                "-",
                "-",
                "ns/nightly",
                archive
            ],
            "{table}"
        );
        assert!(
            table.contains("snapshot ns/nightly") && table.contains(&format!("archive {archive}")),
            "{table}"
        );
        let clients: Vec<&str> = table
            .lines()
            .filter_map(|l| l.split("  ").filter(|c| !c.is_empty()).nth(8))
            .map(str::trim)
            .collect();
        assert_eq!(
            clients,
            [
                "CLIENTS",
                "-",
                "-",
                "10.0.0.2,10.0.0.3",
                "none",
                "40 clients",
                "-",
                "-"
            ],
            "{table}"
        );
    }
}
