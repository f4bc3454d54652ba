//! The installed binary as kubectl runs it: help, version, and one-line errors with exit
//! status 2 when there is no cluster to ask. (Being an integration test of this package
//! also makes `cargo test --workspace` build the binary the end-to-end suite drives.)

use std::process::{Command, Output};

fn plugin(args: &[&str], kubeconfig: Option<&std::path::Path>) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kubectl-nfsprov"));
    command.args(args).env_remove("KUBECONFIG");
    if let Some(path) = kubeconfig {
        command.env("KUBECONFIG", path);
    }
    command.output().expect("the plugin binary runs")
}

#[test]
fn help_names_every_command() {
    let out = plugin(&["--help"], None);
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for command in [
        "status",
        "agents",
        "volumes",
        "doctor",
        "orphans",
        "archives",
        "snapshots",
        "restore",
    ] {
        assert!(help.contains(command), "{command} missing from:\n{help}");
    }
    assert!(help.contains("kubectl nfsprov"), "{help}");
}

#[test]
fn a_missing_kubeconfig_is_one_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = plugin(&["status", "--kubeconfig", missing.to_str().unwrap()], None);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.starts_with("error: "), "{stderr}");
    assert!(stderr.contains("cannot read the kubeconfig"), "{stderr}");
    assert!(stderr.contains("no-such-kubeconfig"), "{stderr}");
    assert!(out.stdout.is_empty(), "{out:?}");
}

#[test]
fn a_malformed_archive_id_is_refused_before_anything_is_asked() {
    // No kubeconfig at all: the id is checked first, so the error is about the id.
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = plugin(
        &[
            "archives",
            "delete",
            "nfs1",
            "../etc/@20261120T120000.000000000Z",
            "--kubeconfig",
            missing.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("is not an archive id"), "{stderr}");
}

#[test]
fn a_restore_to_no_claim_is_refused_before_anything_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-kubeconfig");
    let out = plugin(
        &[
            "restore",
            "nfs1",
            "team-a/data/@20261120T120000.000000000Z",
            "--to",
            "data-back",
            "--kubeconfig",
            missing.to_str().unwrap(),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("names no claim"), "{stderr}");
}

#[test]
fn an_unreachable_api_server_is_an_error_not_an_empty_report() {
    let dir = tempfile::tempdir().unwrap();
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\ncurrent-context: here\n\
             clusters: [{{name: here, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n\
             users: [{{name: me, user: {{}}}}]\n\
             contexts: [{{name: here, context: {{cluster: here, user: me}}}}]\n"
        ),
    )
    .unwrap();
    for command in ["status", "volumes", "doctor"] {
        let out = plugin(&[command, "-o", "json"], Some(&kubeconfig));
        assert_eq!(out.status.code(), Some(2), "{command}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.starts_with("error: "), "{command}: {stderr}");
        assert!(out.stdout.is_empty(), "{command}: {out:?}");
    }
}
