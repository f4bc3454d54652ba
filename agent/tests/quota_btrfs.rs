//! The btrfs quota backend on a real btrfs filesystem, made in a file and loop-mounted by
//! the test (root required): capacity enforced with EDQUOT, raised by a resize, volumes
//! created, archived and deleted as subvolumes.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::LoopBtrfs;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, QuotaBackend, QuotaPolicy, VolumePath};

const MIB: u64 = 1 << 20;

fn btrfs_settings() -> QuotaSettings {
    QuotaSettings {
        backend: QuotaBackend::Btrfs,
        ..QuotaSettings::default()
    }
}

fn request(capacity_bytes: u64, quota: QuotaPolicy) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        quota,
        ..Default::default()
    }
}

/// Writes `bytes` of data into a new file and flushes it to the filesystem.
fn fill(file: &Path, bytes: u64) -> std::io::Result<()> {
    let mut out = std::fs::File::create(file)?;
    let chunk = vec![0x5a_u8; MIB as usize];
    for _ in 0..bytes / MIB {
        out.write_all(&chunk)?;
    }
    out.sync_all()
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_is_enforced_and_raised_by_a_resize() {
    let fs = LoopBtrfs::new(512, true).unwrap();
    let agent = TestAgent::start_with_quota(&fs.root(), btrfs_settings())
        .await
        .unwrap();
    let client = agent.client();
    let info = client.info(None).await.unwrap();
    assert_eq!(info.capabilities.quota, QuotaBackend::Btrfs);
    assert!(info.capabilities.quota_enforced);

    let path = VolumePath::parse("ns/claim").unwrap();
    let created = client
        .create_volume(&path, &request(16 * MIB, QuotaPolicy::Enforce), None)
        .await
        .unwrap();
    assert!(created.created && created.volume.quota_enforced);
    let volume_dir = fs.root().join("ns/claim");
    assert_eq!(
        std::fs::metadata(&volume_dir).unwrap().ino(),
        256,
        "the volume is a subvolume root"
    );

    // Past the capacity: the filesystem refuses with EDQUOT.
    let data = volume_dir.join("data");
    let err = fill(&data, 32 * MIB).expect_err("a write past the capacity must fail");
    assert_eq!(
        err.raw_os_error(),
        Some(rustix::io::Errno::DQUOT.raw_os_error()),
        "{err}"
    );

    // Growing is idempotent, shrinking is refused, and the same write then succeeds.
    let grown = client.resize_volume(&path, 64 * MIB, None).await.unwrap();
    assert_eq!(grown.capacity_bytes, 64 * MIB);
    let again = client.resize_volume(&path, 64 * MIB, None).await.unwrap();
    assert_eq!(again, grown);
    let shrink = client
        .resize_volume(&path, 8 * MIB, None)
        .await
        .unwrap_err();
    assert_eq!(shrink.code(), Some(ErrorCode::Unsupported), "{shrink}");
    fill(&data, 32 * MIB).expect("the write fits after the resize");

    // Usage comes from the qgroup, which counts the data written.
    fs.sync().unwrap();
    let volume = client.get_volume(&path, None).await.unwrap().unwrap();
    let usage = volume.usage.expect("usage is reported");
    assert!(
        (32 * MIB..40 * MIB).contains(&usage.used_bytes),
        "used bytes {}",
        usage.used_bytes
    );
    assert_eq!(volume.capacity_bytes, 64 * MIB);
    assert_eq!(fs.qgroup_limit(&volume_dir).unwrap(), Some(64 * MIB));
}

#[tokio::test(flavor = "multi_thread")]
async fn subvolumes_are_archived_and_deleted_as_subvolumes() {
    let fs = LoopBtrfs::new(512, true).unwrap();
    let agent = TestAgent::start_with_quota(&fs.root(), btrfs_settings())
        .await
        .unwrap();
    let client = agent.client();
    let kept = VolumePath::parse("ns/kept").unwrap();
    let gone = VolumePath::parse("ns/gone").unwrap();
    for path in [&kept, &gone] {
        client
            .create_volume(path, &request(8 * MIB, QuotaPolicy::BestEffort), None)
            .await
            .unwrap();
    }
    std::fs::write(fs.root().join("ns/kept/file"), b"kept").unwrap();
    std::fs::write(fs.root().join("ns/gone/file"), b"gone").unwrap();

    let archived = client.archive_volume(&kept, None, None).await.unwrap();
    let archive_dir = fs.root().join(&archived.archive_path);
    assert_eq!(std::fs::read(archive_dir.join("file")).unwrap(), b"kept");
    assert_eq!(std::fs::metadata(&archive_dir).unwrap().ino(), 256);

    client.delete_volume(&gone, None).await.unwrap();
    assert!(!fs.root().join("ns/gone").exists());
    let subvolumes = fs.subvolumes().unwrap();
    assert!(
        subvolumes.contains("ns/kept/@") && !subvolumes.contains("gone"),
        "the deleted subvolume is gone, the archived one kept: {subvolumes}"
    );

    // The path is free again, and a new volume there is a new subvolume.
    client
        .create_volume(&gone, &request(8 * MIB, QuotaPolicy::BestEffort), None)
        .await
        .unwrap();
    assert!(!fs.root().join("ns/gone/file").exists());

    // Deleting the archive deletes its subvolume (and with it the qgroup's charge).
    let [listed] = &client.list_archives(None).await.unwrap()[..] else {
        panic!("one archive");
    };
    assert_eq!(
        format!(".archive/{}", listed.id),
        archived.archive_path,
        "{listed:?}"
    );
    assert!(listed.size_bytes.is_some(), "{listed:?}");
    client.delete_archive(&listed.id, None).await.unwrap();
    assert!(!archive_dir.exists());
    let subvolumes = fs.subvolumes().unwrap();
    assert!(
        !subvolumes.contains("ns/kept/@") && !subvolumes.contains("trash"),
        "the archived subvolume is deleted as a subvolume: {subvolumes}"
    );
    assert!(client.list_archives(None).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn quota_off_makes_a_plain_directory_and_enforce_needs_a_backend() {
    let fs = LoopBtrfs::new(512, true).unwrap();
    let agent = TestAgent::start_with_quota(&fs.root(), btrfs_settings())
        .await
        .unwrap();
    let path = VolumePath::parse("plain").unwrap();
    let volume = agent
        .client()
        .create_volume(&path, &request(MIB, QuotaPolicy::Off), None)
        .await
        .unwrap()
        .volume;
    assert!(!volume.quota_enforced);
    assert_ne!(
        std::fs::metadata(fs.root().join("plain")).unwrap().ino(),
        256
    );
    fill(&fs.root().join("plain/data"), 4 * MIB).expect("nothing limits it");
    // Asking for the same volume with enforcement cannot be confirmed by it.
    let err = agent
        .client()
        .create_volume(&path, &request(MIB, QuotaPolicy::Enforce), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Conflict), "{err}");
    assert!(err.to_string().contains("no enforced quota"), "{err}");
    agent.client().delete_volume(&path, None).await.unwrap();
    assert!(!fs.root().join("plain").exists());

    // An agent without a backend refuses `enforce` and creates nothing.
    let unenforced = tempfile::tempdir().unwrap();
    let plain_agent = TestAgent::start(unenforced.path()).await.unwrap();
    let err = plain_agent
        .client()
        .create_volume(&path, &request(MIB, QuotaPolicy::Enforce), None)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Unsupported), "{err}");
    assert!(err.to_string().contains("cannot be enforced"), "{err}");
    assert!(!unenforced.path().join("plain").exists());
}

#[tokio::test(flavor = "multi_thread")]
async fn start_fails_in_one_line_when_btrfs_quotas_cannot_work() {
    let fs = LoopBtrfs::new(512, false).unwrap();
    let err = TestAgent::start_with_quota(&fs.root(), btrfs_settings())
        .await
        .err()
        .expect("quotas are off")
        .to_string();
    assert!(err.contains("quotas are not enabled"), "{err}");
    assert!(!err.contains('\n'), "{err}");

    let not_btrfs = tempfile::tempdir().unwrap();
    let err = TestAgent::start_with_quota(not_btrfs.path(), btrfs_settings())
        .await
        .err()
        .expect("not btrfs")
        .to_string();
    assert!(err.contains("is not on a btrfs filesystem"), "{err}");
}
