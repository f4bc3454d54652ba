//! The backend's orchestration against a scripted `xfs_quota` (`MockToolRunner`) and a
//! fake one that keeps state (`FakeXfsQuota`, also used by the store's tests).

use std::collections::HashMap;
use std::os::fd::AsFd;

use super::*;
use crate::quota::command::MockToolRunner;

const MOUNT: &str = "/srv/export";

/// A backend driving `runner` as if the export root were on an XFS mount.
pub(crate) fn xfs_backend_for_tests(runner: Arc<dyn ToolRunner>) -> Xfs {
    backend_with(runner, FilesystemKind::Xfs)
}

impl FakeXfsQuota {
    /// The hard block limit of a project, in KiB, if one is set.
    pub(crate) fn limit_kib(&self, id: u32) -> Option<u64> {
        self.limits_kib.lock().unwrap().get(&id).copied()
    }
}

fn backend_with(runner: Arc<dyn ToolRunner>, kind: FilesystemKind) -> Xfs {
    Xfs {
        runner,
        commands: Commands {
            mount_point: MOUNT.to_owned(),
            kind,
        },
        ids: 1000..=1999,
        in_use: Mutex::new(BTreeSet::new()),
    }
}

fn backend() -> (Arc<MockToolRunner>, Xfs) {
    let runner = Arc::new(MockToolRunner::default());
    let xfs = backend_with(runner.clone(), FilesystemKind::Xfs);
    (runner, xfs)
}

fn a_directory() -> (tempfile::TempDir, std::fs::File) {
    let dir = tempfile::tempdir().unwrap();
    let fd = std::fs::File::open(dir.path()).unwrap();
    (dir, fd)
}

fn target_of(fd: &std::fs::File) -> String {
    path_through_fd(fd.as_fd(), Some(".")).display().to_string()
}

/// A line as `quota -p -v -N -n -b -i` prints it.
fn quota_line(used_kib: u64, hard_kib: u64, inodes: u64) -> String {
    format!(
        "/dev/sdb1           {used_kib:>10} {:>10} {hard_kib:>10}   00 [--------] {inodes:>10} {:>10} {:>10}   00 [--------] {MOUNT}\n",
        0, 0, 0
    )
}

fn checked(target: &str, id: u32) -> String {
    format!(
        "Checking project {id} (path {target})...\n\
         Processed 1 (/dev/null and cmdline) paths for project {id} with recursion depth infinite (-1).\n"
    )
}

fn failed(command: &str, stderr: &str) -> ToolError {
    ToolError::Failed {
        command: command.to_owned(),
        status: "exit status: 1".to_owned(),
        stderr: stderr.to_owned(),
    }
}

/// The replies of a creation that goes through, for the mock's queue.
fn queue_successful_creation(runner: &MockToolRunner, target: &str, id: u32, hard_kib: u64) {
    runner
        .reply(Ok(""))
        .reply(Ok(""))
        .reply(Ok(&checked(target, id)))
        .reply(Ok(""))
        .reply(Ok(&quota_line(0, hard_kib, 1)));
}

#[test]
fn creating_tags_the_directory_then_limits_and_reads_both_back() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    let target = target_of(&fd);
    queue_successful_creation(&runner, &target, 1000, 1024);

    assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1000);
    assert_eq!(
        runner.calls(),
        [
            format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
            format!("xfs_quota -x -D /dev/null -c project -s -p {target} 1000 {MOUNT}"),
            format!("xfs_quota -x -D /dev/null -c project -c -p {target} 1000 {MOUNT}"),
            format!("xfs_quota -x -c limit -p bhard=1048576 1000 {MOUNT}"),
            format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
        ]
    );
    // The tool reaches the very directory the agent holds open, not a symlink to it.
    assert!(target.ends_with("/."), "{target}");
    assert!(
        target.starts_with(&format!("/proc/{}/fd/", std::process::id())),
        "{target}"
    );
}

#[test]
fn ext4_is_driven_in_foreign_mode() {
    let runner = Arc::new(MockToolRunner::default());
    let xfs = backend_with(runner.clone(), FilesystemKind::Ext4);
    runner.reply(Ok(""));
    xfs.release(1234).unwrap();
    assert_eq!(
        runner.calls(),
        [format!(
            "xfs_quota -x -f -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1234 {MOUNT}"
        )]
    );
}

