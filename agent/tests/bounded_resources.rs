//! What a tenant stores, and how many clones run, never exhausts the agent: the agent as
//! a real process over HTTPS, its peak resident memory read from `/proc` around a usage
//! walk, a deletion and a clone of trees with many long-named entries; a create and an
//! adoption answered while a long clone runs; and deep clones at once under a low
//! descriptor limit.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::agent_process::{Setup, agent_binary, setup};
use nfsprov_agent::init::files;
use nfsprov_api_types::client::{AgentClient, ClientError, CloneOutcome, CreateOutcome};
use nfsprov_api_types::{
    AdoptVolumeRequest, CloneVolumeRequest, CreateVolumeRequest, QuotaPolicy, VolumeOwner,
    VolumePath,
};

/// Entries in each tree: enough that holding their names costs the old walks tens of
/// megabytes, few enough to be made and walked in seconds.
const ENTRIES: usize = 200_000;
/// Long names, as a tenant may choose (the limit is 255).
const NAME_LEN: usize = 250;

fn long_name(i: usize) -> String {
    let prefix = format!("{i:08}-");
    format!("{prefix}{}", "n".repeat(NAME_LEN - prefix.len()))
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

/// A quarter of what the names alone take when held in memory: an agent that keeps every
/// pending name grows past it, one whose memory is bounded by depth stays far below.
fn memory_bound(entries: usize) -> u64 {
    (entries * NAME_LEN / 4) as u64
}

/// The agent binary as a process of its own, so its memory and descriptors are its own.
struct Agent {
    setup: Setup,
    child: Child,
    client: AgentClient,
    /// The export root is a tmpfs of the test's own, unmounted when done.
    tmpfs: bool,
}

/// The file, in the agent's settings directory, whose exclusive lock a test holds to
/// keep a debug agent's finished clones from ending (see [`CloneHold`]).
const HOLD_CLONES: &str = "hold-clones";

/// Clones held open at their end, so that a test sees one in progress however fast the
/// copy was; dropped, it closes the file and so releases its lock and the clones.
struct CloneHold {
    _locked: std::fs::File,
}

impl CloneHold {
    fn new(agent: &Agent) -> CloneHold {
        let file = std::fs::File::create(agent.setup.etc.join(HOLD_CLONES)).unwrap();
        file.lock().unwrap();
        CloneHold { _locked: file }
    }
}

/// Where the agent serves from.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Root {
    /// A directory on the machine's own filesystem.
    Disk,
    /// A tmpfs mounted for the test: hundreds of thousands of entries are made and
    /// removed in seconds, where a busy disk takes minutes.
    Tmpfs,
}

impl Agent {
    /// Starts the agent on `root`, with `edit` applied to its settings file and, when
    /// `nofile` is set, under that descriptor limit; `None` (the test skipped) when the
    /// tmpfs cannot be mounted.
    async fn start(
        test: &str,
        root: Root,
        nofile: Option<u64>,
        edit: impl Fn(String) -> String,
    ) -> Option<Agent> {
        let setup = setup();
        if root == Root::Tmpfs {
            let mounted = Command::new("mount")
                .args(["-t", "tmpfs", "-o", "size=4g", "nfsprov-test"])
                .arg(&setup.root)
                .output();
            match mounted {
                Ok(output) if output.status.success() => {}
                Ok(output) => {
                    let reason = String::from_utf8_lossy(&output.stderr);
                    nfsprov_test_skip::skip(test, &format!("cannot mount a tmpfs: {reason}"));
                    return None;
                }
                Err(e) => {
                    nfsprov_test_skip::skip(test, &format!("cannot run mount: {e}"));
                    return None;
                }
            }
        }
        let config = setup.etc.join(files::CONFIG);
        let text = std::fs::read_to_string(&config).unwrap();
        std::fs::write(&config, edit(text)).unwrap();
        let mut command = match nofile {
            Some(limit) => {
                let mut command = Command::new("prlimit");
                command
                    .arg(format!("--nofile={limit}:{limit}"))
                    .arg("--")
                    .arg(agent_binary());
                command
            }
            None => Command::new(agent_binary()),
        };
        let child = command
            .args(["run", "--config"])
            .arg(&config)
            // Clones wait at their end only while a test has made this FIFO.
            .env("NFSPROV_AGENT_HOLD_CLONES", setup.etc.join(HOLD_CLONES))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let client = setup.client();
        let agent = Agent {
            setup,
            child,
            client,
            tmpfs: root == Root::Tmpfs,
        };
        agent.setup.wait_healthy(&agent.client).await;
        Some(agent)
    }

