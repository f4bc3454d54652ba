//! The paths each module's own code names, resolved to the modules they lead into.

use std::collections::BTreeMap;

use syn::visit::Visit;

use crate::discover::{Parsed, is_test_only};
use crate::graph::{Edge, Location};

/// One edge per ordered pair of modules, with the first place that creates it.
pub fn edges(parsed: &[Parsed]) -> Vec<Edge> {
    let mut found: BTreeMap<(usize, usize), Location> = BTreeMap::new();
    for (index, module) in parsed.iter().enumerate() {
        let mut collector = Collector { paths: Vec::new() };
        for item in &module.items {
            collector.visit_item(item);
        }
        for (segments, line) in collector.paths {
            if let Some(target) = resolve(parsed, index, &segments)
                && target != index
            {
                found.entry((index, target)).or_insert_with(|| Location {
                    file: module.module.file.clone(),
                    line,
                });
            }
        }
    }
    found
        .into_iter()
        .map(|((from, to), at)| Edge { from, to, at })
        .collect()
}

/// The module a path leads into, when it starts inside the crate: `crate`, `super`,
/// `self`, or the name of a child module of `from`.
fn resolve(parsed: &[Parsed], from: usize, segments: &[String]) -> Option<usize> {
    let first = segments.first()?;
    let (mut at, rest) = match first.as_str() {
        "crate" => (0, &segments[1..]),
        "self" => (from, &segments[1..]),
        "super" => {
            let mut at = from;
            let mut used = 0;
            for segment in segments {
                if segment != "super" {
                    break;
                }
                at = parsed[at].module.parent?;
                used += 1;
            }
            (at, &segments[used..])
        }
        name if child(parsed, from, name).is_some() => (from, segments),
        _ => return None,
    };
    for segment in rest {
        match child(parsed, at, segment) {
            Some(next) => at = next,
            None => break,
        }
    }
    Some(at)
}

fn child(parsed: &[Parsed], of: usize, name: &str) -> Option<usize> {
    parsed[of]
        .module
        .children
        .iter()
        .copied()
        .find(|&c| parsed[c].module.path.last().is_some_and(|n| n == name))
}

/// Every path in the items, with its line; test-only items and nested modules (whose
/// code is their own) are skipped.
struct Collector {
    paths: Vec<(Vec<String>, usize)>,
}

impl Collector {
    fn record(&mut self, segments: Vec<String>, line: usize) {
        if !segments.is_empty() {
            self.paths.push((segments, line));
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree, line: usize) {
        match tree {
            syn::UseTree::Path(path) => {
                prefix.push(path.ident.to_string());
                self.use_tree(prefix, &path.tree, line);
                prefix.pop();
            }
            syn::UseTree::Name(name) => {
                let mut full = prefix.clone();
                if name.ident != "self" {
                    full.push(name.ident.to_string());
                }
                self.record(full, line);
            }
            syn::UseTree::Rename(rename) => {
                let mut full = prefix.clone();
                if rename.ident != "self" {
                    full.push(rename.ident.to_string());
                }
                self.record(full, line);
            }
            syn::UseTree::Glob(_) => self.record(prefix.clone(), line),
            syn::UseTree::Group(group) => {
                for tree in &group.items {
                    self.use_tree(prefix, tree, line);
                }
            }
        }
    }
}

fn line_of(span: proc_macro2::Span) -> usize {
    span.start().line
}

impl<'ast> Visit<'ast> for Collector {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(_) => return,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if is_test_only(attrs) {
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item_fn(&mut self, function: &'ast syn::ImplItemFn) {
        if !is_test_only(&function.attrs) {
            syn::visit::visit_impl_item_fn(self, function);
        }
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        let line = line_of(item.use_token.span);
        self.use_tree(&mut Vec::new(), &item.tree, line);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments = path.segments.iter().map(|s| s.ident.to_string()).collect();
        let line = path.segments.first().map_or(0, |s| line_of(s.ident.span()));
        self.record(segments, line);
        syn::visit::visit_path(self, path);
    }

    /// `pub(crate)` and `pub(super)` say who may use an item, not what it uses.
    fn visit_visibility(&mut self, _: &'ast syn::Visibility) {}

    /// Macro arguments are read as comma-separated expressions where they parse so.
    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.visit_path(&mac.path);
        if let Ok(arguments) = mac.parse_body_with(
            syn::punctuated::Punctuated::<syn::Expr, syn::Token![,]>::parse_terminated,
        ) {
            for argument in &arguments {
                self.visit_expr(argument);
            }
        }
    }
}
