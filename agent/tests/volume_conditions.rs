//! Each volume's condition over the real HTTPS API, one test per reason: the real fault
//! is made behind the agent's back (a directory moved away, a filesystem remounted
//! read-only, filled up or shut down, an export dropped from ganesha), the condition is
//! awaited through `GET /v1/volumes/{path}` and the list, then, where the fault can be
//! undone, the recovery. The agent's periodic pass runs every second here.

mod common;

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use common::is_root;
use nfsprov_agent::exports::ExportSettings;
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::ganesha::{Ganesha, PrivateBus};
use nfsprov_agent_testkit::{LoopXfs, TestAgent, eventually, run};
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{
    AbnormalReason, CreateVolumeRequest, ExportManager, ExportRequest, QuotaBackend, QuotaPolicy,
    Volume, VolumeCondition, VolumeList, VolumePath,
};

const MIB: u64 = 1 << 20;
/// Far beyond the one-second pass: a hang, not a slow pass, fails the wait.
const WAIT: Duration = Duration::from_secs(30);

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn every_second(exports: ExportSettings) -> ExportSettings {
    ExportSettings {
        reconcile_interval: Duration::from_secs(1),
        ..exports
    }
}

async fn agent_on(root: &Path, quota: QuotaSettings) -> TestAgent {
    TestAgent::start_with_quota_and_exports(root, quota, every_second(ExportSettings::default()))
        .await
        .unwrap()
}

fn create(capacity_bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        ..CreateVolumeRequest::default()
    }
}

async fn condition(client: &AgentClient, volume: &VolumePath) -> Option<VolumeCondition> {
    let got: Option<Volume> = client.get_volume(volume, None).await.ok().flatten();
    got.and_then(|volume| volume.condition)
}

