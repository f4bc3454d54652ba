//! The export reconciler against a mocked API server (every call asserted in order) and
//! `MockAgent` (a mock agent): exports found missing or changed are put right, and
//! `nodes` exports follow Node changes without requests the next look would undo.

use std::time::Duration;

use http::Method;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher::Event;
use nfsprov_api_types::{
    CreateVolumeRequest, ExportAccess, ExportClient, ExportManager, ExportRequest, Mode,
    QuotaPolicy, Squash, VolumeOwner,
};
use serde_json::{Value, json};

use crate::exports::{CONCURRENT_REQUESTS, Reconciler};
use crate::mounters::{MountingPod, NodeAddresses};
use crate::objects::{ANN_AGENT, ANN_PATH, ANN_PROVISIONED_BY};
use crate::tests::builders::{PROVISIONER, class};
use crate::tests::mock_agent::MockAgent;
use crate::tests::mock_api::{BodyCheck, Call, context, finish};

fn volume(name: &str, path: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            ANN_PROVISIONED_BY: PROVISIONER, ANN_AGENT: "nfs1", ANN_PATH: path,
        }},
        "spec": {
            "storageClassName": "nfs",
            "claimRef": {"namespace": "team", "name": path.trim_start_matches("team/")},
        },
        "status": {"phase": "Bound"},
    }))
    .unwrap()
}

fn made(export: Option<ExportRequest>) -> CreateVolumeRequest {
    CreateVolumeRequest {
        mode: Mode::DEFAULT,
        uid: None,
        gid: None,
        capacity_bytes: 1 << 30,
        owner: VolumeOwner::default(),
        quota: QuotaPolicy::Off,
        export,
    }
}

/// Runs one look, then looks with nothing new, over `volumes` of an `exportClients: all`
/// class, with `calls` expected of the API server.
async fn look(agent: &MockAgent, volumes: Vec<PersistentVolume>, calls: Vec<Call>) {
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("exportClients", "all")])],
        volumes,
    );
    let (mut nodes, mut pods) = ctx.mounters.take_writers().unwrap();
    nodes.apply_watcher_event(&Event::<NodeAddresses>::Init);
    nodes.apply_watcher_event(&Event::<NodeAddresses>::InitDone);
    pods.apply_watcher_event(&Event::<MountingPod>::Init);
    pods.apply_watcher_event(&Event::<MountingPod>::InitDone);
    let server = api.run(calls);
    let reconciler = Reconciler::new(&ctx);
    reconciler.sync(true).await;
    // Once seen right, a look asks the agent nothing.
    let asked = agent.calls().len();
    reconciler.sync(false).await;
    reconciler.sync(true).await;
    assert_eq!(agent.calls().len(), asked, "{:?}", agent.calls());
    drop(reconciler);
    finish(ctx, server).await;
}

#[tokio::test]
async fn exports_missing_or_changed_behind_the_controllers_back_are_put_right() {
    let agent = MockAgent::start("nfs1").await;
    agent.manage_exports(ExportManager::Knfsd);
    let everyone = ExportRequest {
        clients: vec![ExportClient::Everyone],
        ..ExportRequest::default()
    };
    // As the class asks: left alone.
    agent.insert_volume("team/right", made(Some(everyone.clone())));
    // Made before the agent had a manager: no export at all. Its access comes from the
    // claim; the change is told on it.
    agent.insert_volume("team/old", made(None));
    look(
        &agent,
        vec![
            volume("pvc-old", "team/old"),
            volume("pvc-right", "team/right"),
        ],
        vec![
            Call::new(
                Method::GET,
                "/api/v1/namespaces/team/persistentvolumeclaims/old",
                BodyCheck::Exact(Value::Null),
            )
            .respond(json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": {"name": "old", "namespace": "team"},
                "spec": {"accessModes": ["ReadOnlyMany"]},
            })),
            Call::event("team", "Normal", "ExportUpdated", "old", "now admits *"),
        ],
    )
    .await;
    assert_eq!(
        agent.export("team/old"),
        Some(ExportRequest {
            access: ExportAccess::ReadOnly,
            ..everyone.clone()
        })
    );

    // Narrowed by hand on the server.
    agent.insert_volume(
        "team/edited",
        made(Some(ExportRequest {
            clients: vec!["192.0.2.1".parse().unwrap()],
            ..ExportRequest::default()
        })),
    );
    look(
        &agent,
        vec![
            volume("pvc-edited", "team/edited"),
            volume("pvc-right", "team/right"),
        ],
        vec![Call::event(
            "team",
            "Normal",
            "ExportUpdated",
            "edited",
            "now admits *",
        )],
    )
    .await;
    assert_eq!(agent.export("team/edited"), Some(everyone.clone()));
    assert_eq!(agent.export("team/right"), Some(everyone));
    let puts: Vec<String> = agent
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("PUT export"))
        .collect();
    assert_eq!(
        puts,
        ["PUT export team/old [*]", "PUT export team/edited [*]"]
    );
}

