//! Two clusters on one agent, each confined to its own prefix: one real agent, two
//! credentials made by the real `nfsprov-agent credential add` (prefixes `production`
//! and `staging`), and per cluster its own API, controller process and token-only Secret.
//! Each cluster provisions, clones, snapshots and restores beneath its prefix; what it
//! asks outside it (a class whose `pathPattern` points into the other prefix, a forged PV
//! naming the other's volume as a clone or snapshot source, a forged Snapshot naming the
//! other's snapshot as a restore source) is refused by the agent and said in an event or
//! status; and `kubectl nfsprov` with each cluster's Secret sees that cluster's volumes
//! only.
//!
//! Each cluster is an API server of its own: the production one is the tier's (the real
//! kube-apiserver under `tests/real-api`, the simulator otherwise), the staging one
//! always a simulator. Two controllers on one API server would not stay apart: each
//! picks its classes and claims by its provisioner name, but reconciles every `Snapshot`
//! of the cluster, so one would act on (and, on deletion, release) the other's.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Secret};
use kube::Api;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams, PostParams};
use nfsprov_e2e::agent::write_secret_manifest_files;
use nfsprov_e2e::api_proxy;
use nfsprov_e2e::binaries::binary;
use nfsprov_e2e::cluster::KubeApi;
use nfsprov_e2e::nfs::{nfs_read, nfs_write};
use nfsprov_e2e::system::{NAMESPACE, System};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(90);
/// The agent's name in both clusters' settings.
const AGENT: &str = "nfs1";
/// Each cluster's class, its `pathPattern` beneath the cluster's prefix.
const CLASS: &str = "e2e-scoped";
/// The claims each cluster makes, by what they are.
const SOURCE: &str = "data";
const CLONE: &str = "copy";
const RESTORED: &str = "restored";
const SNAPSHOT: &str = "before-change";

#[tokio::test(flavor = "multi_thread")]
async fn two_clusters_share_one_agent_each_confined_to_its_prefix() -> anyhow::Result<()> {
    let test = "two_clusters_share_one_agent_each_confined_to_its_prefix";
    if let Some(why) = nfsprov_e2e::requirements::missing_parts(
        "ganesha serves as root",
        &["ganesha.nfsd", "nfs-cp", "nfs-cat"],
    ) {
        nfsprov_test_skip::skip(test, &why);
        return Ok(());
    }
    let work = tempfile::tempdir()?;
    let mut production = System::start_on(KubeApi::start().await?, &[AGENT], 0, &[]).await?;
    let agent = &production.agents[0].process;
    let secret_for = |prefix: &str, namespace: &str| {
        agent.credential(&[
            "add",
            prefix,
            "--prefix",
            prefix,
            "--url",
            &agent.url(),
            "--agent-name",
            AGENT,
            "--namespace",
            namespace,
        ])
    };
    let production_secret = secret_for("production", &production.names.namespace)?;
    let staging_secret = secret_for("staging", NAMESPACE)?;
    for manifest in [&production_secret, &staging_secret] {
        // A Secret for a cluster without a certificate: a token, the CA, the settings.
        anyhow::ensure!(
            manifest.contains(&format!("{AGENT}-token: |"))
                && !manifest.contains("tls.key")
                && !manifest.contains("client_cert_file"),
            "not a token-only Secret:\n{manifest}"
        );
    }
    let production_dir = work.path().join("production-agents");
    write_secret_manifest_files(&production_secret, &production_dir)?;
    production.agents_dir = production_dir;
    production
        .start_controller(&["--leader-elect=false"])
        .await?;
    let staging_dir = work.path().join("staging-agents");
    write_secret_manifest_files(&staging_secret, &staging_dir)?;
    let mut staging = production
        .another_cluster(
            KubeApi::start_with(None).await?,
            staging_dir,
            1,
            &["--leader-elect=false"],
        )
        .await?;

    // Each cluster's whole lifecycle beneath its prefix, both at once.
    let (production_paths, staging_paths) = tokio::try_join!(
        provision_clone_snapshot_restore(&production, "production"),
        provision_clone_snapshot_restore(&staging, "staging"),
    )?;
    let root = production.agents[0].root.clone();
    for (system, prefix, paths) in [
        (&production, "production", &production_paths),
        (&staging, "staging", &staging_paths),
    ] {
        for (claim, path) in paths {
            assert_eq!(
                path,
                &format!("{prefix}/{}/{claim}", system.names.namespace)
            );
            let on_disk = root.join(path).join("owner.txt");
            assert_eq!(
                std::fs::read_to_string(&on_disk)?,
                format!("{prefix} wrote this"),
                "{}",
                on_disk.display()
            );
        }
    }
    // The whole root, as its full credential lists it: the six volumes, nothing else.
    let mut all: Vec<String> = production_paths
        .iter()
        .chain(&staging_paths)
        .map(|(_, path)| path.clone())
        .collect();
    all.sort();
    assert_eq!(
        nfsprov_e2e::system::volume_dirs(&production.agents[0]).await,
        all
    );

    // kubectl nfsprov with each cluster's Secret: its own volumes only.
    for (system, prefix, manifest, paths) in [
        (
            &production,
            "production",
            &production_secret,
            &production_paths,
        ),
        (&staging, "staging", &staging_secret, &staging_paths),
    ] {
        plugin_sees_its_own(system, prefix, manifest, paths, work.path()).await?;
    }

    // What staging asks outside its prefix is refused, and production's data stays.
    cannot_reach_outside(&mut staging, &production, &production_paths).await?;
    assert_eq!(
        nfsprov_e2e::system::volume_dirs(&production.agents[0]).await,
        all
    );
    for (_, path) in &production_paths {
        assert_eq!(
            std::fs::read_to_string(root.join(path).join("owner.txt"))?,
            "production wrote this"
        );
    }
    drop(staging);
    Ok(())
}

