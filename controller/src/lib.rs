//! nfsprov controller: provisions NFS PersistentVolumes by asking nfsprov agents to create
//! directories on the NFS server, expands them, measures their usage, and deletes, archives
//! or keeps them when released.
//!
//! The names, StorageClass parameters and orphan rules it shares with the kubectl plugin
//! are `nfsprov-vocabulary`'s. Modules depend only downward, in this order (the test
//! suite checks it, and that no import cycle exists):
//!
//! 1. leaves: `config`, `metrics`, `backoff`, `reported` (permanent failures already
//!    reported), `events`, `health` (what the usage poll's answers say of each volume's
//!    condition, and the events a change calls for), and `objects` (the vocabulary's
//!    names, and every predicate over claims, classes and the cached form of volumes);
//! 2. `pv` (a new PV), `cache` (what the watch caches keep), `agents` (the agent clients),
//!    `mounters` (the Nodes and Pods that exports follow);
//! 3. `context`: what every reconciler shares (the context, its errors, event publishing);
//! 4. `datasource`: the claim a new volume is cloned from, read through the context;
//! 5. the reconcilers: `provision`, `delete`, `expand`, `usage`, `orphans`, `exports`,
//!    `snapshots` (the `nfsprov.dev` Snapshots), `schedules` (their SnapshotSchedules),
//!    and `agent_secrets` (the agents read
//!    from their watched Secrets);
//! 6. `reconciler`: the one shape of every reconciled kind (the entry point and error
//!    policy kube-runtime calls, with per-object backoff);
//! 7. `controller` (wiring: watches, caches, controllers), `http`, `leader`;
//! 8. `app`: the whole process.
//!
//! Modules are private, except those whose paths the binary and the integration tests use
//! (`app`, `config`, `controller`, `leader`, `agents`, `metrics`, `cache`, `objects`,
//! `orphans`). In those, only what they use is `pub`; everywhere else `unreachable_pub`
//! asks for `pub(crate)`.

#![warn(unreachable_pub)]

mod agent_secrets;
pub mod agents;
pub mod app;
mod backoff;
pub mod cache;
pub mod config;
mod context;
pub mod controller;
mod datasource;
mod delete;
mod events;
mod expand;
mod exports;
mod health;
mod http;
pub mod leader;
pub mod metrics;
mod mounters;
pub mod objects;
pub mod orphans;
mod provision;
mod pv;
mod reconciler;
mod reported;
mod schedules;
mod snapshots;
mod usage;

// Test-only code is linked into no other crate: its `pub` is not the crate's interface.
#[cfg(test)]
#[allow(unreachable_pub)]
mod tests;
