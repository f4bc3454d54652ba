//! The target side of a replica: the source's manifest read as it arrives, the tree
//! built from it beside the base replica, each file the base lacks fetched from the
//! source with the grant, and the replica recorded once all of it is durable.

use std::io::{self, BufReader};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use nfsprov_api_types::client::{AgentClient, ClientError, StreamedAnswer};
use nfsprov_api_types::manifest::{ManifestEntry, to_hex};
use nfsprov_api_types::{ErrorCode, ReceiveReplicaRequest, ReplicaOutcome, Snapshot, SnapshotName};

use super::build::{Base, BuildStats, build};
use super::extents::receive_extents;
use super::scan::scan;
use super::stream::ChannelReader;
use super::wire::ManifestReader;
use crate::store::error::{Result, StoreError};
use crate::store::snapshot::ReplicaOrigin;
use crate::store::{Created, VolumeStore};

/// Chunks of a body held between the connection and the thread writing the tree.
const BODY_CHUNKS: usize = 8;

/// How far a receive is, for an answer given before it ends.
#[derive(Debug, Default)]
pub(crate) struct Progress {
    pub(crate) fetched_files: AtomicU64,
    pub(crate) fetched_bytes: AtomicU64,
    pub(crate) reused_files: AtomicU64,
    pub(crate) reused_bytes: AtomicU64,
    /// The source's snapshot, once its manifest began.
    pub(crate) source: std::sync::OnceLock<Snapshot>,
}

impl Progress {
    fn add(&self, stats: &BuildStats) {
        self.reused_files
            .fetch_add(stats.base_files + stats.kept_files, Ordering::Relaxed);
        self.reused_bytes
            .fetch_add(stats.base_bytes, Ordering::Relaxed);
    }

    /// The outcome so far, with `snapshot` as it stands.
    pub(crate) fn outcome(&self, snapshot: Snapshot) -> ReplicaOutcome {
        ReplicaOutcome {
            snapshot,
            fetched_files: self.fetched_files.load(Ordering::Relaxed),
            fetched_bytes: self.fetched_bytes.load(Ordering::Relaxed),
            reused_files: self.reused_files.load(Ordering::Relaxed),
            reused_bytes: self.reused_bytes.load(Ordering::Relaxed),
        }
    }
}

/// What the source said, as this agent answers it: the grant refused or the snapshot
/// gone is the caller's to fix; anything else may pass.
fn source_error(error: ClientError) -> StoreError {
    match error.code() {
        Some(ErrorCode::NotFound) => {
            StoreError::NotFound(format!("the source agent has no such snapshot: {error}"))
        }
        Some(ErrorCode::Unauthenticated | ErrorCode::OutOfScope) => StoreError::Invalid(format!(
            "the source agent refused the grant (expired, or for another snapshot?): {error}"
        )),
        _ => StoreError::NotReady(format!("the source agent: {error}")),
    }
}

/// Feeds the chunks of `answer` to `sender` until its end; a body cut short ends in an
/// error the reader sees, and is answered too, so that the receive can tell a source
/// that refused or went away from a fault of its own.
async fn feed(
    mut answer: StreamedAnswer,
    sender: tokio::sync::mpsc::Sender<io::Result<Vec<u8>>>,
) -> std::result::Result<(), ClientError> {
    loop {
        match answer.chunk().await {
            Ok(Some(chunk)) => {
                if sender.send(Ok(chunk)).await.is_err() {
                    return Ok(());
                }
            }
            Ok(None) => return Ok(()),
            Err(e) => {
                let _ = sender
                    .send(Err(io::Error::other(format!("the source agent: {e}"))))
                    .await;
                return Err(e);
            }
        }
    }
}

