//! `snapshots`: the `nfsprov.dev` Snapshots of every namespace (claim, readiness, restore
//! size, what each holds and holds alone, method, agent, the schedule that made them) and the SnapshotSchedules (interval,
//! retention, last and next run), as the API holds them; no agent is asked.

use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use nfsprov_vocabulary::snapshots::{
    DeletionPolicy, GROUP, LABEL_SCHEDULE, Snapshot, SnapshotSchedule,
};
use serde::Serialize;

use crate::cluster::{Access, list};
use crate::table::{Table, human_bytes};

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SnapshotRow {
    /// `namespace/name`.
    pub snapshot: String,
    pub claim: String,
    pub ready: bool,
    /// The least a restore from it may request, in bytes.
    pub restore_size_bytes: Option<u64>,
    /// What it holds, in bytes, as its agent counts them.
    pub size_bytes: Option<u64>,
    /// What only it holds, in bytes: what deleting it frees; unknown on storage that
    /// does not count it.
    pub exclusive_bytes: Option<u64>,
    pub method: Option<String>,
    pub agent: Option<String>,
    pub deletion_policy: String,
    /// The schedule that made it, if any.
    pub schedule: Option<String>,
    pub deleting: bool,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct ScheduleRow {
    /// `namespace/name`.
    pub schedule: String,
    pub interval: String,
    pub keep: Option<u32>,
    pub max_age: Option<String>,
    pub last_run: Option<String>,
    pub next_run: Option<String>,
    /// The Snapshots it made that still exist.
    pub snapshots: usize,
    pub error: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct SnapshotsReport {
    pub snapshots: Vec<SnapshotRow>,
    pub schedules: Vec<ScheduleRow>,
}

fn key(namespace: Option<String>, name: String) -> String {
    format!("{}/{name}", namespace.unwrap_or_default())
}

pub(crate) fn snapshot_row(snapshot: &Snapshot) -> SnapshotRow {
    let status = snapshot.status.clone().unwrap_or_default();
    SnapshotRow {
        snapshot: key(snapshot.namespace(), snapshot.name_any()),
        claim: snapshot.claim_name().to_owned(),
        ready: snapshot.ready(),
        restore_size_bytes: status
            .restore_size
            .as_ref()
            .and_then(nfsprov_vocabulary::quantity::bytes),
        size_bytes: status.size_bytes,
        exclusive_bytes: status.exclusive_bytes,
        method: status.method,
        agent: status.agent,
        deletion_policy: match snapshot.spec.deletion_policy {
            DeletionPolicy::Delete => "Delete",
            DeletionPolicy::Retain => "Retain",
        }
        .to_owned(),
        schedule: snapshot.labels().get(LABEL_SCHEDULE).cloned(),
        deleting: snapshot.metadata.deletion_timestamp.is_some(),
        error: status.error,
    }
}

pub(crate) fn schedule_row(schedule: &SnapshotSchedule, snapshots: &[Snapshot]) -> ScheduleRow {
    let status = schedule.status.clone().unwrap_or_default();
    let made = snapshots
        .iter()
        .filter(|s| {
            s.namespace() == schedule.namespace()
                && s.labels().get(LABEL_SCHEDULE) == Some(&schedule.name_any())
        })
        .count();
    let time = |t: Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Time>| {
        t.map(|t| t.0.to_string())
    };
    ScheduleRow {
        schedule: key(schedule.namespace(), schedule.name_any()),
        interval: schedule.spec.interval.clone(),
        keep: schedule.spec.keep,
        max_age: schedule.spec.max_age.clone(),
        last_run: time(status.last_run),
        next_run: time(status.next_run),
        snapshots: made,
        error: status.error,
    }
}

fn access(resource: &'static str) -> Access<'static> {
    Access {
        verb: "list",
        group: GROUP,
        resource,
        namespace: None,
    }
}

/// Reads both kinds from every namespace. Without the CRDs installed, says so.
pub(crate) async fn run(client: &Client) -> anyhow::Result<SnapshotsReport> {
    let not_installed = |e: anyhow::Error| {
        let missing = e
            .chain()
            .filter_map(|cause| cause.downcast_ref::<kube::Error>())
            .any(|cause| matches!(cause, kube::Error::Api(status) if status.code == 404));
        if missing {
            anyhow::anyhow!(
                "the {GROUP} Snapshot resources are not installed in this cluster (apply deploy/crds, or kubectl apply -k deploy/)"
            )
        } else {
            e
        }
    };
    let snapshots = list(
        &Api::<Snapshot>::all(client.clone()),
        &ListParams::default(),
        access("snapshots"),
    )
    .await
    .map_err(not_installed)?;
    let schedules = list(
        &Api::<SnapshotSchedule>::all(client.clone()),
        &ListParams::default(),
        access("snapshotschedules"),
    )
    .await
    .map_err(not_installed)?;
    let mut snapshot_rows: Vec<SnapshotRow> = snapshots.iter().map(snapshot_row).collect();
    snapshot_rows.sort_by(|a, b| a.snapshot.cmp(&b.snapshot));
    let mut schedule_rows: Vec<ScheduleRow> = schedules
        .iter()
        .map(|s| schedule_row(s, &snapshots))
        .collect();
    schedule_rows.sort_by(|a, b| a.schedule.cmp(&b.schedule));
    Ok(SnapshotsReport {
        snapshots: snapshot_rows,
        schedules: schedule_rows,
    })
}

fn or_dash(value: Option<String>) -> String {
    value.unwrap_or_else(|| "-".to_owned())
}

impl crate::report::Report for SnapshotsReport {
    fn table(&self) -> String {
        let mut out = String::new();
        if self.snapshots.is_empty() {
            out.push_str("No Snapshot.\n");
        } else {
            let mut table = Table::new(&[
                "snapshot",
                "claim",
                "ready",
                "restore size",
                "size",
                "exclusive",
                "method",
                "agent",
                "policy",
                "schedule",
            ]);
            for s in &self.snapshots {
                let ready = match (s.deleting, s.ready, &s.error) {
                    (true, _, _) => "deleting",
                    (false, true, _) => "yes",
                    (false, false, Some(_)) => "failed",
                    (false, false, None) => "no",
                };
                table.row([
                    s.snapshot.clone(),
                    s.claim.clone(),
                    ready.to_owned(),
                    or_dash(s.restore_size_bytes.map(human_bytes)),
                    or_dash(s.size_bytes.map(human_bytes)),
                    or_dash(s.exclusive_bytes.map(human_bytes)),
                    or_dash(s.method.clone()),
                    or_dash(s.agent.clone()),
                    s.deletion_policy.clone(),
                    or_dash(s.schedule.clone()),
                ]);
            }
            out.push_str(&table.render());
            for s in &self.snapshots {
                if let Some(error) = s.error.as_ref().filter(|_| !s.ready) {
                    out.push_str(&format!("{}: {error}\n", s.snapshot));
                }
            }
        }
        out.push('\n');
        if self.schedules.is_empty() {
            out.push_str("No SnapshotSchedule.\n");
            return out;
        }
        let mut table = Table::new(&[
            "schedule",
            "interval",
            "keep",
            "max age",
            "last run",
            "next run",
            "snapshots",
        ]);
        for s in &self.schedules {
            table.row([
                s.schedule.clone(),
                s.interval.clone(),
                or_dash(s.keep.map(|k| k.to_string())),
                or_dash(s.max_age.clone()),
                or_dash(s.last_run.clone()),
                or_dash(s.next_run.clone()),
                s.snapshots.to_string(),
            ]);
        }
        out.push_str(&table.render());
        for s in &self.schedules {
            if let Some(error) = &s.error {
                out.push_str(&format!("{}: {error}\n", s.schedule));
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Report;
    use serde_json::json;

    #[test]
    fn rows_show_state_size_origin_and_what_each_schedule_keeps() {
        let snapshots: Vec<Snapshot> = serde_json::from_value(json!([
            {
                "metadata": {"name": "hourly-data-1", "namespace": "team",
                             "labels": {LABEL_SCHEDULE: "hourly"}},
                "spec": {"source": {"persistentVolumeClaimName": "data"}},
                "status": {"readyToUse": true, "restoreSize": "1073741824",
                           "sizeBytes": 314572800u64, "exclusiveBytes": 104857600u64,
                           "method": "btrfs-snapshot", "agent": "nfs1"},
            },
            {
                "metadata": {"name": "manual", "namespace": "team"},
                "spec": {"source": {"persistentVolumeClaimName": "gone"},
                         "deletionPolicy": "Retain"},
                "status": {"readyToUse": false, "error": "claim team/gone does not exist"},
            },
        ]))
        .unwrap();
        let schedule: SnapshotSchedule = serde_json::from_value(json!({
            "metadata": {"name": "hourly", "namespace": "team"},
            "spec": {"interval": "1h", "keep": 3},
            "status": {"lastRun": "2026-01-01T10:00:00Z", "nextRun": "2026-01-01T11:00:00Z"},
        }))
        .unwrap();
        let report = SnapshotsReport {
            snapshots: snapshots.iter().map(snapshot_row).collect(),
            schedules: vec![schedule_row(&schedule, &snapshots)],
        };
        assert_eq!(report.snapshots[0].schedule.as_deref(), Some("hourly"));
        assert_eq!(report.snapshots[1].deletion_policy, "Retain");
        assert_eq!(report.schedules[0].snapshots, 1);
        let table = report.table();
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "team/hourly-data-1",
                "data",
                "yes",
                "1Gi",
                "300Mi",
                "100Mi",
                "btrfs-snapshot",
                "nfs1",
                "Delete",
                "hourly"
            ],
            "{table}"
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "team/manual",
                "gone",
                "failed",
                "-",
                "-",
                "-",
                "-",
                "-",
                "Retain",
                "-"
            ],
            "{table}"
        );
        assert!(
            table.contains("team/manual: claim team/gone does not exist"),
            "{table}"
        );
        assert!(
            table.contains("team/hourly   1h         3      -         2026-01-01T10:00:00Z   2026-01-01T11:00:00Z   1"),
            "{table}"
        );
    }
}
