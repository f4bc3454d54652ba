//! nfsprov controller: provisions NFS PersistentVolumes by asking nfsprov agents to create
//! directories on the NFS server, expands them, measures their usage, and deletes, archives
//! or keeps them when released.
//!
//! The names, StorageClass parameters and orphan rules it shares with the kubectl plugin
//! are `nfsprov-vocabulary`'s. Modules depend only downward, in this order (the test
//! suite checks it, and that no import cycle exists):
//!
//! 1. leaves: `config`, `metrics`, `backoff`, `reported` (permanent failures already
//!    reported), `events`, and `objects` (the vocabulary's names, and every predicate over
//!    claims, classes and the cached form of volumes);
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

pub(crate) mod agent_secrets;
pub mod agents;
pub mod app;
pub(crate) mod backoff;
pub mod cache;
pub mod config;
pub(crate) mod context;
pub mod controller;
pub(crate) mod datasource;
pub(crate) mod delete;
pub(crate) mod events;
pub(crate) mod expand;
pub(crate) mod exports;
pub(crate) mod http;
pub mod leader;
pub mod metrics;
pub(crate) mod mounters;
pub mod objects;
pub mod orphans;
pub(crate) mod provision;
pub(crate) mod pv;
pub(crate) mod reconciler;
pub(crate) mod reported;
pub(crate) mod schedules;
pub(crate) mod snapshots;
pub(crate) mod usage;

#[cfg(test)]
mod tests;
