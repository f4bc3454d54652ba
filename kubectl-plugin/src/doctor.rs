//! `doctor`: what is wrong, one line each, with what to do about it.
//!
//! The rules are pure functions of what was read ([`Facts`]), so each is tested on fixture
//! objects without a cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use nfsprov_api_types::{AbnormalReason, Volume};
use nfsprov_vocabulary::names::{ANN_AGENT, ANN_PATH};
use nfsprov_vocabulary::params::ClassParams;
use serde::Serialize;

use crate::cluster::{Target, annotation};
use crate::probe::{AgentProbe, Volumes, probe_all};
use crate::table::{Table, human_bytes};

pub(crate) const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
pub(crate) const PROVISIONING_FAILED: &str = "ProvisioningFailed";

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct Finding {
    /// What it is about, as `kind/name` (`agent/nfs1`, `pv/pvc-…`, `pvc/ns/name`).
    pub object: String,
    pub problem: String,
    pub fix: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct DoctorReport {
    pub findings: Vec<Finding>,
}

/// Everything the rules look at.
pub(crate) struct Facts<'a> {
    pub namespace: &'a str,
    pub deployment_name: &'a str,
    pub deployment: Option<&'a Deployment>,
    pub lease: Option<&'a Lease>,
    /// Where the agent Secrets were looked for, and the mounted ones that are missing.
    pub agent_source: &'a str,
    pub missing_secrets: &'a [String],
    pub agents: &'a [AgentProbe],
    /// Classes of this provisioner.
    pub classes: &'a [StorageClass],
    /// PVs of this provisioner.
    pub volumes: &'a [PersistentVolume],
    pub claims: &'a [PersistentVolumeClaim],
    pub events: &'a [Event],
    /// Nodes and scheduled Pods, listed when a class's exports follow them.
    pub cluster: &'a crate::exports::Cluster,
}

pub(crate) fn diagnose(facts: &Facts<'_>) -> Vec<Finding> {
    let mut findings = Vec::new();
    controller_rules(facts, &mut findings);
    agent_rules(facts, &mut findings);
    class_rules(facts, &mut findings);
    released_volume_rules(facts, &mut findings);
    pending_claim_rules(facts, &mut findings);
    export_rules(facts, &mut findings);
    condition_rules(facts, &mut findings);
    findings
}

/// Claims named in one finding; more are counted.
const CLAIMS_SHOWN: usize = 5;

/// Volumes their agent reports abnormal, one finding per agent and reason, with the claims
/// they belong to (the path for a volume no PV of ours serves).
fn condition_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    let claims: HashMap<(&str, &str), String> = facts
        .volumes
        .iter()
        .filter_map(|pv| {
            let (agent, path) = served_by(pv)?;
            let owner = crate::volumes::claim_of(pv)
                .map(|claim| format!("pvc/{claim}"))
                .unwrap_or_else(|| format!("pv/{}", pv.metadata.name.as_deref().unwrap_or("")));
            Some(((agent, path), owner))
        })
        .collect();
    for probe in facts.agents {
        let Some(Ok(listing)) = &probe.volumes else {
            continue;
        };
        let mut by_reason: BTreeMap<AbnormalReason, Vec<(String, &str)>> = BTreeMap::new();
        for volume in &listing.kept {
            let Some(condition) = &volume.condition else {
                continue;
            };
            let Some(reason) = condition.abnormal else {
                continue;
            };
            let owner = claims
                .get(&(probe.name.as_str(), volume.path.as_str()))
                .cloned()
                .unwrap_or_else(|| format!("path {} (no PV)", volume.path));
            by_reason
                .entry(reason)
                .or_default()
                .push((owner, condition.message.as_str()));
        }
        for (reason, mut volumes) in by_reason {
            volumes.sort();
            let count = volumes.len();
            let mut named: Vec<&str> = volumes
                .iter()
                .take(CLAIMS_SHOWN)
                .map(|(owner, _)| owner.as_str())
                .collect();
            let more = count.saturating_sub(CLAIMS_SHOWN);
            let more = if more > 0 {
                format!(" and {more} more")
            } else {
                String::new()
            };
            let first_message = volumes
                .first()
                .map(|(_, message)| *message)
                .filter(|m| !m.is_empty())
                .map(|m| format!(" (\"{m}\")"))
                .unwrap_or_default();
            named.dedup();
            findings.push(Finding {
                object: format!("agent/{}", probe.name),
                problem: format!(
                    "{count} volume(s) abnormal: {reason}{first_message}: {}{more}",
                    named.join(", ")
                ),
                fix: condition_fix(reason).to_owned(),
            });
        }
    }
}

