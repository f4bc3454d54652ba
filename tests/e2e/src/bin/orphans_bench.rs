//! The orphan check of the controller and `kubectl nfsprov orphans` against one agent
//! holding many volumes, each a process of its own: the agent (on the directory given),
//! the API (the simulator), the controller and the plugin. Every volume but the first
//! has a PV and one more PV points to a volume that does not exist, so a complete answer
//! is exactly those two findings; anything else fails the run (exit status 1).
//!
//! Prints, for a walk through the agent's volume pages, the time of each page (first,
//! median, 90th percentile, slowest) and of the whole walk with the agent's peak memory;
//! then the peak memory (`VmHWM` from `/proc`) of the controller during its check and of
//! the agent answering it; then the plugin's and the agent's for one `orphans` run.
//!
//!   cargo build --release --locked --workspace --bins &&
//!     target/release/nfsprov-orphans-bench --volumes 100000 --dir /var/tmp

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, ensure};
use clap::Parser;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolume, Secret};
use kube::Api;
use kube::api::PostParams;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{CreateVolumeRequest, MAX_PAGE_LIMIT, VolumeOwner, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::api_proxy;
use nfsprov_e2e::binaries::binary;
use nfsprov_e2e::cluster::{ControllerProcess, KubeApi};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

const AGENT: &str = "bench";
const PROVISIONER: &str = "nfsprov.dev/nfs";
/// Where the plugin looks for the agent's Secret by default.
const NAMESPACE: &str = "nfsprov";
const MIB: f64 = 1024.0 * 1024.0;

#[derive(Debug, Parser)]
#[command(
    about = "Peak memory of the orphan check and `kubectl nfsprov orphans` against an agent of many volumes, and the time of its pages"
)]
struct Args {
    /// Volumes the agent holds.
    #[arg(long, default_value_t = 100_000)]
    volumes: usize,
    /// Volumes per page of the timed walk.
    #[arg(long, default_value_t = MAX_PAGE_LIMIT)]
    page: u32,
    /// Directory the export root is made in.
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Requests in flight while filling the agent and the API.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Only fill the agent and time the pages (no API, controller or plugin).
    #[arg(long)]
    pages_only: bool,
    /// The controller's orphan check interval: its first check comes this long after its
    /// caches are synced, which must leave it time to settle first.
    #[arg(long, default_value_t = 90)]
    check_after_seconds: u64,
}

fn volume_name(i: usize) -> String {
    format!("ns-{:03}/pvc-{i:08x}-claim-{i}", i % 500)
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).expect("a valid volume path")
}

/// `field` of `/proc/<pid>/status`, in bytes.
fn status_bytes(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Resets the peak of `pid` to what it holds now (`clear_refs`); answers that.
fn reset_peak(pid: u32) -> anyhow::Result<u64> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .with_context(|| format!("reset the peak memory of process {pid}"))?;
    status_bytes(pid, "VmRSS:").context("no VmRSS")
}

fn peak(pid: u32) -> anyhow::Result<u64> {
    status_bytes(pid, "VmHWM:").context("no VmHWM")
}

/// CPU time process `pid` has used, in clock ticks.
fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses, which may hold spaces): utime and stime
    // are the 12th and 13th fields.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    Some(fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?)
}

/// Waits until process `pid` used less than 2 ticks of CPU over a second: what it did
/// on its own after start (reconciles of the synced objects) is over.
async fn settled(pid: u32, limit: Duration) -> anyhow::Result<Duration> {
    let started = Instant::now();
    let mut last = cpu_ticks(pid).context("no CPU time")?;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = cpu_ticks(pid).context("no CPU time")?;
        if now - last < 2 {
            return Ok(started.elapsed());
        }
        last = now;
        ensure!(
            started.elapsed() < limit,
            "process {pid} still busy after {limit:?}"
        );
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / MIB)
}

