//! The graph's types, below everything that builds or reads it.

use std::fmt;
use std::path::PathBuf;

/// A module of the crate: its path from the crate root (`crate`, `crate::fs`, ...).
#[derive(Debug, Clone)]
pub struct Module {
    pub path: Vec<String>,
    pub file: PathBuf,
    pub parent: Option<usize>,
    pub children: Vec<usize>,
}

impl Module {
    pub fn name(&self) -> String {
        self.path.join("::")
    }
}

/// Where a dependency was seen first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub file: PathBuf,
    pub line: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.file.display(), self.line)
    }
}

/// A dependency of one module on another.
#[derive(Debug, Clone)]
pub struct Edge {
    pub from: usize,
    pub to: usize,
    pub at: Location,
}

/// The modules of one crate root and their dependencies (one edge per ordered pair).
#[derive(Debug)]
pub struct Graph {
    pub root: PathBuf,
    pub modules: Vec<Module>,
    pub edges: Vec<Edge>,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{declared_in}: module `{name}` has no file (looked for {candidates})")]
    MissingModule {
        declared_in: PathBuf,
        name: String,
        candidates: String,
    },
    #[error("cannot read the workspace manifest {path}: {message}")]
    Manifest { path: PathBuf, message: String },
}
