//! File-level incremental replication of a volume's snapshot from one agent (the
//! source) to another (the target), as library code both ends call; the transport is
//! the caller's.
//!
//! The source [`scan`]s a snapshot into its manifest (the wire format is
//! [`nfsprov_api_types::manifest`]): one entry per name, pre-order, names sorted by
//! their bytes, every regular file with the SHA-256 of its content (holes read as
//! zeros). The target [`build`]s the tree the manifest describes in an empty staging
//! directory, taking each file whose content its previous replica (the [`Base`]) already
//! holds from there (shared with `FICLONE` where the filesystem can, else copied with
//! its holes), and asking its caller to fetch only the others, whose data travels with
//! [`send_extents`] and [`receive_extents`] (data extents only, so sparse files stay
//! sparse). Every file's content is checked against its hash before it is named. The
//! caller then renames the staging tree into place.
//!
//! Over HTTPS (see `docs/replication.md`): the source's transfer endpoints send the
//! manifest and each file's extents through `wire` and `stream`, and the target's
//! `pull` reads them as they arrive into a build.
//!
//! # What is kept
//!
//! As in the local copy (`store/copy`, whose helpers this reuses, and whose
//! documentation says why for each): type, content, holes, owner, mode with the set-ID
//! and sticky bits, access and modification times to the nanosecond, extended
//! attributes (ACLs, capabilities and labels are attributes), symlink targets (never
//! followed), fifos, sockets and device numbers, hard links between names of the tree.
//! Metadata is set in the copy's order: data, owner, attributes, mode, times; a
//! directory's after all its entries. Not kept: change and birth times, inode numbers,
//! the order of directory entries, inode flags, `user.nfsprov.volume` (a forged record),
//! attributes the agent cannot read, `user.*` attributes on symlinks (Linux allows
//! none), and the access times of symlinks (reading a link moves it, so the scan leaves
//! it out and the builder lets the kernel set it). Attributes a new entry gets from the target's filesystem by itself (an
//! inherited default ACL, an SELinux label) and the manifest does not list stay.
//! Times are kept between the years 1678 and 2262 (nanoseconds in 64 bits); a tree with
//! others fails to scan.
//!
//! # Safety
//!
//! A receiver trusts nothing of the manifest: each entry is checked
//! ([`nfsprov_api_types::manifest::ManifestValidator`]) before anything is made for it,
//! so no path leaves the staging directory, every parent is a directory made earlier,
//! and a hard link names an earlier file. Every directory of the staging tree is opened
//! from its parent with `O_NOFOLLOW`: a symlink left in the staging directory (by an
//! earlier build, or anyone) is refused, never followed. A file's content is checked
//! against the manifest's hash whether it was fetched or taken from the base.
//!
//! # Durability
//!
//! Every file is synced before it is named, every directory after its metadata, and the
//! staging directory's filesystem once more at the end (symlinks and special files
//! cannot be opened to be synced): when [`build`] returns, all of it is on disk.
//!
//! # Resuming
//!
//! A build cut short (a crash, a failed fetch) leaves its staging directory as it was;
//! [`build`] called again on it with the same manifest finishes it. What is reused:
//! every regular file found under its final name with the manifest's size and hash
//! (re-hashed, its metadata set again), since a file is written unnamed (`O_TMPFILE`)
//! and named only once its content is checked, its metadata set and it is synced;
//! directories (made again only if missing, their metadata set again); symlinks and
//! special files that are what the manifest says; hard links to the right inode. What
//! is not: a file being fetched when the build stopped (it had no name, the kernel
//! freed it), any file whose size or hash differs (removed, got again), anything of
//! another kind under a name (removed; a directory there stops the build instead).
//! Names the manifest does not have are left alone: a staging directory built from
//! another manifest is the caller's to empty.
//!
//! The filesystem of the staging directory must support `O_TMPFILE` (ext4, XFS, Btrfs,
//! tmpfs and OpenZFS do).
//!
//! # Memory
//!
//! The scan holds the names of each directory on the path it walks (sorted, so read
//! whole) and the first name of each inode with several names. The builder holds the
//! chain of open directories, the validator's path of every non-directory entry (for
//! hard links to name), and, given a base, one path per distinct content of the base.

mod build;
mod common;
mod extents;
pub(crate) mod jobs;
pub(crate) mod pull;
mod scan;
pub(crate) mod stream;
mod wire;

pub use self::build::{Base, BuildStats, Fetch, build};
pub use self::extents::{MAX_FRAME_DATA, receive_extents, send_extents};
pub use self::scan::{ScanStats, scan};
pub(crate) use self::wire::{decode_path, open_file, write_manifest};

#[cfg(test)]
mod tests;
