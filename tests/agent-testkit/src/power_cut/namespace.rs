//! A mount namespace in which a copy of the disk is mounted where the original is, as
//! after a reboot: the ganesha manager's files name absolute paths (each `%include`,
//! each export's `Path`), and the copy must be read at exactly those paths while the
//! original stays mounted at them for the agent that acknowledged.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use anyhow::Context;

/// A process holding a namespace of its own; every process entered into it sees `copy`
/// at `original`. The namespace ends when its last process does.
pub struct CopyAtOriginal {
    holder: Child,
}

impl CopyAtOriginal {
    /// `copy` as this namespace mounts it, bound at `original` in the new one, where the
    /// original and every mount below it (a btrfs volume's own, say) are unmounted
    /// first: a mount left below would still be named in the mount table at a volume's
    /// path and pass for the copy's. Private propagation: nothing mounted or unmounted in
    /// either reaches the other.
    pub fn new(copy: &Path, original: &Path) -> anyhow::Result<Self> {
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "--", "sh", "-c"])
            .arg(
                "umount --recursive \"$2\" && mount --bind \"$1\" \"$2\" && echo bound \
                 && exec sleep infinity",
            )
            .arg("sh")
            .arg(copy)
            .arg(original)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("start unshare (util-linux)")?;
        let mut line = String::new();
        let stdout = holder.stdout.take().context("no stdout of unshare")?;
        BufReader::new(stdout).read_line(&mut line)?;
        if line.trim() != "bound" {
            let _ = holder.kill();
            let output = holder.wait_with_output()?;
            anyhow::bail!(
                "the copy could not be bound at {}: {}",
                original.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        Ok(Self { holder })
    }

    /// The namespace, as `nsenter --mount=` takes it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/mnt", self.holder.id()))
    }

    /// `program` run inside the namespace (`nsenter` execs it: its process is the
    /// program's).
    pub fn command(&self, program: &Path) -> Command {
        let mut flag = OsString::from("--mount=");
        flag.push(self.path());
        let mut command = Command::new("nsenter");
        command.arg(flag).arg("--").arg(program);
        command
    }
}

/// The namespace goes once the processes entered into it are gone too.
impl Drop for CopyAtOriginal {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}
