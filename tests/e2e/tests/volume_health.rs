//! Volume health through the whole system: the controller binary against Kubernetes (the
//! simulator, or a real API server with `E2E_KUBECONFIG`), the agent with the `ganesha`
//! export manager, and ganesha on a private D-Bus. Each scenario binds a claim, breaks its
//! volume behind the system's back (the directory removed, the export dropped from
//! ganesha, the filesystem remounted read-only, the quota filled, the agent killed, the
//! filesystem shut down), awaits the claim's `VolumeConditionAbnormal` event naming the
//! cause, repairs it and awaits `VolumeConditionNormal`, each within a bound that only a
//! detection within one interval meets.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::ListParams;
use nfsprov_api_types::VolumePath;
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::ganesha_dbus::Ganesha;
use nfsprov_e2e::libnfs::{NfsClient, NfsError};
use nfsprov_e2e::system::{AgentSpec, NfsService, System};
use serde_json::json;

/// How often the controller asks the agents about their volumes.
const USAGE_INTERVAL_SECONDS: u64 = 2;
/// How long an agent failing every request is given before its claims are told.
const AGENT_UNREACHABLE_SECONDS: u64 = 6;
/// How often the agent checks its volumes and repairs their exports.
const RECONCILE_INTERVAL_SECONDS: u64 = 1;

/// A fault is found by the agent's check within one reconcile interval and seen by the
/// controller at its next poll, within one usage interval: one of each, about 3 s here.
/// Three times the longer interval plus 10 s is margin for a loaded machine, and still
/// far below what a detection by anything slower would take (a controller restart, the
/// default 60 s poll, the default 30 s reconcile).
const EVENT_BOUND: Duration =
    Duration::from_secs(3 * max(USAGE_INTERVAL_SECONDS, RECONCILE_INTERVAL_SECONDS) + 10);
/// An unreachable agent is reported once it has failed for its limit: the limit, then
/// the same bound as a fault the agent reports.
const UNREACHABLE_BOUND: Duration =
    Duration::from_secs(AGENT_UNREACHABLE_SECONDS + 3 * USAGE_INTERVAL_SECONDS + 10);
/// Provisioning and binding, which these scenarios do not time.
const BIND: Duration = Duration::from_secs(60);

const ABNORMAL: &str = "VolumeConditionAbnormal";
const NORMAL: &str = "VolumeConditionNormal";
const AGENT: &str = "nfs1";
const MIB: u64 = 1 << 20;

const fn max(a: u64, b: u64) -> u64 {
    if a > b { a } else { b }
}

fn controller_args() -> Vec<String> {
    vec![
        "--leader-elect=false".to_owned(),
        format!("--usage-interval-seconds={USAGE_INTERVAL_SECONDS}"),
        format!("--agent-unreachable-seconds={AGENT_UNREACHABLE_SECONDS}"),
    ]
}

/// The whole system with one agent, [`AGENT`], whose volumes ganesha exports one by one,
/// its export root `root` when given, `settings` added to the agent's.
async fn start_system(root: Option<PathBuf>, settings: &str) -> anyhow::Result<System> {
    let args = controller_args();
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    System::start_with_exports_settings(
        KubeApi::start().await?,
        AgentSpec {
            name: AGENT.into(),
            root,
            settings: settings.into(),
        },
        &format!("reconcile_interval_seconds = {RECONCILE_INTERVAL_SECONDS}"),
        &args,
    )
    .await
}

/// A class on [`AGENT`] exporting to the in-process NFS client (127.0.0.1), with `more`.
async fn class(system: &System, name: &str, more: serde_json::Value) -> anyhow::Result<()> {
    let mut params = json!({
        "agent": AGENT,
        "onDelete": "delete",
        "pathPattern": "${.PVC.name}",
        "exportClients": "127.0.0.1",
        "squash": "none",
    });
    if let (Some(params), Some(more)) = (params.as_object_mut(), more.as_object()) {
        params.extend(more.clone());
    }
    system.class(name, params).await
}

/// A bound claim of `class`, `size` big, and its PV.
async fn bound_claim(
    system: &System,
    claim: &str,
    class: &str,
    size: &str,
) -> anyhow::Result<PersistentVolume> {
    system
        .claim_of(claim, class, &["ReadWriteMany"], size)
        .await?;
    system.bound_volume(claim, BIND).await
}

