//! Archive identifiers: which archive of which volume the archive endpoints act on. The
//! agent names archive entries by this grammar and both sides parse with it, so every
//! archive the agent lists is one it accepts back, and nothing else is.
//!
//! An archive of the volume `ns/claim` lives at `.archive/ns/claim/@<UTC time>` beneath
//! the export root, and its identifier is `ns/claim/@<UTC time>`. The time is written
//! `YYYYMMDDTHHMMSS.nnnnnnnnnZ`; a second archive of the same path within the same
//! nanosecond gets `-1`, `-2`, ... up to [`MAX_ARCHIVE_SUFFIX`].

use std::cmp::Ordering;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::path::{PathError, VolumePath};

/// First character of an archive entry. Volume paths cannot contain it, so an archive
/// entry can never be mistaken for (or collide with) a volume.
pub const ARCHIVE_ENTRY_PREFIX: char = '@';
/// Highest counter an entry made within the same nanosecond as another gets.
pub const MAX_ARCHIVE_SUFFIX: u32 = 99;
/// Length of the time in an entry: `YYYYMMDDTHHMMSS.nnnnnnnnnZ`.
const STAMP_LEN: usize = 26;

/// Why a string is not an archive identifier.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArchivePathError {
    #[error(
        "{0:?} names no archive: an archive is <volume path>/@<UTC time>, such as ns/claim/@20260102T030405.000000006Z"
    )]
    NoEntry(String),
    #[error("the volume path of the archive is invalid: {0}")]
    Volume(#[from] PathError),
    #[error(
        "archive entry {0:?} is not @<UTC time> or @<UTC time>-<n> (time as 20260102T030405.000000006Z, n from 1 to {MAX_ARCHIVE_SUFFIX})"
    )]
    Entry(String),
}

/// The last component of an archive's location: `@<UTC time>` or `@<UTC time>-<n>`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ArchiveEntry {
    text: String,
    /// 0 when the entry has no counter.
    suffix: u32,
}

impl ArchiveEntry {
    pub fn parse(raw: &str) -> Result<Self, ArchivePathError> {
        let invalid = || ArchivePathError::Entry(raw.to_owned());
        let rest = raw.strip_prefix(ARCHIVE_ENTRY_PREFIX).ok_or_else(invalid)?;
        let stamp = rest.get(..STAMP_LEN).ok_or_else(invalid)?;
        if !is_stamp(stamp) {
            return Err(invalid());
        }
        let suffix = match &rest[STAMP_LEN..] {
            "" => 0,
            counter => {
                let digits = counter.strip_prefix('-').ok_or_else(invalid)?;
                let canonical = !digits.is_empty()
                    && !digits.starts_with('0')
                    && digits.len() <= 2
                    && digits.bytes().all(|b| b.is_ascii_digit());
                if !canonical {
                    return Err(invalid());
                }
                digits.parse::<u32>().map_err(|_| invalid())?
            }
        };
        if suffix > MAX_ARCHIVE_SUFFIX {
            return Err(invalid());
        }
        Ok(Self {
            text: raw.to_owned(),
            suffix,
        })
    }

    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// The UTC time as written in the entry, `YYYYMMDDTHHMMSS.nnnnnnnnnZ`.
    pub fn stamp(&self) -> &str {
        &self.text[1..=STAMP_LEN]
    }

    /// The counter of an entry made in the same nanosecond as an earlier one; 0 for none.
    pub fn suffix(&self) -> u32 {
        self.suffix
    }
}

/// Entries order by time, then by counter (`-10` after `-9`), so the newest is the
/// greatest.
impl Ord for ArchiveEntry {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.stamp(), self.suffix).cmp(&(other.stamp(), other.suffix))
    }
}

impl PartialOrd for ArchiveEntry {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ArchiveEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

/// `YYYYMMDDTHHMMSS.nnnnnnnnnZ` naming a real instant (no 30 February, no leap second:
/// the agent never writes one).
fn is_stamp(stamp: &str) -> bool {
    let b = stamp.as_bytes();
    let digits = |range: std::ops::Range<usize>| b[range].iter().all(u8::is_ascii_digit);
    let number = |range: std::ops::Range<usize>| {
        b[range]
            .iter()
            .fold(0u32, |n, d| n * 10 + u32::from(d - b'0'))
    };
    let shaped = b.len() == STAMP_LEN
        && digits(0..8)
        && b[8] == b'T'
        && digits(9..15)
        && b[15] == b'.'
        && digits(16..25)
        && b[25] == b'Z';
    if !shaped {
        return false;
    }
    let (year, month, day) = (number(0..4), number(4..6), number(6..8));
    let leap = year % 4 == 0 && (year % 100 != 0 || year % 400 == 0);
    let days = match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if leap => 29,
        2 => 28,
        _ => return false,
    };
    (1..=days).contains(&day) && number(9..11) < 24 && number(11..13) < 60 && number(13..15) < 60
}

/// One archive: the volume path it was archived from and its entry, written
/// `<volume path>/@<entry>` (what `DELETE /v1/archives/{id}` takes and `GET /v1/archives`
/// reports as `id`). It lives at `.archive/<id>` beneath the export root.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArchivePath {
    volume: VolumePath,
    entry: ArchiveEntry,
}

