//! Export changes asked for together reach a real nfs-ganesha in groups: one batched
//! `AddExport` or `UpdateExport` for many exports, the files synced once for the group,
//! and a refusal of one export failing only its own change. What ganesha serves is read
//! from ganesha itself (its D-Bus `ShowExports` and `DisplayExport`), and again after
//! ganesha restarts from the agent's include lists, and after it restarts without them.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use nfsprov_agent::exports::{ExportError, ExportSettings, Exports, VolumeLayout};
use nfsprov_agent_testkit::ganesha::{Ganesha, PrivateBus};
use nfsprov_api_types::{ExportManager, ExportRequest, VolumePath};

/// Enough exports for several include lists (256 ids each) and batches.
const VOLUMES: usize = 600;
/// The volume whose directory is missing: ganesha refuses to serve it.
const MISSING: usize = 333;
/// Changes in flight at once, as the controller sends them.
const IN_FLIGHT: usize = 32;

fn volume(i: usize) -> VolumePath {
    VolumePath::parse(&format!("team/v{i:04}")).unwrap()
}

fn request(clients: &[&str]) -> ExportRequest {
    ExportRequest {
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        ..ExportRequest::default()
    }
}

fn installed(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// `set` of every volume in `0..VOLUMES` to `request`, `IN_FLIGHT` at a time.
async fn set_all(exports: &Arc<Exports>, request: &ExportRequest) -> Vec<Result<(), ExportError>> {
    let mut results: Vec<Option<Result<(), ExportError>>> = (0..VOLUMES).map(|_| None).collect();
    let (sender, receiver) = std::sync::mpsc::channel();
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let workers: Vec<_> = (0..IN_FLIGHT)
        .map(|_| {
            let (exports, request, next, sender) = (
                exports.clone(),
                request.clone(),
                next.clone(),
                sender.clone(),
            );
            tokio::task::spawn_blocking(move || {
                loop {
                    let i = next.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    if i >= VOLUMES {
                        return;
                    }
                    let result = exports.set(&volume(i), &request).map(drop);
                    sender.send((i, result)).unwrap();
                }
            })
        })
        .collect();
    drop(sender);
    for worker in workers {
        worker.await.unwrap();
    }
    for (i, result) in receiver {
        results[i] = Some(result);
    }
    results.into_iter().map(Option::unwrap).collect()
}

fn open(settings: &ExportSettings, root: &Path) -> Arc<Exports> {
    let mount_root = root.display().to_string();
    let (exports, _) = Exports::open(
        settings,
        root,
        &mount_root,
        VolumeLayout::SharedFilesystem,
        |_| true,
    )
    .unwrap();
    Arc::new(exports)
}

/// A real ganesha on a private bus, the volumes' directories and the agent's settings.
struct Setup {
    root: std::path::PathBuf,
    config_dir: std::path::PathBuf,
    settings: ExportSettings,
    ganesha: Ganesha,
    bus: PrivateBus,
    _base: tempfile::TempDir,
}

/// [`Setup`] with the directory of every volume but `missing`; `None`, `test` skipped by
/// name, without ganesha here.
async fn setup(test: &str, missing: Option<usize>) -> Option<Setup> {
    if let Some(tool) = ["ganesha.nfsd", "dbus-daemon", "dbus-send"]
        .into_iter()
        .find(|tool| !installed(tool))
    {
        nfsprov_test_skip::skip(test, &format!("{tool} is not installed"));
        return None;
    }
    let base = tempfile::tempdir().unwrap();
    let root = base.path().join("exports");
    let config_dir = base.path().join("ganesha.d");
    for i in (0..VOLUMES).filter(|i| Some(*i) != missing) {
        std::fs::create_dir_all(root.join(volume(i).as_str())).unwrap();
    }
    let bus = PrivateBus::start().await.unwrap();
    let ganesha = Ganesha::start(&bus, &config_dir).await.unwrap();
    let settings = ExportSettings {
        manager: ExportManager::Ganesha,
        ganesha_config_dir: config_dir.clone(),
        ganesha_dbus_address: Some(bus.address().to_owned()),
        ..ExportSettings::default()
    };
    Some(Setup {
        root,
        config_dir,
        settings,
        ganesha,
        bus,
        _base: base,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn changes_sent_together_reach_ganesha_in_groups_and_a_refusal_fails_only_its_own() {
    const TEST: &str =
        "changes_sent_together_reach_ganesha_in_groups_and_a_refusal_fails_only_its_own";
    let Some(Setup {
        root,
        config_dir,
        settings,
        mut ganesha,
        bus: _bus,
        _base,
    }) = setup(TEST, Some(MISSING)).await
    else {
        return;
    };
    let exports = open(&settings, &root);

    // Made together: only the volume without a directory is refused, by ganesha.
    let results = set_all(&exports, &request(&["127.0.0.2"])).await;
    for (i, result) in results.iter().enumerate() {
        match (i, result) {
            (MISSING, Err(ExportError::Server(_))) => {}
            (MISSING, other) => panic!("the missing directory's export: {other:?}"),
            (_, Err(error)) => panic!("{}: {error}", volume(i)),
            (_, Ok(())) => {}
        }
    }
    assert_eq!(exports.len(), VOLUMES - 1);
    let ids = |exports: &Exports| -> Vec<u16> {
        let by_pseudo = export_ids(&config_dir);
        let mut ids: Vec<u16> = (0..VOLUMES)
            .filter_map(|i| exports.get(&volume(i)))
            .map(|export| by_pseudo[&export.path])
            .collect();
        ids.sort_unstable();
        ids
    };
    let published = ids(&exports);
    let served = |ganesha: &Ganesha| -> Vec<u16> {
        // Without the pseudo-filesystem's root (id 0).
        ganesha
            .export_ids()
            .unwrap()
            .into_iter()
            .filter(|id| *id != 0)
            .collect()
    };
    assert_eq!(served(&ganesha), published);

    // The include lists: the top one names lists, none longer than a bucket of ids.
    let top = std::fs::read_to_string(config_dir.join("exports.conf")).unwrap();
    let lists: Vec<&str> = top.lines().filter(|l| l.starts_with("%include")).collect();
    assert!(lists.len() >= 2, "{top}");
    for list in &lists {
        let name = list.split('"').nth(1).unwrap();
        let text = std::fs::read_to_string(name).unwrap();
        let lines = text.lines().filter(|l| l.starts_with("%include")).count();
        assert!((1..=256).contains(&lines), "{name}: {lines} exports");
    }

    // A node joins: every export admits it, as ganesha itself shows.
    let results = set_all(&exports, &request(&["127.0.0.2", "127.0.0.3"])).await;
    for (i, result) in results.iter().enumerate() {
        assert_eq!(result.is_err(), i == MISSING, "{}: {result:?}", volume(i));
    }
    for &id in &published {
        assert_eq!(
            ganesha.clients(id).unwrap(),
            ["127.0.0.2/32", "127.0.0.3/32"],
            "export {id}"
        );
    }

    // ganesha restarted reads every export back from the agent's lists.
    ganesha.restart().await.unwrap();
    assert_eq!(served(&ganesha), published);
    for &id in published.iter().step_by(97) {
        assert_eq!(
            ganesha.clients(id).unwrap(),
            ["127.0.0.2/32", "127.0.0.3/32"],
            "export {id} after ganesha's restart"
        );
    }

    // ganesha restarted without them: the agent's start serves them all again.
    drop(exports);
    let lists_dir = config_dir.clone();
    ganesha
        .restart_after(|| {
            std::fs::write(lists_dir.join("exports.conf"), "")?;
            Ok(())
        })
        .await
        .unwrap();
    assert!(served(&ganesha).is_empty());
    let exports = open(&settings, &root);
    assert_eq!(served(&ganesha), published);
    assert_eq!(ids(&exports), published);
}

/// The export id of each block of the agent's files, by its `Pseudo` path.
fn export_ids(config_dir: &Path) -> std::collections::HashMap<String, u16> {
    let mut ids = std::collections::HashMap::new();
    for entry in std::fs::read_dir(config_dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let Some(id) = name
            .strip_prefix("export-")
            .and_then(|rest| rest.strip_suffix(".conf"))
        else {
            continue;
        };
        let text = std::fs::read_to_string(&path).unwrap();
        let pseudo = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("Pseudo = \""))
            .and_then(|rest| rest.strip_suffix("\";"))
            .unwrap();
        ids.insert(pseudo.to_owned(), id.parse().unwrap());
    }
    ids
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_ganesha_that_reads_no_export_at_start_is_served_all_again_when_it_is_back_on_the_bus() {
    const TEST: &str =
        "a_ganesha_that_reads_no_export_at_start_is_served_all_again_when_it_is_back_on_the_bus";
    let Some(Setup {
        root,
        config_dir,
        settings,
        mut ganesha,
        bus: _bus,
        _base,
    }) = setup(TEST, None).await
    else {
        return;
    };
    let settings = ExportSettings {
        ganesha_reads_exports_at_start: false,
        // No pass of its own within the test: only ganesha's return can start one.
        reconcile_interval: std::time::Duration::from_secs(3600),
        ..settings
    };
    let exports = open(&settings, &root);
    let passes =
        nfsprov_agent::exports::Reconciler::new(exports.clone(), settings.reconcile_interval)
            .spawn(|_| {});
    let results = set_all(&exports, &request(&["127.0.0.2"])).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let served = |ganesha: &Ganesha| ganesha.export_ids().unwrap().len();
    assert_eq!(served(&ganesha), VOLUMES + 1, "with the pseudo root");
    let top = std::fs::read_to_string(config_dir.join("exports.conf")).unwrap();
    assert!(
        !top.contains("%include"),
        "ganesha's start reads none: {top}"
    );

    ganesha.restart().await.unwrap();
    // The first pass after ganesha took its name serves everything again.
    nfsprov_agent_testkit::eventually(
        "ganesha to serve every export again",
        std::time::Duration::from_secs(60),
        || {
            let count = ganesha.export_ids().map(|ids| ids.len()).unwrap_or(0);
            async move { count == VOLUMES + 1 }
        },
    )
    .await
    .unwrap();
    passes.abort();
}
