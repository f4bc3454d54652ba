//! An agent run the way users run it: `nfsprov-agent init`, then `nfsprov-agent run` as
//! a separate process.

use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use nfsprov_api_types::client::{AgentClient, AgentConnectionConfig};

use crate::binaries::binary;

/// A running agent process; killed when dropped.
pub struct AgentProcess {
    name: String,
    bin: PathBuf,
    etc: PathBuf,
    port: u16,
    log: PathBuf,
    child: Option<Child>,
    _work: tempfile::TempDir,
}

impl AgentProcess {
    /// Initialises credentials for `name` and starts the agent serving `export_root`,
    /// telling clients to mount it from `nfs_server:nfs_path`.
    pub async fn start(
        name: &str,
        export_root: &Path,
        nfs_server: &str,
        nfs_path: &str,
    ) -> anyhow::Result<Self> {
        Self::start_with_settings(name, export_root, nfs_server, nfs_path, "").await
    }

    /// As [`AgentProcess::start`], with `extra_settings` (TOML sections such as `[quota]`)
    /// appended to the settings file `init` wrote.
    pub async fn start_with_settings(
        name: &str,
        export_root: &Path,
        nfs_server: &str,
        nfs_path: &str,
        extra_settings: &str,
    ) -> anyhow::Result<Self> {
        let bin = binary("nfsprov-agent")?;
        let work = tempfile::tempdir()?;
        let etc = work.path().join("etc");
        let port = crate::free_port()?;
        let init = Command::new(&bin)
            .args([
                "init",
                "--hostname",
                "localhost",
                "--ip",
                "127.0.0.1",
                "--name",
                name,
                // Test export roots are directories of the machine's filesystem.
                "--shared-filesystem",
            ])
            .arg("--dir")
            .arg(&etc)
            .arg("--export-root")
            .arg(export_root)
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--nfs-server", nfs_server, "--nfs-path", nfs_path])
            .output()?;
        anyhow::ensure!(
            init.status.success(),
            "nfsprov-agent init failed: {}",
            String::from_utf8_lossy(&init.stderr)
        );
        std::fs::write(work.path().join("secret.yaml"), &init.stdout)?;
        // Test export roots are directories of the machine's own filesystem, and their
        // volumes directories of it: both accepted by name, as an operator would, unless
        // the test's own settings say otherwise.
        let accept_shared = if extra_settings.contains("[exports]") {
            ""
        } else {
            "[exports]\nallow_shared_filesystem = true\nmount_control_only = true\n"
        };
        let settings = etc.join("agent.toml");
        let written = std::fs::read_to_string(&settings)?;
        std::fs::write(
            &settings,
            format!("{written}\n{extra_settings}\n{accept_shared}"),
        )?;
        let mut agent = Self {
            name: name.to_owned(),
            bin,
            etc,
            port,
            log: work.path().join("agent.log"),
            child: None,
            _work: work,
        };
        agent.spawn().await?;
        Ok(agent)
    }

    /// Starts the agent `nfsprov-agent init --name NAME --dir ETC` set up, listening on
    /// `port` (as given to init's `--listen`).
    pub async fn start_initialised(name: &str, etc: &Path, port: u16) -> anyhow::Result<Self> {
        let work = tempfile::tempdir()?;
        std::fs::copy(
            etc.join("controller-secret.yaml"),
            work.path().join("secret.yaml"),
        )?;
        let mut agent = Self {
            name: name.to_owned(),
            bin: binary("nfsprov-agent")?,
            etc: etc.to_owned(),
            port,
            log: work.path().join("agent.log"),
            child: None,
            _work: work,
        };
        agent.spawn().await?;
        Ok(agent)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        self.spawn_under(&[], &[]).await
    }

