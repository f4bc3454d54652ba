//! The orphan check: per agent, directories that no PV points to and PVs whose directory is
//! gone. A claim deleted between the agent's create and the PV's create, or a label used in
//! `pathPattern` that changed between two attempts, leaves a directory nothing refers to;
//! an administrator's `rm -rf` leaves a PV pointing at nothing. Both are reported (metrics
//! per agent, a log line); the claim of a bound PV whose directory is gone learns it from
//! the usage and health poll (`VolumeConditionAbnormal`, reason `missing`), which asks every
//! bound volume each minute, not from this check. With clean-up on,
//! orphaned directories are archived, never deleted, and only after the API server itself
//! (not the cache) confirms that no PV holds them and no claim can still get them.
//! Runs only where the controllers run, that is on the leader. What counts as orphaned is
//! decided by `nfsprov_vocabulary::orphans`, the rules `kubectl nfsprov orphans` shares.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use nfsprov_api_types::VolumeOwner;
use nfsprov_vocabulary::orphans::{Finding, Listing, PvPointer, expects_directory};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use crate::agents::{Agent, request_id};
use crate::config::OrphanSettings;
use crate::context::{Context, stopped};
use crate::objects::{ANN_AGENT, ANN_PATH, CachedVolume, is_ours, phase, pv_name_for};

/// The pointer of one of our cached PVs that records its agent and path.
fn pointer_of(pv: &CachedVolume) -> Option<PvPointer> {
    let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    Some(PvPointer {
        pv: pv.metadata.name.clone()?,
        agent: pv.recorded.agent.as_deref()?.to_owned(),
        path: pv.recorded.path.as_deref()?.to_owned(),
        claim: claim.and_then(|c| Some(format!("{}/{}", c.namespace.as_ref()?, c.name.as_ref()?))),
        expects_directory: expects_directory(phase(pv), pv.metadata.deletion_timestamp.is_some()),
    })
}

/// Why an unreferenced directory is left alone, when it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Keep {
    /// The API server has a PV pointing to it (the cache had not seen it yet).
    PvExists(String),
    /// Its claim still exists, unbound: the provisioner may still make its PV.
    ClaimPending(String),
}

/// Asks the API server, not the cache, whether `path` on `agent` may still belong to a
/// PV: the claim it was made for still exists (same uid) and is not bound yet, or the PV
/// the agent recorded as owner exists and points to it. The claim is asked first: a PV is
/// made before its claim is bound, so a claim seen bound means its PV, if it still
/// exists, is visible to the second request. Errors keep the directory.
pub(crate) async fn still_wanted(
    ctx: &Context,
    agent: &str,
    path: &str,
    owner: &VolumeOwner,
) -> Result<Option<Keep>, kube::Error> {
    if let (Some(namespace), Some(name)) = (&owner.pvc_namespace, &owner.pvc_name) {
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), namespace);
        if let Some(claim) = claims.get_opt(name).await? {
            let same_claim = match (&owner.pv_name, &claim.metadata.uid) {
                (Some(pv_name), Some(uid)) => *pv_name == pv_name_for(uid),
                // No PV name recorded: the claim's name is all there is to go by.
                (None, _) => true,
                (Some(_), None) => false,
            };
            let bound = claim
                .spec
                .as_ref()
                .and_then(|s| s.volume_name.as_deref())
                .is_some_and(|v| !v.is_empty());
            if same_claim && !bound {
                return Ok(Some(Keep::ClaimPending(format!("{namespace}/{name}"))));
            }
        }
    }
    if let Some(pv_name) = &owner.pv_name {
        let volumes: Api<PersistentVolume> = Api::all(ctx.client.clone());
        if let Some(pv) = volumes.get_opt(pv_name).await?
            && points_to(&pv, agent, path)
        {
            return Ok(Some(Keep::PvExists(pv_name.clone())));
        }
    }
    Ok(None)
}

