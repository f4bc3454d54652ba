//! The client: a mounted export, its calls, and the errors they return.

use std::ffi::{CStr, CString, c_char, c_int};
use std::fmt;
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicU64, Ordering};

use super::ffi::*;

/// A libnfs call that failed: which, on what, the errno it returned and libnfs's message.
/// Reach it with `error.downcast_ref::<NfsError>()` to check the errno.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsError {
    pub operation: &'static str,
    pub path: String,
    /// Positive errno (libnfs returns `-errno`).
    pub errno: i32,
    pub message: String,
}

impl fmt::Display for NfsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "NFS {} {:?} failed: {} (errno {}): {}",
            self.operation,
            self.path,
            std::io::Error::from_raw_os_error(self.errno),
            self.errno,
            self.message
        )
    }
}

impl std::error::Error for NfsError {}

impl NfsError {
    /// Whether `error` is a call the server refused because a quota is exhausted.
    /// libnfs 4.0 turns NFS4ERR_DQUOT into ERANGE, not EDQUOT: its message names the
    /// server's status, which is what the quota answered.
    pub fn is_quota_exceeded(error: &anyhow::Error) -> bool {
        error
            .downcast_ref::<Self>()
            .is_some_and(|e| e.message.contains("NFS4ERR_DQUOT"))
    }

    /// Whether `error` is a call the server refused because it serves no export by the
    /// file handle's (`NFS4ERR_STALE`).
    pub fn is_stale(error: &anyhow::Error) -> bool {
        error
            .downcast_ref::<Self>()
            .is_some_and(|e| e.message.contains("NFS4ERR_STALE"))
    }

    /// Whether `error` is a call the server refused because the filesystem under the
    /// file is full (`NFS4ERR_NOSPC`): a volume that is a filesystem of its own.
    pub fn is_out_of_space(error: &anyhow::Error) -> bool {
        error
            .downcast_ref::<Self>()
            .is_some_and(|e| e.message.contains("NFS4ERR_NOSPC"))
    }
}

/// What a file is, from the `S_IFMT` bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other(u32),
}

impl FileKind {
    pub(super) fn from_mode(mode: u32) -> Self {
        match mode & libc::S_IFMT {
            libc::S_IFREG => Self::File,
            libc::S_IFDIR => Self::Directory,
            libc::S_IFLNK => Self::Symlink,
            other => Self::Other(other),
        }
    }
}

/// A point in time as NFS carries it (seconds and nanoseconds since the epoch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp {
    pub sec: i64,
    pub nsec: u32,
}

/// `lstat`/`stat` through NFS (libnfs's `struct nfs_stat_64`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NfsStat {
    pub kind: FileKind,
    /// Permission bits with setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// The whole mode, type bits included, as libnfs returned it.
    pub raw_mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub nlink: u64,
    pub ino: u64,
    pub size: u64,
    /// Bytes the file occupies on the server: NFSv4's `space_used` attribute.
    pub used_bytes: u64,
    /// libnfs's derived block count: over NFSv4, `used_bytes` in 4096-byte units, rounded
    /// up (not `st_blocks`' 512-byte units).
    /// [`local_stat`](super::manifest::local_stat) fills in `st_blocks`.
    pub blocks: u64,
    pub blksize: u64,
    pub atime: Timestamp,
    pub mtime: Timestamp,
    pub ctime: Timestamp,
}

impl NfsStat {
    fn from_raw(raw: &RawStat64) -> Self {
        let time = |sec: u64, nsec: u64| Timestamp {
            // The C fields are unsigned; times before 1970 come back two's-complement.
            sec: sec as i64,
            nsec: nsec as u32,
        };
        let raw_mode = raw.nfs_mode as u32;
        Self {
            kind: FileKind::from_mode(raw_mode),
            mode: raw_mode & 0o7777,
            raw_mode,
            uid: raw.nfs_uid as u32,
            gid: raw.nfs_gid as u32,
            nlink: raw.nfs_nlink,
            ino: raw.nfs_ino,
            size: raw.nfs_size,
            used_bytes: raw.nfs_used,
            blocks: raw.nfs_blocks,
            blksize: raw.nfs_blksize,
            atime: time(raw.nfs_atime, raw.nfs_atime_nsec),
            mtime: time(raw.nfs_mtime, raw.nfs_mtime_nsec),
            ctime: time(raw.nfs_ctime, raw.nfs_ctime_nsec),
        }
    }
}

