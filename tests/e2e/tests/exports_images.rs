//! Image volumes (quota backend `image`: each volume an ext4 filesystem of its own,
//! loop-mounted at its path) exported one by one by nfs-ganesha. After a reboot ganesha
//! may start from its include files before the agent has mounted the volumes: it then
//! resolves each export's path to the bare mountpoint beneath the mount. The mountpoint
//! takes no write meanwhile, and the agent, once it has mounted the volumes, exports
//! them again, so that clients reach the volume, never the directory beneath it.

use std::net::Ipv4Addr;

use nfsprov_api_types::{CreateVolumeRequest, ExportRequest, QuotaPolicy, Squash, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::bind_shim::BindShim;
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};

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
