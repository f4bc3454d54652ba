//! The whole system on embedded defaults: an NFS server exporting a temporary root, an
//! agent with generated certificates, the controller, and the API simulator (or the
//! cluster of `KUBECONFIG`). Provisions a demo claim, shows its PV and how to use it over
//! NFS, and stops everything on Ctrl-C.

use std::time::Duration;

use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::nfs::{nfs_ls, nfs_read, nfs_write};
use nfsprov_e2e::system::System;
use serde_json::json;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    for tool in ["ganesha.nfsd", "nfs-cp", "nfs-ls"] {
        anyhow::ensure!(
            which(tool),
            "{tool} not found: install nfs-ganesha, nfs-ganesha-vfs and libnfs-utils (deploy/quickstart.sh does)"
        );
    }
    // nfs-cp writes a file of more than about 4 KB only over NFSv3, which ganesha serves
    // only when it can register it with rpcbind (deploy/quickstart.sh starts one).
    anyhow::ensure!(
        std::net::TcpStream::connect("127.0.0.1:111").is_ok(),
        "rpcbind is not running: start it (rpcbind -w; Debian: rpcbind), deploy/quickstart.sh does"
    );
    let kubeconfig = std::env::var_os("KUBECONFIG").map(std::path::PathBuf::from);
    let api = KubeApi::start_with(kubeconfig.clone()).await?;
    println!(
        "Kubernetes API: {}",
        match &kubeconfig {
            Some(path) => format!("the cluster of {}", path.display()),
            None => "the built-in simulator".to_owned(),
        }
    );
    let system = System::start_with_nfs_v3(api, &["local"], 1, &["--leader-elect=false"]).await?;
    let agent = &system.agents[0];
    println!(
        "NFS server: 127.0.0.1, port {}, export {}",
        system.nfs.port(),
        agent.export
    );
    println!(
        "agent:      {} (export root {})",
        agent.process.url(),
        agent.root.display()
    );

    match system
        .class(
            "nfsprov-demo",
            json!({"agent": "local", "onDelete": "archive", "mode": "0777"}),
        )
        .await
    {
        Ok(()) => {}
        Err(e) if e.to_string().contains("already exists") => {}
        Err(e) => return Err(e),
    }
    system
        .claim("demo", "nfsprov-demo", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("demo", Duration::from_secs(60)).await?;
    let source = volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.clone())
        .unwrap_or_default();
    let name = volume.metadata.name.clone().unwrap_or_default();
    println!(
        "\nPersistentVolumeClaim {}/demo is Bound to PersistentVolume {name}:",
        system.names.namespace
    );
    println!(
        "{}",
        serde_json::to_string_pretty(&json!({
            "name": name,
            "annotations": volume.metadata.annotations,
            "capacity": volume.spec.as_ref().and_then(|s| s.capacity.clone()),
            "nfs": {"server": source.server, "path": source.path},
            "persistentVolumeReclaimPolicy": volume.spec.as_ref().and_then(|s| s.persistent_volume_reclaim_policy.clone()),
        }))?
    );

    let file = system.file_url(&volume, "hello.txt");
    nfs_write(&file, b"hello from nfsprov\n", Some(1000), Some(1000))?;
    print!(
        "\nWrote and read back over NFS as uid 1000: {}",
        String::from_utf8_lossy(&nfs_read(&file)?)
    );
    let directory = system.file_url(&volume, "");
    println!("Listing of {directory}:\n{}", nfs_ls(&directory)?);
    let write_url = system
        .file_url_v3(&volume, "f")
        .ok_or_else(|| anyhow::anyhow!("the NFS server serves no NFSv3"))?;
    println!(
        "Write a file of yours to it and read it back (libnfs-utils; nfs-cp writes over NFSv3, \
         nfs-cat reads over NFSv4, both on port {}):",
        system.nfs.port()
    );
    println!("  {WRITE_PREFIX}'{write_url}'");
    println!("  {READ_PREFIX}'{}'", system.file_url(&volume, "f"));
    println!(
        "The directory on the server: {}",
        agent
            .root
            .join(
                source
                    .path
                    .trim_start_matches(&agent.export)
                    .trim_start_matches('/')
            )
            .display()
    );
    println!("\nPress Ctrl-C to stop everything.");
    tokio::signal::ctrl_c().await?;
    println!("stopping");
    Ok(())
}

/// The printed commands up to their URL: `tests/e2e/tests/quickstart.rs` runs what
/// follows them, with a file of its own for `/tmp/f`.
const WRITE_PREFIX: &str = "nfs-cp /tmp/f ";
const READ_PREFIX: &str = "nfs-cat ";

fn which(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
}
