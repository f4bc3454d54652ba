//! Attacks by tenants, who can write anything inside their own volume: a tree deep enough
//! to overflow a recursive walk, forged volume records in extended attributes, and a
//! mount inside a volume. Each runs against the real agent binary over real HTTPS.

mod common;

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use common::agent_process::{Setup, setup};
use common::{BindMount, is_root, wait_for};
use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{CreateVolumeRequest, ErrorCode, Mode, VolumeOwner, VolumePath};
use rustix::fs::{Mode as FileMode, OFlags, XattrFlags};

/// Deeper than any recursive walk survives on a default thread stack.
const DEEP: usize = 50_000;
const LEGACY_XATTR: &str = "user.nfsprov.volume";

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

fn request(owner: &str) -> CreateVolumeRequest {
    CreateVolumeRequest {
        capacity_bytes: 1 << 30,
        mode: Mode::new(0o770).unwrap(),
        owner: VolumeOwner {
            pvc_namespace: Some("tenants".into()),
            pvc_name: Some(owner.into()),
            pv_name: Some(format!("pvc-{owner}")),
        },
        ..Default::default()
    }
}

/// Makes a chain of `levels` directories below `top`, one descriptor at a time, with a
/// file at every thousandth level.
fn deep_chain(top: &Path, levels: usize) {
    let mut dir: OwnedFd = rustix::fs::open(
        top,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        FileMode::empty(),
    )
    .unwrap();
    for level in 0..levels {
        rustix::fs::mkdirat(&dir, "d", FileMode::from_raw_mode(0o755)).unwrap();
        if level % 1000 == 0 {
            let file = rustix::fs::openat(
                &dir,
                "f",
                OFlags::WRONLY | OFlags::CREATE | OFlags::CLOEXEC,
                FileMode::from_raw_mode(0o644),
            )
            .unwrap();
            rustix::io::write(&file, b"tenant data").unwrap();
        }
        dir = rustix::fs::openat(
            &dir,
            "d",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            FileMode::empty(),
        )
        .unwrap();
    }
}

/// Removes an export root holding a deep tree when a test ends, wherever the agent left
/// the tree (in place, in its trash): the temporary directory's own cleanup recurses and
/// would overflow the test's stack.
struct DeepTree<'a>(&'a Path);

impl Drop for DeepTree<'_> {
    fn drop(&mut self) {
        let (Some(parent), Some(name)) = (self.0.parent(), self.0.file_name()) else {
            return;
        };
        if let Ok(parent) = rustix::fs::open(
            parent,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            FileMode::empty(),
        ) {
            let _ = nfsprov_agent::store::remove_tree(parent.as_fd(), &name.to_string_lossy());
        }
    }
}

fn forge(dir: &Path, value: &[u8]) {
    let fd = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        FileMode::empty(),
    )
    .unwrap();
    rustix::fs::fsetxattr(fd.as_fd(), LEGACY_XATTR, value, XattrFlags::empty()).unwrap();
}

/// The largest attribute the filesystem takes, past the 4 KB earlier agents read
/// (XFS and btrfs take more; ext4 stops just short of 4 KB).
fn oversize(dir: &Path) {
    let taken = [65_000, 16_000, 6_000, 3_900].into_iter().find(|&size| {
        rustix::fs::setxattr(dir, LEGACY_XATTR, &vec![b'{'; size], XattrFlags::empty()).is_ok()
    });
    assert!(taken.is_some(), "no oversized attribute could be set");
}

fn has_xattr(dir: &Path) -> bool {
    let mut buf = vec![0u8; 8192];
    rustix::fs::getxattr(dir, LEGACY_XATTR, &mut buf[..]).is_ok()
}

fn api_code(error: &ClientError) -> Option<ErrorCode> {
    error.code()
}

