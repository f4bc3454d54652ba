//! The walk of the source tree: one thread, in order, makes every directory, name, hard
//! link and special file of the copy, hands regular files to the workers, and finishes
//! each directory as it leaves it.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::SyncSender;

use rustix::fs::{AtFlags, Dir, FileType, Mode, OFlags, Statx};
use rustix::io::Errno;

use super::data::{Job, data_estimate};
use super::error::{changed, mount_point, write_error};
use super::metadata::{Node, file_type, identity, permissions, set_metadata, stat_fd, stat_mask};
use super::progress::{CopyProgress, CopyStats, Pending, Shared};
use crate::store::confine::is_dot;
use crate::store::error::{Result, StoreError, io_error};
use crate::store::tree::{MAX_USAGE_DEPTH, MountId};

/// Deepest level below the root that is copied: whatever a usage walk measures can be
/// cloned. Each level holds two descriptors (source and target) while the walk is below
/// it, so this also bounds the walk's descriptors.
pub(super) const MAX_COPY_DEPTH: usize = MAX_USAGE_DEPTH;

fn child_path(parent: &str, name: &CStr) -> String {
    let name = name.to_string_lossy();
    if parent == "." {
        name.into_owned()
    } else {
        format!("{parent}/{name}")
    }
}

/// Opens `name` in `dir` without updating its access time (so the copy leaves the
/// source's times alone) where the agent may (owner or `CAP_FOWNER`).
pub(crate) fn open_source(
    dir: BorrowedFd<'_>,
    name: &CStr,
    flags: OFlags,
) -> rustix::io::Result<OwnedFd> {
    let open = |flags| rustix::fs::openat(dir, name, flags | OFlags::CLOEXEC, Mode::empty());
    match open(flags | OFlags::NOATIME) {
        Err(Errno::PERM) => open(flags),
        opened => opened,
    }
}

/// Opens the entry listed as `listed` (a regular file or a directory, as `kind` says)
/// for reading and checks it still is: a name replaced by a symlink is refused rather
/// than followed, by another entry (or a fifo, opened without blocking) refused once
/// opened. `None` when it is gone.
fn open_listed(
    dir: BorrowedFd<'_>,
    name: &CStr,
    listed: &Statx,
    rel: &str,
    kind: FileType,
) -> Result<Option<(OwnedFd, Statx)>> {
    let (flags, replaced) = if kind == FileType::Directory {
        (
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW,
            Errno::NOTDIR,
        )
    } else {
        (
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY,
            Errno::NXIO,
        )
    };
    let fd = match open_source(dir, name, flags) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(None),
        Err(e) if e == Errno::LOOP || e == replaced => return Err(changed(rel)),
        Err(e) => return Err(io_error(format!("open {rel}"), e)),
    };
    let stat = stat_fd(fd.as_fd()).map_err(|e| io_error(format!("stat {rel}"), e))?;
    same_entry(&stat, listed, kind, rel)?;
    Ok(Some((fd, stat)))
}

fn same_entry(opened: &Statx, listed: &Statx, kind: FileType, rel: &str) -> Result<()> {
    if MountId::of(opened) != MountId::of(listed) {
        return Err(mount_point(rel));
    }
    if file_type(opened) != kind || identity(opened) != identity(listed) {
        return Err(changed(rel));
    }
    Ok(())
}

/// A directory being copied: everything below it is done when its listing is.
struct Frame {
    source: Dir,
    target: OwnedFd,
    /// Of the source, taken when it was opened, before it was read.
    stat: Statx,
    rel: String,
}

impl Frame {
    fn source(&self) -> BorrowedFd<'_> {
        // Never fails on Linux; the descriptor is the stream's own.
        self.source
            .fd()
            .expect("a directory stream has a descriptor")
    }
}

/// Where the copy keeps the first name of each hard-linked file until it has met all
/// the others: a private directory in the new volume's root, holding one more link to
/// each such file, named by the source inode. The filesystem itself is the set of files
/// waiting for more names, so the copy's memory does not grow with them; each waits as
/// one directory entry, taken out once its last name is linked, and the directory goes
/// before the copy ends. Being inside the new volume, it shares its quota project (a
/// link across projects is refused), and its entries take the room of directory entries
/// from the clone's quota while the copy runs.
struct LinkStage {
    dir: OwnedFd,
    name: CString,
}

/// Names given to link stages; one a source root holds is moved out of the way.
pub(super) static STAGES: AtomicU64 = AtomicU64::new(0);