fn node(name: &str, address: &str) -> NodeAddresses {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "status": {"addresses": [{"type": "InternalIP", "address": address}]},
    }))
    .unwrap()
}

/// A volume of class `class` at `team/<name>`, named `pvc-<name>`.
fn volume_of_class(name: &str, class: &str) -> PersistentVolume {
    let mut volume = volume(&format!("pvc-{name}"), &format!("team/{name}"));
    volume.spec.as_mut().unwrap().storage_class_name = Some(class.to_owned());
    volume
}

fn hosts(addresses: &[&str]) -> Vec<ExportClient> {
    addresses.iter().map(|a| a.parse().unwrap()).collect()
}

/// The `PUT export` calls the agent received.
fn puts(agent: &MockAgent) -> Vec<String> {
    agent
        .calls()
        .into_iter()
        .filter(|c| c.starts_with("PUT export"))
        .collect()
}

#[tokio::test]
async fn two_nodes_classes_with_other_options_are_each_left_alone_once_right() {
    let agent = MockAgent::start("nfs1").await;
    agent.manage_exports(ExportManager::Ganesha);
    let clients = hosts(&["10.0.0.2"]);
    let squashed = ExportRequest {
        clients: clients.clone(),
        squash: Squash::All,
        anon_uid: Some(1000),
        anon_gid: Some(1000),
        ..ExportRequest::default()
    };
    let mut volumes = Vec::new();
    for i in 0..3 {
        agent.insert_volume(
            &format!("team/plain-{i}"),
            made(Some(ExportRequest {
                clients: clients.clone(),
                ..ExportRequest::default()
            })),
        );
        volumes.push(volume_of_class(&format!("plain-{i}"), "plain"));
        agent.insert_volume(&format!("team/squashed-{i}"), made(Some(squashed.clone())));
        volumes.push(volume_of_class(&format!("squashed-{i}"), "squashed"));
    }
    let (ctx, api) = context(
        agent.registry(),
        vec![
            class("plain", &[("exportClients", "nodes")]),
            class(
                "squashed",
                &[
                    ("exportClients", "nodes"),
                    ("squash", "all"),
                    ("uid", "1000"),
                    ("gid", "1000"),
                ],
            ),
        ],
        volumes,
    );
    let (mut nodes, mut pods) = ctx.mounters.take_writers().unwrap();
    for event in [
        Event::Init,
        Event::InitApply(node("a", "10.0.0.2")),
        Event::InitDone,
    ] {
        nodes.apply_watcher_event(&event);
    }
    pods.apply_watcher_event(&Event::<MountingPod>::Init);
    pods.apply_watcher_event(&Event::<MountingPod>::InitDone);
    let server = api.run(vec![]);
    let reconciler = Reconciler::new(&ctx);
    reconciler.sync(true).await;
    // Every export is as its class asks: a change of the cluster that moves no client
    // changes none, whichever class's volumes the look meets first.
    reconciler.sync(true).await;
    reconciler.sync(true).await;
    assert_eq!(puts(&agent), Vec::<String>::new());

    // A node joins: each export gets it, with its own class's options.
    nodes.apply_watcher_event(&Event::Apply(node("b", "10.0.0.3")));
    reconciler.sync(true).await;
    reconciler.sync(true).await;
    assert_eq!(puts(&agent).len(), 6, "{:?}", puts(&agent));
    let both = hosts(&["10.0.0.2", "10.0.0.3"]);
    for i in 0..3 {
        let plain = agent.export(&format!("team/plain-{i}")).unwrap();
        assert_eq!((plain.clients, plain.squash), (both.clone(), Squash::Root));
        let export = agent.export(&format!("team/squashed-{i}")).unwrap();
        assert_eq!(
            export,
            ExportRequest {
                clients: both.clone(),
                ..squashed.clone()
            }
        );
    }
    drop(reconciler);
    finish(ctx, server).await;
}

