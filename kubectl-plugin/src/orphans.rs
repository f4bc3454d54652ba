//! `orphans`: volumes an agent holds that no PV of this provisioner points to, and PVs
//! whose volume the agent does not have.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::PersistentVolume;
use nfsprov_api_types::Volume;
use nfsprov_controller::objects::{ANN_AGENT, ANN_PATH};
use serde::Serialize;

use crate::cluster::{Target, annotation};
use crate::probe::{AgentProbe, probe_all};
use crate::table::Table;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum OrphanKind {
    /// The agent has the volume; no PV points to it.
    NoPv,
    /// A PV points to a volume the agent does not have.
    NoDirectory,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Orphan {
    pub kind: OrphanKind,
    pub agent: String,
    pub path: String,
    pub pv: Option<String>,
    /// The claim the agent recorded as owner, or the PV's claim.
    pub claim: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct OrphansReport {
    pub orphans: Vec<Orphan>,
    /// Agents whose volumes could not be listed, with the reason; nothing is said about
    /// their volumes or the PVs on them.
    pub unchecked_agents: Vec<(String, String)>,
}

/// Compares one agent's listing with the PVs that name it.
pub fn compare(agent: &str, listed: &[Volume], volumes: &[PersistentVolume]) -> Vec<Orphan> {
    let on_agent: Vec<&PersistentVolume> = volumes
        .iter()
        .filter(|pv| annotation(&pv.metadata, ANN_AGENT) == Some(agent))
        .collect();
    let pointed: BTreeSet<&str> = on_agent
        .iter()
        .filter_map(|pv| annotation(&pv.metadata, ANN_PATH))
        .collect();
    let held: BTreeSet<String> = listed.iter().map(|v| v.path.to_string()).collect();
    let mut orphans = Vec::new();
    for volume in listed {
        let path = volume.path.to_string();
        if pointed.contains(path.as_str()) {
            continue;
        }
        let owner = &volume.owner;
        orphans.push(Orphan {
            kind: OrphanKind::NoPv,
            agent: agent.to_owned(),
            path,
            pv: owner.pv_name.clone(),
            claim: match (&owner.pvc_namespace, &owner.pvc_name) {
                (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
                _ => None,
            },
        });
    }
    for pv in on_agent {
        let Some(path) = annotation(&pv.metadata, ANN_PATH) else {
            continue;
        };
        if !held.contains(path) {
            orphans.push(Orphan {
                kind: OrphanKind::NoDirectory,
                agent: agent.to_owned(),
                path: path.to_owned(),
                pv: pv.metadata.name.clone(),
                claim: crate::volumes::claim_of(pv),
            });
        }
    }
    orphans
}

pub fn report(probes: &[AgentProbe], volumes: &[PersistentVolume]) -> OrphansReport {
    let mut orphans = Vec::new();
    let mut unchecked_agents = Vec::new();
    for probe in probes {
        match &probe.volumes {
            Some(Ok(listed)) => orphans.extend(compare(&probe.name, listed, volumes)),
            Some(Err(e)) => unchecked_agents.push((probe.name.clone(), e.clone())),
            None => unchecked_agents.push((probe.name.clone(), "not asked".to_owned())),
        }
    }
    OrphansReport {
        orphans,
        unchecked_agents,
    }
}

pub async fn run(target: &Target) -> anyhow::Result<OrphansReport> {
    let deployment = target.deployment().await?;
    let volumes = target.volumes().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    let probes = probe_all(&agents, true).await;
    Ok(report(&probes, &volumes))
}

impl crate::report::Report for OrphansReport {
    fn table(&self) -> String {
        let mut out = if self.orphans.is_empty() {
            "No orphan found.\n".to_owned()
        } else {
            let mut table = Table::new(&["kind", "agent", "path", "pv", "claim"]);
            for o in &self.orphans {
                let kind = match o.kind {
                    OrphanKind::NoPv => "no PV",
                    OrphanKind::NoDirectory => "no directory",
                };
                table.row([
                    kind.to_owned(),
                    o.agent.clone(),
                    o.path.clone(),
                    o.pv.clone().unwrap_or_else(|| "-".into()),
                    o.claim.clone().unwrap_or_else(|| "-".into()),
                ]);
            }
            table.render()
        };
        for (agent, reason) in &self.unchecked_agents {
            out.push_str(&format!("agent {agent} not checked: {reason}\n"));
        }
        out
    }

    fn exit_code(&self) -> i32 {
        i32::from(!self.orphans.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn volume(path: &str, claim: Option<(&str, &str)>) -> Volume {
        let owner = claim.map_or(
            json!({}),
            |(ns, name)| json!({"pvc_namespace": ns, "pvc_name": name}),
        );
        serde_json::from_value(json!({
            "path": path, "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
            "owner": owner, "created_at": "2026-01-01T00:00:00Z",
        }))
        .unwrap()
    }

    fn pv(name: &str, agent: &str, path: &str) -> PersistentVolume {
        serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {"nfsprov.dev/agent": agent, "nfsprov.dev/path": path}},
            "spec": {"claimRef": {"namespace": "ns", "name": name}},
        }))
        .unwrap()
    }

    #[test]
    fn directories_without_pvs_and_pvs_without_directories() {
        let listed = [
            volume("ns/kept", None),
            volume("ns/left", Some(("ns", "old"))),
        ];
        let volumes = [
            pv("pvc-kept", "nfs1", "ns/kept"),
            pv("pvc-gone", "nfs1", "ns/gone"),
            // The same path on another agent is another directory.
            pv("pvc-other", "nfs2", "ns/left"),
        ];
        let found = compare("nfs1", &listed, &volumes);
        assert_eq!(
            found,
            [
                Orphan {
                    kind: OrphanKind::NoPv,
                    agent: "nfs1".into(),
                    path: "ns/left".into(),
                    pv: None,
                    claim: Some("ns/old".into()),
                },
                Orphan {
                    kind: OrphanKind::NoDirectory,
                    agent: "nfs1".into(),
                    path: "ns/gone".into(),
                    pv: Some("pvc-gone".into()),
                    claim: Some("ns/pvc-gone".into()),
                },
            ]
        );
        assert!(compare("nfs1", &listed[..1], &volumes[..1]).is_empty());
    }
}
