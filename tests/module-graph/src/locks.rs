//! The blocking-lock check: a `std::sync` lock taken by code on an async worker stalls
//! that worker for as long as anyone holds the lock, so every such lock of a crate must
//! be declared in a table saying how it is held:
//!
//! - **brief**: only for in-memory work (a map updated, a value swapped), never across
//!   I/O, a process, a D-Bus call or another lock's wait; it may be taken anywhere;
//! - **blocking**: possibly across blocking work (the filesystem, a condition variable):
//!   taken on blocking threads only, so no async code of its module may take it.
//!
//! Checked from the sources with a real Rust parser (non-test code only): every file
//! declaring a `std::sync::{Mutex, RwLock}` has a row and every row still names one;
//! no such lock at all in the directories given as lock-free (code that waits on outside
//! servers); and a blocking lock held in a field is never taken by `.lock()`, `.read()`,
//! `.write()` or `.try_lock()` in an `async` function or block of its file (closures
//! handed to `spawn_blocking` or a thread excepted: they run on blocking threads).
//! A lock taken through a method call is beyond a syntactic check: the table's reason
//! is the discipline there. Holding any guard across an `.await` is clippy's
//! `await_holding_lock`, which the workspace denies with every warning.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::{self, Visit};

/// How a lock is held (see the module's documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockClass {
    Brief,
    Blocking,
}

/// One row of the lock table: a lock of `file` (relative to the crate's directory).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockRow {
    pub file: PathBuf,
    /// The field (or local) that holds the lock.
    pub lock: String,
    pub class: LockClass,
}

/// What the check found wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockProblem {
    /// A file declares a `std::sync` lock that no row names.
    Undeclared { file: PathBuf, line: usize },
    /// A row names a file that declares no `std::sync` lock (any more).
    Stale { file: PathBuf },
    /// A `std::sync` lock in a directory that must have none.
    Forbidden { file: PathBuf, line: usize },
    /// A blocking lock taken in async code.
    TakenOnAsyncWorker {
        file: PathBuf,
        line: usize,
        lock: String,
    },
    /// The file could not be read or parsed.
    Unreadable { file: PathBuf, message: String },
}

/// The rows of the markdown table whose header starts `| file | lock | held |`: each
/// row's first three cells, code spans unwrapped; `held` is `brief` or `blocking`.
pub fn read_lock_table(markdown: &str) -> Result<Vec<LockRow>, String> {
    let mut lines = markdown.lines().map(str::trim);
    lines
        .by_ref()
        .find(|line| line.starts_with("| file | lock | held |"))
        .ok_or("no lock table (a header `| file | lock | held | ...`)")?;
    let mut rows = Vec::new();
    for line in lines.skip(1) {
        if !line.starts_with('|') {
            break;
        }
        let cells: Vec<&str> = line
            .trim_matches('|')
            .split('|')
            .map(|cell| cell.trim().trim_matches('`'))
            .collect();
        let [file, lock, held, ..] = cells[..] else {
            return Err(format!("a row of fewer than three cells: {line}"));
        };
        let class = match held {
            "brief" => LockClass::Brief,
            "blocking" => LockClass::Blocking,
            other => {
                return Err(format!(
                    "held {other:?} is neither brief nor blocking: {line}"
                ));
            }
        };
        rows.push(LockRow {
            file: file.into(),
            lock: lock.to_owned(),
            class,
        });
    }
    Ok(rows)
}

