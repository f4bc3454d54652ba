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
    /// A command line with the fixture's export root written as `<root>` and the unique
    /// part of a clone snapshot's name as `<n>`.
    fn calls(&self) -> Vec<String> {
        let root = self.root.path().to_str().unwrap();
        self.runner
            .calls()
            .into_iter()
            .map(|c| without_snapshot_suffix(&c.replace(root, "<root>")))
            .collect()
    }
}

/// `line` with every `nfsprov-clone-<digits>-<digits>` written `nfsprov-clone-<n>`
/// (scripted answers name their snapshots with words).
fn without_snapshot_suffix(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(at) = rest.find(CLONE_SNAPSHOT_PREFIX) {
        let (before, from) = rest.split_at(at + CLONE_SNAPSHOT_PREFIX.len());
        out.push_str(before);
        let suffix = from
            .find(|c: char| !c.is_ascii_digit() && c != '-')
            .unwrap_or(from.len());
        if suffix > 0 {
            out.push_str("<n>");
        }
        rest = &from[suffix..];
    }
    out.push_str(rest);
    out
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
/// What every destroy looks at first: which children are clones of what.
const LIST_ORIGINS: &str =
    "zfs get -H -p -r -d 2 -o name,property,value,source origin,nfsprov:path tank/export";

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
            LIST_ORIGINS,
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
        .reply(Ok(""))
        // zfs-fuse needs a moment after its own unmount.
        .reply(Err(failed(
            "cannot destroy 'tank/export/ns:claim': dataset is busy",
        )));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            LIST_ORIGINS,
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
    runner
        .reply(Ok(&volume_properties(Some("a"), Some("{}"), "")))
        .reply(Ok(""));
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
            LIST_ORIGINS,
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
        [
            LIST_ARCHIVES,
            LIST_ORIGINS,
            "zfs destroy -r tank/export/:archive:77"
        ]
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
            LIST_ORIGINS,
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

const GET_SOURCE: &str =
    "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume tank/export/ns:src";
const SNAPSHOT_SOURCE: &str = "zfs snapshot tank/export/ns:src@nfsprov-clone-<n>";

#[test]
fn clone_snapshots_the_source_and_clones_it_marked_at_the_target_path() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()));
    f.zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), Some(1 << 20))
        .unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_SOURCE,
            GET_VOLUME,
            SNAPSHOT_SOURCE,
            "zfs clone -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=1048576 tank/export/ns:src@nfsprov-clone-<n> tank/export/ns:claim",
        ]
    );
    // The clone is made from the snapshot just taken.
    let raw = f.runner.calls();
    let snapshot = raw[2].strip_prefix("zfs snapshot ").unwrap();
    assert!(raw[3].contains(&format!(" {snapshot} ")), "{raw:?}");

    // Without a quota; a second clone of the same source gets a snapshot of its own.
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()));
    f.zfs
        .clone_volume(&path("ns/src"), &path("other"), None)
        .unwrap();
    let raw = f.runner.calls();
    assert_eq!(
        f.calls()[7],
        "zfs clone -o mountpoint=<root>/other -o nfsprov:path=other tank/export/ns:src@nfsprov-clone-<n> tank/export/other"
    );
    assert_ne!(raw[6], raw[2], "{raw:?}");
}

