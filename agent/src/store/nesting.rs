//! Keeps volumes from ending up nested when a create (or clone) and an adoption of
//! related paths run at once. A create checks that no volume is above its path and an
//! adoption that none is below its directory, each under its own path's lock only: a
//! create below a directory being adopted could pass both checks. So the two wait for
//! each other, but only when their paths are related (one is the other or lies below
//! it): a long clone never holds up a create or an adoption elsewhere.
//!
//! Makers (creates and clones) never wait for each other. An adoption waits for the
//! makers and the other adoptions at related paths; once it waits, new makers at
//! related paths wait behind it, so a stream of creates below a directory cannot keep
//! its adoption waiting forever.

use std::sync::{Condvar, Mutex, MutexGuard};

/// The creates, clones and adoptions in flight, by path.
#[derive(Debug, Default)]
pub(super) struct Nesting {
    state: Mutex<State>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    /// Paths being made; one entry per maker (two may make the same path).
    making: Vec<String>,
    /// Adoptions: an id telling one from another at the same path, the path, and
    /// whether it runs or still waits.
    adopting: Vec<(u64, String, bool)>,
    next: u64,
}

/// Whether `a` and `b` are the same path or one lies below the other.
fn related(a: &str, b: &str) -> bool {
    let (short, long) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    long.strip_prefix(short)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

/// What a caller holds while it makes or adopts `path`; dropping it lets the others go.
#[must_use]
pub(super) struct NestingGuard<'a> {
    nesting: &'a Nesting,
    role: Role,
}

enum Role {
    Making(String),
    Adopting(u64),
}

impl Nesting {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn wait<'a>(&self, state: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
        self.changed.wait(state).unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until no adoption at a path related to `path` runs or waits, and holds
    /// `path` as being made. Blocks the thread: call it off the async workers.
    pub(super) fn making(&self, path: &str) -> NestingGuard<'_> {
        let mut state = self.lock();
        while state
            .adopting
            .iter()
            .any(|(_, other, _)| related(other, path))
        {
            state = self.wait(state);
        }
        state.making.push(path.to_owned());
        NestingGuard {
            nesting: self,
            role: Role::Making(path.to_owned()),
        }
    }

    /// Waits until nothing at a path related to `path` is being made or adopted, and
    /// holds `path` as being adopted. Blocks the thread: call it off the async workers.
    pub(super) fn adopting(&self, path: &str) -> NestingGuard<'_> {
        let mut state = self.lock();
        let id = state.next;
        state.next += 1;
        state.adopting.push((id, path.to_owned(), false));
        // From here on, new makers at related paths wait behind this adoption.
        let guard = NestingGuard {
            nesting: self,
            role: Role::Adopting(id),
        };
        loop {
            let blocked = state.making.iter().any(|other| related(other, path))
                || state
                    .adopting
                    .iter()
                    .any(|(_, other, running)| *running && related(other, path));
            if !blocked {
                break;
            }
            state = self.wait(state);
        }
        if let Some(entry) = state.adopting.iter_mut().find(|entry| entry.0 == id) {
            entry.2 = true;
        }
        guard
    }
}

impl Drop for NestingGuard<'_> {
    fn drop(&mut self) {
        let mut state = self.nesting.lock();
        match &self.role {
            Role::Making(path) => {
                if let Some(at) = state.making.iter().position(|other| other == path) {
                    state.making.swap_remove(at);
                }
            }
            Role::Adopting(id) => {
                state.adopting.retain(|entry| entry.0 != *id);
            }
        }
        drop(state);
        self.nesting.changed.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::mpsc;
    use std::time::Duration;

    #[test]
    fn related_paths() {
        assert!(related("a", "a"));
        assert!(related("a", "a/b"));
        assert!(related("a/b/c", "a"));
        assert!(!related("a", "ab"));
        assert!(!related("a/b", "a/c"));
    }

    /// A maker at an unrelated path goes through while an adoption waits for a long
    /// maker below it; a maker below the waiting adoption waits for it.
    #[test]
    fn only_related_paths_wait() {
        let nesting = Arc::new(Nesting::default());
        let long_clone = nesting.making("team/a/clone");
        let (adopted, adoption_ran) = mpsc::channel();
        let adoption = {
            let nesting = nesting.clone();
            std::thread::spawn(move || {
                let _held = nesting.adopting("team/a");
                adopted.send(()).unwrap();
            })
        };
        // The adoption is listed as waiting once the registry shows it.
        while nesting.lock().adopting.is_empty() {
            std::thread::yield_now();
        }
        // Unrelated: never waits, whatever the adoption does.
        drop(nesting.making("team/b"));
        let (made, maker_ran) = mpsc::channel();
        let below = {
            let nesting = nesting.clone();
            std::thread::spawn(move || {
                let _held = nesting.making("team/a/new");
                made.send(()).unwrap();
            })
        };
        // Neither can go on while the long clone holds its path.
        assert!(
            adoption_ran
                .recv_timeout(Duration::from_millis(200))
                .is_err()
        );
        assert!(maker_ran.recv_timeout(Duration::from_millis(10)).is_err());
        drop(long_clone);
        adoption_ran.recv().unwrap();
        adoption.join().unwrap();
        maker_ran.recv().unwrap();
        below.join().unwrap();
        let state = nesting.lock();
        assert!(state.making.is_empty() && state.adopting.is_empty());
    }
}
