//! Export benchmark on nfs-ganesha: N per-volume exports managed through ganesha's D-Bus
//! export manager by the agent's export table, on a private bus, at each size asked for,
//! each on a fresh ganesha and fresh directories. Prints the time to make the N, the time
//! to add and to remove one export with N present (p50/p99), the time for a change of
//! nodes to reach all N (the sets sent by many threads at once, as the controller does,
//! then until ganesha's DisplayExport shows it for every export), the time to restore
//! all N at an agent start (ganesha kept them; ganesha restarted without them) and
//! ganesha's own start from the agent's include list. With `--before`, an earlier build
//! of this bench runs each size too, turns interleaved, and a table sets the two side by
//! side. Prints figures; asserts nothing.
//!
//!   cargo build --release -p nfsprov-e2e --bin nfsprov-exports-bench &&
//!     target/release/nfsprov-exports-bench --exports 100,1000 --before OLD/nfsprov-exports-bench

#[path = "exports_bench/display.rs"]
mod display;
#[path = "exports_bench/figures.rs"]
mod figures;

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use clap::Parser;
use nfsprov_agent::exports::VolumeLayout;
use nfsprov_agent::exports::{ExportSettings, Exports, GaneshaExport, Reconciler};
use nfsprov_api_types::{ExportManager, ExportRequest, VolumePath};
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};

use figures::{Figures, Run, Turn};

#[derive(Debug, Parser)]
#[command(about = "Measure per-volume export changes on nfs-ganesha with N exports present")]
struct Args {
    /// Sizes: exports present while one is added and removed (a list: 100,1000,10000).
    #[arg(long, value_delimiter = ',', default_value = "10000")]
    exports: Vec<usize>,
    /// Exports added and removed one at a time for the percentiles.
    #[arg(long, default_value_t = 200)]
    samples: usize,
    /// Threads sending the changes of a node joining at once.
    #[arg(long, default_value_t = 64)]
    node_change_threads: usize,
    /// Above this size, ganesha's own restart from the include list is not measured (its
    /// configuration parser takes minutes at tens of thousands of exports).
    #[arg(long, default_value_t = 10_000)]
    ganesha_restart_max: usize,
    /// An earlier build of this bench, run at each size before this one (it is given
    /// `--exports N --samples S` only); its figures beside this one's in a table.
    #[arg(long)]
    before: Option<PathBuf>,
    /// Above this size, the earlier build is not run.
    #[arg(long, default_value_t = 10_000)]
    before_max: usize,
    /// Where each run makes its directories (a temporary directory of its own inside).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
}

fn request(clients: &[&str]) -> ExportRequest {
    ExportRequest {
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        ..ExportRequest::default()
    }
}

fn volume(i: usize) -> VolumePath {
    VolumePath::parse(&format!("bench/v{i:05}")).unwrap()
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// /proc/loadavg's 1, 5 and 15 minute averages.
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|text| {
            text.split_whitespace()
                .take(3)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|e| format!("(unreadable: {e})"))
}

fn ganesha_version() -> String {
    match Command::new("ganesha.nfsd").arg("-v").output() {
        Ok(output) => String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        Err(e) => format!("(ganesha.nfsd -v: {e})"),
    }
}

fn open(settings: &ExportSettings, root: &Path) -> anyhow::Result<(Exports, Duration)> {
    let started = Instant::now();
    let mount_root = root.display().to_string();
    // The benchmark's root is a directory of the machine's filesystem.
    let (exports, restored) = Exports::open(
        settings,
        root,
        &mount_root,
        VolumeLayout::SharedFilesystem,
        |_| true,
    )?;
    let took = started.elapsed();
    println!(
        "  restore: kept {} added {} repaired {} removed {}",
        restored.kept, restored.added, restored.repaired, restored.removed
    );
    Ok((exports, took))
}

