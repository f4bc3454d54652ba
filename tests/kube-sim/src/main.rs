//! Runs the simulator as a process for end-to-end tests: prints where it listens and writes
//! a kubeconfig for the programs under test.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use nfsprov_kube_sim::{SimOptions, Simulator};

#[derive(Parser, Debug)]
#[command(about = "Kubernetes API simulator for nfsprov's tests (never for production)")]
struct Args {
    /// Address to listen on (port 0: any free port).
    #[arg(long, env = "KUBE_SIM_LISTEN", default_value = "127.0.0.1:0")]
    listen: SocketAddr,
    /// Where to write the kubeconfig for clients.
    #[arg(long, env = "KUBE_SIM_KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Do not run the PV binder / protection controllers.
    #[arg(long)]
    no_binder: bool,
    /// Watch events kept per kind for resuming watches.
    #[arg(long, default_value_t = 10_000)]
    watch_history: usize,
    /// Seconds between bookmarks on watches that ask for them.
    #[arg(long, default_value_t = 5)]
    bookmark_interval: u64,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let sim = Simulator::start(SimOptions {
        address: args.listen,
        binder: !args.no_binder,
        watch_history: args.watch_history,
        bookmark_interval: Duration::from_secs(args.bookmark_interval.max(1)),
        ..SimOptions::default()
    })
    .await?;
    if let Some(path) = &args.kubeconfig {
        sim.write_kubeconfig(path)?;
    }
    // One line on stdout, for scripts: the URL clients use.
    println!("{}", sim.url());
    eprintln!(
        "kube-sim listening on {} (admin: POST {}/_sim/faults, /_sim/drop-watches, /_sim/compact)",
        sim.url(),
        sim.url()
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    sim.shutdown().await;
    Ok(())
}
