//! The real filesystems the tests of copies (clones, snapshots, restores) run on, each
//! made or the test reported skipped by name: copies keep owners, which needs root, and a
//! loop filesystem needs its mkfs.

use std::path::Path;

use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::{LoopBtrfs, LoopXfs, TestAgent};
use nfsprov_api_types::QuotaBackend;

/// Whether `test` can run as root; reported skipped otherwise (`what` keeps owners).
pub fn root_or_skip(test: &str, what: &str) -> bool {
    if super::is_root() {
        return true;
    }
    nfsprov_test_skip::skip(test, &format!("{what} keep owners, which needs root"));
    false
}

/// A loop XFS with reflinks, or `None` with `test` reported skipped.
pub fn xfs_or_skip(test: &str) -> Option<LoopXfs> {
    LoopXfs::new(1024, true)
        .map_err(|e| nfsprov_test_skip::skip(test, &format!("no XFS loop filesystem: {e}")))
        .ok()
}

/// A loop btrfs with quotas on, or `None` with `test` reported skipped.
pub fn btrfs_or_skip(test: &str) -> Option<LoopBtrfs> {
    LoopBtrfs::new(2048, true)
        .map_err(|e| nfsprov_test_skip::skip(test, &format!("no btrfs loop filesystem: {e}")))
        .ok()
}

/// An agent on `root` whose volumes are btrfs subvolumes with qgroup limits.
pub async fn btrfs_agent(root: &Path) -> TestAgent {
    let settings = QuotaSettings {
        backend: QuotaBackend::Btrfs,
        ..QuotaSettings::default()
    };
    TestAgent::start_with_quota(root, settings).await.unwrap()
}
