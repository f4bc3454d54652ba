//! The agent's volumes through a real NFS server and client: what a pod would see.

use nfsprov_api_types::{CreateVolumeRequest, Mode, VolumeOwner, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::nfs::{NfsServer, nfs_ls, nfs_read, nfs_write};

#[tokio::test(flavor = "multi_thread")]
async fn volumes_are_usable_over_nfs_through_their_lifecycle() -> anyhow::Result<()> {
    let base = tempfile::tempdir()?;
    let root = base.path().join("export");
    std::fs::create_dir(&root)?;
    let export = root.display().to_string();
    let nfs = NfsServer::start(&[&root]).await?;
    let agent = AgentProcess::start("nfs1", &root, "127.0.0.1", &export).await?;
    let client = agent.client()?;

    let info = client.info(Some("e2e-info")).await?;
    assert_eq!(
        (info.nfs.server.as_str(), info.nfs.path.as_str()),
        ("127.0.0.1", export.as_str())
    );

    // A volume owned by the pod's user, writable by it and nobody else.
    let path = VolumePath::parse("ns/claim-1")?;
    let request = CreateVolumeRequest {
        mode: Mode::new(0o770)?,
        uid: Some(1000),
        gid: Some(1000),
        capacity_bytes: 1 << 30,
        owner: VolumeOwner {
            pvc_namespace: Some("ns".into()),
            pvc_name: Some("claim-1".into()),
            pv_name: Some("pvc-1".into()),
        },
        ..Default::default()
    };
    assert!(client.create_volume(&path, &request, None).await?.created);
    let volume_path = format!("{}/{}", info.nfs.path, path);
    let file_url = nfs.url(&format!("{volume_path}/hello.txt"));
    nfs_write(&file_url, b"written over NFS", Some(1000), Some(1000))?;
    let on_disk = root.join("ns/claim-1/hello.txt");
    assert_eq!(std::fs::read(&on_disk)?, b"written over NFS");
    let owner = std::fs::metadata(&on_disk)?;
    assert_eq!(
        (
            std::os::unix::fs::MetadataExt::uid(&owner),
            std::os::unix::fs::MetadataExt::gid(&owner)
        ),
        (1000, 1000),
        "the NFS client's identity owns what it writes"
    );
    assert_eq!(nfs_read(&file_url)?, b"written over NFS");
    assert!(
        nfs_write(
            &nfs.url(&format!("{volume_path}/intruder")),
            b"x",
            Some(2000),
            Some(2000)
        )
        .is_err(),
        "another user must not write into a 0770 volume"
    );

    // The default mode lets any pod user write, as the peers do.
    let open = VolumePath::parse("ns/open")?;
    client
        .create_volume(
            &open,
            &CreateVolumeRequest {
                capacity_bytes: 1,
                ..Default::default()
            },
            None,
        )
        .await?;
    nfs_write(
        &nfs.url(&format!("{}/{open}/f", info.nfs.path)),
        b"any user",
        Some(4321),
        Some(4321),
    )?;

    // Archived data stays readable over NFS at the archive path.
    let archived = client.archive_volume(&path, None, None).await?;
    assert!(
        nfs_read(&file_url).is_err(),
        "the volume path is gone after archiving"
    );
    let archived_url = nfs.url(&format!(
        "{}/{}/hello.txt",
        info.nfs.path, archived.archive_path
    ));
    assert_eq!(nfs_read(&archived_url)?, b"written over NFS");

    // Deleted data is gone for clients too.
    client.delete_volume(&open, None).await?;
    let listing = nfs_ls(&nfs.url(&format!("{}/ns", info.nfs.path)))?;
    assert!(!listing.contains("open"), "{listing}");
    assert!(!root.join("ns/open").exists());
    drop(agent);
    drop(nfs);
    Ok(())
}
