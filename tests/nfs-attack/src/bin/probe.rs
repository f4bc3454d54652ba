//! Runs the forged-handle attacks against one way of making volumes and prints what the
//! server let through: `nfsprov-isolation-probe MECHANISM` (root), where MECHANISM is
//! `dirs-ext4`, `dirs-xfs`, `images-ext4`, `images-xfs`, `clone-ext4`,
//! `clone-ext4-new-uuid`, `clone-xfs`, `clone-xfs-new-uuid`, `btrfs-subvolumes`, `zfs-datasets`,
//! `agent-images` or `agent-zfs` (volumes made by the agent's own store) or
//! `privileged-port`. A measurement, not a test: a layout that leaks is reported,
//! not failed.

use std::process::ExitCode;

use nfsprov_nfs_attack::attack::{Identity, attack, privileged_port_outcomes};
use nfsprov_nfs_attack::filesystems::FsKind;
use nfsprov_nfs_attack::layout::{Layout, Mechanism};

fn mechanism(name: &str) -> Option<Mechanism> {
    Some(match name {
        "dirs-ext4" => Mechanism::Directories(FsKind::Ext4),
        "dirs-xfs" => Mechanism::Directories(FsKind::Xfs),
        "images-ext4" => Mechanism::Images(FsKind::Ext4),
        "images-xfs" => Mechanism::Images(FsKind::Xfs),
        "clone-ext4" => Mechanism::ReflinkClone {
            kind: FsKind::Ext4,
            new_uuid: false,
        },
        "clone-ext4-new-uuid" => Mechanism::ReflinkClone {
            kind: FsKind::Ext4,
            new_uuid: true,
        },
        "clone-xfs" => Mechanism::ReflinkClone {
            kind: FsKind::Xfs,
            new_uuid: false,
        },
        "clone-xfs-new-uuid" => Mechanism::ReflinkClone {
            kind: FsKind::Xfs,
            new_uuid: true,
        },
        "btrfs-subvolumes" => Mechanism::BtrfsSubvolumes,
        "agent-images" => Mechanism::AgentImages,
        "agent-zfs" => Mechanism::AgentZfs,
        "zfs-datasets" => Mechanism::ZfsDatasets,
        _ => return None,
    })
}

fn main() -> ExitCode {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: nfsprov-isolation-probe MECHANISM (see the source's header)");
        return ExitCode::from(2);
    };
    let outcome = if name == "privileged-port" {
        Layout::build(Mechanism::Images(FsKind::Ext4)).and_then(|layout| {
            let outcomes = privileged_port_outcomes(&layout)?;
            println!("PrivilegedPort = true: {outcomes:#?}");
            Ok(())
        })
    } else {
        let Some(mechanism) = mechanism(&name) else {
            eprintln!("unknown mechanism {name}");
            return ExitCode::from(2);
        };
        Layout::build(mechanism).and_then(|layout| {
            let report = attack(
                &layout,
                &[Identity::ROOT_RESERVED, Identity::NOBODY_UNPRIVILEGED],
            )?;
            println!("# {}\n{report}", mechanism.describe());
            let reached = report.reached().len();
            println!(
                "{reached} of {} attacks reached their target",
                report.attacks.len()
            );
            Ok(())
        })
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
