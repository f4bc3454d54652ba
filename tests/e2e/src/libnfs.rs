//! A userspace NFSv4 client for the tests: a small, safe wrapper over libnfs's synchronous
//! API, for what the libnfs-utils tools cannot do (hard links, symlinks, modes, owners,
//! times, sparse files, directory listings).
//!
//! libnfs is loaded at run time (`dlopen("libnfs.so.13")`), so building never needs it and
//! a machine without it gets a clear error from [`NfsClient::connect`]. Every prototype and
//! struct below is libnfs 4.0.0's (Debian bookworm's libnfs13 4.0.0-1+deb12u1, soname
//! `libnfs.so.13`), as declared in its `include/nfsc/libnfs.h`. Later major versions
//! changed some of them (the `LIBNFS_API_V2` header reorders `nfs_pread`/`nfs_pwrite` to
//! `buf, count, offset` and adds a `port` to `struct nfs_url`), which is why the soname
//! is pinned.
//!
//! Paths are relative to the mounted export (a leading `/` is optional): `"ns/claim-1/a"`
//! is `<export>/ns/claim-1/a` on the server.
//!
//! What libnfs 4.0's NFSv4 client cannot do, and what this module does about it:
//! - it sets attributes by OPENing the path, so chmod, chown and utimes of a directory
//!   fail (NFS4ERR_ISDIR), and lchown/lchmod/lutimes of a symlink change its target: both
//!   are refused up front (`EOPNOTSUPP`); [`NfsClient::mkdir`] gives the mode with the
//!   CREATE, and [`NfsClient::mkdir_owned`] / [`NfsClient::symlink_owned`] make the object
//!   as its owner and rename it into place;
//! - its create is exclusive: [`NfsClient::write_file`] opens an existing file instead;
//! - it encodes each COMPOUND into 4 KiB, so writes go in chunks of 2 KiB;
//! - its READDIR leaves `nfsdirent.inode` 0: listings are names, inodes come from lstat.

use std::collections::BTreeMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::fmt;
use std::path::Path;
use std::ptr::{self, NonNull};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The soname of libnfs 4.x, the only ABI this module speaks.
pub const LIBRARY: &str = "libnfs.so.13";

// ---------------------------------------------------------------------------------------
// The C side: libnfs 4.0.0's declarations, transcribed.
// ---------------------------------------------------------------------------------------

/// `struct nfs_context` (opaque).
#[repr(C)]
struct RawContext {
    _private: [u8; 0],
}

/// `struct nfsfh` (opaque).
#[repr(C)]
struct RawFh {
    _private: [u8; 0],
}

/// `struct nfsdir` (opaque).
#[repr(C)]
struct RawDir {
    _private: [u8; 0],
}

/// `struct nfs_url { char *server; char *path; char *file; };` (libnfs 4.0; libnfs 6 added
/// an `int port` after `server`).
#[repr(C)]
struct RawUrl {
    server: *mut c_char,
    path: *mut c_char,
    file: *mut c_char,
}

/// `struct nfs_stat_64`: seventeen `uint64_t`, in this order, in libnfs 4.0.
#[repr(C)]
#[derive(Default)]
struct RawStat64 {
    nfs_dev: u64,
    nfs_ino: u64,
    nfs_mode: u64,
    nfs_nlink: u64,
    nfs_uid: u64,
    nfs_gid: u64,
    nfs_rdev: u64,
    nfs_size: u64,
    nfs_blksize: u64,
    nfs_blocks: u64,
    nfs_atime: u64,
    nfs_mtime: u64,
    nfs_ctime: u64,
    nfs_atime_nsec: u64,
    nfs_mtime_nsec: u64,
    nfs_ctime_nsec: u64,
    nfs_used: u64,
}

/// The leading fields of libnfs 4.0's `struct nfsdirent`:
///
/// ```c
/// struct nfsdirent {
///        struct nfsdirent *next;
///        char *name;
///        uint64_t inode;
///        uint32_t type;     /* NF3REG, NF3DIR, ... */
///        uint32_t mode;
///        uint64_t size;
///        struct timeval atime, mtime, ctime;
///        uint32_t uid, gid, nlink;
///        uint64_t dev, rdev, blksize, blocks, used;
///        uint32_t atime_nsec, mtime_nsec, ctime_nsec;
/// };
/// ```
///
/// libnfs allocates and owns the entries; this module only reads `name` through a
/// pointer it returns, so the rest of the struct does not matter. (A dump of a 4.0 entry
/// over NFSv4 matched this layout field by field, except that `inode` is always 0 there:
/// its NFSv4 READDIR does not fill it in, which is why listings carry names only.)
#[repr(C)]
struct RawDirentPrefix {
    next: *mut RawDirentPrefix,
    name: *mut c_char,
    inode: u64,
}

