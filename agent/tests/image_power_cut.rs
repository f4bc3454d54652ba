//! A power cut the moment each operation on image volumes (quota backend `image`) is
//! acknowledged: the agent serves an export root on a loop-mounted XFS, and as soon as
//! an answer arrives the XFS image is copied as it is, with no sync of any kind (a read
//! of the image file sees exactly what the loop device has written, what a disk would
//! hold if the power went then). The copy is mounted (its log recovered, as at a reboot)
//! and an agent started on it, which must mount every acknowledged volume from its own
//! image in the copy and show each result with its content and record, and nothing
//! half-made: a create, a clone of a volume holding a file, a snapshot, a restore from
//! it, an archive and a delete.

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::PathBuf;
use std::process::Command;

use common::jobs::{clone_until_ready, restore_until_ready};
use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent_testkit::{LoopXfs, TestAgent};
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{
    CloneVolumeRequest, CreateSnapshotRequest, CreateVolumeRequest, Mode, QuotaBackend,
    QuotaPolicy, RestoreVolumeRequest, SnapshotName, VolumeOwner, VolumePath,
};

const MIB: u64 = 1 << 20;

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn image_settings() -> QuotaSettings {
    QuotaSettings {
        backend: QuotaBackend::Image,
        ..QuotaSettings::default()
    }
}

fn run(program: &str, args: &[&str]) {
    let out = Command::new(program).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{program} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What the disk holds at this moment, mounted as after a reboot, with an agent started
/// on it; everything is unmounted again when dropped.
struct AfterTheCut {
    agent: Option<TestAgent>,
    mount: PathBuf,
    root: PathBuf,
    _dir: tempfile::TempDir,
}

impl AfterTheCut {
    async fn take(original: &LoopXfs) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let copy = dir.path().join("copy.img");
        // A sparse copy of the bytes as the loop device wrote them: no sync first.
        run(
            "cp",
            &[
                "--sparse=always",
                original.image().to_str().unwrap(),
                copy.to_str().unwrap(),
            ],
        );
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount).unwrap();
        // The original is still mounted with the same UUID.
        run(
            "mount",
            &[
                "-o",
                "loop,nouuid",
                copy.to_str().unwrap(),
                mount.to_str().unwrap(),
            ],
        );
        let relative = original
            .root()
            .strip_prefix(original.mount_point())
            .unwrap()
            .to_owned();
        let root = mount.join(relative);
        let agent = TestAgent::start_with_quota(&root, image_settings())
            .await
            .unwrap();
        Self {
            agent: Some(agent),
            mount,
            root,
            _dir: dir,
        }
    }

    fn client(&self) -> AgentClient {
        self.agent.as_ref().unwrap().client()
    }

    async fn volumes(&self) -> BTreeSet<String> {
        self.client()
            .list_volumes(None)
            .await
            .unwrap()
            .into_iter()
            .map(|v| v.path.to_string())
            .collect()
    }

    /// The volume's directory in the copy, which must be its own filesystem.
    fn mounted(&self, volume: &str) -> PathBuf {
        let dir = self.root.join(volume);
        let root_dev = std::fs::metadata(&self.root).unwrap().dev();
        assert_ne!(
            std::fs::metadata(&dir).unwrap().dev(),
            root_dev,
            "{volume} is not mounted in the copy"
        );
        dir
    }
}