/// Whether `pv` holds `path` on `agent`: by our annotations, or, for a PV being adopted
/// from another provisioner (the agent has adopted its directory, the PV does not carry
/// our annotations yet), by its NFS path ending in the volume's path.
fn points_to(pv: &PersistentVolume, agent: &str, path: &str) -> bool {
    let annotation = |key: &str| {
        pv.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .map(String::as_str)
    };
    match annotation(ANN_AGENT) {
        Some(recorded) => recorded == agent && annotation(ANN_PATH) == Some(path),
        None => pv
            .spec
            .as_ref()
            .and_then(|s| s.nfs.as_ref())
            .is_some_and(|nfs| {
                nfs.path
                    .trim_end_matches('/')
                    .strip_suffix(path)
                    .is_some_and(|export| export.ends_with('/'))
            }),
    }
}

/// The PVs of ours that point somewhere, from the cache.
fn pointers(ctx: &Context) -> Vec<PvPointer> {
    ctx.volumes
        .state()
        .iter()
        .filter(|pv| is_ours(pv, &ctx.provisioner))
        .filter_map(|pv| pointer_of(pv))
        .collect()
}

fn describe_owner(owner: &VolumeOwner) -> String {
    match (&owner.pvc_namespace, &owner.pvc_name, &owner.pv_name) {
        (Some(ns), Some(name), Some(pv)) => format!("claim {ns}/{name}, PV {pv}"),
        (Some(ns), Some(name), None) => format!("claim {ns}/{name}"),
        (_, _, Some(pv)) => format!("PV {pv}"),
        _ => "no recorded owner".to_owned(),
    }
}

/// Checks one agent; `None` when its volumes could not be listed.
async fn check_agent(ctx: &Context, agent: &Agent, settings: &OrphanSettings) -> Option<()> {
    let expected = pointers(ctx);
    let mut listing = Listing::new(agent.name(), &expected, settings.grace, Timestamp::now());
    if let Err(e) = agent
        .client()
        .for_each_volume_page(
            settings.page_size,
            Some(&request_id("orphan-check")),
            |page| listing.add(&page),
        )
        .await
    {
        warn!(agent = %agent.name(), error = %e, "orphan check: cannot list the agent's volumes");
        return None;
    }
    let findings = listing.finish(&pointers(ctx));
    let (mut unreferenced, mut missing, mut archived) = (0u64, 0u64, 0u64);
    for finding in findings {
        match finding {
            Finding::Unreferenced {
                path,
                owner,
                created_at,
                ..
            } => {
                let kept = match still_wanted(ctx, agent.name(), &path, &owner).await {
                    Ok(kept) => kept,
                    Err(e) => {
                        warn!(agent = %agent.name(), %path, error = %e,
                            "orphan check: cannot ask the API server about a directory; leaving it");
                        continue;
                    }
                };
                if let Some(keep) = kept {
                    info!(agent = %agent.name(), %path, reason = ?keep, "directory without a cached PV is still wanted");
                    continue;
                }
                unreferenced += 1;
                let owner = describe_owner(&owner);
                if !settings.archive {
                    warn!(agent = %agent.name(), %path, %owner, %created_at,
                        "orphaned directory: no PV points to it (archive it with --archive-orphans, or remove it on the NFS server)");
                    continue;
                }
                let Ok(volume_path) = nfsprov_api_types::VolumePath::parse(&path) else {
                    continue;
                };
                match agent
                    .client()
                    .archive_volume(&volume_path, None, Some(&request_id("orphan-archive")))
                    .await
                {
                    Ok(result) => {
                        archived += 1;
                        warn!(agent = %agent.name(), %path, %owner, archive = %result.archive_path,
                            "orphaned directory archived");
                    }
                    Err(e) => {
                        warn!(agent = %agent.name(), %path, %owner, error = %e,
                            "orphaned directory could not be archived");
                    }
                }
            }
            Finding::Missing {
                path, pv, claim, ..
            } => {
                missing += 1;
                warn!(agent = %agent.name(), %path, %pv, claim = claim.as_deref().unwrap_or("-"),
                    "PV points to a directory its agent does not have");
            }
        }
    }
    // What is left unarchived is still orphaned.
    ctx.metrics
        .set_orphans(agent.name(), unreferenced - archived, missing);
    // Counted even when zero, so the series exists from the first check on.
    ctx.metrics.orphans_archived(agent.name(), archived);
    Some(())
}