#[test]
fn limits_are_whole_kib_and_never_zero() {
    assert_eq!(limit_bytes(0), 1024);
    assert_eq!(limit_bytes(1), 1024);
    assert_eq!(limit_bytes(1024), 1024);
    assert_eq!(limit_bytes(1025), 2048);
    assert_eq!(limit_bytes(5 << 30), 5 << 30);
    let huge = limit_bytes(u64::MAX);
    assert!(
        i64::try_from(huge).is_ok() && huge.is_multiple_of(1024),
        "{huge}"
    );
}

#[test]
fn resizing_sets_the_hard_limit_and_reads_it_back() {
    let (runner, xfs) = backend();
    // 3 GiB plus one byte is rounded up to the next KiB; the kernel may round further
    // up to a whole filesystem block (4 KiB here).
    let capacity = (3 << 30) + 1;
    runner
        .reply(Ok(""))
        .reply(Ok(&quota_line(52, (3 << 20) + 4, 7)));
    xfs.set_limit(1007, capacity).unwrap();
    assert_eq!(
        runner.calls(),
        [
            format!("xfs_quota -x -c limit -p bhard=3221226496 1007 {MOUNT}"),
            format!("xfs_quota -x -c quota -p -v -N -n -b -i 1007 {MOUNT}"),
        ]
    );
}

#[test]
fn a_limit_that_does_not_read_back_is_an_error() {
    let (runner, xfs) = backend();
    // The tool exits 0 without setting anything when it cannot find the mount.
    runner.reply(Ok("")).reply(Ok(""));
    let err = xfs.set_limit(1007, 1 << 20).unwrap_err();
    assert!(matches!(err, XfsError::NotApplied { .. }), "{err}");
    assert!(err.to_string().contains("reads nothing"), "{err}");

    runner.reply(Ok("")).reply(Ok(&quota_line(0, 512, 0)));
    let err = xfs.set_limit(1007, 1 << 20).unwrap_err();
    assert!(
        err.to_string()
            .contains("reads 524288 bytes instead of 1048576"),
        "{err}"
    );
}

#[test]
fn usage_comes_from_the_quota_report_in_kib() {
    let (runner, xfs) = backend();
    runner.reply(Ok(&quota_line(2_097_152, 4_194_304, 4812)));
    assert_eq!(
        xfs.usage(1003).unwrap(),
        VolumeUsage {
            used_bytes: 2 << 30,
            used_inodes: 4812,
        }
    );
    assert_eq!(
        runner.calls(),
        [format!(
            "xfs_quota -x -c quota -p -v -N -n -b -i 1003 {MOUNT}"
        )]
    );
}

#[test]
fn usage_without_a_record_or_with_garbage_is_an_error() {
    let (runner, xfs) = backend();
    runner.reply(Ok(""));
    let err = xfs.usage(1003).unwrap_err();
    assert!(
        err.to_string().contains("no quota record for project 1003"),
        "{err}"
    );
    runner.reply(Ok("Disk quotas for Project #1003 (1003)\n"));
    let err = xfs.usage(1003).unwrap_err();
    assert!(matches!(err, XfsError::UnexpectedOutput { .. }), "{err}");
}

#[test]
fn release_clears_every_limit_and_frees_the_id() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    let target = target_of(&fd);
    queue_successful_creation(&runner, &target, 1000, 1024);
    assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1000);

    xfs.release(1000).unwrap();
    assert_eq!(
        runner.calls().last().unwrap(),
        &format!("xfs_quota -x -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1000 {MOUNT}")
    );
    queue_successful_creation(&runner, &target, 1000, 1024);
    assert_eq!(
        xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(),
        1000,
        "a freed id is reused"
    );
}

#[test]
fn a_failed_release_keeps_the_id_reserved() {
    let (runner, xfs) = backend();
    xfs.mark_in_use([1000]);
    runner.reply(Err(failed(
        "xfs_quota",
        "xfs_quota: cannot set limits: Input/output error",
    )));
    let err = xfs.release(1000).unwrap_err();
    assert!(err.to_string().contains("Input/output error"), "{err}");
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1001);
}

#[test]
fn ids_are_the_lowest_free_ones_in_the_range() {
    let (_runner, xfs) = backend();
    xfs.mark_in_use([1000, 1001, 1003, 5]);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1002);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1004);
    xfs.free(1001);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1001);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1005);
}