macro_rules! libnfs_api {
    ($( $(#[$doc:meta])* $name:ident : fn($($arg:ty),*) $(-> $ret:ty)?; )*) => {
        /// Entry points of libnfs, resolved once with `dlsym`.
        struct Api {
            $( $(#[$doc])* $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
        }

        impl Api {
            /// # Safety
            /// `handle` is a live `dlopen` handle of a libnfs 4.x (soname 13).
            unsafe fn resolve(handle: *mut c_void) -> Result<Self, String> {
                Ok(Self {
                    $( $name: {
                        let symbol = unsafe { symbol(handle, stringify!($name))? };
                        // SAFETY: the symbol is libnfs 4.0's function of that name, whose
                        // C prototype the declaration above transcribes.
                        unsafe {
                            std::mem::transmute::<
                                *mut c_void,
                                unsafe extern "C" fn($($arg),*) $(-> $ret)?,
                            >(symbol)
                        }
                    }, )*
                })
            }
        }
    };
}

libnfs_api! {
    /// `struct nfs_context *nfs_init_context(void);`
    nfs_init_context: fn() -> *mut RawContext;
    /// `void nfs_destroy_context(struct nfs_context *nfs);`
    nfs_destroy_context: fn(*mut RawContext);
    /// `char *nfs_get_error(struct nfs_context *nfs);`
    nfs_get_error: fn(*mut RawContext) -> *mut c_char;
    /// `struct nfs_url *nfs_parse_url_dir(struct nfs_context *nfs, const char *url);`
    /// Also applies the URL's arguments (`version=4&nfsport=N`) to the context.
    nfs_parse_url_dir: fn(*mut RawContext, *const c_char) -> *mut RawUrl;
    /// `void nfs_destroy_url(struct nfs_url *url);`
    nfs_destroy_url: fn(*mut RawUrl);
    /// `int nfs_set_version(struct nfs_context *nfs, int version);`
    nfs_set_version: fn(*mut RawContext, c_int) -> c_int;
    /// `void nfs_set_uid(struct nfs_context *nfs, int uid);`
    nfs_set_uid: fn(*mut RawContext, c_int);
    /// `void nfs_set_gid(struct nfs_context *nfs, int gid);`
    nfs_set_gid: fn(*mut RawContext, c_int);
    /// `void nfs_set_timeout(struct nfs_context *nfs, int milliseconds);`
    nfs_set_timeout: fn(*mut RawContext, c_int);
    /// `void nfs_set_dircache(struct nfs_context *nfs, int enabled);`
    nfs_set_dircache: fn(*mut RawContext, c_int);
    /// `uint16_t nfs_umask(struct nfs_context *nfs, uint16_t mask);`
    nfs_umask: fn(*mut RawContext, u16) -> u16;
    /// `void nfs4_set_client_name(struct nfs_context *nfs, const char *id);`
    nfs4_set_client_name: fn(*mut RawContext, *const c_char);
    /// `void nfs4_set_verifier(struct nfs_context *nfs, const char *verifier);` (8 bytes)
    nfs4_set_verifier: fn(*mut RawContext, *const c_char);
    /// `uint64_t nfs_get_readmax(struct nfs_context *nfs);`
    nfs_get_readmax: fn(*mut RawContext) -> u64;
    /// `uint64_t nfs_get_writemax(struct nfs_context *nfs);`
    nfs_get_writemax: fn(*mut RawContext) -> u64;
    /// `int nfs_mount(struct nfs_context *nfs, const char *server, const char *exportname);`
    nfs_mount: fn(*mut RawContext, *const c_char, *const c_char) -> c_int;
    /// `int nfs_umount(struct nfs_context *nfs);` (a no-op for NFSv4)
    nfs_umount: fn(*mut RawContext) -> c_int;
    /// `int nfs_mkdir2(struct nfs_context *nfs, const char *path, int mode);`
    nfs_mkdir2: fn(*mut RawContext, *const c_char, c_int) -> c_int;
    /// `int nfs_rmdir(struct nfs_context *nfs, const char *path);`
    nfs_rmdir: fn(*mut RawContext, *const c_char) -> c_int;
    /// `int nfs_unlink(struct nfs_context *nfs, const char *path);`
    nfs_unlink: fn(*mut RawContext, *const c_char) -> c_int;
    /// `int nfs_rename(struct nfs_context *nfs, const char *oldpath, const char *newpath);`
    nfs_rename: fn(*mut RawContext, *const c_char, *const c_char) -> c_int;
    /// `int nfs_create(struct nfs_context *nfs, const char *path, int flags, int mode,
    ///                 struct nfsfh **nfsfh);`
    nfs_create: fn(*mut RawContext, *const c_char, c_int, c_int, *mut *mut RawFh) -> c_int;
    /// `int nfs_open(struct nfs_context *nfs, const char *path, int flags,
    ///               struct nfsfh **nfsfh);`
    nfs_open: fn(*mut RawContext, *const c_char, c_int, *mut *mut RawFh) -> c_int;
    /// `int nfs_close(struct nfs_context *nfs, struct nfsfh *nfsfh);`
    nfs_close: fn(*mut RawContext, *mut RawFh) -> c_int;
    /// `int nfs_pread(struct nfs_context *nfs, struct nfsfh *nfsfh, uint64_t offset,
    ///                uint64_t count, void *buf);` (libnfs 4/5 argument order)
    nfs_pread: fn(*mut RawContext, *mut RawFh, u64, u64, *mut c_void) -> c_int;
    /// `int nfs_pwrite(struct nfs_context *nfs, struct nfsfh *nfsfh, uint64_t offset,
    ///                 uint64_t count, const void *buf);` (libnfs 4/5 argument order)
    nfs_pwrite: fn(*mut RawContext, *mut RawFh, u64, u64, *const c_void) -> c_int;
    /// `int nfs_ftruncate(struct nfs_context *nfs, struct nfsfh *nfsfh, uint64_t length);`
    nfs_ftruncate: fn(*mut RawContext, *mut RawFh, u64) -> c_int;
    /// `int nfs_fsync(struct nfs_context *nfs, struct nfsfh *nfsfh);`
    nfs_fsync: fn(*mut RawContext, *mut RawFh) -> c_int;
    /// `int nfs_chmod(struct nfs_context *nfs, const char *path, int mode);`
    nfs_chmod: fn(*mut RawContext, *const c_char, c_int) -> c_int;
    /// `int nfs_lchmod(struct nfs_context *nfs, const char *path, int mode);`
    nfs_lchmod: fn(*mut RawContext, *const c_char, c_int) -> c_int;
    /// `int nfs_chown(struct nfs_context *nfs, const char *path, int uid, int gid);`
    nfs_chown: fn(*mut RawContext, *const c_char, c_int, c_int) -> c_int;
    /// `int nfs_lchown(struct nfs_context *nfs, const char *path, int uid, int gid);`
    nfs_lchown: fn(*mut RawContext, *const c_char, c_int, c_int) -> c_int;
    /// `int nfs_link(struct nfs_context *nfs, const char *oldpath, const char *newpath);`
    nfs_link: fn(*mut RawContext, *const c_char, *const c_char) -> c_int;
    /// `int nfs_symlink(struct nfs_context *nfs, const char *target, const char *linkname);`
    nfs_symlink: fn(*mut RawContext, *const c_char, *const c_char) -> c_int;
    /// `int nfs_readlink2(struct nfs_context *nfs, const char *path, char **bufptr);`
    /// The caller frees `*bufptr` with `free()`.
    nfs_readlink2: fn(*mut RawContext, *const c_char, *mut *mut c_char) -> c_int;
    /// `int nfs_stat64(struct nfs_context *nfs, const char *path, struct nfs_stat_64 *st);`
    nfs_stat64: fn(*mut RawContext, *const c_char, *mut RawStat64) -> c_int;
    /// `int nfs_lstat64(struct nfs_context *nfs, const char *path, struct nfs_stat_64 *st);`
    nfs_lstat64: fn(*mut RawContext, *const c_char, *mut RawStat64) -> c_int;
    /// `int nfs_opendir(struct nfs_context *nfs, const char *path, struct nfsdir **nfsdir);`
    nfs_opendir: fn(*mut RawContext, *const c_char, *mut *mut RawDir) -> c_int;
    /// `struct nfsdirent *nfs_readdir(struct nfs_context *nfs, struct nfsdir *nfsdir);`
    nfs_readdir: fn(*mut RawContext, *mut RawDir) -> *mut RawDirentPrefix;
    /// `void nfs_closedir(struct nfs_context *nfs, struct nfsdir *nfsdir);`
    nfs_closedir: fn(*mut RawContext, *mut RawDir);
    /// `int nfs_utimes(struct nfs_context *nfs, const char *path, struct timeval *times);`
    nfs_utimes: fn(*mut RawContext, *const c_char, *mut libc::timeval) -> c_int;
}

/// # Safety
/// `handle` is a live `dlopen` handle.
unsafe fn symbol(handle: *mut c_void, name: &str) -> Result<*mut c_void, String> {
    let c_name = CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a live handle and a NUL-terminated name.
    let found = unsafe { libc::dlsym(handle, c_name.as_ptr()) };
    if found.is_null() {
        return Err(format!(
            "{LIBRARY} has no symbol {name}: this module needs libnfs 4.x ({})",
            dlerror_text()
        ));
    }
    Ok(found)
}

fn dlerror_text() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string valid until the next dl call.
    let text = unsafe { libc::dlerror() };
    if text.is_null() {
        "no dlerror".to_owned()
    } else {
        // SAFETY: non-NULL, NUL-terminated (see above).
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }
}

/// Loads `library` and resolves the API; the handle is never closed.
fn load(library: &str) -> Result<Api, String> {
    let c_library = CString::new(library).map_err(|e| e.to_string())?;
    // SAFETY: a NUL-terminated name; libnfs's constructors are harmless.
    let handle = unsafe { libc::dlopen(c_library.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(format!(
            "{library} not found: install libnfs13 (Debian, Ubuntu: apt-get install libnfs13; \
             libnfs-utils depends on it) or another build of libnfs 4.x with that soname ({})",
            dlerror_text()
        ));
    }
    // SAFETY: the handle was just opened and is never closed.
    unsafe { Api::resolve(handle) }
}

fn api() -> anyhow::Result<&'static Api> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load(LIBRARY))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Whether libnfs can be loaded here, and if not, why (for tests that skip without it).
pub fn available() -> Result<(), String> {
    api().map(drop).map_err(|e| e.to_string())
}

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

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

// ---------------------------------------------------------------------------------------
// The client
// ---------------------------------------------------------------------------------------

/// What a file is, from the `S_IFMT` bits of its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other(u32),
}

impl FileKind {
    fn from_mode(mode: u32) -> Self {
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
    /// up (not `st_blocks`' 512-byte units). [`local_stat`] fills in `st_blocks`.
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
            tv_usec: (t.nsec / 1000) as libc::suseconds_t,
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

// ---------------------------------------------------------------------------------------
// The clone fixture: a tree with everything a copy can lose, and a comparable manifest.
// ---------------------------------------------------------------------------------------

/// The fixture's names, relative to its directory.
pub mod fixture {
    /// 1001:1001, 0640, text.
    pub const OWNER_A: &str = "owner-a.txt";
    /// 2002:3003, 0755, a script.
    pub const OWNER_B: &str = "owner-b.sh";
    /// 1001:1001, 0600.
    pub const SECRET: &str = "secret.key";
    /// 2002:3003, 0644, no bytes.
    pub const EMPTY: &str = "empty";
    /// Directory 1001:1001, 0750.
    pub const SUBDIR: &str = "sub";
    /// 1001:1001, 0644, inside [`SUBDIR`].
    pub const NESTED: &str = "sub/nested.txt";
    /// Two names of one inode (2002:3003, 0644), in different directories.
    pub const HARD_LINK: &str = "linked-1";
    pub const HARD_LINK_2: &str = "sub/linked-2";
    /// A relative symlink (owned 1001:1001) to [`OWNER_A`].
    pub const SYMLINK: &str = "sub/to-owner-a";
    pub const SYMLINK_TARGET: &str = "../owner-a.txt";
    /// 64 MiB apparent, two 4 KiB data extents, holes elsewhere; 1001:1001, 0644.
    pub const SPARSE: &str = "sparse.img";
    pub const SPARSE_SIZE: u64 = 64 << 20;
    pub const SPARSE_EXTENTS: [u64; 2] = [1 << 20, 40 << 20];
    pub const EXTENT_LEN: usize = 4096;

    /// Every name the fixture makes, parents before children.
    pub const NAMES: [&str; 10] = [
        OWNER_A,
        OWNER_B,
        SECRET,
        EMPTY,
        SUBDIR,
        NESTED,
        HARD_LINK,
        HARD_LINK_2,
        SYMLINK,
        SPARSE,
    ];

    /// The bytes of the sparse file's `index`th extent.
    pub fn extent_bytes(index: usize) -> Vec<u8> {
        (0..EXTENT_LEN)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(index as u8 + 1) | 1)
            .collect()
    }
}

fn join(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}

/// Makes the clone fixture under `dir` (a volume's path inside the export, which must
/// exist): files with distinct owners and modes, a directory, a hard-link pair, a relative
/// symlink, a sparse file and an empty file (see [`fixture`]). Files are created by
/// `client` (root, so any `dir` works) and then chowned; the directory and the symlink,
/// which libnfs 4.0 cannot chown over NFSv4, are made by their owners
/// ([`NfsClient::mkdir_owned`], [`NfsClient::symlink_owned`]), so the export's root must
/// be searchable by others.
pub fn write_fixture_tree(client: &NfsClient, dir: &str) -> anyhow::Result<()> {
    use fixture::*;
    let at = |name: &str| join(dir, name);
    client.write_file(&at(OWNER_A), b"owned by 1001, mode 0640\n", 0o640)?;
    client.write_file(&at(OWNER_B), b"#!/bin/sh\necho owned by 2002:3003\n", 0o755)?;
    client.write_file(&at(SECRET), b"not for others\n", 0o600)?;
    client.write_file(&at(EMPTY), b"", 0o644)?;
    client.mkdir_owned(&at(SUBDIR), 0o750, 1001, 1001)?;
    client.write_file(&at(NESTED), b"a file in a 0750 directory\n", 0o644)?;
    client.write_file(&at(HARD_LINK), b"one inode, two names\n", 0o644)?;
    client.hard_link(&at(HARD_LINK), &at(HARD_LINK_2))?;
    client.symlink_owned(SYMLINK_TARGET, &at(SYMLINK), 1001, 1001)?;
    let extents: Vec<(u64, Vec<u8>)> = SPARSE_EXTENTS
        .iter()
        .enumerate()
        .map(|(i, offset)| (*offset, extent_bytes(i)))
        .collect();
    let extents: Vec<(u64, &[u8])> = extents.iter().map(|(o, b)| (*o, b.as_slice())).collect();
    client.write_sparse(&at(SPARSE), SPARSE_SIZE, &extents, 0o644)?;

    for name in [OWNER_A, SECRET, NESTED, SPARSE] {
        client.chown(&at(name), 1001, 1001)?;
    }
    for name in [OWNER_B, EMPTY, HARD_LINK] {
        client.chown(&at(name), 2002, 3003)?;
    }
    Ok(())
}

/// A file's content in a form that compares and prints well.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Content {
    /// Small UTF-8 files, verbatim.
    Text(String),
    /// Anything else: its length, a 64-bit FNV-1a hash of every byte, and the offsets of
    /// its 4 KiB blocks that are not all zeros (where a sparse file has data).
    Digest {
        len: u64,
        fnv1a: u64,
        nonzero_blocks: Vec<u64>,
    },
}

/// Largest file whose text is kept verbatim.
const TEXT_LIMIT: usize = 4096;
/// Unit of [`Content::Digest::nonzero_blocks`].
const BLOCK: usize = 4096;
/// Files this large report whether they have holes.
const HOLE_CHECK_MIN: u64 = 1 << 20;

impl Content {
    fn of(bytes: &[u8]) -> Self {
        if bytes.len() <= TEXT_LIMIT
            && let Ok(text) = std::str::from_utf8(bytes)
        {
            return Self::Text(text.to_owned());
        }
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in bytes {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        let nonzero_blocks = bytes
            .chunks(BLOCK)
            .enumerate()
            .filter(|(_, block)| block.iter().any(|b| *b != 0))
            .map(|(i, _)| (i * BLOCK) as u64)
            .collect();
        Self::Digest {
            len: bytes.len() as u64,
            fnv1a: hash,
            nonzero_blocks,
        }
    }
}

/// One name of a tree, everything a faithful copy keeps (inode numbers and times aside).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManifestEntry {
    pub kind: FileKind,
    /// `mode & 0o7777`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Size of files and symlinks; `None` for directories (it depends on the filesystem).
    pub size: Option<u64>,
    /// Link count of non-directories (a directory's depends on the filesystem).
    pub nlink: Option<u64>,
    pub content: Option<Content>,
    pub symlink_target: Option<String>,
    /// For files of at least 1 MiB: whether less than half of the size is allocated.
    pub has_holes: Option<bool>,
}

/// A tree as a comparable value: `assert_eq!(source, clone)` shows what differs.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeManifest {
    /// Relative path to entry, sorted; the tree's root itself is not included.
    pub entries: BTreeMap<String, ManifestEntry>,
    /// Sets of names that are one inode, each sorted, sorted.
    pub hard_links: Vec<Vec<String>>,
}

/// What the manifest needs of a tree: std::fs on the server side, or a client over NFS.
trait TreeReader {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat>;
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>>;
    fn readlink(&self, path: &str) -> anyhow::Result<String>;
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>>;
}

impl TreeReader for NfsClient {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat> {
        NfsClient::lstat(self, path)
    }
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>> {
        self.read_dir(dir)
    }
    fn readlink(&self, path: &str) -> anyhow::Result<String> {
        NfsClient::readlink(self, path)
    }
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        self.read_file(path)
    }
}

/// The server's own view of a directory, through std::fs.
struct LocalTree;

impl TreeReader for LocalTree {
    fn lstat(&self, path: &str) -> anyhow::Result<NfsStat> {
        local_stat(Path::new(path))
    }
    fn names(&self, dir: &str) -> anyhow::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    }
    fn readlink(&self, path: &str) -> anyhow::Result<String> {
        Ok(std::fs::read_link(path)?.to_string_lossy().into_owned())
    }
    fn read(&self, path: &str) -> anyhow::Result<Vec<u8>> {
        Ok(std::fs::read(path)?)
    }
}