/// Checks the crate in `crate_dir` (its `src/`) against `rows`, whose files are relative
/// to `crate_dir`; `lock_free` lists directories (relative too) that may hold no
/// `std::sync` lock at all.
pub fn lock_problems(crate_dir: &Path, rows: &[LockRow], lock_free: &[&Path]) -> Vec<LockProblem> {
    let mut problems = Vec::new();
    let mut declaring = BTreeSet::new();
    for file in rust_files(&crate_dir.join("src")) {
        let relative = file.strip_prefix(crate_dir).unwrap_or(&file).to_owned();
        let parsed = match std::fs::read_to_string(&file)
            .map_err(|e| e.to_string())
            .and_then(|text| syn::parse_file(&text).map_err(|e| e.to_string()))
        {
            Ok(parsed) => parsed,
            Err(message) => {
                problems.push(LockProblem::Unreadable {
                    file: relative,
                    message,
                });
                continue;
            }
        };
        let mut found = Declarations::new(&parsed);
        found.visit_file(&parsed);
        let Some(&line) = found.lines.first() else {
            continue;
        };
        declaring.insert(relative.clone());
        if lock_free.iter().any(|dir| relative.starts_with(dir)) {
            problems.push(LockProblem::Forbidden {
                file: relative,
                line,
            });
            continue;
        }
        let rows_here: Vec<&LockRow> = rows.iter().filter(|row| row.file == relative).collect();
        if rows_here.is_empty() {
            problems.push(LockProblem::Undeclared {
                file: relative,
                line,
            });
            continue;
        }
        let blocking: BTreeSet<&str> = rows_here
            .iter()
            .filter(|row| row.class == LockClass::Blocking)
            .map(|row| row.lock.as_str())
            .collect();
        let mut takes = AsyncTakes {
            blocking: &blocking,
            in_async: false,
            found: Vec::new(),
        };
        takes.visit_file(&parsed);
        for (line, lock) in takes.found {
            problems.push(LockProblem::TakenOnAsyncWorker {
                file: relative.clone(),
                line,
                lock,
            });
        }
    }
    let stale: BTreeSet<&PathBuf> = rows
        .iter()
        .map(|row| &row.file)
        .filter(|file| !declaring.contains(*file))
        .collect();
    problems.extend(
        stale
            .into_iter()
            .map(|file| LockProblem::Stale { file: file.clone() }),
    );
    problems
}

/// The `.rs` files beneath `dir`, test-only files (`tests.rs`, `tests/`) left out.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return files;
    };
    let mut entries: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    entries.sort();
    for path in entries {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if name == "tests" || name == "tests.rs" {
            continue;
        }
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if name.ends_with(".rs") {
            files.push(path);
        }
    }
    files
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        attr.path().is_ident("cfg")
            && attr
                .parse_args::<syn::Meta>()
                .is_ok_and(|meta| meta.path().is_ident("test"))
    })
}

/// Where a file's non-test code names a `std::sync` Mutex or RwLock as a type or a
/// constructor.
struct Declarations {
    /// What `Mutex` and `RwLock` mean unqualified in this file: their `use` paths.
    imported: BTreeMap<String, Vec<String>>,
    lines: Vec<usize>,
}

impl Declarations {
    fn new(file: &syn::File) -> Self {
        let mut imported = BTreeMap::new();
        for item in &file.items {
            if let syn::Item::Use(item) = item
                && !is_test_only(&item.attrs)
            {
                collect_uses(&item.tree, &mut Vec::new(), &mut imported);
            }
        }
        Self {
            imported,
            lines: Vec::new(),
        }
    }

    fn check(&mut self, path: &syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        // `Mutex<T>` as a type, or `Mutex::new(..)`: the lock's name is the last
        // segment of a type, or the one before `new` in a constructor.
        let at = match segments.as_slice() {
            [.., name, new] if new == "new" && is_lock_name(name) => segments.len() - 2,
            [.., name] if is_lock_name(name) => segments.len() - 1,
            _ => return,
        };
        let qualified: Vec<String> = if at == 0 {
            match self.imported.get(&segments[0]) {
                Some(full) => full.clone(),
                // Not imported under this name here: not a lock this check knows.
                None => return,
            }
        } else {
            segments[..=at].to_vec()
        };
        if qualified.first().is_some_and(|root| root == "std") && qualified.len() >= 2 {
            let line = path
                .segments
                .first()
                .map_or(0, |s| s.ident.span().start().line);
            self.lines.push(line);
        }
    }
}

fn is_lock_name(name: &str) -> bool {
    matches!(name, "Mutex" | "RwLock")
}