impl LinkStage {
    fn create(root: BorrowedFd<'_>) -> Result<Self> {
        let name = Self::make(|name| rustix::fs::mkdirat(root, name, Mode::from_raw_mode(0o700)))?;
        let dir = rustix::fs::openat(
            root,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error("open the directory of hard links", e))?;
        Ok(Self { dir, name })
    }

    /// Tries `make` with fresh names until one is not taken; answers the name.
    fn make(make: impl Fn(&CStr) -> rustix::io::Result<()>) -> Result<CString> {
        loop {
            let n = STAGES.fetch_add(1, Ordering::Relaxed);
            let name = CString::new(format!(".nfsprov-links-{}-{n}", std::process::id()))
                .expect("no NUL in a generated name");
            match make(&name) {
                Ok(()) => return Ok(name),
                Err(Errno::EXIST) => continue,
                Err(e) => return Err(write_error("create", "the directory of hard links", e)),
            }
        }
    }

    /// Moves the stage away from `name` in `root`, which the source's root holds too.
    fn step_aside(&mut self, root: BorrowedFd<'_>) -> Result<()> {
        let from = self.name.clone();
        self.name = Self::make(|to| {
            rustix::fs::renameat_with(root, &from, root, to, rustix::fs::RenameFlags::NOREPLACE)
        })?;
        Ok(())
    }

    /// The name a file waits under: its source inode, with its birth time where the
    /// filesystem keeps one, so a file removed during the copy and a new one given its
    /// inode number are told apart (the device is the same for every entry copied).
    fn key(listed: &Statx) -> CString {
        let (_, _, ino, born_sec, born_nsec) = identity(listed);
        CString::new(format!("{ino:x}-{born_sec:x}-{born_nsec:x}")).expect("no NUL in a number")
    }

    /// Removes the stage and what is left in it: files some of whose names were not
    /// reached (removed during the copy, or never inside the volume), which keep the
    /// names they were copied under.
    fn remove(self, root: BorrowedFd<'_>) -> Result<()> {
        let mut stream =
            Dir::read_from(&self.dir).map_err(|e| io_error("list the hard links", e))?;
        // Only the agent writes here, so one pass finds everything.
        while let Some(entry) = stream.read() {
            let entry = entry.map_err(|e| io_error("list the hard links", e))?;
            if !is_dot(entry.file_name()) {
                rustix::fs::unlinkat(&self.dir, entry.file_name(), AtFlags::empty())
                    .map_err(|e| io_error("remove a hard link", e))?;
            }
        }
        rustix::fs::unlinkat(root, &self.name, AtFlags::REMOVEDIR)
            .map_err(|e| io_error("remove the directory of hard links", e))
    }
}

/// The walking thread: makes every directory and name in the target in order, and hands
/// regular files to the workers.
pub(super) struct Walker<'s, 'p> {
    mount: MountId,
    shared: &'s Shared,
    progress: &'p CopyProgress,
    queue: SyncSender<Job<'p>>,
    /// Made when the first file with several names is met.
    links: Option<LinkStage>,
    stack: Vec<Frame>,
    stats: CopyStats,
}

impl<'s, 'p> Walker<'s, 'p> {
    pub(super) fn new(
        source: BorrowedFd<'_>,
        target: BorrowedFd<'_>,
        shared: &'s Shared,
        progress: &'p CopyProgress,
        queue: SyncSender<Job<'p>>,
    ) -> Result<Self> {
        let root = open_source(source, c".", OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| io_error("open the source volume", e))?;
        let stat = stat_fd(root.as_fd()).map_err(|e| io_error("stat the source volume", e))?;
        let source = Dir::new(root).map_err(|e| io_error("read the source volume", e))?;
        let target = target.try_clone_to_owned().map_err(|e| {
            io_error(
                "open the new volume",
                Errno::from_io_error(&e).unwrap_or(Errno::BADF),
            )
        })?;
        Ok(Self {
            mount: MountId::of(&stat),
            shared,
            progress,
            queue,
            links: None,
            stack: vec![Frame {
                source,
                target,
                stat,
                rel: ".".into(),
            }],
            stats: CopyStats::default(),
        })
    }

    pub(super) fn finish(self) -> CopyStats {
        self.stats
    }

