//! Making acknowledged changes survive a power cut, with the syncs of concurrent requests
//! shared.
//!
//! Nothing the store changes is durable until the kernel has written it and the disk has
//! flushed it: a rename, a new directory or a record can be lost, and copied file data
//! can come back as zeros behind a size the journal already committed. So every request
//! that changed something names the directories it changed (and whose entries it
//! changed) and waits for them to be synced before it answers.
//!
//! Syncs are committed in groups: a request joins the group being gathered; one of the
//! waiting requests syncs everything the group names (each directory once), and every
//! request of the group gets the outcome. While one group is synced the next gathers,
//! so under load one sync covers many requests and the rate stays close to the rate
//! without syncs.
//!
//! On btrfs, renaming subvolumes and changing qgroup limits are committed only by a
//! transaction commit, which an `fsync` of a directory does not force; there a group is
//! made durable by `syncfs`, which commits the filesystem's transaction. Copied file data
//! is made durable by `syncfs` too ([`Durability::sync_filesystem`]): one call writes
//! back every file of a copy, however many, without reopening them.

use std::collections::HashSet;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, mpsc};

use super::error::{Result, StoreError, io_error};

/// `statfs` type of btrfs.
const BTRFS_MAGIC: i64 = 0x9123_683e;

/// Threads syncing one group's directories at once.
const MAX_SYNC_THREADS: usize = 32;

#[derive(Debug)]
pub(super) struct Durability {
    /// A descriptor of the export root, for `syncfs`.
    root: OwnedFd,
    /// Whether a group is synced by committing the whole filesystem (btrfs).
    whole_filesystem: bool,
    groups: Mutex<Groups>,
    done: Condvar,
    /// Started at the first group of directories to sync.
    pool: OnceLock<SyncPool>,
}

#[derive(Debug, Default)]
struct Groups {
    /// Directories the gathering group names.
    dirs: Vec<OwnedFd>,
    /// Whether the gathering group needs the whole filesystem synced.
    whole: bool,
    /// Whether a request is syncing a group now.
    syncing: bool,
    /// Where the gathering group's outcome is told: each request of the group holds it,
    /// so every one reads its own group's outcome however many groups follow, and it is
    /// gone with the last of them.
    outcome: Arc<OnceLock<std::result::Result<(), String>>>,
}

/// What a request changed and must be durable before it answers.
#[derive(Debug, Default)]
pub(super) struct Changes {
    dirs: Vec<OwnedFd>,
    whole: bool,
}

impl Changes {
    pub(super) fn new() -> Self {
        Self::default()
    }

    /// A directory whose entries or attributes changed.
    pub(super) fn dir(&mut self, dir: BorrowedFd<'_>) -> Result<&mut Self> {
        let owned = dir.try_clone_to_owned().map_err(|source| StoreError::Io {
            context: "keep a directory to sync".into(),
            source,
        })?;
        self.dirs.push(owned);
        Ok(self)
    }

    pub(super) fn owned(&mut self, dir: OwnedFd) -> &mut Self {
        self.dirs.push(dir);
        self
    }

    pub(super) fn extend(&mut self, dirs: impl IntoIterator<Item = OwnedFd>) -> &mut Self {
        self.dirs.extend(dirs);
        self
    }
}

impl Durability {
    pub(super) fn new(root: BorrowedFd<'_>) -> Result<Self> {
        let root = root.try_clone_to_owned().map_err(|source| StoreError::Io {
            context: "keep the export root to sync".into(),
            source,
        })?;
        let fs = rustix::fs::fstatfs(&root).map_err(|e| io_error("statfs export root", e))?;
        #[allow(clippy::unnecessary_cast, clippy::useless_conversion)]
        let whole_filesystem = i64::from(fs.f_type) == BTRFS_MAGIC;
        Ok(Self {
            root,
            whole_filesystem,
            groups: Mutex::default(),
            done: Condvar::new(),
            pool: OnceLock::new(),
        })
    }

    /// Writes back every file's data and commits the filesystem of the export root: what
    /// a copy wrote is on disk before the copy is renamed into place.
    pub(super) fn sync_filesystem(&self) -> Result<()> {
        self.commit(Changes {
            dirs: Vec::new(),
            whole: true,
        })
    }

