//! Test support for the nfsprov agent, kept out of the agent's production build: a real
//! agent serving an export root over HTTPS ([`TestAgent`]), loop-mounted filesystems
//! ([`LoopBtrfs`] for the btrfs quota backend, [`LoopXfs`] with reflinks), a zfs-fuse
//! pool ([`ZfsPool`]), and the benchmark binaries (agent requests, clones).

mod agent;
mod command;
mod filesystems;
mod zfs;

pub use agent::TestAgent;
pub use command::run;
pub use filesystems::{LoopBtrfs, LoopXfs};
pub use zfs::{PoolError, ZfsPool};