impl ArchivePath {
    /// Validates `raw` (`<volume path>/@<entry>`) and returns it as an archive identifier.
    pub fn parse(raw: &str) -> Result<Self, ArchivePathError> {
        let Some((volume, entry)) = raw.rsplit_once('/') else {
            return Err(ArchivePathError::NoEntry(raw.to_owned()));
        };
        if !entry.starts_with(ARCHIVE_ENTRY_PREFIX) {
            return Err(ArchivePathError::NoEntry(raw.to_owned()));
        }
        Ok(Self {
            volume: VolumePath::parse(volume)?,
            entry: ArchiveEntry::parse(entry)?,
        })
    }

    pub fn new(volume: VolumePath, entry: ArchiveEntry) -> Self {
        Self { volume, entry }
    }

    /// The path of the volume this is an archive of.
    pub fn volume(&self) -> &VolumePath {
        &self.volume
    }

    pub fn entry(&self) -> &ArchiveEntry {
        &self.entry
    }
}

impl fmt::Display for ArchivePath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.volume, self.entry)
    }
}

impl std::str::FromStr for ArchivePath {
    type Err = ArchivePathError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Serialize for ArchivePath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ArchivePath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        ArchivePath::parse(&raw).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAMP: &str = "20261122T060102.123456789Z";

    #[test]
    fn accepts_the_names_the_agent_gives() {
        for (raw, volume, suffix) in [
            (format!("ns/claim/@{STAMP}"), "ns/claim", 0),
            (format!("a/@{STAMP}-1"), "a", 1),
            (format!("a/b/c/@{STAMP}-99"), "a/b/c", 99),
            ("x/@20000229T235959.000000000Z".to_owned(), "x", 0),
        ] {
            let id = ArchivePath::parse(&raw).unwrap_or_else(|e| panic!("{raw}: {e}"));
            assert_eq!(id.volume().as_str(), volume);
            assert_eq!(id.entry().suffix(), suffix);
            assert_eq!(id.to_string(), raw);
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<ArchivePath>(&json).unwrap(), id);
        }
    }

    #[test]
    fn rejects_hostile_and_malformed_ids() {
        let no_entry = [
            "",
            "/",
            "ns/claim",
            "ns/claim/",
            "@20261122T060102.123456789Z",
            "ns/claim/@20261122T060102.123456789Z/..",
            "ns/claim/@20261122T060102.123456789Z/x",
        ];
        for raw in no_entry {
            assert_eq!(
                ArchivePath::parse(raw),
                Err(ArchivePathError::NoEntry(raw.to_owned())),
                "{raw:?}"
            );
        }
        let bad_volume = [
            format!("../@{STAMP}"),
            format!("../../etc/@{STAMP}"),
            format!("/etc/@{STAMP}"),
            format!(".archive/x/@{STAMP}"),
            format!("a//b/@{STAMP}"),
            format!("a/./@{STAMP}"),
            format!("a@b/@{STAMP}"),
            format!("a/@{STAMP}/@{STAMP}"),
        ];
        for raw in &bad_volume {
            assert!(
                matches!(ArchivePath::parse(raw), Err(ArchivePathError::Volume(_))),
                "{raw:?}"
            );
        }
        let bad_entry = [
            "a/@",
            "a/@..",
            "a/@20261122T060102.123456789",
            "a/@20261122T060102.123456789Z-",
            "a/@20261122T060102.123456789Z-0",
            "a/@20261122T060102.123456789Z-01",
            "a/@20261122T060102.123456789Z-100",
            "a/@20261122T060102.123456789Z-1-1",
            "a/@20261122T060102.123456789Zx",
            "a/@20261322T060102.123456789Z",
            "a/@20261100T060102.123456789Z",
            "a/@20260230T060102.123456789Z",
            "a/@19000229T060102.123456789Z",
            "a/@20261131T060102.123456789Z",
            "a/@20261122T240102.123456789Z",
            "a/@20261122T066102.123456789Z",
            "a/@20261122T060160.123456789Z",
            "a/@2026112xT060102.123456789Z",
            "a/@20261122 060102.123456789Z",
            "a/@20261122T060102.12345678éZ",
            "a/@20261122T060102.123456789Z\0",
        ];
        for raw in bad_entry {
            assert!(
                matches!(ArchivePath::parse(raw), Err(ArchivePathError::Entry(_))),
                "{raw:?}: {:?}",
                ArchivePath::parse(raw)
            );
        }
        assert!(serde_json::from_str::<ArchivePath>("\"ns/claim\"").is_err());
    }

    #[test]
    fn entries_order_by_time_then_counter() {
        let entry = |raw: &str| ArchiveEntry::parse(raw).unwrap();
        let mut entries = [
            entry(&format!("@{STAMP}-10")),
            entry("@20261122T060102.123456790Z"),
            entry(&format!("@{STAMP}-9")),
            entry(&format!("@{STAMP}")),
        ];
        entries.sort();
        let names: Vec<&str> = entries.iter().map(ArchiveEntry::as_str).collect();
        assert_eq!(
            names,
            [
                format!("@{STAMP}"),
                format!("@{STAMP}-9"),
                format!("@{STAMP}-10"),
                "@20261122T060102.123456790Z".to_owned(),
            ]
        );
        assert_eq!(entries[0].stamp(), STAMP);
    }
}