/// What to do about volumes abnormal for `reason` (docs/operations.md has the details).
fn condition_fix(reason: AbnormalReason) -> &'static str {
    match reason {
        AbnormalReason::Missing => {
            "the directory is gone from the NFS server: restore it from a backup or the archive area (`kubectl nfsprov orphans` shows it), or delete the claim if its data is not needed"
        }
        AbnormalReason::NotExported => {
            "the NFS server does not serve it: check the NFS server (ganesha or knfsd) and the agent's log; the agent exports it again where it can"
        }
        AbnormalReason::ReadOnly => {
            "its filesystem is read-only on the NFS server: check the server's kernel log (dmesg) and remount the filesystem read-write"
        }
        AbnormalReason::QuotaFull => "it is full: expand the claim or have its users free space",
        AbnormalReason::FilesystemError => {
            "its filesystem returns I/O errors: check the NFS server's kernel log and disks, and repair the filesystem"
        }
        AbnormalReason::Unknown => {
            "the agent reports a reason this plugin does not know: see the agent's log and its release notes"
        }
    }
}

/// Volumes on agents with an export manager whose export is missing or is not what their
/// class asks for now. Needs the agents' listings; agents without a manager, or that did
/// not answer, are left to the agent rules.
fn export_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    // By agent and path: one lookup per PV, not a search of the listing.
    let listed: HashMap<(&str, &str), &Volume> = facts
        .agents
        .iter()
        .filter_map(|probe| Some((probe.name.as_str(), probe.volumes.as_ref()?.as_ref().ok()?)))
        .flat_map(|(agent, listing)| {
            listing
                .kept
                .iter()
                .map(move |volume| ((agent, volume.path.as_str()), volume))
        })
        .collect();
    for pv in facts.volumes {
        let Some((agent, path)) = served_by(pv) else {
            continue;
        };
        let Some(probe) = facts.agents.iter().find(|a| a.name == agent) else {
            continue;
        };
        let manager = match &probe.info {
            Ok(info) if info.capabilities.exports.per_volume() => info.capabilities.exports,
            _ => continue,
        };
        let Some(volume) = listed.get(&(agent, path)) else {
            continue;
        };
        let class_name = pv
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref())
            .unwrap_or_default();
        let Some(params) = facts
            .classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(class_name))
            .and_then(|c| ClassParams::parse(c.parameters.as_ref()).ok())
        else {
            continue;
        };
        let wanted = crate::exports::wanted(&params, pv, facts.cluster);
        let name = pv.metadata.name.clone().unwrap_or_default();
        let claim = crate::volumes::claim_of(pv).unwrap_or_default();
        let fix = format!(
            "the controller puts exports right by itself (at once for a change of Nodes or Pods, at its resync otherwise); if this stays, read the ExportUpdateFailed events of claim {claim} and agent {agent}'s log"
        );
        let problem = match &volume.export {
            None => {
                format!("agent {agent} ({manager}) serves no export for it: every mount is refused")
            }
            Some(served) if !served.matches(&wanted) => format!(
                "agent {agent} exports it to {} ({:?}, squash {:?}), but class {class_name} asks for {} ({:?}, squash {:?})",
                list_clients(&served.clients),
                served.access,
                served.squash,
                list_clients(&wanted.clients),
                wanted.access,
                wanted.squash,
            ),
            Some(_) => continue,
        };
        findings.push(Finding {
            object: format!("pv/{name}"),
            problem,
            fix,
        });
    }
}

/// The agent and path of a PV whose export is checked: one not released or failed.
fn served_by(pv: &PersistentVolume) -> Option<(&str, &str)> {
    let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
    if matches!(phase, Some("Released" | "Failed")) {
        return None;
    }
    Some((
        annotation(&pv.metadata, ANN_AGENT)?,
        annotation(&pv.metadata, ANN_PATH)?,
    ))
}

/// Clients in a finding: a long list is counted, not printed.
fn list_clients(clients: &[nfsprov_api_types::ExportClient]) -> String {
    match clients.len() {
        0 => "nobody".to_owned(),
        n if n > 6 => format!("{n} clients"),
        _ => clients
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(","),
    }
}

fn controller_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    let object = format!("deployment/{}/{}", facts.namespace, facts.deployment_name);
    match facts.deployment {
        None => findings.push(Finding {
            object,
            problem: "the controller's Deployment does not exist".into(),
            fix: "install it (kubectl apply -k deploy/), or pass --namespace/--deployment where it runs".into(),
        }),
        Some(d) => {
            let status = crate::status::controller_status(facts.namespace, facts.deployment_name, Some(d));
            if status.ready < status.desired || status.desired == 0 {
                findings.push(Finding {
                    object,
                    problem: format!("{}/{} controller replicas ready", status.ready, status.desired),
                    fix: format!(
                        "kubectl -n {} describe deployment {} and read the pods' logs",
                        facts.namespace, facts.deployment_name
                    ),
                });
            }
        }
    }
    let held = facts
        .lease
        .and_then(|l| l.spec.as_ref())
        .and_then(|s| s.holder_identity.as_deref())
        .is_some_and(|h| !h.is_empty());
    if facts.deployment.is_some() && !held {
        findings.push(Finding {
            object: format!("lease/{}", facts.namespace),
            problem: "no controller replica holds the leader Lease: nothing is provisioned or deleted".into(),
            fix: "check the controller pods' logs; their ServiceAccount needs get/create/update on leases in this namespace".into(),
        });
    }
}

