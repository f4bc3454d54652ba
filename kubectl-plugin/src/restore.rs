//! `restore AGENT ARCHIVE-ID --to NAMESPACE/CLAIM`: a new claim whose volume the
//! controller makes from an archive. The claim names the archive by the two
//! restore-archive annotations (an archive id is no object name, so `dataSourceRef`
//! cannot carry it); the controller does the rest on its normal provisioning path.
//!
//! What the controller would refuse is refused here first, in its words (the rules are
//! the vocabulary crate's): an archive of another namespace, a claim smaller than the
//! archived volume, a class whose agents exclude the archive's, an agent too old to
//! restore archives. The archive is read from its agent, so a wrong id or agent fails
//! before anything is created.
//!
//! `--wait` stops at the first of: the claim Bound, the controller refusing it for good
//! (a `ProvisioningFailed` event of the refusal action about this very claim), the
//! timeout.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{ListParams, PostParams};
use kube::runtime::wait::await_condition;
use kube::runtime::{WatchStreamExt, watcher};
use nfsprov_api_types::{Archive, ArchivePath, ErrorCode};
use nfsprov_vocabulary::archive_restore::{self, ArchiveSource};
use nfsprov_vocabulary::names::{ACTION_REFUSE, ANN_RESTORE_ARCHIVE, ANN_RESTORE_ARCHIVE_AGENT};
use nfsprov_vocabulary::params::ClassParams;
use nfsprov_vocabulary::quantity::parse_bytes;
use serde::Serialize;
use serde_json::json;

use crate::cluster::{Access, Target, get_opt};
use crate::table::human_bytes;

/// Set by Kubernetes on the StorageClass claims get when they name none.
const DEFAULT_CLASS: &str = "storageclass.kubernetes.io/is-default-class";
/// The reason of the controller's events about a claim it could not provision (yet).
const REASON_FAILED: &str = "ProvisioningFailed";
const ACCESS_MODES: [&str; 4] = [
    "ReadWriteOnce",
    "ReadOnlyMany",
    "ReadWriteMany",
    "ReadWriteOncePod",
];

/// What the command line asked for.
#[derive(Debug, Clone)]
pub(crate) struct RestoreOptions {
    pub agent: String,
    pub id: String,
    /// `NAMESPACE/CLAIM`.
    pub to: String,
    pub class: Option<String>,
    /// A quantity (`2Gi`); the archived volume's capacity when absent.
    pub size: Option<String>,
    pub access_mode: String,
    pub wait: bool,
    pub timeout: Duration,
    pub agents_dir: Option<PathBuf>,
}

/// What can be checked before anything is asked: the id, the claim's name, the access
/// mode and the size's spelling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checked {
    pub source: ArchiveSource,
    pub namespace: String,
    pub name: String,
}

pub(crate) fn check_options(options: &RestoreOptions) -> anyhow::Result<Checked> {
    let id = crate::archives::parse_id(&options.id)?;
    let (namespace, name) = options
        .to
        .split_once('/')
        .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
        .with_context(|| {
            format!(
                "--to {:?} names no claim: write NAMESPACE/CLAIM, such as team-a/data-restored",
                options.to
            )
        })?;
    anyhow::ensure!(
        ACCESS_MODES.contains(&options.access_mode.as_str()),
        "--access-mode {:?} is not one of {}",
        options.access_mode,
        ACCESS_MODES.join(", ")
    );
    if let Some(size) = &options.size {
        parse_bytes(size).with_context(|| format!("--size {size:?}"))?;
    }
    Ok(Checked {
        source: ArchiveSource {
            agent: options.agent.clone(),
            id,
        },
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    })
}

/// The claim to create, decided from the archive and the classes; nothing is asked here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub class: String,
    /// The request as written in the claim.
    pub size: String,
    pub size_bytes: u64,
}

