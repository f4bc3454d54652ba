//! `status`: controller replicas, the leader, and the classes of this provisioner.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::storage::v1::StorageClass;
use nfsprov_vocabulary::params::ClassParams;
use serde::Serialize;

use crate::cluster::Target;
use crate::table::{Table, human_age};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ControllerStatus {
    pub namespace: String,
    pub deployment: String,
    /// `false` when the Deployment does not exist (the numbers are then 0).
    pub found: bool,
    pub desired: i32,
    pub ready: i32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct LeaderStatus {
    pub lease: String,
    pub holder: Option<String>,
    /// Seconds since the holder last renewed.
    pub renewed_seconds_ago: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ClassStatus {
    pub name: String,
    /// Agents the class may use; empty means the default (only) agent.
    pub agents: Vec<String>,
    /// Agents it names that no Secret configures.
    pub unknown_agents: Vec<String>,
    pub on_delete: Option<String>,
    pub quota: Option<String>,
    pub reclaim_policy: String,
    pub allow_expansion: bool,
    /// Why the controller refuses the class's parameters, when it does.
    pub invalid: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct StatusReport {
    pub provisioner: String,
    pub controller: ControllerStatus,
    pub leader: LeaderStatus,
    /// Agents configured by the Secrets.
    pub agents: Vec<String>,
    pub classes: Vec<ClassStatus>,
}

pub(crate) fn controller_status(
    namespace: &str,
    name: &str,
    deployment: Option<&Deployment>,
) -> ControllerStatus {
    let desired = deployment
        .and_then(|d| d.spec.as_ref())
        .map_or(0, |s| s.replicas.unwrap_or(1));
    let ready = deployment
        .and_then(|d| d.status.as_ref())
        .and_then(|s| s.ready_replicas)
        .unwrap_or(0);
    ControllerStatus {
        namespace: namespace.to_owned(),
        deployment: name.to_owned(),
        found: deployment.is_some(),
        desired,
        ready,
    }
}

pub(crate) fn leader_status(
    name: &str,
    lease: Option<&Lease>,
    now: k8s_openapi::jiff::Timestamp,
) -> LeaderStatus {
    let spec = lease.and_then(|l| l.spec.as_ref());
    LeaderStatus {
        lease: name.to_owned(),
        holder: spec
            .and_then(|s| s.holder_identity.clone())
            .filter(|h| !h.is_empty()),
        renewed_seconds_ago: spec
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| now.as_second() - t.0.as_second()),
    }
}

pub(crate) fn class_status(class: &StorageClass, known_agents: &BTreeSet<&str>) -> ClassStatus {
    let parsed = ClassParams::parse(class.parameters.as_ref());
    let (agents, on_delete, quota, invalid) = match &parsed {
        Ok(p) => (
            p.agents.clone(),
            Some(p.on_delete.to_string()),
            Some(p.quota.to_string()),
            None,
        ),
        // The class is broken, but the agent it names is still worth checking.
        Err(e) => (
            class
                .parameters
                .as_ref()
                .and_then(|p| p.get("agent"))
                .cloned()
                .into_iter()
                .collect(),
            None,
            None,
            Some(e.to_string()),
        ),
    };
    let unknown_agents = agents
        .iter()
        .filter(|a| !known_agents.contains(a.as_str()))
        .cloned()
        .collect();
    ClassStatus {
        name: class.metadata.name.clone().unwrap_or_default(),
        agents,
        unknown_agents,
        on_delete,
        quota,
        reclaim_policy: class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".to_owned()),
        allow_expansion: class.allow_volume_expansion.unwrap_or(false),
        invalid,
    }
}

pub(crate) async fn run(target: &Target) -> anyhow::Result<StatusReport> {
    let deployment = target.deployment().await?;
    let lease = target.lease().await?;
    let classes = target.classes().await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    let known = agents.names();
    Ok(StatusReport {
        provisioner: target.provisioner.clone(),
        controller: controller_status(&target.namespace, &target.deployment, deployment.as_ref()),
        leader: leader_status(
            &target.lease,
            lease.as_ref(),
            k8s_openapi::jiff::Timestamp::now(),
        ),
        agents: known.iter().map(|a| (*a).to_owned()).collect(),
        classes: classes.iter().map(|c| class_status(c, &known)).collect(),
    })
}

impl crate::report::Report for StatusReport {
    fn table(&self) -> String {
        let c = &self.controller;
        let replicas = if c.found {
            format!("{}/{} ready", c.ready, c.desired)
        } else {
            "Deployment not found".to_owned()
        };
        let leader = match (&self.leader.holder, self.leader.renewed_seconds_ago) {
            (Some(h), Some(ago)) => format!("{h} (renewed {} ago)", human_age(ago)),
            (Some(h), None) => h.clone(),
            (None, _) => "none".to_owned(),
        };
        let agents = if self.agents.is_empty() {
            "none configured".to_owned()
        } else {
            self.agents.join(", ")
        };
        let mut out = format!(
            "Provisioner:  {}\nController:   {}/{}  {replicas}\nLeader:       {leader}  (Lease {}/{})\nAgents:       {agents}\n\n",
            self.provisioner, c.namespace, c.deployment, c.namespace, self.leader.lease
        );
        let mut table = Table::new(&[
            "class",
            "agents",
            "on-delete",
            "quota",
            "reclaim",
            "expansion",
        ]);
        for class in &self.classes {
            let agents = if class.agents.is_empty() {
                "(default)".to_owned()
            } else {
                class
                    .agents
                    .iter()
                    .map(|a| {
                        if class.unknown_agents.contains(a) {
                            format!("{a} (unknown)")
                        } else {
                            a.clone()
                        }
                    })
                    .collect::<Vec<_>>()
                    .join(",")
            };
            table.row([
                class.name.clone(),
                agents,
                class
                    .on_delete
                    .clone()
                    .unwrap_or_else(|| "invalid".to_owned()),
                class.quota.clone().unwrap_or_else(|| "invalid".to_owned()),
                class.reclaim_policy.clone(),
                if class.allow_expansion {
                    "allowed"
                } else {
                    "no"
                }
                .to_owned(),
            ]);
        }
        if table.is_empty() {
            out.push_str("No StorageClass names this provisioner.\n");
        } else {
            out.push_str(&table.render());
        }
        out
    }
}
