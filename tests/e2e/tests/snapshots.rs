//! Snapshots and restores through the whole system: files written through NFS into a
//! claim, a `Snapshot` of it taken by the controller on the agent, the claim changed, and
//! a claim restored from the Snapshot read back through NFS. Runs against the simulator,
//! or a real cluster with `E2E_KUBECONFIG` (where `deploy/` installed the CRDs).
//!
//! The Snapshot is made as a user's manifest makes it (a dynamic object of the group
//! `nfsprov.dev`), so the test speaks the wire format, not the controller's own types.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};
use nfsprov_api_types::{ErrorCode, SnapshotName};
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::libnfs::{
    FileKind, NfsClient, Timestamp, TreeManifest, fixture, snapshot_tree, sparse_usage,
    write_fixture_tree,
};
use nfsprov_e2e::system::{AgentSpec, NfsService, System};
use serde_json::json;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const WAIT: Duration = Duration::from_secs(90);
const GIB: u64 = 1 << 30;
/// A file the change after the snapshot removes, and one it rewrites.
const REMOVED: &str = fixture::SECRET;
const REWRITTEN: &str = fixture::OWNER_A;

/// The plain-directory case: the agent keeps the snapshot as a reflink or exact copy.
#[tokio::test(flavor = "multi_thread")]
async fn a_restore_reads_the_snapshot_not_the_changed_claim_and_outlives_its_source()
-> anyhow::Result<()> {
    let test = "a_restore_reads_the_snapshot_not_the_changed_claim_and_outlives_its_source";
    if let Err(why) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(test, &why);
        return Ok(());
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start_with_agents(
        KubeApi::start().await?,
        &[AgentSpec::named("nfs1")],
        1,
        &["--leader-elect=false"],
    )
    .await?;
    snapshot_and_restore(&system, "e2e-snap", &["copy", "reflink"]).await
}

/// On btrfs the snapshot is a read-only subvolume snapshot, taken in an instant.
#[tokio::test(flavor = "multi_thread")]
async fn on_btrfs_a_subvolume_snapshot_restores_exactly_through_nfs() -> anyhow::Result<()> {
    let test = "on_btrfs_a_subvolume_snapshot_restores_exactly_through_nfs";
    let _turn = ONE_AT_A_TIME.lock().await;
    let Some(btrfs) = nfsprov_e2e::requirements::btrfs_over_nfs(test, 512) else {
        return Ok(());
    };
    let spec = AgentSpec {
        name: "nfs1".into(),
        root: Some(btrfs.root()),
        settings: "[quota]\nbackend = \"btrfs\"".into(),
    };
    // ganesha serves a btrfs subvolume only as an export of its own (see exports.md).
    let system =
        System::start_with_exports(KubeApi::start().await?, spec, &["--leader-elect=false"])
            .await?;
    snapshot_and_restore(&system, "e2e-snap-btrfs", &["btrfs-snapshot"]).await
}

