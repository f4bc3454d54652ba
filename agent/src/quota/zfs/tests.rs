//! The backend's orchestration against a scripted `zfs` (`MockToolRunner`): the command
//! lines it runs, in order, and what it makes of the answers.

use super::parse::classify;
use super::*;
use crate::quota::command::MockToolRunner;

const DATASET: &str = "tank/export";

struct Fixture {
    runner: Arc<MockToolRunner>,
    zfs: Zfs,
    root: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let runner = Arc::new(MockToolRunner::default());
    let root = tempfile::tempdir().unwrap();
    let zfs =
        Zfs::new(runner.clone(), DATASET, root.path()).with_busy_wait(Duration::from_millis(500));
    Fixture { runner, zfs, root }
}

impl Fixture {
    /// A command line with the fixture's export root written as `<root>`.
    fn calls(&self) -> Vec<String> {
        let root = self.root.path().to_str().unwrap();
        self.runner
            .calls()
            .into_iter()
            .map(|c| c.replace(root, "<root>"))
            .collect()
    }
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn failed(stderr: &str) -> ToolError {
    ToolError::Failed {
        command: "zfs".into(),
        status: "exit status: 1".into(),
        stderr: stderr.into(),
    }
}

fn missing() -> ToolError {
    failed("cannot open 'tank/export/x': dataset does not exist")
}

/// `zfs get -o property,value,source` output for a volume dataset.
fn volume_properties(path: Option<&str>, meta: Option<&str>, extra: &str) -> String {
    let user = |name: &str, value: Option<&str>| match value {
        Some(v) => format!("{name}\t{v}\tlocal\n"),
        None => format!("{name}\t-\t-\n"),
    };
    format!(
        "{}{}{extra}",
        user(PATH_PROPERTY, path),
        user(META_PROPERTY, meta)
    )
}

const GET_VOLUME: &str =
    "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume tank/export/ns:claim";

#[test]
fn create_makes_one_dataset_with_mountpoint_owner_mark_and_quota() {
    let f = fixture();
    f.runner.reply(Err(missing()));
    f.zfs.create(&path("ns/claim"), Some(1 << 20)).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            "zfs create -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=1048576 tank/export/ns:claim",
        ]
    );

    let f = fixture();
    f.runner.reply(Err(missing()));
    f.zfs.create(&path("solo"), None).unwrap();
    assert_eq!(
        f.calls()[1],
        "zfs create -o mountpoint=<root>/solo -o nfsprov:path=solo tank/export/solo"
    );
}

#[test]
fn create_destroys_an_unfinished_leftover_first() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), None, "")));
    f.zfs.create(&path("ns/claim"), Some(5)).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            "zfs destroy -r tank/export/ns:claim",
            "zfs create -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=5 tank/export/ns:claim",
        ]
    );
}

#[test]
fn create_refuses_finished_volumes_and_datasets_of_others() {
    let cases = [
        (volume_properties(Some("ns/claim"), Some("{}"), ""), "already exists"),
        (volume_properties(None, None, ""), "not created by the agent"),
        // A mark inherited from the parent is not a mark.
        (
            "nfsprov:path\tns/claim\tinherited from tank/export\nnfsprov:volume\t{}\tinherited from tank/export\n"
                .to_owned(),
            "not created by the agent",
        ),
        (volume_properties(Some("other"), None, ""), "not created by the agent"),
    ];
    for (reply, expected) in cases {
        let f = fixture();
        f.runner.reply(Ok(&reply));
        let err = f.zfs.create(&path("ns/claim"), Some(5)).unwrap_err();
        assert!(
            matches!(err, ZfsError::Conflict(ref m) if m.contains(expected)),
            "{reply:?}: {err}"
        );
        assert_eq!(f.calls(), [GET_VOLUME], "nothing is changed");
    }
}