/// `lstat` on the server side, in [`NfsStat`]'s terms (`used_bytes` is `st_blocks * 512`).
pub fn local_stat(path: &Path) -> anyhow::Result<NfsStat> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(path)
        .map_err(|e| anyhow::anyhow!("lstat {}: {e}", path.display()))?;
    let time = |sec: i64, nsec: i64| Timestamp {
        sec,
        nsec: nsec as u32,
    };
    Ok(NfsStat {
        kind: FileKind::from_mode(meta.mode()),
        mode: meta.mode() & 0o7777,
        raw_mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        nlink: meta.nlink(),
        ino: meta.ino(),
        size: meta.size(),
        used_bytes: meta.blocks() * 512,
        blocks: meta.blocks(),
        blksize: meta.blksize(),
        atime: time(meta.atime(), meta.atime_nsec()),
        mtime: time(meta.mtime(), meta.mtime_nsec()),
        ctime: time(meta.ctime(), meta.ctime_nsec()),
    })
}

fn snapshot<R: TreeReader>(reader: &R, root: &str) -> anyhow::Result<TreeManifest> {
    let mut manifest = TreeManifest::default();
    let mut inodes: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    let mut pending = vec![String::new()];
    while let Some(relative_dir) = pending.pop() {
        let dir = if relative_dir.is_empty() {
            root.to_owned()
        } else {
            join(root, &relative_dir)
        };
        for name in reader.names(&dir)? {
            let relative = if relative_dir.is_empty() {
                name.clone()
            } else {
                format!("{relative_dir}/{name}")
            };
            let path = join(&dir, &name);
            let stat = reader.lstat(&path)?;
            let is_dir = stat.kind == FileKind::Directory;
            let mut entry = ManifestEntry {
                kind: stat.kind,
                mode: stat.mode,
                uid: stat.uid,
                gid: stat.gid,
                size: (!is_dir).then_some(stat.size),
                nlink: (!is_dir).then_some(stat.nlink),
                content: None,
                symlink_target: None,
                has_holes: None,
            };
            match stat.kind {
                FileKind::Directory => pending.push(relative.clone()),
                FileKind::Symlink => entry.symlink_target = Some(reader.readlink(&path)?),
                FileKind::File => {
                    entry.content = Some(Content::of(&reader.read(&path)?));
                    if stat.size >= HOLE_CHECK_MIN {
                        entry.has_holes = Some(stat.used_bytes < stat.size / 2);
                    }
                }
                FileKind::Other(_) => {}
            }
            if !is_dir && stat.nlink > 1 {
                inodes.entry(stat.ino).or_default().push(relative.clone());
            }
            manifest.entries.insert(relative, entry);
        }
    }
    manifest.hard_links = inodes
        .into_values()
        .filter(|names| names.len() > 1)
        .map(|mut names| {
            names.sort();
            names
        })
        .collect();
    manifest.hard_links.sort();
    Ok(manifest)
}

