//! The ZFS quota backend against a real pool (zfs-fuse here): capacity enforced by
//! `refquota`, archive and destroy moving or removing real datasets, and crash leftovers
//! told apart from finished volumes. Needs root; `NFSPROV_SKIP_ZFS=1` skips.

mod common;

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::zfs_pool::ZfsPool;
use nfsprov_agent::quota::command::SystemRunner;
use nfsprov_agent::store::{Zfs, ZfsError};
use nfsprov_api_types::VolumePath;
use rustix::io::Errno;

const MIB: u64 = 1 << 20;

fn backend(pool: &ZfsPool) -> Zfs {
    let runner = Arc::new(SystemRunner::new(Duration::from_secs(60)));
    Zfs::probe(runner, pool.dataset(), pool.export_root()).unwrap()
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn meta(name: &str) -> String {
    format!(r#"{{"mode":"777","uid":0,"gid":0,"owner":{{"pvc":"{name}"}}}}"#)
}

/// Whether a filesystem other than the parent directory's is mounted at `dir`.
fn is_mountpoint(dir: &Path) -> bool {
    let Ok(own) = std::fs::metadata(dir) else {
        return false;
    };
    let parent = std::fs::metadata(dir.parent().unwrap()).unwrap();
    own.is_dir() && own.dev() != parent.dev()
}

/// Writes `bytes` of data no compression could shrink, synced to disk.
fn write_incompressible(file: &Path, bytes: u64) -> std::io::Result<()> {
    let mut out = std::fs::File::create(file)?;
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut chunk = vec![0u8; MIB as usize];
    for _ in 0..bytes / MIB {
        for word in chunk.chunks_exact_mut(8) {
            // xorshift64
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        out.write_all(&chunk)?;
    }
    out.sync_all()
}

/// Polls `condition` until it holds, failing after `limit`.
fn wait_until<T>(what: &str, limit: Duration, mut condition: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(value) = condition() {
            return value;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn capacity_is_enforced_by_refquota_and_can_be_raised() {
    let Some(pool) = ZfsPool::create("capacity_is_enforced_by_refquota_and_can_be_raised") else {
        return;
    };
    let zfs = backend(&pool);
    let claim = path("ns/claim");
    let dir = pool.export_root().join("ns/claim");
    std::fs::create_dir(pool.export_root().join("ns")).unwrap();

    zfs.create(&claim, Some(4 * MIB)).unwrap();
    assert!(
        is_mountpoint(&dir),
        "the new dataset is mounted at the path"
    );
    assert_eq!(zfs.read_meta(&claim).unwrap(), None, "not finished yet");
    assert!(zfs.list().unwrap().is_empty());
    zfs.write_meta(&claim, &meta("claim")).unwrap();
    assert_eq!(zfs.read_meta(&claim).unwrap(), Some(meta("claim")));
    assert_eq!(zfs.list().unwrap(), [(claim.clone(), meta("claim"))]);

    let data = dir.join("data");
    let err = write_incompressible(&data, 16 * MIB).expect_err("16 MiB fit in a 4 MiB volume");
    assert_eq!(
        err.raw_os_error(),
        Some(Errno::DQUOT.raw_os_error()),
        "expected EDQUOT, got {err}"
    );

    zfs.set_refquota(&claim, Some(64 * MIB)).unwrap();
    write_incompressible(&data, 16 * MIB).expect("16 MiB fit in a 64 MiB volume");
    for n in 0..10 {
        std::fs::write(dir.join(format!("small-{n}")), b"x").unwrap();
    }

    // Figures are those of the last committed transaction group; a property change
    // commits one, so they catch up quickly.
    zfs.set_refquota(&claim, Some(64 * MIB)).unwrap();
    let (bytes, objects) = wait_until("usage to count the data", Duration::from_secs(60), || {
        let usage = zfs.usage(&claim).unwrap();
        (usage.0 >= 16 * MIB && usage.1.is_some_and(|n| n >= 11)).then_some(usage)
    });
    assert!(bytes < 20 * MIB, "referenced {bytes}");
    assert!(objects.unwrap() < 100, "objects {objects:?}");

    zfs.set_refquota(&claim, None).unwrap();
    assert_eq!(
        pool.zfs(&[
            "get",
            "-H",
            "-p",
            "-o",
            "value",
            "refquota",
            &zfs.dataset_name(&claim).unwrap()
        ])
        .trim(),
        "0",
        "no quota"
    );
}

#[test]
fn archive_moves_the_data_and_frees_the_path() {
    let Some(pool) = ZfsPool::create("archive_moves_the_data_and_frees_the_path") else {
        return;
    };
    let zfs = backend(&pool);
    let root = pool.export_root();
    let claim = path("ns/claim");
    std::fs::create_dir(root.join("ns")).unwrap();
    zfs.create(&claim, Some(8 * MIB)).unwrap();
    zfs.write_meta(&claim, &meta("first")).unwrap();
    std::fs::write(root.join("ns/claim/hello"), b"first volume").unwrap();

    let archive_rel = ".archive/ns/claim/@20261122T083958.123456789Z";
    std::fs::create_dir_all(root.join(".archive/ns/claim")).unwrap();
    zfs.archive(&claim, archive_rel).unwrap();

    let archived = root.join(archive_rel);
    assert!(is_mountpoint(&archived));
    assert_eq!(
        std::fs::read(archived.join("hello")).unwrap(),
        b"first volume"
    );
    assert!(
        !root.join("ns/claim").exists(),
        "the old mountpoint is removed"
    );
    assert!(root.join("ns").is_dir());
    assert_eq!(zfs.read_meta(&claim).unwrap(), None);
    assert!(zfs.list().unwrap().is_empty());
    let children = pool.child_datasets();
    assert_eq!(children.len(), 1, "{children:?}");
    assert!(children[0].starts_with(":archive:"), "{children:?}");

    // The path is free for a new volume, and the archive stays as it was.
    zfs.create(&claim, Some(8 * MIB)).unwrap();
    assert!(is_mountpoint(&root.join("ns/claim")));
    assert_eq!(std::fs::read_dir(root.join("ns/claim")).unwrap().count(), 0);
    zfs.write_meta(&claim, &meta("second")).unwrap();
    assert_eq!(zfs.list().unwrap(), [(claim.clone(), meta("second"))]);
    assert_eq!(
        std::fs::read(archived.join("hello")).unwrap(),
        b"first volume"
    );

    // Destroying the new volume leaves the archive alone.
    zfs.destroy(&claim).unwrap();
    assert!(archived.join("hello").exists());
    assert_eq!(pool.child_datasets(), children);
}

#[test]
fn destroy_removes_the_dataset_and_its_directory() {
    let Some(pool) = ZfsPool::create("destroy_removes_the_dataset_and_its_directory") else {
        return;
    };
    let zfs = backend(&pool);
    let root = pool.export_root();
    let volume = path("team/app/data");
    std::fs::create_dir_all(root.join("team/app")).unwrap();
    zfs.create(&volume, Some(8 * MIB)).unwrap();
    zfs.write_meta(&volume, &meta("data")).unwrap();
    std::fs::create_dir(root.join("team/app/data/sub")).unwrap();
    std::fs::write(root.join("team/app/data/sub/file"), b"x").unwrap();
    assert_eq!(pool.child_datasets(), ["team:app:data"]);

    zfs.destroy(&volume).unwrap();
    assert!(pool.child_datasets().is_empty());
    assert!(!root.join("team/app/data").exists());
    assert!(root.join("team/app").is_dir(), "parents are the caller's");
    assert_eq!(zfs.read_meta(&volume).unwrap(), None);
    zfs.destroy(&volume).unwrap();

    // Right after creation too (zfs-fuse calls a freshly unmounted dataset busy).
    zfs.create(&volume, None).unwrap();
    zfs.destroy(&volume).unwrap();
    assert!(pool.child_datasets().is_empty());
}

#[test]
fn list_and_purge_tell_finished_volumes_from_leftovers() {
    let Some(pool) = ZfsPool::create("list_and_purge_tell_finished_volumes_from_leftovers") else {
        return;
    };
    let zfs = backend(&pool);
    let root = pool.export_root();
    std::fs::create_dir_all(root.join("n")).unwrap();
    std::fs::create_dir_all(root.join(".archive/gone")).unwrap();
    for (name, finished) in [
        ("done", true),
        ("n/deep", true),
        ("half", false),
        ("gone", true),
    ] {
        zfs.create(&path(name), Some(8 * MIB)).unwrap();
        if finished {
            zfs.write_meta(&path(name), &meta(name)).unwrap();
        }
    }
    zfs.archive(&path("gone"), ".archive/gone/@1").unwrap();
    // A dataset of the operator's, in the volume naming and not.
    let foreign = format!("{}/scratch", pool.dataset());
    let mountpoint = format!("mountpoint={}", root.join("scratch").display());
    pool.zfs(&["create", "-o", &mountpoint, &foreign]);
    pool.zfs(&[
        "create",
        "-o",
        "mountpoint=none",
        &format!("{}/tmp-x", pool.dataset()),
    ]);

    let expected = [
        (path("done"), meta("done")),
        (path("n/deep"), meta("n/deep")),
    ];
    assert_eq!(zfs.list().unwrap(), expected);

    for taken in ["done", "scratch"] {
        let err = zfs.create(&path(taken), None).unwrap_err();
        assert!(matches!(err, ZfsError::Conflict(_)), "{taken}: {err}");
    }
    let err = zfs.destroy(&path("scratch")).unwrap_err();
    assert!(matches!(err, ZfsError::Conflict(_)), "{err}");

    assert_eq!(zfs.purge_leftovers().unwrap(), 1);
    assert!(!root.join("half").exists());
    let mut children = pool.child_datasets();
    children.retain(|c| !c.starts_with(":archive:"));
    children.sort();
    assert_eq!(children, ["done", "n:deep", "scratch", "tmp-x"]);
    assert_eq!(zfs.list().unwrap(), expected);
    assert_eq!(zfs.purge_leftovers().unwrap(), 0);

    // A create interrupted before its metadata is replaced by the next create.
    zfs.create(&path("redo"), Some(8 * MIB)).unwrap();
    std::fs::write(root.join("redo/partial"), b"x").unwrap();
    zfs.create(&path("redo"), Some(8 * MIB)).unwrap();
    assert!(!root.join("redo/partial").exists());
}

/// Every snapshot in the test pool.
fn snapshots(pool: &ZfsPool) -> Vec<String> {
    pool.zfs(&[
        "list",
        "-H",
        "-o",
        "name",
        "-t",
        "snapshot",
        "-r",
        pool.dataset(),
    ])
    .lines()
    .map(str::to_owned)
    .collect()
}

/// What a dataset was cloned from, `-` for none.
fn origin(pool: &ZfsPool, child: &str) -> String {
    let name = format!("{}/{child}", pool.dataset());
    pool.zfs(&["get", "-H", "-o", "value", "origin", &name])
        .trim()
        .to_owned()
}

/// A finished volume at `p` holding `files` (name, content), owned by 1000:1000.
fn volume_with_files(zfs: &Zfs, pool: &ZfsPool, p: &str, files: &[(&str, &str)]) {
    zfs.create(&path(p), Some(32 * MIB)).unwrap();
    let dir = pool.export_root().join(p);
    for (name, content) in files {
        let file = dir.join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        std::fs::write(&file, content).unwrap();
        std::os::unix::fs::chown(&file, Some(1000), Some(1000)).unwrap();
    }
    std::os::unix::fs::chown(&dir, Some(1000), Some(1000)).unwrap();
    zfs.write_meta(&path(p), &meta(p)).unwrap();
}

/// Writes `content` to `file`, owned by 1000:1000 like the files of `volume_with_files`.
fn write_owned(file: impl AsRef<Path>, content: &str) -> std::io::Result<()> {
    std::fs::write(&file, content)?;
    std::os::unix::fs::chown(&file, Some(1000), Some(1000))
}

/// `files` are in the volume at `p` with that content, owned by 1000:1000.
fn assert_files(pool: &ZfsPool, p: &str, files: &[(&str, &str)]) {
    for (name, content) in files {
        let file = pool.export_root().join(p).join(name);
        assert_eq!(
            std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display())),
            *content,
            "{}",
            file.display()
        );
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{}", file.display());
    }
}

#[test]
fn clones_share_the_source_data_and_outlive_it() {
    let Some(pool) = ZfsPool::create("clones_share_the_source_data_and_outlive_it") else {
        return;
    };
    let zfs = backend(&pool);
    let root = pool.export_root();
    std::fs::create_dir(root.join("ns")).unwrap();
    let original = [("a.txt", "first file"), ("sub/b.txt", "second file")];
    volume_with_files(&zfs, &pool, "ns/src", &original);

    zfs.clone_volume(&path("ns/src"), &path("ns/copy"), Some(16 * MIB))
        .unwrap();
    assert!(is_mountpoint(&root.join("ns/copy")));
    assert_files(&pool, "ns/copy", &original);
    let top = std::fs::metadata(root.join("ns/copy")).unwrap();
    assert_eq!(
        (top.uid(), top.gid()),
        (1000, 1000),
        "the root's owner comes along"
    );
    // The clone is the agent's, unfinished: the source's record did not come along.
    assert_eq!(zfs.read_meta(&path("ns/copy")).unwrap(), None);
    let copy = format!("{}/ns:copy", pool.dataset());
    assert_eq!(
        pool.zfs(&[
            "get",
            "-H",
            "-p",
            "-o",
            "property,value,source",
            "nfsprov:path,nfsprov:volume,refquota",
            &copy
        ]),
        format!(
            "nfsprov:path\tns/copy\tlocal\nnfsprov:volume\t-\t-\nrefquota\t{}\tlocal\n",
            16 * MIB
        )
    );
    assert_eq!(zfs.list().unwrap(), [(path("ns/src"), meta("ns/src"))]);
    zfs.write_meta(&path("ns/copy"), &meta("ns/copy")).unwrap();
    let [snapshot] = &snapshots(&pool)[..] else {
        panic!("one snapshot: {:?}", snapshots(&pool));
    };
    assert!(
        snapshot.starts_with(&format!("{}/ns:src@nfsprov-clone-", pool.dataset())),
        "{snapshot}"
    );
    assert_eq!(origin(&pool, "ns:copy"), *snapshot);

    // Each side is written apart from the other.
    write_owned(root.join("ns/copy/a.txt"), "changed in the copy").unwrap();
    write_owned(root.join("ns/copy/new.txt"), "only in the copy").unwrap();
    write_owned(root.join("ns/src/sub/b.txt"), "changed in the source").unwrap();
    assert_files(&pool, "ns/src", &[("a.txt", "first file")]);
    assert_eq!(
        std::fs::read_to_string(root.join("ns/src/sub/b.txt")).unwrap(),
        "changed in the source"
    );
    assert!(!root.join("ns/src/new.txt").exists());
    assert_eq!(
        std::fs::read_to_string(root.join("ns/copy/sub/b.txt")).unwrap(),
        "second file"
    );

    // The source goes first: the clone is promoted, keeps its data, and no snapshot is
    // left.
    zfs.destroy(&path("ns/src")).unwrap();
    assert!(!root.join("ns/src").exists());
    assert_eq!(pool.child_datasets(), ["ns:copy"]);
    assert_eq!(snapshots(&pool), Vec::<String>::new());
    assert_eq!(origin(&pool, "ns:copy"), "-");
    assert_eq!(
        std::fs::read_to_string(root.join("ns/copy/a.txt")).unwrap(),
        "changed in the copy"
    );
    assert_files(
        &pool,
        "ns/copy",
        &[
            ("sub/b.txt", "second file"),
            ("new.txt", "only in the copy"),
        ],
    );
    assert_eq!(zfs.list().unwrap(), [(path("ns/copy"), meta("ns/copy"))]);

    zfs.destroy(&path("ns/copy")).unwrap();
    assert!(pool.child_datasets().is_empty());
    assert!(snapshots(&pool).is_empty());
    assert!(!root.join("ns/copy").exists());

    // The clone goes first: its snapshot goes with it, the source stays as it was.
    volume_with_files(&zfs, &pool, "ns/src", &original);
    zfs.clone_volume(&path("ns/src"), &path("ns/copy"), None)
        .unwrap();
    assert_eq!(snapshots(&pool).len(), 1);
    zfs.destroy(&path("ns/copy")).unwrap();
    assert!(snapshots(&pool).is_empty());
    assert_eq!(pool.child_datasets(), ["ns:src"]);
    assert_files(&pool, "ns/src", &original);

    // A quota below what the source holds is refused, and leaves nothing behind.
    write_incompressible(&root.join("ns/src/big"), 4 * MIB).unwrap();
    // A property change commits a transaction group, so `referenced` counts the data.
    zfs.set_refquota(&path("ns/src"), Some(32 * MIB)).unwrap();
    wait_until(
        "the source to count its data",
        Duration::from_secs(60),
        || (zfs.usage(&path("ns/src")).unwrap().0 >= 4 * MIB).then_some(()),
    );
    let err = zfs
        .clone_volume(&path("ns/src"), &path("ns/copy"), Some(MIB))
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("at least")),
        "{err}"
    );
    assert!(snapshots(&pool).is_empty());
    assert_eq!(pool.child_datasets(), ["ns:src"]);
    assert!(!root.join("ns/copy").exists());

    // A missing source, or an unfinished one, is no source.
    let err = zfs
        .clone_volume(&path("ns/none"), &path("ns/copy"), None)
        .unwrap_err();
    assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
    zfs.create(&path("ns/half"), None).unwrap();
    let err = zfs
        .clone_volume(&path("ns/half"), &path("ns/copy"), None)
        .unwrap_err();
    assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
    assert!(snapshots(&pool).is_empty());
}

#[test]
fn clones_of_clones_and_archived_sources_leave_nothing_once_all_are_destroyed() {
    let Some(pool) = ZfsPool::create(
        "clones_of_clones_and_archived_sources_leave_nothing_once_all_are_destroyed",
    ) else {
        return;
    };
    let zfs = backend(&pool);
    let root = pool.export_root();

    // Two clones of one source, from different points in time; the source goes first,
    // then the older clone, then the newer.
    volume_with_files(&zfs, &pool, "src", &[("f", "one")]);
    zfs.clone_volume(&path("src"), &path("c1"), None).unwrap();
    zfs.write_meta(&path("c1"), &meta("c1")).unwrap();
    write_owned(root.join("src/f"), "two").unwrap();
    zfs.clone_volume(&path("src"), &path("c2"), None).unwrap();
    zfs.write_meta(&path("c2"), &meta("c2")).unwrap();
    assert_eq!(snapshots(&pool).len(), 2);
    zfs.destroy(&path("src")).unwrap();
    assert_files(&pool, "c1", &[("f", "one")]);
    assert_files(&pool, "c2", &[("f", "two")]);
    // The newer clone took over the older snapshot, which the older clone needs.
    let left = snapshots(&pool);
    assert_eq!(left.len(), 1, "{left:?}");
    assert!(left[0].contains("/c2@nfsprov-clone-"), "{left:?}");
    assert_eq!(origin(&pool, "c1"), left[0]);
    zfs.destroy(&path("c1")).unwrap();
    assert!(snapshots(&pool).is_empty());
    assert_files(&pool, "c2", &[("f", "two")]);
    zfs.destroy(&path("c2")).unwrap();
    assert!(pool.child_datasets().is_empty());

    // A chain: a clone of a clone, whose middle goes first.
    volume_with_files(&zfs, &pool, "src", &[("f", "base")]);
    zfs.clone_volume(&path("src"), &path("mid"), None).unwrap();
    zfs.write_meta(&path("mid"), &meta("mid")).unwrap();
    write_owned(root.join("mid/g"), "middle").unwrap();
    zfs.clone_volume(&path("mid"), &path("end"), None).unwrap();
    zfs.write_meta(&path("end"), &meta("end")).unwrap();
    zfs.destroy(&path("mid")).unwrap();
    assert_eq!(pool.child_datasets().len(), 2);
    assert_files(&pool, "end", &[("f", "base"), ("g", "middle")]);
    assert_files(&pool, "src", &[("f", "base")]);
    zfs.destroy(&path("src")).unwrap();
    assert_files(&pool, "end", &[("f", "base"), ("g", "middle")]);
    zfs.destroy(&path("end")).unwrap();
    assert!(pool.child_datasets().is_empty());
    assert!(snapshots(&pool).is_empty());

    // Archiving works in either order (each promotes the other's clone: zfs-fuse cannot
    // rename a dataset whose snapshot a mounted clone depends on), and the archives are
    // destroyed in either order. Repeated, since zfs-fuse refuses such renames only about
    // every other time: source then copy archived, source archive destroyed first; copy
    // then source, copy first; source then copy, copy first.
    for round in 0..3 {
        let stamp = format!("@20261122T083958.12345678{round}Z");
        let (src_archive, copy_archive) = if round % 2 == 0 {
            ("src", "copy")
        } else {
            ("copy", "src")
        };
        volume_with_files(&zfs, &pool, "src", &[("f", "archived")]);
        zfs.clone_volume(&path("src"), &path("copy"), None).unwrap();
        zfs.write_meta(&path("copy"), &meta("copy")).unwrap();
        write_owned(root.join("copy/g"), "copy only").unwrap();
        let first = format!(".archive/{src_archive}/{stamp}");
        let second = format!(".archive/{copy_archive}/{stamp}");
        std::fs::create_dir_all(root.join(format!(".archive/{src_archive}"))).unwrap();
        std::fs::create_dir_all(root.join(format!(".archive/{copy_archive}"))).unwrap();
        zfs.archive(&path(src_archive), &first).unwrap();
        assert!(!root.join(src_archive).exists());
        zfs.archive(&path(copy_archive), &second).unwrap();
        let (src_at, copy_at) = if round % 2 == 0 {
            (&first, &second)
        } else {
            (&second, &first)
        };
        assert_files(&pool, src_at, &[("f", "archived")]);
        assert!(!root.join(src_at).join("g").exists());
        assert_files(&pool, copy_at, &[("f", "archived"), ("g", "copy only")]);
        assert_eq!(zfs.list().unwrap(), []);
        assert_eq!(zfs.archives().unwrap().len(), 2);
        // One snapshot links them, whichever holds it now.
        assert_eq!(snapshots(&pool).len(), 1, "{:?}", snapshots(&pool));

        let (gone_first, gone_last) = if round == 0 {
            (src_at, copy_at)
        } else {
            (copy_at, src_at)
        };
        zfs.destroy_archive(gone_first).unwrap();
        assert_eq!(zfs.archives().unwrap().len(), 1);
        assert!(snapshots(&pool).is_empty(), "{:?}", snapshots(&pool));
        let kept = if gone_last == src_at {
            vec![("f", "archived")]
        } else {
            vec![("f", "archived"), ("g", "copy only")]
        };
        assert_files(&pool, gone_last, &kept);
        zfs.destroy_archive(gone_last).unwrap();
        assert!(pool.child_datasets().is_empty());
        assert!(snapshots(&pool).is_empty());
    }

    // An archived clone takes its snapshot along when destroyed.
    volume_with_files(&zfs, &pool, "src", &[("f", "again")]);
    zfs.clone_volume(&path("src"), &path("copy2"), None)
        .unwrap();
    zfs.write_meta(&path("copy2"), &meta("copy2")).unwrap();
    let archived_clone = ".archive/copy2/@20261122T083958.123456789Z";
    std::fs::create_dir_all(root.join(".archive/copy2")).unwrap();
    zfs.archive(&path("copy2"), archived_clone).unwrap();
    zfs.destroy_archive(archived_clone).unwrap();
    assert!(snapshots(&pool).is_empty());
    zfs.destroy(&path("src")).unwrap();
    assert!(pool.child_datasets().is_empty());

    // A leftover clone (never given its record) is purged with its snapshot.
    volume_with_files(&zfs, &pool, "src", &[("f", "x")]);
    zfs.clone_volume(&path("src"), &path("half"), None).unwrap();
    assert_eq!(zfs.purge_leftovers().unwrap(), 1);
    assert_eq!(pool.child_datasets(), ["src"]);
    assert!(snapshots(&pool).is_empty());
}

#[test]
fn probe_checks_the_real_dataset() {
    let Some(pool) = ZfsPool::create("probe_checks_the_real_dataset") else {
        return;
    };
    let runner = Arc::new(SystemRunner::new(Duration::from_secs(60)));
    Zfs::probe(runner.clone(), pool.dataset(), pool.export_root()).unwrap();

    let elsewhere = pool.scratch_dir().join("elsewhere");
    let err = Zfs::probe(runner.clone(), pool.dataset(), &elsewhere).unwrap_err();
    assert!(err.contains("zfs set mountpoint="), "{err}");

    let missing = format!("{}/missing", pool.dataset());
    let err = Zfs::probe(runner.clone(), &missing, pool.export_root()).unwrap_err();
    assert!(
        err.contains("does not exist") && err.contains("zfs create"),
        "{err}"
    );

    pool.zfs(&["umount", pool.dataset()]);
    let err = Zfs::probe(runner, pool.dataset(), pool.export_root()).unwrap_err();
    assert!(err.contains("not mounted"), "{err}");
}

/// The capacity the agent reports promised to its volumes.
async fn provisioned(client: &nfsprov_api_types::client::AgentClient) -> u64 {
    let info = client.info(None).await.unwrap();
    info.provisioning.expect("reported").provisioned_bytes
}

/// The whole agent over HTTPS with the zfs backend: what a controller sees.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_enforces_grows_archives_and_deletes_datasets() {
    let Some(pool) = ZfsPool::create("the_agent_enforces_grows_archives_and_deletes_datasets")
    else {
        return;
    };
    let settings = pool.quota_settings();
    // The volume below is setgid (2770), which the policy must allow.
    let policy = nfsprov_agent::policy::Policy {
        allow_setgid: true,
        ..Default::default()
    };
    let agent = nfsprov_agent_testkit::TestAgent::start_with(
        pool.export_root(),
        settings.clone(),
        policy.clone(),
    )
    .await
    .unwrap();
    let client = agent.client();
    let info = client.info(None).await.unwrap();
    assert!(info.capabilities.quota_enforced);
    assert_eq!(
        info.capabilities.quota,
        nfsprov_api_types::QuotaBackend::Zfs
    );

    let path = VolumePath::parse("ns/claim").unwrap();
    let request = nfsprov_api_types::CreateVolumeRequest {
        capacity_bytes: 8 * MIB,
        mode: nfsprov_api_types::Mode::new(0o2770).unwrap(),
        uid: Some(1000),
        gid: Some(1000),
        quota: nfsprov_api_types::QuotaPolicy::Enforce,
        ..Default::default()
    };
    let created = client.create_volume(&path, &request, None).await.unwrap();
    assert!(created.created && created.volume.quota_enforced);
    // The same request again is confirmed, not repeated.
    assert!(
        !client
            .create_volume(&path, &request, None)
            .await
            .unwrap()
            .created
    );
    let dir = pool.export_root().join("ns/claim");
    let meta = std::fs::metadata(&dir).unwrap();
    assert_ne!(
        meta.dev(),
        std::fs::metadata(pool.export_root()).unwrap().dev(),
        "a dataset of its own"
    );
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (1000, 1000, 0o2770)
    );

    let data = dir.join("data");
    let err = write_incompressible(&data, 16 * MIB).expect_err("16 MiB past 8 MiB");
    assert_eq!(
        err.raw_os_error(),
        Some(Errno::DQUOT.raw_os_error()),
        "{err}"
    );
    let grown = client.resize_volume(&path, 64 * MIB, None).await.unwrap();
    assert_eq!(grown.capacity_bytes, 64 * MIB);
    assert_eq!(provisioned(&client).await, 64 * MIB);
    assert_eq!(
        pool.zfs(&[
            "get",
            "-H",
            "-p",
            "-o",
            "value",
            "refquota",
            &format!("{}/ns:claim", pool.dataset())
        ])
        .trim(),
        (64 * MIB).to_string()
    );
    write_incompressible(&data, 16 * MIB).expect("16 MiB fit after the resize");
    let shrink = client.resize_volume(&path, MIB, None).await.unwrap_err();
    assert_eq!(
        shrink.code(),
        Some(nfsprov_api_types::ErrorCode::Unsupported)
    );

    let listed = client.list_volumes(None).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].path, path);

    let archived = client.archive_volume(&path, None, None).await.unwrap();
    let archived_data = pool.export_root().join(&archived.archive_path).join("data");
    assert_eq!(std::fs::metadata(&archived_data).unwrap().len(), 16 * MIB);
    assert!(client.get_volume(&path, None).await.unwrap().is_none());
    assert_eq!(
        provisioned(&client).await,
        0,
        "an archived dataset promises nothing"
    );
    // The path is free for a new volume, which is a new, empty dataset.
    client.create_volume(&path, &request, None).await.unwrap();
    assert!(!dir.join("data").exists());
    assert_eq!(provisioned(&client).await, 8 * MIB);
    // A new start counts the datasets' records again.
    agent.stop().await.unwrap();
    let agent = nfsprov_agent_testkit::TestAgent::start_with(pool.export_root(), settings, policy)
        .await
        .unwrap();
    let client = agent.client();
    assert_eq!(provisioned(&client).await, 8 * MIB);
    client.delete_volume(&path, None).await.unwrap();
    assert_eq!(provisioned(&client).await, 0);
    assert!(client.get_volume(&path, None).await.unwrap().is_none());
    assert!(client.list_volumes(None).await.unwrap().is_empty());

    // The archive is listed from its dataset, measured by it, and destroyed with it.
    let [listed] = &client.list_archives(None).await.unwrap()[..] else {
        panic!("one archive");
    };
    assert_eq!(format!(".archive/{}", listed.id), archived.archive_path);
    assert_eq!(listed.path, path);
    assert!(listed.size_bytes.unwrap() >= 16 * MIB, "{listed:?}");
    assert_eq!(
        pool.child_datasets().len(),
        1,
        "{:?}",
        pool.child_datasets()
    );
    client.delete_archive(&listed.id, None).await.unwrap();
    assert!(
        pool.child_datasets().is_empty(),
        "{:?}",
        pool.child_datasets()
    );
    assert!(!pool.export_root().join(&archived.archive_path).exists());
    assert!(!pool.export_root().join(".archive/ns").exists());
    assert!(client.list_archives(None).await.unwrap().is_empty());
    client.delete_archive(&listed.id, None).await.unwrap();
    agent.stop().await.unwrap();
}