/// A claim provisioned, a file written into it through NFS, a clone of it, a Snapshot of
/// it and a claim restored from that Snapshot, each read back through NFS: (claim, the
/// volume's path on the agent) of the three.
async fn provision_clone_snapshot_restore(
    system: &System,
    prefix: &str,
) -> anyhow::Result<Vec<(&'static str, String)>> {
    system
        .class(
            CLASS,
            json!({
                "agent": AGENT,
                "onDelete": "delete",
                "pathPattern": format!("{prefix}/${{.PVC.namespace}}/${{.PVC.name}}"),
            }),
        )
        .await?;
    system.claim(SOURCE, CLASS, json!({}), json!({})).await?;
    let source = system.bound_volume(SOURCE, WAIT).await?;
    let content = format!("{prefix} wrote this");
    let url = system.file_url(&source, "owner.txt");
    let written = content.clone();
    tokio::task::spawn_blocking(move || nfs_write(&url, written.as_bytes(), None, None)).await??;

    system
        .claims()
        .create(
            &PostParams::default(),
            &claim_from(
                system,
                CLONE,
                json!({"kind": "PersistentVolumeClaim", "name": SOURCE}),
            )?,
        )
        .await?;
    let clone = system.bound_volume(CLONE, WAIT).await?;

    let snapshots = snapshot_api(system);
    snapshots
        .create(
            &PostParams::default(),
            &snapshot_of(system, SNAPSHOT, SOURCE)?,
        )
        .await?;
    let status = snapshot_status(system, SNAPSHOT, |s| s["readyToUse"] == json!(true)).await?;
    assert_eq!(
        status["sourcePath"].as_str(),
        Some(path_of(&source).as_str()),
        "{status}"
    );
    system
        .claims()
        .create(
            &PostParams::default(),
            &claim_from(
                system,
                RESTORED,
                json!({"apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": SNAPSHOT}),
            )?,
        )
        .await?;
    let restored = system.bound_volume(RESTORED, WAIT).await?;

    let mut paths = Vec::new();
    for (claim, volume) in [(SOURCE, &source), (CLONE, &clone), (RESTORED, &restored)] {
        let url = system.file_url(volume, "owner.txt");
        let read = tokio::task::spawn_blocking(move || nfs_read(&url)).await??;
        assert_eq!(String::from_utf8(read)?, content, "{claim} of {prefix}");
        paths.push((claim, path_of(volume)));
    }
    Ok(paths)
}

