//! Per-volume exports through the whole system: the controller binary against Kubernetes
//! (the simulator, or a real API server with `E2E_KUBECONFIG`), the agent with the
//! `ganesha` manager, and ganesha on a private D-Bus serving each volume by itself. Each
//! "node" is a loopback address of its own, carried as the InternalIP of a Node object
//! the test creates, and its NFS client (libnfs-utils through the bind shim) connects
//! from that address; who may mount a volume follows the class's `exportClients`.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::PersistentVolume;
use nfsprov_api_types::{ExportAccess, ExportClient, Squash, VolumeExport, VolumePath};
use nfsprov_e2e::bind_shim::{BindShim, NodeClient};
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::libnfs::NfsClient;
use nfsprov_e2e::quota::{Limit, assert_write_stops_at_capacity};
use nfsprov_e2e::system::{AgentSpec, System};
use serde_json::json;

/// Each scenario plays nodes of its own, so that on a shared API server the Nodes of one
/// cannot admit or refuse a client of another.
const POD_NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const POD_NODE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const NODE_KEPT: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 4);
const NODE_ADDED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 5);
const LISTED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 6);
const UNLISTED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 7);

/// The class's owner ids, which root is squashed to.
const OWNER: u32 = 2345;
const MIB: u64 = 1 << 20;
const WAIT: Duration = Duration::from_secs(60);

/// The whole system with one agent, `nfs1`, whose volumes ganesha exports one by one.
async fn start_system(agent: AgentSpec) -> anyhow::Result<System> {
    System::start_with_exports(KubeApi::start().await?, agent, &["--leader-elect=false"]).await
}

/// The system and the shim that binds NFS clients to a node's address; `None`, `test`
/// skipped by name, when this machine cannot run them.
async fn start(test: &str) -> anyhow::Result<Option<(System, BindShim)>> {
    if !nfsprov_e2e::requirements::ganesha_exports(test) {
        return Ok(None);
    }
    let shim = BindShim::build()?;
    Ok(Some((start_system(AgentSpec::named("nfs1")).await?, shim)))
}

/// Parameters of a class on `nfs1` with the given `exportClients` and more.
fn class_params(export_clients: &str, more: serde_json::Value) -> serde_json::Value {
    let mut params = json!({
        "agent": "nfs1",
        "onDelete": "delete",
        "pathPattern": "${.PVC.name}",
        "exportClients": export_clients,
    });
    if let (Some(params), Some(more)) = (params.as_object_mut(), more.as_object()) {
        params.extend(more.clone());
    }
    params
}

/// The path clients mount the volume by, as the PV gives it to kubelets.
fn mount_path(volume: &PersistentVolume) -> String {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.as_ref())
        .map(|nfs| nfs.path.clone())
        .unwrap_or_default()
}

/// The volume's directory on the NFS server, from where the PV says the data lies (its
/// `spec.nfs.path` may be an opaque name that says nothing of it).
fn directory(system: &System, volume: &PersistentVolume) -> PathBuf {
    volume_path(volume)
        .map(|path| system.agents[0].root.join(path.as_str()))
        .unwrap_or_default()
}

/// The volume's path on its agent, as the PV's annotation records it.
fn volume_path(volume: &PersistentVolume) -> anyhow::Result<VolumePath> {
    let recorded = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nfsprov.dev/path"))
        .ok_or_else(|| anyhow::anyhow!("the PV records no volume path"))?;
    Ok(VolumePath::parse(recorded)?)
}

fn host(address: Ipv4Addr) -> ExportClient {
    ExportClient::Host(address.into())
}