/// A mounted NFSv4 export, spoken to with one AUTH_SYS identity.
///
/// Every call blocks until the server answers (or libnfs's timeout, a minute, passes).
/// A client may move between threads but is not shared by them (`Send`, not `Sync`).
pub struct NfsClient {
    api: &'static Api,
    context: NonNull<RawContext>,
    server: String,
    port: u16,
    export: String,
    uid: u32,
    gid: u32,
    readmax: u64,
    writemax: u64,
    mounted: bool,
}

// SAFETY: a libnfs context has no thread affinity (the sync calls run their own event
// loop on the caller's thread); `!Sync` keeps it to one thread at a time.
unsafe impl Send for NfsClient {}

/// Largest chunk moved by one read call, whatever the server offers (libnfs 4.0 reports
/// no maximum for NFSv4: `nfs_get_readmax` returns 0).
const CHUNK_LIMIT: u64 = 1 << 20;
/// Largest chunk written by one call. libnfs 4.0 encodes every NFSv4 COMPOUND into a
/// fixed 4096-byte buffer (ZDR_ENCODEBUF_MINSIZE; it has no size hint for WRITE as its
/// NFSv3 path has), so a WRITE of more than about 3900 bytes fails with "ZDR error:
/// Failed to encode COMPOUND4args". 2048 leaves room for the largest file handle.
const WRITE_CHUNK_LIMIT: u64 = 2048;
/// libnfs's per-call timeout: long enough for a loaded machine, short enough to fail.
const TIMEOUT_MS: c_int = 60_000;

impl NfsClient {
    /// Mounts `export` of `server` with NFSv4 on `port` (no portmapper), as root (0:0;
    /// ganesha here exports with `No_Root_Squash`).
    pub fn connect(server: &str, port: u16, export: &str) -> anyhow::Result<Self> {
        Self::connect_as(server, port, export, 0, 0)
    }