#[test]
fn impossible_requests_are_refused_before_running_zfs() {
    let f = fixture();
    let err = f.zfs.create(&path("a"), Some(0)).unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("0 bytes")),
        "{err}"
    );

    // "tank/export/" takes 12 of the 255 characters, leaving 243 for the path.
    let fits = "a".repeat(243);
    assert_eq!(f.zfs.dataset_name(&path(&fits)).unwrap().len(), 255);
    let long = format!("{}/b", "a".repeat(242));
    let err = f.zfs.create(&path(&long), None).unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("too long") && m.contains("256 characters")),
        "{err}"
    );

    for bad in ["", "-", "{\n}", "{\"a\":\"\t\"}"] {
        let err = f.zfs.write_meta(&path("a"), bad).unwrap_err();
        assert!(matches!(err, ZfsError::Invalid(_)), "{bad:?}: {err}");
    }
    let err = f
        .zfs
        .write_meta(&path("a"), &"x".repeat(MAX_PROPERTY_VALUE_BYTES + 1))
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("8191")),
        "{err}"
    );

    for bad in ["", "/abs", "../up", "a/../../b", "./a"] {
        let err = f.zfs.archive(&path("a"), bad).unwrap_err();
        assert!(matches!(err, ZfsError::Invalid(_)), "{bad:?}: {err}");
    }
    assert!(f.calls().is_empty(), "{:?}", f.calls());
}

#[test]
fn distinct_paths_get_distinct_names() {
    let f = fixture();
    let names: std::collections::HashSet<String> =
        ["a/b", "a-b", "a.b", "a_b", "ab", "a/b/c", "a/bc"]
            .into_iter()
            .map(|p| f.zfs.dataset_name(&path(p)).unwrap())
            .collect();
    assert_eq!(names.len(), 7);
    assert_eq!(
        f.zfs.dataset_name(&path("a/b/c")).unwrap(),
        "tank/export/a:b:c"
    );
    for name in names {
        let child = name.strip_prefix("tank/export/").unwrap();
        assert!(matches!(classify(child), ChildKind::Active(_)), "{name}");
    }
    assert_eq!(classify(":archive:123"), ChildKind::Archived);
    assert_eq!(classify(".hidden"), ChildKind::Other);
}

#[test]
fn write_meta_and_set_refquota_set_one_property_on_the_agents_dataset() {
    let f = fixture();
    let ours = volume_properties(Some("ns/claim"), None, "");
    f.runner.reply(Ok(&ours));
    f.zfs
        .write_meta(&path("ns/claim"), r#"{"mode":"777","owner":{"a":"b c=d"}}"#)
        .unwrap();
    f.runner.reply(Ok(&ours));
    f.zfs
        .set_refquota(&path("ns/claim"), Some(2 << 30))
        .unwrap();
    f.runner.reply(Ok(&ours));
    f.zfs.set_refquota(&path("ns/claim"), None).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            r#"zfs set nfsprov:volume={"mode":"777","owner":{"a":"b c=d"}} tank/export/ns:claim"#,
            GET_VOLUME,
            "zfs set refquota=2147483648 tank/export/ns:claim",
            GET_VOLUME,
            "zfs set refquota=none tank/export/ns:claim",
        ]
    );

    let f = fixture();
    f.runner.reply(Err(missing()));
    let err = f.zfs.set_refquota(&path("ns/claim"), Some(1)).unwrap_err();
    assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
    f.runner.reply(Ok(&volume_properties(None, None, "")));
    let err = f.zfs.write_meta(&path("ns/claim"), "{}").unwrap_err();
    assert!(matches!(err, ZfsError::Conflict(_)), "{err}");
    assert_eq!(f.calls(), [GET_VOLUME, GET_VOLUME]);
}

#[test]
fn zfs_failures_keep_their_stderr() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
        .reply(Err(failed(
            "cannot set property for 'tank/export/ns:claim': size is less than current used or reserved space",
        )));
    let err = f.zfs.set_refquota(&path("ns/claim"), Some(1)).unwrap_err();
    assert!(err.to_string().contains("less than current used"), "{err}");
}

#[test]
fn destroy_removes_the_dataset_then_its_empty_mountpoint_directory() {
    let f = fixture();
    let dir = f.root.path().join("ns/claim");
    std::fs::create_dir_all(&dir).unwrap();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
        // zfs-fuse needs a moment after its own unmount.
        .reply(Err(failed(
            "cannot destroy 'tank/export/ns:claim': dataset is busy",
        )));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            "zfs destroy -r tank/export/ns:claim",
            "zfs destroy -r tank/export/ns:claim",
        ]
    );
    assert!(!dir.exists());
    assert!(
        f.root.path().join("ns").is_dir(),
        "parents are the caller's"
    );

    // Gone already: success, and nothing but the lookup.
    let f = fixture();
    f.runner.reply(Err(missing()));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(f.calls(), [GET_VOLUME]);

    // Files that are not on the dataset are never removed.
    let f = fixture();
    std::fs::create_dir_all(f.root.path().join("ns/claim")).unwrap();
    std::fs::write(f.root.path().join("ns/claim/stray"), b"x").unwrap();
    f.runner.reply(Err(missing()));
    let err = f.zfs.destroy(&path("ns/claim")).unwrap_err();
    assert!(
        matches!(err, ZfsError::Conflict(ref m) if m.contains("still holds files")),
        "{err}"
    );
    assert!(f.root.path().join("ns/claim/stray").exists());
}

