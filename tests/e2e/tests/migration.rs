//! Taking over from nfs-subdir-external-provisioner with `--additional-provisioner-names`,
//! and rolling back before adoption: the PVs the old provisioner made stay its own (no
//! finalizer of ours, no deletion attempt, no VolumeFailedDelete) until they are adopted,
//! so scaling the old provisioner back up finds them as it left them and nothing is stuck
//! Terminating. The old provisioner is simulated by what it leaves in the API: PVs with
//! its provisioned-by annotation, and, once back, deleting its released PVs.
//!
//! Runs on the simulator, and on the real API server under `tests/real-api`.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::DeleteParams;
use kube::runtime::wait::{await_condition, conditions};
use nfsprov_e2e::system::System;
use serde_json::json;

const BIND: Duration = Duration::from_secs(60);
const OUR_FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Makes the claim `name` of the old class and the PV the old provisioner made for it,
/// with its directory on the export; the PV's name and the directory.
fn has_our_finalizer(pv: &PersistentVolume) -> bool {
    pv.metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == OUR_FINALIZER)
}

#[tokio::test(flavor = "multi_thread")]
async fn old_volumes_stay_the_old_provisioners_until_adopted_and_a_rollback_leaves_nothing_stuck()
-> anyhow::Result<()> {
    let mut system = System::start(&["nfs1"], 0, &[]).await?;
    let replaced = format!("{}-subdir", system.names.provisioner);
    system.legacy_class("e2e-old", &replaced).await?;
    // Step 1: what the old provisioner left: one volume in use, one about to be released.
    let (kept, kept_dir) = system
        .legacy_volume(&replaced, "e2e-old", "kept", BIND)
        .await?;
    let (released, released_dir) = system
        .legacy_volume(&replaced, "e2e-old", "released", BIND)
        .await?;

    // Step 2: the old provisioner scaled to zero, this controller deployed with its name.
    system
        .start_controller(&[
            "--leader-elect=false",
            &format!("--additional-provisioner-names={replaced}"),
        ])
        .await?;
    system
        .claims()
        .delete("released", &DeleteParams::default())
        .await?;
    let is_released = |pv: Option<&PersistentVolume>| {
        pv.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            == Some("Released")
    };
    tokio::time::timeout(
        BIND,
        await_condition(system.volumes(), &released, is_released),
    )
    .await??;
    // The old class provisions again at once, under this controller's own name; that
    // volume goes through the controller's whole life (bound, released, its data handled,
    // the PV gone) after the old PVs changed, on the same watch, so the controller has
    // seen them by the time it is done.
    system
        .claim("fresh", "e2e-old", json!({}), json!({}))
        .await?;
    let fresh = system.bound_volume("fresh", BIND).await?;
    let fresh_name = fresh.metadata.name.clone().unwrap_or_default();
    assert_eq!(
        fresh
            .metadata
            .annotations
            .unwrap_or_default()
            .get("pv.kubernetes.io/provisioned-by"),
        Some(&system.names.provisioner)
    );
    system
        .delete_claim_and_wait_for_volume("fresh", &fresh_name)
        .await?;

    // The old PVs are as the old provisioner left them: no finalizer of ours, no deletion
    // attempted (the released one is still there, its directory too), no failure events.
    for name in [&kept, &released] {
        let pv = system.volumes().get(name).await?;
        assert!(
            !has_our_finalizer(&pv),
            "{name}: {:?}",
            pv.metadata.finalizers
        );
        assert!(pv.metadata.deletion_timestamp.is_none(), "{name}");
        let events = system.events_about(name).await?;
        assert!(
            events
                .iter()
                .all(|(reason, _)| reason != "VolumeFailedDelete"),
            "{name}: {events:?}"
        );
    }
    for dir in [&kept_dir, &released_dir] {
        assert!(dir.is_dir(), "{} still there", dir.display());
    }

    // Rollback before adoption: this controller scaled to zero, the old provisioner back.
    // It deletes its released PV, which goes at once: nothing of ours holds it.
    system.controllers.clear();
    let uid = system
        .volumes()
        .get(&released)
        .await?
        .metadata
        .uid
        .unwrap_or_default();
    system
        .volumes()
        .delete(&released, &DeleteParams::default())
        .await?;
    tokio::time::timeout(
        BIND,
        await_condition(system.volumes(), &released, conditions::is_deleted(&uid)),
    )
    .await
    .map_err(|_| anyhow::anyhow!("PV {released} stuck Terminating after the rollback"))??;

    // Forward again: once adopted, the PV is this controller's, finalizer included.
    system
        .start_controller(&[
            "--leader-elect=false",
            &format!("--additional-provisioner-names={replaced}"),
        ])
        .await?;
    let kubeconfig = system.api.kubeconfig().display().to_string();
    let agents_dir = system.agents_dir.display().to_string();
    let adopt = tokio::process::Command::new(nfsprov_e2e::binaries::binary("kubectl-nfsprov")?)
        .args([
            "adopt",
            "--from",
            &replaced,
            "--agent",
            "nfs1",
            "--agents-dir",
            &agents_dir,
            "--provisioner",
            &system.names.provisioner,
            "--kubeconfig",
            &kubeconfig,
        ])
        .output()
        .await?;
    anyhow::ensure!(
        adopt.status.success(),
        "adopt: {}",
        String::from_utf8_lossy(&adopt.stderr)
    );
    tokio::time::timeout(
        BIND,
        await_condition(system.volumes(), &kept, |pv: Option<&PersistentVolume>| {
            pv.is_some_and(has_our_finalizer)
        }),
    )
    .await
    .map_err(|_| {
        anyhow::anyhow!(
            "the adopted PV {kept} never got our finalizer\n{}",
            system.logs()
        )
    })??;
    Ok(())
}
