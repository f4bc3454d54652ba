//! Files the agent owns in the NFS server's configuration, replaced atomically and
//! durably: the new contents are complete on disk before the rename makes them current,
//! and the directory is synced so the rename survives a power cut.
//!
//! A change of many files at once (a group of export changes) writes and renames them
//! all unsynced, then makes every one durable at once ([`Group::sync`]): the files are
//! synced side by side, which the filesystem's journal takes in one commit, and the
//! directory once. (A `syncfs` would be one call, but it also waits for every other
//! write pending on the filesystem, an export root's among them.)

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

/// Files written, renamed and removed together, made durable by one [`Group::sync`]:
/// until then a power cut may lose any of them, so nothing is acknowledged before it.
#[derive(Debug)]
pub(super) struct Group<'a> {
    dir: &'a Path,
    /// The files written, open, to be synced.
    written: Vec<File>,
    /// Whether the directory's entries changed (a rename or a removal).
    renamed: bool,
}

/// The most files synced side by side.
const SYNCING_THREADS: usize = 16;

impl<'a> Group<'a> {
    /// A group of changes to files of `dir`.
    pub(super) fn new(dir: &'a Path) -> Self {
        Self {
            dir,
            written: Vec::new(),
            renamed: false,
        }
    }

    /// Writes the next contents of `path` beside it, unsynced, without making them current.
    pub(super) fn stage(&mut self, path: &Path, contents: &[u8]) -> std::io::Result<PathBuf> {
        let staged = staged_name(path)?;
        let mut file = File::create(&staged)?;
        file.write_all(contents)?;
        self.written.push(file);
        Ok(staged)
    }

    /// Makes the staged contents current (durable at the next sync).
    pub(super) fn commit(&mut self, staged: &Path, path: &Path) -> std::io::Result<()> {
        std::fs::rename(staged, path)?;
        self.renamed = true;
        Ok(())
    }

    /// Replaces `path` with `contents` (durable at the next sync).
    pub(super) fn replace(&mut self, path: &Path, contents: &[u8]) -> std::io::Result<()> {
        let staged = self.stage(path, contents)?;
        self.commit(&staged, path)
    }

    /// Removes `path` if it is there (durably at the next sync).
    pub(super) fn remove(&mut self, path: &Path) -> std::io::Result<()> {
        match std::fs::remove_file(path) {
            Ok(()) => {
                self.renamed = true;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Makes every change of the group durable: the files written, synced side by side,
    /// then the directory (nothing when the group changed nothing).
    pub(super) fn sync(&mut self) -> std::io::Result<()> {
        let written = std::mem::take(&mut self.written);
        if written.len() == 1 {
            written[0].sync_all()?;
        } else if !written.is_empty() {
            let per_thread = written.len().div_ceil(SYNCING_THREADS);
            std::thread::scope(|scope| {
                let syncing: Vec<_> = written
                    .chunks(per_thread)
                    .map(|files| scope.spawn(move || files.iter().try_for_each(File::sync_all)))
                    .collect();
                syncing.into_iter().try_for_each(|thread| {
                    thread
                        .join()
                        .unwrap_or_else(|_| Err(std::io::Error::other("a sync thread panicked")))
                })
            })?;
        }
        if std::mem::take(&mut self.renamed) {
            sync_dir(self.dir)?;
        }
        Ok(())
    }
}

fn parent(path: &Path) -> std::io::Result<&Path> {
    path.parent()
        .ok_or_else(|| std::io::Error::other(format!("{} has no directory", path.display())))
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}