    /// As [`NfsClient::connect`], speaking as `uid`/`gid` (AUTH_SYS, no extra groups).
    pub fn connect_as(
        server: &str,
        port: u16,
        export: &str,
        uid: u32,
        gid: u32,
    ) -> anyhow::Result<Self> {
        let api = api()?;
        anyhow::ensure!(
            export.starts_with('/') && !export.contains(['?', '&', '#', '\0']),
            "export {export:?} must be an absolute path without URL delimiters"
        );
        let uid_c = c_int::try_from(uid).map_err(|_| anyhow::anyhow!("uid {uid} too large"))?;
        let gid_c = c_int::try_from(gid).map_err(|_| anyhow::anyhow!("gid {gid} too large"))?;
        // SAFETY: plain constructor.
        let context = NonNull::new(unsafe { (api.nfs_init_context)() })
            .ok_or_else(|| anyhow::anyhow!("nfs_init_context failed"))?;
        // From here on, Drop destroys the context on every error path.
        let mut client = Self {
            api,
            context,
            server: server.to_owned(),
            port,
            export: export.to_owned(),
            uid,
            gid,
            readmax: CHUNK_LIMIT,
            writemax: WRITE_CHUNK_LIMIT,
            mounted: false,
        };
        let ctx = client.context.as_ptr();
        // libnfs 4.0 names its NFSv4 client "Libnfs pid:<pid> <seconds>" with a verifier
        // from the time: two contexts made in the same second by one process would be one
        // client to the server, and the second SETCLIENTID would expire the first's state.
        static CLIENTS: AtomicU64 = AtomicU64::new(0);
        let serial = CLIENTS.fetch_add(1, Ordering::Relaxed);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or_default();
        let name = CString::new(format!(
            "nfsprov-e2e pid:{} client:{serial} t:{nanos}",
            std::process::id()
        ))?;
        // Exactly 8 bytes are read.
        let verifier = (nanos ^ (serial << 48) ^ u64::from(std::process::id())).to_le_bytes();
        // SAFETY: a live context; the name is NUL-terminated (libnfs copies it), the
        // verifier is the 8 bytes libnfs copies.
        unsafe {
            (api.nfs4_set_client_name)(ctx, name.as_ptr());
            (api.nfs4_set_verifier)(ctx, verifier.as_ptr().cast());
            (api.nfs_set_timeout)(ctx, TIMEOUT_MS);
            // Changes made on the server side must show in the next listing.
            (api.nfs_set_dircache)(ctx, 0);
            // Modes given to create/mkdir are the modes files get.
            (api.nfs_umask)(ctx, 0);
        }
        let url = CString::new(crate::nfs::nfs_url(server, port, export))?;
        // SAFETY: a live context and a NUL-terminated URL; the result is freed below.
        let parsed = unsafe { (api.nfs_parse_url_dir)(ctx, url.as_ptr()) };
        if parsed.is_null() {
            anyhow::bail!(
                "cannot parse NFS URL {url:?}: {}",
                client.last_error_message()
            );
        }
        let mounted = {
            // SAFETY: non-NULL result of nfs_parse_url_dir, read before nfs_destroy_url.
            let (url_server, url_path) = unsafe { ((*parsed).server, (*parsed).path) };
            let result = if url_server.is_null() || url_path.is_null() {
                Err(anyhow::anyhow!("NFS URL {url:?} lacks a server or a path"))
            } else {
                // SAFETY: a live context; version 4 is NFS_V4; uid/gid set before mounting so
                // every call, the mount's own included, carries them.
                unsafe {
                    let version = (api.nfs_set_version)(ctx, 4);
                    (api.nfs_set_uid)(ctx, uid_c);
                    (api.nfs_set_gid)(ctx, gid_c);
                    if version != 0 {
                        Err(anyhow::anyhow!(
                            "nfs_set_version(4) failed: {}",
                            client.last_error_message()
                        ))
                    } else {
                        let rc = (api.nfs_mount)(ctx, url_server, url_path);
                        client.check(rc, "mount", export)
                    }
                }
            };
            // SAFETY: allocated by nfs_parse_url_dir, freed once.
            unsafe { (api.nfs_destroy_url)(parsed) };
            result
        };
        mounted.map_err(|e| {
            anyhow::anyhow!("NFSv4 mount of {server}:{export} on port {port} failed: {e:#}")
        })?;
        client.mounted = true;
        // SAFETY: a live, mounted context.
        let (readmax, writemax) =
            unsafe { ((api.nfs_get_readmax)(ctx), (api.nfs_get_writemax)(ctx)) };
        // 0 means unknown (libnfs 4.0 over NFSv4).
        if readmax > 0 {
            client.readmax = readmax.clamp(512, CHUNK_LIMIT);
        }
        if writemax > 0 {
            client.writemax = writemax.clamp(512, WRITE_CHUNK_LIMIT);
        }
        Ok(client)
    }

    /// Another connection to the same export, speaking as `uid`/`gid`: what it creates is
    /// theirs, and the server checks permissions against them.
    pub fn as_user(&self, uid: u32, gid: u32) -> anyhow::Result<Self> {
        Self::connect_as(&self.server, self.port, &self.export, uid, gid)
    }

    /// The AUTH_SYS identity of this client.
    pub fn identity(&self) -> (u32, u32) {
        (self.uid, self.gid)
    }

    pub fn export(&self) -> &str {
        &self.export
    }

    fn ctx(&self) -> *mut RawContext {
        self.context.as_ptr()
    }

    fn last_error_message(&self) -> String {
        // SAFETY: a live context; the string (or NULL) is owned by it.
        let text = unsafe { (self.api.nfs_get_error)(self.ctx()) };
        if text.is_null() {
            String::new()
        } else {
            // SAFETY: non-NULL, NUL-terminated, valid until the next call on the context.
            unsafe { CStr::from_ptr(text) }
                .to_string_lossy()
                .into_owned()
        }
    }

    /// Turns a libnfs return code (`<0` is `-errno`) into an error, or the value.
    fn check(&self, rc: c_int, operation: &'static str, path: &str) -> anyhow::Result<u64> {
        if rc < 0 {
            return Err(NfsError {
                operation,
                path: path.to_owned(),
                errno: -rc,
                message: self.last_error_message(),
            }
            .into());
        }
        Ok(rc as u64)
    }