    /// Starts the agent as the argument of `wrapper` (a command and its arguments that
    /// runs the rest of its command line, e.g. `faketime -f +2d`), with `env` added.
    async fn spawn_under(&mut self, wrapper: &[&str], env: &[(&str, &str)]) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)?;
        // Under the umask the shipped systemd unit sets, as in production.
        let child = Command::new("sh")
            .args(["-c", "umask 077 && exec \"$0\" \"$@\""])
            .args(wrapper)
            .envs(env.iter().copied())
            .arg(&self.bin)
            .args(["run", "--config"])
            .arg(self.etc.join("agent.toml"))
            .stdout(Stdio::null())
            .stderr(log)
            // A group of its own, so that [`AgentProcess::kill`] reaches every process
            // of it (a wrapper's child too) and nothing else.
            .process_group(0)
            .spawn()?;
        self.child = Some(child);
        let client = self.client()?;
        crate::eventually(
            "the agent to answer /healthz",
            Duration::from_secs(30),
            || {
                let client = client.clone();
                async move { client.healthz().await.is_ok() }
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("{e}; agent log:\n{}", self.log_text()))
    }

    /// Stops the agent with SIGKILL (a crash): its whole process group, since a wrapper
    /// such as `faketime` runs the agent as a child of its own, which a kill of the
    /// wrapper alone would leave running.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(group) = rustix::process::Pid::from_raw(child.id() as i32) {
                let _ = rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the agent again with the same settings and credentials.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.kill();
        self.spawn().await
    }

    /// Starts the agent again with `env` added to its environment (e.g. a fault the
    /// test builds of the agent act on).
    pub async fn restart_with_env(&mut self, env: &[(&str, &str)]) -> anyhow::Result<()> {
        self.kill();
        self.spawn_under(&[], env).await
    }

    /// Starts the agent again with its wall clock `offset` ahead (libfaketime's syntax,
    /// e.g. `+2d`), its monotonic clock left alone so its timers run as usual: what the
    /// agent does once days have passed, without waiting for them.
    pub async fn restart_in_the_future(&mut self, offset: &str) -> anyhow::Result<()> {
        self.kill();
        self.spawn_under(
            &["faketime", "-f", offset],
            &[("FAKETIME_DONT_FAKE_MONOTONIC", "1")],
        )
        .await
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The agent's process id while it runs (for its memory in `/proc`); started
    /// without a wrapper, the shell that starts it has become the agent.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn url(&self) -> String {
        format!("https://localhost:{}", self.port)
    }

    /// The agent's `/metrics`, fetched with curl as a Prometheus operator would check it.
    pub fn metrics(&self) -> anyhow::Result<String> {
        let connection = self.connection();
        let token_file = connection
            .token_file
            .ok_or_else(|| anyhow::anyhow!("the agent has no token"))?;
        let token = std::fs::read_to_string(token_file)?;
        let output = Command::new("curl")
            .args(["-sS", "--fail-with-body", "--max-time", "30", "--cacert"])
            .arg(&connection.ca_file)
            .args(["-H", &format!("Authorization: Bearer {}", token.trim())])
            .arg(format!("{}/metrics", self.url()))
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "curl {}/metrics: {}{}",
            self.url(),
            String::from_utf8_lossy(&output.stderr),
            String::from_utf8_lossy(&output.stdout)
        );
        Ok(String::from_utf8(output.stdout)?)
    }

    /// The agent's log so far (for failure messages).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Connection settings as the controller gets them from the Secret `init` printed.
    pub fn connection(&self) -> AgentConnectionConfig {
        AgentConnectionConfig {
            name: self.name.clone(),
            url: self.url(),
            ca_file: self.etc.join("ca.pem"),
            token_file: Some(self.etc.join("token")),
            client_cert_file: Some(self.etc.join("controller.pem")),
            client_key_file: Some(self.etc.join("controller-key.pem")),
            timeout_seconds: 30,
            nfs_server: None,
            nfs_path: None,
            default: false,
        }
    }

    pub fn client(&self) -> anyhow::Result<AgentClient> {
        Ok(AgentClient::new(&self.connection())?)
    }

    /// Writes the files of the Secret `init` printed into `dir`, as Kubernetes would
    /// project them into the controller's pod.
    pub fn write_secret_files(&self, dir: &Path) -> anyhow::Result<()> {
        let manifest = std::fs::read_to_string(self._work.path().join("secret.yaml"))?;
        write_secret_manifest_files(&manifest, dir)
    }

    /// Runs `nfsprov-agent credential ARGS` on this agent's settings, as its operator
    /// would on the NFS server (e.g. `add staging --prefix staging --url URL`); what it
    /// printed (for `add` and `rotate`, the Secret for the cluster that uses it).
    pub fn credential(&self, args: &[&str]) -> anyhow::Result<String> {
        let output = Command::new(&self.bin)
            .arg("credential")
            .arg("--config")
            .arg(self.etc.join("agent.toml"))
            .args(args)
            .output()?;
        anyhow::ensure!(
            output.status.success(),
            "nfsprov-agent credential {args:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        Ok(String::from_utf8(output.stdout)?)
    }
}

impl Drop for AgentProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Writes the `stringData` entries of a Secret manifest (as `nfsprov-agent init` or
/// `credential add` print it) into `dir`, one file a key, as Kubernetes would project
/// them into the controller's pod.
pub fn write_secret_manifest_files(manifest: &str, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (key, value) in secret_string_data(manifest) {
        std::fs::write(dir.join(key), value)?;
    }
    Ok(())
}

/// The `stringData` entries of a Secret manifest written with `key: |` block scalars.
pub fn secret_string_data(manifest: &str) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    let mut in_data = false;
    for line in manifest.lines() {
        if line == "stringData:" {
            in_data = true;
            continue;
        }
        if !in_data {
            continue;
        }
        if let Some(value) = line.strip_prefix("    ") {
            if let Some((_, content)) = entries.last_mut() {
                content.push_str(value);
                content.push('\n');
            }
        } else if let Some(key) = line.strip_prefix("  ").and_then(|l| l.strip_suffix(": |")) {
            entries.push((key.to_owned(), String::new()));
        } else {
            in_data = false;
        }
    }
    entries
}
