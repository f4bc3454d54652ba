//! nfsprov controller: provisions NFS PersistentVolumes by asking nfsprov agents to create
//! directories on the NFS server, expands them, measures their usage, and deletes, archives
//! or keeps them when released.

pub mod agents;
pub mod app;
pub mod backoff;
pub mod cache;
pub mod config;
pub mod controller;
pub mod delete;
pub mod events;
pub mod expand;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod params;
pub mod pattern;
pub mod provision;
pub mod pv;
pub mod quantity;
pub mod usage;

#[cfg(test)]
mod expand_scenarios;
#[cfg(test)]
mod expand_sim;
#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod real_agent;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod usage_scenarios;
