//! Copies of a file that is being rewritten while it is copied, over the real HTTPS API
//! of the agent binary (root required, as for every copy that keeps owners): each
//! snapshot or clone holds a state the file really had, or fails saying the file kept
//! changing; never a size with zeros behind it.
//!
//! The writer truncates the file and writes 1 MiB of `A` in one call, over and over. The
//! states the file passes through are therefore: empty (just truncated), and `A` repeated
//! any number of times up to 1 MiB (a write in progress, seen by a reader between two of
//! its pages, or the whole write done). Any copy holding a byte other than `A`, or more
//! than 1 MiB, is a state the file never had.

mod common;

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use common::agent_process::{Setup, setup};
use common::backing::root_or_skip;
use nfsprov_api_types::client::{AgentClient, ClientError, CloneOutcome};
use nfsprov_api_types::{
    CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, ErrorCode, QuotaPolicy,
    SnapshotName, VolumeOwner, VolumePath,
};

const MIB: usize = 1 << 20;
const SNAPSHOTS: usize = 200;
const CLONES: usize = 20;
const FILE: &str = "rewritten";

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

/// Rewrites `file` (truncate, then 1 MiB of `A` in one write) until stopped; counts its
/// rounds so the test can show the copies raced with it.
struct Writer {
    stop: Arc<AtomicBool>,
    rounds: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Writer {
    fn start(file: &Path) -> Writer {
        let stop = Arc::new(AtomicBool::new(false));
        let rounds = Arc::new(AtomicU64::new(0));
        let thread = std::thread::spawn({
            let (stop, rounds, file) = (stop.clone(), rounds.clone(), file.to_owned());
            move || {
                let data = vec![b'A'; MIB];
                while !stop.load(Ordering::Relaxed) {
                    let mut out = std::fs::OpenOptions::new()
                        .write(true)
                        .truncate(true)
                        .open(&file)
                        .unwrap();
                    out.write_all(&data).unwrap();
                    rounds.fetch_add(1, Ordering::Relaxed);
                }
            }
        });
        Writer {
            stop,
            rounds,
            thread: Some(thread),
        }
    }

    fn rounds(&self) -> u64 {
        self.rounds.load(Ordering::Relaxed)
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// What one copy of the file came to.
#[derive(Debug, Default)]
struct Tally {
    /// Copies that are a state the file had, by length: empty, a part of a write, whole.
    empty: usize,
    partial: usize,
    whole: usize,
    /// Jobs that failed because the file kept changing.
    refused: usize,
    /// Copies holding a state the file never had, described.
    invented: Vec<String>,
}

impl Tally {
    fn check_copy(&mut self, what: &str, copy: &Path) {
        let data = std::fs::read(copy).unwrap_or_else(|e| panic!("{what}: {e}"));
        if data.len() > MIB {
            self.invented
                .push(format!("{what}: {} bytes, more than 1 MiB", data.len()));
        } else if let Some(at) = data.iter().position(|&b| b != b'A') {
            let zeros = data.iter().filter(|&&b| b == 0).count();
            self.invented.push(format!(
                "{what}: {} bytes, byte {at} is {:#04x}; {zeros} zero bytes",
                data.len(),
                data[at]
            ));
        } else if data.is_empty() {
            self.empty += 1;
        } else if data.len() < MIB {
            self.partial += 1;
        } else {
            self.whole += 1;
        }
    }

    fn check_refusal(&mut self, what: &str, error: &ClientError) {
        let clear = error.code() == Some(ErrorCode::Conflict)
            && error
                .to_string()
                .contains("changed while it was being copied");
        assert!(clear, "{what} failed without the clear error: {error}");
        self.refused += 1;
    }
}

/// The agent process, killed when dropped, also when the test fails.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start(test: &str) -> Option<(Setup, Running, AgentClient)> {
    if !root_or_skip(test, "copies") {
        return None;
    }
    let setup = setup();
    let agent = Running(setup.spawn());
    let client = setup.client();
    setup.wait_healthy(&client).await;
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        ..CreateVolumeRequest::default()
    };
    client
        .create_volume(&path("team/live"), &request, None)
        .await
        .unwrap();
    std::fs::write(setup.root.join("team/live").join(FILE), vec![b'A'; MIB]).unwrap();
    Some((setup, agent, client))
}

fn report(what: &str, tally: &Tally, rounds: u64) {
    eprintln!(
        "{what}: {} empty, {} partial, {} whole, {} refused, {} invented; the writer rewrote the file {rounds} times",
        tally.empty,
        tally.partial,
        tally.whole,
        tally.refused,
        tally.invented.len()
    );
    assert!(
        tally.invented.is_empty(),
        "copies holding a state the file never had:\n{}",
        tally.invented.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_of_a_file_being_rewritten_hold_states_it_had() {
    let test = "snapshots_of_a_file_being_rewritten_hold_states_it_had";
    let Some((setup, _agent, client)) = start(test).await else {
        return;
    };
    let writer = Writer::start(&setup.root.join("team/live").join(FILE));
    let data = setup.root.join(".nfsprov/snapshots/data");
    let request = CreateSnapshotRequest {
        source: path("team/live"),
    };
    let mut tally = Tally::default();
    for n in 0..SNAPSHOTS {
        let name = SnapshotName::parse(&format!("live-{n}")).unwrap();
        let what = format!("snapshot {name}");
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match client.create_snapshot(&name, &request, None).await {
                Ok(snapshot) if snapshot.ready => {
                    tally.check_copy(&what, &data.join(name.as_str()).join(FILE));
                    client.delete_snapshot(&name, None).await.unwrap();
                    break;
                }
                Ok(_) => {
                    assert!(Instant::now() < deadline, "{what} not ready after 60 s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    tally.check_refusal(&what, &e);
                    break;
                }
            }
        }
    }
    let rounds = writer.rounds();
    drop(writer);
    report("snapshots", &tally, rounds);
    assert!(
        rounds > SNAPSHOTS as u64,
        "the writer rewrote the file only {rounds} times: the copies did not race with it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn clones_of_a_file_being_rewritten_hold_states_it_had() {
    let test = "clones_of_a_file_being_rewritten_hold_states_it_had";
    let Some((setup, _agent, client)) = start(test).await else {
        return;
    };
    let writer = Writer::start(&setup.root.join("team/live").join(FILE));
    let mut tally = Tally::default();
    for n in 0..CLONES {
        let target = path(&format!("team/copy-{n}"));
        let what = format!("clone {target}");
        let request = CloneVolumeRequest {
            source: path("team/live"),
            capacity_bytes: 1 << 30,
            owner: VolumeOwner::default(),
            quota: QuotaPolicy::BestEffort,
            export: None,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            match client.clone_volume(&target, &request, None).await {
                Ok(CloneOutcome::Ready(_)) => {
                    tally.check_copy(&what, &setup.root.join(target.as_str()).join(FILE));
                    client.delete_volume(&target, None).await.unwrap();
                    break;
                }
                Ok(CloneOutcome::InProgress(_)) => {
                    assert!(Instant::now() < deadline, "{what} not made after 60 s");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => {
                    tally.check_refusal(&what, &e);
                    break;
                }
            }
        }
    }
    let rounds = writer.rounds();
    drop(writer);
    report("clones", &tally, rounds);
}
