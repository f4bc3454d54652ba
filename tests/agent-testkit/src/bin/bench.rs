//! Benchmark of the agent over real HTTPS on loopback: create + delete pairs at a given
//! concurrency with keep-alive connections, and deleting a large tree through the agent
//! against `rm -rf` of an identical tree. Prints figures; asserts nothing. With `--btrfs`
//! the export root is a loop-mounted btrfs with the btrfs quota backend. With
//! `--credentials N` the pairs are made by a scoped credential, the last of N in the
//! agent's credentials file; `--compare-credentials` runs only the pairs, on an agent for
//! each number of credentials, in interleaved rounds. `--health-pass N` runs only the
//! agent's periodic pass over N volumes: its time and the process's peak RSS.

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use nfsprov_agent::credentials::{CredentialEntry, CredentialsFile, token_sha256};
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent::scope::Operations;
use nfsprov_agent_testkit::LoopBtrfs;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, QuotaBackend, VolumePath};
use tokio::sync::Mutex;

#[derive(Debug, Parser)]
#[command(
    about = "Measure the nfsprov agent's request throughput, latency and tree deletion speed"
)]
struct Args {
    /// Create + delete pairs to run [default: 20,000; in each block of a comparison, 500].
    #[arg(long)]
    pairs: Option<usize>,
    /// Requests in flight at once.
    #[arg(long, default_value_t = 16)]
    concurrency: usize,
    /// Files in the tree deleted through the agent and with `rm -rf`.
    #[arg(long, default_value_t = 100_000)]
    tree_files: usize,
    /// Directory to create the export root in (default: the system temp dir).
    #[arg(long)]
    dir: Option<std::path::PathBuf>,
    /// Serve a loop-mounted btrfs with the btrfs quota backend (a subvolume and a qgroup
    /// limit per volume; needs root) instead of a plain directory.
    #[arg(long)]
    btrfs: bool,
    /// Scoped credentials in the agent's credentials file from its start, with prefixes
    /// bench-0 to bench-{N-1}. The pairs are made with the last one's token (every
    /// credential is compared on each request all the same), beneath its prefix; the tree
    /// with the whole-root token of `init`. 0: the pairs too with that token.
    #[arg(long, default_value_t = 0)]
    credentials: usize,
    /// Compare pairs/s with these numbers of scoped credentials (e.g. 1,2,100; the first
    /// is the baseline of the ratios): an agent for each number, all running, and
    /// `--repeats` rounds of `--pairs` pairs on each agent in turn, from a rotating start.
    /// No tree deletion.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["credentials", "btrfs"])]
    compare_credentials: Vec<usize>,
    /// Rounds of `--compare-credentials`.
    #[arg(long, default_value_t = 30)]
    repeats: usize,
    /// Make this many volumes, then time the agent's periodic pass over them (every
    /// volume's condition; no export manager), running every second, and read this
    /// process's peak RSS meanwhile. Nothing else is measured.
    #[arg(long, conflicts_with_all = ["compare_credentials", "credentials", "btrfs"])]
    health_pass: Option<usize>,
    /// Passes timed by `--health-pass`.
    #[arg(long, default_value_t = 10)]
    passes: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new()?;
    if let Some(volumes) = args.health_pass {
        runtime.block_on(health_pass(args, volumes))
    } else if args.compare_credentials.is_empty() {
        runtime.block_on(run(args))
    } else {
        runtime.block_on(compare_credentials(args))
    }
}

/// N scoped credentials, the client of the last one and where its volumes go.
struct Scoped {
    file: CredentialsFile,
    token_file: tempfile::NamedTempFile,
    prefix: String,
}

impl Scoped {
    fn new(count: usize) -> anyhow::Result<Self> {
        let mut credentials = Vec::with_capacity(count);
        let mut last_token = String::new();
        for i in 0..count {
            let token = random_token()?;
            credentials.push(CredentialEntry {
                name: format!("bench-{i}"),
                token_sha256: token_sha256(token.as_bytes()),
                prefix: Some(format!("bench-{i}")),
                operations: Operations::All,
                export_clients: None,
                max_volumes: None,
                max_bytes: None,
                max_jobs: None,
            });
            last_token = token;
        }
        let mut token_file = tempfile::NamedTempFile::new()?;
        std::io::Write::write_all(&mut token_file, last_token.as_bytes())?;
        Ok(Self {
            file: CredentialsFile { credentials },
            token_file,
            prefix: format!("bench-{}", count - 1),
        })
    }