fn agent_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    for secret in facts.missing_secrets {
        findings.push(Finding {
            object: format!("secret/{}/{secret}", facts.namespace),
            problem: "the controller's Deployment mounts this Secret, but it does not exist".into(),
            fix: format!(
                "create it from the controller-secret.yaml `nfsprov-agent init` wrote on the NFS server (kubectl -n {} apply -f)",
                facts.namespace
            ),
        });
    }
    if facts.agents.is_empty() {
        findings.push(Finding {
            object: format!("namespace/{}", facts.namespace),
            problem: format!("no agent is configured (looked at {})", facts.agent_source),
            fix: format!(
                "run `nfsprov-agent init` on the NFS server and apply the Secret it prints (kubectl -n {} apply -f controller-secret.yaml)",
                facts.namespace
            ),
        });
    }
    for agent in facts.agents {
        let Some(problem) = agent.problem() else {
            continue;
        };
        let fix = match &agent.ready {
            Ok(_) => "see the reason: free space or inodes on the export root, or the export root itself (journalctl -u nfsprov-agent on the NFS server)".to_owned(),
            Err(_) if agent.url.is_none() => format!(
                "fix Secret {}: it must hold the settings `nfsprov-agent init` printed",
                agent.secret
            ),
            Err(_) => format!(
                "start the agent (systemctl status nfsprov-agent on the NFS server); check that {} is reachable from here and the certificate and token in Secret {} are the current ones",
                agent.url.as_deref().unwrap_or("its url"),
                agent.secret
            ),
        };
        let problem = if agent.ready.is_err() {
            format!("unreachable: {problem}")
        } else {
            problem
        };
        findings.push(Finding {
            object: format!("agent/{}", agent.name),
            problem,
            fix,
        });
    }
    for agent in facts.agents {
        let Ok(info) = &agent.info else {
            continue;
        };
        // Accepted by the operator by name: known, and not a finding on every run.
        let Some(why) = info
            .export_root_filesystem
            .as_ref()
            .filter(|filesystem| !filesystem.accepted)
            .and_then(|filesystem| filesystem.shared.as_deref())
        else {
            continue;
        };
        let refused = if info.capabilities.exports.per_volume() {
            "; it makes no new per-volume export unless exports.allow_shared_filesystem accepts that"
        } else {
            ""
        };
        findings.push(Finding {
            object: format!("agent/{}", agent.name),
            problem: format!(
                "its export root shares its filesystem ({why}): an NFS client that forges file handles can reach everything on that filesystem{refused}"
            ),
            fix: "give the export root a filesystem of its own that holds nothing else (see the install guide), and admit only node addresses to the NFS port (a NetworkPolicy or the host firewall)".to_owned(),
        });
    }
    for agent in facts.agents {
        if let Ok(info) = &agent.info
            && let Some(finding) = overcommitted(&agent.name, info)
        {
            findings.push(finding);
        }
    }
}

/// An agent whose volumes are promised more than its warning ratio of its filesystem.
fn overcommitted(agent: &str, info: &nfsprov_api_types::AgentInfo) -> Option<Finding> {
    let provisioning = info.provisioning.filter(|p| p.past_warning())?;
    let bound = match provisioning.max_ratio {
        Some(max) => format!(
            "past {max} times it refuses new volumes and expansions (limits.max_overcommit_ratio)"
        ),
        None => "nothing refuses more (limits.max_overcommit_ratio is unset)".to_owned(),
    };
    Some(Finding {
        object: format!("agent/{agent}"),
        problem: format!(
            "its volumes are promised {} on a filesystem of {}, {:.2} times its size and past its warning ratio {} (limits.overcommit_warn_ratio); {bound}. When tenants use what they were promised, writes inside volumes fail with ENOSPC",
            human_bytes(provisioning.provisioned_bytes),
            human_bytes(info.filesystem.total_bytes),
            provisioning.overcommit_ratio,
            provisioning.warn_ratio,
        ),
        fix: "grow the export root's filesystem, delete or move volumes, or set limits.max_overcommit_ratio in the agent's settings so it refuses new volumes and expansions past a bound".to_owned(),
    })
}

fn class_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    let known: BTreeSet<&str> = facts.agents.iter().map(|a| a.name.as_str()).collect();
    for class in facts.classes {
        let status = crate::status::class_status(class, &known);
        let object = format!("storageclass/{}", status.name);
        if let Some(invalid) = &status.invalid {
            findings.push(Finding {
                object: object.clone(),
                problem: invalid.clone(),
                fix: "recreate the class with valid parameters (parameters cannot be edited); see controller/README.md".into(),
            });
        }
        for agent in &status.unknown_agents {
            findings.push(Finding {
                object: object.clone(),
                problem: format!("names agent {agent:?}, which no agent Secret configures; its claims stay Pending"),
                fix: format!(
                    "apply agent {agent}'s Secret and add it to the Deployment's agents volume, or recreate the class naming one of: {}",
                    if known.is_empty() { "(none configured)".to_owned() } else { known.iter().copied().collect::<Vec<_>>().join(", ") }
                ),
            });
        }
    }
}

