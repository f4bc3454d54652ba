//! End-to-end harness: the project's binaries run as real processes, a real NFS server
//! (nfs-ganesha) exports their export roots on loopback, and a real userspace NFS client
//! (libnfs-utils) reads and writes through it. Every process started here is stopped
//! when its handle is dropped, also when a test fails.

pub mod agent;
pub mod api_proxy;
pub mod binaries;
pub mod bind_shim;
pub mod cluster;
/// The private bus and ganesha launcher live in the agent testkit, which the power-cut
/// check shares; here under the name the suite has always used.
pub use nfsprov_agent_testkit::ganesha as ganesha_dbus;
// libnfs is a C library: its bindings are the one place this crate needs `unsafe`.
#[allow(unsafe_code)]
pub mod libnfs;
pub mod nfs;
pub mod placement;
pub mod quota;
pub mod requirements;
pub mod system;

pub use nfsprov_agent_testkit::{eventually, free_port};
