//! A client admitted to one volume forges file handles to reach another volume, the
//! filesystem's root and a file outside the export root (see `src/attack.rs`), from a
//! reserved port as root and from an unprivileged port as uid 65534. Each test makes
//! the volumes by one mechanism that claims to isolate, and fails if any forged handle
//! reaches its target. Root only: loop mounts and nfs-ganesha; the ZFS test also a
//! zfs-fuse pool, one at a time on the machine (`NFSPROV_SKIP_ZFS=1` skips it).
//!
//! Volumes that are directories of one filesystem, or btrfs subvolumes, do not isolate
//! (`nfsprov-isolation-probe dirs-ext4` shows every attack through): no test here
//! pretends otherwise, and one shows that the attacks do reach across such volumes, so
//! that a refusal elsewhere means the layout refused, not that the attacks are blunt.

use nfsprov_nfs_attack::attack::{EXPORT_B, Identity, attack, privileged_port_outcomes};
use nfsprov_nfs_attack::filesystems::FsKind;
use nfsprov_nfs_attack::layout::{Layout, Mechanism};
use nfsprov_nfs_attack::setup::SetupError;

/// Why this machine cannot run the attack, if it cannot.
fn unable() -> Option<String> {
    // /proc/self belongs to the effective uid of the process.
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0)
        .unwrap_or(false);
    if !root {
        return Some("needs root (loop mounts, nfs-ganesha)".into());
    }
    for tool in [
        "ganesha.nfsd",
        "dbus-daemon",
        "dbus-send",
        "mkfs.ext4",
        "mkfs.xfs",
    ] {
        let found = std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(tool).is_file()));
        if !found {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

fn assert_isolates(test: &str, mechanism: Mechanism) {
    if let Some(reason) = unable() {
        nfsprov_test_skip::skip(test, &reason);
        return;
    }
    let layout = match Layout::build(mechanism) {
        Ok(layout) => layout,
        Err(SetupError::Unavailable(reason)) => {
            nfsprov_test_skip::skip(test, &reason);
            return;
        }
        Err(e) => panic!("{}: {e}", mechanism.describe()),
    };
    assert_eq!(layout.volume_mounts(), 3, "each volume its own filesystem");
    let report = attack(
        &layout,
        &[Identity::ROOT_RESERVED, Identity::NOBODY_UNPRIVILEGED],
    )
    .unwrap();
    // Every attack, from each identity, was tried.
    assert_eq!(report.attacks.len(), 14, "{report}");
    let reached = report.reached();
    assert!(
        reached.is_empty(),
        "{}: forged handles reached their targets:\n{report}",
        mechanism.describe()
    );
}

/// What the agent ships: its store with quota backend `image` made the volumes, B a
/// clone of A.
#[test]
fn the_agents_image_volumes_refuse_every_forged_handle() {
    assert_isolates(
        "the_agents_image_volumes_refuse_every_forged_handle",
        Mechanism::AgentImages,
    );
}

/// What the agent ships with quota backend `zfs`: its store made the volumes, each a
/// dataset of a zfs-fuse pool, B a ZFS clone of A (same objects, same generations).
#[test]
fn the_agents_zfs_volumes_refuse_every_forged_handle() {
    const TEST: &str = "the_agents_zfs_volumes_refuse_every_forged_handle";
    if std::env::var("NFSPROV_SKIP_ZFS").as_deref() == Ok("1") {
        nfsprov_test_skip::skip(TEST, "NFSPROV_SKIP_ZFS=1");
        return;
    }
    assert_isolates(TEST, Mechanism::AgentZfs);
}

/// Directories of one ext4 filesystem, the layout of the agent's `none` backend: forged
/// handles reach the other tenant's volume and the file outside the export root.
#[test]
fn forged_handles_reach_across_directory_volumes() {
    const TEST: &str = "forged_handles_reach_across_directory_volumes";
    if let Some(reason) = unable() {
        nfsprov_test_skip::skip(TEST, &reason);
        return;
    }
    let layout = Layout::build(Mechanism::Directories(FsKind::Ext4)).unwrap();
    let report = attack(
        &layout,
        &[Identity::ROOT_RESERVED, Identity::NOBODY_UNPRIVILEGED],
    )
    .unwrap();
    assert_eq!(report.attacks.len(), 14, "{report}");
    assert!(
        report.reached().len() >= 12,
        "the attacks no longer reach across directory volumes:\n{report}"
    );
}

#[test]
fn ext4_images_refuse_every_forged_handle() {
    assert_isolates(
        "ext4_images_refuse_every_forged_handle",
        Mechanism::Images(FsKind::Ext4),
    );
}

#[test]
fn xfs_images_refuse_every_forged_handle() {
    assert_isolates(
        "xfs_images_refuse_every_forged_handle",
        Mechanism::Images(FsKind::Xfs),
    );
}

#[test]
fn a_reflinked_ext4_clone_with_its_own_uuid_refuses_every_forged_handle() {
    assert_isolates(
        "a_reflinked_ext4_clone_with_its_own_uuid_refuses_every_forged_handle",
        Mechanism::ReflinkClone {
            kind: FsKind::Ext4,
            new_uuid: true,
        },
    );
}

#[test]
fn a_reflinked_xfs_clone_with_its_own_uuid_refuses_every_forged_handle() {
    assert_isolates(
        "a_reflinked_xfs_clone_with_its_own_uuid_refuses_every_forged_handle",
        Mechanism::ReflinkClone {
            kind: FsKind::Xfs,
            new_uuid: true,
        },
    );
}

/// A clone that kept its original's UUID is one filesystem to ganesha: it will not
/// export the second (the safe failure, but a clone must get a UUID of its own).
#[test]
fn a_reflinked_clone_keeping_its_uuid_is_not_exported_at_all() {
    let test = "a_reflinked_clone_keeping_its_uuid_is_not_exported_at_all";
    if let Some(reason) = unable() {
        nfsprov_test_skip::skip(test, &reason);
        return;
    }
    for kind in [FsKind::Ext4, FsKind::Xfs] {
        let layout = Layout::build(Mechanism::ReflinkClone {
            kind,
            new_uuid: false,
        })
        .unwrap();
        match attack(&layout, &[Identity::ROOT_RESERVED]) {
            Err(SetupError::ExportsRefused { ids, log }) => {
                assert_eq!(ids, [EXPORT_B], "{log}");
                assert!(log.contains("resolve_posix_filesystem"), "{log}");
            }
            Err(other) => panic!("{kind:?}: {other}"),
            Ok(report) => {
                panic!("{kind:?}: ganesha served the clone beside its original:\n{report}")
            }
        }
    }
}

#[test]
fn an_export_requiring_a_reserved_port_refuses_an_unprivileged_one() {
    let test = "an_export_requiring_a_reserved_port_refuses_an_unprivileged_one";
    if let Some(reason) = unable() {
        nfsprov_test_skip::skip(test, &reason);
        return;
    }
    let layout = Layout::build(Mechanism::Images(FsKind::Ext4)).unwrap();
    let outcomes = privileged_port_outcomes(&layout).unwrap();
    let names = outcomes
        .reserved
        .expect("from a reserved port the volume lists");
    assert!(names.contains(&layout.a.file), "{names:?}");
    for refused in [
        outcomes.unprivileged_by_name,
        outcomes.unprivileged_by_handle,
    ] {
        let refusal = refused.expect_err("from an unprivileged port it must not");
        assert!(refusal.starts_with("NFS4ERR_"), "{refusal}");
    }
}