#[test]
fn exhausted_ids_are_a_clear_error() {
    let runner = Arc::new(MockToolRunner::default());
    let xfs = Xfs {
        ids: 7..=8,
        ..backend_with(runner.clone(), FilesystemKind::Xfs)
    };
    xfs.mark_in_use([7]);
    let (_dir, fd) = a_directory();
    queue_successful_creation(&runner, &target_of(&fd), 8, 4);
    assert_eq!(xfs.limit_new(fd.as_fd(), 4096).unwrap(), 8);

    let calls_before = runner.calls().len();
    let err = xfs.limit_new(fd.as_fd(), 4096).unwrap_err();
    assert!(matches!(err, XfsError::IdsExhausted { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "every project id in 7-8 is in use; widen the configured id range"
    );
    assert_eq!(runner.calls().len(), calls_before, "nothing was run");
}

#[test]
fn ids_charged_on_the_filesystem_are_skipped_this_time() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    let target = target_of(&fd);
    // Id 1000 has files charged to it that no volume of the agent accounts for.
    runner.reply(Ok(&quota_line(8, 0, 2)));
    queue_successful_creation(&runner, &target, 1001, 1024);
    assert_eq!(xfs.limit_new(fd.as_fd(), 1 << 20).unwrap(), 1001);
    assert_eq!(
        runner.calls()[..2],
        [
            format!("xfs_quota -x -c quota -p -v -N -n -b -i 1000 {MOUNT}"),
            format!("xfs_quota -x -c quota -p -v -N -n -b -i 1001 {MOUNT}"),
        ]
    );
    // Not kept: the charge may be a deleted volume's files still being freed.
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1002);
}

#[test]
fn running_out_while_skipping_charged_ids_frees_them() {
    let runner = Arc::new(MockToolRunner::default());
    let xfs = Xfs {
        ids: 7..=8,
        ..backend_with(runner.clone(), FilesystemKind::Xfs)
    };
    runner
        .reply(Ok(&quota_line(4, 0, 1)))
        .reply(Ok(&quota_line(0, 0, 3)));
    let (_dir, fd) = a_directory();
    let err = xfs.limit_new(fd.as_fd(), 4096).unwrap_err();
    assert!(matches!(err, XfsError::IdsExhausted { .. }), "{err}");
    assert_eq!(runner.calls().len(), 2, "only the two lookups ran");
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 7);
}

#[test]
fn a_failed_limit_undoes_the_tag_and_frees_the_id() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    let target = target_of(&fd);
    runner
        .reply(Ok(""))
        .reply(Ok(""))
        .reply(Ok(&checked(&target, 1000)))
        .reply(Err(failed(
            "xfs_quota",
            "xfs_quota: cannot set limits: Function not implemented",
        )));
    let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
    assert!(
        err.to_string().contains("Function not implemented"),
        "{err}"
    );
    assert_eq!(
        runner.calls()[4..],
        [
            format!("xfs_quota -x -c limit -p bsoft=0 bhard=0 isoft=0 ihard=0 1000 {MOUNT}"),
            format!("xfs_quota -x -D /dev/null -c project -C -p {target} 1000 {MOUNT}"),
        ]
    );
    assert_eq!(
        xfs.reserve_lowest_free().unwrap(),
        1000,
        "the id is free again"
    );
}

#[test]
fn a_tag_that_did_not_take_is_undone_and_the_id_freed() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    let target = target_of(&fd);
    runner.reply(Ok("")).reply(Ok("")).reply(Ok(&format!(
        "Checking project 1000 (path {target})...\n\
         {target} - project identifier is not set (inode=0, tree=1000)\n\
         {target} - project inheritance flag is not set\n\
         Processed 1 (/dev/null and cmdline) paths for project 1000 with recursion depth infinite (-1).\n"
    )));
    let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
    assert!(matches!(err, XfsError::NotApplied { .. }), "{err}");
    assert!(
        err.to_string()
            .contains("project identifier is not set (inode=0, tree=1000)"),
        "{err}"
    );
    assert_eq!(
        runner.calls()[3..],
        [format!(
            "xfs_quota -x -D /dev/null -c project -C -p {target} 1000 {MOUNT}"
        )],
        "no limit was set, so none is cleared"
    );
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);

    // A check that never visited the path (stdout empty, complaint on stderr only).
    let (runner, xfs) = backend();
    runner.reply(Ok("")).reply(Ok("")).reply(Ok(""));
    let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
    assert!(err.to_string().contains("was not checked"), "{err}");
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
}

#[test]
fn a_failing_quota_lookup_frees_the_id() {
    let (runner, xfs) = backend();
    let (_dir, fd) = a_directory();
    runner.reply(Err(ToolError::TimedOut {
        command: "xfs_quota".into(),
        seconds: 30,
    }));
    let err = xfs.limit_new(fd.as_fd(), 1 << 20).unwrap_err();
    assert!(
        matches!(err, XfsError::Tool(ToolError::TimedOut { .. })),
        "{err}"
    );
    assert_eq!(runner.calls().len(), 1);
    assert_eq!(xfs.reserve_lowest_free().unwrap(), 1000);
}

