//! Snapshots and restores through the whole controller (`controller::run`) against the
//! in-repo API simulator, which serves the `nfsprov.dev` resources by their CRD
//! manifests. The agents are `MockAgent`s (mocks, not the real agent) whose snapshot
//! store and recorded restore requests show what the agent was asked.

use std::time::Duration;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use nfsprov_vocabulary::snapshots::{
    ANN_RESTORED_FROM, SNAPSHOT_FINALIZER, Snapshot, SnapshotSchedule,
};
use serde_json::{Value, json};

use crate::tests::harness::{Harness, HarnessOptions, Tier};
use crate::tests::mock_agent::{MockAgent, SNAPSHOT_CREATED_AT};

const WAIT: Duration = Duration::from_secs(30);
/// How often a condition on the agent's in-memory state, the events or the metrics is
/// looked at while awaited.
const POLL: Duration = Duration::from_millis(20);

/// A [`Harness`] (the simulator, or the real API server in the real-API tier) with mock
/// agents `nfs1` (the default) and `nfs2` that take snapshots, a class `nfs`, and a
/// controller that can be stopped and started again on the same cluster.
pub(super) struct Cluster {
    harness: Harness,
}

impl std::ops::Deref for Cluster {
    type Target = Harness;

    fn deref(&self) -> &Harness {
        &self.harness
    }
}

impl std::ops::DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut Harness {
        &mut self.harness
    }
}

impl Cluster {
    pub async fn start() -> Self {
        let harness = Harness::start(HarnessOptions {
            tier: Tier::FromEnvironment,
            agents: vec!["nfs1", "nfs2"],
            snapshots: true,
            ..HarnessOptions::default()
        })
        .await;
        let cluster = Self { harness };
        cluster.class("nfs", json!({})).await;
        cluster
    }

    pub fn agent(&self) -> &MockAgent {
        &self.agents[0]
    }

    pub async fn finish(self) {
        self.harness.finish().await;
    }

    /// `text` as it reads in this cluster's namespace: the scenarios write what they
    /// expect in the namespace `default`, which a real server's run replaces by its own.
    pub fn in_ns(&self, text: &str) -> String {
        text.replace("default/", &format!("{}/", self.namespace))
    }

    pub async fn class(&self, name: &str, parameters: Value) {
        let mut parameters = parameters;
        parameters["pathPattern"] = json!("${.PVC.namespace}/${.PVC.name}");
        self.create_class(name, parameters).await;
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn snapshots(&self) -> Api<Snapshot> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// A claim of `class`, with `source` (a Snapshot's name) as its dataSourceRef.
    pub async fn claim(&self, name: &str, class: &str, size: &str, source: Option<&str>) {
        let mut claim = json!({
            "metadata": {"name": name, "namespace": self.namespace, "labels": {"backup": "yes"}},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": self.class_name(class),
                "resources": {"requests": {"storage": size}},
            },
        });
        if let Some(source) = source {
            claim["spec"]["dataSourceRef"] =
                json!({"apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": source});
        }
        self.claims()
            .create(
                &PostParams::default(),
                &serde_json::from_value(claim).unwrap(),
            )
            .await
            .unwrap();
    }

    pub async fn bound(&self, name: &str) -> PersistentVolumeClaim {
        tokio::time::timeout(
            WAIT,
            await_condition(self.claims(), name, |c: Option<&PersistentVolumeClaim>| {
                c.and_then(|c| c.status.as_ref())
                    .and_then(|s| s.phase.as_deref())
                    == Some("Bound")
            }),
        )
        .await
        .expect("claim bound in time")
        .unwrap()
        .unwrap()
    }

    pub async fn snapshot(&self, name: &str, claim: &str, policy: &str) {
        let snapshot: Snapshot = serde_json::from_value(json!({
            "apiVersion": "nfsprov.dev/v1alpha1",
            "kind": "Snapshot",
            "metadata": {"name": name, "namespace": self.namespace},
            "spec": {
                "source": {"persistentVolumeClaimName": claim},
                "deletionPolicy": policy,
            },
        }))
        .unwrap();
        self.snapshots()
            .create(&PostParams::default(), &snapshot)
            .await
            .unwrap();
    }

