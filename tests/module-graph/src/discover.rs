//! Finds the modules of a crate from its root file: `mod x;` declarations followed to
//! `x.rs` or `x/mod.rs` (or a `#[path]`), inline `mod x { ... }` blocks, and nothing
//! that only exists under `#[cfg(test)]`.

use std::path::{Path, PathBuf};

use crate::graph::{Error, Module};

/// A module with the items written in it (a child module's items are its own).
pub struct Parsed {
    pub module: Module,
    pub items: Vec<syn::Item>,
}

pub fn modules(root: &Path) -> Result<Vec<Parsed>, Error> {
    let file = parse_file(root)?;
    let mut found = vec![Parsed {
        module: Module {
            path: vec!["crate".to_owned()],
            file: root.to_owned(),
            parent: None,
            children: Vec::new(),
        },
        items: Vec::new(),
    }];
    // A crate root's children live beside it, like those of a `mod.rs`.
    let dir = root.parent().unwrap_or(Path::new(".")).to_owned();
    add_items(&mut found, 0, file.items, &dir)?;
    Ok(found)
}

fn parse_file(path: &Path) -> Result<syn::File, Error> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        path: path.to_owned(),
        source,
    })?;
    syn::parse_file(&text).map_err(|e| Error::Parse {
        path: path.to_owned(),
        message: format!("{e} at line {}", e.span().start().line),
    })
}

/// Gives module `index` its items, declaring the child modules among them; `dir` is
/// where the files of its children are.
fn add_items(
    found: &mut Vec<Parsed>,
    index: usize,
    items: Vec<syn::Item>,
    dir: &Path,
) -> Result<(), Error> {
    let mut own = Vec::new();
    for item in items {
        let syn::Item::Mod(declared) = item else {
            own.push(item);
            continue;
        };
        if is_test_only(&declared.attrs) {
            continue;
        }
        let name = declared.ident.to_string();
        let declared_in = found[index].module.file.clone();
        let (child_file, child_items, child_dir) = match declared.content {
            Some((_, items)) => (declared_in.clone(), items, dir.join(&name)),
            None => {
                let file = module_file(dir, &name, path_attribute(&declared.attrs), &declared_in)?;
                let child_dir = if file.file_name().is_some_and(|f| f == "mod.rs") {
                    file.parent().unwrap_or(dir).to_owned()
                } else {
                    dir.join(&name)
                };
                let items = parse_file(&file)?.items;
                (file, items, child_dir)
            }
        };
        let mut path = found[index].module.path.clone();
        path.push(name);
        let child = found.len();
        found.push(Parsed {
            module: Module {
                path,
                file: child_file,
                parent: Some(index),
                children: Vec::new(),
            },
            items: Vec::new(),
        });
        found[index].module.children.push(child);
        add_items(found, child, child_items, &child_dir)?;
    }
    found[index].items = own;
    Ok(())
}

fn module_file(
    dir: &Path,
    name: &str,
    path_attribute: Option<String>,
    declared_in: &Path,
) -> Result<PathBuf, Error> {
    let candidates = match path_attribute {
        Some(path) => vec![declared_in.parent().unwrap_or(dir).join(path)],
        None => vec![
            dir.join(format!("{name}.rs")),
            dir.join(name).join("mod.rs"),
        ],
    };
    candidates
        .iter()
        .find(|c| c.is_file())
        .cloned()
        .ok_or_else(|| Error::MissingModule {
            declared_in: declared_in.to_owned(),
            name: name.to_owned(),
            candidates: candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(" or "),
        })
}

fn path_attribute(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|attr| {
        let syn::Meta::NameValue(value) = &attr.meta else {
            return None;
        };
        if !value.path.is_ident("path") {
            return None;
        }
        match &value.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(text),
                ..
            }) => Some(text.value()),
            _ => None,
        }
    })
}

/// Whether the attributes compile the item only for tests: `#[cfg(test)]`, or a `cfg`
/// that cannot hold without `test` (`all(test, ...)`, `any(test, ...)` of such).
pub fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| needs_test(&meta))
    })
}

fn needs_test(meta: &syn::Meta) -> bool {
    match meta {
        syn::Meta::Path(path) => path.is_ident("test"),
        syn::Meta::List(list) => {
            let Ok(inner) = list.parse_args_with(
                syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated,
            ) else {
                return false;
            };
            if list.path.is_ident("all") {
                inner.iter().any(needs_test)
            } else if list.path.is_ident("any") {
                !inner.is_empty() && inner.iter().all(needs_test)
            } else {
                // `not(test)` and everything else can hold outside tests.
                false
            }
        }
        syn::Meta::NameValue(_) => false,
    }
}