/// Waits until the volume's condition, as `GET` answers it, is abnormal for `reason`
/// (or normal for `None`); answers it.
async fn await_condition(
    client: &AgentClient,
    volume: &VolumePath,
    reason: Option<AbnormalReason>,
) -> VolumeCondition {
    let deadline = Instant::now() + WAIT;
    loop {
        let now = condition(client, volume).await;
        if let Some(found) = now.as_ref().filter(|c| c.abnormal == reason) {
            return found.clone();
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {volume} to be {}; last: {now:?}",
            reason.map_or("normal", |r| r.as_str())
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The condition the list reports for `volume`.
async fn listed_condition(client: &AgentClient, volume: &VolumePath) -> Option<VolumeCondition> {
    client
        .list_volumes(None)
        .await
        .unwrap()
        .into_iter()
        .find(|v| &v.path == volume)
        .and_then(|v| v.condition)
}

fn installed(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|dir| dir.join(tool).is_file())
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_whose_directory_is_moved_away_is_missing_until_it_is_back() {
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("exports");
    std::fs::create_dir(&root).unwrap();
    let agent = agent_on(&root, QuotaSettings::default()).await;
    let client = agent.client();
    let volume = path("team-a/app");
    client
        .create_volume(&volume, &create(MIB), None)
        .await
        .unwrap();
    let normal = await_condition(&client, &volume, None).await;
    assert_eq!(normal, VolumeCondition::normal());
    assert_eq!(
        listed_condition(&client, &volume).await,
        Some(VolumeCondition::normal())
    );
    // Its neighbours in the listing, before and after it.
    for neighbour in ["team-a/0-before", "team-b/after"] {
        client
            .create_volume(&path(neighbour), &create(MIB), None)
            .await
            .unwrap();
    }
    // Seen by a pass, so the agent knows the volume once its directory is gone.
    eventually("a pass to see the volumes", WAIT, || async {
        metric(&agent, "nfsprov_agent_volumes_checked").is_some_and(|n| n >= 3.0)
    })
    .await
    .unwrap();

    let dir = root.join(volume.as_str());
    let aside = base.path().join("aside");
    std::fs::rename(&dir, &aside).unwrap();
    let missing = await_condition(&client, &volume, Some(AbnormalReason::Missing)).await;
    assert!(
        missing.message.contains(&dir.display().to_string()),
        "{}",
        missing.message
    );
    eventually("the pass to count it missing", WAIT, || async {
        metric(&agent, "nfsprov_agent_volumes_abnormal{reason=\"missing\"}") == Some(1.0)
    })
    .await
    .unwrap();
    // Listed too, whole and in pages of one, in its place among the others.
    assert_eq!(
        listed_condition(&client, &volume)
            .await
            .and_then(|c| c.abnormal),
        Some(AbnormalReason::Missing)
    );
    let mut paged = Vec::new();
    let mut after: Option<String> = None;
    loop {
        let query = match &after {
            Some(after) => format!("/v1/volumes?limit=1&after={after}"),
            None => "/v1/volumes?limit=1".to_owned(),
        };
        let answer = common::call(&agent, "GET", &query, None);
        assert_eq!(answer.status, 200, "{}", answer.body);
        let page: VolumeList = serde_json::from_str(&answer.body).unwrap();
        paged.extend(
            page.volumes
                .into_iter()
                .map(|v| (v.path.to_string(), v.condition.and_then(|c| c.abnormal))),
        );
        match page.next {
            Some(next) => after = Some(next),
            None => break,
        }
    }
    assert_eq!(
        paged,
        [
            ("team-a/0-before".to_owned(), None),
            ("team-a/app".to_owned(), Some(AbnormalReason::Missing)),
            ("team-b/after".to_owned(), None),
        ]
    );

    std::fs::rename(&aside, &dir).unwrap();
    await_condition(&client, &volume, None).await;
    eventually("the pass to count it normal", WAIT, || async {
        metric(&agent, "nfsprov_agent_volumes_abnormal{reason=\"missing\"}") == Some(0.0)
    })
    .await
    .unwrap();

    // Deleted through the API, it is gone, not missing.
    client.delete_volume(&volume, None).await.unwrap();
    assert_eq!(client.get_volume(&volume, None).await.unwrap(), None);
    agent.stop().await.unwrap();
}

/// The value of the agent's metric line starting with `name` (labels included).
fn metric(agent: &TestAgent, name: &str) -> Option<f64> {
    let answer = common::call(agent, "GET", "/metrics", None);
    let text = answer.body.clone();
    text.lines().find_map(|line| {
        line.strip_prefix(name)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_on_a_filesystem_remounted_read_only_is_read_only_until_it_is_writable() {
    const TEST: &str =
        "a_volume_on_a_filesystem_remounted_read_only_is_read_only_until_it_is_writable";
    if !is_root() {
        nfsprov_test_skip::skip(TEST, "mounting a tmpfs needs root");
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let mount = base.path().join("tmpfs");
    std::fs::create_dir(&mount).unwrap();
    let mount_arg = mount.to_str().unwrap();
    if let Err(e) = run(
        "mount",
        &["-t", "tmpfs", "-o", "size=64m", "tmpfs", mount_arg],
    ) {
        nfsprov_test_skip::skip(TEST, &format!("no tmpfs mount: {e}"));
        return;
    }
    let _unmount = Unmount(mount.clone());
    let root = mount.join("exports");
    std::fs::create_dir(&root).unwrap();
    let agent = agent_on(&root, QuotaSettings::default()).await;
    let client = agent.client();
    let volume = path("team-a/app");
    client
        .create_volume(&volume, &create(MIB), None)
        .await
        .unwrap();
    await_condition(&client, &volume, None).await;

    run("mount", &["-o", "remount,ro", mount_arg]).unwrap();
    let read_only = await_condition(&client, &volume, Some(AbnormalReason::ReadOnly)).await;
    assert!(
        read_only.message.contains("read-only"),
        "{}",
        read_only.message
    );
    assert_eq!(
        listed_condition(&client, &volume)
            .await
            .and_then(|c| c.abnormal),
        Some(AbnormalReason::ReadOnly)
    );
    eventually("the pass to count it read-only", WAIT, || async {
        metric(
            &agent,
            "nfsprov_agent_volumes_abnormal{reason=\"read_only\"}",
        ) == Some(1.0)
    })
    .await
    .unwrap();

    run("mount", &["-o", "remount,rw", mount_arg]).unwrap();
    await_condition(&client, &volume, None).await;
    agent.stop().await.unwrap();
}

/// `mount` unmounted when dropped (lazily: the agent may still hold a descriptor).
struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = run("umount", &["--lazy", self.0.to_str().unwrap()]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_filled_to_its_capacity_is_quota_full_until_space_is_freed() {
    const TEST: &str = "an_image_volume_filled_to_its_capacity_is_quota_full_until_space_is_freed";
    let fs = match LoopXfs::new(512, true) {
        Ok(fs) => fs,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("no XFS loop filesystem: {e}"));
            return;
        }
    };
    let root = fs.root();
    let quota = QuotaSettings {
        backend: QuotaBackend::Image,
        ..QuotaSettings::default()
    };
    let agent = agent_on(&root, quota).await;
    let client = agent.client();
    let volume = path("team-a/app");
    let request = CreateVolumeRequest {
        quota: QuotaPolicy::Enforce,
        ..create(32 * MIB)
    };
    client.create_volume(&volume, &request, None).await.unwrap();
    await_condition(&client, &volume, None).await;

    let file = root.join(volume.as_str()).join("big");
    let mut out = std::fs::File::create(&file).unwrap();
    let chunk = vec![7u8; MIB as usize];
    let error = loop {
        if let Err(e) = out.write_all(&chunk).and_then(|()| out.sync_data()) {
            break e;
        }
    };
    assert_eq!(
        error.raw_os_error(),
        Some(rustix::io::Errno::NOSPC.raw_os_error())
    );
    drop(out);
    let full = await_condition(&client, &volume, Some(AbnormalReason::QuotaFull)).await;
    assert!(full.message.contains("no space left"), "{}", full.message);

    std::fs::remove_file(&file).unwrap();
    await_condition(&client, &volume, None).await;
    client.delete_volume(&volume, None).await.unwrap();
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_on_an_xfs_that_shuts_down_reports_a_filesystem_error() {
    const TEST: &str = "a_volume_on_an_xfs_that_shuts_down_reports_a_filesystem_error";
    if !installed("xfs_io") {
        nfsprov_test_skip::skip(TEST, "xfs_io is not installed");
        return;
    }
    let fs = match LoopXfs::new(512, false) {
        Ok(fs) => fs,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("no XFS loop filesystem: {e}"));
            return;
        }
    };
    let root = fs.root();
    let agent = agent_on(&root, QuotaSettings::default()).await;
    let client = agent.client();
    let volume = path("team-a/app");
    client
        .create_volume(&volume, &create(MIB), None)
        .await
        .unwrap();
    await_condition(&client, &volume, None).await;
    eventually("a pass to see the volume", WAIT, || async {
        metric(&agent, "nfsprov_agent_volumes_checked").is_some_and(|n| n >= 1.0)
    })
    .await
    .unwrap();

    run(
        "xfs_io",
        &["-x", "-c", "shutdown", fs.mount_point().to_str().unwrap()],
    )
    .unwrap();
    let failing = await_condition(&client, &volume, Some(AbnormalReason::FilesystemError)).await;
    assert!(failing.message.contains("error"), "{}", failing.message);
    eventually("the pass to count it", WAIT, || async {
        metric(
            &agent,
            "nfsprov_agent_volumes_abnormal{reason=\"filesystem_error\"}",
        ) == Some(1.0)
    })
    .await
    .unwrap();
    agent.stop().await.unwrap();
    // The shut-down filesystem is unmounted when `fs` drops.
}

/// An agent exporting through ganesha on a private bus (passes every second) and its one
/// exported volume, `team-a/app`.
struct ExportedVolume {
    agent: TestAgent,
    client: AgentClient,
    volume: VolumePath,
    ganesha: Ganesha,
    config_dir: std::path::PathBuf,
    _bus: PrivateBus,
    _base: tempfile::TempDir,
}

/// [`ExportedVolume`] made; `None`, `test` skipped by name, without ganesha here.
async fn exported_volume(test: &str) -> Option<ExportedVolume> {
    if let Some(tool) = ["ganesha.nfsd", "dbus-daemon", "dbus-send"]
        .into_iter()
        .find(|tool| !installed(tool))
    {
        nfsprov_test_skip::skip(test, &format!("{tool} is not installed"));
        return None;
    }
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("exports");
    std::fs::create_dir(&root).unwrap();
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await.unwrap();
    let ganesha = Ganesha::start(&bus, &config_dir).await.unwrap();
    let exports = ExportSettings {
        manager: ExportManager::Ganesha,
        ganesha_config_dir: config_dir.clone(),
        ganesha_dbus_address: Some(bus.address().to_owned()),
        allow_shared_filesystem: true,
        mount_control_only: true,
        ..ExportSettings::default()
    };
    let agent = TestAgent::start_with_quota_and_exports(
        &root,
        QuotaSettings::default(),
        every_second(exports),
    )
    .await
    .unwrap();
    let client = agent.client();
    let volume = path("team-a/app");
    let request = CreateVolumeRequest {
        export: Some(ExportRequest {
            clients: vec!["127.0.0.1".parse().unwrap()],
            ..ExportRequest::default()
        }),
        ..create(MIB)
    };
    client.create_volume(&volume, &request, None).await.unwrap();
    Some(ExportedVolume {
        agent,
        client,
        volume,
        ganesha,
        config_dir,
        _bus: bus,
        _base: base,
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn an_export_ganesha_drops_is_served_again_within_a_pass_and_reported_repaired() {
    const TEST: &str =
        "an_export_ganesha_drops_is_served_again_within_a_pass_and_reported_repaired";
    let Some(ExportedVolume {
        agent,
        client,
        volume,
        ganesha,
        config_dir: _,
        // Bound, so that they live to the end of the test.
        _bus,
        _base,
    }) = exported_volume(TEST).await
    else {
        return;
    };
    let before = await_condition(&client, &volume, None).await;
    assert_eq!(before.repaired, None);
    // ganesha's own pseudo-filesystem root is export 0.
    let ours = || -> Vec<u16> {
        let mut ids = ganesha.export_ids().unwrap();
        ids.retain(|id| *id != 0);
        ids
    };
    let served = ours();
    assert_eq!(served.len(), 1, "{served:?}");

    ganesha.remove_export(served[0]).unwrap();
    assert!(ours().is_empty(), "dropped behind the agent's back");
    eventually("the export served again", WAIT, || async {
        ours() == served
    })
    .await
    .unwrap();
    eventually("the repair reported", WAIT, || async {
        condition(&client, &volume)
            .await
            .is_some_and(|c| c.repaired.is_some())
    })
    .await
    .unwrap();
    let after = condition(&client, &volume).await.unwrap();
    assert_eq!(after.abnormal, None, "served again: normal");
    let repaired = after.repaired.unwrap();
    assert_eq!(repaired.reason, AbnormalReason::NotExported);
    assert!(repaired.found_at <= repaired.repaired_at, "{repaired:?}");
    assert!(
        repaired.message.contains("exported it again"),
        "{}",
        repaired.message
    );
    // Kept for the controller's next look, in the list too.
    assert_eq!(
        listed_condition(&client, &volume)
            .await
            .and_then(|c| c.repaired),
        Some(repaired)
    );
    client.delete_volume(&volume, None).await.unwrap();
    agent.stop().await.unwrap();
    drop(ganesha);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_export_ganesha_refuses_to_serve_again_is_not_exported_until_it_is_served() {
    const TEST: &str =
        "an_export_ganesha_refuses_to_serve_again_is_not_exported_until_it_is_served";
    let Some(ExportedVolume {
        agent,
        client,
        volume,
        ganesha,
        config_dir,
        _bus,
        _base,
    }) = exported_volume(TEST).await
    else {
        return;
    };
    await_condition(&client, &volume, None).await;
    let mut ids = ganesha.export_ids().unwrap();
    ids.retain(|id| *id != 0);
    assert_eq!(ids.len(), 1, "{ids:?}");
    let id = ids[0];

    // The export's block spoilt, then the export dropped: ganesha refuses it back.
    let file = config_dir.join(format!("export-{id}.conf"));
    let block = std::fs::read_to_string(&file).unwrap();
    std::fs::write(&file, "# nothing here\n").unwrap();
    ganesha.remove_export(id).unwrap();
    let unserved = await_condition(&client, &volume, Some(AbnormalReason::NotExported)).await;
    assert!(
        unserved.message.contains("does not serve"),
        "{}",
        unserved.message
    );
    eventually("the pass to count it", WAIT, || async {
        metric(
            &agent,
            "nfsprov_agent_volumes_abnormal{reason=\"not_exported\"}",
        ) == Some(1.0)
    })
    .await
    .unwrap();

    let found = unserved_since(&client, &volume).await;
    std::fs::write(&file, block).unwrap();
    let served = await_condition(&client, &volume, None).await;
    assert!(ganesha.export_ids().unwrap().contains(&id));
    let repaired = served.repaired.expect("the repair reported");
    assert_eq!(repaired.reason, AbnormalReason::NotExported);
    // Found by the first pass that could not serve it, before the block was mended.
    assert!(repaired.found_at <= found, "{repaired:?} found by {found}");
    assert!(repaired.found_at < repaired.repaired_at, "{repaired:?}");
    client.delete_volume(&volume, None).await.unwrap();
    agent.stop().await.unwrap();
    drop(ganesha);
}

/// An RFC 3339 time (UTC, whole seconds) after the volume was seen unserved: one second
/// after now, so that it orders after the pass that found it.
async fn unserved_since(client: &AgentClient, volume: &VolumePath) -> String {
    assert_eq!(
        condition(client, volume).await.and_then(|c| c.abnormal),
        Some(AbnormalReason::NotExported)
    );
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Waits for the next second: the repair's found_at, whole seconds or finer, is before.
    while std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        == now
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let output = run("date", &["-u", "+%Y-%m-%dT%H:%M:%SZ"]).unwrap();
    output.trim().to_owned()
}
