//! Snapshot schedules: every `interval`, a Snapshot of each Bound claim the schedule's
//! selector picks, labelled with the schedule's name and owned by it; then, per claim,
//! all but the newest `keep` and those older than `maxAge` are deleted (their own
//! `deletionPolicy` then says what becomes of the agent's copy).
//!
//! A run is due `interval` after the last one (`status.lastRun`), or at once for a new
//! schedule. A run missed while the controller was down is taken once when it is back,
//! and the next is due an interval after that, never once per missed interval. The
//! Snapshots of a run are named after the time it started, recorded as
//! `status.currentRun` before the first is made, so a run repeated after a crash makes
//! the same names, not a second set.

use std::time::Duration;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::Selector;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Resource, ResourceExt};
use nfsprov_vocabulary::snapshots::{
    API_VERSION, LABEL_SCHEDULE, SCHEDULE_KIND, Snapshot, SnapshotSchedule, SnapshotSource,
    SnapshotSpec, parse_interval, schedule_labels,
};
use serde_json::json;
use tracing::info;

use crate::context::{Context, Error};
use crate::objects::claim_is_bound;

pub(crate) const REASON_FAILED: &str = "SnapshotScheduleFailed";
const ACTION: &str = "Schedule";
/// The longest name the API accepts for a Snapshot (a DNS subdomain).
const MAX_NAME: usize = 253;

/// `schedule/namespace/name`: the schedule's key among per-object state such as backoff.
pub(crate) fn state_key(schedule: &SnapshotSchedule) -> String {
    format!(
        "schedule/{}/{}",
        schedule.namespace().unwrap_or_default(),
        schedule.name_any()
    )
}

/// What the spec asks for, read.
#[derive(Debug)]
struct Wanted {
    interval: SignedDuration,
    max_age: Option<SignedDuration>,
}

fn wanted(schedule: &SnapshotSchedule) -> Result<Wanted, String> {
    let signed = |raw: &str, field: &str| {
        parse_interval(raw)
            .map_err(|e| format!("spec.{field}: {e}"))
            .and_then(|d| SignedDuration::try_from(d).map_err(|e| format!("spec.{field}: {e}")))
    };
    Ok(Wanted {
        interval: signed(&schedule.spec.interval, "interval")?,
        max_age: schedule
            .spec
            .max_age
            .as_deref()
            .map(|raw| signed(raw, "maxAge"))
            .transpose()?,
    })
}

/// When the next run is due: an interval after the last, or when the schedule was made.
fn due(schedule: &SnapshotSchedule, interval: SignedDuration) -> Timestamp {
    let last = schedule.status.as_ref().and_then(|s| s.last_run.as_ref());
    match last {
        Some(Time(last)) => last.checked_add(interval).unwrap_or(*last),
        None => schedule
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or_else(Timestamp::now, |t| t.0),
    }
}

/// Reconciles one schedule.
pub(crate) async fn reconcile_schedule(
    schedule: &SnapshotSchedule,
    ctx: &Context,
) -> Result<Action, Error> {
    let namespace = schedule.namespace().unwrap_or_default();
    let name = schedule.name_any();
    if schedule.metadata.deletion_timestamp.is_some() {
        // Its Snapshots are owned by it and go with it, each by its own policy.
        ctx.metrics.schedule_gone(&namespace, &name);
        return Ok(Action::await_change());
    }
    let wanted = match wanted(schedule) {
        Ok(wanted) => wanted,
        Err(message) => {
            // Only a change of the spec can help, and it brings a new reconcile.
            report(schedule, ctx, &message).await?;
            return Ok(Action::await_change());
        }
    };
    let now = Timestamp::now();
    let due = due(schedule, wanted.interval);
    if now < due {
        let next = Time(due);
        if schedule.status.as_ref().and_then(|s| s.next_run.as_ref()) != Some(&next) {
            patch_status(schedule, ctx, json!({"nextRun": next})).await?;
        }
        prune(schedule, ctx, &wanted, now).await?;
        let wait = now.duration_until(due).unsigned_abs();
        return Ok(Action::requeue(wait.max(Duration::from_secs(1))));
    }
    let started = match schedule
        .status
        .as_ref()
        .and_then(|s| s.current_run.as_ref())
    {
        Some(Time(started)) => *started,
        None => {
            // Seconds, as the API keeps times: the names must come out the same when
            // read back after a crash.
            let started = Timestamp::from_second(now.as_second()).unwrap_or(now);
            patch_status(schedule, ctx, json!({"currentRun": Time(started)})).await?;
            started
        }
    };
    if let Err(message) = run(schedule, ctx, started).await {
        report(schedule, ctx, &message).await?;
        return Err(Error::Reported(message));
    }
    let lag = due.duration_until(started).unsigned_abs();
    ctx.metrics.schedule_ran(&namespace, &name, lag);
    let next = started.checked_add(wanted.interval).unwrap_or(started);
    patch_status(
        schedule,
        ctx,
        json!({"lastRun": Time(started), "nextRun": Time(next), "currentRun": null, "error": null}),
    )
    .await?;
    info!(schedule = %state_key(schedule), ?lag, "snapshot schedule ran");
    prune(schedule, ctx, &wanted, now).await?;
    Ok(Action::requeue(wanted.interval.unsigned_abs()))
}