/// Checks every agent once.
pub(crate) async fn check_once(ctx: &Context, settings: &OrphanSettings) {
    for agent in ctx.agents.all() {
        check_agent(ctx, &agent, settings).await;
    }
}

/// Checks every `settings.every` until `shutdown` turns true (or the future is dropped,
/// as when the Lease is lost). The first check comes one interval after the caches are
/// synced, so a restart or handover adds nothing to the initial sync.
pub(crate) async fn run(
    ctx: Arc<Context>,
    settings: OrphanSettings,
    shutdown: watch::Receiver<bool>,
) {
    let work = async {
        if ctx.volumes.wait_until_ready().await.is_err() {
            return;
        }
        info!(every = ?settings.every, grace = ?settings.grace, archive = settings.archive, "checking for orphans");
        let mut interval =
            tokio::time::interval_at(Instant::now() + settings.every, settings.every);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            interval.tick().await;
            check_once(&ctx, &settings).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = stopped(shutdown) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_pv_points_to_a_directory_by_our_annotations_or_while_adopted_by_its_nfs_path() {
        let pv = |annotations: serde_json::Value, nfs_path: &str| -> PersistentVolume {
            serde_json::from_value(json!({
                "metadata": {"name": "pvc-1", "annotations": annotations},
                "spec": {"nfs": {"server": "nfs.example", "path": nfs_path}},
            }))
            .unwrap()
        };
        let ours = pv(
            json!({"nfsprov.dev/agent": "nfs1", "nfsprov.dev/path": "ns/a"}),
            "/srv/nfs/ns/a",
        );
        assert!(points_to(&ours, "nfs1", "ns/a"));
        assert!(!points_to(&ours, "nfs2", "ns/a"));
        assert!(!points_to(&ours, "nfs1", "ns/b"));
        // Not adopted yet: only the NFS path says where its data is.
        let adopting = pv(json!({}), "/srv/nfs/ns-a-pvc-1/");
        assert!(points_to(&adopting, "nfs1", "ns-a-pvc-1"));
        assert!(
            !points_to(&adopting, "nfs1", "a-pvc-1"),
            "whole components only"
        );
        assert!(!points_to(&adopting, "nfs1", "ns-a-pvc-2"));
    }

    #[test]
    fn cached_pvs_expect_their_directory_while_bound_or_available() {
        let cached = |phase: &str, deleting: bool| -> CachedVolume {
            let mut meta = json!({"name": "pvc-1", "annotations": {
                "nfsprov.dev/agent": "nfs1", "nfsprov.dev/path": "ns/a",
                "pv.kubernetes.io/provisioned-by": "nfsprov.dev/nfs"}});
            if deleting {
                meta["deletionTimestamp"] = json!("2026-11-24T11:00:00Z");
            }
            serde_json::from_value(json!({
                "metadata": meta,
                "spec": {"claimRef": {"namespace": "ns", "name": "a", "uid": "1"}},
                "status": {"phase": phase},
            }))
            .unwrap()
        };
        let of = |phase, deleting| pointer_of(&cached(phase, deleting)).unwrap();
        assert!(of("Bound", false).expects_directory);
        assert!(of("Available", false).expects_directory);
        assert!(!of("Released", false).expects_directory);
        assert!(!of("Failed", false).expects_directory);
        assert!(!of("Bound", true).expects_directory);
        let bound = of("Bound", false);
        assert_eq!(
            (
                bound.agent.as_str(),
                bound.path.as_str(),
                bound.claim.as_deref()
            ),
            ("nfs1", "ns/a", Some("ns/a"))
        );
    }
}