/// Awaits the agent's export of `volume` satisfying `wanted` (described as `what` for a
/// failure), as the agent reports it through its API.
async fn await_export(
    system: &System,
    volume: &PersistentVolume,
    what: &str,
    wanted: impl Fn(&VolumeExport) -> bool,
) -> anyhow::Result<VolumeExport> {
    let client = system.agents[0].process.client()?;
    let path = volume_path(volume)?;
    let deadline = Instant::now() + WAIT;
    loop {
        let export = client.get_volume(&path, None).await?.and_then(|v| v.export);
        if let Some(export) = export.as_ref().filter(|e| wanted(e)) {
            return Ok(export.clone());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "the export of {path} is not {what} within {WAIT:?}: {export:?}\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Awaits the export of `volume` admitting exactly `clients`.
async fn await_clients(
    system: &System,
    volume: &PersistentVolume,
    clients: &[Ipv4Addr],
) -> anyhow::Result<VolumeExport> {
    let mut wanted: Vec<ExportClient> = clients.iter().copied().map(host).collect();
    wanted.sort_unstable();
    await_export(system, volume, &format!("{clients:?}"), |export| {
        let mut served = export.clients.clone();
        served.sort_unstable();
        served == wanted
    })
    .await
}

/// The node lists the volume's directory through NFS.
fn mounts(system: &System, node: &NodeClient<'_>, volume: &PersistentVolume) -> anyhow::Result<()> {
    node.ls(&system.file_url(volume, "")).map(drop)
}

/// The node's NFS client is turned away: ganesha's pseudo filesystem shows a node only
/// the exports that admit it, so the volume's path does not exist for it.
fn refused(
    system: &System,
    node: &NodeClient<'_>,
    volume: &PersistentVolume,
) -> anyhow::Result<()> {
    match node.ls(&system.file_url(volume, "")) {
        Ok(listing) => anyhow::bail!("the volume was listed: {listing}"),
        Err(error) => {
            let text = format!("{error:#}");
            anyhow::ensure!(
                text.contains("NFS4ERR_NOENT") || text.contains("NFS4ERR_ACCESS"),
                "not a refusal of the export: {text}"
            );
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pods_export_admits_the_node_of_its_pod_and_follows_the_pod_to_another()
-> anyhow::Result<()> {
    const TEST: &str = "a_pods_export_admits_the_node_of_its_pod_and_follows_the_pod_to_another";
    let Some((system, shim)) = start(TEST).await? else {
        return Ok(());
    };
    let (a, b) = (shim.node(POD_NODE_A), shim.node(POD_NODE_B));
    let node_a = system.node("e2e-node-a", POD_NODE_A).await?;
    let node_b = system.node("e2e-node-b", POD_NODE_B).await?;
    system
        .class("e2e-pods", class_params("pods", json!({"mode": "0777"})))
        .await?;
    system
        .claim("moving", "e2e-pods", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("moving", WAIT).await?;

    // No pod uses the claim yet: exported to nobody.
    await_clients(&system, &volume, &[]).await?;
    refused(&system, &a, &volume)?;

    system.pod("app-on-a", "moving", &node_a).await?;
    await_clients(&system, &volume, &[POD_NODE_A]).await?;
    mounts(&system, &a, &volume)?;
    refused(&system, &b, &volume)?;

    // The pod moves: its successor on B is admitted at once, while A, whose pod object
    // is still there (its kubelet may still have the volume mounted), keeps access.
    system.pod("app-on-b", "moving", &node_b).await?;
    await_clients(&system, &volume, &[POD_NODE_A, POD_NODE_B]).await?;
    mounts(&system, &a, &volume)?;
    mounts(&system, &b, &volume)?;
    system.remove_pod("app-on-a").await?;
    await_clients(&system, &volume, &[POD_NODE_B]).await?;
    mounts(&system, &b, &volume)?;
    refused(&system, &a, &volume)?;
    b.write(
        &system.file_url(&volume, "from-b"),
        b"written from node B",
        Some(1000),
        Some(1000),
    )?;
    assert_eq!(
        std::fs::read(directory(&system, &volume).join("from-b"))?,
        b"written from node B"
    );

    system.remove_pod("app-on-b").await?;
    await_clients(&system, &volume, &[]).await?;
    refused(&system, &b, &volume)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_nodes_export_follows_nodes_added_and_removed() -> anyhow::Result<()> {
    const TEST: &str = "a_nodes_export_follows_nodes_added_and_removed";
    let Some((system, shim)) = start(TEST).await? else {
        return Ok(());
    };
    let (kept, added) = (shim.node(NODE_KEPT), shim.node(NODE_ADDED));
    system.node("e2e-node-kept", NODE_KEPT).await?;
    system
        .class("e2e-nodes", class_params("nodes", json!({})))
        .await?;
    system
        .claim("everywhere", "e2e-nodes", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("everywhere", WAIT).await?;
    // On a shared API server other Nodes may be admitted too: only these two are looked at.
    let admits = |address: Ipv4Addr| move |e: &VolumeExport| e.clients.contains(&host(address));
    await_export(
        &system,
        &volume,
        "admitting the first node",
        admits(NODE_KEPT),
    )
    .await?;
    let export = await_export(&system, &volume, "without the second node", |e| {
        !e.clients.contains(&host(NODE_ADDED))
    })
    .await?;
    assert!(export.clients.contains(&host(NODE_KEPT)), "{export:?}");
    mounts(&system, &kept, &volume)?;
    refused(&system, &added, &volume)?;

    let node = system.node("e2e-node-added", NODE_ADDED).await?;
    await_export(
        &system,
        &volume,
        "admitting the added node",
        admits(NODE_ADDED),
    )
    .await?;
    mounts(&system, &added, &volume)?;
    mounts(&system, &kept, &volume)?;

    system.remove_node(&node).await?;
    let export = await_export(&system, &volume, "without the removed node", |e| {
        !e.clients.contains(&host(NODE_ADDED))
    })
    .await?;
    assert!(export.clients.contains(&host(NODE_KEPT)), "{export:?}");
    refused(&system, &added, &volume)?;
    mounts(&system, &kept, &volume)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn root_is_squashed_to_the_class_owner_and_read_only_claims_refuse_writes()
-> anyhow::Result<()> {
    const TEST: &str = "root_is_squashed_to_the_class_owner_and_read_only_claims_refuse_writes";
    let Some((system, shim)) = start(TEST).await? else {
        return Ok(());
    };
    let (listed, unlisted) = (shim.node(LISTED), shim.node(UNLISTED));
    system
        .class(
            "e2e-squash",
            class_params(
                &LISTED.to_string(),
                json!({"squash": "root", "uid": OWNER.to_string(), "gid": OWNER.to_string()}),
            ),
        )
        .await?;

    system
        .claim("squashed", "e2e-squash", json!({}), json!({}))
        .await?;
    let volume = system.bound_volume("squashed", WAIT).await?;
    let export = await_clients(&system, &volume, &[LISTED]).await?;
    assert_eq!(
        (export.squash, export.anon_uid, export.anon_gid),
        (Squash::Root, Some(OWNER), Some(OWNER))
    );
    assert_eq!(export.access, ExportAccess::ReadWrite);
    // The PV mounts the opaque path the agent reported, which names no claim.
    assert_eq!(mount_path(&volume), export.path);
    assert!(!export.path.contains("squashed"), "{}", export.path);
    listed.write(
        &system.file_url(&volume, "by-root"),
        b"root on the client",
        Some(0),
        Some(0),
    )?;
    let written = std::fs::metadata(directory(&system, &volume).join("by-root"))?;
    assert_eq!(
        (written.uid(), written.gid()),
        (OWNER, OWNER),
        "root is the class's anonymous user on the volume"
    );
    refused(&system, &unlisted, &volume)?;

    // Only ReadOnlyMany: exported read-only, so the same client cannot write.
    system
        .claim_of("shared-data", "e2e-squash", &["ReadOnlyMany"], "1Gi")
        .await?;
    let read_only = system.bound_volume("shared-data", WAIT).await?;
    let export = await_clients(&system, &read_only, &[LISTED]).await?;
    assert_eq!(export.access, ExportAccess::ReadOnly);
    mounts(&system, &listed, &read_only)?;
    let refused_write = listed.write(
        &system.file_url(&read_only, "refused"),
        b"x",
        Some(OWNER),
        Some(OWNER),
    );
    let error = format!(
        "{:#}",
        refused_write.expect_err("a read-only export took a write")
    );
    // Refused as a write to a read-only filesystem: the owner may write otherwise.
    assert!(error.contains("NFS4ERR_ROFS"), "{error}");
    assert!(!directory(&system, &read_only).join("refused").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_btrfs_claim_refuses_writes_past_its_size_through_nfs_until_it_is_expanded()
-> anyhow::Result<()> {
    const TEST: &str =
        "a_btrfs_claim_refuses_writes_past_its_size_through_nfs_until_it_is_expanded";
    let Some(btrfs) = nfsprov_e2e::requirements::btrfs_over_nfs(TEST, 512) else {
        return Ok(());
    };
    let system = start_system(AgentSpec {
        name: "nfs1".into(),
        root: Some(btrfs.root()),
        settings: "[quota]\nbackend = \"btrfs\"".into(),
    })
    .await?;
    // The in-process libnfs client connects from 127.0.0.1.
    system
        .class_with_expansion(
            "e2e-quota",
            class_params("127.0.0.1", json!({"quota": "enforce", "squash": "none"})),
            true,
        )
        .await?;
    system
        .claim_of("limited", "e2e-quota", &["ReadWriteMany"], "10Mi")
        .await?;
    let volume = system.bound_volume("limited", WAIT).await?;
    let volume_name = volume.metadata.name.clone().unwrap_or_default();
    let dir = directory(&system, &volume);
    await_clients(&system, &volume, &[Ipv4Addr::LOCALHOST]).await?;
    let nfs = NfsClient::connect("127.0.0.1", system.nfs.port(), &mount_path(&volume))?;

    // Twice the claim's size, within the size it is expanded to.
    let payload = vec![0x5a_u8; 20_000_000];
    assert_write_stops_at_capacity(Limit::Quota, &nfs, &dir, "big", &payload, 10 * MIB)?;
    btrfs.sync()?;

    // Expanded through the claim: the controller raises the quota through the agent.
    system.request_storage("limited", "30Mi").await?;
    system
        .wait_for_size("limited", &volume_name, "30Mi", WAIT)
        .await?;
    assert_eq!(btrfs.qgroup_limit(&dir)?, Some(30 * MIB));
    nfs.write_file("big", &payload, 0o644)?;
    assert_eq!(
        std::fs::metadata(dir.join("big"))?.len(),
        payload.len() as u64
    );
    drop(nfs);

    system
        .delete_claim_and_wait_for_volume("limited", &volume_name)
        .await?;
    assert!(!dir.exists(), "the subvolume went with its claim");
    Ok(())
}
