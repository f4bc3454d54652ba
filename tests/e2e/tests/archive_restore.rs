//! An archive made into a new claim through the whole system: files written through NFS
//! into a claim of a class that archives, the claim deleted, its archive found on the
//! agent, and `kubectl nfsprov restore` (the real plugin binary) making a claim whose
//! volume, read back through NFS, holds exactly the archived files. A claim of another
//! namespace naming the same archive is refused. Runs against the simulator, or a real
//! cluster with `E2E_KUBECONFIG`.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use nfsprov_api_types::Archive;
use nfsprov_e2e::binaries::binary;
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::libnfs::{
    FileKind, NfsClient, Timestamp, TreeManifest, fixture, snapshot_tree, sparse_usage,
    write_fixture_tree,
};
use nfsprov_e2e::system::{AgentSpec, System};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
const GIB: u64 = 1 << 30;
const CLASS: &str = "e2e-archive";

#[tokio::test(flavor = "multi_thread")]
async fn an_archive_restored_by_the_plugin_holds_exactly_the_archived_files() -> anyhow::Result<()>
{
    let test = "an_archive_restored_by_the_plugin_holds_exactly_the_archived_files";
    if let Err(why) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(test, &why);
        return Ok(());
    }
    let system = System::start_with_agents(
        KubeApi::start().await?,
        &[AgentSpec::named("nfs1")],
        1,
        &["--leader-elect=false"],
    )
    .await?;
    let namespace = system.names.namespace.clone();
    system
        .class(
            CLASS,
            json!({"agent": "nfs1", "onDelete": "archive", "pathPattern": "${.PVC.name}"}),
        )
        .await?;

    // Files of several owners, modes, links and a sparse file, written through NFS.
    system.claim("source", CLASS, json!({}), json!({})).await?;
    let source = system.bound_volume("source", WAIT).await?;
    let (nfs, dir) = mount(&system, &source)?;
    write_fixture_tree(&nfs, &dir)?;
    // Times the restore must keep: set after every write and chown, which move them.
    let past = |sec| Timestamp { sec, nsec: 0 };
    for (name, sec) in [
        (fixture::OWNER_B, 1_000_000_000),
        (fixture::SPARSE, 1_200_000_000),
        (fixture::NESTED, 1_400_000_000),
    ] {
        nfs.set_times(&at(&dir, name), past(sec - 7), past(sec))?;
    }
    let taken = snapshot_tree(&nfs, &dir)?;
    let taken_times = file_times(&nfs, &dir, &taken)?;
    drop(nfs);

    // The claim goes; the class archives its volume.
    system
        .delete_claim_and_wait_for_volume("source", &name_of(&source))
        .await?;
    let agent = system.agents[0].process.client()?;
    let mut archives: Vec<Archive> = Vec::new();
    agent
        .for_each_archive_page(100, None, |page| archives.extend(page))
        .await?;
    let archive = archives
        .iter()
        .find(|a| {
            a.owner.pvc_namespace.as_deref() == Some(namespace.as_str())
                && a.owner.pvc_name.as_deref() == Some("source")
        })
        .ok_or_else(|| anyhow::anyhow!("no archive of the claim in {archives:?}"))?
        .clone();
    assert_eq!(archive.capacity_bytes, Some(GIB), "{archive:?}");
    let id = archive.id.to_string();

    // The plugin refuses another namespace in the controller's words, and creates nothing.
    let plugin = Plugin::new(&system)?;
    let other_namespace = format!("{namespace}-other");
    let refused = plugin
        .run(&[
            "restore",
            "nfs1",
            &id,
            "--to",
            &format!("{other_namespace}/stolen"),
            "--class",
            &system.names.class(CLASS),
        ])
        .await?;
    let words = format!(
        "archive nfs1:{id} holds a volume of namespace {namespace}, not {other_namespace}: a claim is made only from an archive of its own namespace"
    );
    assert_ne!(refused.code, 0);
    assert!(refused.stderr.contains(&words), "{}", refused.stderr);

    // The restore, waited for.
    let run = plugin
        .run(&[
            "restore",
            "nfs1",
            &id,
            "--to",
            &format!("{namespace}/restored"),
            "--class",
            &system.names.class(CLASS),
            "--wait",
            "--timeout",
            "90",
            "-o",
            "json",
        ])
        .await?;
    anyhow::ensure!(
        run.code == 0,
        "restore failed: {}{}\n{}",
        run.stdout,
        run.stderr,
        system.logs()
    );
    let report: Value = serde_json::from_str(&run.stdout)?;
    assert_eq!(report["phase"], "Bound", "{report}");
    assert_eq!(report["capacity_bytes"], GIB, "{report}");
    let restored = system
        .volumes()
        .get(report["volume"].as_str().unwrap_or_default())
        .await?;
    let claim = system.claims().get("restored").await?;
    assert_eq!(
        claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()),
        restored.metadata.name.as_deref()
    );
    let annotations = restored.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("nfsprov.dev/restored-from-archive"),
        Some(&format!("nfs1:{id}")),
        "{annotations:?}"
    );
    let (restored_nfs, restored_dir) = mount(&system, &restored)?;
    let held = snapshot_tree(&restored_nfs, &restored_dir)?;
    assert_eq!(held, taken, "the restored volume over NFS");
    assert_eq!(
        file_times(&restored_nfs, &restored_dir, &held)?,
        taken_times,
        "modification times"
    );
    let (size, used) = sparse_usage(&restored_nfs, &restored_dir)?;
    assert!(
        size == fixture::SPARSE_SIZE && used < 8 << 20,
        "the sparse file keeps its holes: {used} of {size} bytes used"
    );
    drop(restored_nfs);
    // The archive stays as it was.
    let kept = agent.get_archive(&archive.id, None).await?;
    assert_eq!(kept.id, archive.id);

    // A claim of another namespace naming the archive itself: refused, no volume.
    let others = Api::<Namespace>::all(system.client.clone());
    let other: Namespace = serde_json::from_value(json!({"metadata": {"name": other_namespace}}))?;
    others.create(&PostParams::default(), &other).await?;
    let stolen: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {
            "name": "stolen",
            "namespace": other_namespace,
            "annotations": {
                "nfsprov.dev/restore-archive": id,
                "nfsprov.dev/restore-archive-agent": "nfs1",
            },
        },
        "spec": {
            "storageClassName": system.names.class(CLASS),
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }))?;
    let other_claims =
        Api::<PersistentVolumeClaim>::namespaced(system.client.clone(), &other_namespace);
    other_claims.create(&PostParams::default(), &stolen).await?;
    failed_event(&system, &other_namespace, "stolen", &words).await?;
    let stolen = other_claims.get("stolen").await?;
    assert_eq!(
        stolen.status.as_ref().and_then(|s| s.phase.as_deref()),
        Some("Pending")
    );
    let uid = stolen.metadata.uid.clone().unwrap_or_default();
    let made = system.volumes().get_opt(&format!("pvc-{uid}")).await?;
    assert!(made.is_none(), "a volume was made: {made:?}");
    assert!(
        !system.agents[0].root.join("stolen").exists(),
        "no directory was made for it"
    );

    other_claims
        .delete("stolen", &DeleteParams::default())
        .await?;
    others
        .delete(&other_namespace, &DeleteParams::default())
        .await?;
    system
        .delete_claim_and_wait_for_volume("restored", &name_of(&restored))
        .await?;
    Ok(())
}