/// `kubectl nfsprov agents`, `volumes` and `orphans` with the Secret `manifest` (what
/// `credential add` printed) as the cluster's agent Secret: the agent's volume count and
/// the cluster's volumes are its own, no volume of the other cluster shows as an orphan,
/// and the figure a scoped credential is not told (the agent's promised capacity) shows
/// as `-`.
async fn plugin_sees_its_own(
    system: &System,
    prefix: &str,
    manifest: &str,
    paths: &[(&'static str, String)],
    work: &Path,
) -> anyhow::Result<()> {
    let namespace = system.names.namespace.clone();
    let secret = secret_object(manifest, &namespace)?;
    let kubeconfig = match system.api.simulator_url() {
        // The simulator serves no Secrets: a proxy answers for them (and for the
        // Deployment, absent, so the plugin reads the labelled Secrets as the
        // controller does) and forwards the rest.
        Some(simulator) => {
            let secrets = format!("/api/v1/namespaces/{namespace}/secrets");
            let listed = json!({"kind": "SecretList", "apiVersion": "v1", "metadata": {},
                                "items": [&secret]})
            .to_string();
            let proxy = api_proxy::start(simulator, move |method, path| {
                if path.starts_with("/apis/apps/") {
                    return Some((404, not_found("deployments")));
                }
                (method == "GET" && path == secrets).then(|| (200, listed.clone()))
            })
            .await?;
            let original = std::fs::read_to_string(system.api.kubeconfig())?;
            let file = work.join(format!("{prefix}.kubeconfig"));
            std::fs::write(
                &file,
                original.replace(&format!("http://{simulator}"), &format!("http://{proxy}")),
            )?;
            file
        }
        None => {
            let secret: Secret = serde_json::from_value(secret)?;
            Api::<Secret>::namespaced(system.client.clone(), &namespace)
                .create(&PostParams::default(), &secret)
                .await?;
            system.api.kubeconfig().to_owned()
        }
    };
    let plugin = |args: &[&str]| {
        let mut command = tokio::process::Command::new(binary("kubectl-nfsprov")?);
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .args(["-n", &namespace, "--provisioner", &system.names.provisioner])
            .args(args);
        anyhow::Ok(command)
    };
    let run = |args: &'static [&'static str]| {
        let command = plugin(args);
        async move {
            let output = command?.output().await?;
            let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
            println!("[{prefix}] $ kubectl nfsprov {}\n{stdout}", args.join(" "));
            anyhow::ensure!(
                output.status.success(),
                "kubectl nfsprov {args:?} for {prefix}: {}\n{stdout}{}",
                output.status,
                String::from_utf8_lossy(&output.stderr)
            );
            anyhow::Ok(stdout)
        }
    };

    let agents: Value = serde_json::from_str(&run(&["agents", "-o", "json"]).await?)?;
    let row = &agents["agents"][0];
    assert_eq!(
        agents["agents"].as_array().map(Vec::len),
        Some(1),
        "{agents}"
    );
    assert_eq!(
        (&row["name"], &row["health"]),
        (&json!(AGENT), &json!("ok")),
        "{row}"
    );
    assert_eq!(row["volumes"], json!(paths.len()), "{row}");
    assert!(row["available_bytes"].as_u64().unwrap_or(0) > 0, "{row}");
    // The scoped credential is told what its own volumes were promised (every claim,
    // clone and restore here asks 1Gi), never the whole agent's figure.
    assert_eq!(
        row["provisioned_bytes"],
        json!(paths.len() as u64 * (1 << 30)),
        "{row}"
    );
    let table = run(&["agents"]).await?;
    let header: Vec<&str> = table
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let cells: Vec<&str> = table
        .lines()
        .nth(1)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    let column = header
        .iter()
        .position(|h| h.eq_ignore_ascii_case("provisioned"));
    assert!(
        column
            .and_then(|c| cells.get(c))
            .is_some_and(|cell| cell.starts_with("3Gi")),
        "PROVISIONED is the scope's own 3Gi:\n{table}"
    );

    let volumes: Value = serde_json::from_str(&run(&["volumes", "-o", "json"]).await?)?;
    let mut listed: Vec<(String, String)> = volumes["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|v| {
            (
                v["claim"].as_str().unwrap_or_default().to_owned(),
                v["path"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    listed.sort();
    let mut expected: Vec<(String, String)> = paths
        .iter()
        .map(|(claim, path)| (format!("{namespace}/{claim}"), path.clone()))
        .collect();
    expected.sort();
    assert_eq!(listed, expected, "{volumes}");

    let orphans: Value = serde_json::from_str(&run(&["orphans", "-o", "json"]).await?)?;
    assert_eq!(orphans["orphans"], json!([]), "{orphans}");
    assert_eq!(orphans["checked_agents"], json!([AGENT]), "{orphans}");
    Ok(())
}

/// Staging asks for what lies outside its prefix three ways; the agent refuses each and
/// the controller says so where the user looks.
async fn cannot_reach_outside(
    staging: &mut System,
    production: &System,
    production_paths: &[(&'static str, String)],
) -> anyhow::Result<()> {
    let refusal = "outside this credential's prefix staging";
    let production_source = &production_paths
        .iter()
        .find(|(claim, _)| *claim == SOURCE)
        .ok_or_else(|| anyhow::anyhow!("no source among {production_paths:?}"))?
        .1;

    // A class of staging whose pathPattern points into production: its claim stays
    // Pending, with the agent's refusal in an event, and nothing is made there.
    staging
        .class(
            "e2e-trespass",
            json!({"agent": AGENT, "pathPattern": "production/${.PVC.namespace}/${.PVC.name}"}),
        )
        .await?;
    staging
        .claim("trespass", "e2e-trespass", json!({}), json!({}))
        .await?;
    refused_and_pending(staging, "trespass", refusal, "out_of_scope").await?;
    let root = &production.agents[0].root;
    assert!(
        !root
            .join(format!("production/{}/trespass", staging.names.namespace))
            .exists(),
        "a volume was made in production's prefix"
    );

    // A PV forged in staging, naming production's volume, bound to a claim of staging:
    // a clone of that claim and a Snapshot of it are refused by the agent.
    let own = staging.bound_volume(SOURCE, WAIT).await?;
    forge_bound_claim(staging, "forged", &own, production_source).await?;
    staging
        .claims()
        .create(
            &PostParams::default(),
            &claim_from(
                staging,
                "stolen-copy",
                json!({"kind": "PersistentVolumeClaim", "name": "forged"}),
            )?,
        )
        .await?;
    refused_and_pending(staging, "stolen-copy", refusal, "out_of_scope").await?;
    snapshot_api(staging)
        .create(
            &PostParams::default(),
            &snapshot_of(staging, "stolen", "forged")?,
        )
        .await?;
    let status = snapshot_status(staging, "stolen", |s| {
        s["error"].as_str().is_some_and(|e| e.contains(refusal))
    })
    .await?;
    assert_ne!(status["readyToUse"], json!(true), "{status}");

    // A Snapshot forged in staging whose status names production's ready snapshot: a
    // restore from it finds no such snapshot, as if it did not exist. Forged while the
    // controller is stopped, so that it finds the Snapshot ready and leaves it be.
    let production_snapshot = snapshot_api(production).get(SNAPSHOT).await?;
    let taken = production_snapshot.data["status"].clone();
    staging.controllers[0].kill();
    let forged = snapshot_api(staging);
    forged
        .create(
            &PostParams::default(),
            &snapshot_of(staging, "borrowed", SOURCE)?,
        )
        .await?;
    forged
        .patch_status(
            "borrowed",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": taken})),
        )
        .await?;
    staging
        .restart_controller(0, &["--leader-elect=false"], WAIT)
        .await?;
    staging
        .claims()
        .create(
            &PostParams::default(),
            &claim_from(
                staging,
                "stolen-restore",
                json!({"apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": "borrowed"}),
            )?,
        )
        .await?;
    let snapshot_name = taken["snapshotName"].as_str().unwrap_or_default();
    let absent = format!(
        "404: not_found: staging/{}/stolen-restore: there is no ready snapshot {snapshot_name}",
        staging.names.namespace
    );
    refused_and_pending(staging, "stolen-restore", snapshot_name, &absent).await?;
    Ok(())
}

/// A claim of `system`'s class named `name` made from `source` (its `dataSourceRef`).
fn claim_from(system: &System, name: &str, source: Value) -> anyhow::Result<PersistentVolumeClaim> {
    let kind = source["kind"].as_str().unwrap_or_default();
    let field = if kind == "Snapshot" {
        "dataSourceRef"
    } else {
        "dataSource"
    };
    Ok(serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": system.names.namespace},
        "spec": {
            "storageClassName": system.names.class(CLASS),
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            field: source,
        },
    }))?)
}

/// A claim named `name`, bound to a PV made by hand as a copy of `own` (a PV the
/// controller made in this cluster) whose recorded path is `path`: what an
/// administrator of a compromised cluster can write.
async fn forge_bound_claim(
    system: &System,
    name: &str,
    own: &PersistentVolume,
    path: &str,
) -> anyhow::Result<()> {
    let pv_name = format!("forged-{name}");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": system.names.namespace},
        "spec": {
            "storageClassName": system.names.class(CLASS),
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeName": pv_name,
        },
    }))?;
    let claim = system
        .claims()
        .create(&PostParams::default(), &claim)
        .await?;
    let mut pv = serde_json::to_value(own)?;
    let export = production_export(own, &path_of(own));
    pv["metadata"] = json!({
        "name": pv_name,
        "annotations": own.metadata.annotations.clone().unwrap_or_default(),
    });
    pv["metadata"]["annotations"]["nfsprov.dev/path"] = json!(path);
    pv["spec"]["nfs"]["path"] = json!(format!("{export}/{path}"));
    pv["spec"]["claimRef"] = json!({
        "kind": "PersistentVolumeClaim",
        "namespace": system.names.namespace,
        "name": name,
        "uid": claim.metadata.uid,
    });
    pv["spec"]["persistentVolumeReclaimPolicy"] = json!("Retain");
    pv.as_object_mut().map(|o| o.remove("status"));
    let pv: PersistentVolume = serde_json::from_value(pv)?;
    system.volumes().create(&PostParams::default(), &pv).await?;
    system.bound_volume(name, WAIT).await?;
    Ok(())
}

