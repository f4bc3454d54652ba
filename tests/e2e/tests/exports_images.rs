//! Image volumes (quota backend `image`: each volume an ext4 filesystem of its own,
//! loop-mounted at its path) exported one by one by nfs-ganesha. After a reboot ganesha
//! may start from its include files before the agent has mounted the volumes: it then
//! resolves each export's path to the bare mountpoint beneath the mount. The mountpoint
//! takes no write meanwhile, and the agent, once it has mounted the volumes, exports
//! them again, so that clients reach the volume, never the directory beneath it. Where
//! the agent may not grow a mounted filesystem, a volume grows unmounted, its export
//! withdrawn meanwhile, and a client that had it mounted goes on afterwards.

use std::net::Ipv4Addr;

use nfsprov_api_types::{CreateVolumeRequest, ExportRequest, QuotaPolicy, Squash, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::bind_shim::BindShim;
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};
use nfsprov_e2e::libnfs::{NfsClient, NfsError};

const NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

#[tokio::test(flavor = "multi_thread")]
async fn ganesha_serves_image_volumes_mounted_after_it_started() -> anyhow::Result<()> {
    const TEST: &str = "ganesha_serves_image_volumes_mounted_after_it_started";
    let Some(fs) = nfsprov_e2e::requirements::images_over_nfs(TEST) else {
        return Ok(());
    };
    let root = fs.root();
    let base = tempfile::tempdir()?;
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await?;
    let mut ganesha = Ganesha::start(&bus, &config_dir).await?;
    // No acceptance of any kind: image volumes are filesystems of their own.
    let settings = format!(
        "[quota]\nbackend = \"image\"\n[exports]\nmanager = \"ganesha\"\nganesha_config_dir = {:?}\nganesha_dbus_address = {:?}\n",
        config_dir.display().to_string(),
        bus.address()
    );
    let mut agent = AgentProcess::start_with_settings(
        "images1",
        &root,
        "127.0.0.1",
        &root.display().to_string(),
        &settings,
    )
    .await?;
    let client = agent.client()?;
    let shim = BindShim::build()?;
    let node = shim.node(NODE_A);

    let volume = VolumePath::parse("ns/app")?;
    let created = client
        .create_volume(
            &volume,
            &CreateVolumeRequest {
                capacity_bytes: 64 << 20,
                quota: QuotaPolicy::Enforce,
                export: Some(ExportRequest {
                    clients: vec![NODE_A.to_string().parse()?],
                    squash: Squash::None,
                    ..ExportRequest::default()
                }),
                ..CreateVolumeRequest::default()
            },
            None,
        )
        .await?;
    let mount = created.volume.export.expect("exported").path;
    node.write(
        &ganesha.url(&format!("{mount}/kept")),
        b"in the volume",
        None,
        None,
    )?;
    let dir = root.join(volume.as_str());
    assert_eq!(std::fs::read(dir.join("kept"))?, b"in the volume");

    // A reboot: the agent gone, the volume unmounted, ganesha started from its include
    // files first.
    agent.kill();
    ganesha
        .restart_after(|| {
            let unmounted = std::process::Command::new("umount").arg(&dir).status()?;
            anyhow::ensure!(unmounted.success(), "umount {}", dir.display());
            Ok(())
        })
        .await?;
    let written = node.write(
        &ganesha.url(&format!("{mount}/written-while-unmounted")),
        b"lost",
        None,
        None,
    );
    assert!(
        written.is_err(),
        "a client wrote into the bare mountpoint through NFS"
    );
    assert!(!dir.join("written-while-unmounted").exists());

    agent.restart().await?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        match node.ls(&ganesha.url(&format!("{mount}/"))) {
            Ok(listing) if listing.contains("kept") => break,
            other => anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "the volume is not served again after the agent mounted it: {other:?}\nagent log:\n{}",
                agent.log_text()
            ),
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    client.delete_volume(&volume, None).await?;
    drop(agent);
    drop(ganesha);
    Ok(())
}

/// Whether this process (and so the agent it starts) may resize a mounted ext4.
fn may_resize_mounted() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            let hex = status.lines().find_map(|l| l.strip_prefix("CapEff:"))?;
            u64::from_str_radix(hex.trim(), 16).ok()
        })
        .is_some_and(|caps| caps & (1 << 24) != 0)
}