/// How many volumes of a `nodes` class the look meets a Node change in the middle of:
/// more than it has requests in flight.
const MID_LOOK_VOLUMES: usize = 200;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_change_in_the_middle_of_a_look_reaches_the_exports_it_has_not_sent_yet() {
    let agent = MockAgent::start("nfs1").await;
    agent.manage_exports(ExportManager::Ganesha);
    let mut volumes = Vec::new();
    for i in 0..MID_LOOK_VOLUMES {
        agent.insert_volume(
            &format!("team/v{i}"),
            made(Some(ExportRequest {
                clients: hosts(&["10.0.0.2"]),
                ..ExportRequest::default()
            })),
        );
        volumes.push(volume_of_class(&format!("v{i}"), "nfs"));
    }
    let (ctx, api) = context(
        agent.registry(),
        vec![class("nfs", &[("exportClients", "nodes")])],
        volumes,
    );
    let (mut nodes, mut pods) = ctx.mounters.take_writers().unwrap();
    for event in [
        Event::Init,
        Event::InitApply(node("a", "10.0.0.2")),
        Event::InitDone,
    ] {
        nodes.apply_watcher_event(&event);
    }
    pods.apply_watcher_event(&Event::<MountingPod>::Init);
    pods.apply_watcher_event(&Event::<MountingPod>::InitDone);
    let server = api.run(vec![]);
    let reconciler = Reconciler::new(&ctx);
    reconciler.sync(true).await;
    assert!(
        puts(&agent).is_empty(),
        "every export is right to begin with"
    );

    // Node b joins; the look it starts is caught with its first requests in flight,
    // when node c joins too.
    nodes.apply_watcher_event(&Event::Apply(node("b", "10.0.0.3")));
    reconciler.node_changed();
    agent.hold_exports(true);
    let in_flight = async {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while agent.exports_held().now() < CONCURRENT_REQUESTS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} export changes in flight, not {CONCURRENT_REQUESTS}",
                agent.exports_held().now()
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        nodes.apply_watcher_event(&Event::Apply(node("c", "10.0.0.4")));
        reconciler.node_changed();
        agent.hold_exports(false);
    };
    tokio::join!(reconciler.sync(true), in_flight);
    let count = |clients: &str| {
        puts(&agent)
            .iter()
            .filter(|c| c.ends_with(&format!(" [{clients}]")))
            .count()
    };
    // Only the requests already sent carry the list without c; the rest of the look
    // sends the latest.
    let (stale, latest) = ("10.0.0.2,10.0.0.3", "10.0.0.2,10.0.0.3,10.0.0.4");
    assert_eq!(count(stale), CONCURRENT_REQUESTS);
    assert_eq!(count(latest), MID_LOOK_VOLUMES - CONCURRENT_REQUESTS);

    // The next look puts right only those.
    reconciler.sync(true).await;
    assert_eq!(count(stale), CONCURRENT_REQUESTS);
    assert_eq!(count(latest), MID_LOOK_VOLUMES);
    for i in 0..MID_LOOK_VOLUMES {
        let export = agent.export(&format!("team/v{i}")).unwrap();
        assert_eq!(export.clients, hosts(&["10.0.0.2", "10.0.0.3", "10.0.0.4"]));
    }
    drop(reconciler);
    finish(ctx, server).await;
}