/// The plugin binary, run as a user runs it against the test's API, with the agents'
/// connection files and the run's provisioner.
struct Plugin {
    bin: std::path::PathBuf,
    args: Vec<String>,
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Plugin {
    fn new(system: &System) -> anyhow::Result<Self> {
        Ok(Self {
            bin: binary("kubectl-nfsprov")?,
            args: vec![
                "--kubeconfig".into(),
                system.api.kubeconfig().display().to_string(),
                "--provisioner".into(),
                system.names.provisioner.clone(),
                "--agents-dir".into(),
                path(&system.agents_dir),
            ],
        })
    }

    async fn run(&self, args: &[&str]) -> anyhow::Result<Run> {
        // Subcommand first: --agents-dir is the command's own flag.
        let (command, rest) = args.split_first().expect("a command");
        let output = tokio::process::Command::new(&self.bin)
            .arg(command)
            .args(&self.args)
            .args(rest)
            .output()
            .await?;
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        println!(
            "$ kubectl nfsprov {}\n{}{}",
            args.join(" "),
            run.stdout,
            run.stderr
        );
        Ok(run)
    }
}

fn path(path: &Path) -> String {
    path.display().to_string()
}

/// Polls the events of `namespace` for a `ProvisioningFailed` about `claim` saying `text`.
async fn failed_event(
    system: &System,
    namespace: &str,
    claim: &str,
    text: &str,
) -> anyhow::Result<()> {
    let events = Api::<Event>::namespaced(system.client.clone(), namespace);
    let deadline = Instant::now() + WAIT;
    loop {
        let seen: Vec<(String, String)> = events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(claim))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect();
        if seen
            .iter()
            .any(|(reason, message)| reason == "ProvisioningFailed" && message.contains(text))
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "no ProvisioningFailed about {namespace}/{claim} with {text:?}: {seen:?}\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The modification time of every regular file of the manifest, through NFS.
fn file_times(
    nfs: &NfsClient,
    dir: &str,
    manifest: &TreeManifest,
) -> anyhow::Result<BTreeMap<String, Timestamp>> {
    let mut times = BTreeMap::new();
    for (name, entry) in &manifest.entries {
        if entry.kind == FileKind::File {
            times.insert(name.clone(), nfs.lstat(&at(dir, name))?.mtime);
        }
    }
    Ok(times)
}

fn name_of(volume: &PersistentVolume) -> String {
    volume.metadata.name.clone().unwrap_or_default()
}

/// A client of the export root and the volume's directory below it.
fn mount(system: &System, volume: &PersistentVolume) -> anyhow::Result<(NfsClient, String)> {
    let export = &system.agents[0].export;
    let nfs_path = volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.as_ref())
        .map(|nfs| nfs.path.clone())
        .unwrap_or_default();
    let dir = nfs_path
        .strip_prefix(export.as_str())
        .ok_or_else(|| anyhow::anyhow!("{nfs_path} is not under {export}"))?
        .to_owned();
    Ok((
        NfsClient::connect("127.0.0.1", system.nfs.port(), export)?,
        dir,
    ))
}

/// `name` in the directory `dir` of an NFS client.
fn at(dir: &str, name: &str) -> String {
    format!("{}/{name}", dir.trim_end_matches('/'))
}