    fn open_file(
        &self,
        path: &str,
        flags: c_int,
        create_mode: Option<u32>,
    ) -> anyhow::Result<File<'_>> {
        let c = c_path(path)?;
        let mut fh: *mut RawFh = ptr::null_mut();
        // SAFETY: live context, NUL-terminated path, out-pointer to a local.
        let rc = unsafe {
            match create_mode {
                Some(mode) => {
                    (self.api.nfs_create)(self.ctx(), c.as_ptr(), flags, mode as c_int, &mut fh)
                }
                None => (self.api.nfs_open)(self.ctx(), c.as_ptr(), flags, &mut fh),
            }
        };
        self.check(
            rc,
            if create_mode.is_some() {
                "create"
            } else {
                "open"
            },
            path,
        )?;
        let fh = NonNull::new(fh)
            .ok_or_else(|| anyhow::anyhow!("libnfs returned no file handle for {path:?}"))?;
        Ok(File {
            client: self,
            fh: Some(fh),
            path: path.to_owned(),
            writable: flags & libc::O_ACCMODE != libc::O_RDONLY,
        })
    }

    /// Creates (or truncates) `path` with `contents`, then sets exactly `mode`.
    pub fn write_file(&self, path: &str, contents: &[u8], mode: u32) -> anyhow::Result<()> {
        self.write_sparse(path, contents.len() as u64, &[(0, contents)], mode)
    }

    /// Creates (or truncates) `path`, writes each `(offset, bytes)` extent, leaves the rest
    /// as holes, sets the size to `size` and the mode to exactly `mode`.
    pub fn write_sparse(
        &self,
        path: &str,
        size: u64,
        extents: &[(u64, &[u8])],
        mode: u32,
    ) -> anyhow::Result<()> {
        for (offset, bytes) in extents {
            anyhow::ensure!(
                offset + bytes.len() as u64 <= size,
                "extent at {offset} of {} bytes lies beyond size {size}",
                bytes.len()
            );
        }
        let file = match self.open_file(path, libc::O_RDWR | libc::O_TRUNC, Some(mode)) {
            Ok(file) => file,
            // libnfs 4.0's NFSv4 create is exclusive: an existing file is opened instead.
            Err(e) if e.downcast_ref::<NfsError>().map(|e| e.errno) == Some(libc::EEXIST) => {
                self.open_file(path, libc::O_RDWR | libc::O_TRUNC, None)?
            }
            Err(e) => return Err(e),
        };
        // Nothing of an earlier content survives, O_TRUNC honoured or not.
        file.truncate(0)?;
        for (offset, bytes) in extents {
            file.write_at(*offset, bytes)?;
        }
        file.truncate(size)?;
        file.close()?;
        // The create's mode is subject to the server's policy: set it for certain.
        self.chmod(path, mode)
    }

    /// Writes `bytes` at `offset` into an existing file (no truncation).
    pub fn write_at(&self, path: &str, offset: u64, bytes: &[u8]) -> anyhow::Result<()> {
        let file = self.open_file(path, libc::O_RDWR, None)?;
        file.write_at(offset, bytes)?;
        file.close()
    }

    /// Reads a whole file, in chunks (holes read as zeros).
    pub fn read_file(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        let size = self.stat(path)?.size;
        let file = self.open_file(path, libc::O_RDONLY, None)?;
        let mut contents = file.read_at(0, size)?;
        // It may have grown meanwhile: read on to the end.
        loop {
            let more = file.read_at(contents.len() as u64, self.readmax)?;
            if more.is_empty() {
                break;
            }
            contents.extend_from_slice(&more);
        }
        file.close()?;
        Ok(contents)
    }

    /// Reads up to `len` bytes at `offset` (fewer at the end of the file).
    pub fn read_range(&self, path: &str, offset: u64, len: u64) -> anyhow::Result<Vec<u8>> {
        let file = self.open_file(path, libc::O_RDONLY, None)?;
        let bytes = file.read_at(offset, len)?;
        file.close()?;
        Ok(bytes)
    }

    /// Sets a file's size (holes when growing).
    pub fn truncate(&self, path: &str, size: u64) -> anyhow::Result<()> {
        let file = self.open_file(path, libc::O_RDWR, None)?;
        file.truncate(size)?;
        file.close()
    }

    /// Creates a directory with exactly `mode` (given to the server with the CREATE, as
    /// libnfs 4.0 cannot change a directory's mode afterwards; checked).
    pub fn mkdir(&self, path: &str, mode: u32) -> anyhow::Result<()> {
        anyhow::ensure!(mode <= 0o7777, "mode {mode:o} has bits beyond 07777");
        let c = c_path(path)?;
        // SAFETY: live context, NUL-terminated path.
        let rc = unsafe { (self.api.nfs_mkdir2)(self.ctx(), c.as_ptr(), mode as c_int) };
        self.check(rc, "mkdir", path)?;
        let made = self.lstat(path)?.mode;
        anyhow::ensure!(
            made == mode,
            "mkdir {path:?} asked for mode {mode:o}, the server made {made:o}"
        );
        Ok(())
    }

    /// A directory owned by `uid`/`gid` with exactly `mode`. libnfs 4.0 cannot chown a
    /// directory over NFSv4, so it is made by that identity in a scratch directory (mode
    /// 0777) at the export's root and renamed into place by this client, which must be
    /// allowed to do both (root is): the export's root must be searchable by others.
    pub fn mkdir_owned(&self, path: &str, mode: u32, uid: u32, gid: u32) -> anyhow::Result<()> {
        self.create_owned(path, uid, gid, |user, staged| user.mkdir(staged, mode))
    }

    /// A symlink owned by `uid`/`gid` (see [`NfsClient::mkdir_owned`] for how: libnfs 4.0's
    /// `lchown` over NFSv4 would change the link's target instead).
    pub fn symlink_owned(
        &self,
        target: &str,
        link_path: &str,
        uid: u32,
        gid: u32,
    ) -> anyhow::Result<()> {
        self.create_owned(link_path, uid, gid, |user, staged| {
            user.symlink(target, staged)
        })
    }

    fn create_owned(
        &self,
        path: &str,
        uid: u32,
        gid: u32,
        make: impl FnOnce(&NfsClient, &str) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        static STAGINGS: AtomicU64 = AtomicU64::new(0);
        let staging = format!(
            "/.nfsprov-e2e-staging-{}-{}",
            std::process::id(),
            STAGINGS.fetch_add(1, Ordering::Relaxed)
        );
        self.mkdir(&staging, 0o777)?;
        let staged = format!("{staging}/made");
        let made = self
            .as_user(uid, gid)
            .and_then(|user| make(&user, &staged))
            .and_then(|()| self.rename(&staged, path));
        if made.is_err() {
            // Whatever was made stays out of the way of the scratch directory's removal.
            let _ = self.unlink(&staged).or_else(|_| self.rmdir(&staged));
        }
        let removed = self.rmdir(&staging);
        made.map_err(|e| anyhow::anyhow!("creating {path:?} as {uid}:{gid}: {e:#}"))?;
        removed
    }

    pub fn rmdir(&self, path: &str) -> anyhow::Result<()> {
        self.path_call(path, "rmdir", self.api.nfs_rmdir)
    }

    pub fn unlink(&self, path: &str) -> anyhow::Result<()> {
        self.path_call(path, "unlink", self.api.nfs_unlink)
    }

    pub fn rename(&self, from: &str, to: &str) -> anyhow::Result<()> {
        self.two_path_call(from, to, "rename", self.api.nfs_rename)
    }

    /// `chmod` of a file, following a symlink. Not of a directory: see
    /// `NfsClient::settable`.
    pub fn chmod(&self, path: &str, mode: u32) -> anyhow::Result<()> {
        self.settable(path, true, "chmod")?;
        self.mode_call(path, mode, "chmod", self.api.nfs_chmod)
    }

    /// `chmod` of a file that is not a symlink (Linux has no symlink modes anyway).
    pub fn lchmod(&self, path: &str, mode: u32) -> anyhow::Result<()> {
        self.settable(path, false, "lchmod")?;
        self.mode_call(path, mode, "lchmod", self.api.nfs_lchmod)
    }

    /// `chown` of a file, following a symlink. Not of a directory: see
    /// [`NfsClient::mkdir_owned`].
    pub fn chown(&self, path: &str, uid: u32, gid: u32) -> anyhow::Result<()> {
        self.settable(path, true, "chown")?;
        self.owner_call(path, uid, gid, "chown", self.api.nfs_chown)
    }

    /// `chown` of a file that is not a symlink; a symlink gets its owner when made, with
    /// [`NfsClient::symlink_owned`].
    pub fn lchown(&self, path: &str, uid: u32, gid: u32) -> anyhow::Result<()> {
        self.settable(path, false, "lchown")?;
        self.owner_call(path, uid, gid, "lchown", self.api.nfs_lchown)
    }

    /// Refuses what libnfs 4.0's NFSv4 client gets wrong, before it does: it sets
    /// attributes by OPENing the path, so on a directory every chmod, chown and utimes
    /// fails (NFS4ERR_ISDIR), and its l-variants follow a final symlink and change the
    /// target. Refused with errno `EOPNOTSUPP` in an [`NfsError`].
    fn settable(&self, path: &str, follow: bool, operation: &'static str) -> anyhow::Result<()> {
        let kind = if follow {
            self.stat(path)?
        } else {
            self.lstat(path)?
        }
        .kind;
        let why = match kind {
            FileKind::Directory => {
                "libnfs 4.0 over NFSv4 cannot set a directory's attributes (it OPENs the path); \
                 give mkdir the mode, or use mkdir_owned"
            }
            FileKind::Symlink => {
                "libnfs 4.0 over NFSv4 would change the symlink's target instead; \
                 use symlink_owned"
            }
            _ => return Ok(()),
        };
        Err(NfsError {
            operation,
            path: path.to_owned(),
            errno: libc::EOPNOTSUPP,
            message: why.to_owned(),
        }
        .into())
    }

    /// A second name `new` for the file `existing` (one inode).
    pub fn hard_link(&self, existing: &str, new: &str) -> anyhow::Result<()> {
        self.two_path_call(existing, new, "link", self.api.nfs_link)
    }

    /// A symlink at `link_path` whose content is `target`, verbatim (relative stays
    /// relative: it is not a path of this client's).
    pub fn symlink(&self, target: &str, link_path: &str) -> anyhow::Result<()> {
        let target_c = CString::new(target)?;
        let link_c = c_path(link_path)?;
        // SAFETY: live context, NUL-terminated strings.
        let rc = unsafe { (self.api.nfs_symlink)(self.ctx(), target_c.as_ptr(), link_c.as_ptr()) };
        self.check(rc, "symlink", link_path).map(drop)
    }

    /// A symlink's content.
    pub fn readlink(&self, path: &str) -> anyhow::Result<String> {
        let c = c_path(path)?;
        let mut buf: *mut c_char = ptr::null_mut();
        // SAFETY: live context, NUL-terminated path, out-pointer to a local.
        let rc = unsafe { (self.api.nfs_readlink2)(self.ctx(), c.as_ptr(), &mut buf) };
        let checked = self.check(rc, "readlink", path);
        if buf.is_null() {
            checked?;
            anyhow::bail!("readlink of {path:?} returned no buffer");
        }
        // SAFETY: a NUL-terminated malloc'ed string owned by us from now on.
        let target = unsafe { CStr::from_ptr(buf) }
            .to_string_lossy()
            .into_owned();
        // SAFETY: allocated by libnfs with malloc (same libc), freed once.
        unsafe { libc::free(buf.cast()) };
        checked?;
        Ok(target)
    }

    /// Attributes of the name itself (a symlink is not followed).
    pub fn lstat(&self, path: &str) -> anyhow::Result<NfsStat> {
        self.stat_call(path, "lstat", self.api.nfs_lstat64)
    }

    /// Attributes, following a symlink.
    pub fn stat(&self, path: &str) -> anyhow::Result<NfsStat> {
        self.stat_call(path, "stat", self.api.nfs_stat64)
    }

    /// Sets a file's access and modification times, following a symlink; not a
    /// directory's (see `NfsClient::settable`). libnfs's `utimes` takes microseconds:
    /// `nsec` is truncated to them.
    pub fn set_times(&self, path: &str, atime: Timestamp, mtime: Timestamp) -> anyhow::Result<()> {
        self.settable(path, true, "utimes")?;
        self.times_call(path, atime, mtime, "utimes", self.api.nfs_utimes)
    }

    /// A directory's names, sorted, "." and ".." left out (`nfs_readdir`; for inode
    /// numbers, [`NfsClient::lstat`] each: libnfs 4.0's NFSv4 listing reports 0).
    pub fn read_dir(&self, path: &str) -> anyhow::Result<Vec<String>> {
        let c = c_path(path)?;
        let mut dir: *mut RawDir = ptr::null_mut();
        // SAFETY: live context, NUL-terminated path, out-pointer to a local.
        let rc = unsafe { (self.api.nfs_opendir)(self.ctx(), c.as_ptr(), &mut dir) };
        self.check(rc, "opendir", path)?;
        anyhow::ensure!(!dir.is_null(), "opendir of {path:?} returned no directory");
        let mut entries = Vec::new();
        loop {
            // SAFETY: a directory opened above and not yet closed.
            let entry = unsafe { (self.api.nfs_readdir)(self.ctx(), dir) };
            if entry.is_null() {
                break;
            }
            // SAFETY: libnfs's entry, valid until closedir; only its leading fields are read.
            let name = unsafe { (*entry).name };
            if name.is_null() {
                continue;
            }
            // SAFETY: a NUL-terminated name owned by the entry.
            let name = unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned();
            if name != "." && name != ".." {
                entries.push(name);
            }
        }
        // SAFETY: closes the directory opened above, once.
        unsafe { (self.api.nfs_closedir)(self.ctx(), dir) };
        entries.sort();
        Ok(entries)
    }

    fn path_call(
        &self,
        path: &str,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char) -> c_int,
    ) -> anyhow::Result<()> {
        let c = c_path(path)?;
        // SAFETY: live context, NUL-terminated path; `call` has this prototype.
        let rc = unsafe { call(self.ctx(), c.as_ptr()) };
        self.check(rc, operation, path).map(drop)
    }

    fn two_path_call(
        &self,
        from: &str,
        to: &str,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char, *const c_char) -> c_int,
    ) -> anyhow::Result<()> {
        let (from_c, to_c) = (c_path(from)?, c_path(to)?);
        // SAFETY: live context, NUL-terminated paths; `call` has this prototype.
        let rc = unsafe { call(self.ctx(), from_c.as_ptr(), to_c.as_ptr()) };
        self.check(rc, operation, &format!("{from} -> {to}"))
            .map(drop)
    }

    fn mode_call(
        &self,
        path: &str,
        mode: u32,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char, c_int) -> c_int,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(mode <= 0o7777, "mode {mode:o} has bits beyond 07777");
        let c = c_path(path)?;
        // SAFETY: live context, NUL-terminated path; `call` has this prototype.
        let rc = unsafe { call(self.ctx(), c.as_ptr(), mode as c_int) };
        self.check(rc, operation, path).map(drop)
    }

    fn owner_call(
        &self,
        path: &str,
        uid: u32,
        gid: u32,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char, c_int, c_int) -> c_int,
    ) -> anyhow::Result<()> {
        let uid = c_int::try_from(uid).map_err(|_| anyhow::anyhow!("uid {uid} too large"))?;
        let gid = c_int::try_from(gid).map_err(|_| anyhow::anyhow!("gid {gid} too large"))?;
        let c = c_path(path)?;
        // SAFETY: live context, NUL-terminated path; `call` has this prototype.
        let rc = unsafe { call(self.ctx(), c.as_ptr(), uid, gid) };
        self.check(rc, operation, path).map(drop)
    }

    fn stat_call(
        &self,
        path: &str,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char, *mut RawStat64) -> c_int,
    ) -> anyhow::Result<NfsStat> {
        let c = c_path(path)?;
        let mut raw = RawStat64::default();
        // SAFETY: live context, NUL-terminated path, a whole `struct nfs_stat_64` to fill.
        let rc = unsafe { call(self.ctx(), c.as_ptr(), &mut raw) };
        self.check(rc, operation, path)?;
        Ok(NfsStat::from_raw(&raw))
    }

    fn times_call(
        &self,
        path: &str,
        atime: Timestamp,
        mtime: Timestamp,
        operation: &'static str,
        call: unsafe extern "C" fn(*mut RawContext, *const c_char, *mut libc::timeval) -> c_int,
    ) -> anyhow::Result<()> {
        let timeval = |t: Timestamp| libc::timeval {
            tv_sec: t.sec as libc::time_t,
            tv_usec: libc::suseconds_t::from(t.nsec / 1000),
        };
        let mut times = [timeval(atime), timeval(mtime)];
        let c = c_path(path)?;
        // SAFETY: live context, NUL-terminated path, `struct timeval[2]` (access, modify).
        let rc = unsafe { call(self.ctx(), c.as_ptr(), times.as_mut_ptr()) };
        self.check(rc, operation, path).map(drop)
    }
}

