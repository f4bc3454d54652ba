//! The name of a snapshot, validated here once for both sides. Its own module, so that
//! the volume types (which name the snapshot a volume was restored from) and the snapshot
//! types (which name volumes) both depend on it and not on each other.

use std::fmt;

use serde::{Deserialize, Serialize};

/// The longest snapshot name, in bytes: a DNS label, so a name made of a Kubernetes
/// object's UID with a short prefix fits.
pub const MAX_SNAPSHOT_NAME: usize = 63;

/// A snapshot's name: 1 to [`MAX_SNAPSHOT_NAME`] lowercase ASCII letters, digits and
/// `-`, starting and ending with a letter or digit. No `/`, `.` or `..`, so a name is
/// always one plain directory entry wherever the agent keeps it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(transparent)]
pub struct SnapshotName(String);

/// Why a string is not a [`SnapshotName`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotNameError {
    #[error("a snapshot name must not be empty")]
    Empty,
    #[error("a snapshot name is at most {MAX_SNAPSHOT_NAME} bytes, not {0}")]
    TooLong(usize),
    #[error(
        "a snapshot name holds only lowercase letters, digits and '-', and starts and ends with a letter or digit"
    )]
    Invalid,
}

impl SnapshotName {
    pub fn parse(raw: &str) -> Result<Self, SnapshotNameError> {
        if raw.is_empty() {
            return Err(SnapshotNameError::Empty);
        }
        if raw.len() > MAX_SNAPSHOT_NAME {
            return Err(SnapshotNameError::TooLong(raw.len()));
        }
        let allowed = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
        let bytes = raw.as_bytes();
        let ends_ok = allowed(bytes[0]) && allowed(bytes[bytes.len() - 1]);
        if !ends_ok || !bytes.iter().all(|&c| allowed(c) || c == b'-') {
            return Err(SnapshotNameError::Invalid);
        }
        Ok(SnapshotName(raw.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SnapshotName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SnapshotName {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::str::FromStr for SnapshotName {
    type Err = SnapshotNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl<'de> Deserialize<'de> for SnapshotName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        SnapshotName::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_labels() {
        for ok in [
            "a",
            "9",
            "snap-0f8e1c2a-5b7d-4e0f-9a1b-2c3d4e5f6a7b",
            &"x".repeat(MAX_SNAPSHOT_NAME),
        ] {
            let name = SnapshotName::parse(ok).unwrap_or_else(|e| panic!("{ok:?}: {e}"));
            assert_eq!(name.as_str(), ok);
        }
    }

    #[test]
    fn refuses_anything_else() {
        for (bad, error) in [
            ("", SnapshotNameError::Empty),
            (
                &"x".repeat(MAX_SNAPSHOT_NAME + 1)[..],
                SnapshotNameError::TooLong(MAX_SNAPSHOT_NAME + 1),
            ),
            ("-a", SnapshotNameError::Invalid),
            ("a-", SnapshotNameError::Invalid),
            ("A", SnapshotNameError::Invalid),
            ("a/b", SnapshotNameError::Invalid),
            ("..", SnapshotNameError::Invalid),
            ("a.b", SnapshotNameError::Invalid),
            ("a b", SnapshotNameError::Invalid),
            ("é", SnapshotNameError::Invalid),
        ] {
            assert_eq!(SnapshotName::parse(bad), Err(error), "{bad:?}");
        }
    }

    #[test]
    fn a_name_is_checked_when_read_from_json() {
        assert!(serde_json::from_str::<SnapshotName>("\"../etc\"").is_err());
        let name: SnapshotName = serde_json::from_str("\"snap-1\"").unwrap();
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"snap-1\"");
    }
}
