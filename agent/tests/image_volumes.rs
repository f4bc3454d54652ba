//! Volumes that are filesystems of their own (quota backend `image`) over the real HTTPS
//! API, on a loop-mounted XFS export root that shares extents (root required): each
//! volume an ext4 image mounted at its path, its size the quota; clones, snapshots and
//! restores reflinks of the image with a UUID of their own; expansion online (where the
//! kernel allows it: `CAP_SYS_RESOURCE`) or offline, its ganesha export withheld and
//! served again (where it does not), and an offline growth a crash interrupted finished
//! at the next start; archives
//! and restores from them; a restart after the volumes were unmounted (a reboot) mounts
//! them again, and a bare mountpoint takes no write meanwhile.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use common::backing::xfs_or_skip;
use common::jobs::{clone_until_ready, restore_until_ready};
use nfsprov_agent::exports::ExportSettings;
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_agent_testkit::ganesha::{Ganesha, PrivateBus};
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{
    CloneMethod, CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, ExportManager,
    ExportRequest, QuotaBackend, QuotaPolicy, RestoreVolumeRequest, SnapshotMethod, SnapshotName,
    VolumeOwner, VolumePath,
};

const MIB: u64 = 1 << 20;

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn image_settings() -> QuotaSettings {
    QuotaSettings {
        backend: QuotaBackend::Image,
        ..QuotaSettings::default()
    }
}

async fn image_agent(root: &Path) -> TestAgent {
    TestAgent::start_with_quota(root, image_settings())
        .await
        .unwrap()
}

fn create(capacity_bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        quota: QuotaPolicy::Enforce,
        owner: VolumeOwner::default(),
        ..CreateVolumeRequest::default()
    }
}

/// The filesystem UUID of the device mounted at `dir`.
fn uuid_of(dir: &Path) -> String {
    let device = run(
        "findmnt",
        &["-n", "-o", "SOURCE", "--mountpoint", dir.to_str().unwrap()],
    )
    .unwrap();
    run("blkid", &["-p", "-o", "value", "-s", "UUID", device.trim()])
        .unwrap()
        .trim()
        .to_owned()
}

fn is_mount(root: &Path, dir: &Path) -> bool {
    std::fs::metadata(dir).is_ok_and(|m| m.dev() != std::fs::metadata(root).unwrap().dev())
}

/// Writes `bytes` of data to a new file, answering how many the filesystem took.
fn fill(file: &Path, bytes: u64) -> (u64, Option<std::io::Error>) {
    let mut out = std::fs::File::create(file).unwrap();
    let chunk = vec![7u8; MIB as usize];
    let mut written = 0;
    while written < bytes {
        if let Err(e) = out.write_all(&chunk).and_then(|()| out.sync_data()) {
            return (written, Some(e));
        }
        written += MIB;
    }
    (written, None)
}

/// The capacity the agent has promised, as it reports it.
async fn promised(client: &AgentClient) -> u64 {
    client
        .info(None)
        .await
        .unwrap()
        .provisioning
        .expect("the agent reports its promises")
        .provisioned_bytes
}

