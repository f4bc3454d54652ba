//! Files the agent owns in the NFS server's configuration, replaced atomically and
//! durably: the new contents are complete on disk before the rename makes them current,
//! and the directory is synced so the rename survives a power cut.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// Replaces `path` with `contents`.
pub(super) fn replace(path: &Path, contents: &[u8]) -> std::io::Result<()> {
    let staged = stage(path, contents)?;
    commit(&staged, path)
}

/// Where the next contents of `path` are written before they become current: a hidden
/// name beside it, so a leftover tells of an interrupted change.
pub(super) fn staged_name(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("a file name is needed"))?;
    let mut staged = std::ffi::OsString::from(".");
    staged.push(name);
    staged.push(".new");
    Ok(parent(path)?.join(staged))
}

/// Writes the next contents of `path` beside it, synced, without making them current.
pub(super) fn stage(path: &Path, contents: &[u8]) -> std::io::Result<PathBuf> {
    let staged = staged_name(path)?;
    let mut file = File::create(&staged)?;
    file.write_all(contents)?;
    file.sync_all()?;
    Ok(staged)
}

/// Makes the staged contents current.
pub(super) fn commit(staged: &Path, path: &Path) -> std::io::Result<()> {
    std::fs::rename(staged, path)?;
    sync_dir(parent(path)?)
}

/// Removes `path` if it is there, durably.
pub(super) fn remove(path: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => sync_dir(parent(path)?),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e),
    }
}

fn parent(path: &Path) -> std::io::Result<&Path> {
    path.parent()
        .ok_or_else(|| std::io::Error::other(format!("{} has no directory", path.display())))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
