//! `orphans`: volumes an agent holds that no PV of this provisioner points to, and PVs
//! whose volume the agent does not have.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::jiff::Timestamp;
use nfsprov_api_types::MAX_PAGE_LIMIT;
use nfsprov_api_types::client::AgentClient;
use nfsprov_vocabulary::names::{ANN_AGENT, ANN_PATH};
use nfsprov_vocabulary::orphans::{Finding, Listing, PvPointer, expects_directory};
use serde::Serialize;

use crate::cluster::{Target, annotation};
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
pub(crate) struct OrphansReport {
    pub orphans: Vec<Orphan>,
    /// Agents whose volumes could not be listed, with the reason; nothing is said about
    /// their volumes or the PVs on them.
    pub unchecked_agents: Vec<(String, String)>,
    /// Agents whose volumes were compared with the PVs.
    pub checked_agents: Vec<String>,
    /// Where the agents' Secrets were looked for.
    pub source: String,
}

/// Compares one agent's listing with the PVs that name it, as the controller's orphan
/// check does, but reporting directories of any age: an operator asking wants to see a
/// provisioning in flight too. [`check_agent`] does the same a page at a time; this whole
/// listing form is what the unit tests drive.
#[cfg(test)]
fn compare(
    agent: &str,
    listed: &[nfsprov_api_types::Volume],
    volumes: &[PersistentVolume],
) -> Vec<Orphan> {
    let pointers = pointers(volumes);
    let mut listing = listing(agent, &pointers);
    listing.add(listed);
    findings(listing, &pointers)
}

/// Pages through one agent's volumes, `page_size` at a time, holding only what may turn
/// out orphaned, never the whole listing.
pub async fn check_agent(
    client: &AgentClient,
    agent: &str,
    pointers: &[PvPointer],
    page_size: u32,
) -> Result<Vec<Orphan>, String> {
    let mut listing = listing(agent, pointers);
    client
        .for_each_volume_page(page_size, None, |page| listing.add(&page))
        .await
        .map_err(|e| e.to_string())?;
    Ok(findings(listing, pointers))
}

fn listing<'a>(agent: &'a str, pointers: &'a [PvPointer]) -> Listing<'a> {
    Listing::new(agent, pointers, Duration::ZERO, Timestamp::now())
}

fn findings(listing: Listing<'_>, pointers: &[PvPointer]) -> Vec<Orphan> {
    listing
        .finish(pointers)
        .into_iter()
        .map(|finding| match finding {
            Finding::Unreferenced {
                agent, path, owner, ..
            } => Orphan {
                kind: OrphanKind::NoPv,
                agent,
                path,
                pv: owner.pv_name,
                claim: match (owner.pvc_namespace, owner.pvc_name) {
                    (Some(ns), Some(name)) => Some(format!("{ns}/{name}")),
                    _ => None,
                },
            },
            Finding::Missing {
                agent,
                path,
                pv,
                claim,
            } => Orphan {
                kind: OrphanKind::NoDirectory,
                agent,
                path,
                pv: Some(pv),
                claim,
            },
        })
        .collect()
}

/// The pointers of the PVs that name an agent and a path.
pub fn pointers(volumes: &[PersistentVolume]) -> Vec<PvPointer> {
    volumes.iter().filter_map(pointer).collect()
}

fn pointer(pv: &PersistentVolume) -> Option<PvPointer> {
    let phase = pv
        .status
        .as_ref()
        .and_then(|s| s.phase.as_deref())
        .unwrap_or("");
    Some(PvPointer {
        pv: pv.metadata.name.clone()?,
        agent: annotation(&pv.metadata, ANN_AGENT)?.to_owned(),
        path: annotation(&pv.metadata, ANN_PATH)?.to_owned(),
        claim: crate::volumes::claim_of(pv),
        expects_directory: expects_directory(phase, pv.metadata.deletion_timestamp.is_some()),
    })
}

