//! Test support for the nfsprov agent, kept out of the agent's production build: a real
//! agent serving an export root over HTTPS ([`TestAgent`]), loop-mounted filesystems for
//! the quota backends ([`LoopBtrfs`]), and the agent benchmark binary.

mod agent;
mod filesystems;

pub use agent::TestAgent;
pub use filesystems::LoopBtrfs;
