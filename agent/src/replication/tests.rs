//! The replication engine on the real filesystem: a tree with every kind of entry and
//! metadata, scanned, built from its manifest through the extent codec, scanned again;
//! an incremental build over a base; a build resumed; hostile manifests.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::Command;

use nfsprov_api_types::manifest::{EntryKind, ManifestEntry, WireBytes};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timespec, Timestamps, XattrFlags};

use super::*;
use crate::store::error::{Result, StoreError};

const SPARSE_SIZE: u64 = 32 << 20;
const EXTENT: usize = 64 << 10;

fn open_dir(path: &Path) -> OwnedFd {
    rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

fn manifest_of(root: &Path) -> (Vec<ManifestEntry>, ScanStats) {
    let mut entries = Vec::new();
    let stats = scan(open_dir(root).as_fd(), &mut |entry| {
        entries.push(entry);
        Ok(())
    })
    .unwrap();
    (entries, stats)
}

fn rel(path: &WireBytes) -> &Path {
    Path::new(OsStr::from_bytes(path.as_bytes()))
}

/// Bytes no two offsets of which are likely alike.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) >> 13) as u8 ^ seed)
        .collect()
}

fn set_times(path: &Path, atime: i64, mtime: i64) {
    let times = Timestamps {
        last_access: Timespec {
            tv_sec: atime,
            tv_nsec: 123_456_789,
        },
        last_modification: Timespec {
            tv_sec: mtime,
            tv_nsec: 987_654_321,
        },
    };
    rustix::fs::utimensat(rustix::fs::CWD, path, &times, AtFlags::SYMLINK_NOFOLLOW).unwrap();
}

fn xattr(path: &Path, name: &str, value: &[u8]) {
    rustix::fs::lsetxattr(path, name, value, XattrFlags::empty()).unwrap();
}

/// A fetch that serves each file from `source` through the extent codec, over an
/// in-memory buffer, and records the paths it was asked for.
fn serve<'a>(
    source: &'a Path,
    fetched: &'a mut Vec<PathBuf>,
) -> impl FnMut(&ManifestEntry, &File) -> Result<()> + 'a {
    move |entry, file| {
        let path = rel(&entry.path);
        fetched.push(path.to_owned());
        let sent = File::open(source.join(path)).unwrap();
        let mut wire = Vec::new();
        send_extents(&sent, &mut wire)?;
        receive_extents(&mut wire.as_slice(), file, entry.size)?;
        Ok(())
    }
}

fn build_from(
    staging: &Path,
    manifest: &[ManifestEntry],
    base: Option<&Base<'_>>,
    fetch: &mut Fetch<'_>,
) -> Result<BuildStats> {
    build(
        open_dir(staging).as_fd(),
        manifest.iter().cloned().map(Ok),
        base,
        fetch,
    )
}

