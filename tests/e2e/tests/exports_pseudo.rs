//! What an NFSv4 client admitted to no volume learns from ganesha's pseudo-filesystem:
//! a raw NFSv4.0 client (PUTROOTFH, LOOKUP, READDIR) walks from the pseudo-root down to
//! the export root's path, as anyone on the network can, while an admitted client
//! mounts its volume by the path the agent reported. Volumes exported at opaque paths
//! show no namespace or claim; one exported at its volume path (as before opaque paths)
//! shows its namespace, which is what the walk would find of every volume without them.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::unix::fs::MetadataExt as _;

use nfsprov_api_types::{CreateVolumeRequest, ExportRequest, VolumePath};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::bind_shim::BindShim;
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};
use nfsprov_nfs_attack::nfs4;
use nfsprov_nfs_attack::rpc::{AuthSys, Source, SourcePort};

const ADMITTED: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const STRANGER: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);

/// The names of the volumes exported at opaque paths, which nobody unadmitted may learn.
const SECRET_NAMES: [&str; 4] = ["team-alpha", "ledger", "team-beta", "payroll"];

fn to_admitted(opaque_path: bool) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        export: Some(ExportRequest {
            clients: vec![ADMITTED.to_string().parse().unwrap()],
            opaque_path,
            ..ExportRequest::default()
        }),
        ..Default::default()
    }
}

/// Every name READDIR shows a client with no export of its own from `source`: the
/// pseudo-root's, then each directory on the way down to `mount_root`, in order.
fn walk(
    server: SocketAddrV4,
    source: Ipv4Addr,
    mount_root: &str,
) -> anyhow::Result<Vec<Vec<String>>> {
    let source = Source {
        addr: source,
        // Root on a node of the cluster: the strongest position short of admission.
        port: SourcePort::Reserved,
    };
    let mut client = nfs4::Client::connect(server, source, AuthSys::root())?;
    let mut listings = vec![client.list(None)?];
    let components: Vec<&str> = mount_root
        .split('/')
        .filter(|component| !component.is_empty())
        .collect();
    for depth in 1..=components.len() {
        let handle = client.lookup_path(&components[..depth])?;
        listings.push(client.list(Some(&handle))?);
    }
    Ok(listings)
}

