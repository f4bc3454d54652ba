//! Names in the archive area: `.archive/<path>/@<UTC time>`, so archiving the same path
//! twice never overwrites anything and the newest archive is found by sorting names.

use nfsprov_api_types::{ArchiveResult, VolumePath};
use time::OffsetDateTime;

/// Archive area beneath the root; archives keep the volume's path below it.
pub const ARCHIVE_DIR: &str = ".archive";
/// Archive entries start with a character volume paths cannot contain, so an archive
/// can never be mistaken for (or collide with) a nested volume name.
const ARCHIVE_ENTRY_PREFIX: char = '@';

const ARCHIVE_STAMP: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year][month][day]T[hour][minute][second].[subsecond digits:9]Z"
);

/// The components of the archive directory of `path`, below the root.
pub fn archive_components(path: &VolumePath) -> Vec<&str> {
    let mut components = vec![ARCHIVE_DIR];
    components.extend(path.components());
    components
}

/// The archive entry names to try, in order, for an archive made at `at`: the time, then
/// the time with a counter for archives of the same path within the same nanosecond.
pub fn archive_entries(at: OffsetDateTime) -> impl Iterator<Item = String> {
    let stamp = archive_stamp(at);
    (0..100u32).map(move |attempt| match attempt {
        0 => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}"),
        n => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}-{n}"),
    })
}

/// The newest of the given entry names of one archive directory.
pub fn latest_entry(names: impl IntoIterator<Item = String>) -> Option<String> {
    // Stamps sort chronologically as text; a "-N" suffix sorts after its base stamp.
    names
        .into_iter()
        .filter(|name| name.starts_with(ARCHIVE_ENTRY_PREFIX))
        .max()
}

/// The archive path below the root of `path`'s archive `entry`.
pub fn archive_path(path: &VolumePath, entry: &str) -> String {
    format!("{ARCHIVE_DIR}/{path}/{entry}")
}

pub fn archive_result(path: &VolumePath, entry: &str) -> ArchiveResult {
    let stamp = entry.trim_start_matches(ARCHIVE_ENTRY_PREFIX);
    let stamp = stamp.split_once('-').map_or(stamp, |(base, _)| base);
    ArchiveResult {
        path: path.clone(),
        archive_path: archive_path(path, entry),
        archived_at: archive_stamp_to_rfc3339(stamp).unwrap_or_default(),
    }
}

fn archive_stamp(at: OffsetDateTime) -> String {
    at.format(ARCHIVE_STAMP)
        .unwrap_or_else(|_| at.unix_timestamp_nanos().to_string())
}

fn archive_stamp_to_rfc3339(stamp: &str) -> Option<String> {
    let parsed = time::PrimitiveDateTime::parse(stamp, ARCHIVE_STAMP).ok()?;
    parsed
        .assume_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_stamps_round_trip() {
        let at = time::macros::datetime!(2026-11-22 06:01:02.123456789 UTC);
        let stamp = archive_stamp(at);
        assert_eq!(stamp, "20261122T060102.123456789Z");
        assert_eq!(
            archive_stamp_to_rfc3339(&stamp).unwrap(),
            "2026-11-22T06:01:02.123456789Z"
        );
        let path = VolumePath::parse("a/b").unwrap();
        let result = archive_result(&path, &format!("@{stamp}-2"));
        assert_eq!(result.archive_path, format!(".archive/a/b/@{stamp}-2"));
        assert_eq!(result.archived_at, "2026-11-22T06:01:02.123456789Z");
    }
}
