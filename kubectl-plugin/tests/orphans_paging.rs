//! `orphans` against a real agent over HTTPS, paging by less than the agent holds: a
//! volume without a PV on the first page and a PV without a volume are both found, and
//! nothing else.

use k8s_openapi::api::core::v1::PersistentVolume;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::{CreateVolumeRequest, VolumePath};
use nfsprov_kubectl::{OrphanKind, check_agent, pointers};
use serde_json::json;

fn pv(name: &str, path: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"nfsprov.dev/agent": "test", "nfsprov.dev/path": path}},
        "spec": {"claimRef": {"namespace": "ns", "name": name}},
        "status": {"phase": "Bound"},
    }))
    .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn orphans_are_found_across_pages() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let client = agent.client();
    let paths: Vec<String> = (0..7).map(|i| format!("ns/claim-{i}")).collect();
    for path in &paths {
        client
            .create_volume(
                &VolumePath::parse(path).unwrap(),
                &CreateVolumeRequest {
                    capacity_bytes: 1 << 20,
                    ..Default::default()
                },
                None,
            )
            .await
            .unwrap();
    }
    // Every volume but the first has its PV, and one PV points to nothing.
    let mut volumes: Vec<PersistentVolume> = paths[1..]
        .iter()
        .enumerate()
        .map(|(i, path)| pv(&format!("pv-{i}"), path))
        .collect();
    volumes.push(pv("pv-lost", "ns/lost"));
    let pointers = pointers(&volumes);

    for page_size in [1, 2, 3, 7, 1000] {
        let found = check_agent(&client, "test", &pointers, page_size)
            .await
            .unwrap();
        let found: Vec<(OrphanKind, &str)> =
            found.iter().map(|o| (o.kind, o.path.as_str())).collect();
        assert_eq!(
            found,
            [
                (OrphanKind::NoPv, "ns/claim-0"),
                (OrphanKind::NoDirectory, "ns/lost")
            ],
            "pages of {page_size}"
        );
    }
}