    /// The client of the last credential, checked to be confined to its prefix: a path
    /// outside it is refused, so the token was taken for that credential.
    async fn client(&self, agent: &TestAgent) -> anyhow::Result<AgentClient> {
        let client = AgentClient::new(&agent.token_connection(self.token_file.path()))?;
        let outside = VolumePath::parse("outside-every-prefix/v")?;
        match client
            .create_volume(&outside, &CreateVolumeRequest::default(), None)
            .await
        {
            Err(e) if e.code() == Some(ErrorCode::OutOfScope) => Ok(client),
            Err(e) => bail!("a path outside the credential's prefix: {e}, not out_of_scope"),
            Ok(_) => bail!("a path outside the credential's prefix was created"),
        }
    }
}

/// 32 random bytes in hex, as `nfsprov-agent credential add` makes a token.
fn random_token() -> std::io::Result<String> {
    let mut bytes = [0u8; 32];
    rustix::rand::getrandom(&mut bytes, rustix::rand::GetRandomFlags::empty())?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

async fn run(args: Args) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    // Sparse: only what the benchmark writes takes space.
    let btrfs = if args.btrfs {
        Some(LoopBtrfs::new(8192, true)?)
    } else {
        None
    };
    let scoped = (args.credentials > 0)
        .then(|| Scoped::new(args.credentials))
        .transpose()?;
    let no_credentials = CredentialsFile::default();
    let credentials = scoped.as_ref().map_or(&no_credentials, |s| &s.file);
    let (root, agent) = match &btrfs {
        Some(fs) => {
            let settings = QuotaSettings {
                backend: QuotaBackend::Btrfs,
                ..QuotaSettings::default()
            };
            (
                fs.root(),
                TestAgent::start_with_credentials(&fs.root(), settings, credentials).await?,
            )
        }
        None => {
            let root = base.path().join("export");
            std::fs::create_dir(&root)?;
            let agent =
                TestAgent::start_with_credentials(&root, QuotaSettings::default(), credentials)
                    .await?;
            (root, agent)
        }
    };
    let client = agent.client();
    client.healthz().await.context("agent not serving")?;
    println!(
        "agent: https://{} (TLS 1.3, token auth), export root {}, quota backend {}",
        agent.addr(),
        root.display(),
        client.info(None).await?.capabilities.quota
    );
    let (pairs_client, under) = match &scoped {
        Some(scoped) => {
            println!(
                "pairs by credential {} of {} scoped ones (token only, prefix {})",
                scoped.prefix, args.credentials, scoped.prefix
            );
            (scoped.client(&agent).await?, scoped.prefix.clone())
        }
        None => (client.clone(), String::new()),
    };

    warm_up(&pairs_client, &under, args.concurrency).await?;
    let figures = pairs(
        &pairs_client,
        &under,
        args.pairs.unwrap_or(20_000),
        args.concurrency,
    )
    .await?;
    figures.print(args.concurrency);

    // Tree deletion: the same shape of tree, once through the agent and once by rm -rf.
    let files = args.tree_files;
    let request = volume_request();
    let volume = VolumePath::parse("tree")?;
    client.create_volume(&volume, &request, None).await?;
    fill(&root.join("tree"), files)?;
    // On the same filesystem as the volumes, so both deletions do the same work.
    let plain = match &btrfs {
        Some(fs) => fs.mount_point().join("plain-tree"),
        None => base.path().join("plain-tree"),
    };
    std::fs::create_dir(&plain)?;
    fill(&plain, files)?;
    sync();

    let t = Instant::now();
    let status = Command::new("rm").arg("-rf").arg(&plain).status()?;
    let rm_time = t.elapsed();
    if !status.success() {
        bail!("rm -rf failed: {status}");
    }
    let t = Instant::now();
    client.delete_volume(&volume, None).await?;
    let agent_time = t.elapsed();
    if root.join("tree").exists() {
        bail!("the tree is still there after DELETE");
    }
    println!(
        "tree of {files} files: DELETE through the agent {:.3}s, rm -rf {:.3}s, ratio {:.2}",
        agent_time.as_secs_f64(),
        rm_time.as_secs_f64(),
        agent_time.as_secs_f64() / rm_time.as_secs_f64()
    );
    agent.stop().await?;
    Ok(())
}