/// The Snapshot of `claim` for the run started at `started`:
/// `<schedule>-<claim>-<started>`, the names cut so the whole stays a valid object name.
fn snapshot_name(schedule: &str, claim: &str, started: Timestamp) -> String {
    let stamp = started.strftime("%Y%m%d%H%M%S").to_string();
    // Two dashes and the stamp; the rest shared by both names.
    let room = (MAX_NAME - stamp.len() - 2) / 2;
    let cut = |name: &str| -> String {
        name.chars()
            .take(room)
            .collect::<String>()
            .trim_end_matches(['-', '.'])
            .to_owned()
    };
    format!("{}-{}-{stamp}", cut(schedule), cut(claim))
}

/// Takes a Snapshot of each selected Bound claim. An error is the message to report.
async fn run(schedule: &SnapshotSchedule, ctx: &Context, started: Timestamp) -> Result<(), String> {
    let namespace = schedule.namespace().unwrap_or_default();
    let name = schedule.name_any();
    let selector = Selector::try_from(schedule.spec.claim_selector.clone())
        .map_err(|e| format!("spec.claimSelector: {e}"))?;
    let claims = Api::<PersistentVolumeClaim>::namespaced(ctx.client.clone(), &namespace)
        .list(&ListParams::default().labels_from(&selector))
        .await
        .map_err(|e| format!("cannot list the claims of namespace {namespace}: {e}"))?;
    let owner = OwnerReference {
        api_version: API_VERSION.to_owned(),
        kind: SCHEDULE_KIND.to_owned(),
        name: name.clone(),
        uid: schedule.uid().unwrap_or_default(),
        controller: Some(true),
        block_owner_deletion: None,
    };
    let api = Api::<Snapshot>::namespaced(ctx.client.clone(), &namespace);
    for claim in claims
        .items
        .iter()
        .filter(|c| claim_is_bound(*c) && c.metadata.deletion_timestamp.is_none())
    {
        let claim_name = claim.name_any();
        let mut snapshot = Snapshot {
            spec: SnapshotSpec {
                source: SnapshotSource {
                    persistent_volume_claim_name: claim_name.clone(),
                },
                deletion_policy: schedule.spec.deletion_policy,
            },
            ..Snapshot::default()
        };
        snapshot.metadata.name = Some(snapshot_name(&name, &claim_name, started));
        snapshot.metadata.namespace = Some(namespace.clone());
        snapshot.metadata.labels = Some(schedule_labels(&name));
        snapshot.metadata.owner_references = Some(vec![owner.clone()]);
        match api.create(&PostParams::default(), &snapshot).await {
            Ok(_) => {}
            // Made by this run before a crash: the run goes on.
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => {
                return Err(format!(
                    "cannot create a Snapshot of claim {namespace}/{claim_name}: {e}"
                ));
            }
        }
    }
    Ok(())
}

