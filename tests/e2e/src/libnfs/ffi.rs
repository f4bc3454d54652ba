//! The C side: libnfs 4.0.0's declarations, transcribed, and the library loaded at run
//! time.

use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::OnceLock;

/// The soname of libnfs 4.x, the only ABI this module speaks.
pub const LIBRARY: &str = "libnfs.so.13";

/// `struct nfs_context` (opaque).
#[repr(C)]
pub(super) struct RawContext {
    pub(super) _private: [u8; 0],
}

/// `struct nfsfh` (opaque).
#[repr(C)]
pub(super) struct RawFh {
    pub(super) _private: [u8; 0],
}

/// `struct nfsdir` (opaque).
#[repr(C)]
pub(super) struct RawDir {
    pub(super) _private: [u8; 0],
}

/// `struct nfs_url { char *server; char *path; char *file; };` (libnfs 4.0; libnfs 6 added
/// an `int port` after `server`).
#[repr(C)]
pub(super) struct RawUrl {
    pub(super) server: *mut c_char,
    pub(super) path: *mut c_char,
    pub(super) file: *mut c_char,
}

/// `struct nfs_stat_64`: seventeen `uint64_t`, in this order, in libnfs 4.0.
#[repr(C)]
#[derive(Default)]
pub(super) struct RawStat64 {
    pub(super) nfs_dev: u64,
    pub(super) nfs_ino: u64,
    pub(super) nfs_mode: u64,
    pub(super) nfs_nlink: u64,
    pub(super) nfs_uid: u64,
    pub(super) nfs_gid: u64,
    pub(super) nfs_rdev: u64,
    pub(super) nfs_size: u64,
    pub(super) nfs_blksize: u64,
    pub(super) nfs_blocks: u64,
    pub(super) nfs_atime: u64,
    pub(super) nfs_mtime: u64,
    pub(super) nfs_ctime: u64,
    pub(super) nfs_atime_nsec: u64,
    pub(super) nfs_mtime_nsec: u64,
    pub(super) nfs_ctime_nsec: u64,
    pub(super) nfs_used: u64,
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
pub(super) struct RawDirentPrefix {
    pub(super) next: *mut RawDirentPrefix,
    pub(super) name: *mut c_char,
    pub(super) inode: u64,
}

macro_rules! libnfs_api {
    ($( $(#[$doc:meta])* $name:ident : fn($($arg:ty),*) $(-> $ret:ty)?; )*) => {
        /// Entry points of libnfs, resolved once with `dlsym`.
        pub(super) struct Api {
            $( $(#[$doc])* pub(super) $name: unsafe extern "C" fn($($arg),*) $(-> $ret)?, )*
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

pub(super) fn dlerror_text() -> String {
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
pub(super) fn load(library: &str) -> Result<Api, String> {
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

pub(super) fn api() -> anyhow::Result<&'static Api> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| load(LIBRARY))
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

/// Whether libnfs can be loaded here, and if not, why (for tests that skip without it).
pub fn available() -> Result<(), String> {
    api().map(drop).map_err(|e| e.to_string())
}
