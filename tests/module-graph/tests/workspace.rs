//! The check itself: no crate of this workspace has an import cycle between its modules.

use std::path::Path;

#[test]
fn no_crate_of_the_workspace_has_an_import_cycle() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../Cargo.toml")
        .canonicalize()
        .unwrap();
    let roots = nfsprov_module_graph::workspace_roots(&manifest).unwrap();
    assert!(roots.len() >= 5, "every member's crate roots: {roots:?}");
    let mut report = String::new();
    for root in &roots {
        let graph = nfsprov_module_graph::crate_graph(root).unwrap();
        for cycle in nfsprov_module_graph::cycles(&graph) {
            report.push_str(&format!("{}: {cycle}", root.display()));
        }
    }
    assert!(report.is_empty(), "{report}");
}

/// The controller and the agent declare their layers in their crate roots; both must
/// list every module once and keep to the order.
#[test]
fn the_controller_and_the_agent_keep_their_declared_layers() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut report = String::new();
    for krate in ["controller", "agent"] {
        let root = top.join(krate).join("src/lib.rs").canonicalize().unwrap();
        let graph = nfsprov_module_graph::crate_graph(&root).unwrap();
        for problem in nfsprov_module_graph::layer_problems(&graph).unwrap() {
            report.push_str(&format!("{krate}: {problem}\n"));
        }
    }
    assert!(report.is_empty(), "{report}");
}
