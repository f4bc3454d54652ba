//! nfsprov controller: provisions NFS PersistentVolumes by asking nfsprov agents to create
//! directories on the NFS server, and deletes, archives or keeps them when released.

pub mod agents;
pub mod app;
pub mod cache;
pub mod config;
pub mod controller;
pub mod delete;
pub mod http;
pub mod leader;
pub mod metrics;
pub mod params;
pub mod pattern;
pub mod provision;
pub mod pv;
pub mod quantity;

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod real_agent;
#[cfg(test)]
mod scenarios;
