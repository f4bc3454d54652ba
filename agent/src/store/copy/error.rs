//! The errors a copy reports about the entries it meets.

use rustix::io::Errno;

use crate::store::error::{StoreError, io_error};

/// What a stopping worker answers; never reported, since an error came first.
pub(super) fn stopped() -> StoreError {
    StoreError::Conflict("the copy stopped".into())
}

/// An error of a step that writes the target; a full filesystem or quota is the clone
/// not fitting, said so.
pub(crate) fn write_error(what: &str, rel: &str, errno: Errno) -> StoreError {
    match errno {
        Errno::NOSPC | Errno::DQUOT => StoreError::NoSpace(format!(
            "{what} {rel}: no space left; the clone's capacity or the filesystem is too small for the source volume"
        )),
        e => io_error(format!("{what} {rel}"), e),
    }
}

pub(super) fn mount_point(rel: &str) -> StoreError {
    StoreError::Conflict(format!(
        "{rel} is a mount point inside the source volume; a clone never spans filesystems; unmount it and retry"
    ))
}

pub(super) fn changed(rel: &str) -> StoreError {
    StoreError::Conflict(format!(
        "{rel} was replaced while the volume was being copied; retry the clone"
    ))
}

/// A file that changed during every one of `copies` copies of it: a copy is a state the
/// file really had, or none.
pub(super) fn kept_changing(rel: &str, copies: u32) -> StoreError {
    StoreError::Conflict(format!(
        "{rel} changed while it was being copied, {copies} times in a row; a copy is never a mixture of its states, so none was kept: retry when it is written less often"
    ))
}

pub(super) fn special_bits(rel: &str) -> StoreError {
    StoreError::Unsupported(format!(
        "{rel} has the set-user-ID or set-group-ID bit, which the agent is not allowed to set (it needs CAP_FSETID, and no RestrictSUIDSGID= in its unit); a clone is exact or fails"
    ))
}
