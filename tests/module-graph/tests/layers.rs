//! The layer-order check on small crates written for each case.

mod common;

use common::write_crate;
use nfsprov_module_graph::{LayerProblem, crate_graph, layer_problems};

fn problems(files: &[(&str, &str)]) -> Vec<LayerProblem> {
    let (_dir, root) = write_crate(files);
    layer_problems(&crate_graph(&root).unwrap()).unwrap()
}

const LAYERED: &str = "//! Layers:\n//!\n//! 1. leaves: `leaf` (no `Other` word counts);\n//! 2. `middle`,\n//!    and `helper`;\n//! 3. `top`.\nmod leaf;\nmod middle;\nmod helper;\nmod top;\n";

#[test]
fn imports_downward_and_within_a_layer_pass() {
    let found = problems(&[
        ("src/lib.rs", LAYERED),
        ("src/leaf.rs", "pub fn l() {}\n"),
        (
            "src/middle.rs",
            "pub fn m() { crate::leaf::l(); crate::helper::h() }\n",
        ),
        ("src/helper.rs", "pub fn h() {}\n"),
        ("src/top.rs", "use crate::middle::m;\npub fn t() { m() }\n"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn an_upward_import_fails_naming_both_modules() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", LAYERED),
        ("src/leaf.rs", "pub fn l() {}\n"),
        ("src/middle.rs", "mod inner;\npub fn m() { inner::i() }\n"),
        // Two layers up, from a child module: the child is in its parent's layer.
        ("src/middle/inner.rs", "\npub fn i() { crate::top::t() }\n"),
        ("src/helper.rs", "pub fn h() {}\n"),
        ("src/top.rs", "pub fn t() {}\n"),
    ]);
    let found = layer_problems(&crate_graph(&root).unwrap()).unwrap();
    assert_eq!(found.len(), 1, "{found:?}");
    let LayerProblem::Upward {
        from,
        from_layer,
        to,
        to_layer,
        at,
    } = &found[0]
    else {
        panic!("expected an upward import, got {found:?}");
    };
    assert_eq!(
        (from.as_str(), *from_layer, to.as_str(), *to_layer),
        ("crate::middle::inner", 2, "crate::top", 3)
    );
    assert!(
        at.file.ends_with("src/middle/inner.rs") && at.line == 2,
        "{at}"
    );
    let message = found[0].to_string();
    assert!(
        message.contains("crate::middle::inner") && message.contains("crate::top"),
        "{message}"
    );
}

#[test]
fn a_module_missing_from_the_list_is_named() {
    let found = problems(&[
        (
            "src/lib.rs",
            &format!("{LAYERED}mod forgotten;\n#[cfg(test)]\nmod tests;\n"),
        ),
        ("src/leaf.rs", ""),
        ("src/middle.rs", ""),
        ("src/helper.rs", ""),
        ("src/top.rs", ""),
        ("src/forgotten.rs", ""),
    ]);
    assert_eq!(
        found,
        [LayerProblem::Missing {
            module: "forgotten".into()
        }],
        "a test-only module needs no layer"
    );
    assert!(found[0].to_string().contains("`forgotten`"));
}

#[test]
fn a_module_listed_twice_is_named_with_both_layers() {
    let found = problems(&[
        (
            "src/lib.rs",
            "//! 1. `a`\n//! 2. `b`, and `a` again\nmod a;\nmod b;\n",
        ),
        ("src/a.rs", ""),
        ("src/b.rs", ""),
    ]);
    assert_eq!(
        found,
        [LayerProblem::Twice {
            module: "a".into(),
            first: 1,
            second: 2
        }]
    );
}

#[test]
fn a_crate_without_a_list_is_reported_as_such() {
    let (_dir, root) = write_crate(&[
        (
            "src/lib.rs",
            "//! A crate that names `a` but lists no layers.\nmod a;\n",
        ),
        ("src/a.rs", ""),
    ]);
    let found = layer_problems(&crate_graph(&root).unwrap()).unwrap();
    assert_eq!(found, [LayerProblem::NoList { root: root.clone() }]);
    assert!(
        found[0].to_string().contains("no layer order"),
        "{}",
        found[0]
    );
}
