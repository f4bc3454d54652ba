//! A small secret file (a token) whose content is re-read whenever it changes on disk, so
//! that a rotated token (or a Kubernetes Secret swapped under a mount) takes effect
//! without a restart.
//!
//! Whoever asks for the content gets the last good one from memory: the file is watched
//! and read by a thread of its own, so no request ever waits on the disk or on a lock
//! held during a read. Only a regular file of bounded size is read (checked on the opened
//! file, which is opened without blocking): a FIFO, a device such as `/dev/zero` or an
//! oversized file put in its place is refused, logged once, and the last good content
//! stays. A file that is gone yields nothing, so removing it revokes what it held.

use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, SystemTime};

use rustix::fs::{Mode, OFlags};

/// The largest token file read.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;

/// The largest certificate or key file (PEM) read.
pub const MAX_PEM_BYTES: u64 = 1024 * 1024;

/// How often a watched file is looked at.
const POLL_INTERVAL: Duration = Duration::from_secs(1);

/// Reads `path` when it is a regular file of at most `max_bytes`. The open never blocks
/// (a FIFO without a writer would otherwise hold it for ever) and the checks are made on
/// the opened file, so a swap between a check and the read cannot slip anything past.
pub fn read_bounded(path: &Path, max_bytes: u64) -> io::Result<Vec<u8>> {
    read_bounded_with_stamp(path, max_bytes).map(|(bytes, _)| bytes)
}

fn read_bounded_with_stamp(path: &Path, max_bytes: u64) -> io::Result<(Vec<u8>, Stamp)> {
    let fd = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let file = std::fs::File::from(fd);
    let meta = file.metadata()?;
    if !meta.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("not a regular file (a {})", kind(&meta)),
        ));
    }
    let too_large = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("larger than {max_bytes} bytes"),
        )
    };
    if meta.len() > max_bytes {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    // The file may grow between the check and the read: never more than the cap is read.
    file.take(max_bytes + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max_bytes {
        return Err(too_large());
    }
    Ok((bytes, Stamp::of(&meta)))
}

fn kind(meta: &std::fs::Metadata) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    let kind = meta.file_type();
    if kind.is_dir() {
        "directory"
    } else if kind.is_fifo() {
        "FIFO"
    } else if kind.is_char_device() {
        "character device"
    } else if kind.is_block_device() {
        "block device"
    } else if kind.is_socket() {
        "socket"
    } else {
        "special file"
    }
}

/// What identifies one version of the file without reading it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    dev: u64,
    ino: u64,
    len: u64,
    modified: Option<SystemTime>,
}

impl Stamp {
    fn of(meta: &std::fs::Metadata) -> Self {
        Self {
            dev: meta.dev(),
            ino: meta.ino(),
            len: meta.len(),
            modified: meta.modified().ok(),
        }
    }
}

/// The file's content as last read, and what was last seen on disk.
#[derive(Debug, Default)]
struct State {
    content: Option<Arc<Vec<u8>>>,
    /// The version `content` came from, or the last version refused (logged once).
    seen: Option<Stamp>,
    /// Why there is no content: the file is gone.
    gone: Option<String>,
}

#[derive(Debug)]
struct Shared {
    path: PathBuf,
    max_bytes: u64,
    state: Mutex<State>,
}

impl Shared {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Re-reads the file if it changed since it was last seen. The lock is taken only to
    /// compare and to store, never while reading.
    fn refresh(&self) {
        let stamp = match std::fs::metadata(&self.path) {
            Ok(meta) => Stamp::of(&meta),
            Err(e) => return self.lost(e),
        };
        if self.state().seen == Some(stamp) {
            return;
        }
        match read_bounded_with_stamp(&self.path, self.max_bytes) {
            Ok((bytes, read)) => {
                let mut state = self.state();
                state.content = Some(Arc::new(bytes));
                state.seen = Some(read);
                state.gone = None;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => self.lost(e),
            Err(e) => {
                self.state().seen = Some(stamp);
                tracing::warn!(
                    path = %self.path.display(),
                    error = %e,
                    "cannot use the file's new content; keeping the last good content"
                );
            }
        }
    }

    /// The file is gone (or its directory is): nothing it held is accepted any more.
    fn lost(&self, error: io::Error) {
        let mut state = self.state();
        if state.gone.is_some() {
            return;
        }
        state.content = None;
        state.seen = None;
        state.gone = Some(error.to_string());
        drop(state);
        tracing::warn!(path = %self.path.display(), %error, "file is gone; nothing it held is accepted until it is back");
    }
}

/// A file's content, kept current by a watcher thread that lives as long as it does.
#[derive(Debug)]
pub struct ReloadingFile {
    shared: Arc<Shared>,
}

impl ReloadingFile {
    /// Reads the file once, so that a missing, unreadable or unfit file is reported at
    /// start, then watches it.
    pub fn open(path: impl Into<PathBuf>, max_bytes: u64) -> io::Result<Self> {
        let path = path.into();
        let (bytes, stamp) = read_bounded_with_stamp(&path, max_bytes)?;
        let shared = Arc::new(Shared {
            path,
            max_bytes,
            state: Mutex::new(State {
                content: Some(Arc::new(bytes)),
                seen: Some(stamp),
                gone: None,
            }),
        });
        let watched = Arc::downgrade(&shared);
        std::thread::Builder::new()
            .name("reload-file".into())
            .spawn(move || watch(watched))?;
        Ok(Self { shared })
    }

