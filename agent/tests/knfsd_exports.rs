//! The knfsd export manager. This machine has no kernel NFS server and no `exportfs`, so
//! these tests run it against a recording `exportfs` stand-in (a shell script that logs
//! its command line), checking the command lines and the persisted exports files, one
//! per exported volume.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

use nfsprov_agent::exports::{ExportSettings, Exports};
use nfsprov_agent::exports::{Knfsd, VolumeLayout};
use nfsprov_api_types::{ExportManager, ExportRequest, Squash, VolumePath};

struct StandIn {
    dir: tempfile::TempDir,
    root: PathBuf,
    log: PathBuf,
    settings: ExportSettings,
}

impl StandIn {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("export");
        std::fs::create_dir(&root).unwrap();
        let log = dir.path().join("exportfs.log");
        let script = dir.path().join("recording-exportfs");
        // Logs its arguments one call a line; refuses a client named 192.0.2.99, as
        // exportfs refuses what it cannot export.
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$*\" >> '{}'\ncase \"$*\" in *192.0.2.99:*) echo refused >&2; exit 1;; esac\n",
                log.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        let exports_dir = dir.path().join("exports.d");
        std::fs::create_dir(&exports_dir).unwrap();
        let settings = ExportSettings {
            manager: ExportManager::Knfsd,
            knfsd_exports_file: exports_dir.join("nfsprov.exports"),
            knfsd_exports_dir: exports_dir,
            knfsd_exportfs: script,
            // The export root is a temporary directory of the machine's filesystem.
            allow_shared_filesystem: true,
            // Its volumes are directories of that filesystem.
            mount_control_only: true,
            ..ExportSettings::default()
        };
        Self {
            dir,
            root,
            log,
            settings,
        }
    }

    /// The table over volumes that are directories of the export root's filesystem.
    fn open(&self) -> Exports {
        self.open_over(VolumeLayout::SharedFilesystem)
    }

    fn open_over(&self, layout: VolumeLayout) -> Exports {
        let root = self.root.display().to_string();
        Exports::open(&self.settings, &self.root, &root, layout, |_| true)
            .unwrap()
            .0
    }

    /// The calls logged since the last look.
    fn calls(&self) -> Vec<String> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let _ = std::fs::remove_file(&self.log);
        text.lines().map(str::to_owned).collect()
    }

    /// What `exportfs -a` reads at boot: every `*.exports` file of the directory whose
    /// name does not start with a dot, in order of their names.
    fn file(&self) -> String {
        self.files()
            .into_iter()
            .filter(|(name, _)| name.ends_with(".exports") && !name.starts_with('.'))
            .map(|(_, text)| text)
            .collect()
    }

    /// Every file of the exports directory, by name.
    fn files(&self) -> BTreeMap<String, String> {
        std::fs::read_dir(&self.settings.knfsd_exports_dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                (name, std::fs::read_to_string(entry.path()).unwrap())
            })
            .collect()
    }

    /// The file of `volume`.
    fn file_of(&self, volume: &str) -> PathBuf {
        let volume = VolumePath::parse(volume).unwrap();
        self.settings
            .knfsd_exports_dir
            .join(Knfsd::file_name(&volume))
    }

    fn path(&self, volume: &str) -> String {
        self.root.join(volume).display().to_string()
    }
}

fn request(clients: &[&str]) -> ExportRequest {
    ExportRequest {
        clients: clients.iter().map(|c| c.parse().unwrap()).collect(),
        squash: Squash::Root,
        anon_uid: Some(4321),
        anon_gid: Some(4321),
        ..ExportRequest::default()
    }
}

/// The agent's `nfsprov_agent_export_root_shared_filesystem`, as `/metrics` shows it.
fn shared_filesystem_gauge(agent: &nfsprov_agent_testkit::TestAgent) -> String {
    let metrics = common::call(agent, "GET", "/metrics", None).body;
    metrics
        .lines()
        .find_map(|line| line.strip_prefix("nfsprov_agent_export_root_shared_filesystem "))
        .unwrap_or_else(|| panic!("no shared-filesystem gauge in:\n{metrics}"))
        .to_owned()
}

