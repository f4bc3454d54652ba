//! Paged volume and archive lists over real HTTPS on a real directory: the pages join
//! into exactly the whole list, in order, with no repeats, also while volumes come and
//! go between pages; bad `limit` and `after` values are refused saying why.

mod common;

use std::collections::BTreeSet;

use common::call;
use futures::StreamExt;
use nfsprov_agent_testkit::TestAgent;
use nfsprov_api_types::client::AgentClient;
use nfsprov_api_types::{
    Archive, ArchiveList, CreateVolumeRequest, ListQuery, MAX_PAGE_LIMIT, Volume, VolumeList,
    VolumePath,
};

async fn agent() -> (tempfile::TempDir, TestAgent) {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    (root, agent)
}

fn path(p: &str) -> VolumePath {
    VolumePath::parse(p).unwrap()
}

/// Paths of several depths whose order as strings differs from the order they are made
/// in (`a-b` sorts before `a/b`).
fn paths(count: usize) -> Vec<VolumePath> {
    (0..count)
        .map(|i| match i % 4 {
            0 => path(&format!("team-{}/claim-{i:04}", i % 5)),
            1 => path(&format!("team/claim-{i:04}")),
            2 => path(&format!("team-{}-x/n/claim-{i}", i % 3)),
            _ => path(&format!("claim-{i}")),
        })
        .collect()
}

async fn create_all(client: &AgentClient, paths: &[VolumePath]) {
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 20,
        ..Default::default()
    };
    futures::stream::iter(paths)
        .for_each_concurrent(16, |path| {
            let request = request.clone();
            async move {
                client.create_volume(path, &request, None).await.unwrap();
            }
        })
        .await;
}

/// One page as the raw answer says it, with the query string sent.
fn volume_page(agent: &TestAgent, query: &ListQuery) -> VolumeList {
    let answer = call(
        agent,
        "GET",
        &format!("/v1/volumes?{}", query.to_query_string()),
        None,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).unwrap()
}

fn archive_page(agent: &TestAgent, query: &ListQuery) -> ArchiveList {
    let answer = call(
        agent,
        "GET",
        &format!("/v1/archives?{}", query.to_query_string()),
        None,
    );
    assert_eq!(answer.status, 200, "{answer:?}");
    serde_json::from_str(&answer.body).unwrap()
}

/// Every page of at most `limit` volumes, checking each page's size and cursor.
fn all_volume_pages(agent: &TestAgent, limit: u32) -> Vec<Vec<Volume>> {
    let mut query = ListQuery::first(limit);
    let mut pages = Vec::new();
    loop {
        let page = volume_page(agent, &query);
        assert!(page.volumes.len() <= limit as usize);
        let next = page.next.clone();
        if let Some(next) = &next {
            assert_eq!(
                Some(next.as_str()),
                page.volumes.last().map(|v| v.path.as_str()),
                "the cursor is the page's last path"
            );
        }
        pages.push(page.volumes);
        match next {
            Some(next) => query.after = Some(next),
            None => return pages,
        }
    }
}

