//! A controller one version older than its agent, against the mock agent answering as a
//! newer agent would: what the agent added is read (as `Unknown`, or ignored), never
//! taken for an agent that cannot be reached.

use nfsprov_api_types::client::CloneOutcome;
use nfsprov_api_types::{
    CloneMethod, CloneVolumeRequest, CreateVolumeRequest, ErrorCode, QuotaBackend, QuotaPolicy,
    VolumeOwner, VolumePath,
};

use crate::tests::mock_agent::MockAgent;

const GI: u64 = 1 << 30;

#[tokio::test]
async fn a_newer_agents_answers_are_read_and_its_unknown_values_shown_as_unknown() {
    let mock = MockAgent::start("newer").await;
    mock.enforce_quotas(true);
    mock.answer_as_newer();
    let registry = mock.registry();
    let agent = registry.get("newer").expect("configured");

    let capabilities = agent
        .capabilities("skew-info")
        .await
        .expect("the info of a newer agent is read");
    assert_eq!(capabilities.quota, QuotaBackend::Unknown);
    assert_eq!(capabilities.quota.to_string(), "unknown");
    assert!(capabilities.quota_enforced);

    mock.insert_volume(
        "ns/source",
        CreateVolumeRequest {
            capacity_bytes: GI,
            ..CreateVolumeRequest::default()
        },
    );
    let target = VolumePath::parse("ns/copy").unwrap();
    let owner = VolumeOwner {
        pvc_namespace: Some("ns".into()),
        pvc_name: Some("copy".into()),
        pv_name: Some("pvc-copy".into()),
    };
    let request = CloneVolumeRequest {
        source: VolumePath::parse("ns/source").unwrap(),
        capacity_bytes: GI,
        owner: owner.clone(),
        quota: QuotaPolicy::BestEffort,
        export: None,
    };
    let outcome = agent
        .client()
        .clone_volume(&target, &request, Some("skew-clone"))
        .await
        .expect("a clone answered with a newer method is read");
    let CloneOutcome::Ready(made) = outcome else {
        panic!("the mock makes clones at once: {outcome:?}");
    };
    assert!(made.created);
    let origin = made
        .volume
        .clone
        .expect("the clone says where it came from");
    assert_eq!(origin.method, CloneMethod::Unknown);
    assert_eq!(origin.method.to_string(), "unknown");
    assert_eq!(origin.source.as_str(), "ns/source");
    // The owner's new field is ignored, the known ones kept.
    assert_eq!(made.volume.owner, owner);
    let fetched = agent
        .client()
        .get_volume(&target, Some("skew-get"))
        .await
        .expect("a volume answered with new fields is read")
        .expect("there");
    assert_eq!(fetched.owner, owner);
    assert_eq!(fetched.capacity_bytes, GI);
}

#[tokio::test]
async fn an_error_code_newer_than_the_controller_is_judged_by_its_status() {
    let mock = MockAgent::start("newer").await;
    mock.insert_volume(
        "ns/claim",
        CreateVolumeRequest {
            capacity_bytes: GI,
            ..CreateVolumeRequest::default()
        },
    );
    let registry = mock.registry();
    let agent = registry.get("newer").expect("configured");
    let path = VolumePath::parse("ns/claim").unwrap();

    mock.fail_calls_newer("PATCH", 409);
    let refused = agent
        .client()
        .resize_volume(&path, 2 * GI, Some("skew-refused"))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Some(ErrorCode::Unknown), "{refused}");
    assert!(!refused.is_transient(), "{refused}");
    let said = refused.to_string();
    assert!(
        said.contains("409") && said.contains("injected failure") && !said.contains("unreachable"),
        "{said}"
    );

    mock.fail_calls_newer("PATCH", 503);
    let passing = agent
        .client()
        .resize_volume(&path, 2 * GI, Some("skew-passing"))
        .await
        .unwrap_err();
    assert_eq!(passing.code(), Some(ErrorCode::Unknown), "{passing}");
    assert!(passing.is_transient(), "{passing}");
}