    /// Awaits the Snapshot `name` meeting `condition`.
    pub async fn snapshot_where(
        &self,
        name: &str,
        condition: impl Fn(&Snapshot) -> bool,
    ) -> Snapshot {
        tokio::time::timeout(
            WAIT,
            await_condition(self.snapshots(), name, |s: Option<&Snapshot>| {
                s.is_some_and(&condition)
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("snapshot {name} never met the condition"))
        .unwrap()
        .unwrap()
    }

    pub async fn ready(&self, name: &str) -> Snapshot {
        self.snapshot_where(name, Snapshot::ready).await
    }

    pub async fn gone(&self, name: &str) {
        tokio::time::timeout(
            WAIT,
            await_condition(self.snapshots(), name, |s: Option<&Snapshot>| s.is_none()),
        )
        .await
        .unwrap_or_else(|_| panic!("snapshot {name} never went"))
        .unwrap();
    }

    /// The reasons and notes of the events in the cluster's namespace.
    pub async fn events(&self) -> Vec<(String, String, String)> {
        Api::<Event>::namespaced(self.client.clone(), &self.namespace)
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|e| {
                (
                    e.regarding.and_then(|r| r.name).unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.note.unwrap_or_default(),
                )
            })
            .collect()
    }

    /// Awaits an event about `object` of `reason` whose note contains `text`.
    pub async fn event(&self, object: &str, reason: &str, text: &str) -> String {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let events = self.events().await;
            if let Some((_, _, note)) = events
                .iter()
                .find(|(o, r, n)| o == object && r == reason && n.contains(text))
            {
                return note.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {reason} event on {object} with {text:?} in {events:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Awaits a line of the metrics equal to `line`.
    pub async fn metric(&self, line: &str) {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let metrics = self.metrics.encode().unwrap();
            if metrics.lines().any(|l| l == line) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {line} in {metrics}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Awaits `condition` on the first agent.
    pub async fn agent_until(&self, what: &str, condition: impl Fn(&MockAgent) -> bool) {
        let deadline = tokio::time::Instant::now() + WAIT;
        while !condition(self.agent()) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "the agent never came to: {what}; calls {:?}",
                self.agent().calls()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

fn calls_starting(agent: &MockAgent, prefix: &str) -> Vec<String> {
    agent
        .calls()
        .into_iter()
        .filter(|c| c.starts_with(prefix))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_a_bound_claim_becomes_ready_and_its_deletion_deletes_it() {
    let cluster = Cluster::start().await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    // Two answers of "still being made" first, as a reflink walk gives.
    cluster.agent().set_snapshot_polls(2);
    // What a btrfs or ZFS agent reports: what the snapshot holds, and what only it holds.
    cluster
        .agent()
        .set_snapshot_cost(Some(300 << 20), Some(100 << 20));
    cluster.snapshot("nightly", "data", "Delete").await;
    let snapshot = cluster.ready("nightly").await;

    let uid = snapshot.uid().unwrap();
    let name = format!("snap-{uid}");
    let mut status = serde_json::to_value(snapshot.status.as_ref().unwrap()).unwrap();
    let conditions = status["conditions"].take();
    assert_eq!(conditions.as_array().map(Vec::len), Some(1), "{conditions}");
    let ready = &conditions[0];
    assert_eq!(
        (&ready["type"], &ready["status"], &ready["reason"]),
        (&json!("Ready"), &json!("True"), &json!("SnapshotReady")),
        "{ready}"
    );
    assert!(ready["lastTransitionTime"].is_string(), "{ready}");
    status.as_object_mut().unwrap().remove("conditions");
    assert_eq!(
        status,
        json!({
            "readyToUse": true,
            "creationTime": SNAPSHOT_CREATED_AT,
            "restoreSize": "1073741824",
            "method": "reflink",
            "sizeBytes": 300u64 << 20,
            "exclusiveBytes": 100u64 << 20,
            "agent": "nfs1",
            "snapshotName": name,
            "sourcePath": cluster.in_ns("default/data"),
        })
    );
    assert_eq!(snapshot.finalizers(), [SNAPSHOT_FINALIZER]);
    assert_eq!(
        calls_starting(cluster.agent(), "PUT snapshot"),
        vec![format!("PUT snapshot {name} of {}/data", cluster.namespace); 3],
        "asked again while not ready, then no more"
    );
    assert!(cluster.agent().snapshot(&name).unwrap().ready);
    cluster
        .event(
            "nightly",
            "SnapshotReady",
            "of claim data is ready on agent nfs1 (reflink",
        )
        .await;
    cluster.metric("nfsprov_snapshots{state=\"ready\"} 1").await;

    cluster
        .snapshots()
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    cluster.gone("nightly").await;
    assert!(cluster.agent().snapshot(&name).is_none());
    assert_eq!(
        calls_starting(cluster.agent(), "DELETE snapshot"),
        [format!("DELETE snapshot {name}")]
    );
    cluster.metric("nfsprov_snapshots{state=\"ready\"} 0").await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retain_keeps_the_agents_snapshot_and_deleting_the_claim_touches_no_snapshot() {
    let cluster = Cluster::start().await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    // What an agent on storage that does not count a snapshot's own bytes reports.
    cluster.agent().set_snapshot_cost(Some(64 << 20), None);
    cluster.snapshot("kept", "data", "Retain").await;
    cluster.snapshot("dropped", "data", "Delete").await;
    let kept = cluster.ready("kept").await;
    let dropped = cluster.ready("dropped").await;
    // The status says what the agent counts and leaves out what it does not.
    let kept_status = kept.status.unwrap();
    assert_eq!(
        (kept_status.size_bytes, kept_status.exclusive_bytes),
        (Some(64 << 20), None),
        "{kept_status:?}"
    );
    let kept_name = kept_status.snapshot_name.unwrap();
    let dropped_name = dropped.status.unwrap().snapshot_name.unwrap();

    // The source claim goes, and its volume with it (the class deletes): both snapshots
    // stay, on the agent and in the API.
    cluster
        .claims()
        .delete("data", &DeleteParams::default())
        .await
        .unwrap();
    let source = cluster.in_ns("default/data");
    cluster
        .agent_until("the source volume is deleted", |a| !a.has_volume(&source))
        .await;
    assert_eq!(cluster.agent().snapshot_names().len(), 2);
    assert!(cluster.snapshots().get("kept").await.unwrap().ready());
    assert!(cluster.snapshots().get("dropped").await.unwrap().ready());

    cluster
        .snapshots()
        .delete("kept", &DeleteParams::default())
        .await
        .unwrap();
    cluster.gone("kept").await;
    cluster
        .snapshots()
        .delete("dropped", &DeleteParams::default())
        .await
        .unwrap();
    cluster.gone("dropped").await;
    assert_eq!(cluster.agent().snapshot_names(), [kept_name]);
    assert_eq!(
        calls_starting(cluster.agent(), "DELETE snapshot"),
        [format!("DELETE snapshot {dropped_name}")]
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_keeps_a_snapshot_from_being_taken_is_in_its_status_and_events() {
    let cluster = Cluster::start().await;
    cluster.snapshot("orphan", "missing", "Delete").await;
    let failed = cluster
        .snapshot_where("orphan", |s| {
            s.status.as_ref().and_then(|s| s.error.as_ref()).is_some()
        })
        .await;
    let status = failed.status.unwrap();
    assert_eq!(
        status.error.as_deref(),
        Some(
            cluster
                .in_ns("claim default/missing does not exist")
                .as_str()
        )
    );
    let condition = &status.conditions.unwrap()[0];
    assert_eq!(
        (condition.status.as_str(), condition.reason.as_str()),
        ("False", "Failed")
    );
    assert_eq!(
        condition.message,
        cluster.in_ns("claim default/missing does not exist")
    );
    cluster
        .event(
            "orphan",
            "SnapshotFailed",
            &cluster.in_ns("claim default/missing does not exist"),
        )
        .await;
    cluster
        .metric("nfsprov_snapshots{state=\"failed\"} 1")
        .await;

    // An agent that takes no snapshots: refused before anything is recorded.
    cluster.agent().take_snapshots(false);
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    cluster.snapshot("early", "data", "Delete").await;
    cluster
        .event(
            "early",
            "SnapshotFailed",
            &cluster.in_ns("agent nfs1 of claim default/data does not take snapshots"),
        )
        .await;
    let refused = cluster.snapshots().get("early").await.unwrap();
    assert_eq!(refused.status.as_ref().unwrap().agent, None);
    assert!(calls_starting(cluster.agent(), "PUT snapshot").is_empty());
    let error = refused.status.unwrap().error.unwrap();
    assert!(error.contains("does not take snapshots"), "{error}");

    // Deleting a Snapshot nothing was ever taken for asks no agent anything.
    cluster
        .snapshots()
        .delete("orphan", &DeleteParams::default())
        .await
        .unwrap();
    cluster.gone("orphan").await;
    assert!(calls_starting(cluster.agent(), "DELETE snapshot").is_empty());
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_is_restored_from_a_ready_snapshot_on_its_agent() {
    let cluster = Cluster::start().await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    cluster.snapshot("nightly", "data", "Delete").await;
    let snapshot = cluster.ready("nightly").await;
    let name = snapshot.status.unwrap().snapshot_name.unwrap();

    cluster.agent().set_restore_polls(1);
    cluster
        .claim("restored", "nfs", "2Gi", Some("nightly"))
        .await;
    let claim = cluster.bound("restored").await;
    let restores = cluster.agent().restores();
    assert_eq!(restores.len(), 2, "one 202, then made: {restores:?}");
    let (path, request) = &restores[1];
    assert_eq!(*path, cluster.in_ns("default/restored"));
    assert_eq!(
        request.snapshot.as_ref().map(|s| s.as_str()),
        Some(name.as_str())
    );
    assert_eq!(request.capacity_bytes, 2 << 30);
    assert_eq!(request.owner.pvc_name.as_deref(), Some("restored"));
    assert_eq!(restores[0], restores[1], "the same request is repeated");
    assert!(
        cluster
            .agent()
            .has_volume(&cluster.in_ns("default/restored"))
    );
    let pv = Api::<PersistentVolume>::all(cluster.client.clone())
        .get(claim.spec.unwrap().volume_name.as_deref().unwrap())
        .await
        .unwrap();
    let annotations = pv.metadata.annotations.unwrap();
    assert_eq!(
        annotations[ANN_RESTORED_FROM],
        cluster.in_ns("default/nightly")
    );
    assert_eq!(annotations["nfsprov.dev/clone-method"], "reflink");
    cluster
        .event(
            "restored",
            "Provisioning",
            &cluster.in_ns("restoring snapshot default/nightly"),
        )
        .await;
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restores_that_cannot_be_made_are_refused_and_retried_when_they_may_come_right() {
    let cluster = Cluster::start().await;
    cluster.class("elsewhere", json!({"agents": "nfs2"})).await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;

    // Not there yet, then made: the claim is restored once the Snapshot is ready.
    cluster.agent().set_snapshot_polls(3);
    cluster.claim("early", "nfs", "1Gi", Some("later")).await;
    cluster
        .event(
            "early",
            "ProvisioningFailed",
            &cluster.in_ns("the snapshot default/later does not exist (yet)"),
        )
        .await;
    cluster.snapshot("later", "data", "Delete").await;
    cluster
        .event(
            "early",
            "ProvisioningFailed",
            &cluster.in_ns("the snapshot default/later is not ready yet"),
        )
        .await;
    cluster.bound("early").await;

    // Smaller than the snapshot, or on an agent the class does not place volumes on:
    // refused for good, nothing asked of any agent.
    cluster.claim("small", "nfs", "512Mi", Some("later")).await;
    cluster
        .event(
            "small",
            "ProvisioningFailed",
            &cluster.in_ns("less than the 1073741824 bytes of its snapshot default/later: a restored volume must be at least as large as its snapshot"),
        )
        .await;
    cluster
        .claim("moved", "elsewhere", "1Gi", Some("later"))
        .await;
    cluster
        .event(
            "moved",
            "ProvisioningFailed",
            &format!(
                "the snapshot {}/later is on agent nfs1, but StorageClass \"{}\" places volumes on agents nfs2: a restored volume is made on its source's agent",
                cluster.namespace,
                cluster.class_name("elsewhere")
            ),
        )
        .await;
    let restored: Vec<String> = cluster
        .agent()
        .restores()
        .into_iter()
        .map(|(path, _)| path)
        .collect();
    assert_eq!(restored, [cluster.in_ns("default/early")]);
    assert!(cluster.agents[1].restores().is_empty());
    for name in ["small", "moved"] {
        let claim = cluster.claims().get(name).await.unwrap();
        assert_eq!(claim.status.unwrap().phase.as_deref(), Some("Pending"));
    }
    cluster.finish().await;
}

impl Cluster {
    fn schedules(&self) -> Api<SnapshotSchedule> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// The schedule's Snapshots that are not being deleted, by name.
    async fn scheduled(&self, schedule: &str) -> Vec<String> {
        let mut names: Vec<String> = self
            .snapshots()
            .list(
                &ListParams::default().labels(&format!("nfsprov.dev/snapshot-schedule={schedule}")),
            )
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| s.metadata.deletion_timestamp.is_none())
            .map(|s| s.name_any())
            .collect();
        names.sort();
        names
    }

    /// Awaits the schedule's living Snapshots meeting `condition`.
    async fn scheduled_until(
        &self,
        schedule: &str,
        what: &str,
        condition: impl Fn(&[String]) -> bool,
    ) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            let names = self.scheduled(schedule).await;
            if condition(&names) {
                return names;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: the schedule's snapshots are {names:?}"
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Awaits the schedule's `lastRun` differing from `before`, and returns it.
    async fn ran_after(&self, schedule: &str, before: Option<&Time>) -> SnapshotSchedule {
        let before = before.cloned();
        tokio::time::timeout(
            WAIT,
            await_condition(
                self.schedules(),
                schedule,
                move |s: Option<&SnapshotSchedule>| {
                    let last = s
                        .and_then(|s| s.status.as_ref())
                        .and_then(|s| s.last_run.clone());
                    last.is_some() && last != before
                },
            ),
        )
        .await
        .expect("the schedule ran in time")
        .unwrap()
        .unwrap()
    }

    /// Writes the schedule's `lastRun`, as if its last run had been then.
    async fn set_last_run(&self, schedule: &str, last: Timestamp) {
        self.schedules()
            .patch_status(
                schedule,
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"lastRun": Time(last)}})),
            )
            .await
            .unwrap();
    }
}

fn last_run(schedule: &SnapshotSchedule) -> Timestamp {
    schedule
        .status
        .as_ref()
        .unwrap()
        .last_run
        .as_ref()
        .unwrap()
        .0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schedule_keeps_the_newest_three_across_a_restart_and_takes_a_missed_run_once() {
    let mut cluster = Cluster::start().await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    // Not selected: no backup label.
    let scratch: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "scratch", "namespace": cluster.namespace},
        "spec": {
            "accessModes": ["ReadWriteMany"],
            "storageClassName": cluster.class_name("nfs"),
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))
    .unwrap();
    cluster
        .claims()
        .create(&PostParams::default(), &scratch)
        .await
        .unwrap();
    cluster.bound("scratch").await;
    let schedule: SnapshotSchedule = serde_json::from_value(json!({
        "apiVersion": "nfsprov.dev/v1alpha1",
        "kind": "SnapshotSchedule",
        "metadata": {"name": "hourly", "namespace": cluster.namespace},
        "spec": {
            "claimSelector": {"matchLabels": {"backup": "yes"}},
            "interval": "1h",
            "keep": 3,
        },
    }))
    .unwrap();
    cluster
        .schedules()
        .create(&PostParams::default(), &schedule)
        .await
        .unwrap();

    // A new schedule runs at once; each later run is brought on by moving lastRun an
    // interval back, so the next is due a second after the last (not an hour).
    let mut ran = cluster.ran_after("hourly", None).await;
    let first = cluster
        .scheduled_until("hourly", "the first run", |n| n.len() == 1)
        .await;
    assert!(first[0].starts_with("hourly-data-"), "{first:?}");
    let mut taken = first;
    for run in 2..=4 {
        let last = last_run(&ran);
        cluster
            .set_last_run(
                "hourly",
                last - SignedDuration::from_hours(1) + SignedDuration::from_secs(1),
            )
            .await;
        ran = cluster
            .ran_after(
                "hourly",
                Some(&Time(
                    last - SignedDuration::from_hours(1) + SignedDuration::from_secs(1),
                )),
            )
            .await;
        let names = cluster
            .scheduled_until("hourly", "a run of the same claim", |n| {
                n.iter().any(|name| !taken.contains(name))
            })
            .await;
        let new: Vec<&String> = names.iter().filter(|n| !taken.contains(n)).collect();
        assert_eq!(
            new.len(),
            1,
            "run {run} took one snapshot of data: {names:?}"
        );
        taken.push(new[0].clone());
    }
    // Four runs, the oldest pruned; its agent snapshot with it (deletionPolicy Delete).
    let kept = cluster
        .scheduled_until("hourly", "pruned to 3", |n| n.len() == 3)
        .await;
    assert_eq!(kept, taken[1..].to_vec());
    cluster
        .agent_until("the pruned snapshot is deleted on the agent", |a| {
            a.snapshot_names().len() == 3
        })
        .await;
    let next = ran.status.as_ref().unwrap().next_run.as_ref().unwrap().0;
    assert_eq!(next, last_run(&ran) + SignedDuration::from_hours(1));

    // Down for ten intervals: one run on return, the next an interval after it. A run's
    // Snapshots are named by the second it starts, and the test has made runs a second
    // apart: the run on return must start in a later second than the last one.
    cluster.stop_controller().await;
    let later = last_run(&ran) + SignedDuration::from_secs(1);
    let wait = Timestamp::now().duration_until(later);
    if wait.is_positive() {
        tokio::time::sleep(wait.unsigned_abs()).await;
    }
    let long_ago = last_run(&ran) - SignedDuration::from_hours(10);
    cluster.set_last_run("hourly", long_ago).await;
    cluster.start_controller();
    let back = cluster.ran_after("hourly", Some(&Time(long_ago))).await;
    let after = cluster
        .scheduled_until("hourly", "one run on return, pruned to 3", |n| {
            n.len() == 3 && n.iter().any(|name| !taken.contains(name))
        })
        .await;
    let new: Vec<&String> = after.iter().filter(|n| !taken.contains(n)).collect();
    assert_eq!(new.len(), 1, "exactly one missed run taken: {after:?}");
    assert_eq!(after[..2], taken[2..]);
    // Taken now, not at the first missed time (as catching up run by run would).
    assert!(last_run(&back) >= later, "{:?}", back.status);
    let status = back.status.unwrap();
    assert_eq!(
        status.next_run.unwrap().0,
        status.last_run.unwrap().0 + SignedDuration::from_hours(1)
    );
    // The run was nine hours late, and the metric says so.
    let lag = cluster
        .metrics
        .encode()
        .unwrap()
        .lines()
        .find_map(|l| {
            l.strip_prefix(&format!(
                "nfsprov_snapshot_schedule_lag_seconds{{namespace=\"{}\",schedule=\"hourly\"}} ",
                cluster.namespace
            ))
            .map(|v| v.parse::<f64>().unwrap())
        })
        .expect("a lag figure");
    assert!((9.0 * 3600.0..9.0 * 3600.0 + 60.0).contains(&lag), "{lag}");
    assert!(
        calls_starting(cluster.agent(), "PUT snapshot")
            .iter()
            .all(|c| c.ends_with(&cluster.in_ns("of default/data"))),
        "the unselected claim is never snapshotted"
    );
    cluster.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_errors_are_reported_and_retried_and_a_failed_delete_keeps_the_snapshot() {
    use nfsprov_api_types::ErrorCode;
    let cluster = Cluster::start().await;
    cluster.claim("data", "nfs", "1Gi", None).await;
    cluster.bound("data").await;
    cluster
        .agent()
        .fail_calls(Some(("PUT snapshot", ErrorCode::InsufficientStorage)));
    cluster.snapshot("nightly", "data", "Delete").await;
    let failed = cluster
        .snapshot_where("nightly", |s| {
            s.status.as_ref().and_then(|s| s.error.as_ref()).is_some()
        })
        .await;
    let status = failed.status.unwrap();
    assert!(
        status
            .error
            .as_deref()
            .unwrap()
            .starts_with(&cluster.in_ns("agent nfs1 could not snapshot volume default/data: ")),
        "{status:?}"
    );
    // Where it is made is recorded before the agent is asked, failure or not.
    let name = status.snapshot_name.unwrap();
    assert_eq!(status.agent.as_deref(), Some("nfs1"));
    cluster
        .event(
            "nightly",
            "SnapshotFailed",
            &cluster.in_ns("could not snapshot volume default/data"),
        )
        .await;
    cluster.agent().fail_calls(None);
    let ready = cluster.ready("nightly").await;
    assert_eq!(
        ready.status.unwrap().error,
        None,
        "a success clears the error"
    );

    cluster
        .agent()
        .fail_calls(Some(("DELETE snapshot", ErrorCode::InsufficientStorage)));
    cluster
        .snapshots()
        .delete("nightly", &DeleteParams::default())
        .await
        .unwrap();
    cluster
        .event(
            "nightly",
            "SnapshotFailed",
            &format!("could not delete snapshot {name}"),
        )
        .await;
    let held = cluster.snapshots().get("nightly").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    assert_eq!(held.finalizers(), [SNAPSHOT_FINALIZER]);
    assert!(cluster.agent().snapshot(&name).is_some());
    cluster.agent().fail_calls(None);
    cluster.gone("nightly").await;
    assert!(cluster.agent().snapshot(&name).is_none());
    // At least one failed attempt each (more when a retry came before the failure ended).
    let metrics = cluster.metrics.encode().unwrap();
    for operation in ["create", "delete"] {
        let count = metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(&format!(
                    "nfsprov_snapshot_failures_total{{operation=\"{operation}\"}} "
                ))
            })
            .map(|v| v.parse::<u64>().unwrap());
        assert!(count.is_some_and(|c| c >= 1), "{operation}: {metrics}");
    }
    cluster.finish().await;
}