/// Picks the class and the size, and applies the controller's rules: `--class`, else the
/// cluster's default class when it is one of `provisioner`'s; `--size`, else the
/// capacity the archived volume had.
pub(crate) fn plan(
    checked: &Checked,
    options: &RestoreOptions,
    archive: &Archive,
    classes: &[StorageClass],
    provisioner: &str,
) -> anyhow::Result<Plan> {
    let source = &checked.source;
    archive_restore::check_namespace(source, archive, &checked.namespace)
        .map_err(anyhow::Error::msg)?;
    let ours: Vec<&StorageClass> = classes
        .iter()
        .filter(|c| c.provisioner == provisioner)
        .collect();
    let names = || {
        let names: Vec<&str> = ours
            .iter()
            .filter_map(|c| c.metadata.name.as_deref())
            .collect();
        if names.is_empty() {
            "there is none".to_owned()
        } else {
            format!("this provisioner's: {}", names.join(", "))
        }
    };
    let class = match &options.class {
        Some(name) => *ours
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .with_context(|| {
                format!(
                    "--class {name}: no StorageClass of provisioner {provisioner} has that name ({})",
                    names()
                )
            })?,
        None => {
            let defaults: Vec<&&StorageClass> = ours
                .iter()
                .filter(|c| {
                    crate::cluster::annotation(&c.metadata, DEFAULT_CLASS) == Some("true")
                })
                .collect();
            match defaults.as_slice() {
                [class] => **class,
                _ => anyhow::bail!(
                    "the cluster's default StorageClass is not one of provisioner {provisioner}'s; name the class of the new claim with --class ({})",
                    names()
                ),
            }
        }
    };
    let class_name = class.metadata.name.clone().unwrap_or_default();
    let params = ClassParams::parse(class.parameters.as_ref())
        .map_err(|e| anyhow::anyhow!("StorageClass {class_name}: {e}"))?;
    // A class without agents places volumes on the controller's default agent, which
    // only the controller knows; it refuses the claim if that is not the archive's.
    anyhow::ensure!(
        params.agents.is_empty() || params.agents.contains(&source.agent),
        "the archive {} is on agent {}, but StorageClass {class_name:?} places volumes on agents {}: a volume made from an archive is made on the archive's agent; choose a class that allows agent {} with --class",
        source.id,
        source.agent,
        params.agents.join(", "),
        source.agent,
    );
    let (size, size_bytes) = match &options.size {
        Some(size) => (size.clone(), parse_bytes(size)?),
        None => {
            let bytes = archive.capacity_bytes.with_context(|| {
                format!(
                    "archive {source} records no capacity; give the new claim's size with --size"
                )
            })?;
            (bytes.to_string(), bytes)
        }
    };
    archive_restore::check_capacity(source, archive, size_bytes).map_err(anyhow::Error::msg)?;
    Ok(Plan {
        class: class_name,
        size,
        size_bytes,
    })
}