#[test]
fn a_dataset_that_stays_busy_is_reported_after_the_busy_wait() {
    let runner = Arc::new(MockToolRunner::default());
    let zfs = Zfs::new(runner.clone(), DATASET, Path::new("/nonexistent"))
        .with_busy_wait(Duration::from_millis(50));
    runner.reply(Ok(&volume_properties(Some("a"), Some("{}"), "")));
    for _ in 0..1000 {
        runner.reply(Err(failed(
            "cannot destroy 'tank/export/a': dataset is busy",
        )));
    }
    let started = Instant::now();
    let err = zfs.destroy(&path("a")).unwrap_err();
    assert!(err.to_string().contains("dataset is busy"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(2));
    assert!(
        runner.calls().len() < 20,
        "retries are paced: {}",
        runner.calls().len()
    );
}

#[test]
fn archive_unmounts_moves_the_mountpoint_renames_and_mounts() {
    let f = fixture();
    let dir = f.root.path().join("ns/claim");
    std::fs::create_dir_all(&dir).unwrap();
    f.runner.reply(Ok(&volume_properties(
        Some("ns/claim"),
        Some("{}"),
        "mounted\tyes\t-\nguid\t5691047184416807748\t-\n",
    )));
    f.zfs
        .archive(
            &path("ns/claim"),
            ".archive/ns/claim/@20261122T083958.123456789Z",
        )
        .unwrap();
    assert_eq!(
        f.calls(),
        [
            "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume,mounted,guid tank/export/ns:claim",
            "zfs umount tank/export/ns:claim",
            "zfs set mountpoint=<root>/.archive/ns/claim/@20261122T083958.123456789Z tank/export/ns:claim",
            "zfs rename tank/export/ns:claim tank/export/:archive:5691047184416807748",
            "zfs mount tank/export/:archive:5691047184416807748",
        ]
    );
    assert!(!dir.exists());

    // An interrupted archive left it unmounted: no second unmount.
    let f = fixture();
    f.runner.reply(Ok(&volume_properties(
        Some("a"),
        Some("{}"),
        "mounted\tno\t-\nguid\t42\t-\n",
    )));
    f.zfs.archive(&path("a"), ".archive/a/@x").unwrap();
    assert!(
        !f.calls().iter().any(|c| c.contains("umount")),
        "{:?}",
        f.calls()
    );

    let f = fixture();
    f.runner.reply(Err(missing()));
    let err = f.zfs.archive(&path("a"), ".archive/a/@x").unwrap_err();
    assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
}

/// A listing of the configured dataset's children, as `zfs get -r -d 1` prints it.
fn listing() -> String {
    [
        // The configured dataset itself.
        "tank/export\tmounted\tyes\t-",
        "tank/export\tnfsprov:path\t-\t-",
        "tank/export\tnfsprov:volume\t-\t-",
        // Finished volumes.
        "tank/export/b\tmounted\tyes\t-",
        "tank/export/b\tnfsprov:path\tb\tlocal",
        "tank/export/b\tnfsprov:volume\t{\"n\":\"b\"}\tlocal",
        "tank/export/a:c\tmounted\tyes\t-",
        "tank/export/a:c\tnfsprov:path\ta/c\tlocal",
        "tank/export/a:c\tnfsprov:volume\t{\"n\":\"a c\"}\tlocal",
        // Unfinished: created, never given metadata.
        "tank/export/half\tmounted\tyes\t-",
        "tank/export/half\tnfsprov:path\thalf\tlocal",
        "tank/export/half\tnfsprov:volume\t-\t-",
        // Someone else's, with a metadata-looking inherited value.
        "tank/export/scratch\tmounted\tyes\t-",
        "tank/export/scratch\tnfsprov:path\t-\t-",
        "tank/export/scratch\tnfsprov:volume\t{}\tinherited from tank",
        // Marked for another path than its name says.
        "tank/export/x:y\tmounted\tyes\t-",
        "tank/export/x:y\tnfsprov:path\tx\tlocal",
        "tank/export/x:y\tnfsprov:volume\t{}\tlocal",
        // Archived, left unmounted by a crash.
        "tank/export/:archive:77\tmounted\tno\t-",
        "tank/export/:archive:77\tnfsprov:path\tb\tlocal",
        "tank/export/:archive:77\tnfsprov:volume\t{\"n\":\"old b\"}\tlocal",
        // A snapshot, as OpenZFS lists them with -r.
        "tank/export/b@daily\tmounted\t-\t-",
        "tank/export/b@daily\tnfsprov:path\tb\tlocal",
        "tank/export/b@daily\tnfsprov:volume\t{}\tlocal",
    ]
    .join("\n")
        + "\n"
}

const LIST_CHILDREN: &str = "zfs get -H -p -r -d 1 -o name,property,value,source mounted,nfsprov:path,nfsprov:volume tank/export";

#[test]
fn list_returns_exactly_the_finished_active_volumes() {
    let f = fixture();
    f.runner.reply(Ok(&listing()));
    let listed = f.zfs.list().unwrap();
    assert_eq!(
        listed,
        [
            (path("a/c"), r#"{"n":"a c"}"#.to_owned()),
            (path("b"), r#"{"n":"b"}"#.to_owned()),
        ]
    );
    assert_eq!(f.calls(), [LIST_CHILDREN]);

    let f = fixture();
    f.runner.reply(Ok("garbage-without-tabs\n"));
    assert!(matches!(f.zfs.list(), Err(ZfsError::UnexpectedOutput(_))));
}

/// A listing of the children with what describes archives, mounted below `root`.
fn archive_listing(root: &Path) -> String {
    let root = root.display();
    [
        "tank/export\tmountpoint\t<root>\tlocal".to_owned(),
        "tank/export\treferenced\t100\t-".to_owned(),
        // A finished volume: not an archive.
        "tank/export/b\tmountpoint\t<root>/b\tlocal".to_owned(),
        "tank/export/b\treferenced\t5\t-".to_owned(),
        "tank/export/b\tnfsprov:path\tb\tlocal".to_owned(),
        "tank/export/b\tnfsprov:volume\t{}\tlocal".to_owned(),
        // Archives of b and of a/c.
        "tank/export/:archive:77\tmountpoint\t<root>/.archive/b/@20260102T030405.000000006Z\tlocal"
            .to_owned(),
        "tank/export/:archive:77\treferenced\t4096\t-".to_owned(),
        "tank/export/:archive:77\tnfsprov:path\tb\tlocal".to_owned(),
        "tank/export/:archive:77\tnfsprov:volume\t{\"n\":\"old b\"}\tlocal".to_owned(),
        "tank/export/:archive:12\tmountpoint\t<root>/.archive/a/c/@20260102T030405.000000006Z-1\tlocal"
            .to_owned(),
        "tank/export/:archive:12\treferenced\t8192\t-".to_owned(),
        "tank/export/:archive:12\tnfsprov:path\ta/c\tlocal".to_owned(),
        "tank/export/:archive:12\tnfsprov:volume\t{}\tlocal".to_owned(),
        // Named like an archive but not the agent's, and one mounted outside the root.
        "tank/export/:archive:5\tmountpoint\t<root>/.archive/z/@20260102T030405.000000006Z\tlocal"
            .to_owned(),
        "tank/export/:archive:5\tnfsprov:path\t-\t-".to_owned(),
        "tank/export/:archive:6\tmountpoint\t/elsewhere/.archive/y/@20260102T030405.000000006Z\tlocal"
            .to_owned(),
        "tank/export/:archive:6\tnfsprov:path\ty\tlocal".to_owned(),
    ]
    .join("\n")
    .replace("<root>", &root.to_string())
        + "\n"
}

const LIST_ARCHIVES: &str = "zfs get -H -p -r -d 1 -o name,property,value,source mountpoint,referenced,nfsprov:path,nfsprov:volume tank/export";

#[test]
fn archives_are_the_agents_archived_datasets_below_the_root() {
    let f = fixture();
    f.runner.reply(Ok(&archive_listing(f.root.path())));
    let archives = f.zfs.archives().unwrap();
    assert_eq!(
        archives,
        [
            ArchivedDataset {
                name: "tank/export/:archive:12".into(),
                location: ".archive/a/c/@20260102T030405.000000006Z-1".into(),
                path: path("a/c"),
                meta: Some("{}".into()),
                referenced: Some(8192),
            },
            ArchivedDataset {
                name: "tank/export/:archive:77".into(),
                location: ".archive/b/@20260102T030405.000000006Z".into(),
                path: path("b"),
                meta: Some(r#"{"n":"old b"}"#.into()),
                referenced: Some(4096),
            },
        ]
    );
    assert_eq!(f.calls(), [LIST_ARCHIVES]);
}

#[test]
fn destroy_archive_destroys_only_the_dataset_mounted_there() {
    let f = fixture();
    let location = ".archive/b/@20260102T030405.000000006Z";
    std::fs::create_dir_all(f.root.path().join(location)).unwrap();
    f.runner.reply(Ok(&archive_listing(f.root.path())));
    f.zfs.destroy_archive(location).unwrap();
    assert_eq!(
        f.calls(),
        [LIST_ARCHIVES, "zfs destroy -r tank/export/:archive:77"]
    );
    assert!(!f.root.path().join(location).exists());
    assert!(f.root.path().join(".archive/b").is_dir());

    // Someone else's dataset, or nothing, at the location: nothing is touched.
    for location in [
        ".archive/z/@20260102T030405.000000006Z",
        ".archive/q/@20260102T030405.000000006Z",
    ] {
        let f = fixture();
        std::fs::create_dir_all(f.root.path().join(location)).unwrap();
        f.runner.reply(Ok(&archive_listing(f.root.path())));
        f.zfs.destroy_archive(location).unwrap();
        assert_eq!(f.calls(), [LIST_ARCHIVES]);
        assert!(f.root.path().join(location).is_dir());
    }
}

#[test]
fn purge_destroys_unfinished_datasets_and_remounts_unmounted_ones() {
    let f = fixture();
    std::fs::create_dir(f.root.path().join("half")).unwrap();
    f.runner.reply(Ok(&listing()));
    assert_eq!(f.zfs.purge_leftovers().unwrap(), 1);
    assert_eq!(
        f.calls(),
        [
            LIST_CHILDREN,
            "zfs mount tank/export/:archive:77",
            "zfs destroy -r tank/export/half",
        ]
    );
    assert!(!f.root.path().join("half").exists());
}

#[test]
fn read_meta_sees_only_the_agents_finished_volumes() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(
            Some("ns/claim"),
            Some(r#"{"uid":1}"#),
            "",
        )))
        .reply(Ok(&volume_properties(Some("ns/claim"), None, "")))
        .reply(Ok(&volume_properties(None, Some("{}"), "")))
        .reply(Err(missing()));
    let claim = path("ns/claim");
    assert_eq!(
        f.zfs.read_meta(&claim).unwrap().as_deref(),
        Some(r#"{"uid":1}"#)
    );
    assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);
    assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);
    assert_eq!(f.zfs.read_meta(&claim).unwrap(), None);

    f.runner.reply(Err(failed("internal error: out of memory")));
    let err = f.zfs.read_meta(&claim).unwrap_err();
    assert!(err.to_string().contains("out of memory"), "{err}");
}

#[test]
fn usage_reads_referenced_bytes() {
    let f = fixture();
    f.runner.reply(Ok("referenced\t5242880\t-\n"));
    // Nothing is mounted at the path in this test, so there is no object count.
    assert_eq!(f.zfs.usage(&path("ns/claim")).unwrap(), (5_242_880, None));
    assert_eq!(
        f.calls(),
        ["zfs get -H -p -o property,value,source referenced tank/export/ns:claim"]
    );

    f.runner.reply(Ok("referenced\t5M\t-\n"));
    assert!(matches!(
        f.zfs.usage(&path("ns/claim")),
        Err(ZfsError::UnexpectedOutput(_))
    ));
    f.runner.reply(Err(missing()));
    assert!(matches!(
        f.zfs.usage(&path("ns/claim")),
        Err(ZfsError::NotFound(_))
    ));
}

fn probe_with(
    reply: std::result::Result<&str, ToolError>,
    dataset: &str,
    root: &str,
) -> std::result::Result<Zfs, String> {
    let runner = Arc::new(MockToolRunner::default());
    runner.reply(reply);
    Zfs::probe(runner, dataset, Path::new(root))
}

const GOOD_PROBE: &str = "type\tfilesystem\t-\nmounted\tyes\t-\nmountpoint\t/srv/export\tlocal\n";

#[test]
fn probe_accepts_the_dataset_mounted_at_the_root() {
    let runner = Arc::new(MockToolRunner::default());
    runner.reply(Ok(GOOD_PROBE));
    let zfs = Zfs::probe(runner.clone(), DATASET, Path::new("/srv/export/")).unwrap();
    assert_eq!(zfs.dataset(), DATASET);
    assert_eq!(
        runner.calls(),
        ["zfs get -H -p -o property,value,source type,mounted,mountpoint tank/export"]
    );
}

#[test]
fn probe_failures_say_what_is_wrong_and_how_to_fix_it_in_one_line() {
    let not_started = ToolError::NotStarted {
        command: "zfs get".into(),
        reason: "No such file or directory (os error 2)".into(),
    };
    let timed_out = ToolError::TimedOut {
        command: "zfs get".into(),
        seconds: 30,
    };
    let long_dataset = "t".repeat(230);
    // What zfs answers, the dataset and export root configured, what the message says.
    type Case<'a> = (
        std::result::Result<&'a str, ToolError>,
        &'a str,
        &'a str,
        &'a [&'a str],
    );
    let cases: Vec<Case> = vec![
        (
            Err(not_started),
            DATASET,
            "/srv/export",
            &["cannot run zfs", "PATH"],
        ),
        (
            Err(timed_out),
            DATASET,
            "/srv/export",
            &["did not answer within 30 s"],
        ),
        (
            Err(failed("cannot open 'tank/export': dataset does not exist")),
            DATASET,
            "/srv/export",
            &[
                "does not exist",
                "zfs create -o mountpoint=/srv/export tank/export",
            ],
        ),
        (
            Err(failed(
                "connect: Connection refused\nPlease make sure that the zfs-fuse daemon is running.",
            )),
            DATASET,
            "/srv/export",
            &["Connection refused; Please make sure"],
        ),
        (
            Ok("type\tvolume\t-\nmounted\t-\t-\nmountpoint\t-\t-\n"),
            DATASET,
            "/srv/export",
            &["is a volume, not a filesystem"],
        ),
        (
            Ok("type\tfilesystem\t-\nmounted\tyes\t-\nmountpoint\t/tank/export\tdefault\n"),
            DATASET,
            "/srv/export",
            &[
                "mountpoint /tank/export",
                "zfs set mountpoint=/srv/export tank/export",
            ],
        ),
        (
            Ok("type\tfilesystem\t-\nmounted\tno\t-\nmountpoint\tlegacy\tlocal\n"),
            DATASET,
            "/srv/export",
            &[
                "mountpoint legacy, not the export root /srv/export; run `zfs set mountpoint=/srv/export tank/export`",
            ],
        ),
        (
            Ok("type\tfilesystem\t-\nmounted\tno\t-\nmountpoint\t/srv/export\tlocal\n"),
            DATASET,
            "/srv/export",
            &["not mounted", "zfs mount tank/export"],
        ),
        (
            Ok(GOOD_PROBE),
            "tank/export@snap",
            "/srv/export",
            &["not a filesystem name"],
        ),
        (
            Ok(GOOD_PROBE),
            "/tank",
            "/srv/export",
            &["not a filesystem name"],
        ),
        (Ok(GOOD_PROBE), &long_dataset, "/srv/export", &["too long"]),
        (Ok(GOOD_PROBE), DATASET, "srv/export", &["absolute"]),
        (Ok(GOOD_PROBE), DATASET, "/srv/../export", &["absolute"]),
    ];
    for (reply, dataset, root, expected) in cases {
        let shown = format!("{reply:?} {dataset} {root}");
        let message = probe_with(reply, dataset, root).unwrap_err();
        assert!(!message.contains('\n'), "{shown}: {message}");
        for part in expected {
            assert!(
                message.contains(part),
                "{shown}: {message:?} lacks {part:?}"
            );
        }
    }
}