/// The export path a PV's `spec.nfs.path` starts with, its volume's `path` taken off.
fn production_export(volume: &PersistentVolume, path: &str) -> String {
    let full = volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.as_ref())
        .map(|n| n.path.clone())
        .unwrap_or_default();
    full.strip_suffix(path)
        .map(|e| e.trim_end_matches('/').to_owned())
        .unwrap_or(full)
}

/// The volume's path on its agent, as its PV records it.
fn path_of(volume: &PersistentVolume) -> String {
    volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nfsprov.dev/path"))
        .cloned()
        .unwrap_or_default()
}

/// Awaits the claim's `ProvisioningFailed` event naming `event`, checks that it says
/// `says`, and that the claim is still Pending.
async fn refused_and_pending(
    system: &System,
    claim: &str,
    event: &str,
    says: &str,
) -> anyhow::Result<()> {
    let message = system
        .wait_for_event(claim, "ProvisioningFailed", event)
        .await?;
    assert!(message.contains(says), "{claim}: {message}");
    assert_eq!(
        phase(system, claim).await?.as_deref(),
        Some("Pending"),
        "{claim}"
    );
    Ok(())
}

async fn phase(system: &System, claim: &str) -> anyhow::Result<Option<String>> {
    Ok(system
        .claims()
        .get(claim)
        .await?
        .status
        .and_then(|s| s.phase))
}

