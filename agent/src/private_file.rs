//! Whether a file that holds or grants a credential is the agent's alone: nobody else may
//! read it, write it or replace it. A token, a private key or the credentials file that
//! another user could write would hand out what it guards.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// What makes `path` unfit to hold a credential, in words an operator can act on; `None`
/// when it is the agent's alone.
pub(crate) fn problem(path: &Path) -> Option<String> {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) => return Some(e.to_string()),
    };
    let mode = meta.mode() & 0o7777;
    if mode & 0o077 != 0 {
        return Some(format!(
            "group or others may read or write it (mode {mode:04o}); run chmod 600 {}",
            path.display()
        ));
    }
    let agent = rustix::process::geteuid().as_raw();
    if meta.uid() != agent && meta.uid() != 0 {
        return Some(format!(
            "it belongs to uid {}, neither the agent's user ({agent}) nor root",
            meta.uid()
        ));
    }
    if let Some(dir) = path.parent().and_then(|d| std::fs::metadata(d).ok()) {
        let dir_mode = dir.mode() & 0o7777;
        // Anyone who can write the directory can replace the file.
        if dir_mode & 0o022 != 0 && dir_mode & 0o1000 == 0 {
            return Some(format!(
                "its directory is writable by group or others (mode {dir_mode:04o}), so the file can be replaced; run chmod go-w on it"
            ));
        }
    }
    None
}