/// Every kind of entry and metadata a replica keeps.
fn make_tree(root: &Path) {
    fs::create_dir_all(root.join("a/b")).unwrap();
    fs::create_dir(root.join("shared")).unwrap();
    fs::write(root.join("a/plain.txt"), b"plain text").unwrap();
    fs::write(root.join("a/b/deep.txt"), pattern(100_000, 1)).unwrap();
    fs::write(root.join("doomed.txt"), pattern(5000, 2)).unwrap();
    fs::write(root.join("moved.txt"), pattern(7000, 3)).unwrap();
    fs::write(root.join("empty"), b"").unwrap();
    fs::write(
        root.join(OsStr::from_bytes(b"bytes-\xff\xfe")),
        b"a name not UTF-8",
    )
    .unwrap();
    // Sparse: two extents of data, holes between, after and at the start.
    let sparse = File::create(root.join("sparse")).unwrap();
    sparse.set_len(SPARSE_SIZE).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&pattern(EXTENT, 4), 1 << 20).unwrap();
    sparse.write_all_at(&pattern(EXTENT, 5), 20 << 20).unwrap();
    drop(sparse);
    fs::hard_link(root.join("a/plain.txt"), root.join("a/b/second-name")).unwrap();
    fs::hard_link(root.join("a/plain.txt"), root.join("link-to-plain")).unwrap();
    symlink("nowhere/at/all", root.join("dangling")).unwrap();
    symlink("/etc/passwd", root.join("absolute")).unwrap();
    symlink("a/plain.txt", root.join("relative")).unwrap();
    rustix::fs::mknodat(
        open_dir(root).as_fd(),
        "fifo",
        FileType::Fifo,
        Mode::from_raw_mode(0o620),
        0,
    )
    .unwrap();
    fs::write(root.join("suid"), b"#!/bin/true\n").unwrap();
    rustix::fs::mknodat(
        open_dir(root).as_fd(),
        "null",
        FileType::CharacterDevice,
        Mode::from_raw_mode(0o666),
        rustix::fs::makedev(1, 3),
    )
    .unwrap();
    xattr(&root.join("a/plain.txt"), "user.test", b"on a file");
    xattr(&root.join("a"), "user.dir", &[0, 1, 2, 255]);
    xattr(root, "user.root", b"top");
    xattr(&root.join("fifo"), "trusted.fifo", b"on the fifo");
    std::os::unix::fs::lchown(root.join("a/b/deep.txt"), Some(1234), Some(5678)).unwrap();
    std::os::unix::fs::lchown(root.join("shared"), Some(1000), Some(1000)).unwrap();
    std::os::unix::fs::lchown(root.join("dangling"), Some(42), Some(43)).unwrap();
    std::os::unix::fs::lchown(root.join("suid"), Some(1000), Some(1000)).unwrap();
    let chmod = |rel: &str, mode| {
        fs::set_permissions(root.join(rel), fs::Permissions::from_mode(mode)).unwrap()
    };
    chmod("shared", 0o2775);
    chmod("a/plain.txt", 0o640);
    chmod("suid", 0o4755);
    chmod("a/b", 0o1750);
    // Times last, deepest first, since making entries changes their directories'.
    let mut when = 1_600_000_000;
    for rel in [
        "a/b/deep.txt",
        "a/b",
        "a/plain.txt",
        "a",
        "dangling",
        "absolute",
        "fifo",
        "sparse",
        "shared",
        "",
    ] {
        set_times(&root.join(rel), when - 1000, when);
        when += 86_400;
    }
}

fn is_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    nfsprov_test_skip::skip(test, "needs root (chown, trusted.* attributes)");
    false
}

fn paths(list: &[PathBuf]) -> BTreeSet<&str> {
    list.iter().map(|p| p.to_str().unwrap()).collect()
}