#[test]
fn clone_needs_a_finished_source_of_the_agents_and_a_free_target() {
    // No finished volume of the agent's at the source: nothing else is looked at.
    for reply in [
        Err(missing()),
        Ok(volume_properties(Some("ns/src"), None, "")),
        Ok(volume_properties(None, Some("{}"), "")),
        Ok(volume_properties(Some("other"), Some("{}"), "")),
    ] {
        let f = fixture();
        f.runner.reply(reply.as_deref().map_err(Clone::clone));
        let err = f
            .zfs
            .clone_volume(&path("ns/src"), &path("ns/claim"), None)
            .unwrap_err();
        assert!(
            matches!(err, ZfsError::NotFound(ref m) if m.contains("no volume at ns/src")),
            "{reply:?}: {err}"
        );
        assert_eq!(f.calls(), [GET_SOURCE]);
    }

    // A finished volume or a dataset of someone else's at the target.
    for (target, expected) in [
        (
            volume_properties(Some("ns/claim"), Some("{}"), ""),
            "already exists",
        ),
        (
            volume_properties(None, None, ""),
            "not created by the agent",
        ),
    ] {
        let f = fixture();
        f.runner
            .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
            .reply(Ok(&target));
        let err = f
            .zfs
            .clone_volume(&path("ns/src"), &path("ns/claim"), None)
            .unwrap_err();
        assert!(
            matches!(err, ZfsError::Conflict(ref m) if m.contains(expected)),
            "{err}"
        );
        assert_eq!(f.calls(), [GET_SOURCE, GET_VOLUME]);
    }

    // A leftover of an interrupted create or clone at the target goes first.
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&volume_properties(Some("ns/claim"), None, "")));
    f.zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), Some(5))
        .unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_SOURCE,
            GET_VOLUME,
            LIST_ORIGINS,
            "zfs destroy -r tank/export/ns:claim",
            SNAPSHOT_SOURCE,
            "zfs clone -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=5 tank/export/ns:src@nfsprov-clone-<n> tank/export/ns:claim",
        ]
    );
}

#[test]
fn clones_whose_snapshot_could_not_move_with_them_are_refused_before_running_zfs() {
    let f = fixture();
    // "tank/export/" takes 12 characters and the snapshot `@nfsprov-clone-<19 digits>-<n>`
    // at least 36, which leaves at most 207 for a path.
    let fits = "a".repeat(200);
    let long = "a".repeat(208);
    let err = f
        .zfs
        .clone_volume(&path("src"), &path(&long), None)
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("cannot be a ZFS clone") && m.contains("ZFS allows 255")),
        "{err}"
    );
    let err = f
        .zfs
        .clone_volume(&path(&long), &path("claim"), None)
        .unwrap_err();
    assert!(matches!(err, ZfsError::Invalid(_)), "{err}");
    let err = f
        .zfs
        .clone_volume(&path("src"), &path("claim"), Some(0))
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("0 bytes")),
        "{err}"
    );
    assert!(f.calls().is_empty(), "{:?}", f.calls());

    f.runner.reply(Err(missing()));
    let err = f
        .zfs
        .clone_volume(&path("src"), &path(&fits), None)
        .unwrap_err();
    assert!(matches!(err, ZfsError::NotFound(_)), "{err}");
}

#[test]
fn a_failed_clone_destroys_the_snapshot_it_was_to_be_made_from() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()))
        .reply(Ok(""))
        .reply(Err(failed(
            "cannot mount '/srv/ns/claim': directory is not empty",
        )));
    let err = f
        .zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), None)
        .unwrap_err();
    assert!(err.to_string().contains("directory is not empty"), "{err}");
    let calls = f.calls();
    assert_eq!(
        calls[2..],
        [
            SNAPSHOT_SOURCE,
            "zfs clone -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim tank/export/ns:src@nfsprov-clone-<n> tank/export/ns:claim",
            "zfs destroy tank/export/ns:src@nfsprov-clone-<n>",
        ]
    );
    let raw = f.runner.calls();
    assert_eq!(
        raw[4].strip_prefix("zfs destroy "),
        raw[2].strip_prefix("zfs snapshot "),
        "the very snapshot taken"
    );

    // A quota below the source's size: zfs says "out of space"; the size is looked up
    // on the snapshot, before it goes.
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()))
        .reply(Ok(""))
        .reply(Err(failed(
            "cannot create 'tank/export/ns:claim': out of space",
        )))
        .reply(Ok("referenced\t2220032\t-\n"));
    let err = f
        .zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), Some(65536))
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Invalid(ref m) if m.contains("at least 2220032 bytes") && m.contains("65536")),
        "{err}"
    );
    assert_eq!(
        f.calls()[4..],
        [
            "zfs get -H -p -o property,value,source referenced tank/export/ns:src@nfsprov-clone-<n>",
            "zfs destroy tank/export/ns:src@nfsprov-clone-<n>",
        ]
    );

    // A pool that is really full stays what zfs said.
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()))
        .reply(Ok(""))
        .reply(Err(failed(
            "cannot create 'tank/export/ns:claim': out of space",
        )))
        .reply(Ok("referenced\t1000\t-\n"));
    let err = f
        .zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), Some(65536))
        .unwrap_err();
    assert!(
        matches!(err, ZfsError::Tool(_)) && err.to_string().contains("out of space"),
        "{err}"
    );
}