/// Deletes, per claim, the schedule's Snapshots beyond the newest `keep` and those older
/// than `maxAge`.
async fn prune(
    schedule: &SnapshotSchedule,
    ctx: &Context,
    wanted: &Wanted,
    now: Timestamp,
) -> Result<(), Error> {
    if schedule.spec.keep.is_none() && wanted.max_age.is_none() {
        return Ok(());
    }
    let namespace = schedule.namespace().unwrap_or_default();
    let name = schedule.name_any();
    let api = Api::<Snapshot>::namespaced(ctx.client.clone(), &namespace);
    let made = api
        .list(&ListParams::default().labels(&format!("{LABEL_SCHEDULE}={name}")))
        .await?;
    let mut living: Vec<&Snapshot> = made
        .items
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    // Newest first; within the same second, by name, whose end is when its run started.
    living.sort_by(|a, b| {
        let created = |s: &Snapshot| s.metadata.creation_timestamp.as_ref().map(|t| t.0);
        created(b)
            .cmp(&created(a))
            .then_with(|| b.name_any().cmp(&a.name_any()))
    });
    let oldest_kept = wanted.max_age.and_then(|age| now.checked_sub(age).ok());
    let mut seen: std::collections::HashMap<&str, u32> = std::collections::HashMap::new();
    for snapshot in living {
        let rank = seen.entry(snapshot.claim_name()).or_default();
        *rank += 1;
        let beyond_keep = schedule.spec.keep.is_some_and(|keep| *rank > keep);
        let too_old = match (oldest_kept, &snapshot.metadata.creation_timestamp) {
            (Some(limit), Some(created)) => created.0 < limit,
            _ => false,
        };
        if beyond_keep || too_old {
            info!(schedule = %state_key(schedule), snapshot = %snapshot.name_any(), beyond_keep, too_old, "pruning snapshot");
            match api
                .delete(&snapshot.name_any(), &DeleteParams::default())
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// Writes the failure into the status and a Warning event.
async fn report(schedule: &SnapshotSchedule, ctx: &Context, message: &str) -> Result<(), Error> {
    ctx.event(
        &schedule.object_ref(&()),
        EventType::Warning,
        REASON_FAILED,
        ACTION,
        message,
    )
    .await;
    patch_status(schedule, ctx, json!({"error": message})).await
}

async fn patch_status(
    schedule: &SnapshotSchedule,
    ctx: &Context,
    status: serde_json::Value,
) -> Result<(), Error> {
    Api::<SnapshotSchedule>::namespaced(
        ctx.client.clone(),
        &schedule.namespace().unwrap_or_default(),
    )
    .patch_status(
        &schedule.name_any(),
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_start_of_the_run_and_stay_valid() {
        let started: Timestamp = "2026-03-04T05:06:07Z".parse().unwrap();
        assert_eq!(
            snapshot_name("nightly", "data", started),
            "nightly-data-20260304050607"
        );
        let long = snapshot_name(&"s".repeat(253), &format!("{}-x", "c".repeat(130)), started);
        assert!(long.len() <= MAX_NAME, "{}", long.len());
        assert!(long.ends_with("-20260304050607"));
        assert!(!long.contains("--"), "{long}");
    }

    #[test]
    fn a_missed_run_is_due_once_an_interval_after_the_last() {
        let mut schedule: SnapshotSchedule = serde_json::from_value(json!({
            "metadata": {"name": "s", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"interval": "1h"},
        }))
        .unwrap();
        let hour = SignedDuration::from_hours(1);
        assert_eq!(
            due(&schedule, hour),
            "2026-01-01T00:00:00Z".parse::<Timestamp>().unwrap(),
            "a new schedule runs at once"
        );
        schedule.status =
            Some(serde_json::from_value(json!({"lastRun": "2026-01-01T05:00:00Z"})).unwrap());
        assert_eq!(
            due(&schedule, hour),
            "2026-01-01T06:00:00Z".parse::<Timestamp>().unwrap()
        );
        let bad: SnapshotSchedule = serde_json::from_value(json!({
            "metadata": {"name": "s"},
            "spec": {"interval": "1w"},
        }))
        .unwrap();
        assert!(wanted(&bad).unwrap_err().starts_with("spec.interval: "));
    }
}