    /// Returns once everything `changes` names is durable, synced together with the
    /// changes of the requests waiting at the same time.
    pub(super) fn commit(&self, changes: Changes) -> Result<()> {
        if changes.dirs.is_empty() && !changes.whole {
            return Ok(());
        }
        let mut groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
        groups.dirs.extend(changes.dirs);
        groups.whole |= changes.whole;
        let mine = groups.outcome.clone();
        loop {
            if let Some(outcome) = mine.get() {
                return outcome.clone().map_err(|error| StoreError::Io {
                    context: "make the change durable".into(),
                    source: std::io::Error::other(error),
                });
            }
            if !groups.syncing {
                groups.syncing = true;
                let dirs = std::mem::take(&mut groups.dirs);
                let whole = std::mem::take(&mut groups.whole);
                // The next requests gather into a new group.
                let told = std::mem::take(&mut groups.outcome);
                drop(groups);
                let outcome = self.sync(dirs, whole);
                if let Err(error) = &outcome {
                    tracing::error!(%error, "could not make changes durable; the requests that made them fail");
                }
                // Told before the lock is taken again: a request that saw no outcome
                // under the lock waits on `done`, which is notified only under it.
                let _ = told.set(outcome);
                groups = self.groups.lock().unwrap_or_else(|e| e.into_inner());
                groups.syncing = false;
                self.done.notify_all();
                continue;
            }
            groups = self.done.wait(groups).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn sync(&self, dirs: Vec<OwnedFd>, whole: bool) -> std::result::Result<(), String> {
        if whole || self.whole_filesystem {
            return rustix::fs::syncfs(&self.root)
                .map_err(|e| format!("syncfs of the export root: {}", std::io::Error::from(e)));
        }
        let mut seen = HashSet::new();
        let mut distinct = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let stat = rustix::fs::fstat(&dir)
                .map_err(|e| format!("stat a directory to sync: {}", std::io::Error::from(e)))?;
            if seen.insert((stat.st_dev, stat.st_ino)) {
                distinct.push(dir);
            }
        }
        self.pool.get_or_init(SyncPool::new).fsync_all(distinct)
    }
}

/// Syncs every directory, many at once: the first `fsync` commits the journal and the
/// others find their changes already committed, and the disk cache flushes they ask for
/// at the same time are merged, so a group costs little more than one `fsync` where one
/// after another would cost a flush each.
#[derive(Debug)]
struct SyncPool {
    /// Each helper takes a group and syncs from it until none is left.
    helpers: Mutex<mpsc::Sender<Arc<Group>>>,
}

#[derive(Debug)]
struct Group {
    dirs: Vec<OwnedFd>,
    next: AtomicUsize,
    /// Helpers still working on the group.
    busy: Mutex<usize>,
    idle: Condvar,
    failed: Mutex<Option<String>>,
}

impl Group {
    fn work(&self) {
        while let Some(dir) = self.dirs.get(self.next.fetch_add(1, Ordering::Relaxed)) {
            if let Err(e) = rustix::fs::fsync(dir) {
                *self.failed.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(format!("fsync a directory: {}", std::io::Error::from(e)));
            }
        }
    }
}

impl SyncPool {
    /// Helper threads end when the pool is dropped.
    fn new() -> Self {
        let (sender, receiver) = mpsc::channel::<Arc<Group>>();
        let receiver = Arc::new(Mutex::new(receiver));
        for _ in 1..MAX_SYNC_THREADS {
            let receiver = receiver.clone();
            let spawned = std::thread::Builder::new()
                .name("nfsprov-sync".into())
                .spawn(move || {
                    loop {
                        let next = receiver.lock().unwrap_or_else(|e| e.into_inner()).recv();
                        let Ok(group) = next else { return };
                        group.work();
                        *group.busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                        group.idle.notify_all();
                    }
                });
            if spawned.is_err() {
                // Fewer helpers: groups are synced by fewer threads, no less surely.
                break;
            }
        }
        Self {
            helpers: Mutex::new(sender),
        }
    }

    fn fsync_all(&self, dirs: Vec<OwnedFd>) -> std::result::Result<(), String> {
        let wanted = dirs.len().min(MAX_SYNC_THREADS).saturating_sub(1);
        let group = Arc::new(Group {
            dirs,
            next: AtomicUsize::new(0),
            busy: Mutex::new(0),
            idle: Condvar::new(),
            failed: Mutex::new(None),
        });
        {
            let helpers = self.helpers.lock().unwrap_or_else(|e| e.into_inner());
            for _ in 0..wanted {
                *group.busy.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                if helpers.send(group.clone()).is_err() {
                    *group.busy.lock().unwrap_or_else(|e| e.into_inner()) -= 1;
                    break;
                }
            }
        }
        group.work();
        let mut busy = group.busy.lock().unwrap_or_else(|e| e.into_inner());
        while *busy > 0 {
            busy = group.idle.wait(busy).unwrap_or_else(|e| e.into_inner());
        }
        drop(busy);
        match group
            .failed
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
        {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd;

    use super::*;

    /// Requests committing at the same time all return, each once its own directories
    /// were synced; one failing directory fails only the requests of its group.
    #[test]
    fn concurrent_commits_all_return_and_fail_alone() {
        let root = tempfile::tempdir().unwrap();
        let open = |p: &std::path::Path| {
            rustix::fs::open(
                p,
                rustix::fs::OFlags::RDONLY
                    | rustix::fs::OFlags::DIRECTORY
                    | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap()
        };
        let durable = Arc::new(Durability::new(open(root.path()).as_fd()).unwrap());
        let threads: Vec<_> = (0..16)
            .map(|n| {
                let dir = root.path().join(format!("d{n}"));
                std::fs::create_dir(&dir).unwrap();
                let fd = open(&dir);
                let durable = durable.clone();
                std::thread::spawn(move || {
                    for _ in 0..20 {
                        let mut changes = Changes::new();
                        changes.dir(fd.as_fd()).unwrap();
                        durable.commit(changes).unwrap();
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        // A descriptor fsync refuses (a pipe is no file to sync) fails its commit.
        let (reader, _writer) = std::io::pipe().unwrap();
        let mut changes = Changes::new();
        changes.owned(OwnedFd::from(reader));
        assert!(durable.commit(changes).is_err());
        let mut changes = Changes::new();
        changes.owned(open(root.path()));
        durable.commit(changes).unwrap();
    }
}
