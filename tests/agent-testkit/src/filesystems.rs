//! Filesystems made in a file and mounted by a test (root required), for tests of the
//! quota backends on the real thing: the agent's own tests and the end-to-end suite.

use std::path::{Path, PathBuf};
use std::process::Command;

const MIB: u64 = 1 << 20;

/// A filesystem in a sparse file, loop-mounted in a temp dir, with an `exports` directory
/// to serve; unmounted when dropped.
struct LoopMount {
    mount: PathBuf,
    image: PathBuf,
    // Declared last so the image outlives the mount.
    _dir: tempfile::TempDir,
}

impl LoopMount {
    /// Makes the filesystem with `mkfs` (its options before the image) and mounts it.
    fn new(kind: &str, size_mib: u64, mkfs: &str, options: &[&str]) -> anyhow::Result<Self> {
        anyhow::ensure!(
            rustix::process::geteuid().is_root(),
            "a loop-mounted {kind} needs root; run the tests as root"
        );
        let dir = tempfile::tempdir()?;
        let image = dir.path().join("fs.img");
        std::fs::File::create(&image)?.set_len(size_mib * MIB)?;
        let mut args: Vec<&std::ffi::OsStr> = options.iter().map(|o| o.as_ref()).collect();
        args.push(image.as_os_str());
        run(mkfs, &args)?;
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
        let fs = Self {
            mount,
            image,
            _dir: dir,
        };
        std::fs::create_dir(fs.root())?;
        Ok(fs)
    }

    fn root(&self) -> PathBuf {
        self.mount.join("exports")
    }
}

impl Drop for LoopMount {
    fn drop(&mut self) {
        let unmounted = Command::new("umount")
            .arg(&self.mount)
            .status()
            .is_ok_and(|s| s.success());
        if !unmounted {
            // Still busy (a server shutting down holds a descriptor a moment longer): a
            // lazy unmount detaches it now and lets the kernel finish once the last
            // descriptor closes. Without it the mount outlived the test, and removing the
            // temp dir emptied the mounted filesystem instead.
            let lazily = Command::new("umount")
                .arg("--lazy")
                .arg(&self.mount)
                .status()
                .is_ok_and(|s| s.success());
            if !lazily {
                eprintln!("could not unmount {}", self.mount.display());
            }
        }
    }
}

/// A btrfs filesystem in a sparse file, loop-mounted in a temp dir, with an `exports`
/// directory to serve; unmounted when dropped.
pub struct LoopBtrfs {
    fs: LoopMount,
}

impl LoopBtrfs {
    /// Makes and mounts the filesystem; with `quotas`, enables btrfs quotas on it.
    pub fn new(size_mib: u64, quotas: bool) -> anyhow::Result<Self> {
        let fs = LoopMount::new("btrfs", size_mib, "mkfs.btrfs", &["-q"])?;
        if quotas {
            run(
                "btrfs",
                &["quota".as_ref(), "enable".as_ref(), fs.mount.as_os_str()],
            )?;
        }
        Ok(Self { fs })
    }

    pub fn mount_point(&self) -> &Path {
        &self.fs.mount
    }

    /// The file holding the filesystem.
    pub fn image(&self) -> &Path {
        &self.fs.image
    }

    /// The directory to serve as an export root.
    pub fn root(&self) -> PathBuf {
        self.fs.root()
    }

    /// Commits the filesystem, so qgroup figures are up to date.
    pub fn sync(&self) -> anyhow::Result<()> {
        run(
            "btrfs",
            &[
                "filesystem".as_ref(),
                "sync".as_ref(),
                self.fs.mount.as_os_str(),
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
                self.fs.mount.as_os_str(),
            ],
        )
    }

    /// The referenced and exclusive bytes of the subvolume at `path`, from btrfs itself.
    pub fn qgroup_bytes(&self, path: &Path) -> anyhow::Result<(u64, u64)> {
        let report = run(
            "btrfs",
            &[
                "qgroup".as_ref(),
                "show".as_ref(),
                "--raw".as_ref(),
                "-f".as_ref(),
                path.as_os_str(),
            ],
        )?;
        let row = report
            .lines()
            .find(|line| line.starts_with("0/"))
            .ok_or_else(|| anyhow::anyhow!("no qgroup for {}: {report}", path.display()))?;
        let figure = |n: usize| {
            row.split_whitespace()
                .nth(n)
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow::anyhow!("no figure {n} in {row}"))
        };
        Ok((figure(1)?, figure(2)?))
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

/// An XFS filesystem in a sparse file, loop-mounted in a temp dir, with an `exports`
/// directory to serve; unmounted when dropped. No quotas: for tests of what the agent does
/// on XFS without its project quota backend (clones by `FICLONE`, say).
pub struct LoopXfs {
    fs: LoopMount,
}

impl LoopXfs {
    /// Makes and mounts the filesystem (xfsprogs wants at least 300 MiB); with `reflink`,
    /// with extents files can share (`mkfs.xfs -m reflink=1`), without, none.
    pub fn new(size_mib: u64, reflink: bool) -> anyhow::Result<Self> {
        let reflink = if reflink { "reflink=1" } else { "reflink=0" };
        let fs = LoopMount::new("XFS", size_mib, "mkfs.xfs", &["-q", "-m", reflink])?;
        Ok(Self { fs })
    }

    pub fn mount_point(&self) -> &Path {
        &self.fs.mount
    }

    /// The file holding the filesystem.
    pub fn image(&self) -> &Path {
        &self.fs.image
    }

    /// The directory to serve as an export root.
    pub fn root(&self) -> PathBuf {
        self.fs.root()
    }
}

/// An ext4 filesystem in a sparse file, loop-mounted in a temp dir, with an `exports`
/// directory to serve; unmounted when dropped. Defaults as `mkfs.ext4` makes them
/// (journal, `data=ordered`, delayed allocation): what most NFS servers run.
pub struct LoopExt4 {
    fs: LoopMount,
}

impl LoopExt4 {
    pub fn new(size_mib: u64) -> anyhow::Result<Self> {
        Self::with_options(size_mib, &[])
    }

    /// With more `mkfs.ext4` options (`-I 128`: inodes without birth times, say).
    pub fn with_options(size_mib: u64, options: &[&str]) -> anyhow::Result<Self> {
        let mut all = vec!["-q", "-F"];
        all.extend_from_slice(options);
        let fs = LoopMount::new("ext4", size_mib, "mkfs.ext4", &all)?;
        Ok(Self { fs })
    }

    pub fn mount_point(&self) -> &Path {
        &self.fs.mount
    }

    /// The file holding the filesystem.
    pub fn image(&self) -> &Path {
        &self.fs.image
    }

    /// The directory to serve as an export root.
    pub fn root(&self) -> PathBuf {
        self.fs.root()
    }
}

fn run(program: &str, args: &[&std::ffi::OsStr]) -> anyhow::Result<String> {
    crate::command::run(program, args).map_err(anyhow::Error::msg)
}