fn assert_strictly_ascending(paths: &[String]) {
    for pair in paths.windows(2) {
        assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn volume_pages_join_into_exactly_the_whole_list() {
    let (_root, agent) = agent().await;
    let client = agent.client();
    let made = paths(300);
    create_all(&client, &made).await;
    // Archived volumes keep their records: a page must pass over them, not end early.
    for archived in &made[..40] {
        client.archive_volume(archived, None, None).await.unwrap();
    }
    let whole = client.list_volumes(None).await.unwrap();
    assert_eq!(whole.len(), 260);

    for limit in [1, 7, 64, 259, 260, MAX_PAGE_LIMIT] {
        let pages = all_volume_pages(&agent, limit);
        let expected_pages = 260_usize.div_ceil(limit as usize);
        assert_eq!(pages.len(), expected_pages, "limit {limit}");
        let joined: Vec<Volume> = pages.into_iter().flatten().collect();
        assert_eq!(joined, whole, "limit {limit}");
    }
    let listed: Vec<String> = whole.iter().map(|v| v.path.to_string()).collect();
    assert_strictly_ascending(&listed);

    // The client pages through the same way, holding one page at a time.
    let mut through_client = Vec::new();
    let mut largest = 0;
    client
        .for_each_volume_page(50, None, |page| {
            largest = largest.max(page.len());
            through_client.extend(page);
        })
        .await
        .unwrap();
    assert_eq!(through_client, whole);
    assert_eq!(largest, 50);
}

#[tokio::test(flavor = "multi_thread")]
async fn volumes_made_and_deleted_between_pages_skip_nothing_else() {
    let (_root, agent) = agent().await;
    let client = agent.client();
    let made = paths(200);
    create_all(&client, &made).await;
    let before: Vec<String> = client
        .list_volumes(None)
        .await
        .unwrap()
        .iter()
        .map(|v| v.path.to_string())
        .collect();

    let mut query = ListQuery::first(30);
    let first = volume_page(&agent, &query);
    let cursor = first.next.clone().unwrap();
    // One already listed and one still to come are deleted; one is made before the
    // cursor (too late for this listing) and one after it.
    let listed_one = path(&before[3]);
    let coming_one = path(&before[150]);
    client.delete_volume(&listed_one, None).await.unwrap();
    client.delete_volume(&coming_one, None).await.unwrap();
    let early = path("a-early");
    let late = path("zz-late/claim");
    assert!(early.as_str() < cursor.as_str() && late.as_str() > cursor.as_str());
    create_all(&client, &[early.clone(), late.clone()]).await;

    let mut seen: Vec<String> = first.volumes.iter().map(|v| v.path.to_string()).collect();
    query.after = Some(cursor);
    loop {
        let page = volume_page(&agent, &query);
        seen.extend(page.volumes.iter().map(|v| v.path.to_string()));
        match page.next {
            Some(next) => query.after = Some(next),
            None => break,
        }
    }
    assert_strictly_ascending(&seen);
    let seen: BTreeSet<&str> = seen.iter().map(String::as_str).collect();
    assert!(
        !seen.contains(coming_one.as_str()),
        "a deleted volume vanishes"
    );
    assert!(seen.contains(listed_one.as_str()), "listed before it went");
    assert!(seen.contains(late.as_str()) && !seen.contains(early.as_str()));
    for path in &before {
        if path != coming_one.as_str() {
            assert!(seen.contains(path.as_str()), "{path} was skipped");
        }
    }
    assert_eq!(seen.len(), before.len());
}

/// Volumes made, archived and deleted all the while pages are read, their paths among
/// and beside the others: every volume there for the whole walk is listed exactly once,
/// in order, in every walk.
#[tokio::test(flavor = "multi_thread")]
async fn volumes_made_and_deleted_while_pages_are_read_skip_nothing_else() {
    let (_root, agent) = agent().await;
    let client = agent.client();
    let stable = paths(240);
    create_all(&client, &stable).await;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let client = client.clone();
        let stop = stop.clone();
        tokio::spawn(async move {
            let request = CreateVolumeRequest {
                capacity_bytes: 1 << 20,
                ..Default::default()
            };
            let mut round = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                // Beside stable paths of each shape, and before and after them all.
                let passing: Vec<VolumePath> = [
                    format!("team/claim-{:04}-x{round}", round % 240),
                    format!("team-{}/claim-{:04}x", round % 5, round % 240),
                    format!("a-{round}"),
                    format!("zz-{round}/claim"),
                ]
                .iter()
                .map(|p| path(p))
                .collect();
                for made in &passing {
                    client.create_volume(made, &request, None).await.unwrap();
                }
                client
                    .archive_volume(&passing[0], None, None)
                    .await
                    .unwrap();
                for gone in &passing[1..] {
                    client.delete_volume(gone, None).await.unwrap();
                }
                round += 1;
            }
            round
        })
    };
    let expected: BTreeSet<String> = stable.iter().map(ToString::to_string).collect();
    for limit in [1, 7, 50] {
        let mut seen = Vec::new();
        client
            .for_each_volume_page(limit, None, |page| {
                seen.extend(page.into_iter().map(|v| v.path.to_string()));
            })
            .await
            .unwrap();
        assert_strictly_ascending(&seen);
        let listed: BTreeSet<String> = seen.into_iter().collect();
        let missing: Vec<&String> = expected.difference(&listed).collect();
        assert!(missing.is_empty(), "pages of {limit} skipped {missing:?}");
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rounds = churn.await.unwrap();
    assert!(rounds > 0, "nothing changed while the pages were read");
}

#[tokio::test(flavor = "multi_thread")]
async fn archive_pages_join_into_exactly_the_whole_list() {
    let (_root, agent) = agent().await;
    let client = agent.client();
    let made = paths(90);
    create_all(&client, &made).await;
    // Two archives of one path: ids differ in their entry only.
    for archived in made[..60].iter().chain(&made[..1]) {
        if archived == &made[0] {
            client
                .create_volume(
                    archived,
                    &CreateVolumeRequest {
                        capacity_bytes: 1 << 20,
                        ..Default::default()
                    },
                    None,
                )
                .await
                .unwrap();
        }
        client.archive_volume(archived, None, None).await.unwrap();
    }
    let whole = client.list_archives(None).await.unwrap();
    assert_eq!(whole.len(), 61);

    for limit in [1, 8, 61, MAX_PAGE_LIMIT] {
        let mut query = ListQuery::first(limit);
        let mut joined: Vec<Archive> = Vec::new();
        loop {
            let page = archive_page(&agent, &query);
            assert!(page.archives.len() <= limit as usize);
            joined.extend(page.archives);
            match page.next {
                Some(next) => {
                    assert_eq!(
                        Some(&next),
                        joined.last().map(|a| a.id.to_string()).as_ref()
                    );
                    query.after = Some(next);
                }
                None => break,
            }
        }
        assert_eq!(joined, whole, "limit {limit}");
    }
    let mut through_client = Vec::new();
    client
        .for_each_archive_page(9, None, |page| through_client.extend(page))
        .await
        .unwrap();
    assert_eq!(through_client, whole);
}

#[tokio::test(flavor = "multi_thread")]
async fn bad_limits_and_cursors_are_refused_saying_why() {
    let (_root, agent) = agent().await;
    for list in ["/v1/volumes", "/v1/archives"] {
        for (query, says) in [
            ("limit=0", "limit must be 1 to 1000"),
            ("limit=1001", "limit must be 1 to 1000"),
            ("limit=ten", "invalid query"),
            ("limit=-3", "invalid query"),
            ("after=team", "after needs a limit"),
            ("limit=5&after=..%2Fetc", "after"),
            ("limit=5&after=%2Fetc", "after"),
            ("limit=5&page=2", "unknown field"),
        ] {
            let answer = call(&agent, "GET", &format!("{list}?{query}"), None);
            assert_eq!(answer.status, 400, "{list}?{query}: {answer:?}");
            assert_eq!(answer.code(), "invalid_query", "{list}?{query}");
            let message = answer.json()["message"].as_str().unwrap().to_owned();
            assert!(message.contains(says), "{list}?{query}: {message}");
        }
    }
    // A volume path is no archive id.
    let answer = call(
        &agent,
        "GET",
        "/v1/archives?limit=5&after=team%2Fdata",
        None,
    );
    assert_eq!(answer.code(), "invalid_query");
    // A cursor naming nothing that exists is fine: the order decides.
    let answer = call(&agent, "GET", "/v1/volumes?limit=5&after=gone%2Fnow", None);
    assert_eq!(answer.status, 200, "{answer:?}");
}

/// Every archive page read through, in pages of `limit`, checked to follow its cursor.
fn all_archive_pages(agent: &TestAgent, limit: u32) -> Vec<Archive> {
    let mut query = ListQuery::first(limit);
    let mut joined: Vec<Archive> = Vec::new();
    loop {
        let page = archive_page(agent, &query);
        assert!(page.archives.len() <= limit as usize);
        joined.extend(page.archives);
        match page.next {
            Some(next) => query.after = Some(next),
            None => return joined,
        }
    }
}

/// Many archives, some made before the agent started and some after, some deleted and
/// one removed by hand: pages of 100 hold exactly the archives there are, in id order.
#[tokio::test(flavor = "multi_thread")]
async fn archive_pages_over_many_archives_are_complete_and_in_order() {
    let root = tempfile::tempdir().unwrap();
    let request = CreateVolumeRequest {
        capacity_bytes: 1 << 20,
        ..Default::default()
    };
    let made = paths(700);
    let archive_all = |client: AgentClient, paths: Vec<VolumePath>| async move {
        create_all(&client, &paths).await;
        futures::stream::iter(&paths)
            .for_each_concurrent(16, |path| {
                let client = client.clone();
                async move {
                    client.archive_volume(path, None, None).await.unwrap();
                }
            })
            .await;
    };
    // Made before the agent that lists them started.
    let first = TestAgent::start(root.path()).await.unwrap();
    archive_all(first.client(), made[..500].to_vec()).await;
    first.stop().await.unwrap();

    let agent = TestAgent::start(root.path()).await.unwrap();
    let client = agent.client();
    archive_all(client.clone(), made[500..].to_vec()).await;
    // A second archive of a path archived before this agent started.
    client
        .create_volume(&made[3], &request, None)
        .await
        .unwrap();
    client.archive_volume(&made[3], None, None).await.unwrap();
    let whole = client.list_archives(None).await.unwrap();
    assert_eq!(whole.len(), 701);
    for pair in whole.windows(2) {
        assert!(
            pair[0].id < pair[1].id,
            "{} then {}",
            pair[0].id,
            pair[1].id
        );
    }
    assert_eq!(all_archive_pages(&agent, 100), whole);

    // Deleted through the agent, or removed from the area by hand: not listed.
    for gone in whole.iter().step_by(50) {
        client.delete_archive(&gone.id, None).await.unwrap();
    }
    let by_hand = &whole[101];
    std::fs::remove_dir_all(root.path().join(&by_hand.archive_path)).unwrap();
    let left = client.list_archives(None).await.unwrap();
    assert_eq!(left.len(), 701 - 15 - 1);
    assert!(!left.contains(by_hand));
    assert_eq!(all_archive_pages(&agent, 100), left);
    assert_eq!(all_archive_pages(&agent, 7), left);
    agent.stop().await.unwrap();
}
