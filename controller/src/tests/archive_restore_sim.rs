//! Claims made from an archive, through the whole controller on either tier (the API
//! simulator, or the real API server in the real-API tier; see `Harness`).
//! The agents are `MockAgent`s (mocks, not the real agent): the archives they hold are
//! put there by the test, and their recorded calls and restore requests show what the
//! controller asked.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, PostParams};
use nfsprov_api_types::ArchivePath;
use nfsprov_vocabulary::names::{
    ACTION_REFUSE, ANN_RESTORE_ARCHIVE, ANN_RESTORE_ARCHIVE_AGENT, ANN_RESTORED_FROM_ARCHIVE,
};
use serde_json::{Value, json};

use crate::tests::snapshot_sim::Cluster;

const WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);
const GIB: u64 = 1 << 30;

/// A claim in `namespace` of `class` asking for `size`, with `annotations`.
async fn claim(
    cluster: &Cluster,
    namespace: &str,
    name: &str,
    class: &str,
    size: &str,
    annotations: Value,
) {
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cluster.class_name(class),
            "resources": {"requests": {"storage": size}},
        },
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), namespace)
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
}

fn naming(agent: &str, id: &ArchivePath) -> Value {
    json!({ANN_RESTORE_ARCHIVE: id.to_string(), ANN_RESTORE_ARCHIVE_AGENT: agent})
}

/// Awaits an event of `reason` about the claim `namespace/name` whose note contains
/// `text`; its action.
async fn event(cluster: &Cluster, namespace: &str, name: &str, reason: &str, text: &str) -> String {
    let events = Api::<Event>::namespaced(cluster.client.clone(), namespace);
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let notes: Vec<(String, String, String, String)> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| {
                (
                    e.regarding.and_then(|r| r.name).unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                    e.action.unwrap_or_default(),
                )
            })
            .collect();
        if let Some((_, _, _, action)) = notes
            .iter()
            .find(|(o, r, n, _)| o == name && r == reason && n.contains(text))
        {
            return action.clone();
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no {reason} event on {namespace}/{name} with {text:?} in {notes:?}"
        );
        tokio::time::sleep(POLL).await;
    }
}

async fn phase(cluster: &Cluster, namespace: &str, name: &str) -> Option<String> {
    Api::<PersistentVolumeClaim>::namespaced(cluster.client.clone(), namespace)
        .get(name)
        .await
        .unwrap()
        .status
        .and_then(|s| s.phase)
}

