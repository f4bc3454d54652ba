//! The blocking-lock check, on small crates written for each case, and on the agent
//! against the table in docs/development.md.

mod common;

use std::path::{Path, PathBuf};

use common::write_crate;
use nfsprov_module_graph::{LockClass, LockProblem, LockRow, lock_problems, read_lock_table};

fn row(file: &str, lock: &str, class: LockClass) -> LockRow {
    LockRow {
        file: file.into(),
        lock: lock.into(),
        class,
    }
}

fn problems(files: &[(&str, &str)], rows: &[LockRow]) -> Vec<LockProblem> {
    let (dir, _root) = write_crate(files);
    lock_problems(dir.path(), rows, &[Path::new("src/remote")])
}

const CACHE: &str = "use std::sync::Mutex;\npub struct Cache { map: Mutex<u32> }\n\
impl Cache { pub async fn get(&self) -> u32 { *self.map.lock().unwrap() } }\n";

#[test]
fn a_declared_brief_lock_may_be_taken_in_async_code() {
    let found = problems(
        &[("src/lib.rs", "mod cache;\n"), ("src/cache.rs", CACHE)],
        &[row("src/cache.rs", "map", LockClass::Brief)],
    );
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn an_undeclared_lock_and_a_stale_row_are_named() {
    let found = problems(
        &[
            ("src/lib.rs", "mod cache;\nmod plain;\n"),
            ("src/cache.rs", CACHE),
            ("src/plain.rs", "pub fn f() {}\n"),
        ],
        &[row("src/plain.rs", "gone", LockClass::Brief)],
    );
    assert_eq!(
        found,
        vec![
            LockProblem::Undeclared {
                file: "src/cache.rs".into(),
                line: 2
            },
            LockProblem::Stale {
                file: "src/plain.rs".into()
            },
        ]
    );
}

#[test]
fn a_blocking_lock_taken_in_async_code_is_named_and_on_a_blocking_thread_passes() {
    let found = problems(
        &[("src/lib.rs", "mod cache;\n"), ("src/cache.rs", CACHE)],
        &[row("src/cache.rs", "map", LockClass::Blocking)],
    );
    assert_eq!(
        found,
        vec![LockProblem::TakenOnAsyncWorker {
            file: "src/cache.rs".into(),
            line: 3,
            lock: "map".into()
        }]
    );
    let on_the_pool = "use std::sync::{Arc, Mutex};\npub struct Cache { map: Arc<Mutex<u32>> }\n\
impl Cache {\n  pub async fn get(self: Arc<Self>) -> u32 {\n    \
tokio::task::spawn_blocking(move || *self.map.lock().unwrap()).await.unwrap()\n  }\n  \
pub fn sync(&self) -> u32 { *self.map.lock().unwrap() }\n}\n";
    let found = problems(
        &[
            ("src/lib.rs", "mod cache;\n"),
            ("src/cache.rs", on_the_pool),
        ],
        &[row("src/cache.rs", "map", LockClass::Blocking)],
    );
    assert!(found.is_empty(), "{found:?}");
    // In an async block of a sync function, and in a closure called inline: async code.
    let inline = "use std::sync::Mutex;\npub struct C { map: Mutex<u32> }\nimpl C {\n  \
pub fn later(&self) -> impl std::future::Future<Output = ()> + '_ {\n    async move {\n      \
let f = || self.map.lock();\n      let _ = f();\n    }\n  }\n}\n";
    let found = problems(
        &[("src/lib.rs", "mod c;\n"), ("src/c.rs", inline)],
        &[row("src/c.rs", "map", LockClass::Blocking)],
    );
    assert_eq!(found.len(), 1, "{found:?}");
}

#[test]
fn async_locks_and_test_code_are_left_alone_and_lock_free_directories_hold_none() {
    let found = problems(
        &[
            ("src/lib.rs", "mod a;\nmod remote;\n"),
            (
                "src/a.rs",
                "use tokio::sync::Mutex;\npub struct A { m: Mutex<u8>, n: tokio::sync::RwLock<u8> }\n\
#[cfg(test)]\nmod tests { use std::sync::Mutex; static M: Mutex<u8> = Mutex::new(0); }\n",
            ),
            ("src/remote/mod.rs", "mod call;\n"),
            (
                "src/remote/call.rs",
                "pub struct Call { slot: std::sync::RwLock<u8> }\n",
            ),
        ],
        &[row("src/remote/call.rs", "slot", LockClass::Brief)],
    );
    assert_eq!(
        found,
        vec![LockProblem::Forbidden {
            file: "src/remote/call.rs".into(),
            line: 1
        }]
    );
}

#[test]
fn the_table_is_read_from_markdown() {
    let rows = read_lock_table(
        "text\n\n| file | lock | held | why |\n|---|---|---|---|\n| `agent/src/a.rs` | `map` | brief | x |\n| `agent/src/b.rs` | `files` | blocking | y |\n\nafter\n",
    )
    .unwrap();
    assert_eq!(
        rows,
        vec![
            row("agent/src/a.rs", "map", LockClass::Brief),
            row("agent/src/b.rs", "files", LockClass::Blocking),
        ]
    );
    assert!(read_lock_table("| file | lock | held |\n|---|---|---|\n| a | b | often |\n").is_err());
}

/// The agent's locks are those docs/development.md lists, each held as it says, and its
/// export code, which waits for the NFS server, holds none.
#[test]
fn the_agent_holds_its_blocking_locks_as_the_development_guide_says() {
    let top = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let guide = std::fs::read_to_string(top.join("docs/development.md")).unwrap();
    let rows: Vec<LockRow> = read_lock_table(&guide)
        .unwrap()
        .into_iter()
        .filter_map(|row| {
            let file = row.file.strip_prefix("agent").ok().map(PathBuf::from)?;
            Some(LockRow { file, ..row })
        })
        .collect();
    assert!(rows.len() >= 10, "{rows:?}");
    let found = lock_problems(&top.join("agent"), &rows, &[Path::new("src/exports")]);
    assert!(found.is_empty(), "{found:#?}");
}
