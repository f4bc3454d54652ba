//! Per-volume exports on nfs-ganesha through its D-Bus export manager: each "node" is a
//! loopback address of its own, its NFS client bound to it, and the agent decides which
//! of them may mount each volume.

use std::net::Ipv4Addr;
use std::os::unix::fs::MetadataExt as _;
use std::path::Path;

use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{
    CreateVolumeRequest, ErrorCode, ExportAccess, ExportRequest, Squash, VolumePath,
};
use nfsprov_e2e::agent::AgentProcess;
use nfsprov_e2e::bind_shim::BindShim;
use nfsprov_e2e::ganesha_dbus::{Ganesha, PrivateBus};

const NODE_A: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);
const NODE_B: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 3);
const ANON: u32 = 4321;

/// A bus, ganesha on it and an agent with the ganesha manager over one export root.
struct Setup {
    root: std::path::PathBuf,
    config_dir: std::path::PathBuf,
    shim: BindShim,
    agent: AgentProcess,
    ganesha: Ganesha,
    _bus: PrivateBus,
    _base: tempfile::TempDir,
}

impl Setup {
    async fn start(name: &str) -> anyhow::Result<Self> {
        let base = tempfile::tempdir()?;
        let root = base.path().join("export");
        std::fs::create_dir(&root)?;
        let config_dir = base.path().join("ganesha.d");
        let bus = PrivateBus::start().await?;
        let ganesha = Ganesha::start(&bus, &config_dir).await?;
        let export = root.display().to_string();
        let agent = AgentProcess::start_with_settings(
            name,
            &root,
            "127.0.0.1",
            &export,
            &ganesha.agent_settings(),
        )
        .await?;
        Ok(Self {
            root,
            config_dir,
            shim: BindShim::build()?,
            agent,
            ganesha,
            _bus: bus,
            _base: base,
        })
    }

    /// The URL of `file` in `volume` as the agent says clients mount it.
    fn url(&self, mount_path: &str, file: &str) -> String {
        self.ganesha.url(&format!("{mount_path}{file}"))
    }
}

fn to(clients: &[Ipv4Addr]) -> ExportRequest {
    ExportRequest {
        clients: clients
            .iter()
            .map(|a| a.to_string().parse().unwrap())
            .collect(),
        squash: Squash::Root,
        anon_uid: Some(ANON),
        anon_gid: Some(ANON),
        ..ExportRequest::default()
    }
}

fn create_request(export: ExportRequest) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        export: Some(export),
        ..Default::default()
    }
}

fn modified(path: &Path) -> anyhow::Result<(i64, i64, u64)> {
    let meta = std::fs::metadata(path)?;
    Ok((meta.mtime(), meta.mtime_nsec(), meta.ino()))
}

