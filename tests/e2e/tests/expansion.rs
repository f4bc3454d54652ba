//! Online expansion through the whole system: a user raises a bound claim's request, the
//! API's expand controller waits for an external resizer (`ExternalExpanding`), and the
//! controller raises the quota through the agent, then reports the new size on the PV
//! and the claim. Runs against the simulator, or a real cluster with `E2E_KUBECONFIG`.

use std::time::Duration;

use nfsprov_agent_testkit::LoopBtrfs;
use nfsprov_api_types::VolumePath;
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::system::{AgentSpec, System};
use serde_json::json;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const GIB: u64 = 1 << 30;
const WAIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_grows_from_1gi_to_2gi_with_its_btrfs_quota() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let btrfs = LoopBtrfs::new(512, true)?;
    let spec = AgentSpec {
        name: "nfs1".into(),
        root: Some(btrfs.root()),
        settings: "[quota]\nbackend = \"btrfs\"".into(),
    };
    let system = System::start_with_agents(
        KubeApi::start().await?,
        &[spec],
        1,
        &["--leader-elect=false"],
    )
    .await?;
    let agent = &system.agents[0];
    system
        .class_with_expansion(
            "e2e-grow",
            json!({"agent": "nfs1", "onDelete": "delete", "quota": "enforce", "pathPattern": "${.PVC.name}"}),
            true,
        )
        .await?;
    system
        .claim("grow", "e2e-grow", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("grow", WAIT).await?;
    let volume_name = volume.metadata.name.clone().unwrap_or_default();
    let directory = agent.root.join("grow");
    assert_eq!(btrfs.qgroup_limit(&directory)?, Some(GIB));

    system.request_storage("grow", "2Gi").await?;
    system
        .wait_for_size("grow", &volume_name, "2Gi", WAIT)
        .await?;
    assert_eq!(
        btrfs.qgroup_limit(&directory)?,
        Some(2 * GIB),
        "quota raised"
    );
    let recorded = agent
        .process
        .client()?
        .get_volume(&VolumePath::parse("grow")?, None)
        .await?
        .expect("the volume exists");
    assert_eq!(recorded.capacity_bytes, 2 * GIB);
    assert!(recorded.quota_enforced);
    system
        .wait_for_event("grow", "ExternalExpanding", "external controller")
        .await?;
    system
        .wait_for_event("grow", "VolumeResizeSuccessful", "")
        .await?;
    let status = system
        .claims()
        .get("grow")
        .await?
        .status
        .unwrap_or_default();
    assert!(
        status
            .conditions
            .unwrap_or_default()
            .iter()
            .all(|c| c.type_ != "Resizing"),
        "no Resizing condition left"
    );

    // Back below the new capacity: the API itself refuses.
    let shrink = system.request_storage("grow", "1Gi").await;
    assert!(
        matches!(&shrink, Err(kube::Error::Api(e)) if e.code == 422),
        "{shrink:?}"
    );

    // Deleting the claim deletes the subvolume with its quota.
    system
        .delete_claim_and_wait_for_volume("grow", &volume_name)
        .await?;
    assert!(!directory.exists());
    assert!(!btrfs.subvolumes()?.contains("grow"));
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn without_a_quota_backend_expansion_says_nothing_is_enforced_and_enforce_fails()
-> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    system
        .class_with_expansion(
            "e2e-loose",
            json!({"agent": "nfs1", "onDelete": "delete", "pathPattern": "${.PVC.name}"}),
            true,
        )
        .await?;
    system
        .claim("loose", "e2e-loose", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("loose", WAIT).await?;
    let volume_name = volume.metadata.name.clone().unwrap_or_default();
    system.request_storage("loose", "2Gi").await?;
    system
        .wait_for_size("loose", &volume_name, "2Gi", WAIT)
        .await?;
    system
        .wait_for_event("loose", "VolumeResizeSuccessful", "not enforced")
        .await?;

    // A class that requires enforcement fails its claims on this agent, creating nothing.
    system
        .class(
            "e2e-strict",
            json!({"agent": "nfs1", "quota": "enforce", "pathPattern": "${.PVC.name}"}),
        )
        .await?;
    system
        .claim("strict", "e2e-strict", json!({}), json!({}))
        .await?;
    system
        .wait_for_event("strict", "ProvisioningFailed", "cannot enforce quotas")
        .await?;
    assert!(!system.agents[0].root.join("strict").exists());
    Ok(())
}
