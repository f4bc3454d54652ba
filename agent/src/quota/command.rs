//! Running the filesystems' own tools (`btrfs`, `zfs`, `xfs_quota`) with a time limit,
//! keeping their stderr for the error a client sees.

use std::fmt;
use std::io::Read;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use wait_timeout::ChildExt;

/// One invocation of a tool: the program and its arguments, exactly as run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCommand {
    pub program: String,
    pub args: Vec<String>,
}

impl ToolCommand {
    pub fn new<I, S>(program: &str, args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self {
            program: program.to_owned(),
            args: args.into_iter().map(Into::into).collect(),
        }
    }
}

impl fmt::Display for ToolCommand {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.program)?;
        for arg in &self.args {
            write!(f, " {arg}")?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum ToolError {
    #[error("`{command}` could not be started: {reason}")]
    NotStarted { command: String, reason: String },
    #[error("`{command}` failed ({status}): {stderr}")]
    Failed {
        command: String,
        status: String,
        stderr: String,
    },
    #[error("`{command}` did not finish within {seconds} s and was killed")]
    TimedOut { command: String, seconds: u64 },
}

impl ToolError {
    /// The tool's own explanation, for matching known failures.
    pub fn stderr(&self) -> &str {
        match self {
            ToolError::Failed { stderr, .. } => stderr,
            _ => "",
        }
    }
}

/// Runs tools. The real one starts processes; tests record the commands instead.
pub trait ToolRunner: Send + Sync + fmt::Debug {
    /// Runs the command to its end and returns its standard output.
    fn run(&self, command: &ToolCommand) -> Result<String, ToolError>;
}

/// Starts the tools as child processes, killing any that outlives the time limit.
#[derive(Debug, Clone)]
pub struct SystemRunner {
    timeout: Duration,
}

impl SystemRunner {
    pub fn new(timeout: Duration) -> Self {
        Self { timeout }
    }
}

/// A tool's multi-line output as one line (lines trimmed, blank ones dropped, the rest
/// joined by "; "), for start-up errors and log lines that must stay on one line.
pub fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|line| !line.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

/// Longest stderr kept for an error message.
const MAX_STDERR_CHARS: usize = 2000;

impl ToolRunner for SystemRunner {
    fn run(&self, command: &ToolCommand) -> Result<String, ToolError> {
        let shown = command.to_string();
        let mut child = Command::new(&command.program)
            .args(&command.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // The C locale keeps the tools' output in the format the parsers expect.
            .env("LC_ALL", "C")
            .spawn()
            .map_err(|e| ToolError::NotStarted {
                command: shown.clone(),
                reason: e.to_string(),
            })?;
        // Both pipes are drained on their own threads so a chatty tool never blocks on a
        // full pipe while we wait for it to exit.
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        let status = match child.wait_timeout(self.timeout) {
            Ok(Some(status)) => status,
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::TimedOut {
                    command: shown,
                    seconds: self.timeout.as_secs(),
                });
            }
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(ToolError::NotStarted {
                    command: shown,
                    reason: e.to_string(),
                });
            }
        };
        let stdout = stdout.map(collect).unwrap_or_default();
        let stderr = stderr.map(collect).unwrap_or_default();
        if status.success() {
            Ok(stdout)
        } else {
            let stderr = stderr.trim();
            let stderr = if stderr.is_empty() {
                stdout.trim()
            } else {
                stderr
            };
            Err(ToolError::Failed {
                command: shown,
                status: status.to_string(),
                stderr: stderr.chars().take(MAX_STDERR_CHARS).collect(),
            })
        }
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

fn collect(reader: std::thread::JoinHandle<String>) -> String {
    reader.join().unwrap_or_default()
}

/// A path naming `name` inside the directory `dir` refers to, for handing to a tool.
///
/// The agent reaches every directory by walking from the root without following links;
/// a textual path would be resolved again by the tool and could be redirected by a
/// symlink swapped in meanwhile. `/proc/<pid>/fd/<n>` is resolved by the kernel straight
/// to the directory this process holds open, so the tool lands where the agent checked.
pub fn path_through_fd(dir: BorrowedFd<'_>, name: Option<&str>) -> PathBuf {
    let mut path = PathBuf::from(format!(
        "/proc/{}/fd/{}",
        std::process::id(),
        dir.as_raw_fd()
    ));
    if let Some(name) = name {
        path.push(name);
    }
    path
}

/// Records every command and answers each from a queue of canned replies; for unit tests
/// of the exact commands a backend issues.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct MockToolRunner {
    calls: std::sync::Mutex<Vec<ToolCommand>>,
    replies: std::sync::Mutex<std::collections::VecDeque<Result<String, ToolError>>>,
}

#[cfg(test)]
impl MockToolRunner {
    /// Queues the answer to the next command; commands without a queued answer succeed
    /// with empty output.
    pub fn reply(&self, reply: Result<&str, ToolError>) -> &Self {
        self.replies
            .lock()
            .unwrap()
            .push_back(reply.map(str::to_owned));
        self
    }

    /// Every command run so far, as command lines.
    pub fn calls(&self) -> Vec<String> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .map(ToString::to_string)
            .collect()
    }
}

#[cfg(test)]
impl ToolRunner for MockToolRunner {
    fn run(&self, command: &ToolCommand) -> Result<String, ToolError> {
        self.calls.lock().unwrap().push(command.clone());
        self.replies
            .lock()
            .unwrap()
            .pop_front()
            .unwrap_or_else(|| Ok(String::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_failure_and_timeout_are_told_apart() {
        let runner = SystemRunner::new(Duration::from_secs(5));
        let out = runner
            .run(&ToolCommand::new("sh", ["-c", "echo hello"]))
            .unwrap();
        assert_eq!(out, "hello\n");

        let err = runner
            .run(&ToolCommand::new("sh", ["-c", "echo nope >&2; exit 3"]))
            .unwrap_err();
        assert!(matches!(err, ToolError::Failed { .. }), "{err}");
        assert_eq!(err.stderr(), "nope");
        assert!(err.to_string().contains("sh -c echo nope"), "{err}");

        let err = runner
            .run(&ToolCommand::new("no-such-tool-anywhere", ["x"]))
            .unwrap_err();
        assert!(matches!(err, ToolError::NotStarted { .. }), "{err}");

        let quick = SystemRunner::new(Duration::from_millis(200));
        let err = quick.run(&ToolCommand::new("sleep", ["30"])).unwrap_err();
        assert!(matches!(err, ToolError::TimedOut { .. }), "{err}");
    }

    #[test]
    fn paths_through_descriptors_reach_the_directory_held_open() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("marker"), b"here").unwrap();
        let fd = std::fs::File::open(dir.path()).unwrap();
        let path = path_through_fd(std::os::fd::AsFd::as_fd(&fd), Some("marker"));
        // Renaming the directory away does not change where the path leads.
        let moved = dir.path().with_extension("moved");
        std::fs::rename(dir.path(), &moved).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"here");
        std::fs::rename(&moved, dir.path()).unwrap();
    }
}
