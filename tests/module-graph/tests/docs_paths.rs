//! The development guide names files and directories of the workspace as places to
//! change things: each one it names must exist, so that the guide cannot drift from the
//! tree unnoticed. A name is a code span starting with one of the workspace's top-level
//! directories; spans with placeholders (`<tool>`, `*`) name patterns, not paths.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .expect("the crate sits two levels below the workspace root")
        .to_owned()
}

const TOP_LEVEL: [&str; 8] = [
    "agent/",
    "api-types/",
    "controller/",
    "kubectl-plugin/",
    "vocabulary/",
    "tests/",
    "deploy/",
    "docs/",
];

/// The code spans of `text` that name a path of the workspace.
fn named_paths(text: &str) -> Vec<String> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .map(|span| span.trim_end_matches(['.', ',', ':']))
        .filter(|span| TOP_LEVEL.iter().any(|top| span.starts_with(top)))
        .filter(|span| !span.contains(['<', '*', ' ', '{', '(']))
        .map(|span| span.split('#').next().unwrap_or(span).to_owned())
        .collect()
}

#[test]
fn every_path_the_development_guide_names_exists() {
    let root = workspace_root();
    let guide = std::fs::read_to_string(root.join("docs/development.md")).unwrap();
    let named = named_paths(&guide);
    assert!(
        named.len() > 20,
        "the guide names only {} paths: is the extraction broken?",
        named.len()
    );
    let missing: Vec<&String> = named
        .iter()
        .filter(|path| !root.join(path).exists())
        .collect();
    assert!(
        missing.is_empty(),
        "docs/development.md names paths that do not exist: {missing:?}"
    );
}

#[test]
fn code_spans_with_placeholders_or_outside_the_workspace_are_not_paths() {
    let text = "see `agent/src/store.rs`, `agent/src/quota/<tool>/`, `cargo test`, `/etc/x` and `docs/a.md#anchor`.";
    assert_eq!(named_paths(text), vec!["agent/src/store.rs", "docs/a.md"]);
}
