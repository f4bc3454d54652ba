//! The XFS project quota backend against a real XFS filesystem, made in a sparse file and
//! loop-mounted in a temporary directory. Needs root and xfsprogs; set NFSPROV_SKIP_XFS=1
//! to skip these tests where neither can be had.
//!
//! A kernel built without XFS quota support refuses to mount with prjquota, so there the
//! limits cannot be enforced. These tests then show that the backend refuses such a
//! filesystem, and that the project tagging it does with the real `xfs_quota` lands on the
//! directory it holds open, is inherited by what is created inside, and is undone when a
//! later step fails. Where the kernel accepts prjquota, enforcement is tested as well.

mod common;

use std::fs::File;
use std::io::Write;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::run;
use nfsprov_agent::quota::command::{SystemRunner, ToolCommand, ToolError, ToolRunner};
use nfsprov_agent::store::{Xfs, XfsError};

/// xfsprogs refuses to make a filesystem smaller than 300 MiB; the file stays sparse.
const IMAGE_BYTES: u64 = 300 << 20;
const IDS: std::ops::RangeInclusive<u32> = 1000..=1999;
const FS_XFLAG_PROJINHERIT: u32 = 0x200;

fn should_run(test: &str) -> bool {
    if std::env::var("NFSPROV_SKIP_XFS").is_ok_and(|v| v == "1") {
        nfsprov_test_skip::skip(test, "NFSPROV_SKIP_XFS=1");
        return false;
    }
    assert!(
        rustix::process::geteuid().is_root(),
        "the XFS backend tests make and loop-mount an XFS filesystem, which needs root; \
         run them as root, or set NFSPROV_SKIP_XFS=1 to skip them"
    );
    true
}

fn system_runner() -> SystemRunner {
    SystemRunner::new(Duration::from_secs(60))
}

/// An XFS filesystem in a file, on a loop device of its own; unmounted and detached on drop.
struct LoopXfs {
    _temp: tempfile::TempDir,
    device: String,
    mount_point: PathBuf,
    mounted: bool,
}

impl LoopXfs {
    fn new() -> Self {
        let temp = tempfile::tempdir().unwrap();
        let image = temp.path().join("xfs.img");
        File::create(&image).unwrap().set_len(IMAGE_BYTES).unwrap();
        let image = image.to_str().unwrap();
        run("mkfs.xfs", &["-q", image]).unwrap();
        let device = run("losetup", &["--find", "--show", image])
            .unwrap()
            .trim()
            .to_owned();
        let mount_point = temp.path().join("mnt");
        std::fs::create_dir(&mount_point).unwrap();
        Self {
            _temp: temp,
            device,
            mount_point,
            mounted: false,
        }
    }

    /// Mounts with the given options (none when empty); on refusal, what mount and the
    /// kernel said.
    fn mount(&mut self, options: &str) -> Result<(), String> {
        let mount_point = self.mount_point.to_str().unwrap();
        let mut args = vec![self.device.as_str(), mount_point];
        if !options.is_empty() {
            args.extend(["-o", options]);
        }
        match run("mount", &args) {
            Ok(_) => {
                self.mounted = true;
                Ok(())
            }
            Err(refusal) => Err(format!("{refusal}; kernel: {}", self.kernel_says())),
        }
    }

    /// The kernel's last message about this filesystem.
    fn kernel_says(&self) -> String {
        let name = self.device.trim_start_matches("/dev/");
        run::<&str>("dmesg", &[])
            .ok()
            .and_then(|log| {
                log.lines()
                    .rfind(|line| line.contains(&format!("XFS ({name})")))
                    .map(|line| line.trim().to_owned())
            })
            .unwrap_or_else(|| "nothing in dmesg".to_owned())
    }

    /// A directory on the filesystem to serve as the export root.
    fn export_root(&self) -> PathBuf {
        let root = self.mount_point.join("export");
        std::fs::create_dir_all(&root).unwrap();
        root
    }
}

