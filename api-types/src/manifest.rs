//! The manifest of a replicated tree: one entry per name, in an order both ends compute
//! the same way, so that a receiver can check each entry as it reads it and build the
//! tree in one pass.
//!
//! # Wire format
//!
//! A manifest is a sequence of [`ManifestEntry`] (JSON objects). Its order is pre-order:
//! the root first (path `""`, a directory: the root's own metadata), each directory
//! before its entries, the entries of one directory sorted by the bytes of their names.
//! The same tree always gives the same manifest.
//!
//! Paths are relative to the root, components separated by `/`, never an empty
//! component, `.` or `..`, never a NUL. Names on Linux are bytes, not text, so every byte
//! string (paths, symlink targets, attribute names and values) is a [`WireBytes`]: a JSON
//! string when the bytes are valid UTF-8, else an object `{"hex": "<lowercase hex>"}`.
//! Text stays readable and nothing is lost for the rest.
//!
//! Every field of an entry is read strictly (an unknown field or kind is refused): a
//! receiver that silently dropped metadata a newer sender added would not be exact.
//!
//! A receiver checks every entry it reads with a [`ManifestValidator`] before acting on
//! it: paths, order (a parent before its entries, so each parent is a directory already
//! made), the fields each kind needs and only those, and hard links only to earlier
//! names of the same kind.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Longest path of an entry, in bytes. Entries are reached one component at a time from
/// the root's descriptor, so the kernel's `PATH_MAX` does not bound them; this bounds
/// what a receiver holds per entry.
pub const MAX_MANIFEST_PATH: usize = 64 * 1024;
/// Most components of an entry's path (the agent walks no deeper).
pub const MAX_MANIFEST_DEPTH: usize = 513;
/// Longest name of one component (the Linux `NAME_MAX`).
pub const MAX_MANIFEST_NAME: usize = 255;
/// Longest symlink target (the Linux `PATH_MAX` less its NUL).
pub const MAX_SYMLINK_TARGET: usize = 4095;
/// Longest extended attribute name (`XATTR_NAME_MAX`).
pub const MAX_XATTR_NAME: usize = 255;
/// Largest extended attribute value (`XATTR_SIZE_MAX`).
pub const MAX_XATTR_VALUE: usize = 64 * 1024;
/// Most extended attributes on one entry.
pub const MAX_XATTRS: usize = 1024;

/// Bytes on the wire: a JSON string when they are valid UTF-8, else `{"hex": "..."}`.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct WireBytes(pub Vec<u8>);

impl WireBytes {
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// For messages: lossy, escaped.
    pub fn shown(&self) -> String {
        String::from_utf8_lossy(&self.0).escape_debug().to_string()
    }
}

impl fmt::Debug for WireBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match std::str::from_utf8(&self.0) {
            Ok(text) => write!(f, "{text:?}"),
            Err(_) => write!(f, "hex:{}", to_hex(&self.0)),
        }
    }
}

impl From<&[u8]> for WireBytes {
    fn from(bytes: &[u8]) -> Self {
        Self(bytes.to_vec())
    }
}