/// A create of a 1 MiB volume with `export`.
fn exported_create(export: ExportRequest) -> nfsprov_api_types::CreateVolumeRequest {
    nfsprov_api_types::CreateVolumeRequest {
        capacity_bytes: 1 << 20,
        export: Some(export),
        ..Default::default()
    }
}

/// The options of a volume that is a directory of a shared filesystem (the stand-in's
/// export root is one): subtree checking confines handles to the export.
const OPTIONS: &str = "rw,root_squash,anonuid=4321,anongid=4321,sec=sys,sync,subtree_check,secure";

#[test]
fn knfsd_recording_exportfs_stand_in_sees_one_call_per_client_change_and_the_file_the_set() {
    let stand_in = StandIn::new();
    let exports = stand_in.open();
    assert_eq!(exports.kind(), ExportManager::Knfsd);
    assert!(stand_in.calls().is_empty(), "nothing to restore");
    let volume = VolumePath::parse("ns/a").unwrap();
    let path = stand_in.path("ns/a");

    let export = exports
        .set(&volume, &request(&["10.0.0.0/8", "127.0.0.2"]))
        .unwrap();
    assert_eq!(export.path, format!("{}/ns/a", stand_in.root.display()));
    assert_eq!(
        stand_in.calls(),
        vec![
            format!("-o {OPTIONS} 127.0.0.2:{path}"),
            format!("-o {OPTIONS} 10.0.0.0/8:{path}"),
        ]
    );
    let line = format!("\"{path}\" 127.0.0.2({OPTIONS}) 10.0.0.0/8({OPTIONS})");
    assert!(
        stand_in.file().lines().any(|l| l == line),
        "{}",
        stand_in.file()
    );

    // The same set in another order: nothing to do.
    exports
        .set(&volume, &request(&["127.0.0.2", "10.0.0.0/8"]))
        .unwrap();
    assert!(stand_in.calls().is_empty());

    // Moved to another client: the new one exported, the old ones unexported.
    exports.set(&volume, &request(&["127.0.0.3"])).unwrap();
    assert_eq!(
        stand_in.calls(),
        vec![
            format!("-o {OPTIONS} 127.0.0.3:{path}"),
            format!("-u 127.0.0.2:{path}"),
            format!("-u 10.0.0.0/8:{path}"),
        ]
    );
    let text = stand_in.file();
    assert!(
        text.contains(&format!("\"{path}\" 127.0.0.3({OPTIONS})\n")),
        "{text}"
    );
    assert!(!text.contains("127.0.0.2("), "{text}");

    // A second volume, everyone, read-only, nobody squashed.
    let other = VolumePath::parse("ns/b").unwrap();
    let everyone = ExportRequest {
        clients: vec!["*".parse().unwrap()],
        access: nfsprov_api_types::ExportAccess::ReadOnly,
        squash: Squash::None,
        ..ExportRequest::default()
    };
    exports.set(&other, &everyone).unwrap();
    let b = stand_in.path("ns/b");
    let ro = "ro,no_root_squash,sec=sys,sync,subtree_check,secure";
    assert_eq!(stand_in.calls(), vec![format!("-o {ro} *:{b}")]);
    // Each volume in a file of its own, holding its record and its line only.
    let a_file = std::fs::read_to_string(stand_in.file_of("ns/a")).unwrap();
    let b_file = std::fs::read_to_string(stand_in.file_of("ns/b")).unwrap();
    assert!(
        a_file.contains(&format!("\"{path}\" 127.0.0.3(")),
        "{a_file}"
    );
    assert!(
        !a_file.contains(&b) && !b_file.contains(&path),
        "{a_file}{b_file}"
    );
    assert_eq!(stand_in.files().len(), 2, "{:?}", stand_in.files());

    // A restart restores exactly the recorded set from the files, with the same calls.
    drop(exports);
    let exports = stand_in.open();
    let mut restored = stand_in.calls();
    restored.sort();
    let mut expected = vec![
        format!("-o {OPTIONS} 127.0.0.3:{path}"),
        format!("-o {ro} *:{b}"),
    ];
    expected.sort();
    assert_eq!(restored, expected);
    assert_eq!(
        exports.get(&volume).unwrap().clients,
        vec!["127.0.0.3".parse().unwrap()]
    );

    // Removed: unexported, and gone from the file.
    exports.remove(&volume).unwrap();
    assert_eq!(stand_in.calls(), vec![format!("-u 127.0.0.3:{path}")]);
    assert!(!stand_in.file().contains(&path), "{}", stand_in.file());
    assert!(!stand_in.file_of("ns/a").exists());
    assert!(stand_in.file().contains(&b));
    assert_eq!(exports.get(&volume), None);

    // Never the whole table reread.
    let log = std::fs::read_to_string(stand_in.dir.path().join("exportfs.log")).unwrap_or_default();
    assert!(!log.contains("-r") && !log.contains("-a"), "{log}");
}