/// Pairs/s with each number of credentials. One agent per number, all started first
/// (each with its own export root and credentials file) and warmed up; then rounds that
/// run a block of pairs on each agent in turn, the start rotating so that no number
/// always follows the same other. Short blocks, interleaved: a change of the machine's
/// load falls on every number alike.
async fn compare_credentials(args: Args) -> anyhow::Result<()> {
    let counts = &args.compare_credentials;
    let block = args.pairs.unwrap_or(500);
    if args.repeats == 0 {
        bail!("--repeats must be at least 1");
    }
    println!(
        "pairs/s with {} scoped credentials: {} rounds of {} pairs on each agent at \
         concurrency {}",
        counts
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" / "),
        args.repeats,
        block,
        args.concurrency
    );
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let mut agents = Vec::with_capacity(counts.len());
    for (which, &count) in counts.iter().enumerate() {
        let root = base.path().join(format!("export-{which}"));
        std::fs::create_dir(&root)?;
        let scoped = (count > 0).then(|| Scoped::new(count)).transpose()?;
        let no_credentials = CredentialsFile::default();
        let credentials = scoped.as_ref().map_or(&no_credentials, |s| &s.file);
        let agent =
            TestAgent::start_with_credentials(&root, QuotaSettings::default(), credentials).await?;
        agent
            .client()
            .healthz()
            .await
            .context("agent not serving")?;
        let (client, under) = match &scoped {
            Some(scoped) => (scoped.client(&agent).await?, scoped.prefix.clone()),
            None => (agent.client(), String::new()),
        };
        warm_up(&client, &under, args.concurrency).await?;
        agents.push((agent, client, under, scoped));
    }

    let mut rates: Vec<Vec<f64>> = vec![Vec::new(); counts.len()];
    let mut latencies: Vec<Vec<Duration>> = vec![Vec::new(); counts.len()];
    let mut totals = vec![(0usize, Duration::ZERO); counts.len()];
    for round in 0..args.repeats {
        for step in 0..counts.len() {
            let which = (round + step) % counts.len();
            let (_, client, under, _) = &agents[which];
            let figures = pairs(client, under, block, args.concurrency).await?;
            rates[which].push(figures.rate());
            totals[which].0 += figures.pairs;
            totals[which].1 += figures.elapsed;
            latencies[which].extend(figures.all());
        }
    }
    for (agent, ..) in agents {
        agent.stop().await?;
    }

    println!(
        "credentials  pairs/s per round: median (min-max)  all rounds  request p50 / p99  \
         ratio of medians, first/this (per round: median, min-max)"
    );
    let baseline = median(&rates[0]);
    for (which, count) in counts.iter().enumerate() {
        let rate = &rates[which];
        let per_round: Vec<f64> = rates[0].iter().zip(rate).map(|(b, r)| b / r).collect();
        let (done, took) = totals[which];
        println!(
            "{count:>11}  {:>7.0} ({:.0}-{:.0})  {:>7.0}  {} / {}  {:.3} ({:.3}, {:.3}-{:.3})",
            median(rate),
            min(rate),
            max(rate),
            done as f64 / took.as_secs_f64(),
            ms(pct(&mut latencies[which], 50.0)),
            ms(pct(&mut latencies[which], 99.0)),
            baseline / median(rate),
            median(&per_round),
            min(&per_round),
            max(&per_round)
        );
    }
    Ok(())
}

fn volume_request() -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        ..Default::default()
    }
}

/// `under/rest`, or `rest` at the top of the export root.
fn beneath(under: &str, rest: &str) -> anyhow::Result<VolumePath> {
    let raw = if under.is_empty() {
        rest.to_owned()
    } else {
        format!("{under}/{rest}")
    };
    Ok(VolumePath::parse(&raw)?)
}

struct PairFigures {
    pairs: usize,
    elapsed: Duration,
    creates: Vec<Duration>,
    deletes: Vec<Duration>,
}

impl PairFigures {
    fn rate(&self) -> f64 {
        self.pairs as f64 / self.elapsed.as_secs_f64()
    }

    fn all(&self) -> Vec<Duration> {
        self.creates.iter().chain(&self.deletes).copied().collect()
    }