#[tokio::test(flavor = "multi_thread")]
async fn image_volumes_are_filesystems_of_their_own_sized_to_their_capacity() {
    let Some(fs) =
        xfs_or_skip("image_volumes_are_filesystems_of_their_own_sized_to_their_capacity")
    else {
        return;
    };
    let root = fs.root();
    let agent = image_agent(&root).await;
    let client = agent.client();
    assert_eq!(
        client.info(None).await.unwrap().capabilities.quota,
        QuotaBackend::Image
    );
    let (a, b) = (path("team-a/app"), path("team-b/db"));
    for volume in [&a, &b] {
        let made = client
            .create_volume(volume, &create(32 * MIB), None)
            .await
            .unwrap();
        assert!(made.created);
    }
    let (dir_a, dir_b) = (root.join(a.as_str()), root.join(b.as_str()));
    assert!(is_mount(&root, &dir_a) && is_mount(&root, &dir_b));
    assert_ne!(uuid_of(&dir_a), uuid_of(&dir_b));
    // Empty, as any new volume: no lost+found.
    assert_eq!(std::fs::read_dir(&dir_a).unwrap().count(), 0);
    let vfs = rustix::fs::statvfs(&dir_a).unwrap();
    let size = vfs.f_blocks * vfs.f_frsize;
    assert!(
        (32 * MIB..40 * MIB).contains(&size),
        "the filesystem holds the capacity and not much more: {size}"
    );

    // The size is the quota, for every writer: a write past it fails with ENOSPC.
    let (written, error) = fill(&dir_a.join("big"), 64 * MIB);
    let error = error.expect("a write past the capacity failed");
    assert_eq!(error.raw_os_error(), Some(libc_enospc()), "{error}");
    assert!((24 * MIB..=36 * MIB).contains(&written), "{written}");
    std::fs::remove_file(dir_a.join("big")).unwrap();

    std::fs::write(dir_a.join("data"), b"first").unwrap();

    // A clone: a reflink of the frozen image with a UUID of its own.
    let c = path("team-c/copy");
    let cloned = clone_until_ready(
        &client,
        &c,
        &CloneVolumeRequest {
            source: a.clone(),
            capacity_bytes: 32 * MIB,
            owner: VolumeOwner::default(),
            quota: QuotaPolicy::Enforce,
            export: None,
        },
    )
    .await
    .unwrap();
    assert_eq!(
        cloned.volume.clone.as_ref().map(|origin| origin.method),
        Some(CloneMethod::Reflink)
    );
    let dir_c = root.join(c.as_str());
    assert_eq!(std::fs::read(dir_c.join("data")).unwrap(), b"first");
    let uuids: HashSet<String> = [&dir_a, &dir_b, &dir_c]
        .iter()
        .map(|d| uuid_of(d))
        .collect();
    assert_eq!(uuids.len(), 3, "every volume has its own filesystem UUID");

    // A snapshot holds the content of its moment; a restore is a volume of its own. It
    // may come to hold its source's whole capacity (a reflink diverges as the source is
    // written), so it is counted in the capacity promised.
    let before_snapshot = promised(&client).await;
    let snapshot = SnapshotName::parse("snap-1").unwrap();
    let taken = client
        .create_snapshot(
            &snapshot,
            &CreateSnapshotRequest { source: a.clone() },
            None,
        )
        .await
        .unwrap();
    assert!(taken.ready);
    assert_eq!(taken.method, SnapshotMethod::Reflink);
    assert_eq!(promised(&client).await, before_snapshot + 32 * MIB);
    std::fs::write(dir_a.join("data"), b"second").unwrap();
    let restored_path = path("team-a/restored");
    restore_until_ready(
        &client,
        &restored_path,
        &RestoreVolumeRequest {
            snapshot: Some(snapshot.clone()),
            archive: None,
            capacity_bytes: 32 * MIB,
            owner: VolumeOwner::default(),
            quota: QuotaPolicy::Enforce,
            export: None,
        },
    )
    .await
    .unwrap();
    let dir_restored = root.join(restored_path.as_str());
    assert_eq!(std::fs::read(dir_restored.join("data")).unwrap(), b"first");
    assert_ne!(uuid_of(&dir_restored), uuid_of(&dir_a));

    // Archived: unmounted, out of every volume path; restored from the archive.
    let archived = client.archive_volume(&b, None, None).await.unwrap();
    assert!(!dir_b.exists());
    let archives = client.list_archives(None).await.unwrap();
    assert_eq!(archives.len(), 1, "{archives:?}");
    let id = archives[0].id.clone();
    assert_eq!(format!(".archive/{id}"), archived.archive_path);
    let back = path("team-b/back");
    restore_until_ready(
        &client,
        &back,
        &RestoreVolumeRequest {
            snapshot: None,
            archive: Some(id.clone()),
            capacity_bytes: 32 * MIB,
            owner: VolumeOwner::default(),
            quota: QuotaPolicy::Enforce,
            export: None,
        },
    )
    .await
    .unwrap();
    assert!(is_mount(&root, &root.join(back.as_str())));
    client.delete_archive(&id, None).await.unwrap();
    assert!(client.list_archives(None).await.unwrap().is_empty());

    // A reboot: every volume unmounted behind the agent's back. The bare mountpoints
    // take no write, even from root; the next start mounts them all again.
    drop(agent);
    let volumes = [&a, &c, &restored_path, &back];
    for volume in volumes {
        run("umount", &[root.join(volume.as_str()).to_str().unwrap()]).unwrap();
    }
    let bare = root.join(a.as_str());
    assert!(!is_mount(&root, &bare));
    assert_eq!(std::fs::metadata(&bare).unwrap().mode() & 0o777, 0);
    let refused = std::fs::write(bare.join("written-while-unmounted"), b"x");
    assert!(refused.is_err(), "a bare mountpoint took a write");
    let agent = image_agent(&root).await;
    let client = agent.client();
    for volume in volumes {
        assert!(is_mount(&root, &root.join(volume.as_str())), "{volume}");
    }
    assert_eq!(std::fs::read(dir_a.join("data")).unwrap(), b"second");

    // Deleted: the mount, the image and the mountpoint go; the snapshot stays.
    for volume in volumes {
        client.delete_volume(volume, None).await.unwrap();
        assert!(!root.join(volume.as_str()).exists(), "{volume}");
    }
    assert!(client.list_volumes(None).await.unwrap().is_empty());
    assert_eq!(
        promised(&client).await,
        32 * MIB,
        "the snapshot's promise, after a restart"
    );
    client.delete_snapshot(&snapshot, None).await.unwrap();
    assert_eq!(promised(&client).await, 0);
    let images = root.join(".nfsprov/images");
    let left: Vec<_> = walk_files(&images);
    assert!(left.is_empty(), "left in the image area: {left:?}");
}

