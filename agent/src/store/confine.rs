//! Confinement: the export root held open as a descriptor, and the primitives that reach
//! beneath it one component at a time with `O_NOFOLLOW | O_DIRECTORY`, so a symlink
//! anywhere on the way is refused instead of followed and nothing outside the root is
//! ever reached.

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags};
use rustix::io::Errno;

use super::error::{Result, StoreError, io_error, walk_error};

/// Hidden directory beneath the root holding the agent's work areas.
pub const STATE_DIR: &str = ".nfsprov";
/// Where volumes are set up before being renamed into place (in [`STATE_DIR`]).
pub(super) const STAGING_DIR: &str = "staging";
/// Where deleted volumes wait for their tree to be removed (in [`STATE_DIR`]).
pub(super) const TRASH_DIR: &str = "trash";

/// Mode of parent directories the agent creates for nested paths: traversable by the
/// pods' users, writable only by the agent.
const PARENT_MODE: u32 = 0o755;

/// The export root, opened once; every path the agent touches is reached from it.
#[derive(Debug)]
pub struct Root {
    path: PathBuf,
    /// The same path with symlinks resolved, as the kernel's mount table names it.
    canonical: PathBuf,
    fd: OwnedFd,
    /// Device and inode at open, to notice the root being unmounted or replaced.
    id: (u64, u64),
}

impl Root {
    pub fn open(path: &Path) -> Result<Self> {
        if !path.is_absolute() {
            return Err(StoreError::NotReady(format!(
                "export root {} is not an absolute path",
                path.display()
            )));
        }
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| {
            StoreError::NotReady(format!(
                "export root {} cannot be opened as a directory: {}",
                path.display(),
                io::Error::from(e)
            ))
        })?;
        let stat = rustix::fs::fstat(&fd).map_err(|e| io_error("stat export root", e))?;
        let canonical = std::fs::canonicalize(path).map_err(|e| {
            StoreError::NotReady(format!(
                "export root {} cannot be resolved: {e}",
                path.display()
            ))
        })?;
        Ok(Self {
            path: path.to_owned(),
            canonical,
            fd,
            id: (stat.st_dev, stat.st_ino),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn canonical_path(&self) -> &Path {
        &self.canonical
    }

    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// The device of the root's own filesystem (another device below it is a mount).
    pub fn device(&self) -> u64 {
        self.id.0
    }

    /// Whether the root's path still names the directory the agent opened.
    pub fn is_unchanged(&self, stat: &rustix::fs::Stat) -> bool {
        (stat.st_dev, stat.st_ino) == self.id
    }

    /// Refuses mutations when the root is gone or was replaced.
    pub fn ensure_present(&self) -> Result<()> {
        match rustix::fs::stat(&self.path) {
            Ok(stat) if self.is_unchanged(&stat) => Ok(()),
            Ok(_) => Err(StoreError::NotReady(format!(
                "export root {} was replaced or unmounted",
                self.path.display()
            ))),
            Err(e) => Err(StoreError::NotReady(format!(
                "export root {} is missing: {}",
                self.path.display(),
                io::Error::from(e)
            ))),
        }
    }

    /// A new descriptor of the root itself.
    pub fn reopen(&self) -> Result<OwnedFd> {
        rustix::fs::openat(
            &self.fd,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("open export root", e))
    }

    /// Opens (and with `create`, makes) a directory of the agent's own beneath the root.
    pub fn open_internal(&self, components: &[&str], create: bool) -> Result<OwnedFd> {
        let mut dir: Option<OwnedFd> = None;
        for component in components {
            let base = dir.as_ref().map_or(self.fd(), |fd| fd.as_fd());
            dir = Some(open_child(base, component, create)?);
        }
        dir.ok_or_else(|| StoreError::NotReady("empty internal path".into()))
    }

    /// Opens the directory below the root named by `components`; `None` when a component
    /// is missing.
    pub fn open_existing(&self, components: &[&str]) -> Result<Option<OwnedFd>> {
        let mut dir = self.reopen()?;
        for component in components {
            dir = match open_child(dir.as_fd(), component, false) {
                Ok(next) => next,
                Err(StoreError::NotFound(_)) => return Ok(None),
                Err(e) => return Err(e),
            };
        }
        Ok(Some(dir))
    }
}

/// Opens `name` in `dir` as a directory without following a symlink; with `create`,
/// makes it first when missing.
pub(super) fn open_child(dir: BorrowedFd<'_>, name: &str, create: bool) -> Result<OwnedFd> {
    open_or_create_dir(dir, name, create).map_err(|e| match e {
        Errno::NOENT => StoreError::NotFound(format!("{name} does not exist")),
        e => walk_error(name, e),
    })
}

pub(super) fn open_or_create_dir(
    dir: BorrowedFd<'_>,
    name: &str,
    create: bool,
) -> rustix::io::Result<OwnedFd> {
    let made = create
        && match rustix::fs::mkdirat(dir, name, Mode::from_raw_mode(PARENT_MODE)) {
            Ok(()) => true,
            Err(Errno::EXIST) => false,
            Err(e) => return Err(e),
        };
    let opened = rustix::fs::openat(
        dir,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    if made {
        // The process umask (0077 under the shipped unit) narrowed the mode; pods must
        // be able to traverse parents to reach their volume.
        rustix::fs::fchmod(&opened, Mode::from_raw_mode(PARENT_MODE))?;
    }
    Ok(opened)
}

/// Names and types of the entries of a directory, without `.` and `..`.
pub(super) fn list_dir(dir: BorrowedFd<'_>) -> rustix::io::Result<Vec<(String, FileType)>> {
    let mut entries = Vec::new();
    for entry in rustix::fs::Dir::read_from(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if is_dot(name) {
            continue;
        }
        // Names that are not UTF-8 are still removable through the byte-level path of
        // tree removal; here they are only listed, so a lossy form is enough to skip them.
        entries.push((name.to_string_lossy().into_owned(), entry.file_type()));
    }
    Ok(entries)
}

pub fn is_dot(name: &CStr) -> bool {
    matches!(name.to_bytes(), b"." | b"..")
}

/// Whether a listed entry may be a directory (the type is not always reported).
pub(super) fn may_be_directory(kind: FileType) -> bool {
    matches!(kind, FileType::Directory | FileType::Unknown)
}