#[tokio::test(flavor = "multi_thread")]
async fn ganesha_exports_admit_only_the_clients_the_request_names() -> anyhow::Result<()> {
    const TEST: &str = "ganesha_exports_admit_only_the_clients_the_request_names";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    let setup = Setup::start("exports1").await?;
    let client = setup.agent.client()?;
    let info = client.info(None).await?;
    assert_eq!(info.capabilities.exports.as_str(), "ganesha");
    let (a, b) = (setup.shim.node(NODE_A), setup.shim.node(NODE_B));

    // A create without an export would leave a volume nobody can mount: refused.
    let path = VolumePath::parse("ns/claim")?;
    let refused = client
        .create_volume(&path, &CreateVolumeRequest::default(), None)
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Api { error, .. }) if error.code == ErrorCode::InvalidBody),
        "{refused:?}"
    );

    let created = client
        .create_volume(&path, &create_request(to(&[NODE_A])), None)
        .await?;
    let export = created
        .volume
        .export
        .clone()
        .expect("the volume reports its export");
    assert_eq!(export.path, format!("{}/ns/claim", setup.root.display()));
    assert_eq!(export.clients, vec![NODE_A.to_string().parse()?]);
    let mount = export.path.clone();
    let listing = setup.url(&mount, "/");
    a.ls(&listing)?;
    assert!(b.ls(&listing).is_err(), "127.0.0.3 is not admitted");

    // Root on the client is the anonymous user on the volume.
    a.write(
        &setup.url(&mount, "/by-root"),
        b"squashed",
        Some(0),
        Some(0),
    )?;
    let written = std::fs::metadata(setup.root.join("ns/claim/by-root"))?;
    assert_eq!((written.uid(), written.gid()), (ANON, ANON), "root_squash");

    // The export moves to the other node as a whole.
    let moved = client
        .set_volume_export(&path, &to(&[NODE_B]), None)
        .await?;
    assert_eq!(
        moved.export.unwrap().clients,
        vec![NODE_B.to_string().parse()?]
    );
    b.ls(&listing)?;
    assert!(a.ls(&listing).is_err(), "127.0.0.2 is no longer admitted");

    // The same request again changes nothing: the export's file is not even rewritten.
    let export_file = export_files(&setup.config_dir)?
        .pop()
        .expect("the export has its file");
    let before = modified(&export_file)?;
    client
        .set_volume_export(&path, &to(&[NODE_B]), None)
        .await?;
    assert_eq!(
        modified(&export_file)?,
        before,
        "an unchanged export is left alone"
    );

    // Read-only: listing works, writing does not.
    let read_only = ExportRequest {
        access: ExportAccess::ReadOnly,
        ..to(&[NODE_B])
    };
    client.set_volume_export(&path, &read_only, None).await?;
    b.ls(&listing)?;
    assert!(
        b.write(&setup.url(&mount, "/refused"), b"x", Some(1000), Some(1000))
            .is_err(),
        "a read-only export refuses writes"
    );
    assert!(!setup.root.join("ns/claim/refused").exists());
    let got = client
        .get_volume(&path, None)
        .await?
        .expect("the volume is there");
    assert_eq!(got.export.unwrap().access, ExportAccess::ReadOnly);

    // ganesha restarted serves the export again from the agent's directory.
    let ids = setup.ganesha.export_ids()?;
    let mut ganesha = setup.ganesha;
    ganesha.restart().await?;
    assert_eq!(ganesha.export_ids()?, ids);
    b.ls(&listing)?;

    // Deleted: unexported, and its file gone.
    client.delete_volume(&path, None).await?;
    assert!(b.ls(&listing).is_err());
    assert!(!export_file.exists());
    let ours: Vec<u16> = ganesha
        .export_ids()?
        .into_iter()
        .filter(|id| *id >= 1000)
        .collect();
    assert!(ours.is_empty(), "ganesha still serves {ours:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn ganesha_exports_and_volumes_agree_after_a_crash_at_each_step() -> anyhow::Result<()> {
    const TEST: &str = "ganesha_exports_and_volumes_agree_after_a_crash_at_each_step";
    if !nfsprov_e2e::requirements::ganesha_exports(TEST) {
        return Ok(());
    }
    if !cfg!(debug_assertions) {
        nfsprov_test_skip::skip(TEST, "the agent's crash points exist in debug builds only");
        return Ok(());
    }
    let mut setup = Setup::start("exports2").await?;
    let a = setup.shim.node(NODE_A);
    let path = VolumePath::parse("ns/crash")?;
    let mount = format!("{}/ns/crash", setup.root.display());
    let listing = setup.url(&mount, "/");

    // Killed after the volume was made, before its export: the volume is there and
    // served to nobody; the retried create exports it.
    setup
        .agent
        .restart_with_env(&[("NFSPROV_AGENT_CRASH_AT", "after-volume")])
        .await?;
    let client = setup.agent.client()?;
    assert!(
        client
            .create_volume(&path, &create_request(to(&[NODE_A])), None)
            .await
            .is_err()
    );
    setup.agent.restart().await?;
    let client = setup.agent.client()?;
    let volume = client
        .get_volume(&path, None)
        .await?
        .expect("the volume was made");
    assert_eq!(volume.export, None);
    assert!(a.ls(&listing).is_err());
    let ours = |ganesha: &Ganesha| -> anyhow::Result<Vec<u16>> {
        Ok(ganesha
            .export_ids()?
            .into_iter()
            .filter(|id| *id >= 1000)
            .collect())
    };
    assert!(ours(&setup.ganesha)?.is_empty());
    let again = client
        .create_volume(&path, &create_request(to(&[NODE_A])), None)
        .await?;
    assert!(!again.created);
    assert!(again.volume.export.is_some());
    a.ls(&listing)?;
    let id = ours(&setup.ganesha)?;
    assert_eq!(id.len(), 1);

    // ganesha lost the export behind the agent's back (as when the agent crashed after
    // its record and before ganesha heard of it): the agent's start serves it again.
    setup.ganesha.remove_export(id[0])?;
    assert!(a.ls(&listing).is_err());
    setup.agent.restart().await?;
    assert_eq!(ours(&setup.ganesha)?, id);
    a.ls(&listing)?;

    // Killed after the export was removed, before the volume was deleted: the volume
    // is there and served to nobody; the retried delete finishes.
    setup
        .agent
        .restart_with_env(&[("NFSPROV_AGENT_CRASH_AT", "after-unexport")])
        .await?;
    let client = setup.agent.client()?;
    assert!(client.delete_volume(&path, None).await.is_err());
    setup.agent.restart().await?;
    let client = setup.agent.client()?;
    let volume = client
        .get_volume(&path, None)
        .await?
        .expect("not deleted yet");
    assert_eq!(volume.export, None);
    assert!(ours(&setup.ganesha)?.is_empty());
    assert!(a.ls(&listing).is_err());
    client.delete_volume(&path, None).await?;
    assert_eq!(client.get_volume(&path, None).await?, None);

    // A record whose volume is gone (its directory removed by hand while the agent
    // was down): its export is removed at start, nothing served at that path.
    let kept = VolumePath::parse("ns/kept")?;
    client
        .create_volume(&kept, &create_request(to(&[NODE_A])), None)
        .await?;
    assert_eq!(ours(&setup.ganesha)?.len(), 1);
    setup.agent.kill();
    let file = export_files(&setup.config_dir)?
        .pop()
        .expect("one export file");
    let text = std::fs::read_to_string(&file)?;
    std::fs::write(&file, text.replace("\"ns/kept\"", "\"ns/removed-by-hand\""))?;
    setup.agent.restart().await?;
    assert!(ours(&setup.ganesha)?.is_empty());
    assert!(export_files(&setup.config_dir)?.is_empty());
    Ok(())
}

/// The agent's EXPORT files in `dir`.
fn export_files(dir: &Path) -> anyhow::Result<Vec<std::path::PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path
            .file_name()
            .is_some_and(|name| name.to_string_lossy().starts_with("export-"))
        {
            files.push(path);
        }
    }
    Ok(files)
}
