//! Metadata of the entries copied: how they are identified (type, inode, mount), and their
//! owners, modes, extended attributes and times, set in the one order that keeps them.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd};

use rustix::fs::{
    AtFlags, FileType, Gid, Mode, Statx, StatxFlags, Timespec, Timestamps, Uid, XattrFlags,
};
use rustix::io::Errno;

use super::error::{special_bits, write_error};
use crate::store::error::{Result, StoreError, io_error};

/// The attribute old agents kept a volume's record in; never copied (see the copy's
/// documentation).
pub(crate) const LEGACY_XATTR: &[u8] = b"user.nfsprov.volume";
/// Tries at reading an attribute or list that keeps growing between size and read.
const XATTR_TRIES: usize = 8;

pub(crate) fn stat_mask() -> StatxFlags {
    StatxFlags::BASIC_STATS | StatxFlags::BTIME | StatxFlags::MNT_ID
}

pub(crate) fn stat_fd(fd: BorrowedFd<'_>) -> rustix::io::Result<Statx> {
    rustix::fs::statx(fd, c"", AtFlags::EMPTY_PATH, stat_mask())
}

/// Which inode a stat is of. The birth time, where the filesystem keeps one, tells apart
/// a file removed during the copy and a new one given its inode number.
pub(crate) type Identity = (u32, u32, u64, i64, u32);

pub(crate) fn identity(stat: &Statx) -> Identity {
    let born = if stat.stx_mask & StatxFlags::BTIME.bits() != 0 {
        (stat.stx_btime.tv_sec, stat.stx_btime.tv_nsec)
    } else {
        (0, 0)
    };
    (
        stat.stx_dev_major,
        stat.stx_dev_minor,
        stat.stx_ino,
        born.0,
        born.1,
    )
}

pub(crate) fn file_type(stat: &Statx) -> FileType {
    FileType::from_raw_mode(stat.stx_mode.into())
}

/// Permission bits with the set-user-ID, set-group-ID and sticky bits.
pub(crate) fn permissions(stat: &Statx) -> u32 {
    u32::from(stat.stx_mode) & 0o7777
}

fn timestamps(stat: &Statx) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: stat.stx_atime.tv_sec,
            tv_nsec: stat.stx_atime.tv_nsec.into(),
        },
        last_modification: Timespec {
            tv_sec: stat.stx_mtime.tv_sec,
            tv_nsec: stat.stx_mtime.tv_nsec.into(),
        },
    }
}

/// An entry whose metadata is read or set: open (files and directories), or a name in an
/// open directory (symlinks and special files, which are never opened: opening a device
/// can do things, a symlink would be followed).
pub(crate) enum Node<'a> {
    Fd(BorrowedFd<'a>),
    At(BorrowedFd<'a>, &'a CStr),
}

impl Node<'_> {
    fn chown(&self, stat: &Statx) -> rustix::io::Result<()> {
        self.chown_ids(stat.stx_uid, stat.stx_gid)
    }

    pub(crate) fn chown_ids(&self, uid: u32, gid: u32) -> rustix::io::Result<()> {
        let (uid, gid) = (Some(Uid::from_raw(uid)), Some(Gid::from_raw(gid)));
        match *self {
            Node::Fd(fd) => rustix::fs::fchown(fd, uid, gid),
            Node::At(dir, name) => {
                rustix::fs::chownat(dir, name, uid, gid, AtFlags::SYMLINK_NOFOLLOW)
            }
        }
    }

    /// Never called for a symlink (which has no mode of its own): `fchmodat` follows.
    fn chmod(&self, mode: u32) -> rustix::io::Result<()> {
        let mode = Mode::from_raw_mode(mode);
        match *self {
            Node::Fd(fd) => rustix::fs::fchmod(fd, mode),
            Node::At(dir, name) => rustix::fs::chmodat(dir, name, mode, AtFlags::empty()),
        }
    }

    pub(crate) fn set_times(&self, times: &Timestamps) -> rustix::io::Result<()> {
        match *self {
            Node::Fd(fd) => rustix::fs::futimens(fd, times),
            Node::At(dir, name) => {
                rustix::fs::utimensat(dir, name, times, AtFlags::SYMLINK_NOFOLLOW)
            }
        }
    }

    fn stat(&self) -> rustix::io::Result<Statx> {
        match *self {
            Node::Fd(fd) => stat_fd(fd),
            Node::At(dir, name) => {
                rustix::fs::statx(dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
            }
        }
    }

    /// The path that reaches the entry through its directory's descriptor, for the
    /// attribute calls that have no `*at` form: `/proc/self/fd/N` leads to the directory
    /// itself and the last component is not followed by the `l*` calls.
    fn path(dir: BorrowedFd<'_>, name: &CStr) -> rustix::io::Result<CString> {
        let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
        path.extend_from_slice(name.to_bytes());
        CString::new(path).map_err(|_| Errno::INVAL)
    }

    /// The names of the entry's attributes, each followed by a NUL.
    pub(crate) fn list_xattrs(&self) -> rustix::io::Result<Vec<u8>> {
        match *self {
            Node::Fd(fd) => read_sized(
                || rustix::fs::flistxattr_query(fd),
                |buffer| rustix::fs::flistxattr(fd, buffer),
            ),
            Node::At(dir, name) => {
                let path = Self::path(dir, name)?;
                read_sized(
                    || rustix::fs::llistxattr_query(&path),
                    |buffer| rustix::fs::llistxattr(&path, buffer),
                )
            }
        }
    }

    pub(crate) fn get_xattr(&self, attribute: &CStr) -> rustix::io::Result<Vec<u8>> {
        match *self {
            Node::Fd(fd) => read_sized(
                || rustix::fs::fgetxattr_query(fd, attribute),
                |buffer| rustix::fs::fgetxattr(fd, attribute, buffer),
            ),
            Node::At(dir, name) => {
                let path = Self::path(dir, name)?;
                read_sized(
                    || rustix::fs::lgetxattr_query(&path, attribute),
                    |buffer| rustix::fs::lgetxattr(&path, attribute, buffer),
                )
            }
        }
    }

    pub(crate) fn set_xattr(&self, attribute: &CStr, value: &[u8]) -> rustix::io::Result<()> {
        match *self {
            Node::Fd(fd) => rustix::fs::fsetxattr(fd, attribute, value, XattrFlags::empty()),
            Node::At(dir, name) => rustix::fs::lsetxattr(
                Self::path(dir, name)?,
                attribute,
                value,
                XattrFlags::empty(),
            ),
        }
    }
}

