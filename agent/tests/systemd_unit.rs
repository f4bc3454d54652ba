//! The shipped systemd unit is valid for this systemd and keeps its hardening.

use std::path::Path;
use std::process::Command;

const UNIT: &str = include_str!("../../deploy/agent/nfsprov-agent.service");
/// The drop-ins for the quota backends, with the highest exposure each may reach (on
/// systemd's 0-100 scale): btrfs and xfs add a capability and stay within 3.0; zfs lifts the
/// mount namespace and stays within 5.0; image lifts it too and adds loop devices and
/// three capabilities, within 5.5.
const DROP_INS: [(&str, &str, u32); 4] = [
    (
        "quota-btrfs.conf",
        include_str!("../../deploy/agent/quota-btrfs.conf"),
        30,
    ),
    (
        "quota-xfs.conf",
        include_str!("../../deploy/agent/quota-xfs.conf"),
        30,
    ),
    (
        "quota-zfs.conf",
        include_str!("../../deploy/agent/quota-zfs.conf"),
        50,
    ),
    (
        "quota-image.conf",
        include_str!("../../deploy/agent/quota-image.conf"),
        55,
    ),
];

/// A minimal root with the system's own units, the agent binary where the unit expects
/// it, and the unit itself, so `systemd-analyze --root` checks exactly what users install.
fn unit_root() -> tempfile::TempDir {
    unit_root_with(None)
}

/// As [`unit_root`], with one drop-in installed where users put it.
fn unit_root_with(drop_in: Option<(&str, &str)>) -> tempfile::TempDir {
    let root = tempfile::tempdir().unwrap();
    let bin = root.path().join("usr/local/bin");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::copy(
        env!("CARGO_BIN_EXE_nfsprov-agent"),
        bin.join("nfsprov-agent"),
    )
    .unwrap();
    let units = root.path().join("etc/systemd/system");
    std::fs::create_dir_all(&units).unwrap();
    std::fs::write(units.join("nfsprov-agent.service"), UNIT).unwrap();
    if let Some((name, text)) = drop_in {
        let dir = units.join("nfsprov-agent.service.d");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), text).unwrap();
    }
    let system_units = root.path().join("usr/lib/systemd");
    std::fs::create_dir_all(&system_units).unwrap();
    let copied = Command::new("cp")
        .args(["-r", "/lib/systemd/system"])
        .arg(&system_units)
        .status()
        .unwrap();
    assert!(copied.success());
    root
}

fn analyze(root: &Path, args: &[&str]) -> std::process::Output {
    Command::new("systemd-analyze")
        .args(args)
        .arg(format!("--root={}", root.display()))
        .arg("nfsprov-agent.service")
        .output()
        .expect("systemd-analyze (Debian package systemd) must be installed")
}

#[test]
fn unit_verifies_cleanly() {
    let root = unit_root();
    let output = analyze(root.path(), &["verify"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    // verify only warns about unknown keys or bad values; any output is a defect.
    assert!(stderr.trim().is_empty(), "{stderr}");
}

#[test]
fn unit_exposure_stays_low() {
    let root = unit_root();
    // The threshold is on systemd's internal 0-100 scale: 20 is an exposure of 2.0.
    let output = analyze(
        root.path(),
        &["security", "--offline=yes", "--threshold=20"],
    );
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "exposure above 2.0:\n{stdout}");
    assert!(stdout.contains("Overall exposure level"), "{stdout}");
}

#[test]
fn unit_keeps_the_promised_hardening() {
    for line in [
        "ProtectSystem=strict",
        "ReadWritePaths=/srv/nfs",
        "NoNewPrivileges=yes",
        "CapabilityBoundingSet=CAP_CHOWN CAP_FOWNER CAP_DAC_OVERRIDE CAP_DAC_READ_SEARCH",
        "PrivateTmp=yes",
        "ProtectHome=yes",
        "RestrictAddressFamilies=AF_INET AF_INET6",
        "SystemCallFilter=@system-service",
        "RestrictSUIDSGID=yes",
        "MemoryMax=512M",
    ] {
        assert!(UNIT.lines().any(|l| l == line), "missing {line}");
    }
}

#[test]
fn quota_drop_ins_verify_cleanly_and_keep_their_exposure_bounded() {
    for (name, text, threshold) in DROP_INS {
        let root = unit_root_with(Some((name, text)));
        let output = analyze(root.path(), &["verify"]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stderr.trim().is_empty(),
            "{name}: {stderr}"
        );
        let output = analyze(
            root.path(),
            &[
                "security",
                "--offline=yes",
                &format!("--threshold={threshold}"),
            ],
        );
        let stdout = String::from_utf8_lossy(&output.stdout);
        let overall = stdout
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or_default()
            .to_owned();
        assert!(output.status.success(), "{name}: {overall}\n{stdout}");
        println!("{name}: {overall}");
    }
}
