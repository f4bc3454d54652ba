use std::collections::{BTreeMap, BTreeSet};
use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};

use super::*;
use crate::store::error::StoreError;

const WORKERS: usize = 4;
const SPARSE_SIZE: u64 = 1 << 30;
const EXTENT: usize = 64 << 10;
const EXTENTS: [u64; 2] = [128 << 20, 640 << 20];
/// Files compared whole; larger ones (the sparse one) are sampled.
const COMPARED_WHOLE: u64 = 16 << 20;

/// True (after reporting the skip) when the test cannot do its part without root.
fn skip_unless_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return false;
    }
    nfsprov_test_skip::skip(test, "needs root");
    true
}

pub(super) fn open_dir(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

pub(super) fn new_dir(path: &Path) -> PathBuf {
    fs::create_dir(path).unwrap();
    path.to_owned()
}

pub(super) fn copy(
    source: &Path,
    target: &Path,
    reflink: bool,
    progress: &CopyProgress,
) -> Result<CopyStats> {
    let options = CopyOptions {
        workers: WORKERS,
        reflink,
    };
    copy_tree(
        open_dir(source).as_fd(),
        open_dir(target).as_fd(),
        &options,
        progress,
    )
}

/// Bytes no two offsets of which are likely alike.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}

pub(super) fn write(root: &Path, rel: &str, data: &[u8]) -> u64 {
    fs::write(root.join(rel), data).unwrap();
    data.len() as u64
}

fn chown(path: &Path, uid: u32, gid: u32) {
    std::os::unix::fs::lchown(path, Some(uid), Some(gid)).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
}

fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, XattrFlags::empty()).unwrap();
}

/// Distinct times for the `n`th entry, with nanoseconds.
fn times(n: i64) -> Timestamps {
    Timestamps {
        last_access: Timespec {
            tv_sec: 1_000_000_000 + n * 1000,
            tv_nsec: 123_456_789 + n,
        },
        last_modification: Timespec {
            tv_sec: 1_100_000_000 + n * 1000,
            tv_nsec: 987_654_321 - n,
        },
    }
}

fn set_times(path: &Path, times: &Timestamps) {
    rustix::fs::utimensat(rustix::fs::CWD, path, times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

/// Names (lossy, for readable failures) and values.
fn xattrs(path: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut names = vec![0; 64 << 10];
    let len = rustix::fs::llistxattr(path, &mut names[..]).unwrap();
    names.truncate(len);
    names
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty())
        .map(|name| {
            let name = CString::new(name).unwrap();
            let mut value = vec![0; 64 << 10];
            let len = rustix::fs::lgetxattr(path, &name, &mut value[..]).unwrap();
            value.truncate(len);
            (name.to_string_lossy().into_owned(), value)
        })
        .collect()
}

/// The tree the exactness test copies; answers its bytes of data. Needs root (owners,
/// a device node).
fn build_source(root: &Path) -> u64 {
    let mut bytes = 0;
    fs::create_dir_all(root.join("a/b/c")).unwrap();
    fs::create_dir(root.join("shared")).unwrap();
    bytes += write(root, "plain.txt", b"hello, world\n");
    bytes += write(root, "setuid-tool", b"#!/bin/sh\necho tool\n");
    bytes += write(root, "empty", b"");
    bytes += write(root, "big.bin", &pattern(100 << 10, 7));
    bytes += write(root, "a/b/c/deep.txt", b"three levels down\n");
    bytes += write(root, "a/first-name", b"one inode, two names\n");
    fs::hard_link(root.join("a/first-name"), root.join("shared/second-name")).unwrap();
    std::os::unix::fs::symlink("a/b/c/deep.txt", root.join("rel-link")).unwrap();
    std::os::unix::fs::symlink("/etc", root.join("abs-link")).unwrap();
    let sparse = fs::File::create(root.join("sparse.img")).unwrap();
    sparse.set_len(SPARSE_SIZE).unwrap();
    for (n, offset) in EXTENTS.into_iter().enumerate() {
        sparse
            .write_all_at(&pattern(EXTENT, n as u8 + 1), offset)
            .unwrap();
        bytes += EXTENT as u64;
    }
    drop(sparse);
    let special = |name: &str, kind, mode, dev| {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            root.join(name).as_path(),
            kind,
            Mode::from_raw_mode(mode),
            dev,
        )
        .unwrap();
    };
    special("fifo", FileType::Fifo, 0o600, 0);
    special(
        "null",
        FileType::CharacterDevice,
        0o600,
        rustix::fs::makedev(1, 3),
    );
    drop(std::os::unix::net::UnixListener::bind(root.join("socket")).unwrap());

    set_xattr(&root.join("plain.txt"), "user.test", b"value");
    set_xattr(&root.join("a"), "user.test", b"value");
    set_xattr(&root.join("a/b"), "user.kept", b"yes");
    set_xattr(
        &root.join("a/b"),
        "user.nfsprov.volume",
        b"{\"forged\":true}",
    );
    set_xattr(root, "user.root", b"top");
    // Linux allows user.* attributes only on files and directories; trusted.* ones
    // (root only) reach symlinks and special files, which are never opened.
    set_xattr(
        &root.join("rel-link"),
        "trusted.link",
        b"on the link itself",
    );
    set_xattr(&root.join("fifo"), "trusted.fifo", b"on the fifo");

    // Owners first: chown clears the set-ID bits.
    for (rel, uid, gid) in [
        (".", 1234, 5678),
        ("plain.txt", 1234, 5678),
        ("a", 1234, 5678),
        ("a/b", 2000, 2000),
        ("a/b/c/deep.txt", 2000, 2000),
        ("setuid-tool", 2000, 2000),
        ("rel-link", 1234, 5678),
        ("fifo", 2000, 2000),
        ("shared/second-name", 1234, 5678),
    ] {
        chown(&root.join(rel), uid, gid);
    }
    for (rel, mode) in [
        (".", 0o751),
        ("plain.txt", 0o640),
        ("setuid-tool", 0o4755),
        ("shared", 0o1777),
        ("a/b", 0o700),
        ("a/b/c", 0o750),
        ("fifo", 0o620),
        ("null", 0o666),
    ] {
        chmod(&root.join(rel), mode);
    }
    // Directories last, deepest first: what is done in them changes their times.
    let entries = [
        "plain.txt",
        "setuid-tool",
        "empty",
        "big.bin",
        "a/b/c/deep.txt",
        "a/first-name",
        "rel-link",
        "abs-link",
        "sparse.img",
        "fifo",
        "null",
        "socket",
        "a/b/c",
        "a/b",
        "a",
        "shared",
        ".",
    ];
    for (n, rel) in entries.into_iter().enumerate() {
        set_times(&root.join(rel), &times(n as i64));
    }
    bytes
}