impl Drop for LoopXfs {
    fn drop(&mut self) {
        if self.mounted
            && let Err(e) = run("umount", &[self.mount_point.to_str().unwrap()])
        {
            eprintln!("{e}; detaching lazily");
            let _ = run("umount", &["-l", self.mount_point.to_str().unwrap()]);
        }
        if let Err(e) = run("losetup", &["-d", &self.device]) {
            eprintln!("{e}");
        }
    }
}

/// The project id and whether the PROJINHERIT flag is set, as `xfs_io -c stat` shows them
/// (the FS_IOC_FSGETXATTR view).
fn project_of(path: &Path) -> (u32, bool) {
    let stat = run("xfs_io", &["-r", "-c", "stat", path.to_str().unwrap()]).unwrap();
    let field = |name: &str| {
        stat.lines()
            .find_map(|line| line.trim().strip_prefix(name))
            .and_then(|rest| rest.trim().strip_prefix('='))
            .map(|value| value.split_whitespace().next().unwrap_or("").to_owned())
            .unwrap_or_else(|| panic!("no {name} in xfs_io output:\n{stat}"))
    };
    let projid = field("fsxattr.projid").parse().unwrap();
    let xflags = field("fsxattr.xflags");
    let xflags = u32::from_str_radix(xflags.trim_start_matches("0x"), 16).unwrap();
    (projid, xflags & FS_XFLAG_PROJINHERIT != 0)
}

/// The real tools, except that `state` answers as a filesystem with project quotas on
/// would: this kernel cannot have them, and the backend refuses to work without. Just
/// before each `limit`, files are made in the volume directory and their project recorded.
#[derive(Debug)]
struct QuotaStateFaked {
    real: SystemRunner,
    volume: PathBuf,
    commands: Mutex<Vec<String>>,
    seen_before_limit: Mutex<Vec<Vec<(String, u32, bool)>>>,
}

impl ToolRunner for QuotaStateFaked {
    fn run(&self, command: &ToolCommand) -> Result<String, ToolError> {
        let subcommand = command
            .args
            .iter()
            .skip_while(|arg| *arg != "-c")
            .nth(1)
            .cloned()
            .unwrap_or_default();
        self.commands.lock().unwrap().push(subcommand.clone());
        if subcommand.starts_with("state") {
            let mount = command.args.last().unwrap();
            return Ok(format!(
                "Project quota state on {mount} (/dev/loop)\n  Accounting: ON\n  Enforcement: ON\n"
            ));
        }
        if subcommand.starts_with("limit -p bhard=") {
            let subdir = self.volume.join("made-inside");
            let file = subdir.join("file");
            std::fs::create_dir_all(&subdir).unwrap();
            std::fs::write(&file, b"data").unwrap();
            let seen = [
                ("volume", &self.volume),
                ("subdirectory", &subdir),
                ("file", &file),
            ]
            .into_iter()
            .map(|(what, path)| {
                let (id, inherit) = project_of(path);
                (what.to_owned(), id, inherit)
            })
            .collect();
            self.seen_before_limit.lock().unwrap().push(seen);
        }
        self.real.run(command)
    }
}

#[test]
fn probe_refuses_xfs_without_project_quota_in_one_line() {
    if !should_run("probe_refuses_xfs_without_project_quota_in_one_line") {
        return;
    }
    let mut xfs = LoopXfs::new();
    xfs.mount("").unwrap();
    let root = xfs.export_root();

    let err = Xfs::probe(Arc::new(system_runner()), &root, IDS).unwrap_err();
    eprintln!("probe said: {err}");
    assert!(!err.contains('\n'), "{err}");
    let expected = format!(
        "project quotas are not enabled on {} ({}, XFS): mount it with -o prjquota",
        xfs.mount_point.display(),
        xfs.device
    );
    assert!(err.starts_with(&expected), "{err}");
}

