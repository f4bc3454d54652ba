//! The testkit's real ZFS pool ([`nfsprov_agent_testkit::ZfsPool`]) as the agent's tests
//! use it: skipped by name when asked to, and a failure (never a pass) when this machine
//! cannot run it.

use std::path::Path;

use super::run;

/// Set to `1` to skip tests that need a ZFS pool (they print a line saying so).
pub const SKIP_VARIABLE: &str = "NFSPROV_SKIP_ZFS";
/// Sparse, so only what the test writes takes disk space; ZFS wants at least 64 MiB.
const POOL_FILE_BYTES: u64 = 256 << 20;

#[derive(Debug)]
pub struct ZfsPool(nfsprov_agent_testkit::ZfsPool);

impl ZfsPool {
    /// A new pool, or `None` after printing a skip line when `NFSPROV_SKIP_ZFS=1`. Panics
    /// with the reason when this machine cannot run ZFS tests, so they never pass
    /// without having run.
    pub fn create(test: &str) -> Option<Self> {
        if std::env::var(SKIP_VARIABLE).as_deref() == Ok("1") {
            nfsprov_test_skip::skip(test, &format!("{SKIP_VARIABLE}=1"));
            return None;
        }
        if !rustix::process::geteuid().is_root() {
            panic!(
                "{test} needs root to run ZFS (zfs-fuse or OpenZFS); run the tests as root or set {SKIP_VARIABLE}=1 to skip them"
            );
        }
        match nfsprov_agent_testkit::ZfsPool::create(POOL_FILE_BYTES) {
            Ok(pool) => Some(Self(pool)),
            Err(e) => {
                panic!("{test} cannot use ZFS: {e}; or set {SKIP_VARIABLE}=1 to skip it")
            }
        }
    }

    /// The dataset mounted at the export root.
    pub fn dataset(&self) -> &str {
        self.0.dataset()
    }

    pub fn export_root(&self) -> &Path {
        self.0.export_root()
    }

    /// The agent's quota settings for this pool: the zfs backend on its dataset.
    pub fn quota_settings(&self) -> nfsprov_agent::quota::QuotaSettings {
        self.0.quota_settings()
    }

    /// A scratch directory beside the pool, outside the export root.
    pub fn scratch_dir(&self) -> &Path {
        self.0.scratch_dir()
    }

    /// Runs zfs and returns its output; panics when it fails.
    pub fn zfs(&self, args: &[&str]) -> String {
        run("zfs", args).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Names of the datasets below the export dataset, without it.
    pub fn child_datasets(&self) -> Vec<String> {
        let prefix = format!("{}/", self.dataset());
        self.zfs(&["list", "-H", "-o", "name", "-r", self.dataset()])
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .map(str::to_owned)
            .collect()
    }
}
