//! Points where a debug build waits, on a test's request, so that a test can watch a job
//! in progress or stop the agent in the middle of one, whatever the speed of the copy
//! (or see what an NFS client meets while a volume grows offline).
//! Each switch is an environment variable naming a file: while the test holds an
//! exclusive lock on it, the job waits for a shared one. A release agent never reads the
//! switches and never waits.

/// A finished clone copy waits before its job ends.
pub(crate) const CLONES: &str = "NFSPROV_AGENT_HOLD_CLONES";
/// A finished snapshot tree waits before it is placed.
pub(crate) const SNAPSHOTS: &str = "NFSPROV_AGENT_HOLD_SNAPSHOTS";
/// A restore's finished copy waits before it is placed at its path.
pub(crate) const RESTORES: &str = "NFSPROV_AGENT_HOLD_RESTORES";

/// A replica's receive waits before fetching each file after its first.
pub(crate) const RECEIVES: &str = "NFSPROV_AGENT_HOLD_RECEIVES";

/// An offline growth waits with the volume's filesystem unmounted and its export
/// withdrawn.
pub(crate) const GROWTHS: &str = "NFSPROV_AGENT_HOLD_GROWTHS";

/// Waits while the test holding the file `switch` names keeps it locked.
pub(crate) fn wait_if_asked(switch: &str) {
    #[cfg(debug_assertions)]
    if let Some(held) = std::env::var_os(switch)
        && let Ok(file) = std::fs::File::open(held)
    {
        let _ = file.lock_shared();
    }
    #[cfg(not(debug_assertions))]
    let _ = switch;
}
