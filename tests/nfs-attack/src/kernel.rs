//! The kernel's own file handle of a path on the server, as ganesha gets it.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::handle::KernelHandle;

/// Longest handle asked for: ganesha's own limit (btrfs needs 40 bytes).
const MAX_HANDLE: usize = 48;

#[repr(C)]
struct FileHandleBuffer {
    handle_bytes: libc::c_uint,
    handle_type: libc::c_int,
    f_handle: [u8; MAX_HANDLE],
}

/// `name_to_handle_at(AT_FDCWD, path, ..., 0)`: the kernel handle of `path` (not
/// following a final symlink) and the id of the mount it is on.
pub fn name_to_handle(path: &Path) -> std::io::Result<(KernelHandle, i32)> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    let mut buffer = FileHandleBuffer {
        handle_bytes: MAX_HANDLE as libc::c_uint,
        handle_type: 0,
        f_handle: [0; MAX_HANDLE],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: `path` is NUL-terminated; `buffer` is a struct file_handle with room for
    // the MAX_HANDLE bytes its handle_bytes announces; `mount_id` is a valid int.
    #[allow(unsafe_code)]
    let rc = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            path.as_ptr(),
            (&raw mut buffer).cast::<libc::c_void>(),
            &raw mut mount_id,
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let len = (buffer.handle_bytes as usize).min(MAX_HANDLE);
    Ok((
        KernelHandle {
            handle_type: buffer.handle_type,
            bytes: buffer.f_handle[..len].to_vec(),
        },
        mount_id,
    ))
}