/// Changes every export of `0..n` to `request` from `threads` threads at once, each
/// set on a blocking thread as the agent's API calls it. A set that fails is sent again
/// (the controller retries an export the agent answered 503), each at most 10 times in all.
/// Returns how many were sent again.
async fn set_all_at_once(
    exports: &Arc<Exports>,
    n: usize,
    request: &ExportRequest,
    threads: usize,
) -> anyhow::Result<usize> {
    let next = Arc::new(AtomicUsize::new(0));
    let retried = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for _ in 0..threads.max(1) {
        let (exports, next, retried, request) = (
            exports.clone(),
            next.clone(),
            retried.clone(),
            request.clone(),
        );
        workers.push(tokio::task::spawn_blocking(
            move || -> anyhow::Result<()> {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= n {
                        return Ok(());
                    }
                    let mut attempt = 1;
                    while let Err(error) = exports.set(&volume(i), &request) {
                        anyhow::ensure!(
                            attempt < 10,
                            "{}: {error} ({attempt} attempts)",
                            volume(i)
                        );
                        attempt += 1;
                        retried.fetch_add(1, Ordering::Relaxed);
                    }
                }
            },
        ));
    }
    for worker in workers {
        worker.await??;
    }
    Ok(retried.load(Ordering::Relaxed))
}

/// One size on a fresh ganesha and fresh directories: prints each figure as it comes,
/// and keeps it in `figures` (so a run that ends early keeps what it measured).
async fn measure(args: &Args, n: usize, figures: &mut Figures) -> anyhow::Result<()> {
    let samples = args.samples;
    std::fs::create_dir_all(&args.dir)?;
    let base = tempfile::Builder::new()
        .prefix("nfsprov-exports-bench-")
        .tempdir_in(&args.dir)?;
    let root = base.path().join("export");
    let config_dir = base.path().join("ganesha.d");
    for i in 0..n + samples {
        std::fs::create_dir_all(root.join(volume(i).as_str()))?;
    }
    let bus = PrivateBus::start().await?;
    let mut ganesha = Ganesha::start(&bus, &config_dir).await?;
    let settings = ExportSettings {
        manager: ExportManager::Ganesha,
        ganesha_config_dir: config_dir.clone(),
        ganesha_dbus_address: Some(bus.address().to_owned()),
        ..ExportSettings::default()
    };
    let node_a = request(&["127.0.0.2"]);
    let (exports, _) = open(&settings, &root)?;

    let started = Instant::now();
    for i in 0..n {
        exports.set(&volume(i), &node_a)?;
    }
    let fill = started.elapsed();
    figures.make_s = Some(fill.as_secs_f64());
    figures.make_each_ms = Some(ms(fill) / n.max(1) as f64);
    println!("{}", figures::made_line(n, fill.as_secs_f64()));

    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for i in n..n + samples {
        let started = Instant::now();
        exports.set(&volume(i), &node_a)?;
        adds.push(started.elapsed());
        let started = Instant::now();
        exports.remove(&volume(i))?;
        removes.push(started.elapsed());
    }
    if samples > 0 {
        adds.sort_unstable();
        removes.sort_unstable();
        let p = [
            ms(percentile(&adds, 0.5)),
            ms(percentile(&adds, 0.99)),
            ms(percentile(&removes, 0.5)),
            ms(percentile(&removes, 0.99)),
        ];
        [
            figures.add_p50_ms,
            figures.add_p99_ms,
            figures.remove_p50_ms,
            figures.remove_p99_ms,
        ] = p.map(Some);
        println!("{}", figures::add_remove_line(n, samples, p));
    }

    // ganesha's own share of an add and a remove with N present: the same D-Bus calls,
    // without the agent's files.
    let alone = ganesha_alone(&bus, &root, &config_dir, samples.min(50))?;
    [
        figures.ganesha_add_p50_ms,
        _,
        figures.ganesha_remove_p50_ms,
        _,
    ] = alone.map(Some);
    println!("{}", figures::ganesha_alone_line(n, samples.min(50), alone));

    // A node joins: every export admits it, the changes sent many at once.
    let joined = "127.0.0.3";
    let both = request(&["127.0.0.2", joined]);
    let exports = Arc::new(exports);
    let started = Instant::now();
    let retried = set_all_at_once(&exports, n, &both, args.node_change_threads).await?;
    let returned = started.elapsed();
    figures.node_change_s = Some(returned.as_secs_f64());
    println!("{}", figures::node_change_line(n, returned.as_secs_f64()));
    println!(
        "  node change: {} threads at once, {retried} sets sent again after an error",
        args.node_change_threads
    );
    // Then, from ganesha's side: every export of the bench's volumes (not ganesha's
    // pseudo root) shows the new client.
    let root_path = root.display().to_string();
    let ids: Vec<u16> = ganesha
        .exports()?
        .into_iter()
        .filter(|(_, path)| path.starts_with(&root_path))
        .map(|(id, _)| id)
        .collect();
    if ids.len() != n {
        println!(
            "  ganesha's ShowExports lists {} exports of the bench's volumes, not {n}",
            ids.len()
        );
    }
    let address = bus.address().to_owned();
    let checked_from = Instant::now();
    let shown = tokio::task::spawn_blocking(move || {
        display::ExportManager::connect(&address)?.wait_until_all_admit(
            &ids,
            joined,
            Duration::from_secs(120),
        )
    })
    .await??;
    let shown_after = shown - started;
    figures.node_change_shown_s = Some(shown_after.as_secs_f64());
    println!(
        "{}",
        figures::node_change_shown_line(
            n,
            shown_after.as_secs_f64(),
            (shown - checked_from).as_secs_f64()
        )
    );
    drop(exports);

    let (exports, took) = open(&settings, &root)?;
    figures.restore_kept_s = Some(took.as_secs_f64());
    println!(
        "{}",
        figures::restore_kept_line(exports.len(), took.as_secs_f64())
    );
    drop(exports);

    if n <= args.ganesha_restart_max {
        let started = Instant::now();
        // ganesha 4.3 reads a long include list for minutes: wait as long as it takes.
        ganesha.restart_within(Duration::from_secs(3600)).await?;
        let served = serving_all(&ganesha, n).await?;
        let up = started.elapsed();
        if served > n {
            figures.ganesha_restart_s = Some(up.as_secs_f64());
            println!(
                "{}",
                figures::ganesha_restart_line(served, up.as_secs_f64())
            );
        } else {
            println!(
                "ganesha restarted from the include list serves only {served} exports of {} after {:.1} s",
                n + 1,
                up.as_secs_f64()
            );
        }
    } else {
        println!(
            "{}",
            figures::ganesha_restart_skipped_line(n, args.ganesha_restart_max)
        );
    }

    // ganesha restarted without them (its include list emptied): the agent adds all.
    std::fs::write(config_dir.join("exports.conf"), "")?;
    ganesha.restart().await?;
    let (exports, took) = open(&settings, &root)?;
    figures.restore_lost_s = Some(took.as_secs_f64());
    println!(
        "{}",
        figures::restore_lost_line(exports.len(), took.as_secs_f64())
    );
    drop(exports);

    // ganesha's own start reads none (exports.ganesha_reads_exports_at_start = false):
    // it is back on the bus at once, and the agent, woken by that, serves all again.
    let served_by_agent = ExportSettings {
        ganesha_reads_exports_at_start: false,
        // No pass on a timer within the run: only ganesha's return starts one.
        reconcile_interval: Duration::from_secs(3600),
        ..settings.clone()
    };
    let (exports, _) = open(&served_by_agent, &root)?;
    let exports = Arc::new(exports);
    let passes = Reconciler::new(exports.clone(), served_by_agent.reconcile_interval).spawn(|_| {});
    let started = Instant::now();
    ganesha.restart().await?;
    let served = serving_all(&ganesha, n).await?;
    passes.abort();
    if served > n {
        let took = started.elapsed().as_secs_f64();
        figures.agent_served_restart_s = Some(took);
        println!("{}", figures::agent_served_line(n, took));
    } else {
        println!(
            "ganesha restarted reading none: the agent had it serve only {served} of {} in 600 s",
            n + 1
        );
    }
    Ok(())
}