async fn fill(client: &AgentClient, count: usize, concurrency: usize) -> anyhow::Result<()> {
    futures::stream::iter(0..count)
        .map(|i| async move {
            let request = CreateVolumeRequest {
                capacity_bytes: 1 << 30,
                owner: VolumeOwner {
                    pvc_namespace: Some("ns".into()),
                    pvc_name: Some(format!("claim-{i}")),
                    pv_name: Some(format!("pvc-{i:08x}")),
                },
                ..Default::default()
            };
            client
                .create_volume(&path(&volume_name(i)), &request, None)
                .await
                .map(|_| ())
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// Walks every page, timing each; fails unless every volume was listed once, in order.
async fn timed_walk(
    client: &AgentClient,
    agent_pid: u32,
    count: usize,
    page: u32,
) -> anyhow::Result<()> {
    let before = reset_peak(agent_pid)?;
    let mut times = Vec::new();
    let mut listed = 0;
    let mut last: Option<String> = None;
    let mut in_order = true;
    let started = Instant::now();
    let mut asked = started;
    // Each page is handed over as soon as it arrived: the time between two is the time
    // of one request.
    client
        .for_each_volume_page(page, None, |volumes| {
            times.push(asked.elapsed());
            for volume in &volumes {
                in_order &= last.as_deref() < Some(volume.path.as_str());
                last = Some(volume.path.to_string());
            }
            listed += volumes.len();
            asked = Instant::now();
        })
        .await?;
    ensure!(
        in_order,
        "the pages are not in path order, or repeat a volume"
    );
    let whole = started.elapsed();
    ensure!(
        listed == count,
        "the pages held {listed} of {count} volumes"
    );
    let mut sorted = times.clone();
    sorted.sort();
    let at = |q: f64| sorted[((sorted.len() - 1) as f64 * q).round() as usize];
    let ms = |d: Duration| format!("{:.1} ms", d.as_secs_f64() * 1000.0);
    println!(
        "agent pages of {page}, {count} volumes: {} pages; first {}, median {}, p90 {}, slowest {}; whole walk {:.2} s; agent RSS before {}, peak {}",
        times.len(),
        ms(times[0]),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(at(1.0)),
        whole.as_secs_f64(),
        mib(before),
        mib(peak(agent_pid)?)
    );
    Ok(())
}

/// A PV of ours for `volume` on the bench agent. Retained: nothing the controller does
/// may touch the volumes.
fn pv(name: &str, volume: &str) -> anyhow::Result<PersistentVolume> {
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {
            "pv.kubernetes.io/provisioned-by": PROVISIONER,
            "nfsprov.dev/agent": AGENT,
            "nfsprov.dev/path": volume,
        }},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteMany"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "bench",
            "nfs": {"server": "127.0.0.1", "path": format!("/export/{volume}")},
        },
    }))?)
}

