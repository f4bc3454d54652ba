use anyhow::Context as _;
use clap::Parser;
use nfsprov_agent::cli::{Cli, Command};
use nfsprov_agent::config::AgentConfig;

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            // One line, whatever RUST_BACKTRACE says: this is what systemd's journal shows.
            eprintln!("nfsprov-agent: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> anyhow::Result<()> {
    // Installed before anything touches TLS, so every rustls user agrees on ring.
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli.command {
        Command::Init(args) => {
            let output = nfsprov_agent::init::run(&args)?;
            eprintln!(
                "Wrote the agent settings, certificates, keys and token to {}.\n\
                 Start the agent:   systemctl enable --now nfsprov-agent\n\
                 Check it:          curl --cacert {}/ca.pem {}/healthz\n\
                 Give the controller this Secret (also saved as {}/controller-secret.yaml):\n",
                output.dir.display(),
                output.dir.display(),
                output.url,
                output.dir.display(),
            );
            print!("{}", output.secret_manifest);
            Ok(())
        }
        Command::Credential(args) => {
            print!("{}", nfsprov_agent::credential::run(&args)?);
            Ok(())
        }
        Command::Run(args) => {
            let config = AgentConfig::load(&args)?;
            nfsprov_agent::init_tracing(config.log_format);
            let runtime =
                tokio::runtime::Runtime::new().context("cannot start the async runtime")?;
            runtime.block_on(async {
                let agent = nfsprov_agent::Agent::bind(config)?;
                agent.serve(nfsprov_agent::shutdown_signal()).await?;
                anyhow::Ok(())
            })
        }
    }
}
