//! The agent stays available while its NFS server or the bus to it hangs: ganesha or
//! dbus-daemon stopped (SIGSTOP) during export changes, and an agent started while the
//! bus is stopped. Only the export changes wait for the server, each for a bounded time
//! and answered `503 nfs_server_unavailable`; health, reads and resizes are answered at
//! once; and the exports converge when the server answers again, without a restart.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nfsprov_api_types::client::{AgentClient, ClientError};
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, ExportRequest, Squash, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::ganesha_dbus::{Ganesha, Paused, PrivateBus};

/// The agent's limit on each wait for the server, short so that the test is quick; a
/// hang is ten times longer than the bound the test allows an export change.
const SERVER_TIMEOUT_SECONDS: u64 = 2;
/// An export change waits for its turn, for a connection to the bus and for one answer,
/// each at most the limit; the rest is margin for a loaded machine.
const CHANGE_BOUND: Duration = Duration::from_secs(4 * SERVER_TIMEOUT_SECONDS + 4);
/// What "answered at once" means here: far below the tens of seconds a request hung
/// for behind a stopped server.
const PROMPT: Duration = Duration::from_secs(1);
/// How long the exports may take to converge once the server answers again.
const CONVERGE: Duration = Duration::from_secs(60);

fn settings(ganesha: &Ganesha) -> String {
    format!(
        "{}server_timeout_seconds = {SERVER_TIMEOUT_SECONDS}\nreconcile_interval_seconds = 1\n",
        ganesha.agent_settings()
    )
}

/// A bus, ganesha on it and an agent with the ganesha manager over one export root.
struct Setup {
    root: PathBuf,
    agent: AgentProcess,
    ganesha: Ganesha,
    bus: PrivateBus,
    _base: tempfile::TempDir,
}

impl Setup {
    async fn start(name: &str) -> anyhow::Result<Self> {
        let base = tempfile::tempdir()?;
        let root = base.path().join("export");
        std::fs::create_dir(&root)?;
        let config_dir = base.path().join("ganesha.d");
        let bus = PrivateBus::start().await?;
        let ganesha = Ganesha::start(&bus, &config_dir).await?;
        let agent = AgentProcess::start_with_settings(
            name,
            &root,
            "127.0.0.1",
            &root.display().to_string(),
            &settings(&ganesha),
        )
        .await?;
        Ok(Self {
            root,
            agent,
            ganesha,
            bus,
            _base: base,
        })
    }

    /// The paths ganesha serves in the agent's id range.
    fn served(&self) -> anyhow::Result<BTreeSet<String>> {
        Ok(self
            .ganesha
            .exports()?
            .into_iter()
            .filter(|(id, _)| *id >= 1000)
            .map(|(_, path)| path)
            .collect())
    }