/// The scenario on the system's first agent, with a class named `class` and a snapshot
/// method among `methods`.
async fn snapshot_and_restore(
    system: &System,
    class: &str,
    methods: &[&str],
) -> anyhow::Result<()> {
    let mut params = json!({"agent": "nfs1", "onDelete": "delete", "pathPattern": "${.PVC.name}"});
    if matches!(system.nfs, NfsService::PerVolume { .. }) {
        // The test's client, as root: the fixture has files of several owners.
        params["exportClients"] = json!("127.0.0.1");
        params["squash"] = json!("none");
    }
    system.class(class, params).await?;
    system.claim("source", class, json!({}), json!({})).await?;
    let source = system.bound_volume("source", WAIT).await?;
    let (nfs, source_dir) = mount(system, &source)?;
    write_fixture_tree(&nfs, &source_dir)?;
    // Times a restore must keep: set after every write and chown, which move them.
    let past = |sec| Timestamp { sec, nsec: 0 };
    for (name, sec) in [
        (fixture::OWNER_B, 1_000_000_000),
        (fixture::SPARSE, 1_200_000_000),
        (fixture::NESTED, 1_400_000_000),
    ] {
        nfs.set_times(&at(&source_dir, name), past(sec - 7), past(sec))?;
    }
    let taken = snapshot_tree(&nfs, &source_dir)?;
    let taken_times = file_times(&nfs, &source_dir, &taken)?;
    assert_eq!(
        taken_times.get(fixture::OWNER_B),
        Some(&past(1_000_000_000)),
        "the NFS server kept the time set"
    );

    // A Snapshot as a user writes it; Delete is the default policy, said here outright.
    let snapshots = snapshot_api(system);
    let snapshot: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nfsprov.dev/v1alpha1",
        "kind": "Snapshot",
        "metadata": {"name": "before-change", "namespace": system.names.namespace},
        "spec": {"source": {"persistentVolumeClaimName": "source"}, "deletionPolicy": "Delete"},
    }))?;
    snapshots.create(&PostParams::default(), &snapshot).await?;
    let ready = ready_snapshot(system, &snapshots, "before-change").await?;
    let status = &ready.data["status"];
    let method = status["method"].as_str().unwrap_or_default();
    assert!(methods.contains(&method), "method {method}: {status}");
    assert_eq!(
        status["restoreSize"].as_str(),
        Some(GIB.to_string().as_str()),
        "the source's capacity: {status}"
    );
    assert!(status["creationTime"].is_string(), "{status}");
    let uid = ready.metadata.uid.clone().unwrap_or_default();
    let agent_name = SnapshotName::parse(status["snapshotName"].as_str().unwrap_or_default())?;
    assert_eq!(agent_name.as_str(), format!("snap-{uid}"));
    let agent = system.agents[0].process.client()?;
    let held = agent.get_snapshot(&agent_name, None).await?;
    assert!(held.ready, "{held:?}");
    assert_eq!(held.method.as_str(), method);
    assert_eq!(held.restore_size_bytes, GIB);

    // The claim changes after the snapshot: one file rewritten, one removed, one added.
    nfs.write_file(
        &at(&source_dir, REWRITTEN),
        b"rewritten after the snapshot",
        0o640,
    )?;
    nfs.unlink(&at(&source_dir, REMOVED))?;
    nfs.write_file(&at(&source_dir, "after-the-snapshot"), b"new", 0o644)?;
    let changed = snapshot_tree(&nfs, &source_dir)?;
    assert_ne!(changed, taken, "the change shows through NFS");

    restore_claim(system, "restored", class, "before-change", "2Gi").await?;
    let restored = system.bound_volume("restored", WAIT).await?;
    let annotations = restored.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("nfsprov.dev/restored-from"),
        Some(&format!("{}/before-change", system.names.namespace)),
        "{annotations:?}"
    );
    assert_ne!(mount_path(&restored), mount_path(&source));
    let (restored_nfs, restored_dir) = mount(system, &restored)?;
    check_holds_the_snapshot(&restored_nfs, &restored_dir, &taken, &taken_times)?;

    // The source goes: the Snapshot stays ready, the restore keeps its files, and a
    // second restore made now still holds the snapshot's content.
    system
        .delete_claim_and_wait_for_volume("source", &name_of(&source))
        .await?;
    drop(nfs);
    assert!(
        !server_dir(system, &source).exists(),
        "the source's data is gone"
    );
    let after = snapshots.get("before-change").await?;
    assert_eq!(after.data["status"]["readyToUse"], json!(true), "{after:?}");
    assert!(agent.get_snapshot(&agent_name, None).await?.ready);
    check_holds_the_snapshot(&restored_nfs, &restored_dir, &taken, &taken_times)?;
    restore_claim(system, "restored-later", class, "before-change", "1Gi").await?;
    let later = system.bound_volume("restored-later", WAIT).await?;
    let (later_nfs, later_dir) = mount(system, &later)?;
    check_holds_the_snapshot(&later_nfs, &later_dir, &taken, &taken_times)?;

    // Deleting the Snapshot (policy Delete) deletes the agent's snapshot, then the object.
    snapshots
        .delete("before-change", &DeleteParams::default())
        .await?;
    gone(system, &snapshots, "before-change").await?;
    let asked = agent.get_snapshot(&agent_name, None).await;
    assert!(
        matches!(&asked, Err(e) if e.code() == Some(ErrorCode::NotFound)),
        "the agent still has it: {asked:?}"
    );
    let mut listed = Vec::new();
    agent
        .for_each_snapshot_page(100, None, |page| listed.extend(page))
        .await?;
    assert!(listed.is_empty(), "{listed:?}");
    // What was restored from it does not depend on it.
    check_holds_the_snapshot(&restored_nfs, &restored_dir, &taken, &taken_times)?;
    drop((restored_nfs, later_nfs));

    for (claim, volume) in [("restored", &restored), ("restored-later", &later)] {
        system
            .delete_claim_and_wait_for_volume(claim, &name_of(volume))
            .await?;
    }
    Ok(())
}