/// The agent process, killed when dropped (also when a test fails).
struct Process(std::process::Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

struct Running {
    setup: Setup,
    _process: Process,
}

impl Running {
    async fn start(setup: Setup) -> Self {
        let process = Process(setup.spawn());
        let running = Self {
            setup,
            _process: process,
        };
        running.setup.wait_healthy(&running.setup.client()).await;
        running
    }

    fn client(&self) -> nfsprov_api_types::client::AgentClient {
        self.setup.client()
    }

    fn root(&self) -> &Path {
        &self.setup.root
    }

    /// Kills the agent (as a crash would) and hands back its setup for the next start.
    fn stop(self) -> Setup {
        self.setup
    }
}

#[tokio::test]
async fn a_fifty_thousand_level_tree_is_measured_and_deleted() {
    let agent = Running::start(setup()).await;
    let client = agent.client();
    client
        .create_volume(&path("tenants/deep"), &request("deep"), None)
        .await
        .unwrap();
    let root = agent.root().to_owned();
    let _cleanup = DeepTree(&root);
    deep_chain(&root.join("tenants/deep"), DEEP);

    // The usage walk stops at its depth bound instead of failing or exhausting descriptors.
    let volume = client
        .get_volume(&path("tenants/deep"), None)
        .await
        .unwrap()
        .expect("the volume is there");
    assert!(volume.usage.is_some(), "usage is measured: {volume:?}");

    client
        .delete_volume(&path("tenants/deep"), None)
        .await
        .expect("a deep tree is deleted");
    assert!(!agent.root().join("tenants/deep").exists());
    assert_eq!(
        agent.setup.trash_entries(),
        0,
        "nothing is left in the trash"
    );
    // The agent is still serving.
    client.healthz().await.unwrap();
}

#[tokio::test]
async fn an_agent_restarted_with_a_deep_tree_in_its_trash_starts_and_purges_it() {
    // A first run lays out the agent's areas; then a crash leaves a deep tree in the trash.
    let first = Running::start(setup()).await;
    let setup = first.stop();
    let doomed = setup.root.join(".nfsprov/trash/del-left-by-a-crash");
    std::fs::create_dir(&doomed).unwrap();
    deep_chain(&doomed, DEEP);
    let root = setup.root.clone();

    let agent = Running::start(setup).await;
    // Dropped before the agent and its temporary directory.
    let _cleanup = DeepTree(&root);
    wait_for(
        "the deep trash entry to be purged",
        Duration::from_secs(120),
        || agent.setup.trash_entries() == 0,
    )
    .await;
    agent.client().healthz().await.unwrap();
}

#[tokio::test]
async fn a_trash_entry_that_cannot_be_removed_is_counted_and_the_agent_serves() {
    assert!(
        is_root(),
        "bind mounts need root; run the agent's tests as root (CI does)"
    );
    let first = Running::start(setup()).await;
    let setup = first.stop();
    // A crash left a tree in the trash that holds a mount: the purge must not cross it.
    let doomed = setup.root.join(".nfsprov/trash/del-holding-a-mount");
    let point = doomed.join("mnt");
    std::fs::create_dir_all(&point).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"not the tenant's").unwrap();
    let _mounted = BindMount::new(outside.path(), &point);

    let agent = Running::start(setup).await;
    agent.client().healthz().await.unwrap();
    let scraped = agent.setup.metrics().await;
    assert!(
        scraped.contains("nfsprov_agent_leftover_entries 1\n"),
        "{scraped}"
    );
    assert!(outside.path().join("precious").exists());
}

#[tokio::test]
async fn forged_or_oversized_records_change_nothing_and_break_no_listing() {
    let agent = Running::start(setup()).await;
    let client = agent.client();
    let original = client
        .create_volume(&path("tenants/a"), &request("a"), None)
        .await
        .unwrap()
        .volume;
    client
        .create_volume(&path("tenants/b"), &request("b"), None)
        .await
        .unwrap();
    let a = agent.root().join("tenants/a");

    // The tenant of `a` claims another owner, size and uid for its volume, plants a fake
    // volume inside it, and makes the record of `b`'s neighbour huge.
    let forged = serde_json::json!({
        "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
        "owner": {"pvc_namespace": "victims", "pvc_name": "x", "pv_name": "pvc-x"},
        "created_at": "2000-01-01T00:00:00Z"
    });
    forge(&a, forged.to_string().as_bytes());
    std::fs::create_dir(a.join("fake")).unwrap();
    forge(&a.join("fake"), forged.to_string().as_bytes());
    oversize(&agent.root().join("tenants/b"));

    let seen = client
        .get_volume(&path("tenants/a"), None)
        .await
        .unwrap()
        .expect("still a volume");
    assert_eq!(seen.owner, original.owner);
    assert_eq!(seen.capacity_bytes, original.capacity_bytes);
    assert_eq!(seen.uid, original.uid);

    let listed: Vec<String> = client
        .list_volumes(None)
        .await
        .expect("the listing answers")
        .into_iter()
        .map(|v| v.path.to_string())
        .collect();
    assert_eq!(listed, ["tenants/a", "tenants/b"]);

    let fake = client.get_volume(&path("tenants/a/fake"), None).await;
    assert!(
        matches!(&fake, Err(e) if api_code(e) == Some(ErrorCode::Conflict)),
        "a planted record inside a volume is no volume: {fake:?}"
    );

    // Another claim cannot adopt the volume by matching the forged record.
    let mut victim = request("x");
    victim.owner.pvc_namespace = Some("victims".into());
    victim.capacity_bytes = 1;
    let adopted = client
        .create_volume(&path("tenants/a"), &victim, None)
        .await;
    assert!(
        matches!(&adopted, Err(e) if api_code(e) == Some(ErrorCode::Conflict)),
        "{adopted:?}"
    );

    // Reclaiming still works.
    client
        .archive_volume(&path("tenants/b"), None, None)
        .await
        .expect("archive ignores the oversized attribute");
    client
        .delete_volume(&path("tenants/a"), None)
        .await
        .expect("delete ignores the forged attribute");
    assert!(!a.exists());
}

