//! Quota through NFS, as a client sees it: a write past a volume's capacity fails with
//! the server's quota error (or, where the volume is a filesystem of its own, with the
//! filesystem full), after about the capacity has landed.

use std::path::Path;

use crate::libnfs::{NfsClient, NfsError};

/// What stops a write at a volume's capacity, as the NFS client hears it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// A quota of the shared filesystem (btrfs qgroup, XFS project): `NFS4ERR_DQUOT`.
    Quota,
    /// The volume's own filesystem is full (an image volume): `NFS4ERR_NOSPC`.
    OwnFilesystem,
}

/// Writes `payload` (more than `capacity_bytes`) to `file` through `nfs` and checks that
/// `limit` stopped it near the capacity, reading what landed in `dir` (the volume's
/// directory on the server); prints the figures. The partial file is removed again.
pub fn assert_write_stops_at_capacity(
    limit: Limit,
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
    let refused = match limit {
        Limit::Quota => NfsError::is_quota_exceeded(&error),
        Limit::OwnFilesystem => NfsError::is_out_of_space(&error),
    };
    anyhow::ensure!(refused, "not refused by the {limit:?} limit: {error}");
    // The qgroup counts metadata too and lets the transaction in flight finish; a
    // filesystem of its own is sized to hold at least the capacity.
    anyhow::ensure!(
        (capacity_bytes / 2..=capacity_bytes + capacity_bytes / 5).contains(&written),
        "{written} bytes landed under a quota of {capacity_bytes}"
    );
    nfs.unlink(file)
}
