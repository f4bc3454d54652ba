//! Mount points beneath a directory, from the kernel's mount table of this process: a
//! volume holding one (a filesystem or a bind mount a tenant or an admin placed inside it)
//! is never deleted, because removing its tree would reach into the mounted directory.

use std::io;
use std::path::{Path, PathBuf};

/// The mount points strictly below `dir` (an absolute path without symlinks).
pub fn mount_points_below(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(parse_mount_points(&table)
        .filter(|point| point != dir && point.starts_with(dir))
        .collect())
}

/// The mount point field of each line (the fifth), with the kernel's octal escapes of
/// space, tab, newline and backslash undone.
fn parse_mount_points(table: &str) -> impl Iterator<Item = PathBuf> + '_ {
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(|field| PathBuf::from(unescape(field)))
}

fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let escaped = bytes
            .get(i + 1..i + 4)
            .filter(|_| bytes[i] == b'\\')
            .and_then(|digits| {
                std::str::from_utf8(digits)
                    .ok()
                    .and_then(|d| u8::from_str_radix(d, 8).ok())
            });
        match escaped {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped_and_only_those_below_count() {
        let table = "\
22 1 8:1 / / rw - ext4 /dev/sda1 rw
40 22 8:1 /data /srv/nfs/ns/v1/in\\040there rw - ext4 /dev/sda1 rw
41 22 0:50 / /srv/nfs/ns/v10 rw - tmpfs tmpfs rw
42 22 0:51 / /srv/nfs/ns/v1 rw - tmpfs tmpfs rw
";
        let below: Vec<PathBuf> = parse_mount_points(table)
            .filter(|p| {
                let dir = Path::new("/srv/nfs/ns/v1");
                p != dir && p.starts_with(dir)
            })
            .collect();
        assert_eq!(below, [PathBuf::from("/srv/nfs/ns/v1/in there")]);
    }
}
