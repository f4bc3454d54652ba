//! Finds the workspace's binaries beside the running test or tool, building them first.

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

static BUILT: OnceLock<Result<(), String>> = OnceLock::new();

/// Path of the workspace binary `name` (e.g. `nfsprov-agent`) of the current profile,
/// freshly built: `cargo test` does not rebuild other packages' binaries, and a stale
/// binary would test old code. The build is a no-op when they are up to date.
pub fn binary(name: &str) -> anyhow::Result<PathBuf> {
    // Set by launchers that have just built the binaries themselves.
    if let Some(dir) = std::env::var_os("NFSPROV_BIN_DIR") {
        let path = PathBuf::from(dir).join(name);
        anyhow::ensure!(path.exists(), "{} is missing", path.display());
        return Ok(path);
    }
    // Tests run from target/<profile>/deps/; binaries live in target/<profile>/.
    let exe = std::env::current_exe()?;
    let parent = exe
        .parent()
        .ok_or_else(|| anyhow::anyhow!("unexpected executable location {}", exe.display()))?;
    let is_test = parent.file_name().is_some_and(|n| n == "deps");
    let profile_dir = if is_test {
        parent.parent().unwrap_or(parent)
    } else {
        parent
    }
    .to_owned();
    let release = profile_dir.file_name().is_some_and(|n| n == "release");
    BUILT
        .get_or_init(|| {
            let mut build = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
            // Cargo gave this test process the variables of its own package; a build
            // script that watches one of them (ring's watches CARGO_MANIFEST_DIR and
            // CARGO_PKG_*) would see it changed and rebuild everything above it, here and
            // again in the next top-level build. Without them the build is the one a
            // user's `cargo` makes.
            for (name, _) in std::env::vars_os() {
                if name.to_str().is_some_and(set_by_cargo_for_a_package) {
                    build.env_remove(&name);
                }
            }
            if is_test {
                // The same build `cargo test --workspace` makes (same feature resolution),
                // so under the test suite this finds everything built already.
                build.args(["test", "--workspace", "--no-run", "--locked", "--quiet"]);
            } else {
                build.args(["build", "--workspace", "--bins", "--locked", "--quiet"]);
            }
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

/// Whether `name` is one of the variables cargo sets for the package whose test or
/// binary it runs (as opposed to those that configure cargo, such as `CARGO_HOME`,
/// `CARGO_TARGET_DIR` or `CARGO_INCREMENTAL`).
fn set_by_cargo_for_a_package(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || name.starts_with("CARGO_BIN_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
        )
}