/// How many exports ganesha serves once it serves the `n` and its pseudo root, or after
/// ten minutes.
async fn serving_all(ganesha: &Ganesha, n: usize) -> anyhow::Result<usize> {
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let served = ganesha.export_ids()?.len();
        if served > n || Instant::now() > deadline {
            return Ok(served);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// ganesha's AddExport and RemoveExport of one export of its own, `samples` times, with
/// what ganesha serves already: p50 and p99 of each, in ms.
fn ganesha_alone(
    bus: &PrivateBus,
    root: &Path,
    config_dir: &Path,
    samples: usize,
) -> anyhow::Result<[f64; 4]> {
    let dir = root.join("ganesha-alone");
    std::fs::create_dir_all(&dir)?;
    // Outside the agent's id range, which a pass of its own would withdraw.
    let id = 65_500;
    let file = config_dir.join("ganesha-alone.conf");
    std::fs::write(
        &file,
        format!(
            "EXPORT {{\n  Export_Id = {id};\n  Path = \"{}\";\n  Pseudo = \"/ganesha-alone\";\n  Protocols = 4;\n  Transports = TCP;\n  Access_Type = None;\n  SecType = sys;\n  FSAL {{ Name = VFS; }}\n  CLIENT {{\n    Clients = 127.0.0.2;\n    Access_Type = RW;\n  }}\n}}\n",
            dir.display()
        ),
    )?;
    let manager = GaneshaExport::new(Some(bus.address().to_owned()), Duration::from_secs(60));
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    for _ in 0..samples.max(1) {
        let started = Instant::now();
        manager.add(&file, id)?;
        adds.push(started.elapsed());
        let started = Instant::now();
        manager.remove(id)?;
        removes.push(started.elapsed());
    }
    std::fs::remove_file(&file)?;
    adds.sort_unstable();
    removes.sort_unstable();
    Ok([
        ms(percentile(&adds, 0.5)),
        ms(percentile(&adds, 0.99)),
        ms(percentile(&removes, 0.5)),
        ms(percentile(&removes, 0.99)),
    ])
}

/// Runs the earlier build at one size, its lines echoed as they come, and reads its
/// figures back into `figures` (those it printed, also when it ended early).
fn run_before(binary: &Path, args: &Args, n: usize, figures: &mut Figures) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)?;
    let mut child = Command::new(binary)
        .args([
            "--exports",
            &n.to_string(),
            "--samples",
            &args.samples.to_string(),
        ])
        // Earlier builds make their directories in the temporary directory.
        .env("TMPDIR", &args.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| anyhow::anyhow!("cannot start {}: {e}", binary.display()))?;
    let mut output = String::new();
    if let Some(stdout) = child.stdout.take() {
        for line in std::io::BufReader::new(stdout).lines() {
            let line = line?;
            println!("  before | {line}");
            output.push_str(&line);
            output.push('\n');
        }
    }
    let status = child.wait()?;
    *figures = Figures::parse(&output);
    anyhow::ensure!(status.success(), "{} ended: {status}", binary.display());
    Ok(())
}