fn expected_stats(bytes: u64, reflinked: bool) -> CopyStats {
    let files = 7;
    CopyStats {
        directories: 4,
        files,
        others: 5,
        hard_links: 1,
        bytes,
        reflinked_files: if reflinked { files } else { 0 },
        copied_files: if reflinked { 0 } else { files },
    }
}

/// Compares the metadata of every entry of both trees (before anything is read, which
/// would change access times), then their contents.
fn assert_same_tree(source: &Path, copy: &Path) {
    let mut files = Vec::new();
    compare_metadata(source, copy, Path::new("."), &mut files);
    for rel in files {
        compare_contents(&source.join(&rel), &copy.join(&rel), &rel);
    }
}

fn compare_metadata(source: &Path, copy: &Path, rel: &Path, files: &mut Vec<PathBuf>) {
    let s = fs::symlink_metadata(source).unwrap();
    let c = fs::symlink_metadata(copy).unwrap_or_else(|e| panic!("{rel:?} copied: {e}"));
    assert_eq!(s.file_type(), c.file_type(), "{rel:?}: type");
    assert_eq!(s.mode(), c.mode(), "{rel:?}: mode");
    assert_eq!((s.uid(), s.gid()), (c.uid(), c.gid()), "{rel:?}: owner");
    assert_eq!(s.nlink(), c.nlink(), "{rel:?}: links");
    assert_eq!(s.rdev(), c.rdev(), "{rel:?}: device");
    assert_eq!(
        (s.mtime(), s.mtime_nsec()),
        (c.mtime(), c.mtime_nsec()),
        "{rel:?}: modification time"
    );
    // Reading a symlink (as the copy does) sets its access time: checked apart.
    if !s.is_symlink() {
        assert_eq!(
            (s.atime(), s.atime_nsec()),
            (c.atime(), c.atime_nsec()),
            "{rel:?}: access time"
        );
    }
    let mut expected = xattrs(source);
    expected.remove("user.nfsprov.volume");
    assert_eq!(expected, xattrs(copy), "{rel:?}: extended attributes");
    if s.is_symlink() {
        assert_eq!(
            fs::read_link(source).unwrap(),
            fs::read_link(copy).unwrap(),
            "{rel:?}: link"
        );
    } else if s.is_file() {
        assert_eq!(s.size(), c.size(), "{rel:?}: size");
        files.push(rel.to_owned());
    } else if s.is_dir() {
        let names = |dir: &Path| -> BTreeSet<_> {
            fs::read_dir(dir)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect()
        };
        let listed = names(source);
        assert_eq!(listed, names(copy), "{rel:?}: entries");
        for name in listed {
            compare_metadata(
                &source.join(&name),
                &copy.join(&name),
                &rel.join(&name),
                files,
            );
        }
    }
}