impl Drop for AfterTheCut {
    fn drop(&mut self) {
        drop(self.agent.take());
        // The volumes the agent mounted in the copy first, then the copy.
        let _ = Command::new("umount")
            .args(["-R", "--lazy"])
            .arg(&self.mount)
            .status();
    }
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn acknowledged_image_volume_operations_survive_a_power_cut() {
    const TEST: &str = "acknowledged_image_volume_operations_survive_a_power_cut";
    if !rustix::process::geteuid().is_root() {
        nfsprov_test_skip::skip(TEST, "needs root to loop-mount filesystems");
        return;
    }
    let original = match LoopXfs::new(2048, true) {
        Ok(fs) => fs,
        Err(e) => {
            nfsprov_test_skip::skip(TEST, &format!("no XFS loop filesystem: {e}"));
            return;
        }
    };
    let root = original.root();
    let agent = TestAgent::start_with_quota(&root, image_settings())
        .await
        .unwrap();
    let client = agent.client();
    let (a, b, c) = (path("team/a"), path("team/b"), path("team/c"));

    // Created: after the cut the volume is there, mounted, with its owner and mode.
    let create = CreateVolumeRequest {
        capacity_bytes: 64 * MIB,
        quota: QuotaPolicy::Enforce,
        mode: Mode::new(0o750).unwrap(),
        uid: Some(1234),
        gid: Some(5678),
        owner: VolumeOwner::default(),
        export: None,
    };
    client.create_volume(&a, &create, None).await.unwrap();
    {
        let cut = AfterTheCut::take(&original).await;
        assert_eq!(cut.volumes().await, names(&["team/a"]));
        let meta = std::fs::metadata(cut.mounted("team/a")).unwrap();
        assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
        assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    }

    // Cloned: the clone holds what the source held when it was frozen.
    std::fs::write(root.join("team/a/data"), b"written before the clone").unwrap();
    let clone = CloneVolumeRequest {
        source: a.clone(),
        capacity_bytes: 64 * MIB,
        owner: VolumeOwner::default(),
        quota: QuotaPolicy::Enforce,
        export: None,
    };
    clone_until_ready(&client, &b, &clone).await.unwrap();
    {
        let cut = AfterTheCut::take(&original).await;
        assert_eq!(cut.volumes().await, names(&["team/a", "team/b"]));
        assert_eq!(
            std::fs::read(cut.mounted("team/b").join("data")).unwrap(),
            b"written before the clone"
        );
    }

    // A snapshot, then a restore from it.
    let snapshot = SnapshotName::parse("snap").unwrap();
    let taken = client
        .create_snapshot(
            &snapshot,
            &CreateSnapshotRequest { source: b.clone() },
            None,
        )
        .await
        .unwrap();
    assert!(taken.ready);
    {
        let cut = AfterTheCut::take(&original).await;
        let kept = cut.client().get_snapshot(&snapshot, None).await.unwrap();
        assert!(kept.ready, "the snapshot is not kept ready: {kept:?}");
    }
    let restore = RestoreVolumeRequest {
        snapshot: Some(snapshot.clone()),
        archive: None,
        capacity_bytes: 64 * MIB,
        owner: VolumeOwner::default(),
        quota: QuotaPolicy::Enforce,
        export: None,
    };
    restore_until_ready(&client, &c, &restore).await.unwrap();
    {
        let cut = AfterTheCut::take(&original).await;
        assert_eq!(cut.volumes().await, names(&["team/a", "team/b", "team/c"]));
        assert_eq!(
            std::fs::read(cut.mounted("team/c").join("data")).unwrap(),
            b"written before the clone"
        );
    }

    // Archived, then deleted: gone from the volumes, the archive kept.
    client.archive_volume(&b, None, None).await.unwrap();
    client.delete_volume(&a, None).await.unwrap();
    {
        let cut = AfterTheCut::take(&original).await;
        assert_eq!(cut.volumes().await, names(&["team/c"]));
        let archives = cut.client().list_archives(None).await.unwrap();
        assert_eq!(archives.len(), 1, "{archives:?}");
        assert!(!cut.root.join("team/a").exists());
        assert!(!cut.root.join(".nfsprov/images/team/a.img").exists());
    }

    for volume in [&c] {
        client.delete_volume(volume, None).await.unwrap();
    }
    let id = client.list_archives(None).await.unwrap()[0].id.clone();
    client.delete_archive(&id, None).await.unwrap();
    client.delete_snapshot(&snapshot, None).await.unwrap();
}