/// The restored tree through NFS is the snapshot's: the same names, kinds, owners,
/// modes, contents, hard links and holes, and the same file times.
fn check_holds_the_snapshot(
    nfs: &NfsClient,
    dir: &str,
    taken: &TreeManifest,
    taken_times: &BTreeMap<String, Timestamp>,
) -> anyhow::Result<()> {
    let restored = snapshot_tree(nfs, dir)?;
    assert_eq!(&restored, taken, "the restore of {dir} over NFS");
    assert_eq!(
        &file_times(nfs, dir, &restored)?,
        taken_times,
        "modification times in {dir}"
    );
    let (size, used) = sparse_usage(nfs, dir)?;
    assert!(
        size == fixture::SPARSE_SIZE && used < 8 << 20,
        "the sparse file keeps its holes: {used} of {size} bytes used"
    );
    Ok(())
}

/// The modification time of every regular file of the manifest, through NFS.
fn file_times(
    nfs: &NfsClient,
    dir: &str,
    manifest: &TreeManifest,
) -> anyhow::Result<BTreeMap<String, Timestamp>> {
    let mut times = BTreeMap::new();
    for (name, entry) in &manifest.entries {
        if entry.kind == FileKind::File {
            times.insert(name.clone(), nfs.lstat(&at(dir, name))?.mtime);
        }
    }
    Ok(times)
}

fn snapshot_api(system: &System) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nfsprov.dev", "v1alpha1", "Snapshot");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "snapshots");
    Api::namespaced_with(system.client.clone(), &system.names.namespace, &resource)
}

