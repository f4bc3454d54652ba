//! `agents` and `doctor` read an agent's volumes through pages against a real agent over
//! HTTPS: every volume is counted once whatever the page size, and only the volumes the
//! command asked for are kept.

use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::{CreateVolumeRequest, Volume, VolumePath};
use nfsprov_kubectl::list_volumes;

#[tokio::test(flavor = "multi_thread")]
async fn volumes_are_counted_across_pages_and_only_the_asked_for_are_kept() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let client = agent.client();
    // Made out of order, so the pages' order is the agent's, not the test's.
    let paths: Vec<String> = (0..9)
        .map(|i| format!("ns-{}/claim-{i}", (i * 4) % 9))
        .collect();
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
    let wanted = ["ns-0/claim-0", "ns-8/claim-2", "ns-4/claim-1"];
    let keep = |agent: &str, volume: &Volume| {
        assert_eq!(agent, "test");
        wanted.contains(&volume.path.as_str())
    };
    for page_size in [1, 2, 4, 9, 1000] {
        let listing = list_volumes(&client, "test", page_size, &keep)
            .await
            .unwrap();
        assert_eq!(listing.count, paths.len(), "pages of {page_size}");
        let kept: Vec<&str> = listing.kept.iter().map(|v| v.path.as_str()).collect();
        assert_eq!(
            kept,
            ["ns-0/claim-0", "ns-4/claim-1", "ns-8/claim-2"],
            "pages of {page_size}"
        );
    }
    let counted = list_volumes(&client, "test", 2, &|_, _| false)
        .await
        .unwrap();
    assert_eq!(
        (counted.count, counted.kept.len()),
        (paths.len(), 0),
        "counting keeps nothing"
    );
}
