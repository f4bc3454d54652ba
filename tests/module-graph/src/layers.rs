//! The layer order a crate declares in its root's doc comment, and the imports that break
//! it. The order is a numbered list, lowest layer first, each item naming its modules in
//! backticks:
//!
//! ```text
//! //! 1. leaves: `config`, `metrics`;
//! //! 2. `store` (uses the leaves),
//! //!    and `api`.
//! ```
//!
//! An item runs on over indented lines. A backticked word that is no module of the crate
//! is prose and ignored. A module may import from its own layer and the ones below; the
//! crate root holds the layers together and belongs to none.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use crate::graph::{Error, Graph, Location};

/// Something that breaks, or leaves out, the declared order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LayerProblem {
    /// The crate root's doc comment has no numbered list.
    NoList { root: PathBuf },
    /// A top-level module that no layer names.
    Missing { module: String },
    /// A module two layers name.
    Twice {
        module: String,
        first: usize,
        second: usize,
    },
    /// A module that uses one of a higher layer.
    Upward {
        from: String,
        from_layer: usize,
        to: String,
        to_layer: usize,
        at: Location,
    },
}

impl fmt::Display for LayerProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LayerProblem::NoList { root } => write!(
                f,
                "{}: no layer order: the crate root's doc comment has no numbered list of its modules (`//! 1. ...`, lowest layer first)",
                root.display()
            ),
            LayerProblem::Missing { module } => {
                write!(f, "module `{module}` is in no layer of the list")
            }
            LayerProblem::Twice {
                module,
                first,
                second,
            } => write!(
                f,
                "module `{module}` is listed twice, in layers {first} and {second}"
            ),
            LayerProblem::Upward {
                from,
                from_layer,
                to,
                to_layer,
                at,
            } => write!(
                f,
                "{from} (layer {from_layer}) imports from {to} (layer {to_layer}), a higher layer ({at})"
            ),
        }
    }
}

/// What a crate root's list says.
struct Declared {
    /// The layer of each listed module, by its name under the crate root.
    layers: BTreeMap<String, usize>,
    /// The modules listed a second time.
    twice: Vec<LayerProblem>,
}

/// The list of the crate root `root`; `None` when it declares no order. `modules` are the
/// names that count as modules.
fn declared(root: &Path, modules: &[&str]) -> Result<Option<Declared>, Error> {
    let text = std::fs::read_to_string(root).map_err(|source| Error::Read {
        path: root.to_owned(),
        source,
    })?;
    let file = syn::parse_file(&text).map_err(|e| Error::Parse {
        path: root.to_owned(),
        message: format!("{e} at line {}", e.span().start().line),
    })?;
    let items = numbered_items(&doc_lines(&file.attrs));
    if items.is_empty() {
        return Ok(None);
    }
    let mut layers = BTreeMap::new();
    let mut twice = Vec::new();
    for (layer, text) in items {
        for name in backticked(&text).filter(|name| modules.contains(name)) {
            if let Some(&first) = layers.get(name) {
                twice.push(LayerProblem::Twice {
                    module: name.to_owned(),
                    first,
                    second: layer,
                });
            } else {
                layers.insert(name.to_owned(), layer);
            }
        }
    }
    Ok(Some(Declared { layers, twice }))
}

/// The inner doc comment of a file, one entry per line.
fn doc_lines(attrs: &[syn::Attribute]) -> Vec<String> {
    attrs
        .iter()
        .filter(|attr| matches!(attr.style, syn::AttrStyle::Inner(_)))
        .filter_map(|attr| match &attr.meta {
            syn::Meta::NameValue(value) if value.path.is_ident("doc") => match &value.value {
                syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(text),
                    ..
                }) => Some(text.value()),
                _ => None,
            },
            _ => None,
        })
        .flat_map(|text| text.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect()
}

/// The items of the numbered list: each number with its text, continuation lines joined.
fn numbered_items(lines: &[String]) -> Vec<(usize, String)> {
    let mut items: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for line in lines {
        // `//! text` gives " text": the comment's own space is not indentation.
        let line = line.strip_prefix(' ').unwrap_or(line);
        if let Some((number, rest)) = line.split_once(". ")
            && !number.is_empty()
            && number.bytes().all(|b| b.is_ascii_digit())
            && let Ok(number) = number.parse()
        {
            items.push((number, rest.to_owned()));
            open = true;
        } else if open && line.starts_with(char::is_whitespace) && !line.trim().is_empty() {
            if let Some((_, text)) = items.last_mut() {
                text.push(' ');
                text.push_str(line.trim());
            }
        } else {
            open = false;
        }
    }
    items
}

/// The words between backticks.
fn backticked(text: &str) -> impl Iterator<Item = &str> {
    text.split('`').skip(1).step_by(2)
}

/// Checks the graph against the order its crate root declares: every top-level module
/// listed once, and no import from a higher layer. A crate that declares no order gives
/// the one problem [`LayerProblem::NoList`].
pub fn layer_problems(graph: &Graph) -> Result<Vec<LayerProblem>, Error> {
    let top_level = |index: usize| graph.modules[index].path.get(1).map(String::as_str);
    let names: Vec<&str> = graph.modules[0]
        .children
        .iter()
        .filter_map(|&child| top_level(child))
        .collect();
    let Some(Declared {
        layers,
        twice: mut problems,
    }) = declared(&graph.root, &names)?
    else {
        return Ok(vec![LayerProblem::NoList {
            root: graph.root.clone(),
        }]);
    };
    for name in &names {
        if !layers.contains_key(*name) {
            problems.push(LayerProblem::Missing {
                module: (*name).to_owned(),
            });
        }
    }
    for edge in &graph.edges {
        let (Some(from), Some(to)) = (top_level(edge.from), top_level(edge.to)) else {
            continue;
        };
        let (Some(&from_layer), Some(&to_layer)) = (layers.get(from), layers.get(to)) else {
            continue;
        };
        if to_layer > from_layer {
            problems.push(LayerProblem::Upward {
                from: graph.modules[edge.from].name(),
                from_layer,
                to: graph.modules[edge.to].name(),
                to_layer,
                at: edge.at.clone(),
            });
        }
    }
    Ok(problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_owned).collect()
    }

    #[test]
    fn items_run_on_over_indented_lines_and_end_at_prose() {
        let items = numbered_items(&lines(
            " Intro naming `a`.\n\n 1. `a`, `b`\n    and `c`;\n 2. `d`\n Not part of it: `e`.\n 10. `f`",
        ));
        assert_eq!(
            items,
            [
                (1, "`a`, `b` and `c`;".to_owned()),
                (2, "`d`".to_owned()),
                (10, "`f`".to_owned()),
            ]
        );
        assert_eq!(
            backticked("`a`, `b` (`X`) and `c`").collect::<Vec<_>>(),
            ["a", "b", "X", "c"]
        );
    }
}
