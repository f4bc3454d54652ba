//! Every call to an agent goes through the client's one hook, which times and counts it
//! under its operation: no call of the controller's escapes the metrics.

use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, VolumePath};

use crate::tests::mock_agent::MockAgent;

const GI: u64 = 1 << 30;

#[tokio::test]
async fn each_call_is_counted_under_its_operation_and_a_missing_volume_is_no_error() {
    let mock = MockAgent::start("counted").await;
    let registry = mock.registry();
    let agent = registry.get("counted").expect("configured");
    let client = agent.client();
    let path = VolumePath::parse("ns/claim").unwrap();

    let missing = client.get_volume(&path, Some("rid-get")).await.unwrap();
    assert_eq!(missing, None);
    let request = CreateVolumeRequest {
        capacity_bytes: GI,
        ..CreateVolumeRequest::default()
    };
    client
        .create_volume(&path, &request, Some("rid-create"))
        .await
        .unwrap();
    mock.fail_calls(Some(("PATCH", ErrorCode::NotReady)));
    client
        .resize_volume(&path, 2 * GI, Some("rid-resize"))
        .await
        .unwrap_err();

    let text = registry.metrics().encode().unwrap();
    for expected in [
        "nfsprov_agent_request_duration_seconds_count{agent=\"counted\",operation=\"get\"} 1",
        "nfsprov_agent_request_duration_seconds_count{agent=\"counted\",operation=\"create\"} 1",
        "nfsprov_agent_request_duration_seconds_count{agent=\"counted\",operation=\"resize\"} 1",
        "nfsprov_agent_request_errors_total{agent=\"counted\",operation=\"resize\",code=\"not_ready\"} 1",
    ] {
        assert!(text.contains(expected), "{expected} in\n{text}");
    }
    assert!(
        !text.contains("operation=\"get\",code="),
        "a volume the agent does not hold is an answer, not an error:\n{text}"
    );
}
