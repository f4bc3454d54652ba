//! `kubectl nfsprov restore --wait` against the API simulator and a real agent over HTTPS.
//! No controller runs here: the test publishes the events the controller publishes about
//! a claim it cannot provision (through the same events API, with the same reason and
//! actions), and the plugin must tell a refusal for good of its own claim from a failure
//! that is retried and from a refusal of an earlier claim of the same name.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_api_types::{ArchivePath, CreateVolumeRequest, VolumeOwner, VolumePath};
use nfsprov_kubectl::{Checked, Target, wait_bound};
use nfsprov_test_harness::{Harness, HarnessOptions};
use nfsprov_vocabulary::archive_restore::ArchiveSource;
use nfsprov_vocabulary::names::{ACTION_REFUSE, DEFAULT_PROVISIONER};
use serde_json::json;

const RETRIED: &str =
    "cannot read archive nfs1:x: agent unreachable; the volume is made once the agent answers";
const REFUSED: &str = "archive nfs1:x holds a volume of namespace other, not default: a claim is made only from an archive of its own namespace";
const EARLIER: &str = "a refusal of an earlier claim of the same name";

/// A `ProvisioningFailed` event about the claim `default/back` of UID `uid`, as the
/// controller publishes it.
async fn failed(client: &kube::Client, uid: &str, action: &str, note: &str) {
    let event: Event = serde_json::from_value(json!({
        "metadata": {"namespace": "default", "generateName": "back."},
        "eventTime": Timestamp::now().to_string(),
        "reportingController": "nfsprov-controller",
        "reportingInstance": "nfsprov-controller-0",
        "action": action,
        "reason": "ProvisioningFailed",
        "type": "Warning",
        "note": note,
        "regarding": {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "namespace": "default",
            "name": "back",
            "uid": uid,
        },
    }))
    .unwrap();
    Api::<Event>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &event)
        .await
        .unwrap();
}

fn target(client: kube::Client) -> Target {
    Target {
        client,
        namespace: "nfsprov-system".into(),
        provisioner: DEFAULT_PROVISIONER.into(),
        deployment: "nfsprov-controller".into(),
        lease: "nfsprov-controller".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_refusal_of_this_very_claim_ends_the_wait_before_its_time() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "back", "namespace": "default"},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    let made = claims.create(&PostParams::default(), &claim).await.unwrap();
    let uid = made.metadata.uid.unwrap();
    failed(&client, "an-earlier-uid", ACTION_REFUSE, EARLIER).await;
    failed(&client, &uid, "Provision", RETRIED).await;
    let checked = Checked {
        source: ArchiveSource {
            agent: "nfs1".into(),
            id: ArchivePath::parse("default/old/@20260101T000000.000000000Z").unwrap(),
        },
        namespace: "default".into(),
        name: "back".into(),
    };
    let target = target(client.clone());

    // Neither ends the wait: it runs to its deadline, and then says what this claim got.
    let waited = wait_bound(&target, &checked, &uid, Duration::from_secs(1))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        waited,
        format!("claim default/back is not Bound after 1s; the controller said: {RETRIED}")
    );

    // The refusal of this claim ends it, whatever the time left, in the controller's words.
    failed(&client, &uid, ACTION_REFUSE, REFUSED).await;
    let waited = wait_bound(&target, &checked, &uid, Duration::from_secs(3600))
        .await
        .unwrap_err()
        .to_string();
    assert_eq!(
        waited,
        format!("claim default/back stays Pending, refused by the controller: {REFUSED}")
    );
    harness.finish().await;
}

/// The plugin binary, as kubectl runs it, in its own thread so the test can act meanwhile.
fn plugin(args: Vec<String>, kubeconfig: &Path) -> std::thread::JoinHandle<Output> {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-nfsprov"));
    command.args(args).env("KUBECONFIG", kubeconfig);
    std::thread::spawn(move || command.output().expect("the plugin binary runs"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restore_wait_stops_at_the_controllers_refusal_of_the_claim_it_made() {
    let harness = Harness::start(HarnessOptions {
        agents: vec!["nfs1"],
        ..HarnessOptions::without_binder()
    })
    .await;
    let client = harness.client.clone();
    let kubeconfig = harness.kubeconfig();
    let class: StorageClass = serde_json::from_value(json!({
        "metadata": {"name": "nfs"},
        "provisioner": DEFAULT_PROVISIONER,
        "parameters": {"agents": "nfs1"},
    }))
    .unwrap();
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await
        .unwrap();

    // An archive of a volume of namespace default, on a real agent.
    let agent = harness.agent("nfs1");
    let volume = VolumePath::parse("default/old").unwrap();
    let owner = VolumeOwner {
        pvc_namespace: Some("default".into()),
        pvc_name: Some("old".into()),
        pv_name: None,
    };
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 20,
        owner,
        ..Default::default()
    };
    agent
        .client()
        .create_volume(&volume, &request, None)
        .await
        .unwrap();
    agent
        .client()
        .archive_volume(&volume, None, None)
        .await
        .unwrap();
    let archives = agent.client().list_archives(None).await.unwrap();
    let [archive] = archives.as_slice() else {
        panic!("one archive: {archives:?}");
    };
    let agents = harness.agents_dir();
    // Left by an earlier claim of the same name.
    failed(&client, "an-earlier-uid", ACTION_REFUSE, EARLIER).await;

    let id = archive.id.to_string();
    let run = plugin(
        [
            "restore",
            "nfs1",
            id.as_str(),
            "--to",
            "default/back",
            "--class",
            "nfs",
            "--wait",
            "--agents-dir",
            agents.to_str().unwrap(),
        ]
        .map(str::to_owned)
        .to_vec(),
        &kubeconfig,
    );
    // Standing in for the controller: once the claim is there, a failure it retries,
    // then its refusal for good.
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let made = await_condition(
        claims.clone(),
        "back",
        |c: Option<&PersistentVolumeClaim>| c.is_some(),
    )
    .await
    .unwrap()
    .unwrap();
    let uid = made.metadata.uid.unwrap();
    failed(&client, &uid, "Provision", RETRIED).await;
    failed(&client, &uid, ACTION_REFUSE, REFUSED).await;

    let out = tokio::task::spawn_blocking(move || run.join().unwrap())
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert_eq!(
        stderr.trim_end(),
        format!("error: claim default/back stays Pending, refused by the controller: {REFUSED}")
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    // The claim stays for the controller to make once it or its class changes.
    let claim = claims.get("back").await.unwrap();
    assert_eq!(claim.metadata.uid.as_deref(), Some(uid.as_str()));
    harness.finish().await;
}