    pub fn path(&self) -> &Path {
        &self.shared.path
    }

    /// The last good content; costs a lock and a reference count, no I/O.
    pub fn contents(&self) -> io::Result<Arc<Vec<u8>>> {
        let state = self.shared.state();
        match (&state.content, &state.gone) {
            (Some(bytes), _) => Ok(bytes.clone()),
            (None, gone) => Err(io::Error::new(
                io::ErrorKind::NotFound,
                gone.clone().unwrap_or_else(|| "no content".into()),
            )),
        }
    }

    /// The contents as a trimmed string (tokens are stored with a trailing newline).
    pub fn trimmed(&self) -> io::Result<String> {
        let bytes = self.contents()?;
        let text = std::str::from_utf8(&bytes)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "file is not UTF-8"))?;
        Ok(text.trim().to_owned())
    }
}

/// Looks at the file every [`POLL_INTERVAL`] until its [`ReloadingFile`] is dropped.
fn watch(file: Weak<Shared>) {
    loop {
        std::thread::sleep(POLL_INTERVAL);
        match file.upgrade() {
            Some(shared) => shared.refresh(),
            None => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// Waits (a few poll intervals at most) for the watcher to see what the test did.
    fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
        let deadline = Instant::now() + POLL_INTERVAL * 10;
        while !condition() {
            assert!(Instant::now() < deadline, "never: {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn picks_up_a_replaced_file_and_a_removal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let file = ReloadingFile::open(&path, MAX_TOKEN_BYTES).unwrap();
        assert_eq!(file.trimmed().unwrap(), "first");
        // Replace it the way Secrets and `install` do: a new inode renamed over the old one.
        let staged = dir.path().join("token.new");
        std::fs::write(&staged, "second-token\n").unwrap();
        std::fs::rename(&staged, &path).unwrap();
        eventually("the new content", || {
            file.trimmed().ok().as_deref() == Some("second-token")
        });
        std::fs::remove_file(&path).unwrap();
        eventually("the removal", || file.contents().is_err());
    }

    #[test]
    fn a_file_that_is_not_small_and_regular_keeps_the_last_good_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "good\n").unwrap();
        let file = ReloadingFile::open(&path, 16).unwrap();
        let swap = |make: &dyn Fn(&Path)| {
            let staged = dir.path().join("staged");
            make(&staged);
            std::fs::rename(&staged, &path).unwrap();
        };
        swap(&|p| {
            rustix::fs::mknodat(
                rustix::fs::CWD,
                p,
                rustix::fs::FileType::Fifo,
                Mode::from_raw_mode(0o600),
                0,
            )
            .unwrap()
        });
        // Seen once the watcher recorded the FIFO's version as refused.
        let fifo = Stamp::of(&std::fs::metadata(&path).unwrap());
        eventually("the FIFO looked at", || {
            file.shared.state().seen == Some(fifo)
        });
        assert_eq!(file.trimmed().unwrap(), "good");
        swap(&|p| std::os::unix::fs::symlink("/dev/zero", p).unwrap());
        let zero = Stamp::of(&std::fs::metadata(&path).unwrap());
        eventually("/dev/zero looked at", || {
            file.shared.state().seen == Some(zero)
        });
        assert_eq!(file.trimmed().unwrap(), "good");
        swap(&|p| std::fs::write(p, "x".repeat(17)).unwrap());
        let large = Stamp::of(&std::fs::metadata(&path).unwrap());
        eventually("the large file looked at", || {
            file.shared.state().seen == Some(large)
        });
        assert_eq!(file.trimmed().unwrap(), "good");
    }

    #[test]
    fn reading_refuses_what_is_not_a_small_regular_file() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let error = read_bounded(&fifo, 16).unwrap_err();
        assert!(error.to_string().contains("FIFO"), "{error}");
        let error = read_bounded(Path::new("/dev/zero"), 16).unwrap_err();
        assert!(error.to_string().contains("character device"), "{error}");
        let large = dir.path().join("large");
        std::fs::write(&large, [0u8; 17]).unwrap();
        let error = read_bounded(&large, 16).unwrap_err();
        assert!(error.to_string().contains("larger than 16"), "{error}");
        assert_eq!(read_bounded(&large, 17).unwrap().len(), 17);
        assert!(ReloadingFile::open(&fifo, 16).is_err());
    }

    #[test]
    fn missing_file_fails_at_open() {
        assert!(ReloadingFile::open("/nonexistent/token", MAX_TOKEN_BYTES).is_err());
    }
}
