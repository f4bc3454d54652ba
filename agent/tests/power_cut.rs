//! A power cut the moment each kind of operation is acknowledged, on ext4, XFS and
//! btrfs: the agent binary serves a loop-mounted filesystem, the image is copied without
//! any sync as the answer arrives, and an agent started on the mounted copy must show
//! every acknowledged result, with its data and record, and nothing half-made. Volumes
//! carry knfsd exports whose files lie on the same filesystem, and snapshots are taken by
//! each filesystem's method (copy on ext4, reflink on XFS, btrfs snapshot). Replicas are
//! received from an agent outside the cut filesystem, every other one built from the one
//! before, and must come back listed and whole, entry by entry. A few cuts per operation
//! here; `nfsprov-power-cut` runs many.
//!
//! The same again with the ganesha export manager and a real ganesha, over the
//! operations that make, change or remove an export: its directory of EXPORT blocks on
//! the cut filesystem must hold exactly the acknowledged exports, a ganesha booted from
//! the copy must serve them, and so must the agent started after it.
//!
//! And with image volumes (quota backend `image`) on XFS: the agent started on the copy
//! must mount each acknowledged volume from its own image in the copy, archives' and
//! snapshots' images must hold their files, and no image or record may be left that the
//! agent does not list; adoption and resize are not cut there ([`FsKind::skips`]).

use std::path::Path;

use nfsprov_agent_testkit::power_cut::{self, FsKind, Manager, Op};

const ITERATIONS: usize = 2;

fn agent_binary() -> String {
    std::env::var("NFSPROV_AGENT_BIN")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nfsprov-agent").to_owned())
}

async fn survives_power_cuts(test: &str, kind: FsKind, manager: Manager, ops: &[Op]) {
    if let Some(missing) = manager.missing() {
        nfsprov_test_skip::skip(test, &missing);
        return;
    }
    if let Some(missing) = kind.missing() {
        nfsprov_test_skip::skip(test, &missing);
        return;
    }
    let _ = rustls::crypto::ring::default_provider().install_default();
    let tallies = power_cut::run(Path::new(&agent_binary()), kind, manager, ops, ITERATIONS)
        .await
        .unwrap();
    let mut failures = Vec::new();
    for (op, tally) in &tallies {
        assert_eq!(tally.checked, ITERATIONS, "{kind} {op}");
        failures.extend(tally.failures.iter().cloned());
    }
    assert_eq!(tallies.len(), ops.len());
    assert!(
        failures.is_empty(),
        "acknowledged results lost in a power cut ({manager} exports):\n{}",
        failures.join("\n")
    );
}

#[tokio::test]
async fn acknowledged_operations_survive_a_power_cut_on_ext4() {
    survives_power_cuts(
        "acknowledged_operations_survive_a_power_cut_on_ext4",
        FsKind::Ext4,
        Manager::Knfsd,
        &Op::ALL,
    )
    .await;
}

#[tokio::test]
async fn acknowledged_operations_survive_a_power_cut_on_xfs() {
    survives_power_cuts(
        "acknowledged_operations_survive_a_power_cut_on_xfs",
        FsKind::Xfs,
        Manager::Knfsd,
        &Op::ALL,
    )
    .await;
}

#[tokio::test]
async fn acknowledged_operations_survive_a_power_cut_on_btrfs() {
    survives_power_cuts(
        "acknowledged_operations_survive_a_power_cut_on_btrfs",
        FsKind::Btrfs,
        Manager::Knfsd,
        &Op::ALL,
    )
    .await;
}

#[tokio::test]
async fn acknowledged_operations_survive_a_power_cut_on_image_volumes() {
    let ops: Vec<Op> = Op::ALL
        .into_iter()
        .filter(|op| FsKind::Image.skips(*op).is_none())
        .collect();
    survives_power_cuts(
        "acknowledged_operations_survive_a_power_cut_on_image_volumes",
        FsKind::Image,
        Manager::Knfsd,
        &ops,
    )
    .await;
}

#[tokio::test]
async fn acknowledged_exports_survive_a_power_cut_with_ganesha_on_ext4() {
    survives_power_cuts(
        "acknowledged_exports_survive_a_power_cut_with_ganesha_on_ext4",
        FsKind::Ext4,
        Manager::Ganesha,
        &Op::EXPORTING,
    )
    .await;
}

#[tokio::test]
async fn acknowledged_exports_survive_a_power_cut_with_ganesha_on_xfs() {
    survives_power_cuts(
        "acknowledged_exports_survive_a_power_cut_with_ganesha_on_xfs",
        FsKind::Xfs,
        Manager::Ganesha,
        &Op::EXPORTING,
    )
    .await;
}

/// Each volume a subvolume with a mount of its own, which a reboot loses: the agent
/// started on the copy must mount and export every one again.
#[tokio::test]
async fn acknowledged_exports_survive_a_power_cut_with_ganesha_on_btrfs() {
    survives_power_cuts(
        "acknowledged_exports_survive_a_power_cut_with_ganesha_on_btrfs",
        FsKind::Btrfs,
        Manager::Ganesha,
        &Op::EXPORTING,
    )
    .await;
}