/// An export withheld while its volume grows offline: unexported from the kernel for
/// each client, kept in the file (a reboot serves it again), then exported again as it was.
#[test]
fn knfsd_recording_exportfs_stand_in_withholds_an_export_and_serves_it_again_as_it_was() {
    let stand_in = StandIn::new();
    let exports = stand_in.open();
    let volume = VolumePath::parse("ns/a").unwrap();
    let path = stand_in.path("ns/a");
    let export = exports
        .set(&volume, &request(&["10.0.0.0/8", "127.0.0.2"]))
        .unwrap();
    let _ = stand_in.calls();
    let file = stand_in.file();

    assert!(exports.withhold(&volume).unwrap());
    let mut calls = stand_in.calls();
    calls.sort();
    assert_eq!(
        calls,
        vec![
            format!("-u 10.0.0.0/8:{path}"),
            format!("-u 127.0.0.2:{path}")
        ]
    );
    assert_eq!(stand_in.file(), file, "still recorded");
    assert_eq!(exports.get(&volume), Some(export.clone()), "still reported");

    exports.serve_withheld(&volume).unwrap();
    let mut calls = stand_in.calls();
    calls.sort();
    assert_eq!(
        calls,
        vec![
            format!("-o {OPTIONS} 10.0.0.0/8:{path}"),
            format!("-o {OPTIONS} 127.0.0.2:{path}"),
        ]
    );
    assert_eq!(stand_in.file(), file);
    assert_eq!(exports.get(&volume), Some(export));
    // Served already: nothing more to do.
    exports.serve_withheld(&volume).unwrap();
    assert!(stand_in.calls().is_empty());
}

