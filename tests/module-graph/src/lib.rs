//! The module dependency graph of a crate, read from its sources with a real Rust parser,
//! and the cycles in it. A module depends on another when its own non-test code names a
//! path into it: `crate::a::b`, `super::Item` (the parent), `super::sibling`,
//! `self::child` or a child module's name. A `mod` declaration alone is no dependency;
//! `#[cfg(test)]` modules and items are left out. Parent and child count like any two
//! modules, so layers must depend one way only.
//!
//! A crate whose root lists its modules as numbered layers is also checked against that
//! order (see [`layer_problems`]), and a crate's blocking locks against the table that
//! says how each is held (see [`lock_problems`]).

mod cycles;
mod discover;
mod graph;
mod layers;
mod locks;
mod references;

use std::path::{Path, PathBuf};

pub use cycles::{Cycle, cycles};
pub use graph::{Edge, Error, Graph, Location, Module};
pub use layers::{LayerProblem, layer_problems};
pub use locks::{LockClass, LockProblem, LockRow, lock_problems, read_lock_table};

/// The graph of the crate whose root file (`src/lib.rs`, `src/main.rs`, ...) is `root`.
pub fn crate_graph(root: &Path) -> Result<Graph, Error> {
    let parsed = discover::modules(root)?;
    let edges = references::edges(&parsed);
    Ok(Graph {
        root: root.to_owned(),
        modules: parsed.into_iter().map(|m| m.module).collect(),
        edges,
    })
}

/// The crate roots of every member of the workspace whose manifest is `manifest`: each
/// member's `src/lib.rs`, `src/main.rs` and `src/bin/*.rs`.
pub fn workspace_roots(manifest: &Path) -> Result<Vec<PathBuf>, Error> {
    let text = std::fs::read_to_string(manifest).map_err(|source| Error::Read {
        path: manifest.to_owned(),
        source,
    })?;
    let value: toml::Table = text.parse().map_err(|e: toml::de::Error| Error::Manifest {
        path: manifest.to_owned(),
        message: e.to_string(),
    })?;
    let members = value
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .ok_or_else(|| Error::Manifest {
            path: manifest.to_owned(),
            message: "no [workspace] members".into(),
        })?;
    let top = manifest.parent().unwrap_or(Path::new("."));
    let mut roots = Vec::new();
    for member in members.iter().filter_map(|m| m.as_str()) {
        let src = top.join(member).join("src");
        for file in ["lib.rs", "main.rs"] {
            if src.join(file).is_file() {
                roots.push(src.join(file));
            }
        }
        if let Ok(bins) = std::fs::read_dir(src.join("bin")) {
            let mut bins: Vec<PathBuf> = bins
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|e| e == "rs"))
                .collect();
            bins.sort();
            roots.extend(bins);
        }
    }
    Ok(roots)
}
