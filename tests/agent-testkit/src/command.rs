//! Running the system tools the fixtures drive (mkfs, mount, zpool, ...).

use std::ffi::OsStr;
use std::process::{Command, Stdio};

/// Runs a program to its end with a C locale (so its messages can be matched); its stdout,
/// or what it said on failure.
pub fn run<A: AsRef<OsStr>>(program: &str, args: &[A]) -> Result<String, String> {
    let output = Command::new(program)
        .args(args)
        .env("LC_ALL", "C")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start {program}: {e} (is it installed?)"))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        let args: Vec<_> = args.iter().map(|a| a.as_ref().to_string_lossy()).collect();
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}