#[test]
fn knfsd_recording_exportfs_stand_in_refusing_leaves_the_export_as_it_was() {
    let stand_in = StandIn::new();
    let exports = stand_in.open();
    let volume = VolumePath::parse("ns/a").unwrap();
    exports.set(&volume, &request(&["127.0.0.2"])).unwrap();
    stand_in.calls();
    let error = exports
        .set(&volume, &request(&["192.0.2.99"]))
        .unwrap_err()
        .to_string();
    assert!(error.contains("refused"), "{error}");
    assert_eq!(
        exports.get(&volume).unwrap().clients,
        vec!["127.0.0.2".parse().unwrap()],
        "the table keeps what is served"
    );
    let path = stand_in.path("ns/a");
    let text = stand_in.file();
    assert!(
        text.contains(&format!("\"{path}\" 127.0.0.2({OPTIONS})\n")),
        "{text}"
    );
    assert!(!text.contains("192.0.2.99("), "{text}");
    assert_eq!(
        stand_in.calls(),
        vec![
            format!("-o {OPTIONS} 192.0.2.99:{path}"),
            format!("-u 192.0.2.99:{path}"),
            format!("-o {OPTIONS} 127.0.0.2:{path}"),
        ]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn knfsd_recording_exportfs_stand_in_follows_every_volume_change_over_the_api() {
    use nfsprov_agent_testkit::TestAgent;
    use nfsprov_api_types::client::{ClientError, CloneOutcome};
    use nfsprov_api_types::{
        AdoptVolumeRequest, CloneVolumeRequest, CreateVolumeRequest, ErrorCode,
    };

    let stand_in = StandIn::new();
    let agent = TestAgent::start_with_exports(&stand_in.root, stand_in.settings.clone())
        .await
        .unwrap();
    let client = agent.client();
    let info = client.info(None).await.unwrap();
    assert_eq!(info.capabilities.exports, ExportManager::Knfsd);
    let create = |clients: &[&str]| exported_create(request(clients));

    let a = VolumePath::parse("ns/a").unwrap();
    let refused = client
        .create_volume(&a, &CreateVolumeRequest::default(), None)
        .await;
    assert!(
        matches!(&refused, Err(ClientError::Api { error, .. }) if error.code == ErrorCode::InvalidBody),
        "{refused:?}"
    );
    let made = client
        .create_volume(&a, &create(&["127.0.0.2"]), None)
        .await
        .unwrap();
    let export = made.volume.export.unwrap();
    assert_eq!(export.path, format!("{}/ns/a", stand_in.root.display()));
    let pa = stand_in.path("ns/a");
    assert_eq!(
        stand_in.calls(),
        vec![format!("-o {OPTIONS} 127.0.0.2:{pa}")]
    );

    // The same request again: the volume is found, the export left alone.
    let again = client
        .create_volume(&a, &create(&["127.0.0.2"]), None)
        .await
        .unwrap();
    assert!(!again.created);
    assert!(stand_in.calls().is_empty());
    client
        .set_volume_export(&a, &request(&["127.0.0.2"]), None)
        .await
        .unwrap();
    assert!(stand_in.calls().is_empty());

    // A clone gets its own export once it is made.
    let b = VolumePath::parse("ns/b").unwrap();
    let clone = CloneVolumeRequest {
        source: a.clone(),
        capacity_bytes: 1 << 20,
        owner: Default::default(),
        quota: Default::default(),
        export: Some(request(&["127.0.0.3"])),
    };
    let cloned = loop {
        match client.clone_volume(&b, &clone, None).await.unwrap() {
            CloneOutcome::Ready(outcome) => break outcome.volume,
            CloneOutcome::InProgress(_) => {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await
            }
        }
    };
    assert_eq!(
        cloned.export.unwrap().clients,
        vec!["127.0.0.3".parse().unwrap()]
    );
    let pb = stand_in.path("ns/b");
    assert_eq!(
        stand_in.calls(),
        vec![format!("-o {OPTIONS} 127.0.0.3:{pb}")]
    );

    // An adopted directory is exported as asked.
    let c = VolumePath::parse("ns/c").unwrap();
    std::fs::create_dir_all(stand_in.root.join("ns/c")).unwrap();
    let adopt = AdoptVolumeRequest {
        capacity_bytes: 1 << 20,
        owner: Default::default(),
        export: Some(request(&["10.0.0.0/8"])),
    };
    client.adopt_volume(&c, &adopt, None).await.unwrap();
    let pc = stand_in.path("ns/c");
    assert_eq!(
        stand_in.calls(),
        vec![format!("-o {OPTIONS} 10.0.0.0/8:{pc}")]
    );

    // Reported by GET, the list and a resize.
    let got = client.get_volume(&c, None).await.unwrap().unwrap();
    assert!(got.export.is_some());
    let listed = client.list_volumes(None).await.unwrap();
    assert_eq!(listed.iter().filter(|v| v.export.is_some()).count(), 3);
    let resized = client.resize_volume(&c, 2 << 20, None).await.unwrap();
    assert!(resized.export.is_some());

    // Archived and deleted volumes are unexported first, and gone from the file.
    client.archive_volume(&a, None, None).await.unwrap();
    assert_eq!(stand_in.calls(), vec![format!("-u 127.0.0.2:{pa}")]);
    client.delete_volume(&b, None).await.unwrap();
    assert_eq!(stand_in.calls(), vec![format!("-u 127.0.0.3:{pb}")]);
    let text = stand_in.file();
    assert!(!text.contains(&pa) && !text.contains(&pb), "{text}");
    assert!(text.contains(&pc), "{text}");
    agent.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn knfsd_recording_exportfs_stand_in_never_sees_an_export_the_policy_or_the_server_would_misread()
 {
    use nfsprov_agent_testkit::TestAgent;
    use nfsprov_api_types::client::ClientError;
    use nfsprov_api_types::{CloneVolumeRequest, ErrorCode};

    let stand_in = StandIn::new();
    let agent = TestAgent::start_with_exports(&stand_in.root, stand_in.settings.clone())
        .await
        .unwrap();
    let client = agent.client();
    let a = VolumePath::parse("ns/a").unwrap();
    client
        .create_volume(&a, &exported_create(request(&["127.0.0.2"])), None)
        .await
        .unwrap();
    assert_eq!(stand_in.calls().len(), 1);

    let wildcard = request(&["127.0.0.2", "0.0.0.0"]);
    let root_anon = ExportRequest {
        squash: Squash::All,
        anon_uid: Some(0),
        ..request(&["127.0.0.2"])
    };
    for (export, code, needle) in [
        (&wildcard, ErrorCode::InvalidBody, "unspecified address"),
        (
            &ExportRequest {
                clients: vec!["::/0".parse().unwrap()],
                ..request(&[])
            },
            ErrorCode::InvalidBody,
            "write `*`",
        ),
        (&root_anon, ErrorCode::Forbidden, "policy.allow_root_anon"),
    ] {
        let expect = |what: &str, answer: Result<(), ClientError>| match answer {
            Err(ClientError::Api { error, .. }) => {
                assert_eq!(error.code, code, "{what}: {error:?}");
                assert!(error.message.contains(needle), "{what}: {error:?}");
            }
            other => panic!("{what} was not refused: {other:?}"),
        };
        let b = VolumePath::parse("ns/b").unwrap();
        let create = exported_create(export.clone());
        expect(
            "create",
            client.create_volume(&b, &create, None).await.map(drop),
        );
        let clone = CloneVolumeRequest {
            source: a.clone(),
            capacity_bytes: 1 << 20,
            owner: Default::default(),
            quota: Default::default(),
            export: Some(export.clone()),
        };
        expect(
            "clone",
            client.clone_volume(&b, &clone, None).await.map(drop),
        );
        expect(
            "export change",
            client.set_volume_export(&a, export, None).await.map(drop),
        );
        // Refused before anything was made or exported.
        assert_eq!(client.get_volume(&b, None).await.unwrap(), None);
        assert_eq!(stand_in.calls(), Vec::<String>::new());
    }
    let kept = client.get_volume(&a, None).await.unwrap().unwrap();
    assert_eq!(
        kept.export.unwrap().clients,
        vec!["127.0.0.2".parse().unwrap()]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn knfsd_recording_exportfs_stand_in_gets_no_new_export_on_a_shared_filesystem_unless_accepted()
 {
    use nfsprov_agent_testkit::TestAgent;
    use nfsprov_api_types::ErrorCode;
    use nfsprov_api_types::client::ClientError;

    let create = exported_create(request(&["127.0.0.2"]));
    let a = VolumePath::parse("ns/a").unwrap();

    // A temporary directory is a directory of the machine's own filesystem.
    let stand_in = StandIn::new();
    let strict = ExportSettings {
        allow_shared_filesystem: false,
        ..stand_in.settings.clone()
    };
    let agent = TestAgent::start_with_exports(&stand_in.root, strict)
        .await
        .unwrap();
    let client = agent.client();
    let info = client.info(None).await.unwrap();
    let filesystem = info.export_root_filesystem.unwrap();
    assert!(!filesystem.accepted);
    let why = filesystem.shared.unwrap();
    assert!(why.contains(&filesystem.mount_point), "{why}");
    assert_eq!(shared_filesystem_gauge(&agent), "1");
    let refused = client.create_volume(&a, &create, None).await;
    match refused {
        Err(ClientError::Api { error, .. }) => {
            assert_eq!(error.code, ErrorCode::Unsupported, "{error:?}");
            assert!(
                error.message.contains("exports.allow_shared_filesystem"),
                "{error:?}"
            );
        }
        other => panic!("a new export on a shared filesystem was not refused: {other:?}"),
    }
    assert_eq!(client.get_volume(&a, None).await.unwrap(), None);
    assert_eq!(stand_in.calls(), Vec::<String>::new());
    drop(agent);

    // Accepted by name: served, and still reported.
    let agent = TestAgent::start_with_exports(&stand_in.root, stand_in.settings.clone())
        .await
        .unwrap();
    let client = agent.client();
    assert!(
        client
            .create_volume(&a, &create, None)
            .await
            .unwrap()
            .created
    );
    let filesystem = client
        .info(None)
        .await
        .unwrap()
        .export_root_filesystem
        .unwrap();
    assert!(
        filesystem.shared.is_some() && filesystem.accepted,
        "{filesystem:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn knfsd_recording_exportfs_stand_in_on_a_filesystem_of_its_own_needs_no_acceptance() {
    use nfsprov_agent_testkit::{LoopExt4, TestAgent};

    const TEST: &str =
        "knfsd_recording_exportfs_stand_in_on_a_filesystem_of_its_own_needs_no_acceptance";
    if !rustix::process::geteuid().is_root() {
        nfsprov_test_skip::skip(TEST, "needs root to loop-mount a filesystem");
        return;
    }
    let fs = LoopExt4::new(64).unwrap();
    let stand_in = StandIn::new();
    let a = VolumePath::parse("ns/a").unwrap();
    // Its volumes are directories of that one filesystem: an export would control
    // mounts by name only, which the operator must accept by name.
    let unaccepted = ExportSettings {
        allow_shared_filesystem: false,
        mount_control_only: false,
        ..stand_in.settings.clone()
    };
    let agent = TestAgent::start_with_exports(fs.mount_point(), unaccepted)
        .await
        .unwrap();
    match agent
        .client()
        .create_volume(&a, &exported_create(request(&["127.0.0.2"])), None)
        .await
    {
        Err(nfsprov_api_types::client::ClientError::Api { error, .. }) => {
            assert_eq!(error.code, nfsprov_api_types::ErrorCode::Unsupported);
            assert!(
                error.message.contains("exports.mount_control_only")
                    && error.message.contains("quota backend image"),
                "{error:?}"
            );
        }
        other => panic!("an export controlling mounts only was not refused: {other:?}"),
    }
    assert_eq!(agent.client().get_volume(&a, None).await.unwrap(), None);
    assert_eq!(stand_in.calls(), Vec::<String>::new());
    drop(agent);

    let settings = ExportSettings {
        allow_shared_filesystem: false,
        ..stand_in.settings.clone()
    };
    let agent = TestAgent::start_with_exports(fs.mount_point(), settings)
        .await
        .unwrap();
    let client = agent.client();
    let filesystem = client
        .info(None)
        .await
        .unwrap()
        .export_root_filesystem
        .unwrap();
    assert_eq!(filesystem.shared, None);
    assert_eq!(
        filesystem.mount_point,
        fs.mount_point().display().to_string()
    );
    assert_eq!(shared_filesystem_gauge(&agent), "0");
    let made = client
        .create_volume(&a, &exported_create(request(&["127.0.0.2"])), None)
        .await
        .unwrap();
    assert!(made.created);
    assert_eq!(stand_in.calls().len(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn knfsd_recording_exportfs_stand_in_exports_image_volumes_without_any_acceptance() {
    use nfsprov_agent::quota::QuotaSettings;
    use nfsprov_agent_testkit::{LoopXfs, TestAgent};
    use nfsprov_api_types::QuotaBackend;

    const TEST: &str =
        "knfsd_recording_exportfs_stand_in_exports_image_volumes_without_any_acceptance";
    if !rustix::process::geteuid().is_root() {
        nfsprov_test_skip::skip(TEST, "needs root to loop-mount filesystems");
        return;
    }
    // A directory of a filesystem that holds more, as a test's export root is: each
    // volume a filesystem of its own, so nothing else on it is in an export's reach.
    let fs = LoopXfs::new(1024, true).unwrap();
    let stand_in = StandIn::new();
    let settings = ExportSettings {
        allow_shared_filesystem: false,
        mount_control_only: false,
        ..stand_in.settings.clone()
    };
    let quota = QuotaSettings {
        backend: QuotaBackend::Image,
        ..QuotaSettings::default()
    };
    let agent = TestAgent::start_with_quota_and_exports(&fs.root(), quota, settings)
        .await
        .unwrap();
    let client = agent.client();
    let a = VolumePath::parse("ns/a").unwrap();
    let made = client
        .create_volume(&a, &exported_create(request(&["127.0.0.2"])), None)
        .await
        .unwrap();
    assert!(made.created);
    assert_eq!(stand_in.calls().len(), 1);
    client.delete_volume(&a, None).await.unwrap();
}

#[test]
fn knfsd_recording_exportfs_stand_in_gives_a_volume_of_its_own_filesystem_a_lasting_fsid() {
    let stand_in = StandIn::new();
    let exports = stand_in.open_over(VolumeLayout::OwnFilesystem);
    let volume = VolumePath::parse("ns/a").unwrap();
    let path = stand_in.path("ns/a");
    let asked = ExportRequest {
        // knfsd serves the real path: the ask changes nothing.
        opaque_path: true,
        ..request(&["127.0.0.2"])
    };
    let export = exports.set(&volume, &asked).unwrap();
    assert_eq!(export.path, path, "clients mount the real path");
    let calls = stand_in.calls();
    let [call] = calls.as_slice() else {
        panic!("one call: {calls:?}")
    };
    let options = call
        .strip_prefix("-o ")
        .and_then(|rest| rest.strip_suffix(&format!(" 127.0.0.2:{path}")))
        .unwrap_or_else(|| panic!("{call}"));
    let fsid = options
        .strip_prefix(
            "rw,root_squash,anonuid=4321,anongid=4321,sec=sys,sync,no_subtree_check,fsid=",
        )
        .and_then(|rest| rest.strip_suffix(",secure"))
        .unwrap_or_else(|| panic!("{options}"));
    assert_eq!(fsid.len(), 36, "a UUID: {fsid}");
    assert!(
        stand_in.file().contains(&format!("127.0.0.2({options})")),
        "{}",
        stand_in.file()
    );

    // Another client, and a restart: the same fsid, so handles clients hold stay good.
    exports.set(&volume, &request(&["127.0.0.3"])).unwrap();
    assert_eq!(
        stand_in.calls()[0],
        format!("-o {options} 127.0.0.3:{path}")
    );
    drop(exports);
    let _exports = stand_in.open_over(VolumeLayout::OwnFilesystem);
    assert_eq!(
        stand_in.calls(),
        vec![format!("-o {options} 127.0.0.3:{path}")]
    );
}

/// Each file of the exports directory as the disk has it: its inode and its change time,
/// which a replacement or a rewrite in place changes.
fn stamps(stand_in: &StandIn) -> BTreeMap<String, (u64, i64, i64)> {
    std::fs::read_dir(&stand_in.settings.knfsd_exports_dir)
        .unwrap()
        .map(|entry| {
            let entry = entry.unwrap();
            let meta = entry.metadata().unwrap();
            (
                entry.file_name().into_string().unwrap(),
                (meta.ino(), meta.mtime(), meta.mtime_nsec()),
            )
        })
        .collect()
}

/// The exports the stand-in's log names, `-o` or `-u`, by their path.
fn paths_called(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .map(|call| call.rsplit_once(':').unwrap().1.to_owned())
        .collect()
}

#[test]
fn knfsd_recording_exportfs_stand_in_changes_one_file_of_two_thousand_for_one_export() {
    const EXPORTS: usize = 2000;
    let stand_in = StandIn::new();
    let exports = stand_in.open();
    let volume = |i: usize| format!("ns/claim-{i:04}");
    for i in 0..EXPORTS {
        let path = VolumePath::parse(&volume(i)).unwrap();
        exports.set(&path, &request(&["127.0.0.2"])).unwrap();
    }
    assert_eq!(stand_in.calls().len(), EXPORTS);
    let before = stamps(&stand_in);
    assert_eq!(before.len(), EXPORTS, "a file per export");

    // A change of one export: its file replaced, every other one untouched, and
    // exportfs called for that export only.
    let changed = VolumePath::parse(&volume(1234)).unwrap();
    let changed_file = Knfsd::file_name(&changed);
    exports
        .set(&changed, &request(&["127.0.0.2", "10.0.0.0/8"]))
        .unwrap();
    let after = stamps(&stand_in);
    let differ: Vec<&String> = after
        .iter()
        .filter(|(name, stamp)| before.get(*name) != Some(*stamp))
        .map(|(name, _)| name)
        .collect();
    assert_eq!(differ, vec![&changed_file]);
    assert_eq!(after.len(), EXPORTS, "no file added or left behind");
    let changed_path = stand_in.path(&volume(1234));
    assert_eq!(
        paths_called(&stand_in.calls()),
        vec![changed_path.clone(), changed_path.clone()],
        "a call for each of its clients, none for another export"
    );
    let text = std::fs::read_to_string(stand_in.file_of(&volume(1234))).unwrap();
    assert!(text.contains("10.0.0.0/8("), "{text}");

    // Removed: its file gone, every other one untouched.
    exports.remove(&changed).unwrap();
    assert_eq!(
        paths_called(&stand_in.calls()),
        vec![changed_path.clone(), changed_path]
    );
    let mut expected = before.clone();
    expected.remove(&changed_file);
    assert_eq!(stamps(&stand_in), expected);
}

/// The exports file an agent before this layout kept: every export's record, then its
/// line, in one file.
fn single_file(stand_in: &StandIn, volumes: &[&str]) -> String {
    let mut text =
        String::from("# Written by nfsprov-agent, which replaces this file at each change.\n");
    for volume in volumes {
        let path = VolumePath::parse(volume).unwrap();
        let record = nfsprov_agent::exports::ExportRecord::new(path, None, request(&["127.0.0.2"]));
        text.push_str(&record.to_comment());
        text.push_str(&format!(
            "\"{}\" 127.0.0.2({OPTIONS})\n",
            stand_in.path(volume)
        ));
    }
    text
}

#[test]
fn knfsd_recording_exportfs_stand_in_moves_the_single_exports_file_to_a_file_per_volume() {
    let stand_in = StandIn::new();
    let legacy = &stand_in.settings.knfsd_exports_file;
    let volumes = ["ns/a", "ns/b", "other/c"];
    let old = single_file(&stand_in, &volumes);
    std::fs::write(legacy, &old).unwrap();

    let exports = stand_in.open();
    assert_eq!(exports.len(), 3);
    let mut called = paths_called(&stand_in.calls());
    called.sort();
    assert_eq!(
        called,
        volumes.map(|v| stand_in.path(v)).to_vec(),
        "each export served again once"
    );
    assert!(!legacy.exists(), "the single file removed");
    let files = stand_in.files();
    assert_eq!(files.len(), 3, "{files:?}");
    for volume in volumes {
        let text = std::fs::read_to_string(stand_in.file_of(volume)).unwrap();
        let line = format!("\"{}\" 127.0.0.2({OPTIONS})\n", stand_in.path(volume));
        assert!(text.contains(&line), "{text}");
        assert_eq!(
            exports
                .get(&VolumePath::parse(volume).unwrap())
                .unwrap()
                .clients
                .len(),
            1
        );
    }
    drop(exports);

    // A crash after the files were written and before the single file was removed:
    // both are there (a volume's file is the very record the single file holds), each
    // export read once; and a crash after only some were written.
    let written = stamps(&stand_in);
    std::fs::write(legacy, &old).unwrap();
    std::fs::remove_file(stand_in.file_of("ns/b")).unwrap();
    let exports = stand_in.open();
    assert_eq!(exports.len(), 3);
    let mut called = paths_called(&stand_in.calls());
    called.sort();
    assert_eq!(called, volumes.map(|v| stand_in.path(v)).to_vec());
    assert!(!legacy.exists());
    let now = stamps(&stand_in);
    assert_eq!(now.len(), 3);
    for volume in ["ns/a", "other/c"] {
        let name = Knfsd::file_name(&VolumePath::parse(volume).unwrap());
        assert_eq!(now[&name], written[&name], "{volume}'s file left as it was");
    }
    assert_eq!(
        stand_in.files(),
        files,
        "the same files as the first move wrote"
    );

    // A change after the move writes the volume's file, and the single file stays gone.
    exports
        .set(
            &VolumePath::parse("ns/a").unwrap(),
            &request(&["127.0.0.3"]),
        )
        .unwrap();
    assert!(!legacy.exists());
    assert!(stand_in.file().contains("127.0.0.3("));
    drop(exports);
    let exports = stand_in.open();
    assert_eq!(
        exports
            .get(&VolumePath::parse("ns/a").unwrap())
            .unwrap()
            .clients,
        vec!["127.0.0.3".parse().unwrap()]
    );
}
