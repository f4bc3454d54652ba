//! `archives`: what each agent keeps in its archive area (origin, claim, age, size,
//! expiry), and `archives delete AGENT ID` to remove one.

use anyhow::Context as _;
use k8s_openapi::jiff::Timestamp;
use nfsprov_api_types::{Archive, ArchivePath, MAX_PAGE_LIMIT};
use serde::Serialize;

use crate::cluster::Target;
use crate::table::{Table, human_age, human_bytes};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ArchiveRow {
    pub agent: String,
    #[serde(flatten)]
    pub archive: Archive,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ArchivesReport {
    pub archives: Vec<ArchiveRow>,
    /// Agents whose archives could not be listed, with the reason.
    pub unchecked_agents: Vec<(String, String)>,
    /// Agents whose archives were listed.
    pub checked_agents: Vec<String>,
    /// Seconds since the Unix epoch when the report was made; ages are relative to it.
    #[serde(skip)]
    pub now: i64,
}

/// Lists the archives of every agent, or of `only` when given.
pub(crate) async fn list(target: &Target, only: Option<&str>) -> anyhow::Result<ArchivesReport> {
    let deployment = target.deployment().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    if let Some(name) = only {
        agents.configured(name)?;
    }
    let asked = agents
        .agents
        .iter()
        .filter(|a| only.is_none_or(|name| a.name == name));
    let answers = futures::future::join_all(asked.map(|agent| async move {
        let listed = match &agent.client {
            Ok(client) => {
                let mut archives = Vec::new();
                client
                    .for_each_archive_page(MAX_PAGE_LIMIT, None, |page| archives.extend(page))
                    .await
                    .map(|()| archives)
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.clone()),
        };
        (agent.name.clone(), listed)
    }))
    .await;
    let mut report = ArchivesReport {
        archives: Vec::new(),
        unchecked_agents: Vec::new(),
        checked_agents: Vec::new(),
        now: Timestamp::now().as_second(),
    };
    for (agent, listed) in answers {
        match listed {
            Ok(archives) => {
                report.checked_agents.push(agent.clone());
                report
                    .archives
                    .extend(archives.into_iter().map(|archive| ArchiveRow {
                        agent: agent.clone(),
                        archive,
                    }))
            }
            Err(e) => report.unchecked_agents.push((agent, e)),
        }
    }
    Ok(report)
}

/// An archive id as the agents' validator reads it; checked before anything is asked.
pub(crate) fn parse_id(id: &str) -> anyhow::Result<ArchivePath> {
    ArchivePath::parse(id).with_context(|| {
        format!("{id:?} is not an archive id (`kubectl nfsprov archives` lists them)")
    })
}

/// Deletes one archive; what to print.
pub(crate) async fn delete(target: &Target, agent: &str, id: &str) -> anyhow::Result<DeleteReport> {
    let id = parse_id(id)?;
    let deployment = target.deployment().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    agents
        .client(agent)?
        .delete_archive(&id, None)
        .await
        .with_context(|| format!("agent {agent} could not delete archive {id}"))?;
    Ok(DeleteReport {
        agent: agent.to_owned(),
        deleted: id.to_string(),
    })
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DeleteReport {
    pub agent: String,
    pub deleted: String,
}

impl crate::report::Report for DeleteReport {
    fn table(&self) -> String {
        format!("archive {} deleted on agent {}\n", self.deleted, self.agent)
    }
}

fn seconds(rfc3339: &str) -> Option<i64> {
    rfc3339.parse::<Timestamp>().ok().map(|t| t.as_second())
}

impl crate::report::Report for ArchivesReport {
    fn table(&self) -> String {
        let mut out = if self.archives.is_empty() {
            match (
                self.checked_agents.is_empty(),
                self.unchecked_agents.is_empty(),
            ) {
                (true, true) => "No agent to ask.\n".to_owned(),
                (_, true) => "No archive found.\n".to_owned(),
                (true, false) => "No agent could be asked.\n".to_owned(),
                (false, false) => format!(
                    "No archive found on agent(s) {}; the others were not asked.\n",
                    self.checked_agents.join(", ")
                ),
            }
        } else {
            let mut table = Table::new(&["agent", "id", "claim", "age", "size", "expires"]);
            for row in &self.archives {
                let a = &row.archive;
                let claim = match (&a.owner.pvc_namespace, &a.owner.pvc_name) {
                    (Some(ns), Some(name)) => format!("{ns}/{name}"),
                    _ => "-".to_owned(),
                };
                let age = seconds(&a.archived_at)
                    .map_or_else(|| "-".to_owned(), |at| human_age(self.now - at));
                let expires = match a.expires_at.as_deref().and_then(seconds) {
                    Some(at) if at <= self.now => "due".to_owned(),
                    Some(at) => format!("in {}", human_age(at - self.now)),
                    None => "never".to_owned(),
                };
                table.row([
                    row.agent.clone(),
                    a.id.to_string(),
                    claim,
                    age,
                    a.size_bytes.map_or_else(|| "-".to_owned(), human_bytes),
                    expires,
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
        // An agent that could not be asked leaves the list incomplete.
        i32::from(!self.unchecked_agents.is_empty() || self.checked_agents.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use serde_json::json;

    fn archive(id: &str, expires_at: Option<&str>, size: Option<u64>) -> Archive {
        let path = id.rsplit_once('/').unwrap().0;
        serde_json::from_value(json!({
            "id": id,
            "archive_path": format!(".archive/{id}"),
            "path": path,
            "owner": {"pvc_namespace": "team-a", "pvc_name": "data", "pv_name": "pvc-1"},
            "archived_at": "2026-11-20T12:00:00Z",
            "expires_at": expires_at,
            "size_bytes": size,
        }))
        .unwrap()
    }

    #[test]
    fn rows_show_claim_age_size_and_expiry() {
        let now = "2026-11-24T12:00:00Z"
            .parse::<Timestamp>()
            .unwrap()
            .as_second();
        let report = ArchivesReport {
            archives: vec![
                ArchiveRow {
                    agent: "nfs1".into(),
                    archive: archive(
                        "team-a/data/@20261120T120000.000000000Z",
                        Some("2026-11-30T12:00:00Z"),
                        Some(3 << 30),
                    ),
                },
                ArchiveRow {
                    agent: "nfs2".into(),
                    archive: archive(
                        "team-a/old/@20261120T120000.000000000Z",
                        Some("2026-11-23T12:00:00Z"),
                        None,
                    ),
                },
                ArchiveRow {
                    agent: "nfs2".into(),
                    archive: archive("team-a/kept/@20261120T120000.000000000Z", None, Some(0)),
                },
            ],
            unchecked_agents: vec![("nfs3".into(), "connection refused".into())],
            checked_agents: vec!["nfs1".into(), "nfs2".into()],
            now,
        };
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[0].starts_with("AGENT"), "{table}");
        assert!(
            lines[1].contains("team-a/data") && lines[1].contains("4d"),
            "{table}"
        );
        assert!(
            lines[1].contains("3") && lines[1].contains("in 6d"),
            "{table}"
        );
        assert!(
            lines[2].contains(" - ") && lines[2].contains("due"),
            "{table}"
        );
        assert!(lines[3].ends_with("never"), "{table}");
        assert_eq!(lines[4], "agent nfs3 not checked: connection refused");
        assert_eq!(report.exit_code(), 1);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["archives"][0]["agent"], "nfs1");
        assert_eq!(json["archives"][0]["owner"]["pvc_name"], "data");
        assert_eq!(json["archives"][0]["size_bytes"], 3u64 << 30);
    }
}