/// Receives the replica `name` as `request` asks: see the module's documentation.
pub(crate) async fn receive(
    store: Arc<VolumeStore>,
    name: SnapshotName,
    request: ReceiveReplicaRequest,
    timeout: Duration,
    progress: Arc<Progress>,
) -> Result<(ReplicaOutcome, Created)> {
    let origin = ReplicaOrigin {
        source_url: request.source_url.clone(),
        source_snapshot: request.grant.snapshot.clone(),
    };
    // A replica already there, or a name taken by another snapshot, is answered without
    // asking the source anything.
    let finding = (store.clone(), name.clone(), origin.clone());
    let found = tokio::task::spawn_blocking(move || finding.0.find_replica(&finding.1, &finding.2))
        .await
        .map_err(|e| StoreError::Io {
            context: format!("look for replica {name}: the task failed ({e})"),
            source: io::Error::other("task failed"),
        })??;
    if let Some(snapshot) = found {
        return Ok((progress.outcome(snapshot), Created::Existing));
    }
    let client = AgentClient::for_transfer(
        &request.source_url,
        &request.source_ca_pem,
        &request.grant,
        timeout,
    )
    .map_err(|e| StoreError::Invalid(format!("cannot reach the source agent: {e}")))?;
    let manifest = client.transfer_manifest(None).await.map_err(source_error)?;
    let (reader, sender) = ChannelReader::new(BODY_CHUNKS);
    let manifest_feed = tokio::spawn(feed(manifest, sender));
    let runtime = tokio::runtime::Handle::current();
    let base = request.base.clone();
    let working = progress.clone();
    let received = tokio::task::spawn_blocking(move || {
        let (entries, source) = ManifestReader::open(BufReader::new(reader))?;
        if source.name != origin.source_snapshot {
            return Err(StoreError::Invalid(format!(
                "the source agent sent snapshot {} for a grant of {}",
                source.name, origin.source_snapshot
            )));
        }
        let _ = working.source.set(source.clone());
        let mut entries = Some(entries);
        let mut fetch = |entry: &ManifestEntry, file: &std::fs::File| -> Result<()> {
            if working.fetched_files.load(Ordering::Relaxed) > 0 {
                crate::holds::wait_if_asked(crate::holds::RECEIVES);
            }
            let path_hex = to_hex(entry.path.as_bytes());
            let (mut body, sender) = ChannelReader::new(BODY_CHUNKS);
            let client = client.clone();
            let fetching = runtime.spawn(async move {
                match client.transfer_content(&path_hex, None).await {
                    Ok(answer) => feed(answer, sender).await,
                    Err(e) => {
                        let _ = sender.send(Err(io::Error::other(e.to_string()))).await;
                        Err(e)
                    }
                }
            });
            let data = match receive_extents(&mut body, file, entry.size) {
                Ok(data) => data,
                // What the source said is the error, when it said anything.
                Err(error) => {
                    drop(body);
                    return match runtime.block_on(fetching) {
                        Ok(Err(refused)) => Err(source_error(refused)),
                        _ => Err(error),
                    };
                }
            };
            working.fetched_files.fetch_add(1, Ordering::Relaxed);
            working.fetched_bytes.fetch_add(data, Ordering::Relaxed);
            Ok(())
        };
        let made = store.receive_replica(
            &name,
            &origin,
            &source,
            base.as_ref(),
            &mut |staging, base_tree| {
                let entries = entries.take().ok_or_else(|| {
                    StoreError::Invalid("a replica's manifest is read once".into())
                })?;
                let mut base_manifest = Vec::new();
                if let Some(tree) = base_tree {
                    scan(tree, &mut |entry| {
                        base_manifest.push(entry);
                        Ok(())
                    })?;
                }
                let base = base_tree.map(|tree| Base::new(tree, base_manifest.iter()));
                let stats = build(staging, entries, base.as_ref(), &mut fetch)?;
                working.add(&stats);
                Ok(())
            },
        )?;
        Ok::<_, StoreError>(made)
    })
    .await
    .map_err(|e| StoreError::Io {
        context: format!("receive replica: the task failed ({e})"),
        source: io::Error::other("task failed"),
    })?;
    let (snapshot, created) = match received {
        Ok(made) => made,
        // A manifest cut short: what the source said is the error, when it said anything.
        Err(error) => {
            return match manifest_feed.await {
                Ok(Err(refused)) => Err(source_error(refused)),
                _ => Err(error),
            };
        }
    };
    Ok((progress.outcome(snapshot), created))
}