/// Polls the Snapshot until its status says `readyToUse`, failing on the deadline with
/// its last status and the controller's log.
async fn ready_snapshot(
    system: &System,
    snapshots: &Api<DynamicObject>,
    name: &str,
) -> anyhow::Result<DynamicObject> {
    let deadline = Instant::now() + WAIT;
    loop {
        let snapshot = snapshots.get(name).await?;
        if snapshot.data["status"]["readyToUse"] == json!(true) {
            return Ok(snapshot);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "Snapshot {name} not ready within {WAIT:?}: {}\n{}",
                snapshot.data["status"],
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Polls until the Snapshot object is gone (its finalizer removed).
async fn gone(system: &System, snapshots: &Api<DynamicObject>, name: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + WAIT;
    while snapshots.get_opt(name).await?.is_some() {
        if Instant::now() > deadline {
            anyhow::bail!(
                "Snapshot {name} not deleted within {WAIT:?}\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(())
}

/// A claim of `class` asking for `size`, to be made from the Snapshot `snapshot`.
async fn restore_claim(
    system: &System,
    name: &str,
    class: &str,
    snapshot: &str,
    size: &str,
) -> anyhow::Result<()> {
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": system.names.namespace},
        "spec": {
            "storageClassName": system.names.class(class),
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": size}},
            "dataSourceRef": {"apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": snapshot},
        },
    }))?;
    system
        .claims()
        .create(&PostParams::default(), &claim)
        .await?;
    Ok(())
}

fn name_of(volume: &PersistentVolume) -> String {
    volume.metadata.name.clone().unwrap_or_default()
}

/// The path clients mount the volume by, as the PV gives it to kubelets.
fn mount_path(volume: &PersistentVolume) -> String {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.as_ref())
        .map(|nfs| nfs.path.clone())
        .unwrap_or_default()
}

/// A client of the volume's files and the directory they are in: the export root and
/// the volume's directory below it when the whole root is exported, the volume's own
/// export and its root otherwise.
fn mount(system: &System, volume: &PersistentVolume) -> anyhow::Result<(NfsClient, String)> {
    let port = system.nfs.port();
    match &system.nfs {
        NfsService::Whole(_) => {
            let export = &system.agents[0].export;
            let dir = mount_path(volume)
                .strip_prefix(export.as_str())
                .ok_or_else(|| anyhow::anyhow!("{volume:?} is not under {export}"))?
                .to_owned();
            Ok((NfsClient::connect("127.0.0.1", port, export)?, dir))
        }
        NfsService::PerVolume { .. } => Ok((
            NfsClient::connect("127.0.0.1", port, &mount_path(volume))?,
            "/".to_owned(),
        )),
        NfsService::OfAnotherSystem { .. } => {
            anyhow::bail!("the scenarios here run on a System of their own")
        }
    }
}

/// The volume's directory on the NFS server.
fn server_dir(system: &System, volume: &PersistentVolume) -> PathBuf {
    // Where the data lies is the PV's annotation: its `spec.nfs.path` may be an opaque
    // name that says nothing of it.
    let recorded = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nfsprov.dev/path"))
        .cloned()
        .unwrap_or_default();
    system.agents[0].root.join(recorded)
}

/// `name` in the directory `dir` of an NFS client.
fn at(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// A `SnapshotSchedule` as a user applies it: every interval a Snapshot of each selected
/// claim, the newest `keep` kept, and once `keep` gives way to `maxAge`, the older ones
/// pruned by age; a claim restored from the newest Snapshot reads, through NFS, exactly
/// what was written before that run. On a real API server this is what fails when the
/// controller's Snapshots lack their `apiVersion` and `kind`.
#[tokio::test(flavor = "multi_thread")]
async fn a_schedule_keeps_the_newest_snapshots_of_each_claim_prunes_by_age_and_restores_the_last_write()
-> anyhow::Result<()> {
    let test = "a_schedule_keeps_the_newest_snapshots_of_each_claim_prunes_by_age_and_restores_the_last_write";
    if let Err(why) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(test, &why);
        return Ok(());
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start_with_agents(
        KubeApi::start().await?,
        &[AgentSpec::named("nfs1")],
        1,
        &["--leader-elect=false"],
    )
    .await?;
    let class = "e2e-sched";
    system
        .class(
            class,
            json!({"agent": "nfs1", "onDelete": "delete", "pathPattern": "${.PVC.name}"}),
        )
        .await?;
    let selected = ["alpha", "beta"];
    for claim in selected {
        system
            .claim(claim, class, json!({"backup": "yes"}), json!({}))
            .await?;
    }
    system
        .claim("ignored", class, json!({"backup": "no"}), json!({}))
        .await?;
    let mut clients = BTreeMap::new();
    for claim in selected {
        let volume = system.bound_volume(claim, WAIT).await?;
        clients.insert(claim, mount(&system, &volume)?);
    }
    system.bound_volume("ignored", WAIT).await?;

    let schedules = schedule_api(&system);
    let schedule: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nfsprov.dev/v1alpha1",
        "kind": "SnapshotSchedule",
        "metadata": {"name": "often", "namespace": system.names.namespace},
        "spec": {
            "claimSelector": {"matchLabels": {"backup": "yes"}},
            "interval": "3s",
            "keep": KEEP,
        },
    }))?;
    schedules.create(&PostParams::default(), &schedule).await?;
    let snapshots = snapshot_api(&system);

    // Several runs: each time a generation of content is written, then a Snapshot made
    // after the write (absent when the write ended) is awaited for each claim.
    let mut newest = BTreeMap::new();
    let mut seen = std::collections::BTreeSet::new();
    for generation in 0..4u32 {
        for (claim, (nfs, dir)) in &clients {
            nfs.write_file(
                &at(dir, "generation"),
                &generation_content(claim, generation),
                0o644,
            )?;
        }
        let before: std::collections::BTreeSet<String> = scheduled(&snapshots)
            .await?
            .into_iter()
            .map(|(n, _)| n)
            .collect();
        seen.extend(before.iter().cloned());
        for claim in selected {
            let made = ready_snapshot_after(&system, &snapshots, claim, &before).await?;
            newest.insert(claim, (made, generation));
        }
    }
    // Pruned to the newest KEEP per claim, the newest among them; none of the claim the
    // selector leaves out.
    let deadline = Instant::now() + WAIT;
    loop {
        let made = scheduled(&snapshots).await?;
        seen.extend(made.iter().map(|(n, _)| n.clone()));
        assert!(
            made.iter().all(|(_, claim)| claim != "ignored"),
            "a Snapshot of an unselected claim: {made:?}"
        );
        let per_claim = |claim: &str| {
            let mut names: Vec<&String> = made
                .iter()
                .filter(|(_, c)| c == claim)
                .map(|(n, _)| n)
                .collect();
            names.sort();
            names
        };
        let pruned = selected.iter().all(|claim| {
            let names = per_claim(claim);
            // Names end in the run's start time, so they sort by age; all seen ones older
            // than the kept ones are gone.
            names.len() == KEEP
                && seen
                    .iter()
                    .filter(|n| n.starts_with(&format!("often-{claim}-")))
                    .filter(|n| n.as_str() < names[0].as_str())
                    .all(|n| !names.contains(&n))
        });
        if pruned && seen.len() > 2 * KEEP {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "not pruned to {KEEP} per claim within {WAIT:?}: {made:?} (seen {seen:?})\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The newest Snapshot of each claim restores what was written before its run.
    for (claim, (snapshot, generation)) in &newest {
        // A later run may have taken the same content; the one awaited may since be
        // pruned, so the newest present is restored (its content is the same: nothing
        // was written after the last generation).
        let current = scheduled(&snapshots)
            .await?
            .into_iter()
            .filter(|(_, c)| c == claim)
            .map(|(n, _)| n)
            .max()
            .unwrap_or_else(|| snapshot.clone());
        let restored = format!("{claim}-restored");
        restore_claim(&system, &restored, class, &current, "1Gi").await?;
        let volume = system.bound_volume(&restored, WAIT).await?;
        let (nfs, dir) = mount(&system, &volume)?;
        assert_eq!(
            nfs.read_file(&at(&dir, "generation"))?,
            generation_content(claim, *generation),
            "{restored} from {current}"
        );
    }

    // keep gives way to maxAge: only age prunes now, so every Snapshot of the keep phase
    // goes once older than maxAge, while new runs go on.
    let keep_phase: Vec<String> = scheduled(&snapshots)
        .await?
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    schedules
        .patch(
            "often",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"keep": null, "maxAge": "8s"}})),
        )
        .await?;
    let deadline = Instant::now() + WAIT;
    loop {
        let made = scheduled(&snapshots).await?;
        let old_gone = keep_phase.iter().all(|n| !made.iter().any(|(m, _)| m == n));
        let new_made = selected.iter().all(|claim| {
            made.iter()
                .any(|(n, c)| c == claim && !keep_phase.contains(n))
        });
        if old_gone && new_made {
            break;
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the keep phase's {keep_phase:?} not pruned by age within {WAIT:?}: {made:?}\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    schedules.delete("often", &DeleteParams::default()).await?;
    Ok(())
}

/// Snapshots kept per claim by the schedule of the test above.
const KEEP: usize = 2;

/// What generation `generation` of the test above writes into `claim`: distinct per
/// claim and generation, and large enough to take more than one NFS write.
fn generation_content(claim: &str, generation: u32) -> Vec<u8> {
    let line = format!("{claim} generation {generation}\n");
    line.repeat((256 << 10) / line.len()).into_bytes()
}

fn schedule_api(system: &System) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nfsprov.dev", "v1alpha1", "SnapshotSchedule");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "snapshotschedules");
    Api::namespaced_with(system.client.clone(), &system.names.namespace, &resource)
}

