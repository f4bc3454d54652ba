//! Quota through NFS, as a client sees it: a write past a volume's capacity fails with
//! the server's quota error, after about the capacity has landed.

use std::path::Path;

use crate::libnfs::{NfsClient, NfsError};

/// Writes `payload` (more than `capacity_bytes`) to `file` through `nfs` and checks that
/// the quota stopped it near the capacity, reading what landed in `dir` (the volume's
/// directory on the server); prints the figures. The partial file is removed again.
pub fn assert_write_stops_at_capacity(
    nfs: &NfsClient,
    dir: &Path,
    file: &str,
    payload: &[u8],
    capacity_bytes: u64,
) -> anyhow::Result<()> {
    let error = match nfs.write_file(file, payload, 0o644) {
        Ok(()) => anyhow::bail!(
            "a write of {} bytes into a volume of {capacity_bytes} bytes went through",
            payload.len()
        ),
        Err(error) => error,
    };
    let written = std::fs::metadata(dir.join(file))?.len();
    println!(
        "capacity {capacity_bytes} bytes: the {}-byte write through NFS stopped at {written} bytes ({error})",
        payload.len()
    );
    anyhow::ensure!(
        NfsError::is_quota_exceeded(&error),
        "not refused by the quota: {error}"
    );
    // The qgroup counts metadata too and lets the transaction in flight finish.
    anyhow::ensure!(
        (capacity_bytes / 2..=capacity_bytes + capacity_bytes / 5).contains(&written),
        "{written} bytes landed under a quota of {capacity_bytes}"
    );
    nfs.unlink(file)
}
