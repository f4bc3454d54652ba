//! A real ZFS pool: a sparse file in a temporary directory, with one dataset mounted in
//! that directory to serve as an export root. zfs-fuse's daemon is started when no ZFS
//! answers yet (machines without systemd have nobody else to start it). The pool is
//! destroyed when dropped; the daemon is left running.
//!
//! Only one such pool exists at a time on the machine, across threads and processes (the
//! agent's tests, the forged-handle tests and the clone benchmark take turns): zfs-fuse
//! deadlocks now and then (every FUSE request to any of its mounts hangs for good) when
//! several pools are created, used and destroyed at once, while the same work one after
//! the other never did.

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::command::run;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// How long the daemon may take to answer after it is started.
const DAEMON_START_LIMIT: Duration = Duration::from_secs(30);
/// How long destroying the pool may be refused while its mounts are let go of.
const DESTROY_LIMIT: Duration = Duration::from_secs(60);
/// How long to wait for the pools of others to be gone.
const TURN_LIMIT: Duration = Duration::from_secs(600);
/// How long a fresh mount may take to answer its first request.
const MOUNT_ANSWER_LIMIT: Duration = Duration::from_secs(20);

/// Why no pool was made.
#[derive(Debug)]
pub enum PoolError {
    /// This machine cannot run ZFS now (no tools, no daemon, no turn, a wedged daemon).
    Unavailable(String),
    /// ZFS runs, but making the pool failed.
    Failed(String),
}

impl std::fmt::Display for PoolError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolError::Unavailable(reason) | PoolError::Failed(reason) => f.write_str(reason),
        }
    }
}

impl std::error::Error for PoolError {}

#[derive(Debug)]
pub struct ZfsPool {
    name: String,
    dataset: String,
    export_root: PathBuf,
    pool_mount: PathBuf,
    // Dropped after the pool is destroyed: it holds the pool's file. Taken and kept when
    // the pool cannot be destroyed, since removing it would walk into hung mounts.
    dir: Option<tempfile::TempDir>,
    // Closing it lets the next pool be made.
    _turn: OwnedFd,
}

impl ZfsPool {
    /// Waits for the machine's turn at a pool, then makes one in a sparse file of
    /// `bytes` (ZFS wants at least 64 MiB) with the export dataset mounted.
    pub fn create(bytes: u64) -> Result<Self, PoolError> {
        zfs_ready().map_err(PoolError::Unavailable)?;
        let turn = lock_exclusive("nfsprov-zfs-tests.lock", TURN_LIMIT).map_err(|e| {
            PoolError::Unavailable(format!(
                "no turn at a ZFS pool: {e}; is a test stuck on a hung zfs-fuse mount?"
            ))
        })?;
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "nfsprovt{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let failed = |e: std::io::Error| PoolError::Failed(e.to_string());
        let dir = tempfile::Builder::new()
            .prefix("nfsprov-zfs-")
            .tempdir()
            .map_err(failed)?;
        let file = dir.path().join("pool.img");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(bytes))
            .map_err(failed)?;
        let pool_mount = dir.path().join("pool");
        run(
            "zpool",
            &[
                "create",
                "-m",
                path_str(&pool_mount),
                &name,
                path_str(&file),
            ],
        )
        .map_err(PoolError::Failed)?;
        let mut pool = Self {
            dataset: format!("{name}/export"),
            export_root: dir.path().join("export"),
            pool_mount,
            name,
            dir: Some(dir),
            _turn: turn,
        };
        run(
            "zfs",
            &[
                "create",
                "-o",
                &format!("mountpoint={}", path_str(&pool.export_root)),
                &pool.dataset,
            ],
        )
        .map_err(PoolError::Failed)?;
        pool.check_mount_answers()?;
        Ok(pool)
    }

    /// A wedged zfs-fuse still answers `zpool` and `zfs` but never a request to its
    /// mounts; the work would hang on its first file operation instead of failing.
    fn check_mount_answers(&mut self) -> Result<(), PoolError> {
        let (sender, receiver) = std::sync::mpsc::channel();
        let export_root = self.export_root.clone();
        // Left behind if it hangs; the process exits without waiting for it.
        std::thread::spawn(move || {
            let _ = sender.send(std::fs::read_dir(&export_root).map(|entries| entries.count()));
        });
        match receiver.recv_timeout(MOUNT_ANSWER_LIMIT) {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(PoolError::Failed(format!(
                "cannot read the new mount {}: {e}",
                self.export_root.display()
            ))),
            Err(_) => {
                // Its files cannot be removed: keep them rather than hang.
                let _ = self.dir.take().map(tempfile::TempDir::keep);
                Err(PoolError::Unavailable(format!(
                    "the new mount {} did not answer within {} s: the zfs-fuse daemon is wedged; restart it",
                    self.export_root.display(),
                    MOUNT_ANSWER_LIMIT.as_secs()
                )))
            }
        }
    }

    /// The dataset mounted at the export root.
    pub fn dataset(&self) -> &str {
        &self.dataset
    }

    pub fn export_root(&self) -> &Path {
        &self.export_root
    }

    /// The agent's quota settings for this pool: the zfs backend on its dataset.
    pub fn quota_settings(&self) -> nfsprov_agent::quota::QuotaSettings {
        nfsprov_agent::quota::QuotaSettings {
            backend: nfsprov_api_types::QuotaBackend::Zfs,
            zfs_dataset: Some(self.dataset.clone()),
            ..Default::default()
        }
    }

    /// Where the pool's own dataset is mounted: beside the export root, in the pool.
    pub fn pool_mount(&self) -> &Path {
        &self.pool_mount
    }

    /// A scratch directory beside the pool, outside the export root.
    pub fn scratch_dir(&self) -> &Path {
        self.dir.as_ref().expect("kept until drop").path()
    }
}

