//! The checker on small crates written for each case: what it must find, and what it
//! must not take for a dependency.

mod common;

use std::path::Path;

use common::write_crate;
use nfsprov_module_graph::{Error, crate_graph, cycles};

fn cycle_modules(root: &Path) -> Vec<Vec<String>> {
    let graph = crate_graph(root).unwrap();
    cycles(&graph).into_iter().map(|c| c.modules).collect()
}

#[test]
fn two_modules_importing_each_other_are_a_cycle() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "use crate::b::B;\npub struct A(B);\n"),
        (
            "src/b.rs",
            "pub struct B;\npub fn f() -> crate::a::A { todo!() }\n",
        ),
    ]);
    assert_eq!(cycle_modules(&root), [["crate::a", "crate::b"]]);
}

#[test]
fn a_child_using_its_parent_that_uses_it_is_a_cycle() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod store;\n"),
        (
            "src/store.rs",
            "mod backend;\npub struct Error;\npub fn run() { backend::go(); }\n",
        ),
        (
            "src/store/backend.rs",
            "use super::Error;\npub fn go() -> Option<Error> { None }\n",
        ),
    ]);
    assert_eq!(
        cycle_modules(&root),
        [["crate::store", "crate::store::backend"]]
    );
}

#[test]
fn test_modules_and_items_are_no_dependency() {
    let (_dir, root) = write_crate(&[
        (
            "src/lib.rs",
            "mod a;\nmod b;\n#[cfg(test)]\nmod fixtures;\n",
        ),
        (
            "src/a.rs",
            "pub fn f() { crate::b::g() }\n#[cfg(test)]\nmod tests { use super::*; use crate::fixtures::X; }\n",
        ),
        (
            "src/b.rs",
            "pub fn g() {}\n#[cfg(all(test, unix))]\nfn only_in_tests() { crate::a::f() }\n",
        ),
        ("src/fixtures.rs", "pub struct X;\n"),
    ]);
    assert!(cycle_modules(&root).is_empty());
    let graph = crate_graph(&root).unwrap();
    assert!(
        graph.modules.iter().all(|m| m.name() != "crate::fixtures"),
        "a test-only module is not part of the graph"
    );
}

#[test]
fn not_test_is_code_like_any_other() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        ("src/a.rs", "pub fn f() { crate::b::g() }\n"),
        (
            "src/b.rs",
            "pub fn g() {}\n#[cfg(not(test))]\nfn h() { crate::a::f() }\n",
        ),
    ]);
    assert_eq!(cycle_modules(&root), [["crate::a", "crate::b"]]);
}

#[test]
fn relative_paths_to_children_and_globs_count() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod outer;\n"),
        (
            "src/outer/mod.rs",
            "mod inner;\npub fn f() { inner::g() }\npub struct T;\n",
        ),
        ("src/outer/inner.rs", "use super::*;\npub fn g() {}\n"),
    ]);
    assert_eq!(
        cycle_modules(&root),
        [["crate::outer", "crate::outer::inner"]]
    );
}

#[test]
fn visibility_restrictions_are_no_dependency() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod a;\npub use a::f;\n"),
        ("src/a.rs", "pub(crate) fn f() {}\npub(super) struct S;\n"),
    ]);
    assert!(cycle_modules(&root).is_empty());
}

#[test]
fn paths_inside_macro_arguments_count() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod a;\nmod b;\n"),
        (
            "src/a.rs",
            "pub const N: u8 = 1;\npub fn f() { crate::b::g() }\n",
        ),
        (
            "src/b.rs",
            "pub fn g() { println!(\"{}\", crate::a::N); }\n",
        ),
    ]);
    assert_eq!(cycle_modules(&root), [["crate::a", "crate::b"]]);
}

#[test]
fn a_layered_crate_has_no_cycle() {
    let (_dir, root) = write_crate(&[
        (
            "src/lib.rs",
            "pub mod top;\nmod middle;\nmod leaf;\npub use top::run;\n",
        ),
        (
            "src/top.rs",
            "use crate::middle;\npub fn run() { middle::m(); crate::leaf::l(); }\n",
        ),
        ("src/middle.rs", "pub fn m() { crate::leaf::l() }\n"),
        (
            "src/leaf.rs",
            "pub fn l() {}\nmod inline { pub fn i() {} }\n",
        ),
    ]);
    let graph = crate_graph(&root).unwrap();
    assert!(cycles(&graph).is_empty());
    assert_eq!(
        graph.modules.len(),
        5,
        "crate, top, middle, leaf, leaf::inline"
    );
    assert!(graph.edges.len() >= 4, "{:?}", graph.edges);
}

#[test]
fn a_ring_of_three_is_reported_with_every_edge_and_its_line() {
    let (_dir, root) = write_crate(&[
        ("src/lib.rs", "mod a;\nmod b;\nmod c;\n"),
        ("src/a.rs", "\npub fn a() { crate::b::b() }\n"),
        ("src/b.rs", "\n\npub fn b() { crate::c::c() }\n"),
        ("src/c.rs", "pub fn c() { crate::a::a() }\n"),
    ]);
    let graph = crate_graph(&root).unwrap();
    let found = cycles(&graph);
    assert_eq!(found.len(), 1);
    let steps: Vec<(String, String)> = found[0]
        .steps
        .iter()
        .map(|(from, to, _)| (from.clone(), to.clone()))
        .collect();
    assert_eq!(
        steps,
        [
            ("crate::a".into(), "crate::b".into()),
            ("crate::b".into(), "crate::c".into()),
            ("crate::c".into(), "crate::a".into()),
        ]
    );
    assert!(found[0].steps[0].2.ends_with("a.rs:2"), "{}", found[0]);
    assert!(found[0].steps[1].2.ends_with("b.rs:3"), "{}", found[0]);
}

#[test]
fn a_declared_module_without_a_file_is_an_error() {
    let (_dir, root) = write_crate(&[("src/lib.rs", "mod missing;\n")]);
    match crate_graph(&root) {
        Err(Error::MissingModule { name, .. }) => assert_eq!(name, "missing"),
        other => panic!("expected a missing module error, got {other:?}"),
    }
}