/// Reads the tree under `dir` through NFS into a [`TreeManifest`]. Names come from
/// `readdir` (libnfs's `nfs_readdir`), so anything in the tree shows, not only the
/// fixture's names; `dir`'s own attributes are left out.
pub fn snapshot_tree(client: &NfsClient, dir: &str) -> anyhow::Result<TreeManifest> {
    snapshot(client, dir)
}

/// As [`snapshot_tree`], on the server side with std::fs (for a tree inside an export).
pub fn snapshot_local_tree(dir: &Path) -> anyhow::Result<TreeManifest> {
    let dir = dir
        .to_str()
        .ok_or_else(|| anyhow::anyhow!("{} is not UTF-8", dir.display()))?;
    snapshot(&LocalTree, dir)
}

/// Apparent size and allocated bytes (NFSv4 `space_used`) of the fixture's sparse file,
/// so a test can check its holes survived a copy.
pub fn sparse_usage(client: &NfsClient, dir: &str) -> anyhow::Result<(u64, u64)> {
    let stat = client.lstat(&join(dir, fixture::SPARSE))?;
    Ok((stat.size, stat.used_bytes))
}

#[cfg(test)]
mod tests {
    use super::fixture::*;
    use super::*;
    use crate::nfs::NfsServer;
    use std::os::unix::fs::MetadataExt;