#[test]
fn a_tree_is_replicated_exactly_then_incrementally() {
    if !is_root("a_tree_is_replicated_exactly_then_incrementally") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("source");
    fs::create_dir(&source).unwrap();
    make_tree(&source);
    let (manifest, scanned) = manifest_of(&source);
    assert_eq!(
        manifest_of(&source).0,
        manifest,
        "the same tree, the same manifest"
    );
    assert_eq!(
        (
            scanned.files,
            scanned.hard_links,
            scanned.symlinks,
            scanned.others
        ),
        (8, 2, 3, 2)
    );
    assert_eq!(manifest[0].path, WireBytes::default());
    let json = serde_json::to_string(&manifest).unwrap();
    assert!(json.contains(r#"{"hex":"62797465732dfffe"}"#), "{json}");
    let sparse = manifest
        .iter()
        .find(|e| rel(&e.path) == Path::new("sparse"))
        .unwrap();
    let whole = fs::read(source.join("sparse")).unwrap();
    assert_eq!(
        sparse.sha256.as_deref().unwrap(),
        nfsprov_api_types::manifest::to_hex(
            ring::digest::digest(&ring::digest::SHA256, &whole).as_ref()
        )
    );

    let first = tmp.path().join("first");
    fs::create_dir(&first).unwrap();
    let mut fetched = Vec::new();
    let stats = build_from(&first, &manifest, None, &mut serve(&source, &mut fetched)).unwrap();
    assert_eq!((stats.fetched_files, stats.base_files), (8, 0));
    assert_eq!(fetched.len(), 8);
    assert_eq!(manifest_of(&first).0, manifest, "the replica's manifest");
    let copied = fs::metadata(first.join("sparse")).unwrap();
    assert_eq!(copied.len(), SPARSE_SIZE);
    assert!(
        copied.blocks() * 512 <= 4 * EXTENT as u64,
        "the sparse file takes {} blocks",
        copied.blocks()
    );
    assert_eq!(
        fs::symlink_metadata(first.join("null")).unwrap().rdev(),
        rustix::fs::makedev(1, 3)
    );
    assert_eq!(
        fs::read_link(first.join("absolute")).unwrap(),
        Path::new("/etc/passwd")
    );
    assert_eq!(
        fs::metadata(first.join("a/plain.txt")).unwrap().ino(),
        fs::metadata(first.join("link-to-plain")).unwrap().ino()
    );

    // Modify one, add one, delete one, rename one, change a mode.
    fs::write(source.join("a/b/deep.txt"), pattern(100_000, 9)).unwrap();
    fs::write(source.join("new.txt"), b"new content").unwrap();
    fs::remove_file(source.join("doomed.txt")).unwrap();
    fs::rename(source.join("moved.txt"), source.join("a/moved-here.txt")).unwrap();
    fs::set_permissions(
        source.join("a/plain.txt"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (changed, _) = manifest_of(&source);

    let second = tmp.path().join("second");
    fs::create_dir(&second).unwrap();
    let base_root = open_dir(&first);
    let base = Base::new(base_root.as_fd(), &manifest);
    let mut fetched = Vec::new();
    let stats = build_from(
        &second,
        &changed,
        Some(&base),
        &mut serve(&source, &mut fetched),
    )
    .unwrap();
    assert_eq!(paths(&fetched), BTreeSet::from(["a/b/deep.txt", "new.txt"]));
    assert_eq!((stats.fetched_files, stats.base_files), (2, 6));
    assert_eq!(manifest_of(&second).0, changed);
    assert!(fs::metadata(second.join("sparse")).unwrap().blocks() * 512 <= 4 * EXTENT as u64);
}

#[test]
fn a_build_cut_short_is_finished_without_fetching_again() {
    if !is_root("a_build_cut_short_is_finished_without_fetching_again") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("source");
    fs::create_dir_all(source.join("d")).unwrap();
    for n in 0..6 {
        fs::write(source.join(format!("d/f{n}")), pattern(10_000 + n, n as u8)).unwrap();
    }
    let (manifest, _) = manifest_of(&source);
    let staging = tmp.path().join("staging");
    fs::create_dir(&staging).unwrap();
    let mut fetched = Vec::new();
    let mut serving = serve(&source, &mut fetched);
    let mut calls = 0;
    let cut = build_from(&staging, &manifest, None, &mut |entry, file| {
        calls += 1;
        if calls == 4 {
            // Half the data arrives, then the connection is cut.
            file.set_len(entry.size / 2).unwrap();
            return Err(StoreError::Conflict("connection cut".into()));
        }
        serving(entry, file)
    });
    assert!(matches!(cut, Err(StoreError::Conflict(_))), "{cut:?}");
    drop(serving);
    assert_eq!(paths(&fetched), BTreeSet::from(["d/f0", "d/f1", "d/f2"]));
    // Nothing but the complete files has a name.
    let names: BTreeSet<_> = fs::read_dir(staging.join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(
        names,
        BTreeSet::from(["f0".into(), "f1".into(), "f2".into()])
    );
    // A complete file spoiled since (same size, other bytes) is not kept.
    let spoiled = fs::read(staging.join("d/f1")).unwrap();
    fs::write(staging.join("d/f1"), pattern(spoiled.len(), 99)).unwrap();

    let mut fetched = Vec::new();
    let stats = build_from(&staging, &manifest, None, &mut serve(&source, &mut fetched)).unwrap();
    assert_eq!(
        paths(&fetched),
        BTreeSet::from(["d/f1", "d/f3", "d/f4", "d/f5"])
    );
    assert_eq!((stats.kept_files, stats.fetched_files), (2, 4));
    assert_eq!(manifest_of(&staging).0, manifest);
}

#[test]
fn content_not_matching_its_hash_is_refused_and_never_named() {
    let tmp = tempfile::tempdir().unwrap();
    let source = tmp.path().join("source");
    fs::create_dir(&source).unwrap();
    fs::write(source.join("file"), b"the real content").unwrap();
    let (manifest, _) = manifest_of(&source);
    let staging = tmp.path().join("staging");
    fs::create_dir(&staging).unwrap();
    let result = build_from(&staging, &manifest, None, &mut |_, file| {
        let mut wire = Vec::new();
        let mut forged = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut forged, b"the fake content").unwrap();
        send_extents(&forged, &mut wire)?;
        receive_extents(&mut wire.as_slice(), file, 16)?;
        Ok(())
    });
    match result {
        Err(StoreError::Conflict(message)) => assert!(message.contains("file"), "{message}"),
        other => panic!("not refused: {other:?}"),
    }
    assert!(!staging.join("file").exists());
}

/// Builds `entries` (after the root) in a fresh staging directory inside a fresh
/// directory; answers the result and what the outer directory then holds besides it.
fn build_hostile(
    entries: Vec<ManifestEntry>,
    prepare: impl FnOnce(&Path, &Path),
) -> (Result<BuildStats>, Vec<String>, usize) {
    let tmp = tempfile::tempdir().unwrap();
    let staging = tmp.path().join("staging");
    fs::create_dir(&staging).unwrap();
    let outside = tmp.path().join("outside");
    fs::create_dir(&outside).unwrap();
    prepare(&staging, &outside);
    let mut manifest = vec![entry("", EntryKind::Directory)];
    manifest.extend(entries);
    let mut fetches = 0;
    let result = build_from(&staging, &manifest, None, &mut |_, _| {
        fetches += 1;
        Ok(())
    });
    let mut around: Vec<String> = fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    around.extend(
        fs::read_dir(&outside)
            .unwrap()
            .map(|e| format!("outside/{}", e.unwrap().file_name().into_string().unwrap())),
    );
    around.sort();
    (result, around, fetches)
}

fn entry(path: &str, kind: EntryKind) -> ManifestEntry {
    ManifestEntry {
        path: path.into(),
        kind,
        mode: 0o755,
        uid: 0,
        gid: 0,
        atime_ns: None,
        mtime_ns: 0,
        size: 0,
        sha256: (kind == EntryKind::File).then(|| "0".repeat(64)),
        target: (kind == EntryKind::Symlink).then(|| "target".into()),
        rdev: None,
        xattrs: Vec::new(),
        link: None,
    }
}

#[test]
fn hostile_manifests_are_refused_and_nothing_is_written_outside() {
    let untouched = vec!["outside".to_owned(), "staging".to_owned()];
    let refused = |result: Result<BuildStats>, kind: &str| match (result, kind) {
        (Err(StoreError::Invalid(message)), "invalid") => message,
        (Err(StoreError::Unsafe(message)), "unsafe") => message,
        (other, _) => panic!("not refused as {kind}: {other:?}"),
    };

    let (result, around, fetches) = build_hostile(vec![entry("../x", EntryKind::Fifo)], |_, _| {});
    assert!(refused(result, "invalid").contains(".."));
    assert_eq!((around.clone(), fetches), (untouched.clone(), 0));

    let tmp = tempfile::tempdir().unwrap();
    let absolute = tmp.path().join("evil");
    let (result, _, fetches) = build_hostile(
        vec![entry(absolute.to_str().unwrap(), EntryKind::File)],
        |_, _| {},
    );
    assert!(refused(result, "invalid").contains("absolute"));
    assert!(!absolute.exists());
    assert_eq!(fetches, 0);

    let mut link = entry("b", EntryKind::File);
    link.link = Some("unknown".into());
    let (result, around, _) = build_hostile(vec![link], |_, _| {});
    assert!(refused(result, "invalid").contains("hard link"));
    assert_eq!(around, untouched);

    // A symlink in the staging tree where the manifest has a directory: never followed.
    let (result, around, _) = build_hostile(
        vec![
            entry("a", EntryKind::Directory),
            entry("a/x", EntryKind::Symlink),
            entry("a/y", EntryKind::File),
        ],
        |staging, outside| symlink(outside, staging.join("a")).unwrap(),
    );
    assert!(refused(result, "unsafe").contains('a'));
    assert_eq!(around, untouched);

    // The manifest's own symlink as a parent: refused by order, before anything is made.
    let (result, around, _) = build_hostile(
        vec![
            entry("a", EntryKind::Symlink),
            entry("a/x", EntryKind::Fifo),
        ],
        |_, _| {},
    );
    assert!(refused(result, "invalid").contains("parent"));
    assert_eq!(around, untouched);
}

/// Frames as raw bytes: each (offset, len) with `len` bytes of data, then the end frame
/// at `end` unless `None`.
fn frames(list: &[(u64, u64)], end: Option<u64>) -> Vec<u8> {
    let mut wire = Vec::new();
    for (offset, len) in list {
        wire.extend_from_slice(&offset.to_be_bytes());
        wire.extend_from_slice(&len.to_be_bytes());
        wire.extend(std::iter::repeat_n(7u8, (*len).min(1 << 16) as usize));
    }
    if let Some(end) = end {
        wire.extend_from_slice(&end.to_be_bytes());
        wire.extend_from_slice(&0u64.to_be_bytes());
    }
    wire
}

#[test]
fn the_extent_codec_refuses_bad_frames() {
    let file = tempfile::tempfile().unwrap();
    let receive = |wire: Vec<u8>| receive_extents(&mut wire.as_slice(), &file, 100);
    assert_eq!(
        receive(frames(&[(0, 10), (50, 10)], Some(100))).unwrap(),
        20
    );
    assert_eq!(
        fs::read(format!(
            "/proc/self/fd/{}",
            std::os::fd::AsRawFd::as_raw_fd(&file)
        ))
        .unwrap()
        .len(),
        100
    );
    for (wire, why) in [
        (frames(&[(50, 10), (0, 10)], Some(100)), "out of order"),
        (frames(&[(0, 10), (5, 10)], Some(100)), "overlapping"),
        (frames(&[(95, 10)], Some(100)), "beyond"),
        (frames(&[(u64::MAX - 1, 10)], Some(100)), "beyond"),
        (frames(&[(0, 10)], None), "before its end frame"),
        (frames(&[(0, 10)], Some(50)), "end frame at 50"),
        (
            frames(&[(0, 10)], Some(100))[..20].to_vec(),
            "inside a frame",
        ),
    ] {
        match receive(wire) {
            Err(StoreError::Invalid(message)) => assert!(message.contains(why), "{why}: {message}"),
            other => panic!("{why}: not refused: {other:?}"),
        }
    }
}

#[test]
fn the_extent_codec_keeps_holes_and_reads_nothing_after_the_end() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("sparse");
    let sparse = File::create(&path).unwrap();
    sparse.set_len(SPARSE_SIZE).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&pattern(EXTENT, 1), 3 << 20).unwrap();
    let sent = File::open(&path).unwrap();
    let mut wire = Vec::new();
    assert_eq!(send_extents(&sent, &mut wire).unwrap(), EXTENT as u64);
    wire.extend_from_slice(b"what follows");
    let received = File::options()
        .read(true)
        .write(true)
        .create_new(true)
        .open(tmp.path().join("received"))
        .unwrap();
    let mut input = wire.as_slice();
    assert_eq!(
        receive_extents(&mut input, &received, SPARSE_SIZE).unwrap(),
        EXTENT as u64
    );
    assert_eq!(input, b"what follows");
    let meta = received.metadata().unwrap();
    assert_eq!(meta.len(), SPARSE_SIZE);
    assert!(
        meta.blocks() * 512 <= 2 * EXTENT as u64,
        "{} blocks",
        meta.blocks()
    );
    assert_eq!(
        fs::read(&path).unwrap(),
        fs::read(tmp.path().join("received")).unwrap()
    );
}

/// A filesystem mounted for a test, unmounted (lazily) when dropped.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_mount_point_inside_the_tree_stops_the_scan() {
    if !is_root("a_mount_point_inside_the_tree_stops_the_scan") {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("tree/mnt")).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "tmpfs"])
        .arg(tmp.path().join("tree/mnt"))
        .output()
        .unwrap();
    if !mounted.status.success() {
        nfsprov_test_skip::skip(
            "a_mount_point_inside_the_tree_stops_the_scan",
            &format!(
                "cannot mount tmpfs: {}",
                String::from_utf8_lossy(&mounted.stderr)
            ),
        );
        return;
    }
    let _mounted = Mounted(tmp.path().join("tree/mnt"));
    fs::write(tmp.path().join("tree/mnt/behind"), b"never read").unwrap();
    let mut emitted = Vec::new();
    let result = scan(open_dir(&tmp.path().join("tree")).as_fd(), &mut |entry| {
        emitted.push(entry.path);
        Ok(())
    });
    match result {
        Err(StoreError::Conflict(message)) => assert!(message.contains("mnt"), "{message}"),
        other => panic!("not refused: {other:?}"),
    }
    assert_eq!(emitted, vec![WireBytes::default()]);
}