/// The newest message of events with `reason` about each object of `kind`, by name.
fn last_messages(events: &[Event], kind: &str, reason: &str) -> BTreeMap<(String, String), String> {
    let mut matching: Vec<&Event> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some(reason))
        .filter(|e| e.involved_object.kind.as_deref() == Some(kind))
        .collect();
    let when = |e: &Event| {
        e.last_timestamp
            .as_ref()
            .map(|t| t.0)
            .or_else(|| e.event_time.as_ref().map(|t| t.0))
            .or_else(|| e.metadata.creation_timestamp.as_ref().map(|t| t.0))
    };
    matching.sort_by_key(|e| when(e));
    matching
        .into_iter()
        .map(|e| {
            let key = (
                e.involved_object.namespace.clone().unwrap_or_default(),
                e.involved_object.name.clone().unwrap_or_default(),
            );
            (key, e.message.clone().unwrap_or_default())
        })
        .collect()
}

fn released_volume_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    let failures = last_messages(facts.events, "PersistentVolume", VOLUME_FAILED_DELETE);
    for pv in facts.volumes {
        let phase = pv.status.as_ref().and_then(|s| s.phase.as_deref());
        if phase != Some("Released") {
            continue;
        }
        let name = pv.metadata.name.clone().unwrap_or_default();
        let Some(message) = failures
            .iter()
            .find(|((_, n), _)| *n == name)
            .map(|(_, m)| m)
        else {
            continue;
        };
        let agent = annotation(&pv.metadata, ANN_AGENT).unwrap_or("its agent");
        let claim = crate::volumes::claim_of(pv).unwrap_or_default();
        findings.push(Finding {
            object: format!("pv/{name}"),
            problem: format!("stuck Released (claim {claim} is gone) and its data cannot be removed: {message}"),
            fix: format!(
                "make agent {agent} reachable and fix the cause; the controller retries by itself. To give up: remove the directory on the server, then kubectl patch pv {name} --type=merge -p '{{\"metadata\":{{\"finalizers\":null}}}}'"
            ),
        });
    }
}

fn pending_claim_rules(facts: &Facts<'_>, findings: &mut Vec<Finding>) {
    let ours: BTreeSet<&str> = facts
        .classes
        .iter()
        .filter_map(|c| c.metadata.name.as_deref())
        .collect();
    let failures = last_messages(facts.events, "PersistentVolumeClaim", PROVISIONING_FAILED);
    for claim in facts.claims {
        let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
        let class = claim
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.as_deref());
        if phase != Some("Pending") || !class.is_some_and(|c| ours.contains(c)) {
            continue;
        }
        let key = (
            claim.metadata.namespace.clone().unwrap_or_default(),
            claim.metadata.name.clone().unwrap_or_default(),
        );
        let Some(message) = failures.get(&key) else {
            continue;
        };
        findings.push(Finding {
            object: format!("pvc/{}/{}", key.0, key.1),
            problem: format!("Pending, provisioning failed: {message}"),
            fix: format!(
                "fix what the message names (class {}, its agent, or the claim); the controller retries with backoff, or delete and recreate the claim",
                class.unwrap_or_default()
            ),
        });
    }
}

pub(crate) async fn run(target: &Target) -> anyhow::Result<DoctorReport> {
    let deployment = target.deployment().await?;
    let lease = target.lease().await?;
    let classes = target.classes().await?;
    let volumes = target.volumes().await?;
    let claims = target.claims().await?;
    let events = target
        .events(&[VOLUME_FAILED_DELETE, PROVISIONING_FAILED])
        .await?;
    let agents = crate::credentials::load(target, deployment.as_ref()).await?;
    // The agents' listings show their volumes' conditions and exports. Only the volumes
    // a rule looks at are kept of each listing: the abnormal ones, and, where volumes
    // have exports of their own, those a PV's export rule checks. Nodes and Pods are
    // listed only where a class follows them.
    let info = probe_all(&agents, Volumes::NotListed).await;
    let per_volume_exports: HashSet<&str> = info
        .iter()
        .filter(|p| {
            p.info
                .as_ref()
                .is_ok_and(|i| i.capabilities.exports.per_volume())
        })
        .map(|p| p.name.as_str())
        .collect();
    let served: HashSet<(&str, &str)> = volumes.iter().filter_map(served_by).collect();
    let keep = |agent: &str, volume: &Volume| {
        volume.condition.as_ref().is_some_and(|c| !c.is_normal())
            || (per_volume_exports.contains(agent)
                && served.contains(&(agent, volume.path.as_str())))
    };
    let probes = probe_all(&agents, Volumes::Listed(&keep)).await;
    let follows_cluster = classes.iter().any(|c| {
        ClassParams::parse(c.parameters.as_ref()).is_ok_and(|p| {
            p.export_clients
                .as_ref()
                .is_some_and(nfsprov_vocabulary::params::ExportClients::follows_cluster)
        })
    });
    let cluster = if follows_cluster {
        crate::exports::Cluster::list(&target.client).await?
    } else {
        crate::exports::Cluster::default()
    };
    let facts = Facts {
        namespace: &target.namespace,
        deployment_name: &target.deployment,
        deployment: deployment.as_ref(),
        lease: lease.as_ref(),
        agent_source: &agents.source,
        missing_secrets: &agents.missing_secrets,
        agents: &probes,
        classes: &classes,
        volumes: &volumes,
        claims: &claims,
        events: &events,
        cluster: &cluster,
    };
    Ok(DoctorReport {
        findings: diagnose(&facts),
    })
}