#[tokio::test(flavor = "multi_thread")]
async fn an_unadmitted_client_browsing_ganeshas_pseudo_root_learns_no_namespace_or_claim()
-> anyhow::Result<()> {
    const TEST: &str =
        "an_unadmitted_client_browsing_ganeshas_pseudo_root_learns_no_namespace_or_claim";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    let base = tempfile::tempdir()?;
    let root = base.path().join("export");
    std::fs::create_dir(&root)?;
    let config_dir = base.path().join("ganesha.d");
    let bus = PrivateBus::start().await?;
    let mut ganesha = Ganesha::start(&bus, &config_dir).await?;
    let mount_root = root.display().to_string();
    let mut agent = AgentProcess::start_with_settings(
        "pseudo1",
        &root,
        "127.0.0.1",
        &mount_root,
        &ganesha.agent_settings(),
    )
    .await?;
    let shim = BindShim::build()?;
    let client = agent.client()?;
    assert!(client.info(None).await?.capabilities.opaque_export_paths);

    let alpha = VolumePath::parse("team-alpha/ledger")?;
    let beta = VolumePath::parse("team-beta/payroll")?;
    let legacy = VolumePath::parse("team-legacy/old-claim")?;
    let mut reported = Vec::new();
    for path in [&alpha, &beta] {
        let made = client.create_volume(path, &to_admitted(true), None).await?;
        let export = made.volume.export.expect("the volume reports its export");
        let name = export
            .path
            .strip_prefix(&format!("{mount_root}/"))
            .unwrap_or_else(|| panic!("{} is not below {mount_root}", export.path))
            .to_owned();
        assert!(
            name.len() == 32 && name.bytes().all(|b| b.is_ascii_hexdigit()),
            "{name}"
        );
        reported.push((path, export.path, name));
    }
    client
        .create_volume(&legacy, &to_admitted(false), None)
        .await?;

    let server = SocketAddrV4::new(Ipv4Addr::LOCALHOST, ganesha.port());
    let listings = walk(server, STRANGER, &mount_root)?;
    for (depth, listing) in listings.iter().enumerate() {
        for name in listing {
            assert!(
                !SECRET_NAMES.iter().any(|secret| name.contains(secret)),
                "level {depth} of the pseudo-filesystem shows {name:?}: {listings:?}"
            );
        }
    }
    // ganesha shows a client no junction of an export it is not admitted to: of the
    // opaque exports nothing at all, of the one at its volume path the directory of its
    // namespace, which the pseudo-filesystem holds on the way to the claim.
    let at_mount_root = listings.last().expect("the walk reaches the export root");
    assert_eq!(at_mount_root, &vec!["team-legacy".to_owned()]);
    // Its claim, the junction itself, is left out as well.
    let mut legacy_namespace: Vec<&str> = mount_root
        .split('/')
        .filter(|component| !component.is_empty())
        .collect();
    legacy_namespace.push("team-legacy");
    let mut stranger_client = nfs4::Client::connect(
        server,
        Source {
            addr: STRANGER,
            port: SourcePort::Reserved,
        },
        AuthSys::root(),
    )?;
    let handle = stranger_client.lookup_path(&legacy_namespace)?;
    assert_eq!(stranger_client.list(Some(&handle))?, Vec::<String>::new());
    // The same walk by the admitted client finds the opaque names where the stranger
    // found none: the walk looks where the exports are.
    let admitted_walk = walk(server, ADMITTED, &mount_root)?;
    let seen = admitted_walk
        .last()
        .expect("the walk reaches the export root");
    for (_, _, name) in &reported {
        assert!(seen.contains(name), "{name} not in {seen:?}");
    }
    for name in admitted_walk.iter().flatten() {
        assert!(
            !SECRET_NAMES.iter().any(|secret| name.contains(secret)),
            "the admitted client sees {name:?}: {admitted_walk:?}"
        );
    }

    // The admitted client mounts each volume by the reported path and writes into it;
    // the stranger is refused there.
    let (admitted, stranger) = (shim.node(ADMITTED), shim.node(STRANGER));
    for (path, mount, _) in &reported {
        admitted.write(&ganesha.url(&format!("{mount}/hello")), b"hi", None, None)?;
        let written = std::fs::metadata(root.join(path.as_str()).join("hello"))?;
        assert_eq!(written.size(), 2);
        assert!(
            stranger.ls(&ganesha.url(&format!("{mount}/"))).is_err(),
            "{STRANGER} is not admitted to {path}"
        );
    }

    // The path lasts: a change of clients, an agent restart and a ganesha restart
    // leave it as it was, and the admitted client still mounts it.
    let (path, mount, _) = &reported[0];
    let moved = ExportRequest {
        clients: vec![
            ADMITTED.to_string().parse()?,
            Ipv4Addr::new(127, 0, 0, 4).to_string().parse()?,
        ],
        opaque_path: true,
        ..ExportRequest::default()
    };
    let changed = client.set_volume_export(path, &moved, None).await?;
    assert_eq!(changed.export.map(|e| e.path).as_ref(), Some(mount));
    agent.restart().await?;
    // ganesha restarted (on its port) serves again what the agent's files say.
    ganesha.restart().await?;
    let client = agent.client()?;
    let served = client.get_volume(path, None).await?.expect("still there");
    assert_eq!(served.export.map(|e| e.path).as_ref(), Some(mount));
    admitted.ls(&ganesha.url(&format!("{mount}/")))?;
    let again = walk(server, STRANGER, &mount_root)?;
    assert!(
        again
            .iter()
            .flatten()
            .all(|name| !SECRET_NAMES.iter().any(|secret| name.contains(secret))),
        "{again:?}"
    );
    Ok(())
}
