//! A small file whose content is re-read whenever it changes on disk, so that a rotated
//! token (or a Kubernetes Secret swapped under a mount) takes effect without a restart.

use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

/// Caches a file's bytes and re-reads them when its inode, size or mtime change.
#[derive(Debug)]
pub struct ReloadingFile {
    path: PathBuf,
    cached: Mutex<Option<(Stamp, Arc<Vec<u8>>)>>,
}

impl ReloadingFile {
    /// Reads the file once, so that a missing or unreadable file is reported at start.
    pub fn open(path: impl Into<PathBuf>) -> io::Result<Self> {
        let file = Self {
            path: path.into(),
            cached: Mutex::new(None),
        };
        file.contents()?;
        Ok(file)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The current contents; costs one `stat` when the file has not changed.
    pub fn contents(&self) -> io::Result<Arc<Vec<u8>>> {
        let meta = std::fs::metadata(&self.path)?;
        let stamp = Stamp {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        };
        let mut cached = self.cached.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, bytes)) = cached.as_ref()
            && *seen == stamp
        {
            return Ok(bytes.clone());
        }
        let bytes = Arc::new(std::fs::read(&self.path)?);
        *cached = Some((stamp, bytes.clone()));
        Ok(bytes)
    }

    /// The contents as a trimmed string (tokens are stored with a trailing newline).
    pub fn trimmed(&self) -> io::Result<String> {
        let bytes = self.contents()?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file is not UTF-8"))?;
        Ok(text.trim().to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_up_a_replaced_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let file = ReloadingFile::open(&path).unwrap();
        assert_eq!(file.trimmed().unwrap(), "first");
        // Replace it the way Secrets and `install` do: a new inode renamed over the old one.
        let staged = dir.path().join("token.new");
        std::fs::write(&staged, "second-token\n").unwrap();
        std::fs::rename(&staged, &path).unwrap();
        assert_eq!(file.trimmed().unwrap(), "second-token");
        std::fs::remove_file(&path).unwrap();
        assert!(file.contents().is_err());
    }

    #[test]
    fn missing_file_fails_at_open() {
        assert!(ReloadingFile::open("/nonexistent/token").is_err());
    }
}