#[test]
fn real_tagging_is_inherited_and_undone_when_the_limit_fails() {
    if !should_run("real_tagging_is_inherited_and_undone_when_the_limit_fails") {
        return;
    }
    // Mounted without prjquota, setting a limit fails on every kernel.
    let mut xfs = LoopXfs::new();
    xfs.mount("").unwrap();
    let root = xfs.export_root();
    let volume = root.join("volume");
    std::fs::create_dir(&volume).unwrap();
    let runner = Arc::new(QuotaStateFaked {
        real: system_runner(),
        volume: volume.clone(),
        commands: Mutex::new(Vec::new()),
        seen_before_limit: Mutex::new(Vec::new()),
    });
    let backend = Xfs::probe(runner.clone(), &root, IDS).unwrap();
    let dir = File::open(&volume).unwrap();

    for attempt in 1..=2 {
        let err = backend.limit_new(dir.as_fd(), 1 << 20).unwrap_err();
        eprintln!("attempt {attempt}: {err}");
        assert!(
            matches!(&err, XfsError::Tool(e @ ToolError::Failed { .. }) if e.stderr().contains("cannot set limits")),
            "{err}"
        );
        // Just before the limit, the directory had the first id of the range with the
        // inheritance flag, and what was made inside it inherited the id.
        let seen = runner.seen_before_limit.lock().unwrap().pop().unwrap();
        assert_eq!(
            seen,
            [
                ("volume".to_owned(), 1000, true),
                ("subdirectory".to_owned(), 1000, true),
                ("file".to_owned(), 1000, false),
            ],
            "attempt {attempt}: projects just before the limit (the first attempt's id must be reused)"
        );
        // After the failure, the whole tree is out of the project again.
        for path in [&volume, &volume.join("made-inside/file")] {
            assert_eq!(project_of(path), (0, false), "{}", path.display());
        }
    }

    let target = format!("/proc/{}/fd/{}/.", std::process::id(), {
        use std::os::fd::AsRawFd;
        dir.as_raw_fd()
    });
    let commands = runner.commands.lock().unwrap();
    assert_eq!(
        commands[..8],
        [
            "state -p -v".to_owned(),
            "quota -p -v -N -n -b -i 1000".to_owned(),
            format!("project -s -p {target} 1000"),
            format!("project -c -p {target} 1000"),
            "limit -p bhard=1048576 1000".to_owned(),
            "limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1000".to_owned(),
            format!("project -C -p {target} 1000"),
            "quota -p -v -N -n -b -i 1000".to_owned(),
        ]
    );
}

#[test]
fn prjquota_mount_enforces_the_capacity_where_the_kernel_supports_it() {
    if !should_run("prjquota_mount_enforces_the_capacity_where_the_kernel_supports_it") {
        return;
    }
    let mut xfs = LoopXfs::new();
    if let Err(refusal) = xfs.mount("prjquota") {
        nfsprov_test_skip::skip(
            "prjquota_mount_enforces_the_capacity_where_the_kernel_supports_it",
            &format!("this kernel refuses to mount XFS with prjquota: {refusal}"),
        );
        return;
    }
    let root = xfs.export_root();
    let backend = Xfs::probe(Arc::new(system_runner()), &root, IDS).unwrap();
    let volume = root.join("volume");
    std::fs::create_dir(&volume).unwrap();
    let dir = File::open(&volume).unwrap();
    let id = backend.limit_new(dir.as_fd(), 1 << 20).unwrap();
    assert_eq!(project_of(&volume), (id, true));

    let write = |name: &str, bytes: usize| -> std::io::Result<()> {
        let mut file = File::create(volume.join(name))?;
        for _ in 0..bytes / 65536 {
            file.write_all(&[7u8; 65536])?;
        }
        file.sync_all()
    };
    let err = write("too-big", 2 << 20).unwrap_err();
    assert_eq!(
        err.raw_os_error(),
        Some(rustix::io::Errno::DQUOT.raw_os_error()),
        "{err}"
    );
    let used = backend.usage(id).unwrap();
    assert!(
        used.used_bytes > 0 && used.used_bytes <= 1 << 20,
        "{used:?}"
    );

    backend.set_limit(id, 4 << 20).unwrap();
    std::fs::remove_file(volume.join("too-big")).unwrap();
    write("fits-now", 2 << 20).unwrap();

    std::fs::remove_file(volume.join("fits-now")).unwrap();
    drop(dir);
    std::fs::remove_dir(&volume).unwrap();
    backend.release(id).unwrap();
}
