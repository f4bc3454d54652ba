//! kube-runtime's `Recorder` writes events.k8s.io/v1 Events (create, then merge patches
//! for a series); core/v1 readers must see the same events, as on a real cluster.

mod common;

use common::*;
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event as EventV1;
use kube::Resource;
use kube::api::{Api, ListParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use nfsprov_kube_sim::SimOptions;
use serde_json::json;

#[tokio::test]
async fn recorder_events_are_visible_through_both_apis() {
    let (_sim, client) = start_with(SimOptions {
        binder: false,
        ..SimOptions::default()
    })
    .await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim = create(&pvcs, &pvc("data", Some("nfs"), "1Gi")).await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "nfsprov-controller".into(),
            instance: Some("pod-1".into()),
        },
    );
    let ev = Event {
        type_: EventType::Normal,
        reason: "Provisioning".into(),
        note: Some("External provisioner is provisioning volume for claim \"default/data\"".into()),
        action: "Provision".into(),
        secondary: None,
    };
    let reference = claim.object_ref(&());
    recorder.publish(&ev, &reference).await.unwrap();
    // The same event again becomes a series (a merge patch of the existing object).
    recorder.publish(&ev, &reference).await.unwrap();

    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "default");
    let seen = core
        .list(&ListParams::default().fields("involvedObject.name=data,reason=Provisioning"))
        .await
        .unwrap();
    assert_eq!(seen.items.len(), 1, "{:#?}", seen.items);
    let e = &seen.items[0];
    assert_eq!(e.reporting_component.as_deref(), Some("nfsprov-controller"));
    assert_eq!(e.message.as_deref(), ev.note.as_deref());
    assert_eq!(e.series.as_ref().and_then(|s| s.count), Some(2));
    assert_eq!(e.involved_object.uid, claim.metadata.uid);

    let v1: Api<EventV1> = Api::namespaced(client.clone(), "default");
    let listed = v1.list(&ListParams::default()).await.unwrap();
    assert_eq!(listed.items.len(), 1);
    assert_eq!(
        listed.items[0]
            .regarding
            .as_ref()
            .and_then(|r| r.name.as_deref()),
        Some("data")
    );

    // events.k8s.io validation: reportingController, action, eventTime are required.
    let bad: EventV1 = serde_json::from_value(json!({
        "metadata": {"name": "bad"},
        "reason": "X",
        "type": "Normal",
        "regarding": {"kind": "PersistentVolumeClaim", "name": "data", "namespace": "default"}
    }))
    .unwrap();
    let e = status(v1.create(&PostParams::default(), &bad).await);
    assert!(e.is_invalid());
    assert!(
        e.message.contains("eventTime: Required value"),
        "{}",
        e.message
    );
    assert!(
        e.message.contains("reportingController: Required value"),
        "{}",
        e.message
    );
}