/// `zfs get -r -d 2 origin,nfsprov:path` output: the configured dataset, then each
/// `(child, origin, path mark)`.
fn origins(children: &[(&str, Option<&str>, Option<&str>)]) -> String {
    let mut out = "tank/export\torigin\t-\t-\ntank/export\tnfsprov:path\t-\t-\n".to_owned();
    for (child, origin, mark) in children {
        let name = format!("tank/export/{child}");
        out += &format!("{name}\torigin\t{}\t-\n", origin.unwrap_or("-"));
        out += &match mark {
            Some(mark) => format!("{name}\tnfsprov:path\t{mark}\tlocal\n"),
            None => format!("{name}\tnfsprov:path\t-\t-\n"),
        };
    }
    out
}

const GET_SOURCE_SNAPSHOTS: &str =
    "zfs get -H -p -r -d 1 -o name,property,value,source createtxg tank/export/ns:src";

#[test]
fn destroying_a_source_promotes_its_clone_and_removes_the_snapshot_that_moved() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                "ns:claim",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("ns/claim"),
            ),
        ])))
        .reply(Ok("tank/export/ns:src\tcreatetxg\t10\t-\n\
             tank/export/ns:src@nfsprov-clone-early\tcreatetxg\t20\t-\n"));
    f.zfs.destroy(&path("ns/src")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_SOURCE,
            LIST_ORIGINS,
            GET_SOURCE_SNAPSHOTS,
            "zfs promote tank/export/ns:claim",
            "zfs destroy -r tank/export/ns:src",
            "zfs destroy tank/export/ns:claim@nfsprov-clone-early",
        ]
    );
}

#[test]
fn destroying_a_source_with_two_clones_promotes_the_one_of_the_newest_snapshot() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            // Listed first, cloned from the newer snapshot.
            (
                "a",
                Some("tank/export/ns:src@nfsprov-clone-late"),
                Some("a"),
            ),
            (
                "b",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("b"),
            ),
            // Someone else's clone of an older snapshot is never promoted.
            ("scratch", Some("tank/export/ns:src@daily"), None),
        ])))
        .reply(Ok("tank/export/ns:src\tcreatetxg\t10\t-\n\
             tank/export/ns:src@daily\tcreatetxg\t15\t-\n\
             tank/export/ns:src@nfsprov-clone-early\tcreatetxg\t20\t-\n\
             tank/export/ns:src@nfsprov-clone-late\tcreatetxg\t31\t-\n"));
    f.zfs.destroy(&path("ns/src")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_SOURCE,
            LIST_ORIGINS,
            GET_SOURCE_SNAPSHOTS,
            "zfs promote tank/export/a",
            "zfs destroy -r tank/export/ns:src",
            // b's snapshot moved onto a with the promotion and stays for b.
            "zfs destroy tank/export/a@nfsprov-clone-late",
        ]
    );

    // Two clones of one snapshot: one is promoted, the snapshot stays for the other.
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                "a",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("a"),
            ),
            (
                "b",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("b"),
            ),
        ])))
        .reply(Ok(
            "tank/export/ns:src@nfsprov-clone-early\tcreatetxg\t20\t-\n",
        ));
    f.zfs.destroy(&path("ns/src")).unwrap();
    let calls = f.calls();
    assert_eq!(calls.len(), 5, "{calls:?}");
    assert!(calls[3].starts_with("zfs promote "), "{calls:?}");
    assert_eq!(calls[4], "zfs destroy -r tank/export/ns:src");
}