/// `POST /v1/clones/{path}` on the whole agent: a ZFS clone, instant, that outlives its
/// source.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_clones_datasets_and_deletes_them_in_any_order() {
    let Some(pool) = ZfsPool::create("the_agent_clones_datasets_and_deletes_them_in_any_order")
    else {
        return;
    };
    let settings = pool.quota_settings();
    let agent = nfsprov_agent_testkit::TestAgent::start_with_quota(pool.export_root(), settings)
        .await
        .unwrap();
    let client = agent.client();
    let root = pool.export_root();

    let source = VolumePath::parse("ns/source").unwrap();
    let request = nfsprov_api_types::CreateVolumeRequest {
        capacity_bytes: 16 * MIB,
        mode: nfsprov_api_types::Mode::new(0o750).unwrap(),
        uid: Some(1000),
        gid: Some(1000),
        quota: nfsprov_api_types::QuotaPolicy::Enforce,
        ..Default::default()
    };
    client.create_volume(&source, &request, None).await.unwrap();
    let files = [("data.txt", "the source's data"), ("dir/more", "more")];
    for (name, content) in files {
        let file = root.join("ns/source").join(name);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        write_owned(&file, content).unwrap();
    }

    let copy = VolumePath::parse("ns/copy").unwrap();
    let clone_request = nfsprov_api_types::CloneVolumeRequest {
        source: source.clone(),
        capacity_bytes: 32 * MIB,
        owner: nfsprov_api_types::VolumeOwner {
            pvc_namespace: Some("ns".into()),
            pvc_name: Some("copy".into()),
            pv_name: Some("pv-copy".into()),
        },
        quota: nfsprov_api_types::QuotaPolicy::BestEffort,
        export: None,
    };
    let nfsprov_api_types::client::CloneOutcome::Ready(made) = client
        .clone_volume(&copy, &clone_request, None)
        .await
        .unwrap()
    else {
        panic!("a ZFS clone is made at once");
    };
    assert!(made.created);
    let volume = made.volume;
    assert_eq!(
        volume.clone,
        Some(nfsprov_api_types::CloneOrigin {
            source: source.clone(),
            method: nfsprov_api_types::CloneMethod::ZfsClone,
        })
    );
    assert!(volume.quota_enforced);
    assert_eq!(
        (
            volume.uid,
            volume.gid,
            volume.mode.bits(),
            volume.capacity_bytes
        ),
        (1000, 1000, 0o750, 32 * MIB)
    );
    assert_eq!(volume.owner, clone_request.owner);
    let copy_dataset = format!("{}/ns:copy", pool.dataset());
    assert_eq!(
        pool.zfs(&["get", "-H", "-p", "-o", "value", "refquota", &copy_dataset])
            .trim(),
        (32 * MIB).to_string()
    );
    assert_files(&pool, "ns/copy", &files);
    // The same request again is confirmed.
    let nfsprov_api_types::client::CloneOutcome::Ready(again) = client
        .clone_volume(&copy, &clone_request, None)
        .await
        .unwrap()
    else {
        panic!("the clone is there");
    };
    assert!(!again.created);
    assert_eq!(snapshots(&pool).len(), 1);

    write_owned(root.join("ns/copy/data.txt"), "the copy's data").unwrap();
    assert_files(&pool, "ns/source", &files);

    // The source goes first; the copy keeps its data and no snapshot is left.
    client.delete_volume(&source, None).await.unwrap();
    assert!(client.get_volume(&source, None).await.unwrap().is_none());
    let kept = client.get_volume(&copy, None).await.unwrap().unwrap();
    assert_eq!(kept.clone, volume.clone);
    assert_files(
        &pool,
        "ns/copy",
        &[("data.txt", "the copy's data"), ("dir/more", "more")],
    );
    assert_eq!(pool.child_datasets(), ["ns:copy"]);
    assert!(snapshots(&pool).is_empty(), "{:?}", snapshots(&pool));

    client.delete_volume(&copy, None).await.unwrap();
    assert!(client.list_volumes(None).await.unwrap().is_empty());
    assert!(pool.child_datasets().is_empty());
    assert!(snapshots(&pool).is_empty());
    agent.stop().await.unwrap();
}
