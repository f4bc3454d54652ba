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
use nfsprov_agent::quota::zfs::{Zfs, ZfsError};
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

/// The whole agent over HTTPS with the zfs backend: what a controller sees.
#[tokio::test(flavor = "multi_thread")]
async fn the_agent_enforces_grows_archives_and_deletes_datasets() {
    let Some(pool) = ZfsPool::create("the_agent_enforces_grows_archives_and_deletes_datasets")
    else {
        return;
    };
    let settings = nfsprov_agent::quota::QuotaSettings {
        backend: nfsprov_api_types::QuotaBackend::Zfs,
        zfs_dataset: Some(pool.dataset().to_owned()),
        ..Default::default()
    };
    // The volume below is setgid (2770), which the policy must allow.
    let policy = nfsprov_agent::policy::Policy {
        allow_setgid: true,
        ..Default::default()
    };
    let agent = nfsprov_agent_testkit::TestAgent::start_with(pool.export_root(), settings, policy)
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
    // The path is free for a new volume, which is a new, empty dataset.
    client.create_volume(&path, &request, None).await.unwrap();
    assert!(!dir.join("data").exists());
    client.delete_volume(&path, None).await.unwrap();
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