fn compare_contents(source: &Path, copy: &Path, rel: &Path) {
    let size = fs::metadata(source).unwrap().len();
    if size <= COMPARED_WHOLE {
        assert!(
            fs::read(source).unwrap() == fs::read(copy).unwrap(),
            "{rel:?}: contents"
        );
        return;
    }
    let (s, c) = (
        fs::File::open(source).unwrap(),
        fs::File::open(copy).unwrap(),
    );
    let read = |file: &fs::File, offset: u64, len: usize| {
        let mut buffer = vec![0; len];
        file.read_exact_at(&mut buffer, offset).unwrap();
        buffer
    };
    for offset in EXTENTS {
        assert!(
            read(&s, offset, EXTENT) == read(&c, offset, EXTENT),
            "{rel:?} at {offset}"
        );
        assert!(
            read(&c, offset, EXTENT).iter().any(|b| *b != 0),
            "{rel:?} at {offset}"
        );
    }
    for offset in [0, 4096, 256 << 20, 512 << 20, size - 4096] {
        assert!(
            read(&c, offset, 4096).iter().all(|b| *b == 0),
            "{rel:?}: hole at {offset}"
        );
    }
}

/// The checks of one exact copy beyond the tree comparison.
fn assert_copy_details(source: &Path, copy: &Path) {
    // The hole stays a hole.
    let sparse = fs::metadata(copy.join("sparse.img")).unwrap();
    assert_eq!(sparse.len(), SPARSE_SIZE);
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "{} bytes allocated",
        sparse.blocks() * 512
    );
    // Hard links: one new inode, two names.
    let first = fs::metadata(copy.join("a/first-name")).unwrap();
    let second = fs::metadata(copy.join("shared/second-name")).unwrap();
    assert_eq!(first.ino(), second.ino());
    assert_eq!(first.nlink(), 2);
    assert_ne!(
        first.ino(),
        fs::metadata(source.join("a/first-name")).unwrap().ino()
    );
    // Links are links, never followed.
    assert!(
        fs::symlink_metadata(copy.join("abs-link"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(
        fs::read_link(copy.join("abs-link")).unwrap(),
        Path::new("/etc")
    );
    let mut names = Vec::new();
    let mut pending = vec![copy.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            }
            names.push(entry.file_name());
        }
    }
    assert_eq!(names.len(), 17, "{names:?}");
    assert!(!names.iter().any(|n| n == "passwd" || n == "hostname"));
    assert_eq!(
        fs::symlink_metadata(copy.join("rel-link")).unwrap().uid(),
        1234
    );
    // The forged record stays behind; other attributes come along.
    assert!(xattrs(&source.join("a/b")).contains_key("user.nfsprov.volume"));
    let attributes = xattrs(&copy.join("a/b"));
    assert!(!attributes.contains_key("user.nfsprov.volume"));
    assert_eq!(
        attributes.get("user.kept").map(Vec::as_slice),
        Some(b"yes".as_slice())
    );
    assert_eq!(
        fs::metadata(copy.join("setuid-tool")).unwrap().mode() & 0o7777,
        0o4755
    );
    assert_eq!(
        fs::metadata(copy.join("shared")).unwrap().mode() & 0o7777,
        0o1777
    );
}

/// A symlink's own access time: the copy's must be the source's before the copy read
/// the link (which sets it), and is looked at before anything else reads the copy.
fn symlink_atime(path: &Path) -> (i64, i64) {
    let link = fs::symlink_metadata(path).unwrap();
    (link.atime(), link.atime_nsec())
}

fn assert_balanced(progress: &CopyProgress) {
    assert_eq!(progress.pending_bytes.get(), 0, "pending bytes left");
}