#[test]
fn destroying_a_clone_removes_the_snapshot_it_was_made_from() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                "ns:claim",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("ns/claim"),
            ),
        ])));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            LIST_ORIGINS,
            "zfs destroy -r tank/export/ns:claim",
            "zfs destroy tank/export/ns:src@nfsprov-clone-early",
        ]
    );

    // A snapshot the agent did not take, or one another clone still depends on, stays;
    // a failure to destroy the snapshot does not fail the destroy.
    for (other_origin, snapshot) in [
        (None, "tank/export/ns:src@daily"),
        (
            Some("tank/export/ns:src@nfsprov-clone-early"),
            "tank/export/ns:src@nfsprov-clone-early",
        ),
    ] {
        let f = fixture();
        f.runner
            .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
            .reply(Ok(&origins(&[
                ("ns:src", None, Some("ns/src")),
                ("ns:claim", Some(snapshot), Some("ns/claim")),
                ("other", other_origin, Some("other")),
            ])));
        f.zfs.destroy(&path("ns/claim")).unwrap();
        assert_eq!(
            f.calls(),
            [
                GET_VOLUME,
                LIST_ORIGINS,
                "zfs destroy -r tank/export/ns:claim"
            ]
        );
    }
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
        .reply(Ok(&origins(&[(
            "ns:claim",
            Some("tank/export/ns:src@nfsprov-clone-early"),
            Some("ns/claim"),
        )])))
        .reply(Ok(""))
        .reply(Err(failed("internal error: out of memory")));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(f.calls().len(), 4);
}

#[test]
fn archived_sources_and_leftover_clones_are_destroyed_the_same_way() {
    // An archived source: its clone's origin follows the rename.
    let f = fixture();
    let location = ".archive/b/@20260102T030405.000000006Z";
    f.runner
        .reply(Ok(&archive_listing(f.root.path())))
        .reply(Ok(&origins(&[
            (":archive:77", None, Some("b")),
            (
                "c",
                Some("tank/export/:archive:77@nfsprov-clone-early"),
                Some("c"),
            ),
        ])))
        .reply(Ok(
            "tank/export/:archive:77@nfsprov-clone-early\tcreatetxg\t20\t-\n",
        ));
    f.zfs.destroy_archive(location).unwrap();
    assert_eq!(
        f.calls(),
        [
            LIST_ARCHIVES,
            LIST_ORIGINS,
            "zfs get -H -p -r -d 1 -o name,property,value,source createtxg tank/export/:archive:77",
            "zfs promote tank/export/c",
            "zfs destroy -r tank/export/:archive:77",
            "zfs destroy tank/export/c@nfsprov-clone-early",
        ]
    );

    // A clone interrupted before its record is purged with its snapshot.
    let f = fixture();
    f.runner
        .reply(Ok(&listing()))
        // The mount of the archive a crash left unmounted.
        .reply(Ok(""))
        .reply(Ok(&origins(&[(
            "half",
            Some("tank/export/b@nfsprov-clone-early"),
            Some("half"),
        )])));
    assert_eq!(f.zfs.purge_leftovers().unwrap(), 1);
    assert_eq!(
        f.calls()[2..],
        [
            LIST_ORIGINS,
            "zfs destroy -r tank/export/half",
            "zfs destroy tank/export/b@nfsprov-clone-early",
        ]
    );
}

