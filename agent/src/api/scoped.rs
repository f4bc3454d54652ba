//! Listings as a scoped credential sees them: only what lies within its scope, and a
//! page's `next` always one of its own entries, so no cursor names another scope's.

use std::fmt::Display;
use std::future::Future;

use nfsprov_api_types::PageRequest;

use super::failure::ApiResult;

/// The page `page` asks for of what `fetch` lists, holding only the entries `in_scope`
/// keeps. Pages of the whole listing are read until the page is full or the listing
/// ends; `cursor_of` gives the cursor an entry is resumed after.
pub(super) async fn scoped_page<T, C, F, Fut>(
    page: Option<PageRequest<C>>,
    in_scope: impl Fn(&T) -> bool,
    cursor_of: impl Fn(&T) -> C,
    mut fetch: F,
) -> ApiResult<(Vec<T>, Option<String>)>
where
    C: Clone + Display,
    F: FnMut(Option<PageRequest<C>>) -> Fut,
    Fut: Future<Output = ApiResult<(Vec<T>, Option<String>)>>,
{
    let Some(page) = page else {
        let (all, _) = fetch(None).await?;
        return Ok((
            all.into_iter().filter(|entry| in_scope(entry)).collect(),
            None,
        ));
    };
    let mut kept = Vec::new();
    let mut after = page.after;
    loop {
        let (entries, next) = fetch(Some(PageRequest {
            limit: page.limit - kept.len(),
            after: after.clone(),
        }))
        .await?;
        let last = entries.last().map(&cursor_of);
        kept.extend(entries.into_iter().filter(|entry| in_scope(entry)));
        match (next, last) {
            (Some(_), Some(last)) if kept.len() < page.limit => after = Some(last),
            (Some(_), Some(_)) => {
                let next = kept.last().map(|entry| cursor_of(entry).to_string());
                return Ok((kept, next));
            }
            _ => return Ok((kept, None)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of `all` as the store gives them: `limit` entries after `after`, and the
    /// last one's name as `next` when more follow.
    async fn store_page(
        all: &[u32],
        page: Option<PageRequest<u32>>,
    ) -> ApiResult<(Vec<u32>, Option<String>)> {
        let Some(page) = page else {
            return Ok((all.to_vec(), None));
        };
        let rest: Vec<u32> = all
            .iter()
            .copied()
            .filter(|n| page.after.is_none_or(|after| *n > after))
            .collect();
        let more = rest.len() > page.limit;
        let found: Vec<u32> = rest.into_iter().take(page.limit).collect();
        let next = more.then(|| found.last().unwrap().to_string());
        Ok((found, next))
    }

    async fn walk(all: &[u32], limit: usize, keep: impl Fn(&u32) -> bool + Copy) -> Vec<Vec<u32>> {
        let mut pages = Vec::new();
        let mut after = None;
        loop {
            let (page, next) = scoped_page(
                Some(PageRequest { limit, after }),
                keep,
                |n| *n,
                |page| store_page(all, page),
            )
            .await
            .unwrap();
            if let Some(next) = &next {
                assert!(keep(&next.parse().unwrap()), "a cursor outside: {next}");
            }
            pages.push(page);
            match next {
                Some(next) => after = Some(next.parse().unwrap()),
                None => return pages,
            }
        }
    }

    #[tokio::test]
    async fn pages_hold_the_scope_only_and_every_cursor_is_its_own() {
        let all: Vec<u32> = (1..=50).collect();
        let even = |n: &u32| n.is_multiple_of(2);
        let few = |n: &u32| *n == 7 || *n == 41;
        for limit in [1, 3, 10, 100] {
            let pages = walk(&all, limit, even).await;
            let seen: Vec<u32> = pages.iter().flatten().copied().collect();
            assert_eq!(seen, all.iter().copied().filter(even).collect::<Vec<_>>());
            assert!(pages.iter().all(|page| page.len() <= limit));
            let pages = walk(&all, limit, few).await;
            assert_eq!(pages.concat(), vec![7, 41], "limit {limit}");
            let none = walk(&all, limit, |_| false).await;
            assert_eq!(none, vec![Vec::<u32>::new()], "limit {limit}");
        }
        let (unpaged, next) = scoped_page(None, even, |n| *n, |page| store_page(&all, page))
            .await
            .unwrap();
        assert_eq!(unpaged.len(), 25);
        assert_eq!(next, None);
    }
}
