//! The PVs `orphans` compares are read a page at a time from the API (here the simulator,
//! in-process): over several pages every PV of this provisioner is handed over once, and
//! those of another provisioner are not.

use std::collections::BTreeSet;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use kube::api::PostParams;
use nfsprov_kubectl::{PV_PAGE, Target};
use nfsprov_test_harness::{Harness, HarnessOptions};
use serde_json::json;

fn pv(name: &str, provisioner: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": provisioner}},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "nfs": {"server": "127.0.0.1", "path": format!("/export/{name}")},
        },
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn every_pv_of_ours_is_read_once_across_pages() {
    let harness = Harness::start(HarnessOptions::without_binder()).await;
    let client = harness.client.clone();
    let api: Api<PersistentVolume> = Api::all(client.clone());
    // Two and a half pages of ours, interleaved with others' by name.
    let ours = PV_PAGE as usize * 5 / 2;
    let made: Vec<(String, &str)> = (0..ours)
        .map(|i| (format!("pv-{i:05}-a"), "nfsprov.dev/nfs"))
        .chain((0..ours / 3).map(|i| (format!("pv-{:05}-b", i * 3), "other.example/nfs")))
        .collect();
    futures::stream::iter(&made)
        .map(|(name, provisioner)| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pv(name, provisioner))
                    .await
            }
        })
        .buffer_unordered(32)
        .try_collect::<Vec<_>>()
        .await
        .unwrap();
    let target = Target {
        client,
        namespace: "nfsprov".into(),
        provisioner: "nfsprov.dev/nfs".into(),
        deployment: "nfsprov-controller".into(),
        lease: "nfsprov-controller".into(),
    };
    let mut pages = 0;
    let mut seen = Vec::new();
    target
        .for_each_volume_page(|page| {
            pages += 1;
            assert!(page.len() <= PV_PAGE as usize);
            seen.extend(page.into_iter().map(|pv| pv.metadata.name.unwrap()));
        })
        .await
        .unwrap();
    assert!(pages >= 3, "{pages} pages");
    let expected: Vec<String> = made
        .iter()
        .filter(|(_, provisioner)| *provisioner == "nfsprov.dev/nfs")
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(seen.len(), expected.len(), "none twice");
    assert_eq!(
        seen.into_iter().collect::<BTreeSet<_>>(),
        expected.into_iter().collect::<BTreeSet<_>>()
    );
    harness.finish().await;
}