    /// Waits until ganesha serves exactly the exports the agent reports, and `wanted`
    /// among them; then the agent must be ready again.
    async fn converged(&self, client: &AgentClient, wanted: &[&VolumePath]) -> anyhow::Result<()> {
        let wanted: BTreeSet<String> = wanted
            .iter()
            .map(|volume| self.root.join(volume.as_str()).display().to_string())
            .collect();
        let started = Instant::now();
        loop {
            let reported: BTreeSet<String> = client
                .list_volumes(None)
                .await?
                .into_iter()
                .filter_map(|volume| volume.export.map(|export| export.path))
                .collect();
            let served = self.served();
            let ready = client.readyz().await.is_ok();
            if let Ok(served) = &served
                && *served == reported
                && wanted.is_subset(served)
                && ready
            {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < CONVERGE,
                "the exports did not converge within {CONVERGE:?}: the agent reports {reported:?}, ganesha serves {served:?}, wanted {wanted:?}, ready: {ready}\nagent log:\n{}",
                self.agent.log_text()
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

fn to_loopback() -> ExportRequest {
    ExportRequest {
        clients: vec!["127.0.0.2".parse().unwrap()],
        squash: Squash::Root,
        ..ExportRequest::default()
    }
}

fn create_request() -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        export: Some(to_loopback()),
        ..Default::default()
    }
}

fn volume(name: &str) -> VolumePath {
    VolumePath::parse(&format!("outage/{name}")).unwrap()
}

/// Asks for what needs no NFS server, again and again until `done`: health, the
/// volumes `known` (whose export is being changed) and `spare`, the list, the agent's
/// info and a resize of `spare`, each answered within [`PROMPT`]. Returns how many
/// rounds were made and the slowest round's time.
async fn probe_until(
    client: &AgentClient,
    known: &VolumePath,
    spare: &VolumePath,
    done: &tokio::sync::watch::Receiver<bool>,
) -> anyhow::Result<(usize, Duration)> {
    let mut rounds = 0;
    let mut slowest = Duration::ZERO;
    let mut capacity = 1u64 << 30;
    while !*done.borrow() {
        capacity += 1 << 20;
        let started = Instant::now();
        let answered = tokio::time::timeout(PROMPT, async {
            client.healthz().await?;
            for path in [known, spare] {
                let got = client.get_volume(path, None).await?;
                anyhow::ensure!(
                    got.as_ref().is_some_and(|v| v.export.is_some()),
                    "{path} lost its export: {got:?}"
                );
            }
            client.list_volumes(None).await?;
            client.info(None).await?;
            anyhow::Ok(())
        })
        .await;
        match answered {
            Ok(result) => result?,
            Err(_) => anyhow::bail!(
                "health, a GET and a list not answered within {PROMPT:?} while the NFS server hangs (round {rounds})"
            ),
        }
        let resized =
            tokio::time::timeout(PROMPT, client.resize_volume(spare, capacity, None)).await;
        match resized {
            Ok(result) => {
                result?;
            }
            Err(_) => anyhow::bail!(
                "a resize not answered within {PROMPT:?} while the NFS server hangs (round {rounds})"
            ),
        }
        rounds += 1;
        slowest = slowest.max(started.elapsed());
        let pause = Duration::from_millis(100).saturating_sub(started.elapsed());
        tokio::time::sleep(pause).await;
    }
    Ok((rounds, slowest))
}

/// Three export changes at once (two creates, one change of an export) while `paused`
/// holds the server or its bus: each is answered `503 nfs_server_unavailable` within
/// [`CHANGE_BOUND`] while everything else is answered at once. Then the server is
/// resumed and the exports must converge.
async fn changes_while_paused(setup: &Setup, paused: Paused) -> anyhow::Result<()> {
    let client = setup.agent.client()?;
    let (known, spare) = (volume("known"), volume("spare"));
    let (one, two) = (volume("one"), volume("two"));
    let (done, watching) = tokio::sync::watch::channel(false);
    let probes = {
        let client = client.clone();
        let (known, spare) = (known.clone(), spare.clone());
        tokio::spawn(async move { probe_until(&client, &known, &spare, &watching).await })
    };
    let change = |what: &'static str, answer: Result<(), ClientError>, took: Duration| {
        match answer {
            Err(error) if error.code() == Some(ErrorCode::NfsServerUnavailable) => {}
            other => anyhow::bail!("{what}: expected 503 nfs_server_unavailable, got {other:?}"),
        }
        anyhow::ensure!(
            took < CHANGE_BOUND,
            "{what} answered after {took:?}, past its bound {CHANGE_BOUND:?}"
        );
        anyhow::Ok(())
    };
    async fn timed(
        future: impl std::future::Future<Output = Result<(), ClientError>>,
    ) -> (Result<(), ClientError>, Duration) {
        let started = Instant::now();
        let answer = future.await;
        (answer, started.elapsed())
    }
    let request = create_request();
    let moved = ExportRequest {
        clients: vec!["127.0.0.3".parse()?],
        ..to_loopback()
    };
    let (first, second, third) = tokio::join!(
        timed(async { client.create_volume(&one, &request, None).await.map(drop) }),
        timed(async { client.create_volume(&two, &request, None).await.map(drop) }),
        timed(async {
            client
                .set_volume_export(&known, &moved, None)
                .await
                .map(drop)
        }),
    );
    // The probes may have stopped already, on a failure their result tells.
    let _ = done.send(true);
    let (rounds, slowest) = probes.await??;
    eprintln!(
        "{rounds} probe rounds, the slowest {slowest:?}; export changes answered after {:?}, {:?}, {:?}",
        first.1, second.1, third.1
    );
    change("create of outage/one", first.0, first.1)?;
    change("create of outage/two", second.0, second.1)?;
    change("export change of outage/known", third.0, third.1)?;
    anyhow::ensure!(rounds > 0, "no probe round ran while the changes waited");
    // The agent says why it is not ready, to an authenticated caller.
    let readyz = client.readyz().await;
    anyhow::ensure!(
        matches!(&readyz, Err(ClientError::UnexpectedResponse { status: 503, body }) if body.contains("exports degraded")),
        "/readyz while the server hangs: {readyz:?}"
    );

    paused.resume()?;
    // The exports converge on what the agent reports, with nothing left over from the
    // changes that were refused; then the creates asked again succeed.
    setup.converged(&client, &[&known, &spare]).await?;
    for path in [&one, &two] {
        let made = client.create_volume(path, &request, None).await?;
        anyhow::ensure!(made.volume.export.is_some(), "{path}: {made:?}");
    }
    setup
        .converged(&client, &[&known, &spare, &one, &two])
        .await?;
    let metrics = setup.agent.metrics()?;
    anyhow::ensure!(
        metrics
            .lines()
            .any(|line| line == "nfsprov_agent_exports_degraded 0"),
        "{metrics}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn ganesha_stopped_during_export_changes_stalls_only_those_changes() -> anyhow::Result<()> {
    const TEST: &str = "ganesha_stopped_during_export_changes_stalls_only_those_changes";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    let setup = Setup::start("outage-ganesha").await?;
    let client = setup.agent.client()?;
    for name in ["known", "spare"] {
        client
            .create_volume(&volume(name), &create_request(), None)
            .await?;
    }
    let paused = setup.ganesha.pause()?;
    changes_while_paused(&setup, paused).await
}

#[tokio::test(flavor = "multi_thread")]
async fn bus_stopped_during_export_changes_stalls_only_those_changes() -> anyhow::Result<()> {
    const TEST: &str = "bus_stopped_during_export_changes_stalls_only_those_changes";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    let setup = Setup::start("outage-bus").await?;
    let client = setup.agent.client()?;
    for name in ["known", "spare"] {
        client
            .create_volume(&volume(name), &create_request(), None)
            .await?;
    }
    let paused = setup.bus.pause()?;
    changes_while_paused(&setup, paused).await
}

#[tokio::test(flavor = "multi_thread")]
async fn agent_started_while_the_bus_is_stopped_serves_and_repairs_the_exports_later()
-> anyhow::Result<()> {
    const TEST: &str =
        "agent_started_while_the_bus_is_stopped_serves_and_repairs_the_exports_later";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    let mut setup = Setup::start("outage-start").await?;
    let client = setup.agent.client()?;
    let (kept, lost) = (volume("kept"), volume("lost"));
    for path in [&kept, &lost] {
        client.create_volume(path, &create_request(), None).await?;
    }
    // ganesha loses one export behind the agent's back, then the agent stops and the
    // bus with it; the agent starts again while the bus is stopped.
    let lost_path = setup.root.join(lost.as_str()).display().to_string();
    let lost_id = setup
        .ganesha
        .exports()?
        .into_iter()
        .find(|(_, path)| *path == lost_path)
        .map(|(id, _)| id)
        .ok_or_else(|| anyhow::anyhow!("ganesha does not serve {lost_path}"))?;
    setup.ganesha.remove_export(lost_id)?;
    setup.agent.kill();
    let paused = setup.bus.pause()?;
    let started = Instant::now();
    // Answers /healthz (the restart waits for it) although the bus answers nothing.
    setup.agent.restart().await?;
    let took = started.elapsed();
    anyhow::ensure!(
        took < CHANGE_BOUND,
        "the agent took {took:?} to serve with the bus stopped\n{}",
        setup.agent.log_text()
    );
    let client = setup.agent.client()?;
    let answered = tokio::time::timeout(PROMPT, async {
        let listed = client.list_volumes(None).await?;
        let got = client.get_volume(&kept, None).await?;
        anyhow::Ok((listed, got))
    })
    .await;
    let (listed, got) = match answered {
        Ok(result) => result?,
        Err(_) => anyhow::bail!("a list and a GET not answered within {PROMPT:?}"),
    };
    anyhow::ensure!(listed.len() == 2, "{listed:?}");
    anyhow::ensure!(
        got.as_ref().is_some_and(|v| v.export.is_some()),
        "the table is read without the server: {got:?}"
    );
    let readyz = client.readyz().await;
    anyhow::ensure!(
        matches!(&readyz, Err(ClientError::UnexpectedResponse { status: 503, body }) if body.contains("exports degraded")),
        "/readyz with the bus stopped: {readyz:?}"
    );
    let metrics = setup.agent.metrics()?;
    anyhow::ensure!(
        metrics
            .lines()
            .any(|line| line == "nfsprov_agent_exports_degraded 1"),
        "{metrics}"
    );
    // An export change is refused within its bound.
    let started = Instant::now();
    let refused = client
        .create_volume(&volume("new"), &create_request(), None)
        .await;
    let took = started.elapsed();
    anyhow::ensure!(
        refused.as_ref().err().and_then(ClientError::code) == Some(ErrorCode::NfsServerUnavailable)
            && took < CHANGE_BOUND,
        "create with the bus stopped: {refused:?} after {took:?}"
    );

    paused.resume()?;
    setup.converged(&client, &[&kept, &lost]).await?;
    let metrics = setup.agent.metrics()?;
    let repaired = metrics
        .lines()
        .find_map(|line| line.strip_prefix("nfsprov_agent_exports_repaired_total "))
        .and_then(|count| count.parse::<u64>().ok());
    anyhow::ensure!(
        repaired.is_some_and(|count| count >= 1),
        "the lost export counted as repaired: {repaired:?}\n{metrics}"
    );
    Ok(())
}
