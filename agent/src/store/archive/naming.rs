//! Names in the archive area: `.archive/<path>/@<UTC time>`, so archiving the same path
//! twice never overwrites anything and the newest archive is the greatest entry. The
//! grammar of entries and archive ids is `nfsprov_api_types::ArchivePath`'s; this module
//! writes times in it and reads them back.

use nfsprov_api_types::{
    ARCHIVE_ENTRY_PREFIX, ArchiveEntry, ArchivePath, ArchiveResult, MAX_ARCHIVE_SUFFIX, VolumePath,
};
use time::OffsetDateTime;

use crate::store::record::rfc3339;

/// Archive area beneath the root; archives keep the volume's path below it.
pub const ARCHIVE_DIR: &str = ".archive";

const ARCHIVE_STAMP: &[time::format_description::FormatItem<'static>] = time::macros::format_description!(
    "[year][month][day]T[hour][minute][second].[subsecond digits:9]Z"
);

/// The components of the archive directory of `path`, below the root.
pub(crate) fn archive_components(path: &VolumePath) -> Vec<&str> {
    let mut components = vec![ARCHIVE_DIR];
    components.extend(path.components());
    components
}

/// The archive entry names to try, in order, for an archive made at `at`: the time, then
/// the time with a counter for archives of the same path within the same nanosecond.
pub(crate) fn archive_entries(at: OffsetDateTime) -> impl Iterator<Item = ArchiveEntry> {
    let stamp = at.format(ARCHIVE_STAMP).unwrap_or_default();
    // A time the grammar cannot hold (beyond year 9999) yields no name at all, and the
    // archive is refused rather than named otherwise.
    (0..=MAX_ARCHIVE_SUFFIX).filter_map(move |attempt| {
        let name = match attempt {
            0 => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}"),
            n => format!("{ARCHIVE_ENTRY_PREFIX}{stamp}-{n}"),
        };
        ArchiveEntry::parse(&name).ok()
    })
}

/// The newest of the given entry names of one archive directory; names that are not
/// archive entries are left out.
pub(crate) fn latest_entry(names: impl IntoIterator<Item = String>) -> Option<ArchiveEntry> {
    names
        .into_iter()
        .filter_map(|name| ArchiveEntry::parse(&name).ok())
        .max()
}

/// Where the archive is, relative to the root.
pub(crate) fn archive_path(id: &ArchivePath) -> String {
    format!("{ARCHIVE_DIR}/{id}")
}

pub(crate) fn archive_result(path: &VolumePath, entry: &ArchiveEntry) -> ArchiveResult {
    ArchiveResult {
        path: path.clone(),
        archive_path: archive_path(&ArchivePath::new(path.clone(), entry.clone())),
        archived_at: archived_at(entry).map(rfc3339).unwrap_or_default(),
    }
}

/// The time an entry's name carries.
pub(crate) fn archived_at(entry: &ArchiveEntry) -> Option<OffsetDateTime> {
    // Only a validated entry reaches the parser: a stray byte below '0' in the digits
    // overflows inside `time` and panics a debug build.
    time::PrimitiveDateTime::parse(entry.stamp(), ARCHIVE_STAMP)
        .ok()
        .map(time::PrimitiveDateTime::assume_utc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn archive_stamps_round_trip() {
        let at = time::macros::datetime!(2026-11-22 06:01:02.123456789 UTC);
        let entries: Vec<ArchiveEntry> = archive_entries(at).collect();
        assert_eq!(entries.len(), MAX_ARCHIVE_SUFFIX as usize + 1);
        assert_eq!(entries[0].as_str(), "@20261122T060102.123456789Z");
        assert_eq!(entries[2].as_str(), "@20261122T060102.123456789Z-2");
        assert!(entries.iter().all(|e| archived_at(e) == Some(at)));
        let path = VolumePath::parse("a/b").unwrap();
        let result = archive_result(&path, &entries[2]);
        assert_eq!(
            result.archive_path,
            ".archive/a/b/@20261122T060102.123456789Z-2"
        );
        assert_eq!(result.archived_at, "2026-11-22T06:01:02.123456789Z");
    }

    #[test]
    fn every_name_given_is_an_id_the_api_accepts() {
        let path = VolumePath::parse("ns/claim").unwrap();
        for at in [
            OffsetDateTime::UNIX_EPOCH,
            time::macros::datetime!(2000-02-29 23:59:59.999999999 UTC),
            time::macros::datetime!(9999-12-31 23:59:59.999999999 UTC),
            OffsetDateTime::now_utc(),
        ] {
            for entry in archive_entries(at) {
                let id = format!("{path}/{entry}");
                let parsed = ArchivePath::parse(&id).unwrap();
                assert_eq!(parsed.entry(), &entry);
            }
        }
    }

    #[test]
    fn the_latest_entry_is_the_newest_with_the_highest_counter() {
        let names = [
            "@20261122T060102.123456789Z-9",
            "@20261122T060102.123456789Z-10",
            "@20261122T060102.123456789Z",
            "@20251122T060102.123456789Z-99",
            // Not archive entries: never chosen, whatever they sort like.
            "@99991122T060102.123456789Z-0",
            "z-foreign",
            "@zzz",
        ];
        let latest = latest_entry(names.iter().map(|n| (*n).to_owned())).unwrap();
        assert_eq!(latest.as_str(), "@20261122T060102.123456789Z-10");
        assert_eq!(latest_entry(["plain".to_owned()]), None);
    }
}
