//! Test support for the nfsprov agent, kept out of the agent's production build: a real
//! agent serving an export root over HTTPS ([`TestAgent`]), loop-mounted filesystems
//! ([`LoopBtrfs`] for the btrfs quota backend, [`LoopXfs`] with reflinks), a zfs-fuse
//! pool ([`ZfsPool`]), the power-cut check ([`power_cut`]), and the benchmark binaries
//! (agent requests, clones, power cuts).

mod agent;
mod command;
mod filesystems;
pub mod power_cut;
mod zfs;

pub use agent::TestAgent;
pub use command::run;
pub use filesystems::{LoopBtrfs, LoopExt4, LoopXfs};
pub use zfs::{PoolError, ZfsPool};