#[test]
fn a_copy_is_exact_with_and_without_reflink() {
    const TEST: &str = "store::copy::tests::a_copy_is_exact_with_and_without_reflink";
    if skip_unless_root(TEST) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let source = new_dir(&tmp.path().join("source"));
    let bytes = build_source(&source);
    let sparse = fs::metadata(source.join("sparse.img")).unwrap();
    assert!(
        sparse.blocks() * 512 < 1 << 20,
        "the test's filesystem made no hole"
    );
    let reflink = reflink_supported(open_dir(tmp.path()).as_fd());
    for use_reflink in [false, true] {
        let copied = new_dir(&tmp.path().join(format!("copy-{use_reflink}")));
        let link_times = symlink_atime(&source.join("rel-link"));
        let progress = CopyProgress::default();
        let stats = copy(&source, &copied, use_reflink, &progress).unwrap();
        assert_eq!(symlink_atime(&copied.join("rel-link")), link_times);
        assert_eq!(stats, expected_stats(bytes, use_reflink && reflink));
        assert_same_tree(&source, &copied);
        assert_copy_details(&source, &copied);
        assert_balanced(&progress);
        assert_eq!(progress.copied_files.get(), stats.files);
        assert_eq!(progress.copied_bytes.get(), stats.bytes);
    }
}

/// The same on btrfs, where FICLONE works: every file is reflinked.
#[test]
fn a_reflinked_copy_is_exact() {
    const TEST: &str = "store::copy::tests::a_reflinked_copy_is_exact";
    if skip_unless_root(TEST) {
        return;
    }
    let btrfs = match nfsprov_agent_testkit::LoopBtrfs::new(300, false) {
        Ok(btrfs) => btrfs,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("no loop-mounted btrfs: {e}"));
            return;
        }
    };
    let root = btrfs.root();
    assert!(reflink_supported(open_dir(&root).as_fd()));
    assert_eq!(
        fs::read_dir(&root).unwrap().count(),
        0,
        "probes left behind"
    );
    let source = new_dir(&root.join("source"));
    let bytes = build_source(&source);
    let copied = new_dir(&root.join("copy"));
    let link_times = symlink_atime(&source.join("rel-link"));
    let progress = CopyProgress::default();
    let stats = copy(&source, &copied, true, &progress).unwrap();
    assert_eq!(symlink_atime(&copied.join("rel-link")), link_times);
    assert_eq!(stats, expected_stats(bytes, true));
    assert_same_tree(&source, &copied);
    assert_copy_details(&source, &copied);
    assert_balanced(&progress);
    assert_eq!(progress.copied_bytes.get(), stats.bytes);
}

/// A filesystem mounted for a test, unmounted when dropped (lazily: a failed
/// assertion must not leave it behind).
struct Mounted(PathBuf);

impl Mounted {
    fn new(args: &[&str], source: &str, target: &Path) -> std::result::Result<Self, String> {
        let output = Command::new("mount")
            .args(args)
            .arg(source)
            .arg(target)
            .output()
            .map_err(|e| format!("mount: {e}"))?;
        if !output.status.success() {
            return Err(String::from_utf8_lossy(&output.stderr).trim().to_owned());
        }
        Ok(Self(target.to_owned()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn assert_mount_point_refused(error: StoreError, rel: &str) {
    match error {
        StoreError::Conflict(message) => assert!(
            message.starts_with(&format!("{rel} is a mount point inside the source volume")),
            "{message}"
        ),
        other => panic!("not refused as a mount point: {other:?}"),
    }
}

#[test]
fn a_mount_point_inside_the_source_is_refused() {
    const TEST: &str = "store::copy::tests::a_mount_point_inside_the_source_is_refused";
    if skip_unless_root(TEST) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let source = new_dir(&tmp.path().join("source"));
    write(&source, "file", b"data");
    let point = source.join("deep/er");
    fs::create_dir_all(&point).unwrap();
    let elsewhere = new_dir(&tmp.path().join("elsewhere"));
    write(&elsewhere, "secret", b"not the volume's");

    let tmpfs = match Mounted::new(
        &["-t", "tmpfs", "-o", "size=1m"],
        "nfsprov-copy-test",
        &point,
    ) {
        Ok(mounted) => mounted,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("cannot mount a tmpfs: {e}"));
            return;
        }
    };
    write(&point, "inside", b"another filesystem");
    let copied = new_dir(&tmp.path().join("copy-1"));
    let error = copy(&source, &copied, false, &CopyProgress::default()).unwrap_err();
    assert_mount_point_refused(error, "deep/er");
    assert!(!copied.join("deep/er").exists());
    drop(tmpfs);

    // The same filesystem bound elsewhere: same device, another mount.
    let bind = match Mounted::new(&["--bind"], elsewhere.to_str().unwrap(), &point) {
        Ok(mounted) => mounted,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("cannot bind-mount: {e}"));
            return;
        }
    };
    assert_eq!(
        fs::metadata(&point).unwrap().dev(),
        fs::metadata(&source).unwrap().dev()
    );
    let copied = new_dir(&tmp.path().join("copy-2"));
    let error = copy(&source, &copied, false, &CopyProgress::default()).unwrap_err();
    assert_mount_point_refused(error, "deep/er");
    assert!(!copied.join("deep/er/secret").exists());
    drop(bind);
}