    /// Why this machine cannot run a real server and libnfs, if it cannot.
    fn missing_prerequisite() -> Option<String> {
        let on_path = std::env::var_os("PATH").is_some_and(|path| {
            std::env::split_paths(&path).any(|dir| dir.join("ganesha.nfsd").is_file())
        });
        if !on_path {
            return Some(
                "ganesha.nfsd not installed (Debian: nfs-ganesha, nfs-ganesha-vfs)".into(),
            );
        }
        let vfs = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .any(|dir| dir.path().join("ganesha/libfsalvfs.so").exists());
        if !vfs {
            return Some("ganesha's VFS backend not installed (Debian: nfs-ganesha-vfs)".into());
        }
        if !rustix::process::geteuid().is_root() {
            return Some("ganesha exporting with real owners needs root".into());
        }
        available().err()
    }

    struct Setup {
        // Dropped first: the server outlives nothing that talks to it.
        client: NfsClient,
        nfs: NfsServer,
        root: std::path::PathBuf,
        _base: tempfile::TempDir,
    }

    async fn setup(test: &str) -> anyhow::Result<Option<Setup>> {
        if let Some(reason) = missing_prerequisite() {
            nfsprov_test_skip::skip(test, &reason);
            return Ok(None);
        }
        let base = tempfile::tempdir()?;
        let root = base.path().join("export");
        std::fs::create_dir(&root)?;
        let nfs = NfsServer::start(&[&root]).await?;
        let export = root.to_str().expect("a UTF-8 temp path").to_owned();
        let client = NfsClient::connect("127.0.0.1", nfs.port(), &export)
            .map_err(|e| anyhow::anyhow!("{e:#}; ganesha log:\n{}", nfs.log_text()))?;
        Ok(Some(Setup {
            client,
            nfs,
            root,
            _base: base,
        }))
    }

