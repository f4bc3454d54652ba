//! Filesystems made in a file and mounted by a test (root required), for tests of the
//! quota backends on the real thing: the agent's own tests and the end-to-end suite.

use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// A btrfs filesystem in a sparse file, loop-mounted in a temp dir, with an `exports`
/// directory to serve; unmounted when dropped.
pub struct LoopBtrfs {
    mount: PathBuf,
    // Declared last so the image outlives the mount.
    _dir: tempfile::TempDir,
}

impl LoopBtrfs {
    /// Makes and mounts the filesystem; with `quotas`, enables btrfs quotas on it.
    pub fn new(size_mib: u64, quotas: bool) -> anyhow::Result<Self> {
        anyhow::ensure!(
            rustix::process::geteuid().is_root(),
            "a loop-mounted btrfs needs root; run the tests as root"
        );
        let dir = tempfile::tempdir()?;
        let image = dir.path().join("btrfs.img");
        std::fs::File::create(&image)?.set_len(size_mib * MIB)?;
        run("mkfs.btrfs", &["-q".as_ref(), image.as_os_str()])?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount)?;
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                mount.as_os_str(),
            ],
        )?;
        let fs = Self { mount, _dir: dir };
        if quotas {
            run(
                "btrfs",
                &["quota".as_ref(), "enable".as_ref(), fs.mount.as_os_str()],
            )?;
        }
        std::fs::create_dir(fs.root())?;
        Ok(fs)
    }

    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// The directory to serve as an export root.
    pub fn root(&self) -> PathBuf {
        self.mount.join("exports")
    }

    /// Commits the filesystem, so qgroup figures are up to date.
    pub fn sync(&self) -> anyhow::Result<()> {
        run(
            "btrfs",
            &[
                "filesystem".as_ref(),
                "sync".as_ref(),
                self.mount.as_os_str(),
            ],
        )
        .map(drop)
    }

    /// `btrfs subvolume list` of the whole filesystem.
    pub fn subvolumes(&self) -> anyhow::Result<String> {
        run(
            "btrfs",
            &[
                "subvolume".as_ref(),
                "list".as_ref(),
                self.mount.as_os_str(),
            ],
        )
    }

    /// The limit on referenced bytes of the subvolume at `path`, from btrfs itself.
    pub fn qgroup_limit(&self, path: &Path) -> anyhow::Result<Option<u64>> {
        let report = run(
            "btrfs",
            &[
                "qgroup".as_ref(),
                "show".as_ref(),
                "--raw".as_ref(),
                "-r".as_ref(),
                "-f".as_ref(),
                path.as_os_str(),
            ],
        )?;
        let row = report
            .lines()
            .find(|line| line.starts_with("0/"))
            .ok_or_else(|| anyhow::anyhow!("no qgroup for {}: {report}", path.display()))?;
        Ok(row.split_whitespace().nth(3).and_then(|v| v.parse().ok()))
    }
}

impl Drop for LoopBtrfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

/// An XFS filesystem in a sparse file, loop-mounted in a temp dir, with an `exports`
/// directory to serve; unmounted when dropped. No quotas: for tests of what the agent does
/// on XFS without its project quota backend (clones by `FICLONE`, say).
pub struct LoopXfs {
    mount: PathBuf,
    // Declared last so the image outlives the mount.
    _dir: tempfile::TempDir,
}

impl LoopXfs {
    /// Makes and mounts the filesystem (xfsprogs wants at least 300 MiB); with `reflink`,
    /// with extents files can share (`mkfs.xfs -m reflink=1`), without, none.
    pub fn new(size_mib: u64, reflink: bool) -> anyhow::Result<Self> {
        anyhow::ensure!(
            rustix::process::geteuid().is_root(),
            "a loop-mounted XFS needs root; run the tests as root"
        );
        let dir = tempfile::tempdir()?;
        let image = dir.path().join("xfs.img");
        std::fs::File::create(&image)?.set_len(size_mib * MIB)?;
        let reflink = if reflink { "reflink=1" } else { "reflink=0" };
        run(
            "mkfs.xfs",
            &[
                "-q".as_ref(),
                "-m".as_ref(),
                reflink.as_ref(),
                image.as_os_str(),
            ],
        )?;
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount)?;
        run(
            "mount",
            &[
                "-o".as_ref(),
                "loop".as_ref(),
                image.as_os_str(),
                mount.as_os_str(),
            ],
        )?;
        let fs = Self { mount, _dir: dir };
        std::fs::create_dir(fs.root())?;
        Ok(fs)
    }

    pub fn mount_point(&self) -> &Path {
        &self.mount
    }

    /// The directory to serve as an export root.
    pub fn root(&self) -> PathBuf {
        self.mount.join("exports")
    }
}

impl Drop for LoopXfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount).status();
    }
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
    let output = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| anyhow::anyhow!("{program} could not be started: {e}"))?;
    anyhow::ensure!(
        output.status.success(),
        "{program} {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