    pub(super) fn run(&mut self) -> Result<()> {
        while let Some(top) = self.stack.last_mut() {
            // A worker's error is the one reported.
            if self.shared.stopped() {
                return Ok(());
            }
            match top.source.read() {
                Some(Ok(entry)) => {
                    if !is_dot(entry.file_name()) {
                        self.entry(entry.file_name().to_owned())?;
                    }
                }
                Some(Err(e)) => return Err(io_error(format!("list {}", top.rel), e)),
                None => {
                    let done = self.stack.pop().expect("the directory just read");
                    // The root's listing is done, and so is every name: the stage goes
                    // before the root's times are set.
                    if self.stack.is_empty()
                        && let Some(links) = self.links.take()
                    {
                        links.remove(done.target.as_fd())?;
                    }
                    let source = Node::Fd(done.source());
                    set_metadata(
                        &source,
                        &Node::Fd(done.target.as_fd()),
                        &done.stat,
                        &done.rel,
                    )?;
                }
            }
        }
        Ok(())
    }

    fn top(&self) -> &Frame {
        self.stack.last().expect("a directory is being walked")
    }

    fn entry(&mut self, name: CString) -> Result<()> {
        let top = self.top();
        let rel = child_path(&top.rel, &name);
        let listed =
            match rustix::fs::statx(top.source(), &name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()) {
                Ok(stat) => stat,
                // Removed since it was listed: copied as it is when reached.
                Err(Errno::NOENT) => return Ok(()),
                Err(e) => return Err(io_error(format!("stat {rel}"), e)),
            };
        if MountId::of(&listed) != self.mount {
            return Err(mount_point(&rel));
        }
        if self.stack.len() == 1
            && let Some(links) = &mut self.links
            && links.name == name
        {
            links.step_aside(self.stack[0].target.as_fd())?;
        }
        let kind = file_type(&listed);
        if kind == FileType::Directory {
            return self.directory(name, rel, &listed);
        }
        let linked = listed.stx_nlink > 1;
        if linked && self.link(&name, &rel, &listed)? {
            return Ok(());
        }
        let made = match kind {
            FileType::RegularFile => self.regular(&name, &rel, &listed)?,
            FileType::Symlink => self.symlink(&name, &rel, &listed)?,
            FileType::Fifo
            | FileType::Socket
            | FileType::CharacterDevice
            | FileType::BlockDevice => self.special(&name, &rel, &listed, kind)?,
            _ => {
                return Err(StoreError::Unsupported(format!(
                    "{rel} is of a type the agent cannot copy"
                )));
            }
        };
        if made && linked {
            self.stage(&name, &rel, &listed)?;
        }
        Ok(())
    }

    fn directory(&mut self, name: CString, rel: String, listed: &Statx) -> Result<()> {
        if self.stack.len() > MAX_COPY_DEPTH {
            return Err(StoreError::Unsupported(format!(
                "{rel} is more than {MAX_COPY_DEPTH} directories deep; the agent does not clone trees that deep"
            )));
        }
        let top = self.top();
        let Some((source, stat)) =
            open_listed(top.source(), &name, listed, &rel, FileType::Directory)?
        else {
            return Ok(());
        };
        // Private to the agent until the copy is done; its metadata comes when everything
        // in it is.
        rustix::fs::mkdirat(&top.target, &name, Mode::from_raw_mode(0o700))
            .map_err(|e| write_error("create", &rel, e))?;
        let target = rustix::fs::openat(
            &top.target,
            &name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| io_error(format!("open the copy of {rel}"), e))?;
        let source = Dir::new(source).map_err(|e| io_error(format!("read {rel}"), e))?;
        self.stats.directories += 1;
        self.stack.push(Frame {
            source,
            target,
            stat,
            rel,
        });
        Ok(())
    }

    /// Links another name of a file already copied; `false` when it is the first met.
    fn link(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let Some(links) = &self.links else {
            return Ok(false);
        };
        let key = LinkStage::key(listed);
        let to = self.stack.last().expect("a directory is being walked");
        match rustix::fs::linkat(&links.dir, &key, &to.target, name, AtFlags::empty()) {
            Ok(()) => {}
            Err(Errno::NOENT) => return Ok(false),
            Err(e) => return Err(write_error("link", rel, e)),
        }
        self.stats.hard_links += 1;
        // Every name the source had when listed is made (the stage holds one more): the
        // file stops waiting. Most such files have two names, and this is the second.
        let done = listed.stx_nlink <= 2 || {
            let made = rustix::fs::statx(&links.dir, &key, AtFlags::SYMLINK_NOFOLLOW, stat_mask())
                .map_err(|e| io_error(format!("stat the copy of {rel}"), e))?;
            made.stx_nlink > listed.stx_nlink
        };
        if done {
            rustix::fs::unlinkat(&links.dir, &key, AtFlags::empty())
                .map_err(|e| io_error(format!("forget the first name of {rel}"), e))?;
        }
        Ok(true)
    }

