//! Finds the workspace's binaries next to the running test, building them first.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

static BUILT: OnceLock<Result<(), String>> = OnceLock::new();

/// Path of the workspace binary `name` (e.g. `nfsprov-agent`) of the current profile,
/// freshly built: `cargo test` does not rebuild other packages' binaries, and a stale
/// binary would test old code. The build is a no-op when they are up to date.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    // Set by the demo's launcher, which has just built the binaries itself.
    if let Some(dir) = std::env::var_os("NFSPROV_BIN_DIR") {
        let path = PathBuf::from(dir).join(name);
        anyhow::ensure!(path.exists(), "{} is missing", path.display());
        return Ok(path);
    }
    // Tests run from target/<profile>/deps/<test>; binaries live in target/<profile>/.
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or_else(|| anyhow::anyhow!("unexpected test executable location {}", exe.display()))?
        .to_owned();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    BUILT
        .get_or_init(|| {
            let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            // The same build `cargo test --workspace` makes (same feature resolution), so
            // under the test suite this finds everything built already.
            build.args(["test", "--workspace", "--no-run", "--locked", "--quiet"]);
            if release {
                build.arg("--release");
            }
            match build.status() {
                Ok(status) if status.success() => Ok(()),
                Ok(status) => Err(format!("building the workspace binaries failed: {status}")),
                Err(e) => Err(format!("cannot run cargo: {e}")),
            }
        })
        .clone()
        .map_err(anyhow::Error::msg)?;
    let path = profile_dir.join(name);
    anyhow::ensure!(
        path.exists(),
        "{} is missing after the build",
        path.display()
    );
    Ok(path)
}
