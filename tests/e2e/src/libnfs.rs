//! A userspace NFSv4 client for the tests: a small, safe wrapper over libnfs's synchronous
//! API, for what the libnfs-utils tools cannot do (hard links, symlinks, modes, owners,
//! times, sparse files, directory listings).
//!
//! libnfs is loaded at run time (`dlopen("libnfs.so.13")`), so building never needs it and
//! a machine without it gets a clear error from [`NfsClient::connect`]. Every prototype and
//! struct below is libnfs 4.0.0's (Debian bookworm's libnfs13 4.0.0-1+deb12u1, soname
//! `libnfs.so.13`), as declared in its `include/nfsc/libnfs.h`. Later major versions
//! changed some of them (the `LIBNFS_API_V2` header reorders `nfs_pread`/`nfs_pwrite` to
//! `buf, count, offset` and adds a `port` to `struct nfs_url`), which is why the soname
//! is pinned.
//!
//! Paths are relative to the mounted export (a leading `/` is optional): `"ns/claim-1/a"`
//! is `<export>/ns/claim-1/a` on the server.
//!
//! What libnfs 4.0's NFSv4 client cannot do, and what this module does about it:
//! - it sets attributes by OPENing the path, so chmod, chown and utimes of a directory
//!   fail (NFS4ERR_ISDIR), and lchown/lchmod/lutimes of a symlink change its target: both
//!   are refused up front (`EOPNOTSUPP`); [`NfsClient::mkdir`] gives the mode with the
//!   CREATE, and [`NfsClient::mkdir_owned`] / [`NfsClient::symlink_owned`] make the object
//!   as its owner and rename it into place;
//! - its create is exclusive: [`NfsClient::write_file`] opens an existing file instead;
//! - it encodes each COMPOUND into 4 KiB, so writes go in chunks of 2 KiB;
//! - its READDIR leaves `nfsdirent.inode` 0: listings are names, inodes come from lstat.

mod client;
mod ffi;
mod manifest;

pub use client::*;
pub use ffi::{LIBRARY, available};
pub use manifest::*;

#[cfg(test)]
mod tests;