/// Asserts that the controller made no volume (volumes are cluster-scoped: on a real
/// server, other scenarios' are there too, told apart by their provisioner).
async fn no_volumes(cluster: &Cluster) {
    let volumes: Vec<PersistentVolume> = Api::<PersistentVolume>::all(cluster.client.clone())
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|v| {
            v.metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get("pv.kubernetes.io/provisioned-by"))
                == Some(&cluster.provisioner)
        })
        .collect();
    assert!(volumes.is_empty(), "{volumes:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_annotated_with_an_archive_of_its_namespace_is_made_from_it() {
    let cluster = Cluster::start().await;
    let id = cluster.agent().insert_archive(
        cluster.in_ns("default/old").as_str(),
        Some(cluster.in_ns("default/old").as_str()),
        Some(GIB),
    );
    cluster.agent().set_restore_polls(1);
    claim(
        &cluster,
        &cluster.namespace,
        "back",
        "nfs",
        "2Gi",
        naming("nfs1", &id),
    )
    .await;
    let bound = cluster.bound("back").await;

    let restores = cluster.agent().restores();
    assert_eq!(restores.len(), 2, "one 202, then made: {restores:?}");
    assert_eq!(restores[0], restores[1], "the same request is repeated");
    let (path, request) = &restores[1];
    assert_eq!(path, cluster.in_ns("default/back").as_str());
    assert_eq!(request.archive.as_ref(), Some(&id));
    assert_eq!(request.snapshot, None);
    assert_eq!(request.capacity_bytes, 2 * GIB);
    assert_eq!(
        request.owner.pvc_namespace.as_deref(),
        Some(cluster.namespace.as_str())
    );
    assert_eq!(request.owner.pvc_name.as_deref(), Some("back"));
    // The archive was looked at on its agent before the volume was asked for.
    let calls = cluster.agent().calls();
    let asked = calls
        .iter()
        .position(|c| *c == format!("GET archive {id}"))
        .expect("the archive was read");
    let restored = calls
        .iter()
        .position(|c| c.starts_with(&cluster.in_ns("POST restore default/back")))
        .unwrap();
    assert!(asked < restored, "{calls:?}");
    // The archived volume's mode and owner, the claim's capacity.
    let made = cluster
        .agent()
        .volume(cluster.in_ns("default/back").as_str())
        .unwrap();
    assert_eq!(made.mode.to_string(), "0750");
    assert_eq!((made.uid, made.gid), (Some(1000), Some(1000)));
    assert_eq!(made.capacity_bytes, 2 * GIB);

    let pv = Api::<PersistentVolume>::all(cluster.client.clone())
        .get(bound.spec.unwrap().volume_name.as_deref().unwrap())
        .await
        .unwrap();
    let annotations: BTreeMap<String, String> = pv.metadata.annotations.unwrap();
    assert_eq!(annotations[ANN_RESTORED_FROM_ARCHIVE], format!("nfs1:{id}"));
    assert_eq!(annotations["nfsprov.dev/clone-method"], "reflink");
    assert!(!annotations.contains_key("nfsprov.dev/restored-from"));
    event(
        &cluster,
        &cluster.namespace,
        "back",
        "Provisioning",
        &format!("restoring archive nfs1:{id}"),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "back",
        "ProvisioningSucceeded",
        "",
    )
    .await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archive_restores_that_must_not_be_made_are_refused_with_no_volume() {
    let cluster = Cluster::start().await;
    cluster.class("elsewhere", json!({"agents": "nfs2"})).await;
    let agent = cluster.agent();
    let id = agent.insert_archive(
        cluster.in_ns("default/old").as_str(),
        Some(cluster.in_ns("default/old").as_str()),
        Some(GIB),
    );
    let unowned = agent.insert_archive("loose", None, None);
    let moved = agent.insert_archive(
        cluster.in_ns("default/moved").as_str(),
        Some(cluster.in_ns("default/moved").as_str()),
        Some(GIB),
    );
    let missing = ArchivePath::parse(
        cluster
            .in_ns("default/gone/@20250101T000000.000000000Z")
            .as_str(),
    )
    .unwrap();

    // A tenant of another namespace naming the archive id.
    let intruder_name = cluster.scoped_name("intruder");
    cluster.adopt("namespace", &intruder_name);
    let intruder: Namespace =
        serde_json::from_value(json!({"metadata": {"name": intruder_name}})).unwrap();
    Api::<Namespace>::all(cluster.client.clone())
        .create(&PostParams::default(), &intruder)
        .await
        .unwrap();
    claim(
        &cluster,
        &intruder_name,
        "stolen",
        "nfs",
        "1Gi",
        naming("nfs1", &id),
    )
    .await;
    let refused = event(
        &cluster,
        &intruder_name,
        "stolen",
        "ProvisioningFailed",
        &format!(
            "archive nfs1:{id} holds a volume of namespace {}, not {intruder_name}: a claim is made only from an archive of its own namespace",
            cluster.namespace
        ),
    )
    .await;
    assert_eq!(refused, ACTION_REFUSE, "a refusal for good says so");
    claim(
        &cluster,
        &cluster.namespace,
        "unowned",
        "nfs",
        "1Gi",
        naming("nfs1", &unowned),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "unowned",
        "ProvisioningFailed",
        "records no namespace",
    )
    .await;
    claim(
        &cluster,
        &cluster.namespace,
        "unknown",
        "nfs",
        "1Gi",
        naming("nfs1", &missing),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "unknown",
        "ProvisioningFailed",
        &format!("archive nfs1:{missing} does not exist"),
    )
    .await;
    claim(
        &cluster,
        &cluster.namespace,
        "small",
        "nfs",
        "512Mi",
        naming("nfs1", &id),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "small",
        "ProvisioningFailed",
        "less than the 1073741824 bytes the volume of archive",
    )
    .await;
    claim(
        &cluster,
        &cluster.namespace,
        "moved",
        "elsewhere",
        "1Gi",
        naming("nfs1", &moved),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "moved",
        "ProvisioningFailed",
        &format!(
            "the archive {moved} is on agent nfs1, but StorageClass \"{}\" places volumes on agents nfs2",
            cluster.class_name("elsewhere")
        ),
    )
    .await;
    // Half the annotations, or an archive together with a data source.
    claim(
        &cluster,
        &cluster.namespace,
        "half",
        "nfs",
        "1Gi",
        json!({ANN_RESTORE_ARCHIVE: id.to_string()}),
    )
    .await;
    event(
        &cluster,
        &cluster.namespace,
        "half",
        "ProvisioningFailed",
        "names no agent",
    )
    .await;
    let both: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "both", "namespace": cluster.namespace, "annotations": naming("nfs1", &id)},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cluster.class_name("nfs"),
            "resources": {"requests": {"storage": "1Gi"}},
            "dataSourceRef": {"apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": "s"},
        },
    }))
    .unwrap();
    cluster
        .claims()
        .create(&PostParams::default(), &both)
        .await
        .unwrap();
    event(
        &cluster,
        &cluster.namespace,
        "both",
        "ProvisioningFailed",
        "and a dataSource too",
    )
    .await;

    // Nothing was made, and the class's refusal came before its archive was looked at.
    assert!(
        cluster.agent().restores().is_empty(),
        "{:?}",
        cluster.agent().restores()
    );
    assert!(cluster.agents[1].restores().is_empty());
    let calls = cluster.agent().calls();
    assert!(
        !calls.contains(&format!("GET archive {moved}")),
        "the agent of a class that does not allow it is asked nothing: {calls:?}"
    );
    assert!(calls.iter().all(|c| !c.starts_with("PUT ")), "{calls:?}");
    for (namespace, name) in [
        (intruder_name.as_str(), "stolen"),
        (cluster.namespace.as_str(), "unowned"),
        (cluster.namespace.as_str(), "unknown"),
        (cluster.namespace.as_str(), "small"),
        (cluster.namespace.as_str(), "moved"),
        (cluster.namespace.as_str(), "half"),
        (cluster.namespace.as_str(), "both"),
    ] {
        assert_eq!(
            phase(&cluster, namespace, name).await.as_deref(),
            Some("Pending"),
            "{namespace}/{name}"
        );
    }
    no_volumes(&cluster).await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_archive_agent_that_does_not_answer_is_waited_for_not_refused() {
    let mut cluster = Cluster::start().await;
    cluster.class("elsewhere", json!({"agents": "nfs2"})).await;
    let id = cluster.agents[1].insert_archive(
        cluster.in_ns("default/old").as_str(),
        Some(cluster.in_ns("default/old").as_str()),
        Some(GIB),
    );
    cluster.agents[1].stop().await;
    claim(
        &cluster,
        &cluster.namespace,
        "later",
        "elsewhere",
        "1Gi",
        naming("nfs2", &id),
    )
    .await;
    let action = event(
        &cluster,
        &cluster.namespace,
        "later",
        "ProvisioningFailed",
        &format!("cannot read archive nfs2:{id}: agent unreachable"),
    )
    .await;
    assert_eq!(
        action, "Provision",
        "a failure that is retried is no refusal"
    );
    // Waiting, not refused for good: the attempt is made again, and announced again.
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let failures = Api::<Event>::namespaced(cluster.client.clone(), &cluster.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
            .map(|e| e.series.map_or(1, |s| s.count))
            .sum::<i32>();
        if failures >= 2 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the claim was not tried again"
        );
        tokio::time::sleep(POLL).await;
    }
    assert_eq!(
        phase(&cluster, &cluster.namespace, "later")
            .await
            .as_deref(),
        Some("Pending")
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_older_than_archive_restores_is_named_not_the_archive_called_missing() {
    let cluster = Cluster::start().await;
    let agent = cluster.agent();
    let id = agent.insert_archive(
        cluster.in_ns("default/old").as_str(),
        Some(cluster.in_ns("default/old").as_str()),
        Some(GIB),
    );
    agent.predate_archive_restores();
    claim(
        &cluster,
        &cluster.namespace,
        "back",
        "nfs",
        "1Gi",
        naming("nfs1", &id),
    )
    .await;
    let action = event(
        &cluster,
        &cluster.namespace,
        "back",
        "ProvisioningFailed",
        &format!(
            "agent nfs1 cannot make a volume from an archive (its version is older than archive restores): upgrade agent nfs1 to restore archive {id}"
        ),
    )
    .await;
    assert_eq!(action, ACTION_REFUSE, "only an upgrade helps");

    // The agent was asked what it can do, and nothing else: not for the archive (which
    // it would call missing), not to make a volume.
    let calls = cluster.agent().calls();
    assert!(calls.iter().any(|c| c == "GET info"), "{calls:?}");
    assert!(
        calls.iter().all(|c| !c.starts_with("GET archive")
            && !c.starts_with("POST ")
            && !c.starts_with("PUT ")),
        "{calls:?}"
    );
    assert!(cluster.agent().restores().is_empty());
    assert_eq!(
        phase(&cluster, &cluster.namespace, "back").await.as_deref(),
        Some("Pending")
    );
    no_volumes(&cluster).await;
    cluster.finish().await;
}