    fn print(mut self, concurrency: usize) {
        let mut all = self.all();
        println!(
            "create+delete pairs: {} in {:.2}s at concurrency {} = {:.0} pairs/s ({:.0} requests/s)",
            self.pairs,
            self.elapsed.as_secs_f64(),
            concurrency,
            self.rate(),
            2.0 * self.rate()
        );
        println!(
            "  request latency  p50 {}  p99 {}  max {}",
            ms(pct(&mut all, 50.0)),
            ms(pct(&mut all, 99.0)),
            ms(pct(&mut all, 100.0))
        );
        println!(
            "  create latency   p50 {}  p99 {}",
            ms(pct(&mut self.creates, 50.0)),
            ms(pct(&mut self.creates, 99.0))
        );
        println!(
            "  delete latency   p50 {}  p99 {}",
            ms(pct(&mut self.deletes, 50.0)),
            ms(pct(&mut self.deletes, 99.0))
        );
    }
}

/// One pair per connection, to open the connections and warm the caches.
async fn warm_up(client: &AgentClient, under: &str, concurrency: usize) -> anyhow::Result<()> {
    let request = volume_request();
    for i in 0..concurrency {
        let path = beneath(under, &format!("warmup/v{i}"))?;
        client.create_volume(&path, &request, None).await?;
        client.delete_volume(&path, None).await?;
    }
    Ok(())
}

/// `pairs` creates each followed by its delete, `concurrency` at a time, beneath `under`.
async fn pairs(
    client: &AgentClient,
    under: &str,
    pairs: usize,
    concurrency: usize,
) -> anyhow::Result<PairFigures> {
    let request = volume_request();

    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let create_latencies = Arc::new(Mutex::new(Vec::with_capacity(pairs)));
    let delete_latencies = Arc::new(Mutex::new(Vec::with_capacity(pairs)));
    let started = Instant::now();
    let mut workers = Vec::new();
    for _ in 0..concurrency {
        let client = client.clone();
        let next = next.clone();
        let request = request.clone();
        let creates = create_latencies.clone();
        let deletes = delete_latencies.clone();
        let under = under.to_owned();
        workers.push(tokio::spawn(async move {
            let mut mine_create = Vec::new();
            let mut mine_delete = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= pairs {
                    break;
                }
                let path = beneath(&under, &format!("bench/ns{}/v{i}", i % 16))?;
                let t = Instant::now();
                let outcome = client.create_volume(&path, &request, None).await?;
                mine_create.push(t.elapsed());
                if !outcome.created {
                    bail!("{path} already existed");
                }
                let t = Instant::now();
                client.delete_volume(&path, None).await?;
                mine_delete.push(t.elapsed());
            }
            creates.lock().await.extend(mine_create);
            deletes.lock().await.extend(mine_delete);
            anyhow::Ok(())
        }));
    }
    for worker in workers {
        worker.await??;
    }
    let elapsed = started.elapsed();
    let creates = create_latencies.lock().await.clone();
    let deletes = delete_latencies.lock().await.clone();
    Ok(PairFigures {
        pairs,
        elapsed,
        creates,
        deletes,
    })
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    if n % 2 == 1 {
        sorted[n / 2]
    } else {
        (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0
    }
}

fn min(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::INFINITY, f64::min)
}

fn max(values: &[f64]) -> f64 {
    values.iter().copied().fold(f64::NEG_INFINITY, f64::max)
}

/// `files` small files in subdirectories of 1,000 (a typical application layout).
fn fill(dir: &Path, files: usize) -> std::io::Result<()> {
    for i in 0..files {
        let sub = dir.join(format!("d{}", i / 1000));
        if i % 1000 == 0 {
            std::fs::create_dir_all(&sub)?;
        }
        std::fs::write(sub.join(format!("file-{i}")), b"0123456789")?;
    }
    Ok(())
}

fn sync() {
    let _ = Command::new("sync").status();
}

