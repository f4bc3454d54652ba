//! The Kubernetes-side vocabulary of nfsprov, shared by the controller and the kubectl
//! plugin so that both read and write objects the same way:
//!
//! - [`names`]: the default provisioner name, the annotations and the finalizer nfsprov
//!   puts on claims and volumes, and the Kubernetes names it relies on;
//! - [`exports`]: the export a class asks for (who may mount, squashing, read-only);
//! - [`params`]: StorageClass `parameters`, parsed strictly, with [`pattern`] for
//!   `pathPattern` templates;
//! - [`quantity`]: resource quantities as byte counts;
//! - [`snapshots`]: the `Snapshot` and `SnapshotSchedule` resources and their names;
//! - [`archive_restore`]: how a claim names the archive it is made from, and which
//!   archives a claim may be made from;
//! - [`orphans`]: which PVs expect their directory and how an agent's listing compares with
//!   the PVs pointing to it.
//!
//! What belongs here is pure: names, parsing and predicates over values, no I/O; a name
//! belongs with the other names even while only one side reads it. What does not: talking
//! to the API server or an agent, the controller's caches and the forms they keep objects
//! in, metrics, events, reports, anything async or process-wide (an allocator, an HTTP
//! server). The agent API is `nfsprov-api-types`' alone; this crate builds on it, never
//! repeats it.

#![forbid(unsafe_code)]

pub mod archive_restore;
pub mod exports;
pub mod names;
pub mod orphans;
pub mod params;
pub mod pattern;
pub mod quantity;
pub mod snapshots;