fn collect_uses(
    tree: &syn::UseTree,
    prefix: &mut Vec<String>,
    out: &mut BTreeMap<String, Vec<String>>,
) {
    match tree {
        syn::UseTree::Path(path) => {
            prefix.push(path.ident.to_string());
            collect_uses(&path.tree, prefix, out);
            prefix.pop();
        }
        syn::UseTree::Name(name) => {
            let mut full = prefix.clone();
            full.push(name.ident.to_string());
            out.insert(name.ident.to_string(), full);
        }
        syn::UseTree::Rename(rename) => {
            let mut full = prefix.clone();
            full.push(rename.ident.to_string());
            out.insert(rename.rename.to_string(), full);
        }
        syn::UseTree::Group(group) => {
            for tree in &group.items {
                collect_uses(tree, prefix, out);
            }
        }
        syn::UseTree::Glob(_) => {}
    }
}

impl<'ast> Visit<'ast> for Declarations {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !item_is_test_only(item) {
            visit::visit_item(self, item);
        }
    }

    fn visit_type_path(&mut self, ty: &'ast syn::TypePath) {
        self.check(&ty.path);
        visit::visit_type_path(self, ty);
    }

    fn visit_expr_path(&mut self, expr: &'ast syn::ExprPath) {
        self.check(&expr.path);
        visit::visit_expr_path(self, expr);
    }
}

fn item_is_test_only(item: &syn::Item) -> bool {
    let attrs: &[syn::Attribute] = match item {
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        _ => return false,
    };
    is_test_only(attrs)
}

/// Where async code takes one of the file's blocking locks held in a field.
struct AsyncTakes<'a> {
    blocking: &'a BTreeSet<&'a str>,
    in_async: bool,
    found: Vec<(usize, String)>,
}

impl AsyncTakes<'_> {
    fn within(&mut self, in_async: bool, visit: impl FnOnce(&mut Self)) {
        let outer = std::mem::replace(&mut self.in_async, in_async);
        visit(self);
        self.in_async = outer;
    }
}

/// Calls whose closure arguments run on a blocking thread.
fn runs_on_blocking_thread(func: &syn::Expr) -> bool {
    let syn::Expr::Path(path) = func else {
        return false;
    };
    let segments: Vec<String> = path
        .path
        .segments
        .iter()
        .map(|s| s.ident.to_string())
        .collect();
    match segments.as_slice() {
        [.., last] if last == "spawn_blocking" || last == "block_in_place" => true,
        [.., thread, spawn] => thread == "thread" && spawn == "spawn",
        _ => false,
    }
}

impl<'ast> Visit<'ast> for AsyncTakes<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        if !item_is_test_only(item) {
            visit::visit_item(self, item);
        }
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let in_async = item.sig.asyncness.is_some();
        self.within(in_async, |me| visit::visit_item_fn(me, item));
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        if is_test_only(&item.attrs) {
            return;
        }
        let in_async = item.sig.asyncness.is_some();
        self.within(in_async, |me| visit::visit_impl_item_fn(me, item));
    }

    fn visit_expr_async(&mut self, expr: &'ast syn::ExprAsync) {
        self.within(true, |me| visit::visit_expr_async(me, expr));
    }

    fn visit_expr_closure(&mut self, expr: &'ast syn::ExprClosure) {
        // A closure called inline runs where its caller runs; an async closure is
        // async code.
        let in_async = self.in_async || expr.asyncness.is_some();
        self.within(in_async, |me| visit::visit_expr_closure(me, expr));
    }

    fn visit_expr_call(&mut self, expr: &'ast syn::ExprCall) {
        if runs_on_blocking_thread(&expr.func) {
            self.visit_expr(&expr.func);
            self.within(false, |me| {
                for arg in &expr.args {
                    me.visit_expr(arg);
                }
            });
        } else {
            visit::visit_expr_call(self, expr);
        }
    }

    fn visit_expr_method_call(&mut self, expr: &'ast syn::ExprMethodCall) {
        let taking = matches!(
            expr.method.to_string().as_str(),
            "lock" | "read" | "write" | "try_lock"
        );
        if self.in_async
            && taking
            && let syn::Expr::Field(field) = &*expr.receiver
            && let syn::Member::Named(name) = &field.member
            && self.blocking.contains(name.to_string().as_str())
        {
            self.found
                .push((expr.method.span().start().line, name.to_string()));
        }
        visit::visit_expr_method_call(self, expr);
    }
}