    /// Keeps the copy of a file with several names, just made under `name`, until its
    /// other names are met.
    fn stage(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<()> {
        let links = match &mut self.links {
            Some(links) => links,
            None => self
                .links
                .insert(LinkStage::create(self.stack[0].target.as_fd())?),
        };
        let from = self.stack.last().expect("a directory is being walked");
        let key = LinkStage::key(listed);
        loop {
            match rustix::fs::linkat(&from.target, name, &links.dir, &key, AtFlags::empty()) {
                Ok(()) => return Ok(()),
                // Left by a file that had that inode before (removed during the copy).
                Err(Errno::EXIST) => {
                    match rustix::fs::unlinkat(&links.dir, &key, AtFlags::empty()) {
                        Ok(()) | Err(Errno::NOENT) => continue,
                        Err(e) => return Err(io_error(format!("forget a first name of {rel}"), e)),
                    }
                }
                Err(e) => return Err(write_error("link", rel, e)),
            }
        }
    }

    fn regular(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let top = self.top();
        let Some((source, stat)) =
            open_listed(top.source(), name, listed, rel, FileType::RegularFile)?
        else {
            return Ok(false);
        };
        // Made here rather than by the worker, so that only this thread changes
        // directories and a directory's times can be set as soon as it is walked.
        let target = rustix::fs::openat(
            &top.target,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| write_error("create", rel, e))?;
        self.stats.files += 1;
        let pending = Pending::new(&self.progress.pending_bytes, data_estimate(&stat));
        let job = Job {
            source,
            target,
            stat,
            rel: rel.to_owned(),
            pending,
        };
        self.queue
            .send(job)
            .map_err(|_| io_error(format!("copy {rel} (no worker left)"), Errno::IO))?;
        Ok(true)
    }

    fn symlink(&mut self, name: &CStr, rel: &str, listed: &Statx) -> Result<bool> {
        let top = self.top();
        let link = match rustix::fs::readlinkat(top.source(), name, Vec::new()) {
            Ok(link) => link,
            Err(Errno::NOENT) => return Ok(false),
            // Not a symlink any more.
            Err(Errno::INVAL) => return Err(changed(rel)),
            Err(e) => return Err(io_error(format!("read the link {rel}"), e)),
        };
        rustix::fs::symlinkat(link.as_c_str(), &top.target, name)
            .map_err(|e| write_error("create", rel, e))?;
        set_metadata(
            &Node::At(top.source(), name),
            &Node::At(top.target.as_fd(), name),
            listed,
            rel,
        )?;
        self.stats.others += 1;
        Ok(true)
    }

    fn special(&mut self, name: &CStr, rel: &str, listed: &Statx, kind: FileType) -> Result<bool> {
        let top = self.top();
        let device = matches!(kind, FileType::CharacterDevice | FileType::BlockDevice);
        let rdev = if device {
            rustix::fs::makedev(listed.stx_rdev_major, listed.stx_rdev_minor)
        } else {
            0
        };
        // The set-ID bits come with the rest of the mode, after the owner.
        let mode = Mode::from_raw_mode(permissions(listed) & 0o777);
        rustix::fs::mknodat(&top.target, name, kind, mode, rdev).map_err(|e| match e {
            Errno::PERM if device => StoreError::Unsupported(format!(
                "{rel} is a device node, which the agent is not allowed to make (it needs CAP_MKNOD); a clone is exact or fails"
            )),
            e => write_error("create", rel, e),
        })?;
        set_metadata(
            &Node::At(top.source(), name),
            &Node::At(top.target.as_fd(), name),
            listed,
            rel,
        )?;
        self.stats.others += 1;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::MetadataExt;
    use std::path::Path;

    use super::*;
    use crate::store::copy::tests::{copy, new_dir, open_dir, write};

    #[test]
    fn a_file_replaced_after_listing_is_refused_not_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        write(root, "victim", b"listed");
        write(root, "other", b"never to be read through the victim's name");
        let dir = open_dir(root);
        let listed = |name: &CStr| {
            rustix::fs::statx(&dir, name, AtFlags::SYMLINK_NOFOLLOW, stat_mask()).unwrap()
        };
        let open_victim = |listed: &Statx| {
            open_listed(
                dir.as_fd(),
                c"victim",
                listed,
                "victim",
                FileType::RegularFile,
            )
        };
        let refused = |result: Result<Option<(OwnedFd, Statx)>>| match result {
            Err(StoreError::Conflict(message)) => assert!(message.contains("victim"), "{message}"),
            Err(e) => panic!("not refused as changed: {e:?}"),
            Ok(opened) => panic!("opened: {:?}", opened.map(|(_, stat)| stat.stx_ino)),
        };

        let unchanged = listed(c"victim");
        let (_, stat) = open_victim(&unchanged).unwrap().unwrap();
        assert_eq!(stat.stx_ino, unchanged.stx_ino);

        // Replaced by a symlink to another file.
        fs::remove_file(root.join("victim")).unwrap();
        std::os::unix::fs::symlink("other", root.join("victim")).unwrap();
        refused(open_victim(&unchanged));

        // Replaced by another file, renamed over it.
        let symlink = listed(c"victim");
        write(root, "new", b"another file");
        fs::rename(root.join("new"), root.join("victim")).unwrap();
        refused(open_victim(&unchanged));
        refused(open_victim(&symlink));

        // Gone: nothing to copy.
        fs::remove_file(root.join("victim")).unwrap();
        assert!(open_victim(&unchanged).unwrap().is_none());
    }

    #[test]
    fn a_tree_deeper_than_the_bound_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        let deepest = source.join("d/".repeat(MAX_COPY_DEPTH));
        fs::create_dir_all(&deepest).unwrap();
        write(&deepest, "leaf", b"at the bound");
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
        assert_eq!((stats.directories, stats.files), (MAX_COPY_DEPTH as u64, 1));
        assert_eq!(
            fs::read(copied.join("d/".repeat(MAX_COPY_DEPTH)).join("leaf")).unwrap(),
            b"at the bound"
        );

        fs::create_dir(deepest.join("d")).unwrap();
        let copied = new_dir(&tmp.path().join("copy-2"));
        match copy(&source, &copied, false, &CopyProgress::default()) {
            Err(StoreError::Unsupported(message)) => {
                assert!(
                    message.contains(&format!("more than {MAX_COPY_DEPTH}")),
                    "{message}"
                )
            }
            other => panic!("not refused: {other:?}"),
        }
    }
    /// Names of one file in several directories are one file in the copy, met in any
    /// order; a file whose other name lies outside the source is copied once under the
    /// name inside; the copy's root keeps nothing of the bookkeeping, even when the
    /// source's root holds an entry named like it.

