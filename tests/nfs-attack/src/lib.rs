//! An attacker's NFSv4.0 client and the server it attacks, for tests that export
//! isolation holds against forged file handles: a raw client of its own ([`nfs4`],
//! over [`rpc`] and [`xdr`]) that sends any handle bytes from any source address and
//! port with any AUTH_SYS identity; ganesha's handle layout to take handles apart and
//! forge them ([`handle`]); the kernel's handle of a server path ([`kernel`]); and on
//! the server side loop-mounted filesystems ([`filesystems`], [`layout`]), nfs-ganesha
//! on a private D-Bus ([`ganesha`]), volumes made by the agent's own store
//! ([`agent_volumes`]) and the attacks themselves ([`attack`]).

pub mod agent_volumes;
pub mod attack;
pub mod filesystems;
pub mod ganesha;
pub mod handle;
pub mod kernel;
pub mod layout;
pub mod nfs4;
pub mod rpc;
pub mod setup;
pub mod xdr;
