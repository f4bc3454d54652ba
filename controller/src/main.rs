use clap::Parser;
use nfsprov_controller::config::{Args, LogFormat};
use tracing_subscriber::EnvFilter;

/// jemalloc instead of glibc's malloc. At 10,000 claims on a real API server, glibc's heap
/// held about 30 MB of free chunks between the long-lived cache entries once a burst was
/// over (half of the controller's memory), which it cannot give back; jemalloc's size
/// classes keep such entries together (docs/benchmarks.md, "Controller memory").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read before `main`: one arena (a handful of threads, whose
/// contention costs less than an arena per thread's share of half-empty pages), and freed
/// pages returned to the system after a second instead of ten.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 47] = b"narenas:1,dirty_decay_ms:1000,muzzy_decay_ms:0\0";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    rustls::crypto::ring::default_provider()
        .install_default()
        .map_err(|_| anyhow::anyhow!("a rustls crypto provider was already installed"))?;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Logs go to stderr, leaving stdout free for anything a wrapper wants to parse.
    let logs = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => logs.init(),
    }
    nfsprov_controller::app::run(args).await?;
    Ok(())
}
