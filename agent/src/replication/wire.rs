//! The transfer endpoints' bodies, both ends: the manifest as lines of
//! [`TransferManifestLine`], and a file of the granted snapshot found by its manifest
//! path beneath the snapshot's tree, never by a path the kernel resolves.

use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nfsprov_api_types::manifest::{ManifestEntry, from_hex, path_components};
use nfsprov_api_types::{MAX_MANIFEST_LINE, Snapshot, TransferManifestLine};
use rustix::fs::{FileType, Mode, OFlags};

use super::scan::scan;
use crate::store::error::{Result, StoreError, io_error};

fn encode_error(e: serde_json::Error) -> StoreError {
    StoreError::Io {
        context: "encode a manifest line".into(),
        source: std::io::Error::other(e),
    }
}

fn write_line(out: &mut impl Write, line: &TransferManifestLine) -> Result<()> {
    serde_json::to_writer(&mut *out, line).map_err(encode_error)?;
    out.write_all(b"\n").map_err(|source| StoreError::Io {
        context: "send the manifest".into(),
        source,
    })
}

/// Writes the manifest of `tree`, the tree of `snapshot`: the snapshot, every entry,
/// and the count that ends it.
pub(crate) fn write_manifest(
    snapshot: &Snapshot,
    tree: OwnedFd,
    out: &mut impl Write,
) -> Result<()> {
    write_line(out, &TransferManifestLine::Snapshot(snapshot.clone()))?;
    let mut entries = 0u64;
    scan(tree.as_fd(), &mut |entry| {
        entries += 1;
        write_line(out, &TransferManifestLine::Entry(entry))
    })?;
    write_line(out, &TransferManifestLine::End { entries })?;
    out.flush().map_err(|source| StoreError::Io {
        context: "send the manifest".into(),
        source,
    })
}

/// The manifest path a content request names, hex-decoded and checked as every
/// manifest path is.
pub(crate) fn decode_path(hex: &str) -> std::result::Result<Vec<u8>, String> {
    let path = from_hex(hex).ok_or_else(|| "path is not lowercase hex".to_owned())?;
    if path.is_empty() {
        return Err("the root is a directory, not a file".into());
    }
    path_components(&path).map_err(|e| e.to_string())?;
    Ok(path)
}

/// The regular file at `path` beneath `tree`, each directory on the way opened from its
/// parent without following a link, the file itself likewise.
pub(crate) fn open_file(tree: &OwnedFd, path: &[u8]) -> Result<File> {
    let shown = String::from_utf8_lossy(path).into_owned();
    let components = path_components(path).map_err(|e| StoreError::Invalid(e.to_string()))?;
    let (name, parents) = components
        .split_last()
        .ok_or_else(|| StoreError::Invalid("the root is not a file".into()))?;
    let mut dir: Option<OwnedFd> = None;
    for component in parents {
        let parent = dir.as_ref().map_or(tree.as_fd(), |d| d.as_fd());
        let next = rustix::fs::openat(
            parent,
            OsStr::from_bytes(component),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| not_there(&shown, e))?;
        dir = Some(next);
    }
    let parent = dir.as_ref().map_or(tree.as_fd(), |d| d.as_fd());
    // Non-blocking: a fifo of the snapshot is never waited on, it is refused below.
    let file = rustix::fs::openat(
        parent,
        OsStr::from_bytes(name),
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| not_there(&shown, e))?;
    let stat = rustix::fs::fstat(&file).map_err(|e| io_error(format!("stat {shown}"), e))?;
    if FileType::from_raw_mode(stat.st_mode) != FileType::RegularFile {
        return Err(StoreError::Invalid(format!(
            "{shown} is not a regular file of the snapshot"
        )));
    }
    Ok(File::from(file))
}

fn not_there(shown: &str, e: rustix::io::Errno) -> StoreError {
    match e {
        rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP => {
            StoreError::NotFound(format!("the snapshot has no file {shown}"))
        }
        e => io_error(format!("open {shown}"), e),
    }
}

/// Reads a manifest line by line as it arrives: its snapshot first, then entries until
/// its `end`, whose count must match.
pub(crate) struct ManifestReader<R> {
    input: R,
    line: Vec<u8>,
    entries: u64,
    ended: bool,
}

impl<R: BufRead> ManifestReader<R> {
    /// The reader and the snapshot the manifest's first line names.
    pub(crate) fn open(input: R) -> Result<(Self, Snapshot)> {
        let mut reader = Self {
            input,
            line: Vec::new(),
            entries: 0,
            ended: false,
        };
        match reader.next_line()? {
            Some(TransferManifestLine::Snapshot(snapshot)) => Ok((reader, snapshot)),
            _ => Err(bad("the manifest does not begin with its snapshot")),
        }
    }

    fn next_line(&mut self) -> Result<Option<TransferManifestLine>> {
        self.line.clear();
        let limit = MAX_MANIFEST_LINE as u64 + 1;
        let read = std::io::Read::take(&mut self.input, limit)
            .read_until(b'\n', &mut self.line)
            .map_err(|source| StoreError::Io {
                context: "receive the manifest".into(),
                source,
            })?;
        if read == 0 {
            return Ok(None);
        }
        if self.line.last() != Some(&b'\n') {
            return Err(bad(if self.line.len() > MAX_MANIFEST_LINE {
                "a manifest line is longer than any the agent sends"
            } else {
                "the manifest was cut short"
            }));
        }
        serde_json::from_slice(&self.line)
            .map(Some)
            .map_err(|e| bad(&format!("a manifest line cannot be read: {e}")))
    }
}

fn bad(message: &str) -> StoreError {
    StoreError::Invalid(format!("the source agent's manifest: {message}"))
}

impl<R: BufRead> Iterator for ManifestReader<R> {
    type Item = Result<ManifestEntry>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.ended {
            return None;
        }
        let line = match self.next_line() {
            Ok(line) => line,
            Err(e) => {
                self.ended = true;
                return Some(Err(e));
            }
        };
        match line {
            Some(TransferManifestLine::Entry(entry)) => {
                self.entries += 1;
                Some(Ok(entry))
            }
            Some(TransferManifestLine::End { entries }) if entries == self.entries => {
                self.ended = true;
                None
            }
            Some(TransferManifestLine::End { entries }) => {
                self.ended = true;
                Some(Err(bad(&format!(
                    "it says {entries} entries and sent {}",
                    self.entries
                ))))
            }
            Some(TransferManifestLine::Snapshot(_)) => {
                self.ended = true;
                Some(Err(bad("a second snapshot line")))
            }
            None => {
                self.ended = true;
                Some(Err(bad("the manifest was cut short")))
            }
        }
    }
}