    #[test]
    fn hard_links_are_kept_and_nothing_else_is_left() {
        let tmp = tempfile::tempdir().unwrap();
        let source = new_dir(&tmp.path().join("source"));
        for dir in ["a", "b", "c/d"] {
            fs::create_dir_all(source.join(dir)).unwrap();
        }
        for n in 0..50 {
            let first = source.join("b").join(format!("f{n}"));
            write(
                &source.join("b"),
                &format!("f{n}"),
                format!("file {n}").as_bytes(),
            );
            fs::hard_link(&first, source.join("a").join(format!("g{n}"))).unwrap();
            fs::hard_link(&first, source.join("c/d").join(format!("h{n}"))).unwrap();
        }
        write(&source, "half", b"one name inside");
        fs::hard_link(source.join("half"), tmp.path().join("outside")).unwrap();
        // What the first stage of this process would be called, and then some.
        let next = STAGES.load(Ordering::Relaxed);
        for n in next..next + 64 {
            fs::create_dir(source.join(format!(".nfsprov-links-{}-{n}", std::process::id())))
                .unwrap();
        }
        let copied = new_dir(&tmp.path().join("copy"));
        let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
        assert_eq!((stats.files, stats.hard_links), (51, 100));
        let listing = |dir: &Path| {
            let mut names: Vec<_> = fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            names
        };
        assert_eq!(listing(&copied), listing(&source));
        for n in 0..50 {
            let names = [
                copied.join("a").join(format!("g{n}")),
                copied.join("b").join(format!("f{n}")),
                copied.join("c/d").join(format!("h{n}")),
            ];
            let first = fs::metadata(&names[0]).unwrap();
            assert_eq!(first.nlink(), 3);
            for name in &names {
                assert_eq!(fs::metadata(name).unwrap().ino(), first.ino());
            }
            assert_eq!(fs::read(&names[0]).unwrap(), format!("file {n}").as_bytes());
        }
        assert_eq!(fs::metadata(copied.join("half")).unwrap().nlink(), 1);
    }
}