impl crate::report::Report for DoctorReport {
    fn table(&self) -> String {
        if self.findings.is_empty() {
            return "No problem found.\n".to_owned();
        }
        let mut table = Table::new(&["object", "problem", "fix"]);
        for f in &self.findings {
            table.row([f.object.clone(), f.problem.clone(), f.fix.clone()]);
        }
        table.render()
    }

    fn exit_code(&self) -> i32 {
        i32::from(!self.findings.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nfsprov_api_types::Health;
    use serde_json::json;

    fn object<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> T {
        serde_json::from_value(value).unwrap()
    }

    fn probe(name: &str, ready: Result<&str, &str>) -> AgentProbe {
        AgentProbe {
            name: name.into(),
            secret: format!("nfsprov-agent-{name}"),
            url: Some(format!("https://{name}:8443")),
            readable: true,
            ready: ready
                .map(|status| Health {
                    status: status.into(),
                    reason: (status != "ok").then(|| "export root is full".into()),
                })
                .map_err(str::to_owned),
            info: Err("not asked".into()),
            volumes: None,
        }
    }

    fn deployment(ready: i32) -> Deployment {
        object(json!({
            "metadata": {"name": "nfsprov-controller"},
            "spec": {"replicas": 2, "selector": {}, "template": {}},
            "status": {"readyReplicas": ready},
        }))
    }

    fn lease(holder: &str) -> Lease {
        object(
            json!({"metadata": {"name": "nfsprov-controller"}, "spec": {"holderIdentity": holder}}),
        )
    }

    fn class(name: &str, parameters: serde_json::Value) -> StorageClass {
        object(
            json!({"metadata": {"name": name}, "provisioner": "nfsprov.dev/nfs", "parameters": parameters}),
        )
    }

    fn pv(name: &str, phase: &str) -> PersistentVolume {
        object(json!({
            "metadata": {"name": name, "annotations": {"nfsprov.dev/agent": "nfs1", "nfsprov.dev/path": "ns-data"}},
            "spec": {"claimRef": {"namespace": "ns", "name": "data"}},
            "status": {"phase": phase},
        }))
    }

    fn claim(name: &str, class: &str, phase: &str) -> PersistentVolumeClaim {
        object(json!({
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"storageClassName": class},
            "status": {"phase": phase},
        }))
    }

    fn event(
        kind: &str,
        namespace: Option<&str>,
        name: &str,
        reason: &str,
        message: &str,
        at: &str,
    ) -> Event {
        object(json!({
            "metadata": {"name": format!("{name}.{at}"), "namespace": namespace.unwrap_or("default")},
            "involvedObject": {"kind": kind, "name": name, "namespace": namespace},
            "reason": reason,
            "message": message,
            "lastTimestamp": at,
        }))
    }

    struct Fixture {
        deployment: Option<Deployment>,
        lease: Option<Lease>,
        missing: Vec<String>,
        agents: Vec<AgentProbe>,
        classes: Vec<StorageClass>,
        volumes: Vec<PersistentVolume>,
        claims: Vec<PersistentVolumeClaim>,
        events: Vec<Event>,
        cluster: crate::exports::Cluster,
    }

    impl Fixture {
        fn healthy() -> Self {
            Self {
                deployment: Some(deployment(2)),
                lease: Some(lease("nfsprov-controller-0")),
                missing: Vec::new(),
                agents: vec![probe("nfs1", Ok("ok"))],
                classes: vec![class("nfs", json!({"agent": "nfs1", "onDelete": "delete"}))],
                volumes: vec![pv("pvc-1", "Bound")],
                claims: vec![claim("data", "nfs", "Bound")],
                events: Vec::new(),
                cluster: crate::exports::Cluster::default(),
            }
        }

        fn diagnose(&self) -> Vec<Finding> {
            diagnose(&Facts {
                namespace: "nfsprov",
                deployment_name: "nfsprov-controller",
                deployment: self.deployment.as_ref(),
                lease: self.lease.as_ref(),
                agent_source: "the Secrets labelled x",
                missing_secrets: &self.missing,
                agents: &self.agents,
                classes: &self.classes,
                volumes: &self.volumes,
                claims: &self.claims,
                events: &self.events,
                cluster: &self.cluster,
            })
        }
    }

    fn objects(findings: &[Finding]) -> Vec<&str> {
        findings.iter().map(|f| f.object.as_str()).collect()
    }

    #[test]
    fn a_missing_export_or_one_other_than_the_class_asks_is_reported() {
        let mut fixture = Fixture::healthy();
        fixture.classes = vec![class(
            "nfs",
            json!({"agent": "nfs1", "exportClients": "pods"}),
        )];
        let mut bound = pv("pvc-1", "Bound");
        bound.spec.as_mut().unwrap().storage_class_name = Some("nfs".into());
        let mut other = pv("pvc-2", "Bound");
        other.spec.as_mut().unwrap().storage_class_name = Some("nfs".into());
        other
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("nfsprov.dev/path".into(), "ns-logs".into());
        other
            .spec
            .as_mut()
            .unwrap()
            .claim_ref
            .as_mut()
            .unwrap()
            .name = Some("logs".into());
        fixture.volumes = vec![bound, other];
        fixture.cluster = crate::exports::Cluster {
            nodes: vec![object(json!({
                "metadata": {"name": "node-a"},
                "status": {"addresses": [{"type": "InternalIP", "address": "10.0.0.2"}]},
            }))],
            pods: vec![object(json!({
                "metadata": {"name": "app", "namespace": "ns"},
                "spec": {"nodeName": "node-a", "containers": [], "volumes": [
                    {"name": "d", "persistentVolumeClaim": {"claimName": "data"}},
                ]},
            }))],
        };
        let volume = |path: &str, clients: Option<serde_json::Value>| {
            let mut volume = json!({
                "path": path, "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
                "created_at": "2026-01-01T00:00:00Z",
            });
            if let Some(clients) = clients {
                volume["export"] = json!({
                    "path": format!("/srv/{path}"), "clients": clients, "access": "readWrite",
                    "squash": "root", "sec": ["sys"],
                });
            }
            object::<nfsprov_api_types::Volume>(volume)
        };
        let agent = |volumes: Vec<Volume>| {
            let mut agent = probe("nfs1", Ok("ok"));
            agent.info = Ok(object(json!({
                "version": "1", "nfs": {"server": "nfs1", "path": "/srv"},
                "capabilities": {"quota": "none", "quota_enforced": false, "archive": true, "exports": "ganesha"},
                "filesystem": {"total_bytes": 1, "free_bytes": 1, "available_bytes": 1, "total_inodes": 1, "free_inodes": 1},
            })));
            agent.volumes = Some(Ok(crate::probe::VolumeListing {
                count: volumes.len(),
                kept: volumes,
            }));
            agent
        };
        // The pod of `data` runs on node-a: its export is right; `logs` has none.
        fixture.agents = vec![agent(vec![
            volume("ns-data", Some(json!(["10.0.0.2"]))),
            volume("ns-logs", None),
        ])];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["pv/pvc-2"], "{findings:?}");
        assert!(
            findings[0].problem.contains("serves no export"),
            "{findings:?}"
        );

        // The pod moved to a node the export does not admit.
        fixture.agents = vec![agent(vec![
            volume("ns-data", Some(json!(["10.0.0.9"]))),
            volume("ns-logs", Some(json!([]))),
        ])];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["pv/pvc-1"], "{findings:?}");
        assert!(
            findings[0].problem.contains(
                "exports it to 10.0.0.9 (ReadWrite, squash Root), but class nfs asks for 10.0.0.2"
            ),
            "{findings:?}"
        );
    }

    #[test]
    fn abnormal_volumes_are_counted_per_agent_and_reason_with_their_claims() {
        let mut fixture = Fixture::healthy();
        let mut volumes = Vec::new();
        let mut pvs = Vec::new();
        for i in 0..7 {
            let mut bound = pv(&format!("pvc-{i}"), "Bound");
            let path = format!("ns-c{i}");
            bound
                .metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert("nfsprov.dev/path".into(), path.clone());
            bound
                .spec
                .as_mut()
                .unwrap()
                .claim_ref
                .as_mut()
                .unwrap()
                .name = Some(format!("c{i}"));
            pvs.push(bound);
            let mut volume = json!({
                "path": path, "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
                "created_at": "2026-01-01T00:00:00Z",
            });
            // c0..c5 read-only, c6 normal.
            volume["condition"] = if i < 6 {
                json!({"abnormal": "read_only", "message": "mounted read-only"})
            } else {
                json!({})
            };
            volumes.push(object::<Volume>(volume));
        }
        volumes.push(object::<Volume>(json!({
            "path": "ns-gone", "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
            "created_at": "2026-01-01T00:00:00Z",
            "condition": {"abnormal": "quota_full", "message": "no space left"},
        })));
        fixture.volumes = pvs;
        let mut agent = probe("nfs1", Ok("ok"));
        agent.volumes = Some(Ok(crate::probe::VolumeListing {
            count: volumes.len(),
            kept: volumes,
        }));
        fixture.agents = vec![agent];
        let findings = fixture.diagnose();
        assert_eq!(
            objects(&findings),
            ["agent/nfs1", "agent/nfs1"],
            "{findings:?}"
        );
        assert_eq!(
            findings[0].problem,
            "6 volume(s) abnormal: read_only (\"mounted read-only\"): pvc/ns/c0, pvc/ns/c1, pvc/ns/c2, pvc/ns/c3, pvc/ns/c4 and 1 more"
        );
        assert!(findings[0].fix.contains("remount"), "{findings:?}");
        assert_eq!(
            findings[1].problem,
            "1 volume(s) abnormal: quota_full (\"no space left\"): path ns-gone (no PV)"
        );
        assert!(findings[1].fix.contains("expand the claim"), "{findings:?}");
    }

    #[test]
    fn a_healthy_installation_has_no_finding() {
        assert_eq!(Fixture::healthy().diagnose(), []);
    }

    #[test]
    fn unreachable_and_unready_agents_are_told_apart() {
        let mut fixture = Fixture::healthy();
        fixture.agents = vec![
            probe(
                "nfs1",
                Err("agent unreachable: cannot connect to https://nfs1:8443/"),
            ),
            probe("nfs2", Ok("unavailable")),
        ];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["agent/nfs1", "agent/nfs2"]);
        assert!(
            findings[0]
                .problem
                .starts_with("unreachable: agent unreachable"),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[0].fix.contains("systemctl status nfsprov-agent"),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[0].fix.contains("Secret nfsprov-agent-nfs1"),
            "{:?}",
            findings[0]
        );
        assert_eq!(findings[1].problem, "not ready: export root is full");
    }

    #[test]
    fn an_agent_whose_export_root_shares_its_filesystem_is_reported() {
        let mut fixture = Fixture::healthy();
        let info = |filesystem: serde_json::Value| {
            object(json!({
                "version": "1", "nfs": {"server": "nfs1", "path": "/srv"},
                "capabilities": {"quota": "none", "quota_enforced": false, "archive": true, "exports": "ganesha"},
                "filesystem": {"total_bytes": 1, "free_bytes": 1, "available_bytes": 1, "total_inodes": 1, "free_inodes": 1},
                "export_root_filesystem": filesystem,
            }))
        };
        let mut agent = probe("nfs1", Ok("ok"));
        agent.info = Ok(info(json!({"mount_point": "/srv/nfs"})));
        fixture.agents = vec![agent];
        assert_eq!(fixture.diagnose(), []);

        let mut agent = probe("nfs1", Ok("ok"));

        agent.info = Ok(info(json!({
            "mount_point": "/",
            "shared": "it is a directory of the filesystem mounted at /",
        })));
        fixture.agents = vec![agent];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["agent/nfs1"], "{findings:?}");
        let mut accepted = probe("nfs1", Ok("ok"));
        accepted.info = Ok(info(json!({
            "mount_point": "/",
            "shared": "it is a directory of the filesystem mounted at /",
            "accepted": true,
        })));
        assert!(
            findings[0].problem.contains("mounted at /")
                && findings[0]
                    .problem
                    .contains("exports.allow_shared_filesystem"),
            "{findings:?}"
        );
        assert!(
            findings[0].fix.contains("filesystem of its own"),
            "{findings:?}"
        );
    }

    #[test]
    fn classes_naming_unknown_agents_are_reported() {
        let mut fixture = Fixture::healthy();
        fixture
            .classes
            .push(class("typo", json!({"agent": "nfs9"})));
        fixture
            .classes
            .push(class("broken", json!({"onDelete": "shred"})));
        let findings = fixture.diagnose();
        assert_eq!(
            objects(&findings),
            ["storageclass/typo", "storageclass/broken"]
        );
        assert!(
            findings[0].problem.contains("\"nfs9\""),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[0].fix.contains("one of: nfs1"),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[1].problem.contains("onDelete"),
            "{:?}",
            findings[1]
        );
    }

    #[test]
    fn a_released_pv_with_failed_deletes_is_stuck_and_the_newest_message_is_shown() {
        let mut fixture = Fixture::healthy();
        fixture.volumes = vec![pv("pvc-1", "Released"), pv("pvc-2", "Released")];
        fixture.events = vec![
            event(
                "PersistentVolume",
                None,
                "pvc-1",
                VOLUME_FAILED_DELETE,
                "newer: agent unreachable",
                "2026-01-01T00:00:10Z",
            ),
            event(
                "PersistentVolume",
                None,
                "pvc-1",
                VOLUME_FAILED_DELETE,
                "older",
                "2026-01-01T00:00:01Z",
            ),
            // Released without a failure is a delete in progress, not a problem.
            event(
                "PersistentVolume",
                None,
                "pvc-2",
                "VolumeDeleted",
                "x",
                "2026-01-01T00:00:01Z",
            ),
        ];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["pv/pvc-1"]);
        assert!(
            findings[0].problem.contains("claim ns/data"),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[0].problem.ends_with("newer: agent unreachable"),
            "{:?}",
            findings[0]
        );
        assert!(findings[0].fix.contains("agent nfs1"), "{:?}", findings[0]);
        assert!(
            findings[0].fix.contains("kubectl patch pv pvc-1"),
            "{:?}",
            findings[0]
        );
        // The same events about a Bound PV are history, not a problem.
        fixture.volumes = vec![pv("pvc-1", "Bound")];
        assert_eq!(fixture.diagnose(), []);
    }

    #[test]
    fn pending_claims_of_our_classes_with_failures_are_reported() {
        let mut fixture = Fixture::healthy();
        fixture.claims = vec![
            claim("stuck", "nfs", "Pending"),
            claim("fresh", "nfs", "Pending"),
            claim("theirs", "other-class", "Pending"),
        ];
        fixture.events = vec![
            event(
                "PersistentVolumeClaim",
                Some("ns"),
                "stuck",
                PROVISIONING_FAILED,
                "agent nfs1 cannot enforce quotas",
                "2026-01-01T00:00:01Z",
            ),
            event(
                "PersistentVolumeClaim",
                Some("ns"),
                "theirs",
                PROVISIONING_FAILED,
                "not ours",
                "2026-01-01T00:00:01Z",
            ),
            event(
                "PersistentVolumeClaim",
                Some("other"),
                "fresh",
                PROVISIONING_FAILED,
                "same name, other namespace",
                "2026-01-01T00:00:01Z",
            ),
        ];
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["pvc/ns/stuck"]);
        assert!(
            findings[0]
                .problem
                .ends_with("agent nfs1 cannot enforce quotas"),
            "{:?}",
            findings[0]
        );
    }

    #[test]
    fn controller_lease_and_secret_problems() {
        let mut fixture = Fixture::healthy();
        fixture.deployment = Some(deployment(1));
        fixture.lease = Some(lease(""));
        fixture.missing = vec!["nfsprov-agent-nfs2".into()];
        let findings = fixture.diagnose();
        assert_eq!(
            objects(&findings),
            [
                "deployment/nfsprov/nfsprov-controller",
                "lease/nfsprov",
                "secret/nfsprov/nfsprov-agent-nfs2"
            ]
        );
        assert_eq!(findings[0].problem, "1/2 controller replicas ready");
        fixture.deployment = None;
        fixture.agents.clear();
        let findings = fixture.diagnose();
        assert_eq!(
            objects(&findings),
            [
                "deployment/nfsprov/nfsprov-controller",
                "secret/nfsprov/nfsprov-agent-nfs2",
                "namespace/nfsprov",
                // With no agent configured, the agent the class names is unknown too.
                "storageclass/nfs"
            ]
        );
        assert!(
            findings[2].problem.contains("the Secrets labelled x"),
            "{:?}",
            findings[2]
        );
    }

    fn with_provisioning(mut probe: AgentProbe, provisioning: serde_json::Value) -> AgentProbe {
        probe.info = Ok(object(json!({
            "version": "0.2.0",
            "nfs": {"server": "s", "path": "/srv/nfs"},
            "capabilities": {"quota": "none", "quota_enforced": false, "archive": true},
            "filesystem": {"total_bytes": 1u64 << 40, "free_bytes": 1, "available_bytes": 1,
                           "total_inodes": 1, "free_inodes": 1},
            "provisioning": provisioning,
        })));
        probe
    }

    #[test]
    fn an_agent_promising_past_its_warning_ratio_is_reported_with_its_bound() {
        let mut fixture = Fixture::healthy();
        fixture.agents = vec![
            with_provisioning(
                probe("nfs1", Ok("ok")),
                json!({"provisioned_bytes": 3u64 << 39, "overcommit_ratio": 1.5, "warn_ratio": 1.0}),
            ),
            with_provisioning(
                probe("nfs2", Ok("ok")),
                json!({"provisioned_bytes": 5u64 << 39, "overcommit_ratio": 2.5, "warn_ratio": 2.0, "max_ratio": 3.0}),
            ),
            // At its warning ratio, not past it.
            with_provisioning(
                probe("nfs3", Ok("ok")),
                json!({"provisioned_bytes": 1u64 << 40, "overcommit_ratio": 1.0, "warn_ratio": 1.0}),
            ),
            // An older agent says nothing of it.
            probe("nfs4", Ok("ok")),
        ];
        fixture.classes.clear();
        let findings = fixture.diagnose();
        assert_eq!(objects(&findings), ["agent/nfs1", "agent/nfs2"]);
        assert!(
            findings[0].problem.starts_with(
                "its volumes are promised 1.5Ti on a filesystem of 1Ti, 1.50 times its size and past its warning ratio 1 (limits.overcommit_warn_ratio); nothing refuses more (limits.max_overcommit_ratio is unset)"
            ),
            "{:?}",
            findings[0]
        );
        assert!(
            findings[1]
                .problem
                .contains("past 3 times it refuses new volumes and expansions"),
            "{:?}",
            findings[1]
        );
        assert!(findings[1].fix.contains("limits.max_overcommit_ratio"));
    }

    #[test]
    fn findings_print_one_line_each_and_fail_the_exit_status() {
        use crate::report::Report as _;
        let mut fixture = Fixture::healthy();
        fixture.agents = vec![probe("nfs1", Err("down"))];
        let report = DoctorReport {
            findings: fixture.diagnose(),
        };
        let text = report.table();
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(text.starts_with("OBJECT"), "{text}");
        assert_eq!(report.exit_code(), 1);
        let clean = DoctorReport {
            findings: Vec::new(),
        };
        assert_eq!(clean.table(), "No problem found.\n");
        assert_eq!(clean.exit_code(), 0);
    }
}
