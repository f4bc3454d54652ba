//! A tree with every kind of entry a copy, clone or snapshot must keep exactly, and a
//! manifest of a tree to compare two of them entry by entry.

use std::collections::{BTreeMap, HashMap};
use std::os::unix::fs::{FileExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const MIB: u64 = 1 << 20;

/// Writes a tree with every kind of entry a clone must keep exactly.
pub fn write_fixture(volume: &Path) {
    write_tree(volume, true);
}

/// [`write_fixture`], with an extended attribute only when `xattrs` (zfs-fuse has none).
pub fn write_tree(volume: &Path, xattrs: bool) {
    let sub = volume.join("sub/deeper/deepest");
    std::fs::create_dir_all(&sub).unwrap();
    std::fs::write(sub.join("leaf.txt"), b"three levels down").unwrap();
    let data: Vec<u8> = (0..100 * 1024u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(volume.join("data.bin"), &data).unwrap();
    std::fs::write(volume.join("private.txt"), b"for 1234 only").unwrap();
    std::os::unix::fs::chown(volume.join("private.txt"), Some(1234), Some(5678)).unwrap();
    std::fs::set_permissions(
        volume.join("private.txt"),
        std::fs::Permissions::from_mode(0o640),
    )
    .unwrap();
    std::fs::write(volume.join("empty"), b"").unwrap();
    std::fs::create_dir(volume.join("shared")).unwrap();
    std::os::unix::fs::chown(volume.join("shared"), Some(2000), Some(2000)).unwrap();
    std::fs::set_permissions(
        volume.join("shared"),
        std::fs::Permissions::from_mode(0o1777),
    )
    .unwrap();
    std::fs::hard_link(volume.join("data.bin"), volume.join("shared/data-link.bin")).unwrap();
    std::os::unix::fs::symlink("../data.bin", volume.join("shared/relative-link")).unwrap();
    std::os::unix::fs::symlink("/etc", volume.join("escape")).unwrap();
    let sparse = std::fs::File::create(volume.join("sparse.img")).unwrap();
    sparse.set_len(1 << 30).unwrap();
    sparse.write_all_at(&[0xab; 65536], 4096 * 16).unwrap();
    sparse.write_all_at(&[0xcd; 65536], 512 * MIB).unwrap();
    drop(sparse);
    if xattrs {
        rustix::fs::setxattr(
            volume.join("data.bin"),
            "user.origin",
            b"source",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
    }
    rustix::fs::mkfifoat(
        rustix::fs::CWD,
        volume.join("pipe"),
        rustix::fs::Mode::from_raw_mode(0o600),
    )
    .unwrap();
    let past = SystemTime::UNIX_EPOCH + Duration::new(1_600_000_000, 123_456_789);
    std::fs::File::options()
        .write(true)
        .open(volume.join("data.bin"))
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(past))
        .unwrap();
    std::fs::File::open(volume.join("sub"))
        .unwrap()
        .set_times(std::fs::FileTimes::new().set_modified(past))
        .unwrap();
}

/// Every entry below `root` as a comparable line, plus which entries share an inode.
pub fn manifest(root: &Path) -> (BTreeMap<PathBuf, String>, Vec<Vec<PathBuf>>) {
    let mut entries = BTreeMap::new();
    let mut inodes: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    let mut pending = vec![root.to_owned()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let entry = entry.unwrap();
            let full = entry.path();
            let relative = full.strip_prefix(root).unwrap().to_owned();
            let meta = std::fs::symlink_metadata(&full).unwrap();
            let kind = meta.file_type();
            let mut line = format!(
                "mode {:o} owner {}:{} mtime {}.{:09}",
                meta.mode(),
                meta.uid(),
                meta.gid(),
                meta.mtime(),
                meta.mtime_nsec()
            );
            if kind.is_symlink() {
                line += &format!(" link->{}", std::fs::read_link(&full).unwrap().display());
            } else if kind.is_dir() {
                pending.push(full.clone());
            } else if kind.is_file() {
                let data = std::fs::read(&full).unwrap();
                line += &format!(" size {} data {:016x}", meta.len(), fnv(&data));
                // Holes stay holes: far fewer blocks than the apparent size.
                if meta.len() >= 1 << 30 {
                    line += &format!(" sparse {}", meta.blocks() * 512 < 16 * MIB);
                }
                if meta.nlink() > 1 {
                    inodes.entry(meta.ino()).or_default().push(relative.clone());
                }
                let mut value = [0u8; 64];
                if let Ok(n) = rustix::fs::getxattr(&full, "user.origin", &mut value) {
                    line += &format!(" xattr {}", String::from_utf8_lossy(&value[..n]));
                }
            }
            entries.insert(relative, line);
        }
    }
    let mut links: Vec<Vec<PathBuf>> = inodes
        .into_values()
        .map(|mut names| {
            names.sort();
            names
        })
        .collect();
    links.sort();
    (entries, links)
}

fn fnv(data: &[u8]) -> u64 {
    data.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}
