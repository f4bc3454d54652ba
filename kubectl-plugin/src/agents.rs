//! `agents`: each agent's health, version, quota backend, free space, volume count and
//! the capacity it has promised (with its ratio to the filesystem), asked with the
//! controller's own credentials.

use serde::Serialize;

use crate::cluster::Target;
use crate::probe::{AgentProbe, Volumes, probe_all};
use crate::table::{Table, human_bytes};

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct AgentRow {
    pub name: String,
    pub secret: String,
    pub url: Option<String>,
    /// `ok`, `not ready`, `unreachable`, or `unreadable` (its Secret makes no client).
    pub health: String,
    pub problem: Option<String>,
    pub version: Option<String>,
    pub quota: Option<String>,
    pub quota_enforced: Option<bool>,
    pub available_bytes: Option<u64>,
    pub total_bytes: Option<u64>,
    pub volumes: Option<usize>,
    /// The capacity the agent has promised, and its ratio to the filesystem's size
    /// (agents that report it).
    pub provisioned_bytes: Option<u64>,
    pub overcommit_ratio: Option<f64>,
    /// Whether the ratio is past the agent's warning (`limits.overcommit_warn_ratio`).
    pub overcommitted: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct AgentsReport {
    /// Where the agents' Secrets were found.
    pub source: String,
    pub agents: Vec<AgentRow>,
    /// Secrets the controller's Deployment mounts that do not exist.
    pub missing_secrets: Vec<String>,
}

pub(crate) fn row(probe: &AgentProbe) -> AgentRow {
    let info = probe.info.as_ref().ok();
    let health = match &probe.ready {
        _ if !probe.readable => "unreadable",
        Ok(h) if h.status == "ok" => "ok",
        Ok(_) => "not ready",
        Err(_) => "unreachable",
    };
    AgentRow {
        name: probe.name.clone(),
        secret: probe.secret.clone(),
        url: probe.url.clone(),
        health: health.to_owned(),
        problem: probe.problem(),
        version: info.map(|i| i.version.clone()),
        quota: info.map(|i| i.capabilities.quota.to_string()),
        quota_enforced: info.map(|i| i.capabilities.quota_enforced),
        available_bytes: info.map(|i| i.filesystem.available_bytes),
        total_bytes: info.map(|i| i.filesystem.total_bytes),
        volumes: probe
            .volumes
            .as_ref()
            .and_then(|v| v.as_ref().ok())
            .map(|listing| listing.count),
        provisioned_bytes: info
            .and_then(|i| i.provisioning.as_ref())
            .map(|p| p.provisioned_bytes),
        overcommit_ratio: info
            .and_then(|i| i.provisioning.as_ref())
            .map(|p| p.overcommit_ratio),
        overcommitted: info
            .and_then(|i| i.provisioning.as_ref())
            .map(|p| p.past_warning()),
    }
}

pub(crate) async fn run(target: &Target) -> anyhow::Result<AgentsReport> {
    let deployment = target.deployment().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    let probes = probe_all(&agents, Volumes::COUNTED).await;
    Ok(AgentsReport {
        source: agents.source.clone(),
        agents: probes.iter().map(row).collect(),
        missing_secrets: agents.missing_secrets.clone(),
    })
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

impl crate::report::Report for AgentsReport {
    fn table(&self) -> String {
        let mut missing = String::new();
        for secret in &self.missing_secrets {
            missing.push_str(&format!(
                "Secret {secret} (mounted by the controller) does not exist: its agents not checked\n"
            ));
        }
        if self.agents.is_empty() {
            return format!("{missing}No agent found in {}.\n", self.source);
        }
        let mut table = Table::new(&[
            "agent",
            "health",
            "version",
            "quota",
            "available",
            "volumes",
            "provisioned",
            "url",
        ]);
        for a in &self.agents {
            let quota = a.quota.as_ref().map(|q| match a.quota_enforced {
                Some(true) => format!("{q} (enforced)"),
                _ => q.clone(),
            });
            let available = match (a.available_bytes, a.total_bytes) {
                (Some(free), Some(total)) => {
                    Some(format!("{}/{}", human_bytes(free), human_bytes(total)))
                }
                _ => None,
            };
            let provisioned = match (a.provisioned_bytes, a.overcommit_ratio) {
                (Some(bytes), Some(ratio)) => {
                    let past = if a.overcommitted == Some(true) {
                        ",overcommitted"
                    } else {
                        ""
                    };
                    Some(format!("{}({ratio:.2}x{past})", human_bytes(bytes)))
                }
                _ => None,
            };
            table.row([
                a.name.clone(),
                a.health.clone(),
                or_dash(a.version.clone()),
                or_dash(quota),
                or_dash(available),
                or_dash(a.volumes.map(|v| v.to_string())),
                or_dash(provisioned),
                or_dash(a.url.clone()),
            ]);
        }
        let mut out = table.render();
        for a in &self.agents {
            if let Some(problem) = &a.problem {
                out.push_str(&format!(
                    "agent {} ({}, Secret {}): {problem}\n",
                    a.name, a.health, a.secret
                ));
            }
        }
        out.push_str(&missing);
        out
    }

    /// 1 when any agent could not be read or reached, or none was found: a script asking
    /// whether the agents are fine must not hear yes when they were not all asked.
    fn exit_code(&self) -> i32 {
        let unchecked = self
            .agents
            .iter()
            .any(|a| a.health == "unreachable" || a.health == "unreadable");
        i32::from(unchecked || self.agents.is_empty() || !self.missing_secrets.is_empty())
    }
}
