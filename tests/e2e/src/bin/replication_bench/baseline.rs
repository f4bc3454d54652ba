//! The baselines of the same run: `rsync -a --stats` and `cp -a` of the source volume to a
//! local directory, each followed by a `sync -f` of what it wrote (the agent syncs a
//! replica before it answers), each timed with and without that sync.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// One copy by a baseline tool: its own time, its time with the sync after, and for
/// rsync the bytes its `--stats` reported.
#[derive(Debug, Clone, Default)]
pub struct Copy {
    pub time: Duration,
    pub with_sync: Duration,
    /// rsync's "Total bytes sent": its protocol included (file list, block checksums).
    pub bytes_sent: Option<u64>,
    /// rsync's "Literal data": file data that was not found at the destination.
    pub literal_bytes: Option<u64>,
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot start {program}: {e}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {}: {}: {}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The time from `started` to the end of a `sync -f` of the filesystem of `destination`.
fn synced(destination: &Path, started: Instant) -> anyhow::Result<Duration> {
    run("sync", &["-f", &destination.display().to_string()])?;
    Ok(started.elapsed())
}

/// `rsync -a --stats --no-whole-file source/ destination/`. rsync between two local
/// directories sends whole files by default; `--no-whole-file` has it use its delta
/// algorithm, as it does to another machine, so that a changed file's unchanged blocks
/// are not sent.
pub fn rsync(source: &Path, destination: &Path) -> anyhow::Result<Copy> {
    let from = format!("{}/", source.display());
    let to = format!("{}/", destination.display());
    let started = Instant::now();
    let stats = run("rsync", &["-a", "--stats", "--no-whole-file", &from, &to])?;
    let time = started.elapsed();
    Ok(Copy {
        time,
        with_sync: synced(destination, started)?,
        bytes_sent: Some(stat(&stats, "Total bytes sent")?),
        literal_bytes: Some(stat(&stats, "Literal data")?),
    })
}

/// `cp -a source destination` (destination not there before).
pub fn cp(source: &Path, destination: &Path) -> anyhow::Result<Copy> {
    let started = Instant::now();
    run(
        "cp",
        &[
            "-a",
            &source.display().to_string(),
            &destination.display().to_string(),
        ],
    )?;
    let time = started.elapsed();
    Ok(Copy {
        time,
        with_sync: synced(destination, started)?,
        ..Copy::default()
    })
}

/// One figure of rsync's `--stats`, e.g. "Total bytes sent: 1,074,070,341" (rsync 3.1+
/// groups digits with commas; older ones do not).
fn stat(stats: &str, label: &str) -> anyhow::Result<u64> {
    let line = stats
        .lines()
        .find_map(|line| line.trim().strip_prefix(label)?.strip_prefix(':'))
        .ok_or_else(|| anyhow::anyhow!("rsync --stats printed no {label:?}:\n{stats}"))?;
    let digits: String = line
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| *c != ',' && *c != '.')
        .collect();
    digits
        .parse()
        .map_err(|e| anyhow::anyhow!("rsync's {label:?} {line:?}: {e}"))
}

/// rsync's version line, for the report.
pub fn rsync_version() -> String {
    match run("rsync", &["--version"]) {
        Ok(text) => text.lines().next().unwrap_or_default().trim().to_owned(),
        Err(e) => format!("({e})"),
    }
}