/// Runs a tool to its end; its stdout, or what it said when it failed.
fn run(program: &str, args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Whether this process may resize a mounted ext4 (`CAP_SYS_RESOURCE`, bit 24).
fn may_resize_mounted() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_grows_while_mounted() {
    const TEST: &str = "an_image_volume_grows_while_mounted";
    let Some(fs) = xfs_or_skip(TEST) else {
        return;
    };
    if !may_resize_mounted() {
        nfsprov_test_skip::skip(
            TEST,
            "the kernel resizes a mounted ext4 only for CAP_SYS_RESOURCE, which this machine withholds from root",
        );
        return;
    }
    let root = fs.root();
    let agent = image_agent(&root).await;
    let client = agent.client();
    let a = path("team-a/app");
    client
        .create_volume(&a, &create(32 * MIB), None)
        .await
        .unwrap();
    let dir_a = root.join(a.as_str());
    std::fs::write(dir_a.join("data"), b"kept").unwrap();
    let grown = client.resize_volume(&a, 64 * MIB, None).await.unwrap();
    assert_eq!(grown.capacity_bytes, 64 * MIB);
    let vfs = rustix::fs::statvfs(&dir_a).unwrap();
    assert!(vfs.f_blocks * vfs.f_frsize >= 64 * MIB);
    let (written, error) = fill(&dir_a.join("big"), 48 * MIB);
    assert!(error.is_none() && written == 48 * MIB, "{error:?}");
    assert_eq!(std::fs::read(dir_a.join("data")).unwrap(), b"kept");
}

/// Where the kernel withholds `CAP_SYS_RESOURCE`: the volume is grown unmounted, its
/// ganesha export withdrawn meanwhile and served again as it was, its filesystem the same
/// (UUID, data) at the new size.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_grows_offline() {
    const TEST: &str = "an_image_volume_grows_offline";
    let Some(fs) = xfs_or_skip(TEST) else {
        return;
    };
    if may_resize_mounted() {
        nfsprov_test_skip::skip(
            TEST,
            "this machine lets root resize a mounted ext4 (CAP_SYS_RESOURCE), so the agent grows volumes online",
        );
        return;
    }
    if let Some(tool) = ["ganesha.nfsd", "dbus-daemon", "dbus-send"]
        .into_iter()
        .find(|tool| !installed(tool))
    {
        nfsprov_test_skip::skip(TEST, &format!("{tool} is not installed"));
        return;
    }
    let root = fs.root();
    let base = tempfile::tempdir().unwrap();
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await.unwrap();
    let ganesha = Ganesha::start(&bus, &config_dir).await.unwrap();
    let exports = ExportSettings {
        manager: ExportManager::Ganesha,
        ganesha_config_dir: config_dir.clone(),
        ganesha_dbus_address: Some(bus.address().to_owned()),
        ..ExportSettings::default()
    };
    let agent = TestAgent::start_with_quota_and_exports(&root, image_settings(), exports)
        .await
        .unwrap();
    let client = agent.client();
    let a = path("team-a/app");
    let made = client
        .create_volume(
            &a,
            &CreateVolumeRequest {
                export: Some(ExportRequest {
                    clients: vec!["127.0.0.1".parse().unwrap()],
                    ..ExportRequest::default()
                }),
                ..create(32 * MIB)
            },
            None,
        )
        .await
        .unwrap();
    let export = made.volume.export.expect("exported");
    // ganesha's own pseudo-filesystem root is export 0.
    let ours = || -> Vec<(u16, String)> {
        let mut served = ganesha.exports().unwrap();
        served.retain(|(id, _)| *id != 0);
        served
    };
    let served = ours();
    assert_eq!(served.len(), 1, "{served:?}");
    let dir_a = root.join(a.as_str());
    std::fs::write(dir_a.join("data"), b"kept").unwrap();
    let uuid = uuid_of(&dir_a);

    let grown = client.resize_volume(&a, 64 * MIB, None).await.unwrap();
    assert_eq!(grown.capacity_bytes, 64 * MIB);
    assert_eq!(grown.export.as_ref(), Some(&export), "reported as before");
    assert!(is_mount(&root, &dir_a), "mounted again");
    assert_eq!(uuid_of(&dir_a), uuid, "the same filesystem");
    let vfs = rustix::fs::statvfs(&dir_a).unwrap();
    assert!(vfs.f_blocks * vfs.f_frsize >= 64 * MIB);
    assert_eq!(std::fs::read(dir_a.join("data")).unwrap(), b"kept");
    assert_eq!(ours(), served, "served again with its id and path");
    let (written, error) = fill(&dir_a.join("big"), 48 * MIB);
    assert!(error.is_none() && written == 48 * MIB, "{error:?}");
    let got = client.get_volume(&a, None).await.unwrap().expect("there");
    assert_eq!(got.capacity_bytes, 64 * MIB);
    assert_eq!(got.export, Some(export));
    // The same capacity again changes nothing and withdraws nothing.
    client.resize_volume(&a, 64 * MIB, None).await.unwrap();
    assert_eq!(ours(), served);
    client.delete_volume(&a, None).await.unwrap();
    assert!(ours().is_empty());
    drop(agent);
    drop(ganesha);
}