/// Whether the kernel's mount table has a mount exactly at `path`.
fn is_mount_point(path: &std::path::Path) -> anyhow::Result<bool> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    let wanted = path.to_string_lossy().replace(' ', "\\040");
    Ok(table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .any(|point| point == wanted))
}

/// Where the agent may not resize a mounted filesystem (no `CAP_SYS_RESOURCE`), a volume
/// is grown unmounted, its export withdrawn meanwhile. An NFS client that had it mounted
/// goes on after the export is back, with the file handles it holds (ganesha's handle is
/// the export id and ext4's own, and the filesystem keeps its UUID and inodes): it reads
/// what it wrote and writes past the old capacity. A crash of the agent between the
/// unmount and the growth leaves a volume the next start mounts, at its old or new size,
/// and serves again.
#[tokio::test(flavor = "multi_thread")]
async fn an_image_volume_grows_offline_under_a_mounted_nfs_client() -> anyhow::Result<()> {
    const TEST: &str = "an_image_volume_grows_offline_under_a_mounted_nfs_client";
    const MIB: u64 = 1 << 20;
    let Some(fs) = nfsprov_e2e::requirements::images_over_nfs(TEST) else {
        return Ok(());
    };
    if let Err(reason) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(TEST, &reason);
        return Ok(());
    }
    if may_resize_mounted() {
        nfsprov_test_skip::skip(
            TEST,
            "this machine lets root resize a mounted ext4 (CAP_SYS_RESOURCE), so the agent grows volumes online",
        );
        return Ok(());
    }
    let root = fs.root();
    let base = tempfile::tempdir()?;
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await?;
    let ganesha = Ganesha::start(&bus, &config_dir).await?;
    let settings = format!(
        "[quota]\nbackend = \"image\"\n[exports]\nmanager = \"ganesha\"\nganesha_config_dir = {:?}\nganesha_dbus_address = {:?}\n",
        config_dir.display().to_string(),
        bus.address()
    );
    let mut agent = AgentProcess::start_with_settings(
        "images-grow",
        &root,
        "127.0.0.1",
        &root.display().to_string(),
        &settings,
    )
    .await?;
    let log = agent.log_text();
    assert!(
        log.contains("image volumes grow unmounted"),
        "the agent says which way it grows volumes:\n{log}"
    );
    let client = agent.client()?;
    let ours = || -> anyhow::Result<Vec<(u16, String)>> {
        let mut served = ganesha.exports()?;
        // Export 0 is ganesha's own pseudo-filesystem root.
        served.retain(|(id, _)| *id != 0);
        Ok(served)
    };

    let volume = VolumePath::parse("ns/grown")?;
    let dir = root.join(volume.as_str());
    let created = client
        .create_volume(
            &volume,
            &CreateVolumeRequest {
                capacity_bytes: 16 * MIB,
                quota: QuotaPolicy::Enforce,
                export: Some(ExportRequest {
                    clients: vec!["127.0.0.1".parse()?],
                    squash: Squash::None,
                    ..ExportRequest::default()
                }),
                ..CreateVolumeRequest::default()
            },
            None,
        )
        .await?;
    let export = created.volume.export.expect("exported");
    let served = ours()?;
    assert_eq!(served.len(), 1, "{served:?}");
    let nfs = NfsClient::connect("127.0.0.1", ganesha.port(), &export.path)?;
    let kept: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    nfs.write_file("kept", &kept, 0o644)?;
    let past = vec![0x5a_u8; (24 * MIB) as usize];
    assert!(
        nfs.write_file("past", &past, 0o644).is_err(),
        "24 MiB fit into a volume of 16 MiB"
    );
    nfs.unlink("past")?;

    let started = std::time::Instant::now();
    let grown = client.resize_volume(&volume, 32 * MIB, None).await?;
    println!(
        "grown offline from 16 to 32 MiB in {:?} (the request, as the client sees it)",
        started.elapsed()
    );
    assert_eq!(grown.capacity_bytes, 32 * MIB);
    assert_eq!(grown.export.as_ref(), Some(&export));
    assert_eq!(ours()?, served, "served again with its id and path");
    assert!(
        agent
            .log_text()
            .contains("grew a volume's filesystem unmounted"),
        "{}",
        agent.log_text()
    );
    let metrics = agent.metrics()?;
    assert!(
        metrics.lines().any(|line| line
            == r#"nfsprov_agent_volume_operations_total{operation="grow_offline",outcome="success"} 1"#),
        "{metrics}"
    );
    // The same client, mounted throughout.
    assert_eq!(nfs.read_file("kept")?, kept);
    nfs.write_file("past", &past, 0o644)?;
    assert_eq!(std::fs::metadata(dir.join("past"))?.len(), 24 * MIB);
    nfs.unlink("past")?;

    if cfg!(debug_assertions) {
        // While the filesystem is unmounted: what a mounted client meets.
        let hold = base.path().join("hold-growths");
        let held = std::fs::File::create(&hold)?;
        held.lock()?;
        agent
            .restart_with_env(&[("NFSPROV_AGENT_HOLD_GROWTHS", hold.to_str().unwrap())])
            .await?;
        let waiting = NfsClient::connect("127.0.0.1", ganesha.port(), &export.path)?;
        let growing = {
            let client = agent.client()?;
            let volume = volume.clone();
            tokio::spawn(async move { client.resize_volume(&volume, 40 * MIB, None).await })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while is_mount_point(&dir)? {
            anyhow::ensure!(
                std::time::Instant::now() < deadline,
                "never unmounted:\n{}",
                agent.log_text()
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        // ganesha knows no export by the handle's id meanwhile: the request fails as
        // stale at once, rather than waiting.
        let reader = std::thread::spawn(move || {
            let read = waiting.read_file("kept");
            (waiting, read)
        });
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while !reader.is_finished() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let answered = reader.is_finished();
        held.unlock()?;
        let grown = growing.await??;
        let (waiting, during) = reader.join().expect("the reader ends");
        assert!(answered, "a request during the growth waited for it");
        let during = during.expect_err("read while the filesystem was unmounted");
        assert!(
            NfsError::is_stale(&during),
            "what a client meets during the growth: {during}"
        );
        assert_eq!(grown.capacity_bytes, 40 * MIB);
        // The client that met the stale handle goes on with the same handles.
        assert_eq!(waiting.read_file("kept")?, kept);
        drop(waiting);

        // Killed between the unmount and the growth: unmounted and unexported.
        agent
            .restart_with_env(&[("NFSPROV_AGENT_CRASH_AT", "grow-unmounted")])
            .await?;
        let killed = agent.client()?.resize_volume(&volume, 48 * MIB, None).await;
        assert!(killed.is_err(), "the agent died before answering");
        assert!(!is_mount_point(&dir)?, "killed after the unmount");
        assert!(ours()?.is_empty(), "and with the export withdrawn");
        // The start checks the filesystem, finishes the growth, mounts and serves it.
        agent.restart().await?;
        assert!(is_mount_point(&dir)?, "the start mounted it again");
        assert_eq!(ours()?, served, "and serves it as before");
        let client = agent.client()?;
        let got = client.get_volume(&volume, None).await?.expect("the volume");
        assert_eq!(
            got.capacity_bytes,
            40 * MIB,
            "the growth was not acknowledged"
        );
        let vfs = rustix::fs::statvfs(&dir)?;
        assert!(vfs.f_blocks * vfs.f_frsize >= 40 * MIB);
        assert_eq!(nfs.read_file("kept")?, kept, "the same client reads on");
        // Asked again, the growth completes.
        let grown = client.resize_volume(&volume, 48 * MIB, None).await?;
        assert_eq!(grown.capacity_bytes, 48 * MIB);
        let vfs = rustix::fs::statvfs(&dir)?;
        assert!(vfs.f_blocks * vfs.f_frsize >= 48 * MIB);
        assert_eq!(ours()?, served);
        nfs.write_file("after", b"after the crash", 0o644)?;
        assert_eq!(std::fs::read(dir.join("after"))?, b"after the crash");
        assert_eq!(nfs.read_file("kept")?, kept);
    } else {
        println!("the crash between unmount and growth is checked in debug builds only");
    }
    drop(nfs);
    agent.client()?.delete_volume(&volume, None).await?;
    assert!(ours()?.is_empty());
    drop(agent);
    drop(ganesha);
    Ok(())
}
