//! What the checker's tests share: small crates written to a temporary directory.

use std::path::PathBuf;

/// Writes `files` (relative path, text) into a temporary crate and returns its root file.
pub fn write_crate(files: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }
    let root = dir.path().join("src/lib.rs");
    (dir, root)
}