/// PVs for volumes 1.. (the first has none) and one for a volume that does not exist.
async fn make_pvs(
    api: &Api<PersistentVolume>,
    count: usize,
    concurrency: usize,
) -> anyhow::Result<()> {
    futures::stream::iter(1..=count)
        .map(|i| async move {
            let volume = if i == count {
                "ns-missing/none".to_owned()
            } else {
                volume_name(i)
            };
            api.create(
                &PostParams::default(),
                &pv(&format!("pvc-{i:08x}"), &volume)?,
            )
            .await?;
            anyhow::Ok(())
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok(())
}

/// The value of the metric line `name{agent="bench"}` (a gauge), when there is one.
fn metric(text: &str, name: &str) -> Option<f64> {
    let prefix = format!("{name}{{agent=\"{AGENT}\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
}

async fn controller_check(
    kube: &KubeApi,
    agent: &AgentProcess,
    agent_pid: u32,
    work: &Path,
    interval: u64,
) -> anyhow::Result<()> {
    let agents_dir = work.join("agents");
    agent.write_secret_files(&agents_dir)?;
    // The first check runs one interval after the caches are synced: long enough for
    // the controller to settle and the peaks to be reset in between.
    let started = Instant::now();
    let mut controller = ControllerProcess::start_within(
        kube,
        Some(&agents_dir),
        &[
            "--leader-elect=false",
            &format!("--provisioner-name={PROVISIONER}"),
            &format!("--orphan-check-interval-seconds={interval}"),
            "--orphan-grace-seconds=0",
            "--log-format=json",
        ],
        Duration::from_secs(600),
    )
    .await?;
    let pid = controller.pid().context("the controller is not running")?;
    let ready = started.elapsed();
    let synced = reset_peak(pid)?;
    let quiet = settled(pid, Duration::from_secs(interval)).await?;
    let settling_peak = peak(pid)?;
    ensure!(
        metric(&controller.metrics()?, "nfsprov_orphaned_directories").is_none(),
        "the orphan check ran before the controller settled: raise --check-after-seconds"
    );
    let holding = reset_peak(pid)?;
    let agent_before = reset_peak(agent_pid)?;
    let checked = Instant::now();
    let (unreferenced, missing) = loop {
        let text = controller.metrics()?;
        if let (Some(unreferenced), Some(missing)) = (
            metric(&text, "nfsprov_orphaned_directories"),
            metric(&text, "nfsprov_missing_volume_directories"),
        ) {
            break (unreferenced, missing);
        }
        ensure!(
            checked.elapsed() < Duration::from_secs(600 + interval),
            "no orphan check within 10 minutes; controller log:\n{}",
            controller.log_text()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let controller_peak = peak(pid)?;
    let agent_peak = peak(agent_pid)?;
    let log = controller.log_text();
    controller.kill();
    println!(
        "controller: ready {:.1} s after start, RSS {}; settled {:.1} s later, peak meanwhile {}",
        ready.as_secs_f64(),
        mib(synced),
        quiet.as_secs_f64(),
        mib(settling_peak)
    );
    println!(
        "controller: RSS before its orphan check {}, peak during it {} (grew {}); agent answering it: RSS before {}, peak {}",
        mib(holding),
        mib(controller_peak),
        mib(controller_peak.saturating_sub(holding)),
        mib(agent_before),
        mib(agent_peak)
    );
    println!(
        "controller's orphan check: {unreferenced} directory without a PV, {missing} PV without its directory"
    );
    ensure!(
        (unreferenced, missing) == (1.0, 1.0)
            && log.contains(&format!("\"path\":\"{}\"", volume_name(0)))
            && log.contains("\"path\":\"ns-missing/none\""),
        "the controller's check is not complete: {unreferenced} unreferenced, {missing} missing; log:\n{log}"
    );
    Ok(())
}

/// The agent's Secret as `nfsprov-agent init` printed it, in the shape the API returns.
fn agent_secret(agent: &AgentProcess, dir: &Path) -> anyhow::Result<Value> {
    agent.write_secret_files(dir)?;
    let mut data = std::collections::BTreeMap::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        data.insert(
            entry.file_name().to_string_lossy().into_owned(),
            ByteString(std::fs::read(entry.path())?),
        );
    }
    let mut secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "nfsprov-agent-bench", "namespace": NAMESPACE, "labels": {
            "app.kubernetes.io/name": "nfsprov",
            "app.kubernetes.io/component": "agent-credentials",
            "nfsprov.dev/agent": AGENT,
        }},
        "type": "Opaque",
    }))?;
    secret.data = Some(data);
    Ok(serde_json::to_value(&secret)?)
}

/// The simulator serves no Secrets and no Deployments: a proxy answers those itself (the
/// agent's Secret; no Deployment, so the plugin reads the labelled Secrets, as the
/// controller does) and passes everything else through, streamed.
async fn proxy(upstream: SocketAddr, secret: Value) -> anyhow::Result<SocketAddr> {
    let secrets = json!({
        "kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": [secret],
    })
    .to_string();
    api_proxy::start(upstream, move |_, path| {
        if path == format!("/api/v1/namespaces/{NAMESPACE}/secrets") {
            Some((200, secrets.clone()))
        } else if path.starts_with("/apis/apps/") {
            let status = json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": "NotFound", "code": 404});
            Some((404, status.to_string()))
        } else {
            None
        }
    })
    .await
}