impl From<&str> for WireBytes {
    fn from(text: &str) -> Self {
        Self(text.as_bytes().to_vec())
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct HexBytes<'a> {
    hex: Cow<'a, str>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum WireForm<'a> {
    #[serde(borrow)]
    Text(Cow<'a, str>),
    Hex(HexBytes<'a>),
}

impl Serialize for WireBytes {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match std::str::from_utf8(&self.0) {
            Ok(text) => serializer.serialize_str(text),
            Err(_) => HexBytes {
                hex: Cow::Owned(to_hex(&self.0)),
            }
            .serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for WireBytes {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match WireForm::deserialize(deserializer)? {
            WireForm::Text(text) => Ok(Self(text.into_owned().into_bytes())),
            WireForm::Hex(hex) => from_hex(&hex.hex)
                .map(Self)
                .ok_or_else(|| serde::de::Error::custom("invalid hex bytes")),
        }
    }
}

/// Lowercase hex of `bytes`.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// The bytes of lowercase (or uppercase) hex; `None` when it is not hex.
pub fn from_hex(hex: &str) -> Option<Vec<u8>> {
    let digits = hex.as_bytes();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    let value = |d: u8| (d as char).to_digit(16);
    digits
        .chunks(2)
        .map(|pair| Some((value(pair[0])? * 16 + value(pair[1])?) as u8))
        .collect()
}

/// What an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EntryKind {
    Directory,
    File,
    Symlink,
    Fifo,
    Socket,
    CharDevice,
    BlockDevice,
}

impl EntryKind {
    fn is_device(self) -> bool {
        matches!(self, EntryKind::CharDevice | EntryKind::BlockDevice)
    }
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Xattr {
    pub name: WireBytes,
    pub value: WireBytes,
}

/// One name of the tree and the metadata of what it names.
///
/// A hard-linked inode appears under each of its names, with the same metadata each
/// time; every name after the first carries `link`, the path of the first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManifestEntry {
    /// Relative to the root; `""` is the root itself.
    pub path: WireBytes,
    pub kind: EntryKind,
    /// Permission bits with the set-user-ID, set-group-ID and sticky bits (`0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Access time in nanoseconds since the epoch; absent when not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub atime_ns: Option<i64>,
    /// Modification time in nanoseconds since the epoch.
    pub mtime_ns: i64,
    /// Bytes of a regular file (holes included); 0 for the rest.
    #[serde(default)]
    pub size: u64,
    /// Regular files: lowercase hex SHA-256 of the whole content, holes read as zeros.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sha256: Option<String>,
    /// Symlinks: the target, never followed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<WireBytes>,
    /// Devices: the device number as the kernel encodes it (`makedev`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rdev: Option<u64>,
    /// Sorted by name; never `user.nfsprov.volume`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub xattrs: Vec<Xattr>,
    /// The path of the first name of this inode, for each later name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<WireBytes>,
}

/// Why an entry read from the wire is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest entry {path}: {reason}")]
    Entry { path: String, reason: String },
    #[error("the manifest's first entry must be the root directory (path \"\")")]
    NoRoot,
    #[error("the manifest has a second root entry")]
    SecondRoot,
}

fn refuse(path: &[u8], reason: impl Into<String>) -> ManifestError {
    ManifestError::Entry {
        path: WireBytes(path.to_vec()).shown(),
        reason: reason.into(),
    }
}

/// The components of a valid non-root path, or why it is not one.
pub fn path_components(path: &[u8]) -> Result<Vec<&[u8]>, ManifestError> {
    if path.is_empty() {
        return Ok(Vec::new());
    }
    if path.len() > MAX_MANIFEST_PATH {
        return Err(refuse(
            &path[..64],
            format!("path longer than {MAX_MANIFEST_PATH} bytes"),
        ));
    }
    if path.contains(&0) {
        return Err(refuse(path, "path contains a NUL byte"));
    }
    if path[0] == b'/' {
        return Err(refuse(path, "path is absolute"));
    }
    let components: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    if components.len() > MAX_MANIFEST_DEPTH {
        return Err(refuse(
            path,
            format!("path deeper than {MAX_MANIFEST_DEPTH} components"),
        ));
    }
    for component in &components {
        match *component {
            b"" => return Err(refuse(path, "path has an empty component")),
            b"." | b".." => return Err(refuse(path, "path has a `.` or `..` component")),
            name if name.len() > MAX_MANIFEST_NAME => {
                return Err(refuse(
                    path,
                    format!("a component is longer than {MAX_MANIFEST_NAME} bytes"),
                ));
            }
            _ => {}
        }
    }
    Ok(components)
}

/// Checks what one entry says on its own: its path, the fields its kind needs and only
/// those, its mode and attributes. [`ManifestValidator`] adds the checks of order.
pub fn validate_entry(entry: &ManifestEntry) -> Result<(), ManifestError> {
    let path = entry.path.as_bytes();
    path_components(path)?;
    let kind = entry.kind;
    if entry.mode & !0o7777 != 0 {
        return Err(refuse(path, "mode has bits beyond 0o7777"));
    }
    match (&entry.sha256, kind) {
        (Some(sha), EntryKind::File) => {
            if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
                return Err(refuse(path, "sha256 is not 64 lowercase hex digits"));
            }
        }
        (None, EntryKind::File) => return Err(refuse(path, "a file without sha256")),
        (Some(_), _) => return Err(refuse(path, "sha256 on an entry that is not a file")),
        (None, _) => {}
    }
    if kind != EntryKind::File && entry.size != 0 {
        return Err(refuse(path, "a size on an entry that is not a file"));
    }
    match (&entry.target, kind) {
        (Some(target), EntryKind::Symlink) => {
            let target = target.as_bytes();
            if target.is_empty() || target.len() > MAX_SYMLINK_TARGET || target.contains(&0) {
                return Err(refuse(
                    path,
                    format!(
                        "symlink target empty, longer than {MAX_SYMLINK_TARGET} bytes or with a NUL"
                    ),
                ));
            }
        }
        (None, EntryKind::Symlink) => return Err(refuse(path, "a symlink without target")),
        (Some(_), _) => return Err(refuse(path, "target on an entry that is not a symlink")),
        (None, _) => {}
    }
    match (entry.rdev, kind.is_device()) {
        (None, true) => return Err(refuse(path, "a device without rdev")),
        (Some(_), false) => return Err(refuse(path, "rdev on an entry that is not a device")),
        _ => {}
    }
    if kind == EntryKind::Directory && entry.link.is_some() {
        return Err(refuse(path, "a directory cannot be a hard link"));
    }
    if path.is_empty() && kind != EntryKind::Directory {
        return Err(refuse(path, "the root must be a directory"));
    }
    if entry.xattrs.len() > MAX_XATTRS {
        return Err(refuse(path, format!("more than {MAX_XATTRS} xattrs")));
    }
    let mut previous: Option<&[u8]> = None;
    for xattr in &entry.xattrs {
        let name = xattr.name.as_bytes();
        if name.is_empty() || name.len() > MAX_XATTR_NAME || name.contains(&0) {
            return Err(refuse(
                path,
                "an xattr name is empty, too long or has a NUL",
            ));
        }
        if xattr.value.as_bytes().len() > MAX_XATTR_VALUE {
            return Err(refuse(
                path,
                format!("an xattr value is larger than {MAX_XATTR_VALUE} bytes"),
            ));
        }
        if previous.is_some_and(|p| p >= name) {
            return Err(refuse(path, "xattrs not sorted by name or repeated"));
        }
        previous = Some(name);
    }
    Ok(())
}

/// Checks each entry of a manifest as it is read, in order: [`validate_entry`], then
/// that the root comes first, that each entry's parent is a directory met earlier and
/// still open in the pre-order walk, that the names of a directory come sorted, and that
/// a `link` names an earlier entry of the same kind that is not itself a link.
///
/// Memory: the chain of open directories (bounded by the depth), and the path and kind
/// of every non-directory entry that is not a link, for the links to name (this one
/// grows with the number of files).
#[derive(Debug, Default)]
pub struct ManifestValidator {
    root_seen: bool,
    /// The open directories, root first: each one's path and the last name met in it.
    open: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    linkable: HashMap<Vec<u8>, EntryKind>,
}

impl ManifestValidator {
    pub fn new() -> Self {
        Self::default()
    }

    /// Checks the next entry of the manifest.
    pub fn check(&mut self, entry: &ManifestEntry) -> Result<(), ManifestError> {
        validate_entry(entry)?;
        let path = entry.path.as_bytes();
        if path.is_empty() {
            if self.root_seen {
                return Err(ManifestError::SecondRoot);
            }
            self.root_seen = true;
            self.open.push((Vec::new(), None));
            return Ok(());
        }
        if !self.root_seen {
            return Err(ManifestError::NoRoot);
        }
        let (parent, name) = match path.iter().rposition(|b| *b == b'/') {
            Some(slash) => (&path[..slash], &path[slash + 1..]),
            None => (&path[..0], path),
        };
        // Leave the directories that are done: pre-order never comes back to them.
        while self.open.last().is_some_and(|(open, _)| open != parent) {
            self.open.pop();
        }
        let Some((_, last)) = self.open.last_mut() else {
            return Err(refuse(
                path,
                "its parent is not a directory listed before it (out of order, or unknown)",
            ));
        };
        if last.as_deref().is_some_and(|last| last >= name) {
            return Err(refuse(
                path,
                "names of a directory not sorted by their bytes, or repeated",
            ));
        }
        *last = Some(name.to_vec());
        if let Some(link) = &entry.link {
            match self.linkable.get(link.as_bytes()) {
                Some(kind) if *kind == entry.kind => {}
                Some(_) => return Err(refuse(path, "a hard link to an entry of another kind")),
                None => {
                    return Err(refuse(
                        path,
                        "a hard link to a path not listed before it (or itself a link, or a directory)",
                    ));
                }
            }
        } else if entry.kind != EntryKind::Directory {
            self.linkable.insert(path.to_vec(), entry.kind);
        }
        if entry.kind == EntryKind::Directory {
            self.open.push((path.to_vec(), None));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(path: &str, kind: EntryKind) -> ManifestEntry {
        ManifestEntry {
            path: path.into(),
            kind,
            mode: 0o755,
            uid: 0,
            gid: 0,
            atime_ns: None,
            mtime_ns: 0,
            size: 0,
            sha256: (kind == EntryKind::File).then(|| "0".repeat(64)),
            target: (kind == EntryKind::Symlink).then(|| "t".into()),
            rdev: None,
            xattrs: Vec::new(),
            link: None,
        }
    }

    fn check_all(entries: &[ManifestEntry]) -> Result<(), ManifestError> {
        let mut validator = ManifestValidator::new();
        entries.iter().try_for_each(|e| validator.check(e))
    }

    fn refused(entries: &[ManifestEntry], expected: &str) {
        match check_all(entries) {
            Err(e) => assert!(e.to_string().contains(expected), "{e}"),
            Ok(()) => panic!("accepted: {entries:?}"),
        }
    }

    #[test]
    fn bytes_travel_as_text_or_hex() {
        let text = WireBytes::from("héllo");
        assert_eq!(serde_json::to_string(&text).unwrap(), "\"héllo\"");
        let raw = WireBytes(vec![b'a', 0xff, 0]);
        let json = serde_json::to_string(&raw).unwrap();
        assert_eq!(json, r#"{"hex":"61ff00"}"#);
        assert_eq!(serde_json::from_str::<WireBytes>(&json).unwrap(), raw);
        assert_eq!(
            serde_json::from_str::<WireBytes>("\"héllo\"").unwrap(),
            text
        );
        assert!(serde_json::from_str::<WireBytes>(r#"{"hex":"6"}"#).is_err());
        assert!(serde_json::from_str::<WireBytes>(r#"{"hex":"zz"}"#).is_err());
        assert!(serde_json::from_str::<WireBytes>(r#"{"hex":"61","x":1}"#).is_err());
    }

    #[test]
    fn an_entry_round_trips_and_unknown_kinds_or_fields_are_refused() {
        let mut file = entry("a/b", EntryKind::File);
        file.xattrs.push(Xattr {
            name: "user.x".into(),
            value: WireBytes(vec![0, 1, 2]),
        });
        file.atime_ns = Some(-5);
        let json = serde_json::to_string(&file).unwrap();
        assert_eq!(serde_json::from_str::<ManifestEntry>(&json).unwrap(), file);
        let unknown_kind = json.replace("\"file\"", "\"door\"");
        assert!(serde_json::from_str::<ManifestEntry>(&unknown_kind).is_err());
        let unknown_field = json.replacen('{', "{\"colour\":1,", 1);
        assert!(serde_json::from_str::<ManifestEntry>(&unknown_field).is_err());
    }

    #[test]
    fn bad_paths_are_refused() {
        let root = entry("", EntryKind::Directory);
        for (path, why) in [
            ("../x", "`..`"),
            ("a/../b", "`..`"),
            ("./a", "`.`"),
            ("/etc", "absolute"),
            ("a//b", "empty component"),
            ("a/", "empty component"),
            ("a\0b", "NUL"),
        ] {
            refused(&[root.clone(), entry(path, EntryKind::File)], why);
        }
        let long = "n".repeat(MAX_MANIFEST_NAME + 1);
        refused(&[root.clone(), entry(&long, EntryKind::File)], "longer");
        let deep = vec!["d"; MAX_MANIFEST_DEPTH + 1].join("/");
        refused(&[root.clone(), entry(&deep, EntryKind::File)], "deeper");
        let huge = vec!["d"; MAX_MANIFEST_PATH / 2 + 1].join("/");
        refused(&[root, entry(&huge, EntryKind::File)], "longer");
    }

    #[test]
    fn order_and_parents_are_checked() {
        let root = entry("", EntryKind::Directory);
        let dir = entry("a", EntryKind::Directory);
        let good = [
            root.clone(),
            dir.clone(),
            entry("a/x", EntryKind::File),
            entry("a/y", EntryKind::Directory),
            entry("a/y/z", EntryKind::Fifo),
            entry("b", EntryKind::File),
        ];
        check_all(&good).unwrap();
        refused(&[entry("a", EntryKind::File)], "first entry");
        refused(&[root.clone(), root.clone()], "second root");
        // Parent unknown, parent not a directory, parent already left.
        refused(&[root.clone(), entry("a/x", EntryKind::File)], "parent");
        refused(
            &[
                root.clone(),
                entry("a", EntryKind::Symlink),
                entry("a/x", EntryKind::File),
            ],
            "parent",
        );
        refused(
            &[
                root.clone(),
                dir.clone(),
                entry("b", EntryKind::File),
                entry("a/x", EntryKind::File),
            ],
            "parent",
        );
        // Unsorted and repeated names.
        refused(
            &[
                root.clone(),
                entry("b", EntryKind::File),
                entry("a", EntryKind::File),
            ],
            "sorted",
        );
        refused(
            &[
                root.clone(),
                entry("b", EntryKind::File),
                entry("b", EntryKind::File),
            ],
            "sorted",
        );
        // Names are compared within their directory: "a-b" comes after all of "a".
        check_all(&[
            root,
            dir,
            entry("a/x", EntryKind::File),
            entry("a-b", EntryKind::File),
        ])
        .unwrap();
    }

    #[test]
    fn links_name_an_earlier_entry_of_their_kind() {
        let root = entry("", EntryKind::Directory);
        let mut link = entry("b", EntryKind::File);
        link.link = Some("a".into());
        check_all(&[root.clone(), entry("a", EntryKind::File), link.clone()]).unwrap();
        refused(&[root.clone(), link.clone()], "not listed before");
        let mut later = entry("a", EntryKind::File);
        later.link = Some("b".into());
        refused(
            &[root.clone(), later, entry("b", EntryKind::File)],
            "not listed before",
        );
        refused(
            &[root.clone(), entry("a", EntryKind::Fifo), link.clone()],
            "another kind",
        );
        refused(
            &[root.clone(), entry("a", EntryKind::Directory), link],
            "not listed before",
        );
        let mut dir_link = entry("c", EntryKind::Directory);
        dir_link.link = Some("a".into());
        refused(
            &[root, entry("a", EntryKind::Directory), dir_link],
            "directory",
        );
    }

    #[test]
    fn fields_must_fit_the_kind() {
        let root = entry("", EntryKind::Directory);
        let mut e = entry("a", EntryKind::File);
        e.sha256 = None;
        refused(&[root.clone(), e], "without sha256");
        let mut e = entry("a", EntryKind::File);
        e.sha256 = Some("A".repeat(64));
        refused(&[root.clone(), e], "lowercase");
        let mut e = entry("a", EntryKind::Symlink);
        e.target = None;
        refused(&[root.clone(), e], "without target");
        let mut e = entry("a", EntryKind::Symlink);
        e.target = Some(WireBytes(b"x\0y".to_vec()));
        refused(&[root.clone(), e], "NUL");
        refused(&[root.clone(), entry("a", EntryKind::CharDevice)], "rdev");
        let mut e = entry("a", EntryKind::Fifo);
        e.mode = 0o10644;
        refused(&[root.clone(), e], "mode");
        let mut e = entry("a", EntryKind::Fifo);
        e.xattrs = vec![
            Xattr {
                name: "user.b".into(),
                value: "1".into(),
            },
            Xattr {
                name: "user.a".into(),
                value: "1".into(),
            },
        ];
        refused(&[root.clone(), e], "sorted");
        let mut e = entry("a", EntryKind::Fifo);
        e.size = 3;
        refused(&[root, e], "size");
    }
}