    #[test]
    fn a_missing_library_is_named_with_its_package() {
        let error = load("libnfs.so.0.does-not-exist")
            .err()
            .expect("no such library");
        assert!(
            error.starts_with("libnfs.so.0.does-not-exist not found: install libnfs13 (Debian"),
            "{error}"
        );
    }

    #[test]
    fn the_transcribed_layouts_have_libnfs_4_sizes() {
        // Seventeen uint64_t; the dirent prefix is three 8-byte fields on LP64.
        assert_eq!(std::mem::size_of::<RawStat64>(), 17 * 8);
        assert_eq!(std::mem::offset_of!(RawStat64, nfs_used), 16 * 8);
        assert_eq!(std::mem::offset_of!(RawDirentPrefix, inode), 16);
        assert_eq!(std::mem::size_of::<RawUrl>(), 3 * 8);
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn libnfs_fixture_tree_is_real_on_the_server_and_reads_back() -> anyhow::Result<()> {
        let test = "libnfs_fixture_tree_is_real_on_the_server_and_reads_back";
        // Kept whole: its fields drop in order, the client before the server.
        let Some(setup) = setup(test).await? else {
            return Ok(());
        };
        let (client, nfs, root) = (&setup.client, &setup.nfs, &setup.root);
        client.mkdir("vol", 0o770)?;
        write_fixture_tree(client, "/vol")
            .map_err(|e| anyhow::anyhow!("{e:#}; ganesha log:\n{}", nfs.log_text()))?;
        let on_disk = root.join("vol");
        let meta = |name: &str| std::fs::symlink_metadata(on_disk.join(name)).unwrap();

        // Owners and modes, as the server's filesystem has them.
        let owner_mode = |name: &str| {
            let m = meta(name);
            (m.uid(), m.gid(), m.mode() & 0o7777)
        };
        assert_eq!(owner_mode(OWNER_A), (1001, 1001, 0o640));
        assert_eq!(owner_mode(OWNER_B), (2002, 3003, 0o755));
        assert_eq!(owner_mode(SECRET), (1001, 1001, 0o600));
        assert_eq!(owner_mode(EMPTY), (2002, 3003, 0o644));
        assert_eq!(owner_mode(NESTED), (1001, 1001, 0o644));
        assert_eq!(owner_mode(SPARSE), (1001, 1001, 0o644));
        assert_eq!(owner_mode(SUBDIR), (1001, 1001, 0o750));
        assert!(meta(SUBDIR).is_dir());
        assert_eq!(
            std::fs::read(on_disk.join(OWNER_A))?,
            b"owned by 1001, mode 0640\n"
        );
        assert_eq!(meta(EMPTY).len(), 0);

        // One inode, two names.
        assert_eq!(meta(HARD_LINK).ino(), meta(HARD_LINK_2).ino());
        assert_eq!(meta(HARD_LINK).nlink(), 2);
        assert_eq!(
            (meta(HARD_LINK_2).uid(), meta(HARD_LINK_2).gid()),
            (2002, 3003)
        );

        // A relative symlink, itself owned by 1001, resolving to owner-a.txt.
        assert!(meta(SYMLINK).file_type().is_symlink());
        assert_eq!(
            std::fs::read_link(on_disk.join(SYMLINK))?,
            Path::new(SYMLINK_TARGET)
        );
        assert_eq!((meta(SYMLINK).uid(), meta(SYMLINK).gid()), (1001, 1001));
        assert_eq!(
            std::fs::read(on_disk.join(SYMLINK))?,
            std::fs::read(on_disk.join(OWNER_A))?
        );

        // 64 MiB apparent, two 4 KiB extents allocated (a filesystem may round up a bit).
        let sparse = meta(SPARSE);
        assert_eq!(sparse.len(), SPARSE_SIZE);
        assert!(
            sparse.blocks() * 512 <= 1 << 20,
            "the sparse file occupies {} bytes on the server",
            sparse.blocks() * 512
        );
        let bytes = std::fs::read(on_disk.join(SPARSE))?;
        for (i, offset) in SPARSE_EXTENTS.iter().enumerate() {
            let at = *offset as usize;
            assert_eq!(&bytes[at..at + EXTENT_LEN], extent_bytes(i).as_slice());
        }
        assert_eq!(bytes.iter().filter(|b| **b != 0).count(), 2 * EXTENT_LEN);

        // Through NFS, the same tree: every attribute as the server's filesystem says.
        let over_nfs = snapshot_tree(client, "vol")?;
        let server_side = snapshot_local_tree(&on_disk)?;
        assert_eq!(over_nfs, server_side);
        let mut names: Vec<&str> = over_nfs.entries.keys().map(String::as_str).collect();
        names.sort();
        let mut expected = NAMES.to_vec();
        expected.sort();
        assert_eq!(names, expected);
        assert_eq!(
            over_nfs.hard_links,
            vec![vec![HARD_LINK.to_owned(), HARD_LINK_2.to_owned()]]
        );
        assert_eq!(
            over_nfs.entries[SPARSE].content,
            Some(Content::Digest {
                len: SPARSE_SIZE,
                fnv1a: match Content::of(&bytes) {
                    Content::Digest { fnv1a, .. } => fnv1a,
                    Content::Text(_) => unreachable!(),
                },
                nonzero_blocks: SPARSE_EXTENTS.to_vec(),
            })
        );
        assert_eq!(over_nfs.entries[SPARSE].has_holes, Some(true));

        // lstat over NFS agrees with the server's own, field by field.
        for name in NAMES {
            let remote = client.lstat(&format!("vol/{name}"))?;
            let local = local_stat(&on_disk.join(name))?;
            assert_eq!(
                (
                    remote.kind,
                    remote.raw_mode,
                    remote.uid,
                    remote.gid,
                    remote.nlink,
                    remote.ino
                ),
                (
                    local.kind,
                    local.raw_mode,
                    local.uid,
                    local.gid,
                    local.nlink,
                    local.ino
                ),
                "{name}"
            );
            if remote.kind != FileKind::Directory {
                assert_eq!(remote.size, local.size, "{name}");
            }
            assert_eq!(remote.mtime, local.mtime, "{name}");
        }
        let (apparent, used) = sparse_usage(client, "vol")?;
        assert_eq!(apparent, SPARSE_SIZE);
        assert_eq!(
            used,
            sparse.blocks() * 512,
            "space_used is the server's st_blocks"
        );
        assert!(used < SPARSE_SIZE / 16);
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn libnfs_identities_times_ranges_and_errors() -> anyhow::Result<()> {
        let test = "libnfs_identities_times_ranges_and_errors";
        let Some(setup) = setup(test).await? else {
            return Ok(());
        };
        let (client, root) = (&setup.client, &setup.root);
        client.mkdir("shared", 0o777)?;
        assert_eq!(
            std::fs::metadata(root.join("shared"))?.mode() & 0o7777,
            0o777,
            "no umask applies"
        );

        // A user's files are theirs, with the mode they asked for.
        let user = client.as_user(1001, 1001)?;
        assert_eq!(user.identity(), (1001, 1001));
        user.write_file("shared/mine", b"first version, longer", 0o640)?;
        user.write_file("shared/mine", b"second", 0o604)?;
        let on_disk = std::fs::metadata(root.join("shared/mine"))?;
        assert_eq!(
            (on_disk.uid(), on_disk.gid(), on_disk.mode() & 0o7777),
            (1001, 1001, 0o604)
        );
        assert_eq!(std::fs::read(root.join("shared/mine"))?, b"second");
        user.mkdir("shared/user-dir", 0o700)?;
        let dir_meta = std::fs::metadata(root.join("shared/user-dir"))?;
        assert_eq!((dir_meta.uid(), dir_meta.mode() & 0o7777), (1001, 0o700));

        // The server checks permissions against the identity: errno comes back.
        let stranger = client.as_user(2002, 3003)?;
        let denied = stranger
            .write_file("shared/user-dir/intruder", b"x", 0o644)
            .expect_err("0700 directory of another user");
        let errno = denied.downcast_ref::<NfsError>().map(|e| e.errno);
        assert_eq!(errno, Some(libc::EACCES), "{denied:#}");
        let refused = user
            .chown("shared/mine", 2002, 3003)
            .expect_err("only root gives files away");
        assert_eq!(
            refused.downcast_ref::<NfsError>().map(|e| e.errno),
            Some(libc::EPERM),
            "{refused:#}"
        );
        let missing = client
            .lstat("shared/nothing-here")
            .expect_err("no such file");
        assert_eq!(
            missing.downcast_ref::<NfsError>().map(|e| e.errno),
            Some(libc::ENOENT),
            "{missing:#}"
        );

        // Ranges and a large file crossing many read and write chunks.
        let big: Vec<u8> = (0..(1 << 20) + 123).map(|i: u32| (i % 251) as u8).collect();
        client.write_file("shared/big", &big, 0o644)?;
        assert_eq!(std::fs::read(root.join("shared/big"))?, big);
        assert_eq!(client.read_file("shared/big")?, big);
        assert_eq!(
            client.read_range("shared/big", 700_001, 10)?,
            big[700_001..700_011]
        );
        assert_eq!(
            client.read_range("shared/big", big.len() as u64 - 3, 100)?,
            big[big.len() - 3..]
        );
        client.write_at("shared/big", 7, b"XYZ")?;
        assert_eq!(
            client.read_range("shared/big", 6, 5)?,
            [big[6], b'X', b'Y', b'Z', big[10]]
        );
        client.truncate("shared/big", 4)?;
        assert_eq!(std::fs::read(root.join("shared/big"))?, big[..4]);

        // Times: set, seen on the server and read back through NFS with nanoseconds.
        let atime = Timestamp {
            sec: 1_600_000_000,
            nsec: 0,
        };
        let mtime = Timestamp {
            sec: 1_500_000_000,
            nsec: 250_000_000,
        };
        client.set_times("shared/mine", atime, mtime)?;
        let on_disk = std::fs::metadata(root.join("shared/mine"))?;
        assert_eq!(
            (on_disk.mtime(), on_disk.mtime_nsec()),
            (1_500_000_000, 250_000_000)
        );
        assert_eq!(on_disk.atime(), 1_600_000_000);
        let stat = client.lstat("shared/mine")?;
        assert_eq!((stat.mtime, stat.atime), (mtime, atime));

        // stat follows a symlink, lstat does not; lchmod of a file.
        client.symlink("mine", "shared/link")?;
        assert_eq!(client.readlink("shared/link")?, "mine");
        assert_eq!(client.lstat("shared/link")?.kind, FileKind::Symlink);
        assert_eq!(client.lstat("shared/link")?.size, 4);
        let followed = client.stat("shared/link")?;
        assert_eq!(
            (followed.kind, followed.uid, followed.size),
            (FileKind::File, 1001, 6)
        );
        client
            .lchmod("shared/renamed-later", 0o640)
            .expect_err("no such file");
        client.write_file("shared/plain", b"", 0o600)?;
        client.lchmod("shared/plain", 0o664)?;
        assert_eq!(
            std::fs::metadata(root.join("shared/plain"))?.mode() & 0o7777,
            0o664
        );

        // What libnfs 4.0 over NFSv4 gets wrong is refused before it happens: attributes
        // of a directory, and l-variants on a symlink (they would change its target).
        let unsupported = |result: anyhow::Result<()>| {
            let error = result.expect_err("refused");
            assert_eq!(
                error.downcast_ref::<NfsError>().map(|e| e.errno),
                Some(libc::EOPNOTSUPP),
                "{error:#}"
            );
        };
        unsupported(client.chmod("shared/user-dir", 0o755));
        unsupported(client.chown("shared/user-dir", 0, 0));
        unsupported(client.set_times("shared/user-dir", atime, mtime));
        unsupported(client.lchown("shared/link", 0, 0));
        unsupported(client.lchmod("shared/link", 0o600));
        let target = std::fs::metadata(root.join("shared/mine"))?;
        assert_eq!((target.uid(), target.mode() & 0o7777), (1001, 0o604));
        // Owned directories and symlinks are made by their owners instead.
        client.mkdir_owned("shared/owned-dir", 0o1751, 2002, 3003)?;
        let owned = std::fs::metadata(root.join("shared/owned-dir"))?;
        assert_eq!(
            (owned.uid(), owned.gid(), owned.mode() & 0o7777),
            (2002, 3003, 0o1751)
        );
        client.symlink_owned("../elsewhere", "shared/owned-dir/link", 1001, 1001)?;
        let link = std::fs::symlink_metadata(root.join("shared/owned-dir/link"))?;
        assert!(link.file_type().is_symlink());
        assert_eq!((link.uid(), link.gid()), (1001, 1001));
        assert_eq!(
            std::fs::read_link(root.join("shared/owned-dir/link"))?,
            Path::new("../elsewhere")
        );
        let leftovers: Vec<_> = std::fs::read_dir(root)?
            .map(|e| e.unwrap().file_name())
            .filter(|name| name.to_string_lossy().starts_with(".nfsprov-e2e-staging"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");

        // Listings carry the server's names; lstat its inode numbers.
        let listed = client.read_dir("shared")?;
        let mut expected: Vec<String> = std::fs::read_dir(root.join("shared"))?
            .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        expected.sort();
        assert_eq!(listed, expected);
        for name in &listed {
            assert_eq!(
                client.lstat(&format!("shared/{name}"))?.ino,
                std::fs::symlink_metadata(root.join("shared").join(name))?.ino(),
                "{name}"
            );
        }

        // Rename, unlink, rmdir, and what the server sees of them.
        client.rename("shared/mine", "shared/renamed")?;
        assert!(root.join("shared/renamed").exists() && !root.join("shared/mine").exists());
        client.unlink("shared/renamed")?;
        client.unlink("shared/link")?;
        client.unlink("shared/plain")?;
        client.unlink("shared/big")?;
        client.rmdir("shared/user-dir")?;
        assert!(!root.join("shared/user-dir").exists());
        client.unlink("shared/owned-dir/link")?;
        client.rmdir("shared/owned-dir")?;
        assert_eq!(client.read_dir("shared")?, Vec::<String>::new());
        Ok(())
    }
}
