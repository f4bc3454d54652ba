//! The whole system as a user runs it: a Kubernetes API, the controller, agents on the
//! "NFS server", nfs-ganesha exporting their roots, and a real NFS client.
//!
//! Each scenario starts its own installation; they run one at a time (the machine has
//! two cores and each brings up an NFS server, agents, an API and controllers).

use std::time::Duration;

use nfsprov_e2e::libnfs::{NfsClient, fixture, snapshot_tree, sparse_usage, write_fixture_tree};
use nfsprov_e2e::nfs::{nfs_read, nfs_write};
use nfsprov_e2e::system::{System, volume_dirs};
use serde_json::json;
use tokio::sync::Mutex;

static ONE_AT_A_TIME: Mutex<()> = Mutex::const_new(());

const BIND: Duration = Duration::from_secs(60);

fn name_of(volume: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    volume.metadata.name.clone().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_bind_and_every_on_delete_policy_is_honoured() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    let agent = &system.agents[0];
    for policy in ["delete", "archive", "retain"] {
        system
            .class(
                &format!("e2e-{policy}"),
                json!({"agent": "nfs1", "onDelete": policy}),
            )
            .await?;
        let claim_name = format!("data-{policy}");
        let claim = system
            .claim(&claim_name, &format!("e2e-{policy}"), json!({}), json!({}))
            .await?;
        let volume = system.bound_volume(&claim_name, BIND).await?;
        let volume_name = name_of(&volume);
        assert_eq!(
            volume_name,
            format!("pvc-{}", claim.metadata.uid.unwrap_or_default())
        );
        let source = volume
            .spec
            .as_ref()
            .and_then(|s| s.nfs.clone())
            .expect("an NFS volume");
        let directory = format!("{}-{claim_name}-{volume_name}", system.names.namespace);
        assert_eq!(source.server, "127.0.0.1");
        assert_eq!(source.path, format!("{}/{directory}", agent.export));

        // A pod's write over NFS lands in the agent's root under the expected directory.
        let url = system.file_url(&volume, "hello.txt");
        nfs_write(
            &url,
            format!("policy {policy}").as_bytes(),
            Some(1000),
            Some(1000),
        )?;
        assert_eq!(nfs_read(&url)?, format!("policy {policy}").as_bytes());
        let on_disk = agent.root.join(&directory).join("hello.txt");
        assert_eq!(
            std::fs::read_to_string(&on_disk)?,
            format!("policy {policy}")
        );

        system
            .delete_claim_and_wait_for_volume(&claim_name, &volume_name)
            .await?;
        match policy {
            "delete" => assert!(
                !agent.root.join(&directory).exists(),
                "deleted data is gone"
            ),
            "retain" => assert_eq!(std::fs::read_to_string(&on_disk)?, "policy retain"),
            _ => {
                assert!(
                    !agent.root.join(&directory).exists(),
                    "archived data left its path"
                );
                let archives: Vec<_> =
                    std::fs::read_dir(agent.root.join(".archive").join(&directory))?
                        .collect::<Result<_, _>>()?;
                assert_eq!(archives.len(), 1);
                let archived = format!(
                    "{}/.archive/{directory}/{}/hello.txt",
                    agent.export,
                    archives[0].file_name().to_string_lossy()
                );
                assert_eq!(nfs_read(&system.nfs.url(&archived))?, b"policy archive");
            }
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn nested_path_patterns_and_hostile_values() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    let agent = &system.agents[0];
    system
        .class(
            "e2e-nested",
            json!({
                "agent": "nfs1",
                "onDelete": "delete",
                "pathPattern": "${.PVC.labels.team}/${.PVC.annotations.app}/${.PVC.name}",
            }),
        )
        .await?;
    system
        .claim(
            "db",
            "e2e-nested",
            json!({"team": "alpha"}),
            json!({"app": "postgres"}),
        )
        .await?;
    let volume = system.bound_volume("db", BIND).await?;
    let url = system.file_url(&volume, "PG_VERSION");
    nfs_write(&url, b"16", Some(999), Some(999))?;
    assert_eq!(
        std::fs::read(agent.root.join("alpha/postgres/db/PG_VERSION"))?,
        b"16"
    );

    // Values that would climb out of the root or name hidden areas fail the claim with an
    // event, and nothing is created.
    let before = volume_dirs(agent).await;
    system
        .claim(
            "escape",
            "e2e-nested",
            json!({"team": "alpha"}),
            json!({"app": "../../etc"}),
        )
        .await?;
    system
        .claim(
            "hidden",
            "e2e-nested",
            json!({"team": "alpha"}),
            json!({"app": ".archive"}),
        )
        .await?;
    system
        .wait_for_event("escape", "ProvisioningFailed", "${.PVC.annotations.app}")
        .await?;
    system
        .wait_for_event("hidden", "ProvisioningFailed", ".archive")
        .await?;
    for claim in ["escape", "hidden"] {
        let phase = system
            .claims()
            .get(claim)
            .await?
            .status
            .and_then(|s| s.phase);
        assert_eq!(phase.as_deref(), Some("Pending"), "{claim}");
    }
    assert_eq!(volume_dirs(agent).await, before);
    assert!(!agent.root.join("alpha/.archive").exists());
    // Label values are checked by the API itself: one that could not be a label never
    // reaches the controller.
    let refused = system
        .claim(
            "bad-label",
            "e2e-nested",
            json!({"team": ".."}),
            json!({"app": "x"}),
        )
        .await;
    assert!(refused.is_err(), "the API refuses a label value of '..'");

    system
        .delete_claim_and_wait_for_volume("db", &name_of(&volume))
        .await?;
    assert!(!agent.root.join("alpha/postgres/db").exists());
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn two_classes_on_two_agents() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["east", "west"], 1, &["--leader-elect=false"]).await?;
    for agent in ["east", "west"] {
        system
            .class(
                &format!("e2e-{agent}"),
                json!({"agent": agent, "onDelete": "delete"}),
            )
            .await?;
        system
            .claim(
                &format!("on-{agent}"),
                &format!("e2e-{agent}"),
                json!({}),
                json!({}),
            )
            .await?;
    }
    for (index, agent) in ["east", "west"].iter().enumerate() {
        let volume = system.bound_volume(&format!("on-{agent}"), BIND).await?;
        let path = volume
            .spec
            .as_ref()
            .and_then(|s| s.nfs.as_ref())
            .map(|n| n.path.clone());
        let under_test = &system.agents[index];
        assert!(
            path.unwrap_or_default().starts_with(&under_test.export),
            "{agent}"
        );
        nfs_write(
            &system.file_url(&volume, "where"),
            agent.as_bytes(),
            None,
            None,
        )?;
        let dirs = volume_dirs(under_test).await;
        assert_eq!(dirs.len(), 1, "{agent}: {dirs:?}");
        assert_eq!(
            std::fs::read(under_test.root.join(&dirs[0]).join("where"))?,
            agent.as_bytes()
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn claims_wait_for_a_stopped_agent_then_bind_once() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    system.agents[0].process.kill();
    for i in 0..3 {
        system
            .claim(&format!("early-{i}"), "e2e-delete", json!({}), json!({}))
            .await?;
    }
    let message = system
        .wait_for_event("early-0", "ProvisioningFailed", "nfs1")
        .await?;
    assert!(!message.is_empty());
    for i in 0..3 {
        let claim = system.claims().get(&format!("early-{i}")).await?;
        assert_eq!(
            claim.status.and_then(|s| s.phase).as_deref(),
            Some("Pending")
        );
    }
    system.agents[0].process.restart().await?;
    let mut names = Vec::new();
    for i in 0..3 {
        names.push(name_of(
            &system.bound_volume(&format!("early-{i}"), BIND).await?,
        ));
    }
    let dirs = volume_dirs(&system.agents[0]).await;
    assert_eq!(dirs.len(), 3, "one directory per claim: {dirs:?}");
    for name in names {
        assert!(
            dirs.iter().any(|d| d.ends_with(&name)),
            "{name} in {dirs:?}"
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn controller_killed_in_a_burst_converges_without_duplicates() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    const CLAIMS: usize = 200;
    let mut creates = Vec::new();
    for i in 0..CLAIMS {
        let claims = system.claims();
        let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim =
            serde_json::from_value(json!({
                "metadata": {"name": format!("burst-{i}"), "namespace": system.names.namespace},
                "spec": {
                    "storageClassName": system.names.class("e2e-delete"),
                    "accessModes": ["ReadWriteMany"],
                    "resources": {"requests": {"storage": "1Gi"}},
                },
            }))?;
        creates.push(tokio::spawn(async move {
            claims
                .create(&kube::api::PostParams::default(), &claim)
                .await
        }));
    }
    for create in creates {
        create.await??;
    }
    // Kill the controller once it is part-way through the burst.
    let volumes = system.volumes();
    nfsprov_e2e::eventually("some PVs to exist", Duration::from_secs(60), || {
        let volumes = volumes.clone();
        async move {
            volumes
                .list(&Default::default())
                .await
                .is_ok_and(|l| l.items.len() >= 20)
        }
    })
    .await?;
    system.controllers[0].kill();
    let made_before_kill = volume_dirs(&system.agents[0]).await.len();
    assert!(
        made_before_kill < CLAIMS,
        "the kill came too late to test anything"
    );
    system.start_controller(&["--leader-elect=false"]).await?;

    let mut names = std::collections::BTreeSet::new();
    for i in 0..CLAIMS {
        names.insert(name_of(
            &system
                .bound_volume(&format!("burst-{i}"), Duration::from_secs(120))
                .await?,
        ));
    }
    assert_eq!(names.len(), CLAIMS);
    let dirs = volume_dirs(&system.agents[0]).await;
    assert_eq!(dirs.len(), CLAIMS, "exactly one directory per claim");
    let listed = system.agents[0]
        .process
        .client()?
        .list_volumes(None)
        .await?;
    assert_eq!(listed.len(), CLAIMS, "the agent knows no orphan");
    for volume in listed {
        let pv = volume.owner.pv_name.unwrap_or_default();
        assert!(
            names.contains(&pv),
            "directory {} belongs to no PV",
            volume.path
        );
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn only_the_leader_acts_and_a_standby_takes_over() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let args = |id: &'static str| {
        [
            "--leader-elect=true",
            // The Lease lives in the credentials' own namespace, as in the Deployment.
            "--lease-duration-seconds=4",
            match id {
                "first" => "--identity=first",
                _ => "--identity=second",
            },
        ]
    };
    let mut system = System::start(&["nfs1"], 0, &[]).await?;
    system.start_controller(&args("first")).await?;
    system.start_controller(&args("second")).await?;
    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    for i in 0..5 {
        system
            .claim(&format!("ha-{i}"), "e2e-delete", json!({}), json!({}))
            .await?;
    }
    for i in 0..5 {
        system.bound_volume(&format!("ha-{i}"), BIND).await?;
    }
    let provisions = |c: &nfsprov_e2e::cluster::ControllerProcess| -> u64 {
        c.metrics()
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("controller_persistentvolumeclaim_provision_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let counts = [
        provisions(&system.controllers[0]),
        provisions(&system.controllers[1]),
    ];
    assert_eq!(counts.iter().sum::<u64>(), 5, "{counts:?}");
    assert!(
        counts.contains(&0),
        "only the leader provisions: {counts:?}"
    );
    let leader = if counts[0] == 5 { 0 } else { 1 };

    system.controllers[leader].kill();
    for i in 5..8 {
        system
            .claim(&format!("ha-{i}"), "e2e-delete", json!({}), json!({}))
            .await?;
    }
    for i in 5..8 {
        system.bound_volume(&format!("ha-{i}"), BIND).await?;
    }
    assert_eq!(volume_dirs(&system.agents[0]).await.len(), 8);
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn api_faults_during_a_burst_converge() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    let Some(admin) = system.api.simulator_url() else {
        nfsprov_test_skip::skip(
            "api_faults_during_a_burst_converge",
            "fault injection needs the simulator",
        );
        return Ok(());
    };
    system
        .class("e2e-delete", json!({"agent": "nfs1", "onDelete": "delete"}))
        .await?;
    // A fifth of the requests fail with 500, and every watch is cut, during the burst.
    nfsprov_e2e::cluster::sim_admin(
        &admin,
        "POST",
        "/_sim/faults",
        r#"{"error_rate":0.2,"error_code":500}"#,
    )?;
    const CLAIMS: usize = 60;
    for i in 0..CLAIMS {
        // The test's own creates retry through the injected errors.
        loop {
            match system
                .claim(&format!("faulty-{i}"), "e2e-delete", json!({}), json!({}))
                .await
            {
                Ok(_) => break,
                Err(e) if e.to_string().contains("409") || e.to_string().contains("already") => {
                    break;
                }
                Err(_) => continue,
            }
        }
        if i % 20 == 10 {
            nfsprov_e2e::cluster::sim_admin(&admin, "POST", "/_sim/drop-watches", "")?;
        }
    }
    nfsprov_e2e::cluster::sim_admin(&admin, "DELETE", "/_sim/faults", "")?;
    for i in 0..CLAIMS {
        system
            .bound_volume(&format!("faulty-{i}"), Duration::from_secs(120))
            .await?;
    }
    assert_eq!(volume_dirs(&system.agents[0]).await.len(), CLAIMS);
    Ok(())
}

/// The agent a PV records and the directory it has on that agent's root.
async fn placed_on(
    system: &System,
    volume: &k8s_openapi::api::core::v1::PersistentVolume,
) -> String {
    let agent = volume
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("nfsprov.dev/agent"))
        .cloned()
        .unwrap_or_default();
    let path = volume
        .spec
        .as_ref()
        .and_then(|s| s.nfs.as_ref())
        .map(|n| n.path.clone())
        .unwrap_or_default();
    let under_test = system
        .agents
        .iter()
        .find(|a| a.process.name() == agent)
        .unwrap_or_else(|| panic!("PV {} records unknown agent {agent:?}", name_of(volume)));
    assert!(path.starts_with(&under_test.export), "{agent}: {path}");
    assert!(
        volume_dirs(under_test)
            .await
            .iter()
            .any(|d| d.ends_with(&name_of(volume))),
        "{agent} has no directory for {}",
        name_of(volume)
    );
    agent
}

/// Restarts the only controller, which reads its agents directory at start.
async fn restart_controller(system: &mut System) -> anyhow::Result<()> {
    for mut controller in system.controllers.drain(..) {
        controller.kill();
    }
    system.start_controller(&["--leader-elect=false"]).await
}

#[tokio::test(flavor = "multi_thread")]
async fn adding_a_second_agent_keeps_classes_without_agent_working() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut system = System::start(&["nfs1", "nfs2"], 0, &[]).await?;
    let nfs1_file = system.agents_dir.join("nfs1.toml");
    let nfs2_file = system.agents_dir.join("nfs2.toml");
    let nfs2_aside = system.agents_dir.join("nfs2.toml.new");

    // An installation with one agent and a class that names none.
    std::fs::rename(&nfs2_file, &nfs2_aside)?;
    system.start_controller(&["--leader-elect=false"]).await?;
    system
        .class("e2e-implicit", json!({"onDelete": "delete"}))
        .await?;
    system
        .claim("before", "e2e-implicit", json!({}), json!({}))
        .await?;
    let before = system.bound_volume("before", BIND).await?;
    assert_eq!(placed_on(&system, &before).await, "nfs1");

    // The second agent's Secret is added without a default: claims of that class fail with
    // the reason, and stay Pending.
    std::fs::rename(&nfs2_aside, &nfs2_file)?;
    restart_controller(&mut system).await?;
    system
        .claim("waiting", "e2e-implicit", json!({}), json!({}))
        .await?;
    system
        .wait_for_event("waiting", "ProvisioningFailed", "with no default")
        .await?;

    // Marking the first agent the default lets them through, on that agent; a class
    // naming both places its volume on one of them.
    let mut settings = std::fs::read_to_string(&nfs1_file)?;
    settings.push_str("default = true\n");
    std::fs::write(&nfs1_file, settings)?;
    restart_controller(&mut system).await?;
    system
        .claim("after", "e2e-implicit", json!({}), json!({}))
        .await?;
    for name in ["waiting", "after"] {
        let volume = system.bound_volume(name, BIND).await?;
        assert_eq!(placed_on(&system, &volume).await, "nfs1", "{name}");
    }
    system
        .class(
            "e2e-both",
            json!({"agents": "nfs1,nfs2", "onDelete": "delete"}),
        )
        .await?;
    system
        .claim("spread", "e2e-both", json!({}), json!({}))
        .await?;
    let spread = system.bound_volume("spread", BIND).await?;
    let agent = placed_on(&system, &spread).await;
    assert!(["nfs1", "nfs2"].contains(&agent.as_str()), "{agent}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_made_on_purpose_is_reported_then_archived() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    // The check runs every second with no grace period, so the claims provisioned below
    // are checked while their directory exists and their PV does not yet: only the
    // API server's answer (their claim is still pending) keeps them.
    let system = System::start(
        &["nfs1"],
        1,
        &[
            "--leader-elect=false",
            "--orphan-check-interval-seconds=1",
            "--orphan-grace-seconds=0",
            "--archive-orphans",
        ],
    )
    .await?;
    system
        .class(
            "e2e-orphans",
            json!({"agent": "nfs1", "onDelete": "delete"}),
        )
        .await?;
    for i in 0..5 {
        system
            .claim(&format!("kept-{i}"), "e2e-orphans", json!({}), json!({}))
            .await?;
    }
    // What an interrupted provisioning leaves: a directory made for a claim that is gone.
    let orphan = nfsprov_api_types::VolumePath::parse("e2e-orphan")?;
    system.agents[0]
        .process
        .client()?
        .create_volume(
            &orphan,
            &nfsprov_api_types::CreateVolumeRequest {
                capacity_bytes: 1 << 20,
                owner: nfsprov_api_types::VolumeOwner {
                    pvc_namespace: Some(system.names.namespace.clone()),
                    pvc_name: Some("gone".into()),
                    pv_name: Some("pvc-00000000-0000-0000-0000-000000000000".into()),
                },
                ..Default::default()
            },
            None,
        )
        .await?;
    let mut kept = Vec::new();
    for i in 0..5 {
        kept.push(name_of(
            &system.bound_volume(&format!("kept-{i}"), BIND).await?,
        ));
    }
    let controller = &system.controllers[0];
    nfsprov_e2e::eventually("the orphan to be archived", BIND, || async {
        controller
            .metrics()
            .unwrap_or_default()
            .lines()
            .any(|l| l == "nfsprov_orphaned_directories_archived_total{agent=\"nfs1\"} 1")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", system.logs()))?;
    let root = &system.agents[0].root;
    assert!(!root.join("e2e-orphan").exists());
    assert_eq!(
        std::fs::read_dir(root.join(".archive/e2e-orphan"))?.count(),
        1,
        "archived, not deleted"
    );
    let dirs = volume_dirs(&system.agents[0]).await;
    assert_eq!(dirs.len(), 5, "{dirs:?}");
    for pv in &kept {
        assert!(dirs.iter().any(|d| d.ends_with(pv)), "{pv} not in {dirs:?}");
    }
    let metrics = controller.metrics()?;
    assert!(
        metrics
            .lines()
            .any(|l| l == "nfsprov_orphaned_directories_archived_total{agent=\"nfs1\"} 1"),
        "nothing else archived: {metrics}"
    );
    Ok(())
}

/// What `kubectl nfsprov adopt` printed as JSON, after checking it exited as expected.
async fn adopt(system: &System, extra: &[&str]) -> anyhow::Result<serde_json::Value> {
    let plugin = nfsprov_e2e::binaries::binary("kubectl-nfsprov")?;
    let replaced = format!("{}-subdir", system.names.provisioner);
    let agents_dir = system.agents_dir.display().to_string();
    let kubeconfig = system.api.kubeconfig().display().to_string();
    let mut args = vec![
        "adopt",
        "--from",
        &replaced,
        "--agent",
        "nfs1",
        "--agents-dir",
        &agents_dir,
        "--provisioner",
        &system.names.provisioner,
        "--kubeconfig",
        &kubeconfig,
        "-o",
        "json",
    ];
    args.extend_from_slice(extra);
    let out = tokio::process::Command::new(plugin)
        .args(&args)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "kubectl nfsprov {args:?}: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_volume_laid_out_by_nfs_subdir_is_adopted_then_archived() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let mut system = System::start(&["nfs1"], 0, &[]).await?;
    let replaced = format!("{}-subdir", system.names.provisioner);
    // nfs-subdir-external-provisioner's class and claim, the claim bound to the PV it made.
    system.legacy_class("e2e-subdir", &replaced).await?;
    let (pv_name, on_disk) = system
        .legacy_volume(&replaced, "e2e-subdir", "legacy", BIND)
        .await?;
    std::fs::write(on_disk.join("data.txt"), b"written before the migration")?;
    let namespace = system.names.namespace.clone();
    let directory = format!("{namespace}-legacy-{pv_name}");

    // The dry run lists it and changes nothing.
    let planned = adopt(&system, &["--dry-run"]).await?;
    assert_eq!(
        planned["volumes"],
        json!([{
            "pv": pv_name, "claim": format!("{namespace}/legacy"), "phase": "Bound",
            "path": directory, "on_delete": "archive", "action": "adopt", "reason": null,
        }]),
        "{planned}"
    );
    let untouched = system.volumes().get(&pv_name).await?;
    assert!(
        !untouched
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key("nfsprov.dev/agent")
    );
    assert!(volume_dirs(&system.agents[0]).await.is_empty());

    let done = adopt(&system, &[]).await?;
    assert_eq!(done["volumes"][0]["action"], "adopted", "{done}");
    let adopted = system.volumes().get(&pv_name).await?;
    let annotations = adopted.metadata.annotations.unwrap_or_default();
    for (key, value) in [
        (
            "pv.kubernetes.io/provisioned-by",
            system.names.provisioner.as_str(),
        ),
        ("nfsprov.dev/agent", "nfs1"),
        ("nfsprov.dev/path", directory.as_str()),
        ("nfsprov.dev/on-delete", "archive"),
    ] {
        assert_eq!(
            annotations.get(key).map(String::as_str),
            Some(value),
            "{key}"
        );
    }
    assert_eq!(
        volume_dirs(&system.agents[0]).await,
        std::slice::from_ref(&directory)
    );
    // A second run finds nothing left to do.
    let again = adopt(&system, &[]).await?;
    assert_eq!(again["volumes"], json!([]), "{again}");

    // From now on this controller handles it: deleting the claim archives the data.
    system
        .start_controller(&[
            "--leader-elect=false",
            &format!("--additional-provisioner-names={replaced}"),
        ])
        .await?;
    system
        .delete_claim_and_wait_for_volume("legacy", &pv_name)
        .await
        .map_err(|e| anyhow::anyhow!("{e}\n{}", system.logs()))?;
    assert!(!on_disk.exists());
    let archive_dir = system.agents[0].root.join(".archive").join(&directory);
    let archived: Vec<_> = std::fs::read_dir(&archive_dir)?.collect::<Result<_, _>>()?;
    assert_eq!(archived.len(), 1, "{archived:?}");
    assert_eq!(
        std::fs::read(archived[0].path().join("data.txt"))?,
        b"written before the migration"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_class_naming_two_agents_places_volumes_on_the_one_with_more_space() -> anyhow::Result<()>
{
    let _turn = ONE_AT_A_TIME.lock().await;
    // nfs1, listed first, on a 256 MiB filesystem; nfs2 on the machine's own disk.
    let small = nfsprov_agent_testkit::LoopBtrfs::new(256, false)?;
    let specs = [
        nfsprov_e2e::system::AgentSpec {
            name: "nfs1".into(),
            root: Some(small.root()),
            settings: String::new(),
        },
        nfsprov_e2e::system::AgentSpec::named("nfs2"),
    ];
    let system = System::start_with_agents(
        nfsprov_e2e::cluster::KubeApi::start().await?,
        &specs,
        1,
        &["--leader-elect=false"],
    )
    .await?;
    system
        .class(
            "e2e-spread",
            json!({"agents": "nfs1,nfs2", "onDelete": "delete"}),
        )
        .await?;
    for i in 0..3 {
        system
            .claim(&format!("spread-{i}"), "e2e-spread", json!({}), json!({}))
            .await?;
    }
    for i in 0..3 {
        let volume = system.bound_volume(&format!("spread-{i}"), BIND).await?;
        assert_eq!(placed_on(&system, &volume).await, "nfs2", "spread-{i}");
    }
    assert!(volume_dirs(&system.agents[0]).await.is_empty());

    // An unknown or repeated name in the list fails the claim with the reason.
    system
        .class("e2e-typo", json!({"agents": "nfs1,nfs9"}))
        .await?;
    system
        .claim("typo", "e2e-typo", json!({}), json!({}))
        .await?;
    system
        .wait_for_event("typo", "ProvisioningFailed", "nfs9")
        .await?;
    system
        .class("e2e-twice", json!({"agents": "nfs2,nfs2"}))
        .await?;
    system
        .claim("twice", "e2e-twice", json!({}), json!({}))
        .await?;
    system
        .wait_for_event("twice", "ProvisioningFailed", "twice")
        .await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread")]
async fn retention_deletes_an_expired_archive_and_nothing_else() -> anyhow::Result<()> {
    let _turn = ONE_AT_A_TIME.lock().await;
    let spec = nfsprov_e2e::system::AgentSpec {
        name: "nfs1".into(),
        root: None,
        settings: "[archive]\nsweep_interval_seconds = 1".into(),
    };
    let mut system = System::start_with_agents(
        nfsprov_e2e::cluster::KubeApi::start().await?,
        &[spec],
        1,
        &["--leader-elect=false"],
    )
    .await?;
    for (class, days) in [("e2e-day", "1"), ("e2e-week", "7")] {
        system
            .class(
                class,
                json!({"agent": "nfs1", "onDelete": "archive", "archiveRetentionDays": days}),
            )
            .await?;
    }
    for (claim, class) in [
        ("short", "e2e-day"),
        ("long", "e2e-week"),
        ("live", "e2e-day"),
    ] {
        system.claim(claim, class, json!({}), json!({})).await?;
    }
    let mut pvs = std::collections::BTreeMap::new();
    for claim in ["short", "long", "live"] {
        let volume = system.bound_volume(claim, BIND).await?;
        pvs.insert(claim, name_of(&volume));
    }
    for claim in ["short", "long"] {
        system
            .delete_claim_and_wait_for_volume(claim, &pvs[claim])
            .await?;
    }
    let client = system.agents[0].process.client()?;
    let archives = client.list_archives(None).await?;
    let retention = |pv: &str| {
        archives
            .iter()
            .find(|a| a.owner.pv_name.as_deref() == Some(pv))
            .map(|a| a.retention_days)
    };
    assert_eq!(retention(&pvs["short"]), Some(Some(1)), "{archives:?}");
    assert_eq!(retention(&pvs["long"]), Some(Some(7)), "{archives:?}");

    // Two days on, the one-day archive goes; the week's archive and the live volume stay.
    system.agents[0]
        .process
        .restart_in_the_future("+2d")
        .await?;
    let client = system.agents[0].process.client()?;
    nfsprov_e2e::eventually("the expired archive to be deleted", BIND, || {
        let client = client.clone();
        let short = pvs["short"].clone();
        async move {
            client.list_archives(None).await.is_ok_and(|archives| {
                !archives
                    .iter()
                    .any(|a| a.owner.pv_name.as_deref() == Some(short.as_str()))
            })
        }
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", system.agents[0].process.log_text()))?;
    let left: Vec<_> = client
        .list_archives(None)
        .await?
        .into_iter()
        .map(|a| a.owner.pv_name.unwrap_or_default())
        .collect();
    assert_eq!(left, [pvs["long"].clone()]);
    let volumes = volume_dirs(&system.agents[0]).await;
    assert_eq!(volumes.len(), 1, "{volumes:?}");
    assert!(volumes[0].ends_with(&pvs["live"]), "{volumes:?}");
    // The sweep counts an expiry just after the archive is gone from the list.
    let agent = &system.agents[0].process;
    nfsprov_e2e::eventually("the expiry to be counted", BIND, || async {
        agent
            .metrics()
            .unwrap_or_default()
            .lines()
            .any(|l| l == "nfsprov_agent_archives_expired_total 1")
    })
    .await
    .map_err(|e| anyhow::anyhow!("{e}\n{}", agent.metrics().unwrap_or_default()))?;
    Ok(())
}

/// A claim of `class` whose data source is the claim `source`, asking for `size`.
async fn clone_claim(
    system: &System,
    name: &str,
    class: &str,
    source: &str,
    size: &str,
) -> anyhow::Result<()> {
    let claim: k8s_openapi::api::core::v1::PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": system.names.namespace},
        "spec": {
            "storageClassName": system.names.class(class),
            "accessModes": ["ReadWriteMany"],
            "resources": {"requests": {"storage": size}},
            "dataSource": {"kind": "PersistentVolumeClaim", "name": source},
        },
    }))?;
    system
        .claims()
        .create(&kube::api::PostParams::default(), &claim)
        .await?;
    Ok(())
}

/// The volume's directory below the export, as an NFS client names it.
fn export_dir(system: &System, volume: &k8s_openapi::api::core::v1::PersistentVolume) -> String {
    let path = &volume.spec.as_ref().unwrap().nfs.as_ref().unwrap().path;
    path.strip_prefix(&system.agents[0].export)
        .unwrap_or(path)
        .to_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_claim_cloned_from_another_holds_the_same_files_over_nfs() -> anyhow::Result<()> {
    let test = "a_claim_cloned_from_another_holds_the_same_files_over_nfs";
    if let Err(why) = nfsprov_e2e::libnfs::available() {
        nfsprov_test_skip::skip(test, &why);
        return Ok(());
    }
    let _turn = ONE_AT_A_TIME.lock().await;
    let system = System::start(&["nfs1"], 1, &["--leader-elect=false"]).await?;
    // The class's mode and owner apply to new volumes, never to a clone's tree.
    system
        .class(
            "e2e-clone",
            json!({"agent": "nfs1", "onDelete": "delete", "mode": "0775", "uid": "1000", "gid": "1000"}),
        )
        .await?;
    system
        .class("e2e-clone-other", json!({"agent": "nfs1"}))
        .await?;
    system
        .claim("source", "e2e-clone", json!({}), json!({}))
        .await?;
    let source = system.bound_volume("source", BIND).await?;
    let source_dir = export_dir(&system, &source);
    let nfs = NfsClient::connect("127.0.0.1", system.nfs.port(), &system.agents[0].export)?;
    write_fixture_tree(&nfs, &source_dir)?;
    nfs.chmod(&format!("{source_dir}/{}", fixture::OWNER_A), 0o604)?;
    let before = snapshot_tree(&nfs, &source_dir)?;
    let source_root = nfs.lstat(&source_dir)?;

    clone_claim(&system, "copy", "e2e-clone", "source", "2Gi").await?;
    let copy = system.bound_volume("copy", BIND).await?;
    let annotations = copy.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("nfsprov.dev/cloned-from"),
        Some(&format!("{}/source", system.names.namespace))
    );
    let method = annotations
        .get("nfsprov.dev/clone-method")
        .cloned()
        .unwrap_or_default();
    assert!(
        method == "copy" || method == "reflink",
        "a plain directory root copies or reflinks: {method}"
    );
    let copy_dir = export_dir(&system, &copy);
    assert_ne!(copy_dir, source_dir);
    assert_eq!(
        snapshot_tree(&nfs, &copy_dir)?,
        before,
        "the same tree over NFS"
    );
    let copy_root = nfs.lstat(&copy_dir)?;
    assert_eq!(
        (copy_root.mode, copy_root.uid, copy_root.gid),
        (source_root.mode, source_root.uid, source_root.gid),
        "the clone's root keeps its source's mode and owner"
    );
    let (size, used) = sparse_usage(&nfs, &copy_dir)?;
    assert!(
        size == fixture::SPARSE_SIZE && used < 8 << 20,
        "the sparse file keeps its holes in the clone: {used} of {size} bytes used"
    );

    // Changes to the clone stay in the clone.
    nfs.write_file(
        &format!("{copy_dir}/{}", fixture::OWNER_A),
        b"changed",
        0o600,
    )?;
    nfs.write_file(&format!("{copy_dir}/only-in-the-copy"), b"new", 0o644)?;
    assert_eq!(
        snapshot_tree(&nfs, &source_dir)?,
        before,
        "the source is unchanged"
    );

    // A clone of another class is refused once, with the rule it broke.
    clone_claim(&system, "wrong-class", "e2e-clone-other", "source", "1Gi").await?;
    system
        .wait_for_event(
            "wrong-class",
            "ProvisioningFailed",
            "a clone must be of its source's class",
        )
        .await?;

    // The source goes; the clone and its data stay.
    system
        .delete_claim_and_wait_for_volume("source", &name_of(&source))
        .await?;
    assert!(
        nfs.lstat(&source_dir).is_err(),
        "the source's data is deleted"
    );
    assert_eq!(
        nfs.read_file(&format!("{copy_dir}/{}", fixture::NESTED))?,
        nfs_read_local(&system, &copy, fixture::NESTED)?,
    );
    assert_eq!(
        nfs.read_file(&format!("{copy_dir}/{}", fixture::OWNER_A))?,
        b"changed"
    );
    let claims = system.claims();
    claims
        .delete("wrong-class", &kube::api::DeleteParams::default())
        .await?;
    system
        .delete_claim_and_wait_for_volume("copy", &name_of(&copy))
        .await?;
    Ok(())
}

/// A file of the volume read on the server, to compare with what NFS serves.
fn nfs_read_local(
    system: &System,
    volume: &k8s_openapi::api::core::v1::PersistentVolume,
    file: &str,
) -> anyhow::Result<Vec<u8>> {
    let dir = export_dir(system, volume);
    Ok(std::fs::read(
        system.agents[0]
            .root
            .join(dir.trim_start_matches('/'))
            .join(file),
    )?)
}
