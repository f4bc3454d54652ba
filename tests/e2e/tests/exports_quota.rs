//! Quota through NFS: a btrfs volume exported by nfs-ganesha, written through the libnfs
//! client (libnfs 4.0's NFSv4 client, in 2 KiB writes: `nfs-cp` cannot encode larger ones), stops at its capacity and takes more once the volume is resized. ganesha can
//! export a subvolume only when it is mounted by itself, so the agent mounts each one
//! over its own path; the test follows that mount through archive, delete and restart.
//! An image volume (quota backend `image`, a filesystem of its own) stops the same
//! write with its filesystem full.

use std::path::Path;

use nfsprov_api_types::{CreateVolumeRequest, ExportRequest, QuotaPolicy, Squash, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};
use nfsprov_e2e::libnfs::NfsClient;
use nfsprov_e2e::quota::{Limit, assert_write_stops_at_capacity};

const MIB: u64 = 1 << 20;
/// What the write tries: twice the first capacity, within the second.
const WRITE_BYTES: usize = 20_000_000;

/// Whether the kernel's mount table has a mount exactly at `path`.
fn is_mount_point(path: &Path) -> anyhow::Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    Ok(table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| point == wanted))
}

/// Only 127.0.0.1 (the libnfs client's own address), root kept as root.
fn to_localhost() -> ExportRequest {
    ExportRequest {
        clients: vec!["127.0.0.1".parse().unwrap()],
        squash: Squash::None,
        ..ExportRequest::default()
    }
}

fn create_request(capacity_bytes: u64) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes,
        export: Some(to_localhost()),
        ..Default::default()
    }
}