/// The claim the plan makes: the two annotations name the archive.
pub(crate) fn claim(
    checked: &Checked,
    options: &RestoreOptions,
    plan: &Plan,
) -> PersistentVolumeClaim {
    let annotations = BTreeMap::from([
        (ANN_RESTORE_ARCHIVE, checked.source.id.to_string()),
        (ANN_RESTORE_ARCHIVE_AGENT, checked.source.agent.clone()),
    ]);
    serde_json::from_value(json!({
        "metadata": {
            "name": checked.name,
            "namespace": checked.namespace,
            "annotations": annotations,
        },
        "spec": {
            "storageClassName": plan.class,
            "accessModes": [options.access_mode],
            "resources": {"requests": {"storage": plan.size}},
        },
    }))
    .expect("a claim's fields")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct RestoreReport {
    pub agent: String,
    pub archive: ArchivePath,
    /// `namespace/name`.
    pub claim: String,
    pub class: String,
    pub capacity_bytes: u64,
    pub access_mode: String,
    /// `Pending` as created; `Bound` once waited for.
    pub phase: String,
    /// With `--wait`: the PersistentVolume made from the archive.
    pub volume: Option<String>,
    pub nfs_server: Option<String>,
    pub nfs_path: Option<String>,
}

impl crate::report::Report for RestoreReport {
    fn table(&self) -> String {
        let mut out = format!(
            "claim {} created from archive {}:{} (class {}, {}, {})\n",
            self.claim,
            self.agent,
            self.archive,
            self.class,
            human_bytes(self.capacity_bytes),
            self.access_mode
        );
        match &self.volume {
            Some(volume) => out.push_str(&format!(
                "Bound to PersistentVolume {volume} ({}:{})\n",
                self.nfs_server.as_deref().unwrap_or("-"),
                self.nfs_path.as_deref().unwrap_or("-")
            )),
            None => out.push_str(&format!(
                "{}: the controller makes its volume; kubectl get pvc -n {} {} shows when it is Bound\n",
                self.phase,
                self.claim.split_once('/').map_or("", |(ns, _)| ns),
                self.claim.split_once('/').map_or("", |(_, name)| name),
            )),
        }
        out
    }
}

fn claims_access<'a>(namespace: &'a str, verb: &'static str) -> Access<'a> {
    Access {
        verb,
        group: "",
        resource: "persistentvolumeclaims",
        namespace: Some(namespace),
    }
}

pub(crate) async fn run(
    target: &Target,
    options: &RestoreOptions,
) -> anyhow::Result<RestoreReport> {
    let checked = check_options(options)?;
    let source = &checked.source;
    let client =
        crate::adopt::agent_client(target, &options.agent, options.agents_dir.as_deref()).await?;
    // Asked first: an agent too old to restore archives would call any archive missing.
    let info = client
        .info(None)
        .await
        .with_context(|| format!("cannot ask agent {} what it can do", source.agent))?;
    archive_restore::check_agent(source, &info.capabilities).map_err(anyhow::Error::msg)?;
    let archive = client
        .get_archive(&source.id, None)
        .await
        .map_err(|e| match e.code() {
            Some(ErrorCode::NotFound) => anyhow::anyhow!(
                "agent {} has no archive {} (kubectl nfsprov archives lists them)",
                source.agent,
                source.id
            ),
            _ => anyhow::Error::new(e).context(format!("cannot read archive {source}")),
        })?;
    let classes = target.classes().await?;
    let plan = plan(&checked, options, &archive, &classes, &target.provisioner)?;

    let key = format!("{}/{}", checked.namespace, checked.name);
    let claims =
        Api::<PersistentVolumeClaim>::namespaced(target.client.clone(), &checked.namespace);
    if get_opt(
        &claims,
        &checked.name,
        claims_access(&checked.namespace, "get"),
    )
    .await?
    .is_some()
    {
        anyhow::bail!(
            "claim {key} exists already: a claim's volume is made once; choose another name with --to"
        );
    }
    let created = claims
        .create(&PostParams::default(), &claim(&checked, options, &plan))
        .await
        .map_err(|e| match e {
            kube::Error::Api(status) if status.code == 409 => {
                anyhow::anyhow!("claim {key} exists already: a claim's volume is made once; choose another name with --to")
            }
            e => claims_access(&checked.namespace, "create").error(e),
        })?;
    let mut report = RestoreReport {
        agent: source.agent.clone(),
        archive: source.id.clone(),
        claim: key,
        class: plan.class,
        capacity_bytes: plan.size_bytes,
        access_mode: options.access_mode.clone(),
        phase: "Pending".to_owned(),
        volume: None,
        nfs_server: None,
        nfs_path: None,
    };
    if options.wait {
        let uid = created.metadata.uid.unwrap_or_default();
        let volume = wait_bound(target, &checked, &uid, options.timeout).await?;
        let nfs = volume.spec.as_ref().and_then(|s| s.nfs.as_ref());
        report.phase = "Bound".to_owned();
        report.nfs_server = nfs.map(|n| n.server.clone());
        report.nfs_path = nfs.map(|n| n.path.clone());
        report.volume = volume.metadata.name;
    }
    Ok(report)
}

/// Awaits the binding of the claim `checked` names, whose UID is `uid`, and returns its PV.
/// Fails at once when the controller refuses the claim for good, with its words; on the
/// deadline, with what it last said about the claim.
pub async fn wait_bound(
    target: &Target,
    checked: &Checked,
    uid: &str,
    timeout: Duration,
) -> anyhow::Result<PersistentVolume> {
    let claims =
        Api::<PersistentVolumeClaim>::namespaced(target.client.clone(), &checked.namespace);
    let bound = |c: Option<&PersistentVolumeClaim>| {
        c.and_then(|c| c.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Bound")
    };
    let key = format!("{}/{}", checked.namespace, checked.name);
    let events = Api::<Event>::namespaced(target.client.clone(), &checked.namespace);
    let waited = tokio::time::timeout(timeout, async {
        tokio::select! {
            bound = await_condition(claims, &checked.name, bound) => Ok(bound),
            refusal = refusal(events, uid) => Err(refusal),
        }
    })
    .await;
    let claim = match waited {
        Ok(Ok(Ok(Some(claim)))) => claim,
        Ok(Ok(Ok(None))) => anyhow::bail!("claim {key} was deleted while waiting for it"),
        Ok(Ok(Err(e))) => {
            return Err(anyhow::Error::new(e).context(format!("cannot watch claim {key}")));
        }
        Ok(Err(refused)) => {
            anyhow::bail!("claim {key} stays Pending, refused by the controller: {refused}")
        }
        Err(_) => {
            let said = last_failure(target, checked, uid).await;
            anyhow::bail!(
                "claim {key} is not Bound after {}s{}",
                timeout.as_secs(),
                said.map(|s| format!("; the controller said: {s}"))
                    .unwrap_or_default()
            )
        }
    };
    let name = claim
        .spec
        .and_then(|s| s.volume_name)
        .with_context(|| format!("claim {key} is Bound to no volume"))?;
    let volumes = Api::<PersistentVolume>::all(target.client.clone());
    volumes.get(&name).await.map_err(|e| {
        Access {
            verb: "get",
            group: "",
            resource: "persistentvolumes",
            namespace: None,
        }
        .error(e)
    })
}

/// The controller's events about the claim `uid` that say it could not be provisioned;
/// events about an earlier claim of the same name are not about this one.
fn failures_of(uid: &str) -> String {
    format!("involvedObject.uid={uid},reason={REASON_FAILED}")
}

/// The note of the controller's refusal for good of the claim `uid`, once there is one.
/// Events that cannot be watched leave the claim waited for alone: this never resolves.
async fn refusal(events: Api<Event>, uid: &str) -> String {
    let config = watcher::Config::default().fields(&failures_of(uid));
    let mut stream = std::pin::pin!(watcher(events, config).default_backoff().applied_objects());
    while let Some(event) = stream.next().await {
        if let Ok(event) = event
            && event.action.as_deref() == Some(ACTION_REFUSE)
        {
            return event.message.unwrap_or_default();
        }
    }
    std::future::pending().await
}

/// The note of the newest `ProvisioningFailed` event about the claim, if it can be read.
async fn last_failure(target: &Target, checked: &Checked, uid: &str) -> Option<String> {
    let events = Api::<Event>::namespaced(target.client.clone(), &checked.namespace);
    events
        .list(&ListParams::default().fields(&failures_of(uid)))
        .await
        .ok()?
        .items
        .into_iter()
        .max_by_key(|e| {
            (
                e.last_timestamp.as_ref().map(|t| t.0),
                e.event_time.as_ref().map(|t| t.0),
            )
        })?
        .message
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "team-a/data/@20261120T120000.000000000Z";
    const PROVISIONER: &str = "nfsprov.dev/nfs";

    fn options(to: &str) -> RestoreOptions {
        RestoreOptions {
            agent: "nfs1".into(),
            id: ID.into(),
            to: to.into(),
            class: None,
            size: None,
            access_mode: "ReadWriteMany".into(),
            wait: false,
            timeout: Duration::from_secs(1),
            agents_dir: None,
        }
    }

    fn archive(namespace: Option<&str>, capacity: Option<u64>) -> Archive {
        serde_json::from_value(json!({
            "id": ID,
            "archive_path": format!(".archive/{ID}"),
            "path": "team-a/data",
            "owner": {"pvc_namespace": namespace, "pvc_name": "data"},
            "archived_at": "2026-11-20T12:00:00Z",
            "capacity_bytes": capacity,
        }))
        .unwrap()
    }

    fn class(name: &str, provisioner: &str, default: bool, agents: Option<&str>) -> StorageClass {
        let mut class = json!({"metadata": {"name": name}, "provisioner": provisioner});
        if default {
            class["metadata"]["annotations"] = json!({DEFAULT_CLASS: "true"});
        }
        if let Some(agents) = agents {
            class["parameters"] = json!({"agents": agents});
        }
        serde_json::from_value(class).unwrap()
    }

    fn planned(
        options: &RestoreOptions,
        archive: &Archive,
        classes: &[StorageClass],
    ) -> anyhow::Result<Plan> {
        let checked = check_options(options)?;
        plan(&checked, options, archive, classes, PROVISIONER)
    }

    #[test]
    fn the_options_are_checked_before_anything_is_asked() {
        let checked = check_options(&options("team-a/back")).unwrap();
        assert_eq!(
            (checked.namespace.as_str(), checked.name.as_str()),
            ("team-a", "back")
        );
        assert_eq!(checked.source.to_string(), format!("nfs1:{ID}"));
        for to in ["back", "/back", "team-a/", "a/b/c"] {
            let e = check_options(&options(to)).unwrap_err().to_string();
            assert!(e.contains("names no claim"), "{to}: {e}");
        }
        let mut bad = options("team-a/back");
        bad.id = "team-a/data".into();
        assert!(
            check_options(&bad)
                .unwrap_err()
                .to_string()
                .contains("is not an archive id")
        );
        let mut bad = options("team-a/back");
        bad.access_mode = "ReadWriteSometimes".into();
        assert!(check_options(&bad).is_err());
        let mut bad = options("team-a/back");
        bad.size = Some("lots".into());
        assert!(check_options(&bad).is_err());
    }

    #[test]
    fn the_default_class_of_this_provisioner_and_the_archived_capacity_are_taken() {
        let classes = [
            class("other-default", "example.com/else", true, None),
            class("nfs", PROVISIONER, true, None),
            class("fast", PROVISIONER, false, Some("nfs1,nfs2")),
        ];
        let archive = archive(Some("team-a"), Some(3 << 30));
        let plan = planned(&options("team-a/back"), &archive, &classes).unwrap();
        assert_eq!(
            plan,
            Plan {
                class: "nfs".into(),
                size: (3u64 << 30).to_string(),
                size_bytes: 3 << 30,
            }
        );
        let mut chosen = options("team-a/back");
        chosen.class = Some("fast".into());
        chosen.size = Some("4Gi".into());
        let plan = planned(&chosen, &archive, &classes).unwrap();
        assert_eq!(
            (plan.class.as_str(), plan.size.as_str(), plan.size_bytes),
            ("fast", "4Gi", 4 << 30)
        );
        let claim = claim(&check_options(&chosen).unwrap(), &chosen, &plan);
        let annotations = claim.metadata.annotations.unwrap();
        assert_eq!(annotations[ANN_RESTORE_ARCHIVE], ID);
        assert_eq!(annotations[ANN_RESTORE_ARCHIVE_AGENT], "nfs1");
        assert_eq!(claim.metadata.namespace.as_deref(), Some("team-a"));
        let spec = claim.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
        assert_eq!(spec.access_modes, Some(vec!["ReadWriteMany".to_owned()]));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            "4Gi"
        );
        assert!(spec.data_source_ref.is_none());
    }

    #[test]
    fn what_the_controller_would_refuse_is_refused_in_its_words() {
        let classes = [
            class("nfs", PROVISIONER, false, None),
            class("elsewhere", PROVISIONER, false, Some("nfs2")),
            class("theirs", "example.com/else", true, None),
        ];
        let own = archive(Some("team-a"), Some(1 << 30));
        let no_default = planned(&options("team-a/back"), &own, &classes)
            .unwrap_err()
            .to_string();
        assert!(
            no_default.contains("--class")
                && no_default.contains("this provisioner's: nfs, elsewhere"),
            "{no_default}"
        );
        let mut with = options("team-b/back");
        with.class = Some("nfs".into());
        let other = planned(&with, &own, &classes).unwrap_err().to_string();
        let source = check_options(&with).unwrap().source;
        assert_eq!(
            other,
            archive_restore::check_namespace(&source, &own, "team-b").unwrap_err(),
            "the controller's words"
        );
        let unowned = planned(&with, &archive(None, None), &classes)
            .unwrap_err()
            .to_string();
        assert!(unowned.contains("records no namespace"), "{unowned}");
        let mut small = options("team-a/back");
        small.class = Some("nfs".into());
        small.size = Some("512Mi".into());
        let e = planned(&small, &own, &classes).unwrap_err().to_string();
        assert_eq!(
            e,
            archive_restore::check_capacity(&source, &own, 512 << 20).unwrap_err()
        );
        let mut moved = options("team-a/back");
        moved.class = Some("elsewhere".into());
        let e = planned(&moved, &own, &classes).unwrap_err().to_string();
        assert!(e.contains("places volumes on agents nfs2"), "{e}");
        let mut foreign = options("team-a/back");
        foreign.class = Some("theirs".into());
        assert!(
            planned(&foreign, &own, &classes)
                .unwrap_err()
                .to_string()
                .contains("no StorageClass of provisioner")
        );
        let mut no_size = options("team-a/back");
        no_size.class = Some("nfs".into());
        let e = planned(&no_size, &archive(Some("team-a"), None), &classes)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("records no capacity") && e.contains("--size"),
            "{e}"
        );
    }
}
