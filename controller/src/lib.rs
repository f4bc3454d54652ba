//! nfsprov controller: provisions NFS PersistentVolumes by asking nfsprov agents to create
//! directories on the NFS server, expands them, measures their usage, and deletes, archives
//! or keeps them when released.
//!
//! The names, StorageClass parameters and orphan rules it shares with the kubectl plugin
//! are `nfsprov-vocabulary`'s. Modules depend only downward (the test suite checks that no
//! import cycle exists):
//!
//! 1. leaves: `config`, `metrics`, `backoff`, `reported` (permanent failures already
//!    reported), `events`, and `objects` (the vocabulary's names, and every predicate over
//!    claims, classes and the cached form of volumes);
//! 2. `pv` (a new PV), `cache` (what the watch caches keep), `agents` (the agent clients),
//!    `mounters` (the Nodes and Pods that exports follow);
//! 3. `context`: what every reconciler shares (`Context`, `Error`, event publishing);
//! 4. the reconcilers: `provision`, `delete`, `expand`, `usage`, `orphans`, `exports`, and
//!    `agent_secrets` (the agents read from their watched Secrets);
//! 5. `reconcile`: the entry points kube-runtime calls, with per-object backoff;
//! 6. `controller` (wiring: watches, caches, controllers), `http`, `leader`;
//! 7. `app`: the whole process.

pub mod agent_secrets;
pub mod agents;
pub mod app;
pub mod backoff;
pub mod cache;
pub mod config;
pub mod context;
pub mod controller;
pub mod datasource;
pub mod delete;
pub mod events;
pub mod expand;
pub mod exports;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod mounters;
pub mod objects;
pub mod orphans;
pub mod provision;
pub mod pv;
pub mod reconcile;
pub mod reported;
pub mod usage;

#[cfg(test)]
mod tests;