#[test]
fn a_source_with_clones_of_others_is_mounted_again_and_kept() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            ("scratch", Some("tank/export/ns:src@mine"), None),
        ])))
        .reply(Err(failed(
            "cannot destroy 'tank/export/ns:src': filesystem has dependent clones\nuse '-R' to destroy the following datasets:\ntank/export/scratch",
        )));
    let err = f.zfs.destroy(&path("ns/src")).unwrap_err();
    assert!(
        matches!(err, ZfsError::Conflict(ref m) if m.contains("did not make") && m.contains("tank/export/scratch")),
        "{err}"
    );
    assert_eq!(
        f.calls(),
        [
            GET_SOURCE,
            LIST_ORIGINS,
            "zfs destroy -r tank/export/ns:src",
            "zfs mount tank/export/ns:src",
        ]
    );
}

#[test]
fn a_promotion_that_would_make_a_snapshot_name_too_long_is_refused() {
    // zfs-fuse would do it and crash on the name.
    let f = fixture();
    let clone = format!("c{}", "x".repeat(220));
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                &clone,
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some(&clone),
            ),
        ])))
        .reply(Ok(&format!(
            "tank/export/ns:src@{}\tcreatetxg\t5\t-\ntank/export/ns:src@nfsprov-clone-early\tcreatetxg\t20\t-\n",
            "h".repeat(30)
        )));
    let err = f.zfs.destroy(&path("ns/src")).unwrap_err();
    assert!(
        matches!(err, ZfsError::Conflict(ref m) if m.contains("hhhh") && m.contains("264 characters")),
        "{err}"
    );
    assert_eq!(f.calls(), [GET_SOURCE, LIST_ORIGINS, GET_SOURCE_SNAPSHOTS]);
}

#[test]
fn a_clone_zfs_made_before_failing_goes_with_its_snapshot() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(Some("ns/src"), Some("{}"), "")))
        .reply(Err(missing()))
        .reply(Ok(""))
        .reply(Err(failed(
            "cannot mount 'tank/export/ns:claim': mountpoint or dataset is busy",
        )))
        .reply(Err(failed(
            "cannot destroy 'tank/export/ns:src@nfsprov-clone-x': snapshot has dependent clones\nuse '-R' to destroy the following datasets:\ntank/export/ns:claim",
        )))
        .reply(Ok(&volume_properties(Some("ns/claim"), None, "")))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                "ns:claim",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("ns/claim"),
            ),
        ])));
    let err = f
        .zfs
        .clone_volume(&path("ns/src"), &path("ns/claim"), None)
        .unwrap_err();
    assert!(err.to_string().contains("cannot mount"), "{err}");
    assert_eq!(
        f.calls()[4..],
        [
            "zfs destroy tank/export/ns:src@nfsprov-clone-<n>",
            GET_VOLUME,
            LIST_ORIGINS,
            "zfs destroy -r tank/export/ns:claim",
            "zfs destroy tank/export/ns:src@nfsprov-clone-early",
        ]
    );
}

#[test]
fn archiving_a_source_promotes_its_clone_first() {
    let f = fixture();
    f.runner
        .reply(Ok(&volume_properties(
            Some("ns/src"),
            Some("{}"),
            "mounted\tyes\t-\nguid\t42\t-\n",
        )))
        .reply(Ok(&origins(&[
            ("ns:src", None, Some("ns/src")),
            (
                "ns:claim",
                Some("tank/export/ns:src@nfsprov-clone-early"),
                Some("ns/claim"),
            ),
        ])))
        .reply(Ok(
            "tank/export/ns:src@nfsprov-clone-early\tcreatetxg\t20\t-\n",
        ));
    f.zfs
        .archive(&path("ns/src"), ".archive/ns/src/@x")
        .unwrap();
    assert_eq!(
        f.calls(),
        [
            "zfs get -H -p -o property,value,source nfsprov:path,nfsprov:volume,mounted,guid tank/export/ns:src",
            LIST_ORIGINS,
            GET_SOURCE_SNAPSHOTS,
            "zfs promote tank/export/ns:claim",
            "zfs umount tank/export/ns:src",
            "zfs set mountpoint=<root>/.archive/ns/src/@x tank/export/ns:src",
            "zfs rename tank/export/ns:src tank/export/:archive:42",
            "zfs mount tank/export/:archive:42",
        ]
    );
}

