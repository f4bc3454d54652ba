//! Facts about btrfs subvolumes that more than the quota tool needs: whether a directory
//! is on btrfs, whether it is a subvolume's root, and which subvolume it is. The store's
//! records tell snapshots apart by the subvolume id, and the exports mount a volume's
//! subvolume on its own for ganesha. Only system calls, no tool: `btrfs` itself is driven
//! by the directory backend's btrfs tool.

use std::os::fd::BorrowedFd;

/// `statfs` magic of btrfs.
const BTRFS_SUPER_MAGIC: i64 = 0x9123_683E;
/// Inode number of every subvolume's root directory.
pub(crate) const SUBVOLUME_ROOT_INODE: u64 = 256;

/// Whether the directory is the root of a btrfs subvolume.
pub(crate) fn is_subvolume(dir: BorrowedFd<'_>) -> bool {
    let on_btrfs = rustix::fs::fstatfs(dir).is_ok_and(|s| is_btrfs_magic(s.f_type));
    on_btrfs && rustix::fs::fstat(dir).is_ok_and(|s| s.st_ino == SUBVOLUME_ROOT_INODE)
}

/// `struct btrfs_ioctl_ino_lookup_args` of `linux/btrfs.h`.
#[repr(C)]
struct InoLookupArgs {
    treeid: u64,
    objectid: u64,
    name: [u8; 4080],
}

/// `BTRFS_IOC_INO_LOOKUP`: `_IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args)`.
const INO_LOOKUP: rustix::ioctl::Opcode =
    rustix::ioctl::opcode::read_write::<InoLookupArgs>(0x94, 18);

/// The id of the subvolume `dir` is in: for a subvolume's root (inode 256, which the
/// caller has checked), its own id; `None` off btrfs. A snapshot's root has its source's
/// inode number and birth time; this id is what tells them apart, and it stays the same
/// across remounts (unlike the device number).
pub(crate) fn subvolume_id(dir: BorrowedFd<'_>) -> Option<u64> {
    if !rustix::fs::fstatfs(dir).is_ok_and(|s| is_btrfs_magic(s.f_type)) {
        return None;
    }
    // Asking for the subvolume root's own object id answers the tree id without any
    // capability: the kernel checks CAP_SYS_ADMIN only for other lookups.
    let mut args = InoLookupArgs {
        treeid: 0,
        objectid: SUBVOLUME_ROOT_INODE,
        name: [0; 4080],
    };
    // SAFETY: the opcode's argument is `InoLookupArgs`, laid out as the kernel's struct
    // (4096 bytes), which the kernel reads and fills in place and which outlives the call.
    #[allow(unsafe_code)]
    let looked_up = unsafe {
        rustix::ioctl::ioctl(
            dir,
            rustix::ioctl::Updater::<INO_LOOKUP, InoLookupArgs>::new(&mut args),
        )
    };
    looked_up.ok().map(|()| args.treeid)
}

/// `f_type`'s width differs between architectures, hence the cast.
#[allow(clippy::unnecessary_cast)]
pub(crate) fn is_btrfs_magic(f_type: rustix::fs::FsWord) -> bool {
    f_type as i64 == BTRFS_SUPER_MAGIC
}