impl Drop for ZfsPool {
    fn drop(&mut self) {
        // Mounts let go a moment after the last file closes; retry until they have.
        let deadline = Instant::now() + DESTROY_LIMIT;
        loop {
            match run("zpool", &["destroy", "-f", &self.name]) {
                Ok(_) => return,
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err(e) => {
                    let kept = self.dir.take().map(tempfile::TempDir::keep);
                    eprintln!(
                        "could not destroy pool {}: {e}; remove it with `zpool destroy -f {}`, then its directory {:?}",
                        self.name, self.name, kept
                    );
                    return;
                }
            }
        }
    }
}

/// Takes an exclusive `flock` on a file in the temporary directory, waiting at most
/// `limit` for whoever holds it; released when the returned descriptor is closed.
fn lock_exclusive(name: &str, limit: Duration) -> Result<OwnedFd, String> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let path = std::env::temp_dir().join(name);
    let lock = rustix::fs::open(
        &path,
        OFlags::RDWR | OFlags::CREATE | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let deadline = Instant::now() + limit;
    loop {
        match rustix::fs::flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => return Ok(lock),
            Err(rustix::io::Errno::WOULDBLOCK) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                return Err(format!(
                    "{} stayed locked by another process for {} s ({e})",
                    path.display(),
                    limit.as_secs()
                ));
            }
        }
    }
}

/// Whether zfs answers, starting zfs-fuse's daemon once per process if needed.
fn zfs_ready() -> Result<(), String> {
    static READY: OnceLock<Result<(), String>> = OnceLock::new();
    READY
        .get_or_init(|| {
            for tool in ["zfs", "zpool"] {
                if !on_path(tool) {
                    return Err(format!(
                        "`{tool}` is not on PATH; install zfs-fuse (or OpenZFS) and make sure the sbin directories are on PATH"
                    ));
                }
            }
            if run("zpool", &["list"]).is_ok() {
                return Ok(());
            }
            if !on_path("zfs-fuse") {
                return Err(
                    "zfs does not answer (`zpool list` fails) and zfs-fuse is not installed to start".into(),
                );
            }
            // One start at a time across processes: the daemon takes over the socket of
            // whichever ran before it, so a second one would strand the first.
            let _starting = lock_exclusive("nfsprov-zfs-fuse-start.lock", DAEMON_START_LIMIT)?;
            if run("zpool", &["list"]).is_ok() {
                return Ok(());
            }
            // zfs-fuse refuses to daemonize, silently and with exit status 1, while its
            // pidfile exists, even when the daemon it names is long gone (a machine's
            // processes end, its temporary directory stays). No daemon answers, so any
            // pidfile here is stale.
            let pidfile = std::env::temp_dir().join("nfsprov-test-zfs-fuse.pid");
            match std::fs::remove_file(&pidfile) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(format!(
                        "cannot remove the stale zfs-fuse pidfile {}: {e}",
                        pidfile.display()
                    ));
                }
            }
            let started = Command::new("zfs-fuse")
                .args(["--no-kstat-mount", "-p"])
                .arg(&pidfile)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            match &started {
                Ok(status) if status.success() => {}
                Ok(status) => {
                    return Err(format!(
                        "zfs does not answer and `zfs-fuse` failed to start ({status}); run `zfs-fuse --no-daemon` to see why"
                    ));
                }
                Err(e) => return Err(format!("cannot run zfs-fuse: {e}")),
            }
            let deadline = Instant::now() + DAEMON_START_LIMIT;
            loop {
                match run("zpool", &["list"]) {
                    Ok(_) => return Ok(()),
                    Err(e) if Instant::now() >= deadline => {
                        return Err(format!(
                            "zfs-fuse was started but `zpool list` still fails after {} s: {e}",
                            DAEMON_START_LIMIT.as_secs()
                        ));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(100)),
                }
            }
        })
        .clone()
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false)
}

fn path_str(path: &Path) -> &str {
    path.to_str().expect("temporary paths are UTF-8")
}
