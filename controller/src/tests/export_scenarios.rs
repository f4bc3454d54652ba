//! The export reconciler against a mocked API server (every call asserted in order) and
//! `MockAgent` (a mock agent): exports found missing or changed are put right.

use http::Method;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::watcher::Event;
use nfsprov_api_types::{
    CreateVolumeRequest, ExportAccess, ExportClient, ExportManager, ExportRequest, Mode,
    QuotaPolicy, VolumeOwner,
};
use serde_json::{Value, json};

use crate::exports::Reconciler;
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
