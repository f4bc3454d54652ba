//! Real agents (the agent crate's own server, over HTTPS with mTLS and a token) on
//! temporary export roots, by the names the test's classes give them, and the connection
//! files a controller or plugin process reads them from.

use std::path::{Path, PathBuf};

use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};

/// One real agent and the export root it serves, removed when dropped.
pub struct Agent {
    pub name: String,
    agent: TestAgent,
    root: tempfile::TempDir,
}

impl Agent {
    /// Starts an agent called `name` on an export root of its own.
    pub async fn start(name: &str) -> Self {
        let root = tempfile::tempdir().expect("an export root");
        let agent = TestAgent::start(root.path())
            .await
            .expect("the agent starts");
        Self {
            name: name.to_owned(),
            agent,
            root,
        }
    }

    /// The export root the agent serves.
    pub fn root(&self) -> &Path {
        self.root.path()
    }

    /// How a controller reaches it (client certificate and token), under its name.
    pub fn connection(&self) -> AgentConnectionConfig {
        AgentConnectionConfig {
            name: self.name.clone(),
            ..self.agent.connection()
        }
    }

    /// A client of its API, as the controller's.
    pub fn client(&self) -> AgentClient {
        self.agent.client()
    }

    /// Stops the agent and waits until it has finished serving.
    pub async fn stop(self) -> std::io::Result<()> {
        self.agent.stop().await
    }
}

/// Writes one connection file per agent into `dir` (made if missing), as the controller's
/// `--agents-dir` and the plugin's read them; returns `dir`.
pub fn write_connection_files(dir: &Path, agents: &[Agent]) -> std::io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    for agent in agents {
        let c = agent.connection();
        let mut text = format!(
            "name = {:?}\nurl = {:?}\nca_file = {:?}\n",
            c.name, c.url, c.ca_file
        );
        for (key, file) in [
            ("token_file", &c.token_file),
            ("client_cert_file", &c.client_cert_file),
            ("client_key_file", &c.client_key_file),
        ] {
            if let Some(file) = file {
                text.push_str(&format!("{key} = {file:?}\n"));
            }
        }
        std::fs::write(dir.join(format!("{}.toml", c.name)), text)?;
    }
    Ok(dir.to_owned())
}
