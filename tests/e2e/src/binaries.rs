//! Finds the workspace's binaries next to the running test, building them if needed.

use std::path::PathBuf;
use std::process::Command;
use std::sync::Mutex;

static BUILD: Mutex<()> = Mutex::new(());

/// Path of the workspace binary `name` (e.g. `nfsprov-agent`) of the current profile.
pub fn binary(package: &str, name: &str) -> anyhow::Result<PathBuf> {
    // Tests run from target/<profile>/deps/<test>; binaries live in target/<profile>/.
    let exe = std::env::current_exe()?;
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .ok_or_else(|| anyhow::anyhow!("unexpected test executable location {}", exe.display()))?;
    let path = profile_dir.join(name);
    let _guard = BUILD.lock().unwrap_or_else(|e| e.into_inner());
    if !path.exists() {
        let release = profile_dir.file_name().is_some_and(|n| n == "release");
        let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        build.args(["build", "--locked", "-p", package, "--bin", name]);
        if release {
            build.arg("--release");
        }
        let status = build.status()?;
        anyhow::ensure!(status.success(), "building {name} failed");
    }
    anyhow::ensure!(
        path.exists(),
        "{} is missing after the build",
        path.display()
    );
    Ok(path)
}