#[test]
fn a_volume_with_kept_snapshots_is_held_not_destroyed() {
    let f = fixture();
    let dir = f.root.path().join("ns/claim");
    std::fs::create_dir_all(&dir).unwrap();
    let mut listing = origins(&[("ns:claim", None, Some("ns/claim"))]);
    listing += "tank/export/ns:claim@nfsprov-snapshot-snap-1\torigin\t-\t-\n";
    f.runner
        .reply(Ok(&volume_properties(Some("ns/claim"), Some("{}"), "")))
        .reply(Ok(&listing))
        .reply(Ok("mounted\tyes\t-\nguid\t42\t-\n"));
    f.zfs.destroy(&path("ns/claim")).unwrap();
    assert_eq!(
        f.calls(),
        [
            GET_VOLUME,
            LIST_ORIGINS,
            "zfs get -H -p -o property,value,source mounted,guid tank/export/ns:claim",
            "zfs umount tank/export/ns:claim",
            "zfs set mountpoint=none tank/export/ns:claim",
            "zfs rename tank/export/ns:claim tank/export/:held:42",
        ]
    );
    assert!(!dir.exists(), "the path is free for a new volume");
    assert_eq!(classify(":held:42"), ChildKind::Held);
}

/// `zfs get -r -d 2 used,referenced` output listing the kept snapshot `snap-1` of `child`.
fn kept_listing(child: &str) -> String {
    let name = format!("tank/export/{child}@nfsprov-snapshot-snap-1");
    format!(
        "tank/export\tused\t1\t-\ntank/export/{child}\tused\t9\t-\n{name}\tused\t4096\t-\n{name}\treferenced\t8192\t-\n"
    )
}

#[test]
fn a_kept_snapshot_clones_depend_on_is_deferred_and_a_held_dataset_goes_with_its_last() {
    // Restores depend on it: renamed to a clone snapshot, which goes with them.
    let f = fixture();
    f.runner
        .reply(Ok(&kept_listing("ns:claim")))
        .reply(Err(failed(
            "cannot destroy 'tank/export/ns:claim@nfsprov-snapshot-snap-1': snapshot has dependent clones",
        )));
    assert!(f.zfs.drop_snapshot("snap-1").unwrap());
    assert_eq!(
        f.calls(),
        [
            "zfs get -H -p -r -d 2 -o name,property,value,source used,referenced tank/export",
            "zfs destroy tank/export/ns:claim@nfsprov-snapshot-snap-1",
            "zfs rename tank/export/ns:claim@nfsprov-snapshot-snap-1 tank/export/ns:claim@nfsprov-clone-<n>",
        ]
    );

    // The last kept snapshot of a held dataset: the dataset goes after it.
    let f = fixture();
    f.runner
        .reply(Ok(&kept_listing(":held:42")))
        .reply(Ok(""))
        .reply(Ok(""))
        .reply(Ok(&origins(&[(":held:42", None, Some("ns/claim"))])));
    assert!(f.zfs.drop_snapshot("snap-1").unwrap());
    assert_eq!(
        f.calls(),
        [
            "zfs get -H -p -r -d 2 -o name,property,value,source used,referenced tank/export",
            "zfs destroy tank/export/:held:42@nfsprov-snapshot-snap-1",
            "zfs get -H -p -r -d 1 -o name,property,value,source createtxg tank/export/:held:42",
            LIST_ORIGINS,
            "zfs destroy -r tank/export/:held:42",
        ]
    );

    // No such snapshot: nothing is touched.
    let f = fixture();
    f.runner.reply(Ok(&kept_listing("ns:claim")));
    assert!(!f.zfs.drop_snapshot("snap-2").unwrap());
    assert_eq!(f.calls().len(), 1);
}

