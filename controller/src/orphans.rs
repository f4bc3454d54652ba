//! The orphan check: per agent, directories that no PV points to and PVs whose directory is
//! gone. A claim deleted between the agent's create and the PV's create, or a label used in
//! `pathPattern` that changed between two attempts, leaves a directory nothing refers to;
//! an administrator's `rm -rf` leaves a PV pointing at nothing. Both are reported (metrics
//! per agent, a log line, an event on the PV where there is one). With clean-up on,
//! orphaned directories are archived, never deleted, and only after the API server itself
//! (not the cache) confirms that no PV holds them and no claim can still get them.
//! Runs only where the controllers run, that is on the leader.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::runtime::events::EventType;
use nfsprov_api_types::{Volume, VolumeOwner};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{info, warn};

use crate::agents::{Agent, request_id};
use crate::config::OrphanSettings;
use crate::context::{Context, stopped};
use crate::objects::{ANN_AGENT, ANN_PATH, CachedVolume, is_ours, phase, pv_name_for};

pub const REASON_DIRECTORY_MISSING: &str = "VolumeDirectoryMissing";
const ACTION: &str = "CheckOrphans";

/// Where one PV says its data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvPointer {
    pub pv: String,
    pub agent: String,
    pub path: String,
    /// `namespace/name` of the claim it is bound to, if any.
    pub claim: Option<String>,
    /// Whether its directory is expected to exist now ([`expects_directory`]).
    pub expects_directory: bool,
}

impl PvPointer {
    /// The pointer of one of our cached PVs that records its agent and path.
    pub fn of_cached(pv: &CachedVolume) -> Option<Self> {
        let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        Some(Self {
            pv: pv.metadata.name.clone()?,
            agent: pv.recorded.agent.as_deref()?.to_owned(),
            path: pv.recorded.path.as_deref()?.to_owned(),
            claim: claim
                .and_then(|c| Some(format!("{}/{}", c.namespace.as_ref()?, c.name.as_ref()?))),
            expects_directory: expects_directory(
                phase(pv),
                pv.metadata.deletion_timestamp.is_some(),
            ),
        })
    }
}

/// Whether a PV in `phase` expects its directory to exist: not while it is Released or
/// being deleted, when the deletion path handles (and may already have removed) it.
pub fn expects_directory(phase: &str, being_deleted: bool) -> bool {
    !being_deleted && !matches!(phase, "Released" | "Failed")
}

/// One thing the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The agent holds this volume and no PV points to it.
    Unreferenced {
        agent: String,
        path: String,
        owner: VolumeOwner,
        created_at: String,
    },
    /// This PV points to a volume its agent does not hold.
    Missing {
        agent: String,
        path: String,
        pv: String,
        claim: Option<String>,
    },
}

/// Compares one agent's listing with the PVs that point to it: those known before the
/// listing was asked for (`expected`) and those known after it (`later`). Both protect
/// their directory (a PV made after a snapshot still does); only `expected` can be
/// reported missing, so a volume made after the listing never is. Volumes created less than `grace`
/// before `now` (or at an unreadable time) are left out: their PV may be on its way.
pub fn compare(
    agent: &str,
    listed: &[Volume],
    later: &[PvPointer],
    expected: &[PvPointer],
    grace: Duration,
    now: Timestamp,
) -> Vec<Finding> {
    let pointed: HashSet<&str> = later
        .iter()
        .chain(expected)
        .filter(|p| p.agent == agent)
        .map(|p| p.path.as_str())
        .collect();
    let held: HashSet<&str> = listed.iter().map(|v| v.path.as_str()).collect();
    let mut found: Vec<Finding> = listed
        .iter()
        .filter(|v| !pointed.contains(v.path.as_str()))
        .filter(|v| older_than(&v.created_at, grace, now))
        .map(|v| Finding::Unreferenced {
            agent: agent.to_owned(),
            path: v.path.to_string(),
            owner: v.owner.clone(),
            created_at: v.created_at.clone(),
        })
        .collect();
    found.extend(
        expected
            .iter()
            .filter(|p| p.agent == agent && p.expects_directory)
            .filter(|p| !held.contains(p.path.as_str()))
            .map(|p| Finding::Missing {
                agent: agent.to_owned(),
                path: p.path.clone(),
                pv: p.pv.clone(),
                claim: p.claim.clone(),
            }),
    );
    found
}

fn older_than(created_at: &str, grace: Duration, now: Timestamp) -> bool {
    let Ok(created) = created_at.parse::<Timestamp>() else {
        return false;
    };
    let age = now
        .as_millisecond()
        .saturating_sub(created.as_millisecond());
    u128::try_from(age).is_ok_and(|age| age >= grace.as_millis())
}