fn snapshot_api(system: &System) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("nfsprov.dev", "v1alpha1", "Snapshot");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "snapshots");
    Api::namespaced_with(system.client.clone(), &system.names.namespace, &resource)
}

fn snapshot_of(system: &System, name: &str, claim: &str) -> anyhow::Result<DynamicObject> {
    Ok(serde_json::from_value(json!({
        "apiVersion": "nfsprov.dev/v1alpha1",
        "kind": "Snapshot",
        "metadata": {"name": name, "namespace": system.names.namespace},
        "spec": {"source": {"persistentVolumeClaimName": claim}, "deletionPolicy": "Delete"},
    }))?)
}

/// Polls the Snapshot `name` until its status satisfies `done`; that status.
async fn snapshot_status(
    system: &System,
    name: &str,
    done: impl Fn(&Value) -> bool,
) -> anyhow::Result<Value> {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = snapshot_api(system).get(name).await?.data["status"].clone();
        if done(&status) {
            return Ok(status);
        }
        if Instant::now() > deadline {
            anyhow::bail!(
                "Snapshot {name}: no expected status within {WAIT:?}: {status}\n{}",
                system.logs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The Secret `credential add` printed, as the API server returns it (`data`, base64)
/// in `namespace`.
fn secret_object(manifest: &str, namespace: &str) -> anyhow::Result<Value> {
    let mut secret: Secret = serde_yaml_ng::from_str(manifest)?;
    let data = secret.string_data.take().unwrap_or_default();
    secret.data = Some(
        data.into_iter()
            .map(|(key, value)| (key, ByteString(value.into_bytes())))
            .collect(),
    );
    secret.metadata.namespace = Some(namespace.to_owned());
    let mut value = serde_json::to_value(&secret)?;
    value["apiVersion"] = json!("v1");
    value["kind"] = json!("Secret");
    Ok(value)
}

fn not_found(what: &str) -> String {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {},
        "status": "Failure", "message": format!("{what} not found"), "reason": "NotFound",
        "code": 404,
    })
    .to_string()
}