#[test]
fn a_copy_that_does_not_fit_is_no_space() {
    const TEST: &str = "store::copy::tests::a_copy_that_does_not_fit_is_no_space";
    if skip_unless_root(TEST) {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    // One file only: with a second, small one the parallel workers may
    // fill the filesystem with the big file first and fail on the small.
    let source = new_dir(&tmp.path().join("source"));
    write(&source, "big.bin", &pattern(4 << 20, 3));
    let small = new_dir(&tmp.path().join("small"));
    let _tmpfs = match Mounted::new(
        &["-t", "tmpfs", "-o", "size=1m"],
        "nfsprov-copy-test",
        &small,
    ) {
        Ok(mounted) => mounted,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("cannot mount a tmpfs: {e}"));
            return;
        }
    };
    let progress = CopyProgress::default();
    match copy(&source, &small, false, &progress) {
        Err(StoreError::NoSpace(message)) => {
            assert!(message.contains("big.bin"), "{message}");
            assert!(message.contains("too small"), "{message}");
        }
        other => panic!("not NoSpace: {other:?}"),
    }
    assert_balanced(&progress);
}

#[test]
fn progress_ends_balanced_after_a_copy_and_after_a_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let source = new_dir(&tmp.path().join("source"));
    fs::create_dir(source.join("sub")).unwrap();
    let mut bytes = 0;
    for n in 0..40 {
        let dir = if n % 2 == 0 { "." } else { "sub" };
        bytes += write(
            &source.join(dir),
            &format!("file-{n}"),
            &pattern(n * 3000, n as u8),
        );
    }
    let sparse = fs::File::create(source.join("sparse")).unwrap();
    sparse.set_len(32 << 20).unwrap();
    sparse.write_all_at(&pattern(EXTENT, 9), 16 << 20).unwrap();
    bytes += EXTENT as u64;

    let progress = CopyProgress::default();
    let copied = new_dir(&tmp.path().join("copy"));
    let stats = copy(&source, &copied, true, &progress).unwrap();
    assert_eq!(
        (stats.files, stats.directories, stats.bytes),
        (41, 1, bytes)
    );
    assert_eq!(stats.reflinked_files + stats.copied_files, stats.files);
    assert_balanced(&progress);
    assert_eq!(progress.copied_files.get(), stats.files);
    assert_eq!(progress.copied_bytes.get(), stats.bytes);

    // A target that is not empty: the copy stops at the name already there, and
    // what was queued gives its pending bytes back.
    let progress = CopyProgress::default();
    let taken = new_dir(&tmp.path().join("taken"));
    fs::create_dir(taken.join("sub")).unwrap();
    write(&taken.join("sub"), "file-39", b"in the way");
    let error = copy(&source, &taken, false, &progress).unwrap_err();
    assert!(error.to_string().contains("sub"), "{error}");
    assert_balanced(&progress);
}

#[test]
fn names_that_are_not_utf8_are_copied_as_they_are() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let name = |bytes: &[u8]| OsStr::from_bytes(bytes).to_owned();
    let tmp = tempfile::tempdir().unwrap();
    let source = new_dir(&tmp.path().join("source"));
    let (dir, file) = (name(b"d\xff"), name(b"caf\xe9"));
    fs::create_dir_all(source.join(&dir).join(&dir)).unwrap();
    fs::write(source.join(&dir).join(&file), b"latin-1").unwrap();
    // The second name, in a directory the first's is not in: reached from the root.
    fs::hard_link(
        source.join(&dir).join(&file),
        source.join(&dir).join(&dir).join(&file),
    )
    .unwrap();
    std::os::unix::fs::symlink(name(b"\xfe/target"), source.join(&file)).unwrap();
    let copied = new_dir(&tmp.path().join("copy"));
    let stats = copy(&source, &copied, false, &CopyProgress::default()).unwrap();
    assert_eq!((stats.files, stats.hard_links, stats.others), (1, 1, 1));
    assert_eq!(
        fs::read(copied.join(&dir).join(&dir).join(&file)).unwrap(),
        b"latin-1"
    );
    assert_eq!(
        fs::read_link(copied.join(&file)).unwrap().as_os_str(),
        name(b"\xfe/target")
    );
}