#[test]
fn an_archive_is_restored_by_a_clone_of_a_new_snapshot_of_its_dataset() {
    let f = fixture();
    f.runner
        .reply(Ok(&archive_listing(f.root.path())))
        .reply(Err(missing()));
    f.zfs
        .clone_archive(
            ".archive/b/@20260102T030405.000000006Z",
            &path("ns/claim"),
            Some(1 << 20),
        )
        .unwrap();
    assert_eq!(
        f.calls(),
        [
            LIST_ARCHIVES,
            GET_VOLUME,
            "zfs snapshot tank/export/:archive:77@nfsprov-clone-<n>",
            "zfs clone -o mountpoint=<root>/ns/claim -o nfsprov:path=ns/claim -o refquota=1048576 tank/export/:archive:77@nfsprov-clone-<n> tank/export/ns:claim",
        ]
    );

    // Nothing archived there, or a dataset there that is not the agent's archive: not
    // found, and nothing but the listing ran.
    for location in [
        ".archive/b/@20000101T000000.000000000Z",
        ".archive/z/@20260102T030405.000000006Z",
    ] {
        let f = fixture();
        f.runner.reply(Ok(&archive_listing(f.root.path())));
        let err = f
            .zfs
            .clone_archive(location, &path("ns/claim"), None)
            .unwrap_err();
        assert!(matches!(err, ZfsError::NotFound(_)), "{location}: {err}");
        assert_eq!(f.calls(), [LIST_ARCHIVES]);
    }
}

/// Three finished volumes with records the store can read.
fn readable_listing() -> String {
    let meta =
        r#"{"mode":"0775","uid":0,"gid":0,"capacity_bytes":1,"created_at":"2026-01-01T00:00:00Z"}"#;
    ["a", "b", "c"]
        .iter()
        .flat_map(|name| {
            [
                format!("tank/export/{name}\tmounted\tyes\t-"),
                format!("tank/export/{name}\tnfsprov:path\t{name}\tlocal"),
                format!("tank/export/{name}\tnfsprov:volume\t{meta}\tlocal"),
            ]
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

#[test]
fn pages_are_cut_from_one_listing_until_a_dataset_changes_through_the_agent() {
    use crate::store::backend::VolumeBackend;
    let f = fixture();
    let root = crate::store::confine::Root::open(f.root.path()).unwrap();
    let backend = super::dataset_backend::DatasetBackend::new(Zfs::for_tests(
        f.runner.clone(),
        DATASET,
        f.root.path(),
    ));
    let names = |page: &[(VolumePath, crate::store::record::VolumeRecord)]| -> Vec<String> {
        page.iter().map(|(path, _)| path.to_string()).collect()
    };

    f.runner.reply(Ok(&readable_listing()));
    let (first, more) = backend.list_page(&root, None, 2).unwrap();
    assert_eq!((names(&first), more), (vec!["a".into(), "b".into()], true));
    let (second, more) = backend.list_page(&root, Some(&path("b")), 2).unwrap();
    assert_eq!((names(&second), more), (vec!["c".into()], false));
    assert_eq!(
        f.runner.calls(),
        [LIST_CHILDREN],
        "one listing for both pages"
    );

    // A change through the agent: the next page is cut from a new listing.
    f.runner.reply(Ok(&volume_properties(Some("b"), None, "")));
    f.runner.reply(Ok(""));
    backend
        .zfs()
        .write_meta(&path("b"), r#"{"mode":"0775"}"#)
        .unwrap();
    f.runner.reply(Ok(&readable_listing()));
    let (again, _) = backend.list_page(&root, Some(&path("a")), 5).unwrap();
    assert_eq!(names(&again), ["b", "c"]);
    let calls = f.runner.calls();
    assert_eq!(calls.len(), 4, "{calls:?}");
    assert_eq!(calls[3], LIST_CHILDREN);
}