/// A stand-in for xfs_quota that keeps tags and limits, so that creations from many
/// threads at once can run through the real command sequence.
#[derive(Debug, Default)]
pub(crate) struct FakeXfsQuota {
    limits_kib: Mutex<HashMap<u32, u64>>,
    tags: Mutex<HashMap<String, u32>>,
    /// Project ids whose next limit command fails.
    failing_limits: Mutex<BTreeSet<u32>>,
}

impl ToolRunner for FakeXfsQuota {
    fn run(&self, command: &ToolCommand) -> Result<String, ToolError> {
        // Lets other threads in between the steps of a creation.
        std::thread::yield_now();
        let position = command.args.iter().position(|a| a == "-c").unwrap();
        let words: Vec<&str> = command.args[position + 1].split(' ').collect();
        let id: u32 = words.last().unwrap().parse().unwrap();
        match words[..] {
            ["quota", ..] => Ok(self
                .limits_kib
                .lock()
                .unwrap()
                .get(&id)
                .map(|kib| quota_line(0, *kib, 1))
                .unwrap_or_default()),
            ["limit", "-p", bhard, _] => {
                if self.failing_limits.lock().unwrap().remove(&id) {
                    return Err(failed("xfs_quota", "cannot set limits"));
                }
                let bytes: u64 = bhard.strip_prefix("bhard=").unwrap().parse().unwrap();
                self.limits_kib.lock().unwrap().insert(id, bytes / 1024);
                Ok(String::new())
            }
            ["limit", "-p", "bsoft=0", "bhard=0", "isoft=0", "ihard=0", _] => {
                self.limits_kib.lock().unwrap().remove(&id);
                Ok(String::new())
            }
            ["project", "-s", "-p", target, _] => {
                // Keyed by the descriptor path, which a later directory may reuse.
                self.tags.lock().unwrap().insert(target.to_owned(), id);
                Ok(String::new())
            }
            ["project", "-c", "-p", target, _] => {
                assert_eq!(self.tags.lock().unwrap().get(target), Some(&id));
                Ok(checked(target, id))
            }
            ["project", "-C", "-p", target, _] => {
                self.tags.lock().unwrap().remove(target);
                Ok(String::new())
            }
            _ => panic!("unexpected command {command}"),
        }
    }
}

#[test]
fn concurrent_creations_never_share_an_id() {
    const THREADS: usize = 16;
    const PER_THREAD: usize = 8;
    let fake = Arc::new(FakeXfsQuota::default());
    // Some creations fail half-way, freeing their id while others allocate.
    fake.failing_limits
        .lock()
        .unwrap()
        .extend([1003, 1010, 1050]);
    let xfs = backend_with(fake.clone(), FilesystemKind::Xfs);
    xfs.mark_in_use([1001, 1020]);
    let start = std::sync::Barrier::new(THREADS);
    let ids: Vec<u32> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..THREADS)
            .map(|_| {
                scope.spawn(|| {
                    let dirs: Vec<_> = (0..PER_THREAD).map(|_| a_directory()).collect();
                    start.wait();
                    dirs.iter()
                        .filter_map(|(_, fd)| xfs.limit_new(fd.as_fd(), 1 << 20).ok())
                        .collect::<Vec<u32>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().unwrap())
            .collect()
    });
    let distinct: BTreeSet<u32> = ids.iter().copied().collect();
    assert_eq!(
        distinct.len(),
        ids.len(),
        "an id was handed out twice: {ids:?}"
    );
    assert_eq!(
        ids.len(),
        THREADS * PER_THREAD - 3,
        "only the three injected failures fail"
    );
    assert!(!distinct.contains(&1001) && !distinct.contains(&1020));
    // Ids freed by a failure went to later creations.
    assert!(distinct.contains(&1003) && distinct.contains(&1010));
    // Each created volume holds exactly its own tag and limit; failures left nothing.
    let tags = fake.tags.lock().unwrap();
    let tagged: BTreeSet<u32> = tags.values().copied().collect();
    assert_eq!(tagged, distinct);
    assert_eq!(tags.len(), distinct.len());
    let limited: BTreeSet<u32> = fake.limits_kib.lock().unwrap().keys().copied().collect();
    assert_eq!(limited, distinct);
}

