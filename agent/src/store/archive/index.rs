//! The ids of the archives in the archive area, sorted, kept in memory beside it: a page
//! of archives starts at its cursor here and reads only its own entries, instead of
//! walking the whole area for every page. Built by one walk when the store opens, then
//! changed by the store's own archiving and deletions, the only ways an archive comes or
//! goes while the agent runs. An id here is a candidate only: each page still checks its
//! entries against the record store, so an entry removed by hand is passed over.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Mutex;

use nfsprov_api_types::ArchivePath;

#[derive(Debug, Default)]
pub(crate) struct ArchiveIndex {
    /// Brief: taken for in-memory work only, never across I/O.
    ids: Mutex<BTreeSet<ArchivePath>>,
}

impl ArchiveIndex {
    pub(crate) fn new(ids: impl IntoIterator<Item = ArchivePath>) -> Self {
        Self {
            ids: Mutex::new(ids.into_iter().collect()),
        }
    }

    pub(crate) fn insert(&self, id: ArchivePath) {
        self.ids().insert(id);
    }

    pub(crate) fn remove(&self, id: &ArchivePath) {
        self.ids().remove(id);
    }

    /// At most `limit` ids after `after` (all from the first without it), in order, and
    /// whether more follow them.
    pub(crate) fn after(
        &self,
        after: Option<&ArchivePath>,
        limit: usize,
    ) -> (Vec<ArchivePath>, bool) {
        let ids = self.ids();
        let start = after.map_or(Bound::Unbounded, Bound::Excluded);
        let mut following = ids.range::<ArchivePath, _>((start, Bound::Unbounded));
        let page: Vec<ArchivePath> = following.by_ref().take(limit).cloned().collect();
        let more = following.next().is_some();
        (page, more)
    }

    fn ids(&self) -> std::sync::MutexGuard<'_, BTreeSet<ArchivePath>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(raw: &str) -> ArchivePath {
        ArchivePath::parse(raw).unwrap()
    }

    #[test]
    fn pages_follow_the_cursor_in_order_and_see_changes() {
        let index = ArchiveIndex::new(
            [
                "b/@20240101T000000.000000000Z",
                "a/@20240101T000000.000000000Z",
                "a/@20240102T000000.000000000Z",
            ]
            .map(id),
        );
        let (first, more) = index.after(None, 2);
        assert_eq!(
            first,
            [
                "a/@20240101T000000.000000000Z",
                "a/@20240102T000000.000000000Z"
            ]
            .map(id)
        );
        assert!(more);
        let (second, more) = index.after(first.last(), 2);
        assert_eq!(second, [id("b/@20240101T000000.000000000Z")]);
        assert!(!more);

        // A cursor that is no longer an id (its archive deleted) still places the page.
        index.remove(&id("a/@20240102T000000.000000000Z"));
        index.insert(id("c/@20240101T000000.000000000Z"));
        let (after_gone, more) = index.after(Some(&id("a/@20240102T000000.000000000Z")), 5);
        assert_eq!(
            after_gone,
            [
                "b/@20240101T000000.000000000Z",
                "c/@20240101T000000.000000000Z"
            ]
            .map(id)
        );
        assert!(!more);
    }
}