/// Reads something whose size is asked first, again when it grew in between.
fn read_sized(
    size: impl Fn() -> rustix::io::Result<usize>,
    read: impl Fn(&mut [u8]) -> rustix::io::Result<usize>,
) -> rustix::io::Result<Vec<u8>> {
    for _ in 0..XATTR_TRIES {
        let mut buffer = vec![0; size()?];
        if buffer.is_empty() {
            return Ok(buffer);
        }
        match read(&mut buffer) {
            Ok(len) => {
                buffer.truncate(len);
                return Ok(buffer);
            }
            Err(Errno::RANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(Errno::RANGE)
}

/// Gives `target` the metadata of `source` (whose stat is `stat`), in the one order that
/// keeps it all (see the module's documentation).
pub(super) fn set_metadata(
    source: &Node<'_>,
    target: &Node<'_>,
    stat: &Statx,
    rel: &str,
) -> Result<()> {
    let symlink = file_type(stat) == FileType::Symlink;
    target
        .chown(stat)
        .map_err(|e| write_error("set the owner of", rel, e))?;
    copy_xattrs(source, target, symlink, rel)?;
    if !symlink {
        set_mode(target, permissions(stat), rel)?;
    }
    target
        .set_times(&timestamps(stat))
        .map_err(|e| write_error("set the times of", rel, e))
}

pub(crate) fn set_mode(target: &Node<'_>, mode: u32, rel: &str) -> Result<()> {
    let set_id = mode & 0o6000 != 0;
    match target.chmod(mode) {
        Ok(()) => {}
        // What the unit's RestrictSUIDSGID= answers.
        Err(Errno::PERM) if set_id => return Err(special_bits(rel)),
        Err(e) => return Err(write_error("set the mode of", rel, e)),
    }
    if set_id {
        // Without CAP_FSETID the kernel silently drops the set-group-ID bit of a file
        // whose group the agent is not in: look.
        let now = target
            .stat()
            .map_err(|e| io_error(format!("stat {rel}"), e))?;
        if permissions(&now) != mode {
            return Err(special_bits(rel));
        }
    }
    Ok(())
}

fn copy_xattrs(source: &Node<'_>, target: &Node<'_>, symlink: bool, rel: &str) -> Result<()> {
    let names = match source.list_xattrs() {
        Ok(names) => names,
        // The source's filesystem has none.
        Err(Errno::OPNOTSUPP) => return Ok(()),
        Err(e) => {
            return Err(io_error(
                format!("list the extended attributes of {rel}"),
                e,
            ));
        }
    };
    for attribute in names.split(|b| *b == 0) {
        if attribute.is_empty() || attribute == LEGACY_XATTR {
            continue;
        }
        let shown = String::from_utf8_lossy(attribute);
        let Ok(attribute) = CString::new(attribute) else {
            continue;
        };
        let value = match source.get_xattr(&attribute) {
            Ok(value) => value,
            // Removed since it was listed.
            Err(Errno::NODATA) => continue,
            Err(e) => {
                return Err(io_error(
                    format!("read the extended attribute {shown} of {rel}"),
                    e,
                ));
            }
        };
        match target.set_xattr(&attribute, &value) {
            Ok(()) => {}
            // Linux allows no user.* attributes on symlinks.
            Err(Errno::PERM | Errno::OPNOTSUPP) if symlink && shown.starts_with("user.") => {}
            Err(Errno::OPNOTSUPP) => {
                return Err(StoreError::Unsupported(format!(
                    "{rel} has the extended attribute {shown}, which the clone's filesystem cannot store; a clone is exact or fails"
                )));
            }
            Err(e) => {
                return Err(write_error(
                    &format!("set the extended attribute {shown} of"),
                    rel,
                    e,
                ));
            }
        }
    }
    Ok(())
}