/// The report of each agent's check (its name, and its orphans or why it could not be
/// checked).
pub(crate) fn report(
    checks: Vec<(String, Result<Vec<Orphan>, String>)>,
    agents: &crate::credentials::Agents,
) -> OrphansReport {
    let mut orphans = Vec::new();
    let mut unchecked_agents: Vec<(String, String)> = agents
        .missing_secrets
        .iter()
        .map(|secret| {
            (
                format!("of Secret {secret}"),
                "the Secret the controller mounts does not exist".to_owned(),
            )
        })
        .collect();
    let mut checked_agents = Vec::new();
    for (agent, checked) in checks {
        match checked {
            Ok(found) => {
                checked_agents.push(agent);
                orphans.extend(found);
            }
            Err(e) => unchecked_agents.push((agent, e)),
        }
    }
    OrphansReport {
        orphans,
        unchecked_agents,
        checked_agents,
        source: agents.source.clone(),
    }
}

pub(crate) async fn run(target: &Target) -> anyhow::Result<OrphansReport> {
    let deployment = target.deployment().await?;
    // Only each PV's pointer is kept, a page of PVs at a time.
    let mut pointers = Vec::new();
    target
        .for_each_volume_page(|page| pointers.extend(page.iter().filter_map(pointer)))
        .await?;
    // Findings follow the PVs' order, by name as before.
    pointers.sort_by(|a, b| a.pv.cmp(&b.pv));
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    let checks = futures::future::join_all(agents.agents.iter().map(|agent| {
        let pointers = &pointers;
        async move {
            let checked = match &agent.client {
                Ok(client) => check_agent(client, &agent.name, pointers, MAX_PAGE_LIMIT).await,
                Err(e) => Err(e.clone()),
            };
            (agent.name.clone(), checked)
        }
    }))
    .await;
    Ok(report(checks, &agents))
}

impl crate::report::Report for OrphansReport {
    fn table(&self) -> String {
        let mut out = if !self.orphans.is_empty() {
            String::new()
        } else if self.checked_agents.is_empty() && self.unchecked_agents.is_empty() {
            format!("No agent to check: none found in {}.\n", self.source)
        } else if self.unchecked_agents.is_empty() {
            "No orphan found.\n".to_owned()
        } else if self.checked_agents.is_empty() {
            "No agent could be checked.\n".to_owned()
        } else {
            format!(
                "No orphan found on agent(s) {}; the others were not checked.\n",
                self.checked_agents.join(", ")
            )
        };
        if !self.orphans.is_empty() {
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
            out = table.render();
        }
        for (agent, reason) in &self.unchecked_agents {
            out.push_str(&format!("agent {agent} not checked: {reason}\n"));
        }
        out
    }

    /// 1 when something was found, and when not everything could be checked (an agent
    /// unreadable or unreachable, or no agent at all): "nothing found" is said only when
    /// everything was looked at.
    fn exit_code(&self) -> i32 {
        i32::from(
            !self.orphans.is_empty()
                || !self.unchecked_agents.is_empty()
                || self.checked_agents.is_empty(),
        )
    }
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::Volume;
    use serde_json::json;

    use super::*;

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

    #[test]
    fn nothing_found_is_said_only_when_every_agent_was_checked() {
        use crate::report::Report;
        let report = |checked: &[&str], unchecked: &[(&str, &str)]| OrphansReport {
            orphans: Vec::new(),
            unchecked_agents: unchecked
                .iter()
                .map(|(a, r)| ((*a).to_owned(), (*r).to_owned()))
                .collect(),
            checked_agents: checked.iter().map(|a| (*a).to_owned()).collect(),
            source: "the Secrets labelled x in namespace nfsprov".into(),
        };
        let all = report(&["nfs1"], &[]);
        assert_eq!(
            (all.table().as_str(), all.exit_code()),
            ("No orphan found.\n", 0)
        );
        let partial = report(&["nfs1"], &[("nfs2", "agent unreachable: refused")]);
        let text = partial.table();
        assert!(!text.contains("No orphan found.\n"), "{text}");
        assert!(
            text.contains("agent nfs2 not checked: agent unreachable: refused"),
            "{text}"
        );
        assert_eq!(partial.exit_code(), 1);
        let none = report(&[], &[]);
        assert!(
            none.table().starts_with("No agent to check"),
            "{}",
            none.table()
        );
        assert_eq!(none.exit_code(), 1);
    }
}
