//! What a test needs of the machine (root, tools, kernel features). A test that lacks
//! any of it says so by name through `nfsprov_test_skip::skip` and returns, rather than
//! passing without doing its real part.

use nfsprov_agent_testkit::{LoopBtrfs, LoopXfs};

/// The tools of the tests that run ganesha with its D-Bus export manager and reach it
/// from several loopback addresses through the bind shim.
const GANESHA_EXPORTS: &[&str] = &[
    "ganesha.nfsd",
    "dbus-daemon",
    "dbus-send",
    "nfs-ls",
    "nfs-cp",
    "cc",
];

/// The tools of the tests that write through ganesha into a btrfs volume.
const BTRFS_OVER_NFS: &[&str] = &[
    "ganesha.nfsd",
    "dbus-daemon",
    "dbus-send",
    "mkfs.btrfs",
    "btrfs",
];

/// Why a test that needs root (for `why_root`) and `tools` on the PATH cannot run here,
/// if it cannot.
pub fn missing_parts(why_root: &str, tools: &[&str]) -> Option<String> {
    if !rustix::process::geteuid().is_root() {
        return Some(format!("needs root ({why_root})"));
    }
    tools.iter().find_map(|tool| {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).exists()));
        (!found).then(|| format!("{tool} is not installed"))
    })
}

/// Whether `test` can run ganesha's per-volume exports and bound NFS clients here;
/// skipped by name when not.
pub fn ganesha_exports(test: &str) -> bool {
    match missing_parts("ganesha serves as root", GANESHA_EXPORTS) {
        Some(reason) => {
            nfsprov_test_skip::skip(test, &reason);
            false
        }
        None => true,
    }
}

/// A loop-mounted btrfs with quotas (`size_mib` MiB) for `test` to export through
/// ganesha and write into with libnfs; `None`, the test skipped by name, when this
/// machine cannot give one.
pub fn btrfs_over_nfs(test: &str, size_mib: u64) -> Option<LoopBtrfs> {
    let missing = missing_parts(
        "ganesha serves as root, the test mounts btrfs",
        BTRFS_OVER_NFS,
    )
    .or_else(|| crate::libnfs::available().err());
    if let Some(reason) = missing {
        nfsprov_test_skip::skip(test, &reason);
        return None;
    }
    match LoopBtrfs::new(size_mib, true) {
        Ok(fs) => Some(fs),
        Err(error) => {
            let reason =
                format!("the kernel gives no loop-mounted btrfs with quotas here: {error}");
            nfsprov_test_skip::skip(test, &reason);
            None
        }
    }
}

/// A loop-mounted XFS with reflinks (1 GiB) for `test` to keep image volumes on, and
/// ganesha to export them with: `None`, the test skipped by name, when this machine
/// cannot run ganesha's exports or give such a filesystem.
pub fn images_over_nfs(test: &str) -> Option<LoopXfs> {
    if !ganesha_exports(test) {
        return None;
    }
    match LoopXfs::new(1024, true) {
        Ok(fs) => Some(fs),
        Err(e) => {
            nfsprov_test_skip::skip(test, &format!("no XFS loop filesystem: {e}"));
            None
        }
    }
}