/// What a crash in the middle of an offline growth leaves: the filesystem unmounted, the
/// image already longer, the growth's mark beside it and a filesystem marked as having
/// errors. The next start checks it (e2fsck), grows it to fill its image and mounts it,
/// with its data; the record keeps the capacity last acknowledged.
#[tokio::test(flavor = "multi_thread")]
async fn an_interrupted_offline_growth_is_finished_at_the_next_start() {
    const TEST: &str = "an_interrupted_offline_growth_is_finished_at_the_next_start";
    let Some(fs) = xfs_or_skip(TEST) else {
        return;
    };
    let root = fs.root();
    let agent = image_agent(&root).await;
    let a = path("team-a/app");
    agent
        .client()
        .create_volume(&a, &create(32 * MIB), None)
        .await
        .unwrap();
    let dir_a = root.join(a.as_str());
    std::fs::write(dir_a.join("data"), b"kept").unwrap();
    drop(agent);

    run("umount", &[dir_a.to_str().unwrap()]).unwrap();
    let images = root.join(".nfsprov/images/team-a");
    let image = images.join("app.img");
    let mark = images.join("app.growing");
    std::fs::write(&mark, b"").unwrap();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .unwrap();
    file.set_len(file.metadata().unwrap().len() + 40 * MIB)
        .unwrap();
    drop(file);
    // Not clean, with errors, and last checked long ago: the check that must come
    // before the mount shows in its date.
    for field in ["state 2", "lastcheck 20200101"] {
        run(
            "debugfs",
            &["-w", "-R", &format!("ssv {field}"), image.to_str().unwrap()],
        )
        .unwrap();
    }

    let agent = image_agent(&root).await;
    assert!(is_mount(&root, &dir_a), "mounted again");
    assert!(!mark.exists(), "the growth was finished");
    let vfs = rustix::fs::statvfs(&dir_a).unwrap();
    assert!(
        vfs.f_blocks * vfs.f_frsize >= 64 * MIB,
        "grown to fill its image: {}",
        vfs.f_blocks * vfs.f_frsize
    );
    assert_eq!(std::fs::read(dir_a.join("data")).unwrap(), b"kept");
    let superblock = run("dumpe2fs", &["-h", image.to_str().unwrap()]).unwrap();
    let checked = superblock
        .lines()
        .find(|line| line.starts_with("Last checked:"))
        .unwrap();
    assert!(
        !checked.contains("2020"),
        "checked before it was mounted: {checked}"
    );
    let got = agent.client().get_volume(&a, None).await.unwrap().unwrap();
    assert_eq!(got.capacity_bytes, 32 * MIB, "as last acknowledged");
    agent.client().delete_volume(&a, None).await.unwrap();
}

fn installed(tool: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|paths| {
        std::env::split_paths(&paths)
            .chain(["/usr/sbin".into(), "/sbin".into()])
            .any(|dir| dir.join(tool).is_file())
    })
}

fn walk_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        if entry.file_type().unwrap().is_dir() {
            found.extend(walk_files(&entry.path()));
        } else {
            found.push(entry.path());
        }
    }
    found
}

fn libc_enospc() -> i32 {
    rustix::io::Errno::NOSPC.raw_os_error()
}
