//! How setting up a server or a filesystem failed.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SetupError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Failed(String),
    /// This machine cannot make the layout now (no ZFS, a daemon that does not answer, no
    /// turn at a pool): the test is skipped, not failed.
    #[error("{0}")]
    Unavailable(String),
    /// ganesha started but would not serve these exports.
    #[error("ganesha refused exports {ids:?}; its log:\n{log}")]
    ExportsRefused { ids: Vec<u16>, log: String },
}

pub type Result<T> = std::result::Result<T, SetupError>;

/// Runs `program` with `args`; its stdout, or what it said when it failed.
pub fn run(program: &str, args: &[&str]) -> Result<String> {
    let output = std::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| SetupError::Failed(format!("cannot run {program}: {e}")))?;
    if !output.status.success() {
        return Err(SetupError::Failed(format!(
            "{program} {}: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim(),
            String::from_utf8_lossy(&output.stdout).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// Polls `condition` every 20 ms until it holds or `limit` passes.
pub fn eventually(
    what: &str,
    limit: std::time::Duration,
    mut condition: impl FnMut() -> bool,
) -> Result<()> {
    let deadline = std::time::Instant::now() + limit;
    while !condition() {
        if std::time::Instant::now() >= deadline {
            return Err(SetupError::Failed(format!(
                "timed out after {limit:?} waiting for {what}"
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(())
}