/// The schedule's Snapshots not being deleted: (name, claim).
async fn scheduled(snapshots: &Api<DynamicObject>) -> anyhow::Result<Vec<(String, String)>> {
    let list = snapshots
        .list(&kube::api::ListParams::default().labels("nfsprov.dev/snapshot-schedule=often"))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .map(|s| {
            let claim = s.data["spec"]["source"]["persistentVolumeClaimName"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (s.metadata.name.unwrap_or_default(), claim)
        })
        .collect())
}

/// Waits for a ready Snapshot of `claim` that is not among `before`; its name.
async fn ready_snapshot_after(
    system: &System,
    snapshots: &Api<DynamicObject>,
    claim: &str,
    before: &std::collections::BTreeSet<String>,
) -> anyhow::Result<String> {
    let deadline = Instant::now() + WAIT;
    loop {
        let made = scheduled(snapshots).await?;
        if let Some((name, _)) = made
            .iter()
            .filter(|(n, c)| c == claim && !before.contains(n))
            .max()
        {
            return ready_snapshot(system, snapshots, name)
                .await
                .map(|_| name.clone());
        }
        if Instant::now() > deadline {
            let schedule = schedule_api(system).get("often").await?;
            anyhow::bail!(
                "no new Snapshot of {claim} within {WAIT:?}: {made:?}; schedule status {}\n{}",
                schedule.data["status"],
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
