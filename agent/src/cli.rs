//! The command line: `run` serves the API with the settings of [`crate::config`], `init`
//! writes those settings and the credentials ([`crate::init`]).

use clap::{Parser, Subcommand};

use crate::config::RunArgs;
use crate::credential::CredentialArgs;
use crate::init::InitArgs;

#[derive(Debug, Parser)]
#[command(
    name = "nfsprov-agent",
    version,
    about = "Creates, archives and deletes NFS export directories for the nfsprov controller over an authenticated HTTPS API"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the API.
    Run(RunArgs),
    /// Generate the CA, certificates, token and settings, and print the controller's Secret.
    Init(InitArgs),
    /// Add, rotate, revoke or list the scoped credentials, while the agent runs.
    Credential(CredentialArgs),
}