async fn plugin_check(
    kube: &KubeApi,
    agent: &AgentProcess,
    agent_pid: u32,
    work: &Path,
) -> anyhow::Result<()> {
    let sim = kube
        .simulator_url()
        .context("the plugin's run needs the simulator (the proxy serves its Secret)")?;
    let address = proxy(sim, agent_secret(agent, &work.join("secret"))?).await?;
    let kubeconfig = work.join("plugin-kubeconfig");
    let text = std::fs::read_to_string(kube.kubeconfig())?;
    std::fs::write(
        &kubeconfig,
        text.replace(&sim.to_string(), &address.to_string()),
    )?;
    let agent_before = reset_peak(agent_pid)?;
    let started = Instant::now();
    let mut child = tokio::process::Command::new(binary("kubectl-nfsprov")?)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .args(["orphans", "-o", "json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id().context("the plugin is not running")?;
    let mut stdout = child.stdout.take().context("no stdout")?;
    let mut stderr = child.stderr.take().context("no stderr")?;
    let read = tokio::spawn(async move {
        let (mut out, mut err) = (String::new(), String::new());
        let _ = tokio::join!(
            stdout.read_to_string(&mut out),
            stderr.read_to_string(&mut err)
        );
        (out, err)
    });
    // The plugin ends by itself: its peak is the last one read before it exits.
    let mut plugin_peak = 0;
    let status = loop {
        if let Some(bytes) = status_bytes(pid, "VmHWM:") {
            plugin_peak = plugin_peak.max(bytes);
        }
        if let Some(status) = child.try_wait()? {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    };
    let took = started.elapsed();
    let (out, err) = read.await?;
    let agent_peak = peak(agent_pid)?;
    println!(
        "kubectl nfsprov orphans: {:.1} s, peak {} (VmHWM, read every 2 ms); agent answering it: RSS before {}, peak {}",
        took.as_secs_f64(),
        mib(plugin_peak),
        mib(agent_before),
        mib(agent_peak)
    );
    let report: Value = serde_json::from_str(&out)
        .with_context(|| format!("the plugin's answer is not JSON: {out}{err}"))?;
    let found: Vec<(&str, &str)> = report["orphans"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|o| {
            (
                o["kind"].as_str().unwrap_or_default(),
                o["path"].as_str().unwrap_or_default(),
            )
        })
        .collect();
    println!("kubectl nfsprov orphans found: {found:?}");
    ensure!(
        found
            == [
                ("noPv", volume_name(0).as_str()),
                ("noDirectory", "ns-missing/none")
            ]
            && report["checked_agents"] == json!([AGENT])
            && status.code() == Some(1),
        "the plugin's answer is not complete (status {status}): {out}{err}"
    );
    Ok(())
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let args = Args::parse();
    let work = tempfile::tempdir_in(&args.dir)?;
    let root = work.path().join("export");
    std::fs::create_dir(&root)?;
    let agent = AgentProcess::start(AGENT, &root, "127.0.0.1", &root.display().to_string()).await?;
    let agent_pid = agent.pid().context("the agent is not running")?;
    let client = agent.client()?;
    println!("export root: {}", root.display());
    let started = Instant::now();
    fill(&client, args.volumes, args.concurrency).await?;
    println!(
        "agent: made {} volumes in {:.1} s",
        args.volumes,
        started.elapsed().as_secs_f64()
    );
    timed_walk(&client, agent_pid, args.volumes, args.page).await?;
    if args.pages_only {
        return Ok(());
    }

    let kube = KubeApi::start().await?;
    println!(
        "API server: {}",
        if kube.is_shared() {
            "real (E2E_KUBECONFIG)"
        } else {
            "simulator"
        }
    );
    let volumes: Api<PersistentVolume> = Api::all(kube.client().await?);
    let started = Instant::now();
    make_pvs(&volumes, args.volumes, args.concurrency).await?;
    println!(
        "API: made {} PVs in {:.1} s",
        args.volumes,
        started.elapsed().as_secs_f64()
    );
    controller_check(
        &kube,
        &agent,
        agent_pid,
        work.path(),
        args.check_after_seconds,
    )
    .await?;
    plugin_check(&kube, &agent, agent_pid, work.path()).await?;
    Ok(())
}
