//! What the scan, the codec and the builder share: file hashing with holes read as
//! zeros, confined opening of a manifest path, and times as nanoseconds.

use std::ffi::CString;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nfsprov_api_types::manifest::{WireBytes, path_components};
use ring::digest::{Context, SHA256};
use rustix::fs::{Mode, OFlags, StatxTimestamp, Timespec};
use rustix::io::Errno;

use crate::store::copy::data::next_data;
use crate::store::copy::walk::open_source;
use crate::store::error::{Result, StoreError, io_error};

/// Bytes read (or zeros fed for a hole) per step of a hash or a copy.
pub(super) const BLOCK: usize = 1 << 20;

/// A path of the manifest as shown in messages.
pub(super) fn shown(path: &[u8]) -> String {
    if path.is_empty() {
        "the root".to_owned()
    } else {
        WireBytes(path.to_vec()).shown()
    }
}

pub(super) fn name_of(component: &[u8]) -> Result<CString> {
    CString::new(component)
        .map_err(|_| StoreError::Invalid(format!("{} contains NUL", shown(component))))
}

/// Joins a directory's path and one of its names, as the manifest writes it.
pub(super) fn child_path(parent: &[u8], name: &[u8]) -> Vec<u8> {
    let mut path = Vec::with_capacity(parent.len() + 1 + name.len());
    if !parent.is_empty() {
        path.extend_from_slice(parent);
        path.push(b'/');
    }
    path.extend_from_slice(name);
    path
}

/// A path's parent directory and last name; the root has none.
pub(super) fn split_path(path: &[u8]) -> (&[u8], &[u8]) {
    match path.iter().rposition(|b| *b == b'/') {
        Some(slash) => (&path[..slash], &path[slash + 1..]),
        None => (&path[..0], path),
    }
}

/// Opens the directory holding `path` (a valid non-root manifest path) below `root`,
/// one component at a time with `O_NOFOLLOW`, so that no symlink in the tree leads
/// outside it; answers it with the last name.
pub(super) fn open_parent(root: BorrowedFd<'_>, path: &[u8]) -> Result<(OwnedFd, CString)> {
    let components = path_components(path).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let Some((last, parents)) = components.split_last() else {
        return Err(StoreError::Invalid("the root has no parent".into()));
    };
    let mut dir = open_dir_at(root, c".", path)?;
    for component in parents {
        dir = open_dir_at(dir.as_fd(), &name_of(component)?, path)?;
    }
    Ok((dir, name_of(last)?))
}

/// Opens a directory of a tree, refusing a symlink or anything else in its place.
pub(super) fn open_dir_at(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
    path: &[u8],
) -> Result<OwnedFd> {
    open_source(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
    )
    .map_err(|e| match e {
        Errno::LOOP | Errno::NOTDIR => StoreError::Unsafe(format!(
            "a directory on the way to {} is a symlink or not a directory",
            shown(path)
        )),
        e => io_error(format!("open a directory on the way to {}", shown(path)), e),
    })
}

/// Opens a regular file of a tree for reading, never through a symlink.
pub(super) fn open_file_at(
    dir: BorrowedFd<'_>,
    name: &std::ffi::CStr,
) -> rustix::io::Result<OwnedFd> {
    open_source(
        dir,
        name,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
    )
}

/// Lowercase hex SHA-256 of the file's first `size` bytes, holes read as zeros (only the
/// data extents are read). A file shorter than `size` is an error.
pub(super) fn hash_file(fd: BorrowedFd<'_>, size: u64, path: &[u8]) -> Result<String> {
    let mut context = Context::new(&SHA256);
    let zeros = vec![0u8; BLOCK];
    let mut buffer = vec![0u8; BLOCK];
    let mut offset = 0;
    let read_error = |e| io_error(format!("read {}", shown(path)), e);
    let feed_zeros = |context: &mut Context, mut len: u64| {
        while len > 0 {
            let step = len.min(BLOCK as u64) as usize;
            context.update(&zeros[..step]);
            len -= step as u64;
        }
    };
    while let Some((start, stop)) = next_data(fd, offset, size).map_err(read_error)? {
        feed_zeros(&mut context, start - offset);
        let mut position = start;
        while position < stop {
            let want = (stop - position).min(BLOCK as u64) as usize;
            let read = match rustix::io::pread(fd, &mut buffer[..want], position) {
                Ok(0) => {
                    return Err(StoreError::Conflict(format!(
                        "{} is shorter than its size while it is read",
                        shown(path)
                    )));
                }
                Ok(read) => read,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(read_error(e)),
            };
            context.update(&buffer[..read]);
            position += read as u64;
        }
        offset = stop;
    }
    feed_zeros(&mut context, size - offset);
    Ok(nfsprov_api_types::manifest::to_hex(
        context.finish().as_ref(),
    ))
}

pub(super) fn to_ns(time: &StatxTimestamp, path: &[u8]) -> Result<i64> {
    time.tv_sec
        .checked_mul(1_000_000_000)
        .and_then(|ns| ns.checked_add(i64::from(time.tv_nsec)))
        .ok_or_else(|| {
            StoreError::Unsupported(format!(
                "{} has a time beyond the nanoseconds a manifest holds (years 1678 to 2262)",
                shown(path)
            ))
        })
}

pub(super) fn from_ns(ns: i64) -> Timespec {
    Timespec {
        tv_sec: ns.div_euclid(1_000_000_000),
        tv_nsec: ns.rem_euclid(1_000_000_000) as _,
    }
}

/// Files made by the builder start private to the agent; their mode comes last.
pub(super) const PRIVATE: Mode = Mode::from_raw_mode(0o600);
