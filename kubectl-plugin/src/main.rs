use clap::Parser;

#[tokio::main]
async fn main() {
    let cli = nfsprov_kubectl::Cli::parse();
    match nfsprov_kubectl::run(cli).await {
        Ok(code) => std::process::exit(code),
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(2);
        }
    }
}