#[tokio::test]
async fn records_kept_the_old_way_are_migrated_at_start_once() {
    let setup = setup();
    // A volume as earlier agents laid it out: its record in an extended attribute, and a
    // tenant's planted attribute inside it.
    let old = setup.root.join("tenants/old");
    std::fs::create_dir_all(old.join("inner")).unwrap();
    let record = serde_json::json!({
        "mode": "0770", "uid": 0, "gid": 0, "capacity_bytes": 4096,
        "owner": {"pvc_namespace": "tenants", "pvc_name": "old", "pv_name": "pvc-old"},
        "created_at": "2026-01-01T00:00:00Z"
    });
    forge(&old, record.to_string().as_bytes());
    forge(&old.join("inner"), record.to_string().as_bytes());

    let agent = Running::start(setup).await;
    let client = agent.client();
    let volume = client
        .get_volume(&path("tenants/old"), None)
        .await
        .unwrap()
        .expect("the old volume is known after the migration");
    assert_eq!(volume.capacity_bytes, 4096);
    assert_eq!(volume.owner.pvc_name.as_deref(), Some("old"));
    assert!(!has_xattr(&old), "the old attribute is gone once migrated");
    assert!(
        client
            .get_volume(&path("tenants/old/inner"), None)
            .await
            .is_err(),
        "nothing below a volume is migrated"
    );

    // A directory that is not a volume (as a replaced provisioner's are, owned by their
    // tenants) gets the old attribute after the migration: it must stay foreign.
    let planted = agent.root().join("tenants/planted");
    std::fs::create_dir_all(&planted).unwrap();
    forge(&planted, record.to_string().as_bytes());

    // A second start finds nothing more to do and loses nothing.
    let agent = Running::start(agent.stop()).await;
    let foreign = agent
        .client()
        .get_volume(&path("tenants/planted"), None)
        .await;
    assert!(
        matches!(&foreign, Err(e) if api_code(e) == Some(ErrorCode::Conflict)),
        "an attribute planted after the migration makes no volume: {foreign:?}"
    );
    assert!(has_xattr(&planted), "and the agent did not even read it");
    let again = agent
        .client()
        .get_volume(&path("tenants/old"), None)
        .await
        .unwrap()
        .expect("still known");
    assert_eq!(again.capacity_bytes, 4096);
    let listed = agent.client().list_volumes(None).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
}

#[tokio::test]
async fn delete_refuses_a_volume_holding_a_bind_mount_and_touches_nothing_behind_it() {
    assert!(
        is_root(),
        "bind mounts need root; run the agent's tests as root (CI does)"
    );
    let agent = Running::start(setup()).await;
    let client = agent.client();
    client
        .create_volume(&path("tenants/m"), &request("m"), None)
        .await
        .unwrap();
    // A delete before the mount, so the agent holds the mount table from before it.
    client
        .create_volume(&path("tenants/before"), &request("before"), None)
        .await
        .unwrap();
    client
        .delete_volume(&path("tenants/before"), None)
        .await
        .unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), b"not the tenant's").unwrap();
    let point = agent.root().join("tenants/m/mnt");
    std::fs::create_dir(&point).unwrap();
    std::fs::write(agent.root().join("tenants/m/own-file"), b"tenant data").unwrap();
    let mounted = BindMount::new(outside.path(), &point);

    let refused = client.delete_volume(&path("tenants/m"), None).await;
    match &refused {
        Err(e) => {
            assert_eq!(api_code(e), Some(ErrorCode::Conflict), "{e}");
            assert!(e.to_string().contains("mount point"), "{e}");
        }
        Ok(()) => panic!("a volume holding a mount was deleted"),
    }
    assert!(outside.path().join("precious").exists());
    assert!(
        agent.root().join("tenants/m/own-file").exists(),
        "the volume stays whole"
    );

    drop(mounted);
    client
        .delete_volume(&path("tenants/m"), None)
        .await
        .expect("after the unmount, the delete goes through");
    assert!(outside.path().join("precious").exists());
    assert!(!agent.root().join("tenants/m").exists());
}