/// The volume's path on its agent, as the PV's annotation records it.
fn volume_path(volume: &PersistentVolume) -> anyhow::Result<VolumePath> {
    let recorded = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nfsprov.dev/path"))
        .ok_or_else(|| anyhow::anyhow!("the PV records no volume path"))?;
    Ok(VolumePath::parse(recorded)?)
}

/// The volume's directory on the NFS server.
fn directory(system: &System, volume: &PersistentVolume) -> anyhow::Result<PathBuf> {
    Ok(system.agents[0].root.join(volume_path(volume)?.as_str()))
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

fn ganesha(system: &System) -> anyhow::Result<&Ganesha> {
    match &system.nfs {
        NfsService::PerVolume { ganesha, .. } => Ok(ganesha),
        _ => anyhow::bail!("the system does not run ganesha's per-volume exports"),
    }
}

/// One event about a claim as the events API keeps it.
#[derive(Debug, Clone)]
struct Seen {
    name: String,
    reason: String,
    type_: String,
    note: String,
    /// 1, or the series count when the event was repeated.
    count: i32,
}

/// The events about the claim `claim`, through `events.k8s.io/v1` (what the controller
/// publishes with).
async fn events_about(system: &System, claim: &str) -> anyhow::Result<Vec<Seen>> {
    let listed = Api::<Event>::namespaced(system.client.clone(), &system.names.namespace)
        .list(&ListParams::default())
        .await?;
    Ok(listed
        .items
        .into_iter()
        .filter(|e| {
            e.regarding.as_ref().is_some_and(|r| {
                r.name.as_deref() == Some(claim)
                    && r.kind.as_deref() == Some("PersistentVolumeClaim")
            })
        })
        .map(|e| Seen {
            name: e.metadata.name.unwrap_or_default(),
            reason: e.reason.unwrap_or_default(),
            type_: e.type_.unwrap_or_default(),
            note: e.note.unwrap_or_default(),
            count: e.series.map_or(1, |s| s.count),
        })
        .collect())
}

/// What the claim's events were at one moment: an occurrence after it is an event not
/// among them, or one whose series has grown since.
struct Mark {
    counts: HashMap<String, i32>,
}

impl Mark {
    async fn now(system: &System, claim: &str) -> anyhow::Result<Self> {
        let counts = events_about(system, claim)
            .await?
            .into_iter()
            .map(|e| (e.name, e.count))
            .collect();
        Ok(Self { counts })
    }

    fn is_new(&self, event: &Seen) -> bool {
        self.counts
            .get(&event.name)
            .is_none_or(|&c| event.count > c)
    }
}

/// Awaits an occurrence after `since` of an event `reason` of `type_` about `claim`
/// whose note names `cause`, within `bound` of `started` (when the fault or its repair
/// was made); returns when it came.
#[allow(clippy::too_many_arguments)]
async fn await_event(
    system: &System,
    claim: &str,
    since: &Mark,
    reason: &str,
    type_: &str,
    cause: &str,
    started: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
    loop {
        let events = events_about(system, claim).await?;
        if events.iter().any(|e| {
            since.is_new(e) && e.reason == reason && e.type_ == type_ && e.note.contains(cause)
        }) {
            let took = started.elapsed();
            println!("{claim}: {reason} naming {cause:?} after {took:?}");
            return Ok(took);
        }
        if started.elapsed() > bound {
            anyhow::bail!(
                "no {type_} {reason} event naming {cause:?} about {claim} within {bound:?}; events: {events:#?}\nagent log:\n{}\n{}",
                system.agents[0].process.log_text(),
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Awaits the claim's `VolumeConditionAbnormal` (a warning) naming `cause`.
async fn await_abnormal(
    system: &System,
    claim: &str,
    since: &Mark,
    cause: &str,
    started: Instant,
    bound: Duration,
) -> anyhow::Result<Duration> {
    await_event(
        system, claim, since, ABNORMAL, "Warning", cause, started, bound,
    )
    .await
}

/// Awaits the claim's `VolumeConditionNormal`, within one detection of the repair.
async fn await_normal(
    system: &System,
    claim: &str,
    since: &Mark,
    started: Instant,
) -> anyhow::Result<Duration> {
    await_event(
        system,
        claim,
        since,
        NORMAL,
        "Normal",
        "",
        started,
        EVENT_BOUND,
    )
    .await
}

/// A healthy volume has no abnormal event: checked before each fault, so that the event
/// awaited after it is the fault's own. First the controller must have looked at the
/// volume once (its usage is published): what the agent repaired before the controller's
/// first look is, by design, not replayed as an event.
async fn await_seen_normal(system: &System, claim: &str) -> anyhow::Result<()> {
    let claim_label = format!("persistentvolumeclaim=\"{claim}\"");
    let namespace_label = format!("namespace=\"{}\"", system.names.namespace);
    let started = Instant::now();
    loop {
        let metrics = system.controllers[0].metrics()?;
        let measured = metrics.lines().any(|line| {
            line.strip_prefix("nfsprov_volume_used_bytes{")
                .is_some_and(|rest| rest.contains(&claim_label) && rest.contains(&namespace_label))
        });
        if measured {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < EVENT_BOUND,
            "the controller did not measure {claim} within {EVENT_BOUND:?}\n{metrics}\n{}",
            system.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let events = events_about(system, claim).await?;
    anyhow::ensure!(
        !events.iter().any(|e| e.reason == ABNORMAL),
        "{claim} reported abnormal before any fault: {events:#?}"
    );
    Ok(())
}

/// The value of the controller's `nfsprov_volume_abnormal` for `reason` on [`AGENT`],
/// whatever the order of its labels.
fn abnormal_gauge(system: &System, reason: &str) -> anyhow::Result<Option<f64>> {
    let text = system.controllers[0].metrics()?;
    let agent = format!("agent=\"{AGENT}\"");
    let reason = format!("reason=\"{reason}\"");
    Ok(text.lines().find_map(|line| {
        let (series, value) = line.rsplit_once(' ')?;
        let labels = series.strip_prefix("nfsprov_volume_abnormal{")?;
        let labels = labels.strip_suffix('}')?;
        let labels: Vec<&str> = labels.split(',').collect();
        (labels.contains(&agent.as_str()) && labels.contains(&reason.as_str()))
            .then(|| value.parse().ok())
            .flatten()
    }))
}

/// Awaits `nfsprov_volume_abnormal{agent=AGENT,reason}` at `value`: the gauge follows the
/// same poll as the events, so it gets there within the same bound.
async fn await_gauge(system: &System, reason: &str, value: f64) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let gauge = abnormal_gauge(system, reason)?;
        if gauge == Some(value) {
            return Ok(());
        }
        if started.elapsed() > EVENT_BOUND {
            anyhow::bail!(
                "nfsprov_volume_abnormal{{agent={AGENT:?},reason={reason:?}}} is {gauge:?}, not {value}, within {EVENT_BOUND:?}\n{}",
                system.controllers[0].metrics()?
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Runs `program` with `args`; fails with what it printed unless it succeeds.
fn run(program: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<()> {
    let output = Command::new(program).args(args).output()?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {args:?}: {}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

fn remount(mount_point: &Path, options: &str) -> anyhow::Result<()> {
    run(
        "mount",
        &["-o".as_ref(), options.as_ref(), mount_point.as_os_str()],
    )
}

/// Whether this machine runs ganesha's per-volume exports and the libnfs client; when
/// not, `test` is skipped by name.
fn can_run(test: &str) -> bool {
    if !nfsprov_e2e::requirements::ganesha_exports(test) {
        return false;
    }
    if let Err(reason) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(test, &reason);
        return false;
    }
    true
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_directory_removed_from_its_place_on_the_server_is_reported_missing_until_put_back()
-> anyhow::Result<()> {
    const TEST: &str = "a_volume_directory_removed_from_its_place_on_the_server_is_reported_missing_until_put_back";
    if !can_run(TEST) {
        return Ok(());
    }
    let system = start_system(None, "").await?;
    class(&system, "e2e-health-missing", json!({})).await?;
    let volume = bound_claim(&system, "removed", "e2e-health-missing", "1Gi").await?;
    let dir = directory(&system, &volume)?;
    std::fs::write(dir.join("data"), b"kept aside")?;
    await_seen_normal(&system, "removed").await?;

    // Taken away from its path by hand, as a mistaken `mv` on the server does (a removal
    // is the same to the system: the path is empty).
    let aside = dir.with_file_name(".removed-by-hand");
    let before = Mark::now(&system, "removed").await?;
    let started = Instant::now();
    std::fs::rename(&dir, &aside)?;
    await_abnormal(&system, "removed", &before, "missing", started, EVENT_BOUND).await?;

    // Put back where it was: the same directory is the volume again. (A copy made from a
    // backup would be a new directory, which the agent refuses to take for the volume;
    // docs/operations.md says what to do then.)
    let before = Mark::now(&system, "removed").await?;
    let started = Instant::now();
    std::fs::rename(&aside, &dir)?;
    await_normal(&system, "removed", &before, started).await?;
    assert_eq!(std::fs::read(dir.join("data"))?, b"kept aside");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_export_ganesha_lost_is_reported_and_served_again_without_an_agent_restart()
-> anyhow::Result<()> {
    const TEST: &str =
        "an_export_ganesha_lost_is_reported_and_served_again_without_an_agent_restart";
    if !can_run(TEST) {
        return Ok(());
    }
    let system = start_system(None, "").await?;
    class(&system, "e2e-health-export", json!({})).await?;
    let volume = bound_claim(&system, "unexported", "e2e-health-export", "1Gi").await?;
    let dir = directory(&system, &volume)?;
    std::fs::write(dir.join("kept"), b"served before and after")?;
    // ganesha lists an export by the opaque path clients mount, which the PV gives.
    let served_path = mount_path(&volume);
    let ganesha = ganesha(&system)?;
    let export_id = |exports: Vec<(u16, String)>| {
        exports
            .into_iter()
            .find(|(_, path)| *path == served_path)
            .map(|(id, _)| id)
    };
    let exports = ganesha.exports()?;
    let id = export_id(exports.clone())
        .ok_or_else(|| anyhow::anyhow!("ganesha does not serve {served_path}: {exports:?}"))?;
    let nfs = NfsClient::connect("127.0.0.1", system.nfs.port(), &mount_path(&volume))?;
    assert_eq!(nfs.read_file("kept")?, b"served before and after");
    drop(nfs);
    await_seen_normal(&system, "unexported").await?;
    let agent_pid = system.agents[0].process.pid();

    // Behind the agent's back: ganesha drops the export the agent made.
    let before = Mark::now(&system, "unexported").await?;
    let started = Instant::now();
    ganesha.remove_export(id)?;
    anyhow::ensure!(
        export_id(ganesha.exports()?).is_none(),
        "ganesha still serves {served_path} after RemoveExport {id}"
    );
    // The agent repairs it by itself within one interval: the controller may see the
    // export missing, or only the repair the agent reports; either way the event names
    // the cause.
    await_abnormal(
        &system,
        "unexported",
        &before,
        "not_exported",
        started,
        EVENT_BOUND,
    )
    .await?;

    // Served again, by the same agent process: through ganesha's own list and to a
    // client that mounts it anew.
    let deadline = Instant::now() + EVENT_BOUND;
    while export_id(ganesha.exports()?).is_none() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "ganesha does not serve {served_path} again within {EVENT_BOUND:?}: {:?}\nagent log:\n{}",
            ganesha.exports()?,
            system.agents[0].process.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let nfs = NfsClient::connect("127.0.0.1", system.nfs.port(), &mount_path(&volume))?;
    assert_eq!(nfs.read_file("kept")?, b"served before and after");
    anyhow::ensure!(
        system.agents[0].process.pid() == agent_pid,
        "the agent was restarted"
    );
    await_normal(&system, "unexported", &before, started).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_remounted_read_only_is_reported_until_it_is_writable_again()
-> anyhow::Result<()> {
    const TEST: &str = "a_filesystem_remounted_read_only_is_reported_until_it_is_writable_again";
    if !can_run(TEST) {
        return Ok(());
    }
    let fs = match nfsprov_agent_testkit::LoopExt4::new(64) {
        Ok(fs) => fs,
        Err(error) => {
            nfsprov_test_skip::skip(TEST, &format!("no loop-mounted ext4 here: {error}"));
            return Ok(());
        }
    };
    let system = start_system(Some(fs.root()), "").await?;
    class(&system, "e2e-health-ro", json!({})).await?;
    bound_claim(&system, "frozen", "e2e-health-ro", "1Gi").await?;
    await_seen_normal(&system, "frozen").await?;
    await_gauge(&system, "read_only", 0.0).await?;

    let before = Mark::now(&system, "frozen").await?;
    let started = Instant::now();
    remount(fs.mount_point(), "remount,ro")?;
    await_abnormal(
        &system,
        "frozen",
        &before,
        "read_only",
        started,
        EVENT_BOUND,
    )
    .await?;
    await_gauge(&system, "read_only", 1.0).await?;

    let before = Mark::now(&system, "frozen").await?;
    let started = Instant::now();
    remount(fs.mount_point(), "remount,rw")?;
    await_normal(&system, "frozen", &before, started).await?;
    await_gauge(&system, "read_only", 0.0).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_quota_is_reported_until_space_is_freed() -> anyhow::Result<()> {
    const TEST: &str = "a_full_quota_is_reported_until_space_is_freed";
    // btrfs qgroups are the backend that enforces a capacity under a shared export root.
    let Some(btrfs) = nfsprov_e2e::requirements::btrfs_over_nfs(TEST, 512) else {
        return Ok(());
    };
    if !can_run(TEST) {
        return Ok(());
    }
    let system = start_system(Some(btrfs.root()), "[quota]\nbackend = \"btrfs\"").await?;
    class(&system, "e2e-health-quota", json!({"quota": "enforce"})).await?;
    let volume = bound_claim(&system, "filled", "e2e-health-quota", "10Mi").await?;
    let dir = directory(&system, &volume)?;
    await_seen_normal(&system, "filled").await?;

    // Written through NFS until the quota refuses more: twice the capacity is offered.
    let nfs = NfsClient::connect("127.0.0.1", system.nfs.port(), &mount_path(&volume))?;
    let before = Mark::now(&system, "filled").await?;
    let started = Instant::now();
    let refused = nfs
        .write_file("fill", &vec![0x5a_u8; (20 * MIB) as usize], 0o644)
        .expect_err("a write of twice the capacity went through");
    anyhow::ensure!(
        NfsError::is_quota_exceeded(&refused),
        "not refused by the quota: {refused:#}"
    );
    // The qgroup counts what is committed: the agent's look is as of the next commit.
    btrfs.sync()?;
    println!(
        "{} bytes landed before the quota refused the write",
        std::fs::metadata(dir.join("fill"))?.len()
    );
    await_abnormal(
        &system,
        "filled",
        &before,
        "quota_full",
        started,
        EVENT_BOUND,
    )
    .await?;

    let before = Mark::now(&system, "filled").await?;
    let started = Instant::now();
    nfs.unlink("fill")?;
    btrfs.sync()?;
    await_normal(&system, "filled", &before, started).await?;
    // Writable again through NFS.
    nfs.write_file("after", b"room again", 0o644)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_agent_stopped_is_reported_once_per_claim_until_it_answers_again() -> anyhow::Result<()>
{
    const TEST: &str = "an_agent_stopped_is_reported_once_per_claim_until_it_answers_again";
    if !can_run(TEST) {
        return Ok(());
    }
    let mut system = start_system(None, "").await?;
    class(&system, "e2e-health-agent", json!({})).await?;
    let claims = ["first", "second"];
    for claim in claims {
        bound_claim(&system, claim, "e2e-health-agent", "1Gi").await?;
        await_seen_normal(&system, claim).await?;
    }

    let mut marks = Vec::new();
    for claim in claims {
        marks.push(Mark::now(&system, claim).await?);
    }
    let started = Instant::now();
    system.agents[0].process.kill();
    for (claim, before) in claims.iter().zip(&marks) {
        await_abnormal(
            &system,
            claim,
            before,
            "agent_unreachable",
            started,
            UNREACHABLE_BOUND,
        )
        .await?;
    }
    await_gauge(&system, "agent_unreachable", claims.len() as f64).await?;
    // Once per claim, not at every poll: several more polls pass (an absence cannot be
    // awaited, so it is watched for this long) and each claim still has one such event,
    // never repeated in a series.
    let watched = Instant::now();
    let window = Duration::from_secs(3 * USAGE_INTERVAL_SECONDS);
    while watched.elapsed() < window {
        for (claim, before) in claims.iter().zip(&marks) {
            let unreachable: Vec<Seen> = events_about(&system, claim)
                .await?
                .into_iter()
                .filter(|e| {
                    before.is_new(e) && e.reason == ABNORMAL && e.note.contains("agent_unreachable")
                })
                .collect();
            anyhow::ensure!(
                unreachable.len() == 1 && unreachable[0].count == 1,
                "{claim}: the unreachable agent reported more than once: {unreachable:#?}"
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    let mut marks = Vec::new();
    for claim in claims {
        marks.push(Mark::now(&system, claim).await?);
    }
    let started = Instant::now();
    system.agents[0].process.restart().await?;
    for (claim, before) in claims.iter().zip(&marks) {
        await_normal(&system, claim, before, started).await?;
    }
    await_gauge(&system, "agent_unreachable", 0.0).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_filesystem_shut_down_is_reported_until_it_is_mounted_again() -> anyhow::Result<()> {
    const TEST: &str = "a_filesystem_shut_down_is_reported_until_it_is_mounted_again";
    if !can_run(TEST) {
        return Ok(());
    }
    if let Some(reason) = nfsprov_e2e::requirements::missing_parts(
        "the test mounts XFS and shuts it down",
        &["mkfs.xfs", "xfs_io"],
    ) {
        nfsprov_test_skip::skip(TEST, &reason);
        return Ok(());
    }
    let xfs = match nfsprov_agent_testkit::LoopXfs::new(320, false) {
        Ok(fs) => fs,
        Err(error) => {
            nfsprov_test_skip::skip(TEST, &format!("no loop-mounted XFS here: {error}"));
            return Ok(());
        }
    };
    let mut system = start_system(Some(xfs.root()), "").await?;
    class(&system, "e2e-health-xfs", json!({})).await?;
    bound_claim(&system, "broken", "e2e-health-xfs", "1Gi").await?;
    await_seen_normal(&system, "broken").await?;
    let mount_point = xfs.mount_point();

    let before = Mark::now(&system, "broken").await?;
    let started = Instant::now();
    run(
        "xfs_io",
        &[
            "-x".as_ref(),
            "-c".as_ref(),
            "shutdown".as_ref(),
            mount_point.as_os_str(),
        ],
    )?;
    await_abnormal(
        &system,
        "broken",
        &before,
        "filesystem_error",
        started,
        EVENT_BOUND,
    )
    .await?;

    // An operator's repair, as docs/operations.md gives it: the agent stopped (it holds the
    // export root open, and a shut-down filesystem stays shut down for whoever holds it),
    // the filesystem unmounted and mounted again, the agent started. ganesha may still
    // hold the shut-down mount, so it is detached lazily; the image is then attached to a
    // loop device of its own (`mount -o loop` would reuse the old one, and with it the
    // shut-down filesystem) and mounted beside it, which XFS allows only when told not to
    // compare UUIDs. Restarting ganesha too, as the docs say, is left out here.
    let before = Mark::now(&system, "broken").await?;
    let started = Instant::now();
    system.agents[0].process.kill();
    if run("umount", &[mount_point.as_os_str()]).is_err() {
        run("umount", &["--lazy".as_ref(), mount_point.as_os_str()])?;
    }
    let attached = Command::new("losetup")
        .args(["--find", "--show"])
        .arg(xfs.image())
        .output()?;
    anyhow::ensure!(
        attached.status.success(),
        "losetup: {}",
        String::from_utf8_lossy(&attached.stderr)
    );
    let device = PathBuf::from(String::from_utf8(attached.stdout)?.trim());
    let _detach = DetachLoop(device.clone());
    run(
        "mount",
        &[
            "-o".as_ref(),
            "nouuid".as_ref(),
            device.as_os_str(),
            mount_point.as_os_str(),
        ],
    )?;
    system.agents[0].process.restart().await?;
    await_normal(&system, "broken", &before, started).await?;
    Ok(())
}

/// Detaches a loop device the test attached, once whatever holds it lets go (`losetup -d`
/// of a busy device marks it to be freed then).
struct DetachLoop(PathBuf);

impl Drop for DetachLoop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}