fn pct(samples: &mut [Duration], percentile: f64) -> Duration {
    if samples.is_empty() {
        return Duration::ZERO;
    }
    samples.sort_unstable();
    let rank = ((percentile / 100.0) * (samples.len() - 1) as f64).round() as usize;
    samples[rank.min(samples.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.2}ms", d.as_secs_f64() * 1000.0)
}

/// `--health-pass`: `volumes` volumes made 64 at a time, then `--passes` passes of the
/// agent's periodic task timed by its own histogram, with this process's VmHWM reset
/// just before them (the client is idle meanwhile: the growth is the agent's).
async fn health_pass(args: Args, volumes: usize) -> anyhow::Result<()> {
    let base = match &args.dir {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let root = base.path().join("export");
    std::fs::create_dir(&root)?;
    let exports = nfsprov_agent::exports::ExportSettings {
        reconcile_interval: Duration::from_secs(1),
        ..Default::default()
    };
    let agent =
        TestAgent::start_with_quota_and_exports(&root, QuotaSettings::default(), exports).await?;
    let client = agent.client();
    client.healthz().await.context("agent not serving")?;
    let started = Instant::now();
    let client = Arc::new(client);
    let mut made = tokio::task::JoinSet::new();
    let slots = Arc::new(tokio::sync::Semaphore::new(64));
    for i in 0..volumes {
        let client = client.clone();
        let slot = slots.clone().acquire_owned().await?;
        made.spawn(async move {
            let path = VolumePath::parse(&format!("ns-{:03}/v{i:06}", i % 100))?;
            client
                .create_volume(&path, &CreateVolumeRequest::default(), None)
                .await?;
            drop(slot);
            anyhow::Ok(())
        });
    }
    while let Some(done) = made.join_next().await {
        done??;
    }
    println!(
        "made {volumes} volumes in {:.1} s (directories, no quota, no export manager), export root {}",
        started.elapsed().as_secs_f64(),
        root.display()
    );
    let deadline = Instant::now() + Duration::from_secs(600);
    while metric(&agent, "nfsprov_agent_volumes_checked ")? < volumes as f64 {
        anyhow::ensure!(Instant::now() < deadline, "no pass saw every volume");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let count =
        |agent: &TestAgent| metric(agent, "nfsprov_agent_volume_check_duration_seconds_count ");
    let sum = |agent: &TestAgent| metric(agent, "nfsprov_agent_volume_check_duration_seconds_sum ");
    let (count0, sum0) = (count(&agent)?, sum(&agent)?);
    std::fs::write("/proc/self/clear_refs", "5")?;
    let before = status_kib("VmRSS:")?;
    let mut last = count0;
    let mut longest: f64 = 0.0;
    let mut previous_sum = sum0;
    while last < count0 + args.passes as f64 {
        anyhow::ensure!(Instant::now() < deadline, "the passes did not come");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = count(&agent)?;
        if now > last {
            let now_sum = sum(&agent)?;
            longest = longest.max((now_sum - previous_sum) / (now - last));
            previous_sum = now_sum;
            last = now;
        }
    }
    let peak = status_kib("VmHWM:")?;
    let passes = last - count0;
    let mean = (previous_sum - sum0) / passes;
    let abnormal = metric(
        &agent,
        "nfsprov_agent_volumes_abnormal{reason=\"missing\"} ",
    )?;
    println!(
        "periodic pass over {volumes} volumes: {passes} passes, mean {:.1} ms, longest {:.1} ms ({} missing)",
        mean * 1000.0,
        longest * 1000.0,
        abnormal
    );
    println!(
        "process RSS before the passes {:.1} MiB, peak during them {:.1} MiB (grew {:.1} MiB)",
        before as f64 / 1024.0,
        peak as f64 / 1024.0,
        peak.saturating_sub(before) as f64 / 1024.0
    );
    agent.stop().await?;
    Ok(())
}

/// This process's `field` of /proc/self/status, in KiB.
fn status_kib(field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string("/proc/self/status")?;
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in /proc/self/status"))
}

/// The value of the agent's metric line that starts with `name` (labels and the space
/// after them included), read with curl and the whole-root token.
fn metric(agent: &TestAgent, name: &str) -> anyhow::Result<f64> {
    let dir = agent.credentials_dir();
    let token = std::fs::read_to_string(dir.join(nfsprov_agent::init::files::TOKEN))?;
    let output = Command::new("curl")
        .args(["-sS", "--fail", "--max-time", "60", "--cacert"])
        .arg(dir.join(nfsprov_agent::init::files::CA_CERT))
        .arg("-H")
        .arg(format!("Authorization: Bearer {}", token.trim()))
        .arg(format!("https://localhost:{}/metrics", agent.addr().port()))
        .output()?;
    anyhow::ensure!(
        output.status.success(),
        "curl /metrics: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout)?;
    Ok(text
        .lines()
        .find_map(|line| line.strip_prefix(name)?.trim().parse().ok())
        .unwrap_or(0.0))
}