/// The agent's export ids ganesha serves.
fn ours(ganesha: &Ganesha) -> anyhow::Result<Vec<u16>> {
    Ok(ganesha
        .export_ids()?
        .into_iter()
        .filter(|id| *id >= 1000)
        .collect())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_through_ganesha_stops_at_the_btrfs_volumes_capacity() -> anyhow::Result<()> {
    const TEST: &str = "a_write_through_ganesha_stops_at_the_btrfs_volumes_capacity";
    let Some(fs) = nfsprov_e2e::requirements::btrfs_over_nfs(TEST, 512) else {
        return Ok(());
    };
    let root = fs.root();
    let base = tempfile::tempdir()?;
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await?;
    let mut ganesha = Ganesha::start(&bus, &config_dir).await?;
    let settings = format!(
        "[quota]\nbackend = \"btrfs\"\n\n{}",
        ganesha.agent_settings()
    );
    let export_path = root.display().to_string();
    let mut agent =
        AgentProcess::start_with_settings("quota-nfs", &root, "127.0.0.1", &export_path, &settings)
            .await?;
    let client = agent.client()?;

    let path = VolumePath::parse("ns/limited")?;
    let dir = root.join("ns/limited");
    let created = client
        .create_volume(&path, &create_request(10 * MIB), None)
        .await?;
    let export = created
        .volume
        .export
        .expect("the volume reports its export");
    assert_eq!(
        export.path,
        dir.display().to_string(),
        "the path is unchanged"
    );
    assert!(
        is_mount_point(&dir)?,
        "the subvolume has a mount of its own"
    );
    let nfs = NfsClient::connect("127.0.0.1", ganesha.port(), &export.path)?;
    let payload = vec![0x5a_u8; WRITE_BYTES];

    // Within the capacity a write goes through.
    let within = vec![0xa5_u8; MIB as usize];
    nfs.write_file("within", &within, 0o644)?;
    assert_eq!(std::fs::read(dir.join("within"))?, within);
    nfs.unlink("within")?;
    fs.sync()?;

    assert_write_stops_at_capacity(Limit::Quota, &nfs, &dir, "big", &payload, 10 * MIB)?;

    // Grown to 30 MiB through the API: the same write goes through.
    fs.sync()?;
    let resized = client.resize_volume(&path, 30 * MIB, None).await?;
    assert_eq!(resized.capacity_bytes, 30 * MIB);
    nfs.write_file("big", &payload, 0o644)?;
    assert_eq!(
        std::fs::metadata(dir.join("big"))?.len(),
        WRITE_BYTES as u64
    );
    drop(nfs);

    // After a reboot the mount is gone and ganesha comes up without it (here: taken away
    // behind the agent's back, ganesha restarted); the agent's start makes both again.
    let ids = ours(&ganesha)?;
    assert_eq!(ids.len(), 1);
    agent.kill();
    // ganesha still holds the mount: detached from the path now, gone with its restart.
    rustix::mount::unmount(
        &dir,
        rustix::mount::UnmountFlags::NOFOLLOW | rustix::mount::UnmountFlags::DETACH,
    )?;
    assert!(!is_mount_point(&dir)?);
    ganesha.restart().await?;
    agent.restart().await?;
    assert!(is_mount_point(&dir)?, "the start made the mount again");
    assert_eq!(ours(&ganesha)?, ids, "and serves the export again");
    let nfs = NfsClient::connect("127.0.0.1", ganesha.port(), &export.path)?;
    nfs.write_file("again", b"after restart", 0o644)?;
    drop(nfs);
    assert_eq!(std::fs::read(dir.join("again"))?, b"after restart");

    // Killed between the mount of a new volume and its export: the start finds the
    // record and the mount, and serves the export.
    if cfg!(debug_assertions) {
        let crashed = VolumePath::parse("ns/crashed")?;
        let crashed_dir = root.join("ns/crashed");
        agent
            .restart_with_env(&[("NFSPROV_AGENT_CRASH_AT", "after-mount")])
            .await?;
        let killed = agent
            .client()?
            .create_volume(&crashed, &create_request(10 * MIB), None)
            .await;
        assert!(killed.is_err(), "the agent died before answering");
        assert!(is_mount_point(&crashed_dir)?, "killed after the mount");
        assert_eq!(ours(&ganesha)?, ids, "and before ganesha heard of it");
        agent.restart().await?;
        assert_eq!(ours(&ganesha)?.len(), 2, "the start exported it");
        let client = agent.client()?;
        let got = client
            .get_volume(&crashed, None)
            .await?
            .expect("the volume");
        assert!(got.export.is_some());
        let nfs = NfsClient::connect(
            "127.0.0.1",
            ganesha.port(),
            &crashed_dir.display().to_string(),
        )?;
        nfs.write_file("served", b"served", 0o644)?;
        drop(nfs);
        client.delete_volume(&crashed, None).await?;
        assert!(!is_mount_point(&crashed_dir)?);
        assert_eq!(ours(&ganesha)?, ids);
    } else {
        println!("the crash between mount and export is checked in debug builds only");
    }
    let client = agent.client()?;

    // Archived: unexported and unmounted, so the subvolume could move to the archive.
    client.archive_volume(&path, None, None).await?;
    assert!(!is_mount_point(&dir)?, "no mount left at the archived path");
    assert!(!dir.exists());
    assert!(ours(&ganesha)?.is_empty());
    assert_eq!(client.list_archives(None).await?.len(), 1);

    // Deleted: a second volume, mounted and exported, then gone with its mount.
    let other = VolumePath::parse("ns/deleted")?;
    let other_dir = root.join("ns/deleted");
    client
        .create_volume(&other, &create_request(10 * MIB), None)
        .await?;
    assert!(is_mount_point(&other_dir)?);
    let nfs = NfsClient::connect(
        "127.0.0.1",
        ganesha.port(),
        &other_dir.display().to_string(),
    )?;
    nfs.write_file("small", b"small", 0o644)?;
    drop(nfs);
    client.delete_volume(&other, None).await?;
    assert!(!is_mount_point(&other_dir)?, "no mount left after delete");
    assert_eq!(client.get_volume(&other, None).await?, None);
    assert!(ours(&ganesha)?.is_empty());
    drop(agent);
    drop(ganesha);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_through_ganesha_stops_at_the_image_volumes_capacity() -> anyhow::Result<()> {
    const TEST: &str = "a_write_through_ganesha_stops_at_the_image_volumes_capacity";
    let Some(fs) = nfsprov_e2e::requirements::images_over_nfs(TEST) else {
        return Ok(());
    };
    if let Err(reason) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(TEST, &reason);
        return Ok(());
    }
    let root = fs.root();
    let base = tempfile::tempdir()?;
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await?;
    let ganesha = Ganesha::start(&bus, &config_dir).await?;
    let settings = format!(
        "[quota]\nbackend = \"image\"\n\n{}",
        ganesha.agent_settings()
    );
    let agent = AgentProcess::start_with_settings(
        "quota-image",
        &root,
        "127.0.0.1",
        &root.display().to_string(),
        &settings,
    )
    .await?;
    let client = agent.client()?;

    let path = VolumePath::parse("ns/limited")?;
    let dir = root.join("ns/limited");
    let created = client
        .create_volume(
            &path,
            &CreateVolumeRequest {
                quota: QuotaPolicy::Enforce,
                ..create_request(10 * MIB)
            },
            None,
        )
        .await?;
    let export = created
        .volume
        .export
        .expect("the volume reports its export");
    assert!(is_mount_point(&dir)?, "the image is mounted at the path");
    let nfs = NfsClient::connect("127.0.0.1", ganesha.port(), &export.path)?;

    let within = vec![0xa5_u8; MIB as usize];
    nfs.write_file("within", &within, 0o644)?;
    assert_eq!(std::fs::read(dir.join("within"))?, within);
    nfs.unlink("within")?;

    let payload = vec![0x5a_u8; WRITE_BYTES];
    assert_write_stops_at_capacity(Limit::OwnFilesystem, &nfs, &dir, "big", &payload, 10 * MIB)?;

    // Full once, the volume takes writes again once the partial file is gone.
    nfs.write_file("after", b"after the refusal", 0o644)?;
    assert_eq!(std::fs::read(dir.join("after"))?, b"after the refusal");
    drop(nfs);
    client.delete_volume(&path, None).await?;
    assert!(!is_mount_point(&dir)?, "no mount left after delete");
    drop(agent);
    drop(ganesha);
    Ok(())
}