impl Drop for NfsClient {
    fn drop(&mut self) {
        // SAFETY: the context is live and destroyed once; umount (a no-op for NFSv4, the
        // documented counterpart of mount) only after a mount.
        unsafe {
            if self.mounted {
                (self.api.nfs_umount)(self.ctx());
            }
            (self.api.nfs_destroy_context)(self.ctx());
        }
    }
}

impl fmt::Debug for NfsClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NfsClient")
            .field("server", &self.server)
            .field("port", &self.port)
            .field("export", &self.export)
            .field("uid", &self.uid)
            .field("gid", &self.gid)
            .finish()
    }
}

/// An open file of a client; closed when dropped (or by [`File::close`], which reports).
struct File<'a> {
    client: &'a NfsClient,
    fh: Option<NonNull<RawFh>>,
    path: String,
    /// Opened for writing: flushed (COMMIT) before it is closed.
    writable: bool,
}

impl File<'_> {
    fn raw(&self) -> *mut RawFh {
        self.fh.expect("an open file").as_ptr()
    }

    fn write_at(&self, mut offset: u64, mut bytes: &[u8]) -> anyhow::Result<()> {
        let client = self.client;
        while !bytes.is_empty() {
            let count = (bytes.len() as u64).min(client.writemax);
            // SAFETY: an open file of a live context; `count` bytes are readable at `bytes`.
            let rc = unsafe {
                (client.api.nfs_pwrite)(
                    client.ctx(),
                    self.raw(),
                    offset,
                    count,
                    bytes.as_ptr().cast(),
                )
            };
            let written = client.check(rc, "pwrite", &self.path)?;
            anyhow::ensure!(written > 0, "pwrite of {:?} wrote nothing", self.path);
            offset += written;
            bytes = &bytes[written as usize..];
        }
        Ok(())
    }

    /// Up to `len` bytes at `offset`: fewer only at the end of the file.
    fn read_at(&self, offset: u64, len: u64) -> anyhow::Result<Vec<u8>> {
        let client = self.client;
        let mut out = Vec::with_capacity(len.min(64 << 20) as usize);
        let mut chunk = vec![0u8; client.readmax as usize];
        while (out.len() as u64) < len {
            let count = (len - out.len() as u64).min(client.readmax);
            // SAFETY: an open file of a live context; `count` bytes are writable at `chunk`.
            let rc = unsafe {
                (client.api.nfs_pread)(
                    client.ctx(),
                    self.raw(),
                    offset + out.len() as u64,
                    count,
                    chunk.as_mut_ptr().cast(),
                )
            };
            let read = client.check(rc, "pread", &self.path)?;
            if read == 0 {
                break;
            }
            anyhow::ensure!(read <= count, "pread of {:?} overran its buffer", self.path);
            out.extend_from_slice(&chunk[..read as usize]);
        }
        Ok(out)
    }

    fn truncate(&self, size: u64) -> anyhow::Result<()> {
        let client = self.client;
        // SAFETY: an open file of a live context.
        let rc = unsafe { (client.api.nfs_ftruncate)(client.ctx(), self.raw(), size) };
        client.check(rc, "ftruncate", &self.path).map(drop)
    }

    fn close(mut self) -> anyhow::Result<()> {
        let client = self.client;
        let fh = self.fh.take().expect("an open file").as_ptr();
        let synced = if self.writable {
            // SAFETY: an open file of a live context.
            let rc = unsafe { (client.api.nfs_fsync)(client.ctx(), fh) };
            client.check(rc, "fsync", &self.path).map(drop)
        } else {
            Ok(())
        };
        // SAFETY: an open file of a live context, closed once.
        let closed = unsafe { (client.api.nfs_close)(client.ctx(), fh) };
        synced?;
        client.check(closed, "close", &self.path).map(drop)
    }
}

impl Drop for File<'_> {
    fn drop(&mut self) {
        if let Some(fh) = self.fh.take() {
            // SAFETY: an open file of a live context, closed once.
            unsafe { (self.client.api.nfs_close)(self.client.ctx(), fh.as_ptr()) };
        }
    }
}

fn c_path(path: &str) -> anyhow::Result<CString> {
    let absolute = if path.starts_with('/') {
        path.to_owned()
    } else {
        format!("/{path}")
    };
    CString::new(absolute).map_err(|_| anyhow::anyhow!("path {path:?} contains a NUL byte"))
}