#[test]
fn probe_accepts_only_enforced_project_quotas() {
    let filesystem = |kind| QuotaFilesystem {
        mount_point: MOUNT.to_owned(),
        device: "/dev/sdb1".to_owned(),
        kind,
    };
    let probe_with = |kind, reply: Result<&str, ToolError>| {
        let runner = Arc::new(MockToolRunner::default());
        runner.reply(reply);
        let result = Xfs::on_filesystem(runner.clone(), filesystem(kind), 1000..=1999);
        (runner.calls(), result.map(|_| ()))
    };

    let on = "Project quota state on /srv/export (/dev/sdb1)\n  Accounting: ON\n  Enforcement: ON\n  \
              Inode: #131 (2 blocks, 2 extents)\nBlocks grace time: [7 days]\nBlocks max warnings: 5\n\
              Inodes grace time: [7 days]\nInodes max warnings: 5\nRealtime Blocks grace time: [7 days]\n";
    let (calls, result) = probe_with(FilesystemKind::Xfs, Ok(on));
    assert_eq!(result, Ok(()));
    assert_eq!(calls, [format!("xfs_quota -x -c state -p -v {MOUNT}")]);

    // What xfsprogs 6.1 prints for a filesystem mounted without prjquota.
    let (_, result) = probe_with(
        FilesystemKind::Xfs,
        Ok("Project quota are not enabled on /dev/sdb1\n"),
    );
    let err = result.unwrap_err();
    assert!(err.starts_with("project quotas are not enabled on /srv/export (/dev/sdb1, XFS): mount it with -o prjquota"), "{err}");

    let counted_only = on.replace("Enforcement: ON", "Enforcement: OFF");
    let (_, result) = probe_with(FilesystemKind::Xfs, Ok(&counted_only));
    let err = result.unwrap_err();
    assert!(err.contains("counted but not enforced"), "{err}");
    assert!(
        err.contains("xfs_quota -x -c 'enable -p' /srv/export"),
        "{err}"
    );

    let off = on
        .replace("Accounting: ON", "Accounting: OFF")
        .replace("Enforcement: ON", "Enforcement: OFF");
    let (_, result) = probe_with(FilesystemKind::Xfs, Ok(&off));
    assert!(result.unwrap_err().contains("not enabled"));

    let (calls, result) = probe_with(
        FilesystemKind::Ext4,
        Ok("Project quota are not enabled on /dev/sdb1\n"),
    );
    assert_eq!(calls, [format!("xfs_quota -x -f -c state -p -v {MOUNT}")]);
    assert!(result.unwrap_err().contains("tune2fs -O project,quota"));

    let (_, result) = probe_with(FilesystemKind::Xfs, Ok(""));
    assert!(
        result
            .unwrap_err()
            .contains("does not recognise /srv/export"),
        "empty output means the tool did not find the mount"
    );

    let (_, result) = probe_with(
        FilesystemKind::Xfs,
        Err(ToolError::NotStarted {
            command: "xfs_quota -x -c state -p -v /srv/export".into(),
            reason: "No such file or directory (os error 2)".into(),
        }),
    );
    assert_eq!(
        result.unwrap_err(),
        "cannot run xfs_quota (No such file or directory (os error 2)); install xfsprogs"
    );

    let (_, result) = probe_with(
        FilesystemKind::Xfs,
        Err(failed("xfs_quota", "line one\nline two")),
    );
    let err = result.unwrap_err();
    assert!(!err.contains('\n'), "{err}");
}

#[test]
fn probe_refuses_other_filesystems_in_one_line() {
    let runner = Arc::new(MockToolRunner::default());
    let err = Xfs::probe(runner.clone(), Path::new("/proc"), 1000..=1999).unwrap_err();
    assert!(
        err.starts_with("export root /proc is on proc, not XFS or ext4"),
        "{err}"
    );
    assert!(err.contains("mounted with prjquota"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    assert!(runner.calls().is_empty());

    assert_eq!(filesystem_kind(0x5846_5342), Some(FilesystemKind::Xfs));
    assert_eq!(filesystem_kind(0xEF53), Some(FilesystemKind::Ext4));
    assert_eq!(filesystem_kind(0x9123_683E), None, "btrfs");

    let err = Xfs::probe(runner, Path::new("/no/such/export"), 1000..=1999).unwrap_err();
    assert!(err.starts_with("export root /no/such/export: "), "{err}");
}

#[test]
fn unusable_id_ranges_are_refused() {
    assert!(check_id_range(&(0..=10)).unwrap_err().contains("id 0"));
    #[allow(clippy::reversed_empty_ranges)]
    let empty = 10..=9;
    assert!(check_id_range(&empty).unwrap_err().contains("empty"));
    assert!(
        check_id_range(&(1..=u32::MAX))
            .unwrap_err()
            .contains("4294967295")
    );
    assert_eq!(check_id_range(&(1..=u32::MAX - 1)), Ok(()));
}