    fn status_kib(&self, field: &str) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        status
            .lines()
            .find_map(|line| line.strip_prefix(field))
            .and_then(|rest| rest.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or_else(|| panic!("no {field} in the agent's status"))
    }

    /// Resets the agent's peak resident memory to what it uses now; answers that, in bytes.
    fn reset_peak(&self) -> u64 {
        std::fs::write(format!("/proc/{}/clear_refs", self.child.id()), "5").unwrap();
        self.status_kib("VmRSS:") * 1024
    }

    /// The agent's peak resident memory since the last reset, in bytes.
    fn peak(&self) -> u64 {
        self.status_kib("VmHWM:") * 1024
    }

    /// The value of a sample without labels.
    async fn metric(&self, name: &str) -> f64 {
        sample(&self.setup.metrics().await, name)
            .unwrap_or_else(|| panic!("no sample {name} in the agent's metrics"))
    }

    /// Polls a metric until `holds`, failing after `limit`.
    async fn await_metric(&self, name: &str, limit: Duration, holds: impl Fn(f64) -> bool) -> f64 {
        let deadline = Instant::now() + limit;
        loop {
            let value = self.metric(name).await;
            if holds(value) {
                return value;
            }
            assert!(
                Instant::now() < deadline,
                "{name} still {value} after {limit:?}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn create(&self, volume: &str) -> std::path::PathBuf {
        let request = CreateVolumeRequest {
            capacity_bytes: 1 << 40,
            ..Default::default()
        };
        self.client
            .create_volume(&path(volume), &request, None)
            .await
            .unwrap();
        self.setup.root.join(volume)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if self.tmpfs {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.setup.root)
                .status();
        }
    }
}

/// The value of the sample `name` (without labels) in a metrics text.
fn sample(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .and_then(|value| value.trim().parse().ok())
}

fn clone_request(source: &str) -> CloneVolumeRequest {
    CloneVolumeRequest {
        source: path(source),
        capacity_bytes: 1 << 40,
        owner: VolumeOwner::default(),
        quota: QuotaPolicy::BestEffort,
        export: None,
    }
}

/// Repeats the clone request, as the controller does, until the agent says it is there.
async fn clone_until_ready(
    client: &AgentClient,
    target: &str,
    request: &CloneVolumeRequest,
) -> Result<CreateOutcome, ClientError> {
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        match client.clone_volume(&path(target), request, None).await? {
            CloneOutcome::Ready(outcome) => return Ok(outcome),
            CloneOutcome::InProgress(_) => {
                assert!(
                    Instant::now() < deadline,
                    "clone of {target} still running after 300 s"
                );
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

fn assert_bounded(what: &str, before: u64, peak: u64, entries: usize) {
    let grown = peak.saturating_sub(before);
    let bound = memory_bound(entries);
    eprintln!(
        "{what}: resident {} MiB before, peak {} MiB (grew {} KiB; bound {} KiB)",
        before >> 20,
        peak >> 20,
        grown >> 10,
        bound >> 10
    );
    assert!(
        grown < bound,
        "{what}: the agent grew by {grown} bytes, more than {bound} (a quarter of what the {entries} names of {NAME_LEN} bytes take)"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_usage_walk_of_many_long_named_directories_stays_small() {
    const TEST: &str = "a_usage_walk_of_many_long_named_directories_stays_small";
    let Some(agent) = Agent::start(TEST, Root::Tmpfs, None, |text| text).await else {
        return;
    };
    let dir = agent.create("tenant/wide").await;
    for i in 0..ENTRIES {
        std::fs::create_dir(dir.join(long_name(i))).unwrap();
    }
    let before = agent.reset_peak();
    let deadline = Instant::now() + Duration::from_secs(120);
    let usage = loop {
        let volume = agent
            .client
            .get_volume(&path("tenant/wide"), None)
            .await
            .unwrap()
            .unwrap();
        if let Some(usage) = volume.usage {
            break usage;
        }
        assert!(Instant::now() < deadline, "no usage after 120 s");
    };
    assert_eq!(
        usage.used_inodes,
        ENTRIES as u64 + 1,
        "every directory counted"
    );
    assert_bounded("usage walk", before, agent.peak(), ENTRIES);
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_many_long_named_files_stays_small() {
    const TEST: &str = "deleting_many_long_named_files_stays_small";
    let Some(agent) = Agent::start(TEST, Root::Tmpfs, None, |text| text).await else {
        return;
    };
    let dir = agent.create("tenant/files").await;
    for i in 0..ENTRIES {
        std::fs::write(dir.join(long_name(i)), b"").unwrap();
    }
    let before = agent.reset_peak();
    agent
        .client
        .delete_volume(&path("tenant/files"), None)
        .await
        .unwrap();
    assert!(!dir.exists());
    assert_bounded("delete", before, agent.peak(), ENTRIES);
}

#[tokio::test(flavor = "multi_thread")]
async fn cloning_many_hard_linked_files_stays_small_and_keeps_the_links() {
    const TEST: &str = "cloning_many_hard_linked_files_stays_small_and_keeps_the_links";
    const FILES: usize = ENTRIES / 2;
    let Some(agent) = Agent::start(TEST, Root::Tmpfs, None, |text| text).await else {
        return;
    };
    let dir = agent.create("tenant/linked").await;
    // Every first name is met before any second one: a copy that remembers where it
    // put each first name holds them all at once.
    let (first, second) = (dir.join("a"), dir.join("b"));
    std::fs::create_dir(&first).unwrap();
    std::fs::create_dir(&second).unwrap();
    for i in 0..FILES {
        let name = long_name(i);
        std::fs::write(first.join(&name), i.to_le_bytes()).unwrap();
        std::fs::hard_link(first.join(&name), second.join(&name)).unwrap();
    }
    let before = agent.reset_peak();
    clone_until_ready(
        &agent.client,
        "tenant/linked-copy",
        &clone_request("tenant/linked"),
    )
    .await
    .unwrap();
    let peak = agent.peak();

    let copy = agent.setup.root.join("tenant/linked-copy");
    let names: Vec<_> = std::fs::read_dir(&copy)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "only the source's entries: {names:?}");
    for dir in ["a", "b"] {
        assert_eq!(std::fs::read_dir(copy.join(dir)).unwrap().count(), FILES);
    }
    for i in (0..FILES).step_by(997) {
        let name = long_name(i);
        let (a, b) = (copy.join("a").join(&name), copy.join("b").join(&name));
        let (meta_a, meta_b) = (
            std::fs::metadata(&a).unwrap(),
            std::fs::metadata(&b).unwrap(),
        );
        assert_eq!(meta_a.ino(), meta_b.ino(), "{name}: one file");
        assert_eq!(meta_a.nlink(), 2, "{name}: exactly its two names");
        assert_eq!(std::fs::read(&a).unwrap(), i.to_le_bytes());
    }
    // The names held: the first names and their directory paths.
    assert_bounded("clone", before, peak, FILES);
}

/// `files` files of `bytes_each` bytes of data in `dir`.
fn write_big_source(dir: &Path, files: usize, bytes_each: usize) {
    let block: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    for n in 0..files {
        use std::io::Write;
        let mut file = std::fs::File::create(dir.join(format!("data-{n}"))).unwrap();
        for _ in 0..bytes_each / block.len() {
            file.write_all(&block).unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_create_and_an_adoption_are_answered_while_a_long_clone_runs() {
    let agent = Agent::start("", Root::Disk, None, |text| text)
        .await
        .expect("no tmpfs needed");
    let source = agent.create("team/big").await;
    write_big_source(&source, 4, 1 << 20);
    std::fs::create_dir_all(agent.setup.root.join("legacy/data")).unwrap();
    // However fast the copy, the clone holds its slot and locks until this is dropped.
    let hold = CloneHold::new(&agent);

    let cloning = tokio::spawn({
        let client = agent.client.clone();
        async move { clone_until_ready(&client, "team/big-copy", &clone_request("team/big")).await }
    });
    // The copy has begun: the clone holds whatever it holds for its whole run from here.
    agent
        .await_metric(
            "nfsprov_agent_clone_copied_bytes_total",
            Duration::from_secs(60),
            |bytes| bytes > 0.0,
        )
        .await;

    let started = Instant::now();
    let adoption = AdoptVolumeRequest {
        capacity_bytes: 1 << 30,
        owner: VolumeOwner::default(),
        export: None,
    };
    let adopted = tokio::time::timeout(
        Duration::from_secs(120),
        agent
            .client
            .adopt_volume(&path("legacy/data"), &adoption, None),
    )
    .await
    .expect("the adoption is answered within 120 s");
    let adopted_after = started.elapsed();
    adopted.unwrap();
    let running = agent.metric("nfsprov_agent_clones_in_progress").await;
    assert_eq!(
        running, 1.0,
        "the adoption was answered only after the clone ended ({adopted_after:?})"
    );

    let started = Instant::now();
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        ..Default::default()
    };
    tokio::time::timeout(
        Duration::from_secs(120),
        agent
            .client
            .create_volume(&path("team/other"), &request, None),
    )
    .await
    .expect("the create is answered within 120 s")
    .unwrap();
    let created_after = started.elapsed();
    let running = agent.metric("nfsprov_agent_clones_in_progress").await;
    assert_eq!(
        running, 1.0,
        "the create was answered only after the clone ended ({created_after:?})"
    );
    eprintln!("during the clone: adoption {adopted_after:?}, create {created_after:?}");
    drop(hold);
    cloning.await.unwrap().unwrap();
}

/// A chain of `depth` directories with a file at its bottom.
fn write_deep(dir: &Path, depth: usize) -> std::path::PathBuf {
    let mut bottom = dir.to_owned();
    for _ in 0..depth {
        bottom.push("d");
    }
    std::fs::create_dir_all(&bottom).unwrap();
    std::fs::write(bottom.join("leaf"), b"at the bottom").unwrap();
    bottom
}

#[tokio::test(flavor = "multi_thread")]
async fn deep_clones_at_once_under_a_low_descriptor_limit_all_succeed() {
    const CLONES: usize = 6;
    const DEPTH: usize = 500;
    // Room for one deep copy beside what the (lowered) connection and request limits
    // may take, and far from six.
    const NOFILE: u64 = 2560;
    let agent = Agent::start("", Root::Disk, Some(NOFILE), |text| {
        text.replace("max_connections = 4096", "max_connections = 32")
            .replace(
                "max_concurrent_requests = 256",
                "max_concurrent_requests = 8",
            )
    })
    .await
    .expect("no tmpfs needed");
    let mut bottoms = Vec::new();
    for n in 0..CLONES {
        let source = agent.create(&format!("deep/source-{n}")).await;
        bottoms.push(write_deep(&source, DEPTH));
    }
    // The first copy stays at the bottom of its tree a while, its descriptors all open.
    write_big_source(&bottoms[0], 8, 64 << 20);

    let clone = |n: usize| {
        let client = agent.client.clone();
        tokio::spawn(async move {
            clone_until_ready(
                &client,
                &format!("deep/copy-{n}"),
                &clone_request(&format!("deep/source-{n}")),
            )
            .await
        })
    };
    let mut clones = vec![clone(0)];
    agent
        .await_metric(
            "nfsprov_agent_clone_copied_bytes_total",
            Duration::from_secs(60),
            |bytes| bytes > 0.0,
        )
        .await;
    // Watches the queue while the clones run; the most it saw, once they are done.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let watcher = tokio::spawn({
        let setup_port = agent.setup.port;
        let https = agent.setup.https();
        let token = agent.setup.token();
        async move {
            let mut most = 0f64;
            while !*stopped.borrow() {
                let response = https
                    .get(format!("https://localhost:{setup_port}/metrics"))
                    .bearer_auth(&token)
                    .send()
                    .await;
                // The agent went away: the test is failing already and says why.
                let Ok(text) = async { response?.text().await }.await else {
                    break;
                };
                let queued = sample(&text, "nfsprov_agent_clone_jobs_queued").unwrap_or(0.0);
                most = most.max(queued);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            most
        }
    });
    clones.extend((1..CLONES).map(clone));
    for (n, clone) in clones.into_iter().enumerate() {
        let outcome = clone.await.unwrap();
        assert!(outcome.is_ok(), "clone {n}: {outcome:?}");
        let leaf = agent
            .setup
            .root
            .join(format!("deep/copy-{n}"))
            .join("d/".repeat(DEPTH))
            .join("leaf");
        assert_eq!(std::fs::read(&leaf).unwrap(), b"at the bottom");
    }
    stop.send(true).unwrap();
    let most_queued = watcher.await.unwrap();
    assert!(
        most_queued >= 1.0,
        "no clone job was ever seen waiting for a slot"
    );
    assert_eq!(agent.metric("nfsprov_agent_clone_job_slots").await, 1.0);
    assert_eq!(agent.metric("nfsprov_agent_clone_jobs_queued").await, 0.0);
    assert!(agent.metric("nfsprov_agent_clone_jobs_waited_total").await >= 1.0);
}

/// New jobs asked for by clients that hang up after 30 ms, per kind.
const HUNG_UP_REQUESTS: usize = 30_000;
/// The queue limit the test sets: small, so the requests past it are most of them.
const QUEUE_LIMIT: usize = 8;
/// What the agent may take however many jobs it was asked for.
const RSS_BOUND: u64 = 64 << 20;

/// Sends `HUNG_UP_REQUESTS` requests for new jobs (`request(n)` gives the n-th's method,
/// path and body: a clone is a POST, a snapshot a PUT), 32 at a time, each abandoned after 30 ms; answers how many the test saw
/// refused with 429 and `Retry-After`, and how many it hung up on. Any other answer fails
/// the test: a job admitted past the limit would have answered 202 or 201.
async fn flood(
    agent: &Agent,
    request: impl Fn(usize) -> (reqwest::Method, String, serde_json::Value),
) -> (usize, usize) {
    let https = agent.setup.https();
    let token = agent.setup.token();
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(32));
    let mut sent = tokio::task::JoinSet::new();
    for n in 0..HUNG_UP_REQUESTS {
        let permit = slots.clone().acquire_owned().await.unwrap();
        let (method, path, body) = request(n);
        let call = https
            .request(
                method,
                format!("https://localhost:{}{path}", agent.setup.port),
            )
            .bearer_auth(&token)
            .json(&body)
            .timeout(Duration::from_millis(30));
        sent.spawn(async move {
            let answer = call.send().await;
            drop(permit);
            match answer {
                // Hung up on after 30 ms, or on a connection the agent closed after
                // too many streams hung up on (HTTP/2's guard against rapid resets): no
                // answer either way.
                Err(_) => None,
                Ok(response) => Some((
                    response.status().as_u16(),
                    response
                        .headers()
                        .get("retry-after")
                        .and_then(|v| v.to_str().ok())
                        .map(str::to_owned),
                    path,
                )),
            }
        });
    }
    let (mut refused, mut hung_up) = (0, 0);
    while let Some(done) = sent.join_next().await {
        match done.unwrap() {
            None => hung_up += 1,
            Some((429, Some(retry_after), _)) => {
                assert!(retry_after.parse::<u64>().unwrap() > 0, "{retry_after}");
                refused += 1;
            }
            Some((status, retry_after, path)) => {
                panic!("{path}: {status}, Retry-After {retry_after:?}: neither refused nor waiting")
            }
        }
    }
    (refused, hung_up)
}

#[tokio::test(flavor = "multi_thread")]
async fn jobs_past_the_queue_limit_are_refused_and_memory_stays_bounded() {
    let agent = Agent::start("", Root::Disk, None, |text| {
        text.replace(
            "max_connections = 4096",
            &format!("max_connections = 4096\nmax_clone_jobs = 1\nmax_queued_jobs = {QUEUE_LIMIT}"),
        )
    })
    .await
    .expect("no tmpfs needed");
    let source = agent.create("team/source").await;
    std::fs::write(source.join("file"), b"some data").unwrap();
    // The one slot stays taken: every job admitted after this one waits.
    let hold = CloneHold::new(&agent);
    let busy = tokio::spawn({
        let client = agent.client.clone();
        async move { clone_until_ready(&client, "team/busy", &clone_request("team/source")).await }
    });
    agent
        .await_metric(
            "nfsprov_agent_jobs_running{kind=\"clone\"}",
            Duration::from_secs(60),
            |running| running == 1.0,
        )
        .await;
    let before = agent.status_kib("VmRSS:") * 1024;

    let clone_body = serde_json::to_value(clone_request("team/source")).unwrap();
    let (refused, hung_up) = flood(&agent, |n| {
        (
            reqwest::Method::POST,
            format!("/v1/clones/team/copy-{n}"),
            clone_body.clone(),
        )
    })
    .await;
    eprintln!("clones: {refused} refused, {hung_up} hung up on");
    let snapshot_body = serde_json::json!({"source": "team/source"});
    let (snapshots_refused, snapshots_hung_up) = flood(&agent, |n| {
        (
            reqwest::Method::PUT,
            format!("/v1/snapshots/snap-{n}"),
            snapshot_body.clone(),
        )
    })
    .await;
    eprintln!("snapshots: {snapshots_refused} refused, {snapshots_hung_up} hung up on");

    let rss = agent.status_kib("VmRSS:") * 1024;
    let peak = agent.peak();
    eprintln!(
        "resident {} KiB before, {} KiB after, peak {} KiB",
        before >> 10,
        rss >> 10,
        peak >> 10
    );
    assert!(
        rss < RSS_BOUND,
        "the agent holds {rss} bytes after the floods"
    );
    assert!(
        peak < RSS_BOUND,
        "the agent peaked at {peak} bytes during the floods"
    );
    for kind in ["clone", "snapshot"] {
        let queued = agent
            .metric(&format!("nfsprov_agent_jobs_queued{{kind=\"{kind}\"}}"))
            .await;
        assert_eq!(queued, QUEUE_LIMIT as f64, "{kind} jobs waiting");
        let counted = agent
            .metric(&format!(
                "nfsprov_agent_jobs_refused_total{{kind=\"{kind}\"}}"
            ))
            .await;
        let seen = if kind == "clone" {
            refused
        } else {
            snapshots_refused
        };
        // Every refusal the test saw was counted; a request hung up on before the agent
        // read it is neither.
        assert!(
            counted >= seen as f64,
            "{kind}: {counted} counted, {seen} seen"
        );
        assert!(
            counted + QUEUE_LIMIT as f64 <= HUNG_UP_REQUESTS as f64,
            "{kind}: {counted} refused"
        );
    }
    assert!(
        refused + snapshots_refused >= HUNG_UP_REQUESTS,
        "most requests must be refused, not hung up on: {refused} and {snapshots_refused} of {HUNG_UP_REQUESTS} each"
    );

    // Let go, the admitted jobs run and the queues empty.
    drop(hold);
    busy.await.unwrap().unwrap();
    for kind in ["clone", "snapshot"] {
        agent
            .await_metric(
                &format!("nfsprov_agent_jobs_queued{{kind=\"{kind}\"}}"),
                Duration::from_secs(120),
                |queued| queued == 0.0,
            )
            .await;
    }
    let copies = std::fs::read_dir(agent.setup.root.join("team"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("copy-")
        })
        .count();
    assert!(
        copies <= QUEUE_LIMIT,
        "{copies} clones made, more than were admitted"
    );
}