/// Why an unreferenced directory is left alone, when it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Keep {
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
pub async fn still_wanted(
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
        .filter_map(|pv| PvPointer::of_cached(pv))
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
async fn check_agent(
    ctx: &Context,
    agent: &Agent,
    settings: &OrphanSettings,
    warned: &mut HashSet<String>,
) -> Option<()> {
    let expected = pointers(ctx);
    let listed = match agent.list_volumes(&request_id("orphan-check")).await {
        Ok(listed) => listed,
        Err(e) => {
            warn!(agent = %agent.name(), error = %e, "orphan check: cannot list the agent's volumes");
            return None;
        }
    };
    let later = pointers(ctx);
    let findings = compare(
        agent.name(),
        &listed,
        &later,
        &expected,
        settings.grace,
        Timestamp::now(),
    );
    drop(listed);
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
                    .archive_volume(&volume_path, None, &request_id("orphan-archive"))
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
                if warned.insert(pv.clone()) {
                    let reference = k8s_openapi::api::core::v1::ObjectReference {
                        api_version: Some("v1".to_owned()),
                        kind: Some("PersistentVolume".to_owned()),
                        name: Some(pv.clone()),
                        ..Default::default()
                    };
                    ctx.event(
                        &reference,
                        EventType::Warning,
                        REASON_DIRECTORY_MISSING,
                        ACTION,
                        &format!(
                            "agent {} has no directory {path} for this volume; its data is gone or was moved on the NFS server",
                            agent.name()
                        ),
                    )
                    .await;
                }
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
pub async fn check_once(ctx: &Context, settings: &OrphanSettings, warned: &mut HashSet<String>) {
    for agent in ctx.agents.all() {
        check_agent(ctx, &agent, settings, warned).await;
    }
    // Forget warnings of PVs that are gone, so the set does not grow for ever.
    let live: HashSet<String> = ctx
        .volumes
        .state()
        .iter()
        .filter_map(|pv| pv.metadata.name.clone())
        .collect();
    warned.retain(|pv| live.contains(pv));
}

/// Checks every `settings.every` until `shutdown` turns true (or the future is dropped,
/// as when the Lease is lost). The first check comes one interval after the caches are
/// synced, so a restart or handover adds nothing to the initial sync.
pub async fn run(ctx: Arc<Context>, settings: OrphanSettings, shutdown: watch::Receiver<bool>) {
    let work = async {
        if ctx.volumes.wait_until_ready().await.is_err() {
            return;
        }
        info!(every = ?settings.every, grace = ?settings.grace, archive = settings.archive, "checking for orphans");
        let mut interval =
            tokio::time::interval_at(Instant::now() + settings.every, settings.every);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut warned = HashSet::new();
        loop {
            interval.tick().await;
            check_once(&ctx, &settings, &mut warned).await;
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

    fn volume(path: &str, created_at: &str) -> Volume {
        serde_json::from_value(json!({
            "path": path, "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
            "owner": {"pvc_namespace": "ns", "pvc_name": "old", "pv_name": "pvc-1"},
            "created_at": created_at,
        }))
        .unwrap()
    }

    fn pointer(pv: &str, agent: &str, path: &str, expects_directory: bool) -> PvPointer {
        PvPointer {
            pv: pv.into(),
            agent: agent.into(),
            path: path.into(),
            claim: Some(format!("ns/{pv}")),
            expects_directory,
        }
    }

    const NOW: &str = "2026-11-24T12:00:00Z";
    const OLD: &str = "2026-11-24T11:00:00Z";
    const GRACE: Duration = Duration::from_secs(600);

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    #[test]
    fn unreferenced_directories_and_missing_ones() {
        let listed = [volume("ns/kept", OLD), volume("ns/left", OLD)];
        let pvs = [
            pointer("pvc-kept", "nfs1", "ns/kept", true),
            pointer("pvc-gone", "nfs1", "ns/gone", true),
            // The same path on another agent is another directory.
            pointer("pvc-other", "nfs2", "ns/left", true),
        ];
        let found = compare("nfs1", &listed, &pvs, &pvs, GRACE, now());
        assert_eq!(
            found,
            [
                Finding::Unreferenced {
                    agent: "nfs1".into(),
                    path: "ns/left".into(),
                    owner: listed[1].owner.clone(),
                    created_at: OLD.into(),
                },
                Finding::Missing {
                    agent: "nfs1".into(),
                    path: "ns/gone".into(),
                    pv: "pvc-gone".into(),
                    claim: Some("ns/pvc-gone".into()),
                },
            ]
        );
    }

    #[test]
    fn young_and_undated_directories_are_never_reported() {
        let listed = [
            volume("ns/new", "2026-11-24T11:55:00Z"),
            volume("ns/odd", "not a time"),
            volume("ns/edge", "2026-11-24T11:50:00Z"),
        ];
        let found = compare("nfs1", &listed, &[], &[], GRACE, now());
        let paths: Vec<_> = found
            .iter()
            .map(|f| match f {
                Finding::Unreferenced { path, .. } => path.as_str(),
                Finding::Missing { path, .. } => path.as_str(),
            })
            .collect();
        assert_eq!(paths, ["ns/edge"], "exactly the grace period old counts");
    }

    #[test]
    fn a_pv_seen_only_after_the_listing_protects_but_is_not_missing() {
        // Seen after the listing: its directory may be newer than the listing.
        let late = pointer("pvc-late", "nfs1", "ns/late", true);
        let found = compare("nfs1", &[], std::slice::from_ref(&late), &[], GRACE, now());
        assert!(found.is_empty(), "{found:?}");
        // Its directory, listed, is referenced by it.
        let found = compare(
            "nfs1",
            &[volume("ns/late", OLD)],
            std::slice::from_ref(&late),
            &[],
            GRACE,
            now(),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn released_or_deleted_pvs_do_not_expect_their_directory() {
        let released = pointer("pvc-rel", "nfs1", "ns/rel", false);
        let found = compare(
            "nfs1",
            &[],
            std::slice::from_ref(&released),
            std::slice::from_ref(&released),
            GRACE,
            now(),
        );
        assert!(found.is_empty(), "{found:?}");
    }

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
        let of = |phase, deleting| PvPointer::of_cached(&cached(phase, deleting)).unwrap();
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