/// Runs one build at one size between two readings of the load average.
async fn timed_run<F>(label: &str, n: usize, run: F) -> Run
where
    F: std::future::Future<Output = (Figures, anyhow::Result<()>)>,
{
    let load_before = load_average();
    println!("== {label}, N = {n}; load average {load_before}");
    let (figures, result) = run.await;
    let load_after = load_average();
    println!("== {label}, N = {n} done; load average {load_after}");
    let failure = result.err().map(|error| format!("{error:#}"));
    if let Some(failure) = &failure {
        println!("{label}, N = {n}: ended early: {failure}");
    }
    Run::Measured {
        figures: Box::new(figures),
        load_before,
        load_after,
        failure,
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    println!("ganesha: {}", ganesha_version());
    let mut turns = Vec::new();
    for &n in &args.exports {
        let before = match &args.before {
            None => Run::Skipped("no --before".into()),
            Some(_) if n > args.before_max => {
                Run::Skipped(format!("above --before-max {}", args.before_max))
            }
            Some(binary) => {
                let binary = binary.clone();
                timed_run("before", n, async {
                    let mut figures = Figures::default();
                    let result =
                        tokio::task::block_in_place(|| run_before(&binary, &args, n, &mut figures));
                    (figures, result)
                })
                .await
            }
        };
        let after = timed_run("after", n, async {
            let mut figures = Figures::default();
            let result = measure(&args, n, &mut figures).await;
            (figures, result)
        })
        .await;
        turns.push(Turn {
            exports: n,
            before,
            after,
        });
    }
    // One size and nothing to compare: the lines above are the whole report (and what
    // a later build reads back when it runs this one as its "before").
    if turns.len() > 1 || args.before.is_some() {
        println!();
        println!(
            "ganesha {}; {} samples; node change from {} threads",
            ganesha_version(),
            args.samples,
            args.node_change_threads
        );
        println!();
        print!("{}", figures::table(&turns));
        println!(
            "\n(before: each build measures in its own way; an earlier build may send a \
             node's changes one at a time, and print fewer decimals.)"
        );
    }
    let ended_early = |run: &Run| {
        matches!(
            run,
            Run::Measured {
                failure: Some(_),
                ..
            }
        )
    };
    if turns.iter().any(|turn| ended_early(&turn.after)) {
        anyhow::bail!("a run of this build ended early (see above)");
    }
    Ok(())
}
