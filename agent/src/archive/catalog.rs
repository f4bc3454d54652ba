//! Archives as the API and the retention sweep see them: the listing (origin, owner,
//! time, expiry, size), deleting one, and the sweep that deletes those whose retention
//! ran out. A request and the sweep delete the same way, and the sweep only ever deletes
//! what the archive listing holds: never a volume.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use nfsprov_api_types::{Archive, ArchivePath, PageRequest, VolumeUsage};
use time::OffsetDateTime;

use super::retention::{ArchiveSettings, is_expired};
use crate::metrics::ArchiveMetrics;
use crate::store::{Deleted, StoreError, StoredArchive, VolumeStore};
use crate::usage::UsageCache;

/// The archives of one store, with their measured sizes.
#[derive(Debug)]
pub(crate) struct Archives {
    store: Arc<VolumeStore>,
    settings: ArchiveSettings,
    sizes: UsageCache<ArchivePath>,
    metrics: ArchiveMetrics,
}

/// What one sweep did.
#[derive(Debug, Default)]
pub(crate) struct Sweep {
    pub deleted: Vec<ArchivePath>,
    pub failed: Vec<(ArchivePath, StoreError)>,
}

impl Archives {
    pub(crate) fn new(
        store: Arc<VolumeStore>,
        settings: ArchiveSettings,
        metrics: ArchiveMetrics,
    ) -> Self {
        Self {
            store,
            settings,
            // Nobody writes to an archive: a figure an hour old is as good as a fresh one,
            // and big archives are not walked over and over. One walk at a time, beside
            // the volumes' own.
            sizes: UsageCache::new(Duration::from_secs(3600), Duration::from_secs(2), 1),
            metrics,
        }
    }

    /// The archives with their owner, time, expiry and size, in id order: every one, or
    /// with a `page` at most its limit of those after its cursor, and the next page's
    /// cursor. An archive not measured yet is waited for a little, then listed without a
    /// size. Only what is listed is measured: the whole list refreshes the archive
    /// metrics, a page leaves them to the whole list and the sweep.
    pub(crate) async fn list(
        &self,
        page: Option<PageRequest<ArchivePath>>,
    ) -> Result<(Vec<Archive>, Option<String>), StoreError> {
        let whole = page.is_none();
        let store = self.store.clone();
        let (stored, next) =
            tokio::task::spawn_blocking(move || store.list_archives(page.as_ref()))
                .await
                .unwrap_or_else(|e| Err(task_failed(e)))?;
        let sizes = self.sizes_of(&stored).await;
        if whole {
            self.observe(&stored, &sizes);
        }
        let listed = stored
            .iter()
            .zip(sizes)
            .map(|(archive, usage)| self.describe(archive, usage))
            .collect();
        Ok((listed, next))
    }

    /// The archive `id`, described as [`Self::list`] describes it, or `None`: only it
    /// is looked up and measured.
    pub(crate) async fn get(&self, id: &ArchivePath) -> Result<Option<Archive>, StoreError> {
        let store = self.store.clone();
        let target = id.clone();
        let found = tokio::task::spawn_blocking(move || store.find_stored_archive(&target))
            .await
            .unwrap_or_else(|e| Err(task_failed(e)))?;
        let Some(archive) = found else {
            return Ok(None);
        };
        let usage = self
            .sizes_of(std::slice::from_ref(&archive))
            .await
            .pop()
            .flatten();
        Ok(Some(self.describe(&archive, usage)))
    }

    async fn sizes_of(&self, stored: &[StoredArchive]) -> Vec<Option<VolumeUsage>> {
        futures::future::join_all(stored.iter().map(|archive| async {
            match archive.usage {
                Some(usage) => Some(usage),
                None => self.sizes.get(&self.store, &archive.id).await,
            }
        }))
        .await
    }

    /// Deletes one archive with its quota and record; absent already is success.
    pub(crate) async fn delete(&self, id: &ArchivePath) -> Result<Deleted, StoreError> {
        // Under the lock of the path it was archived from, so a new archive of that path,
        // or a retried archive request looking for the latest one, never meets it half
        // gone. The guard travels into the blocking task: a request that times out keeps
        // the path locked until the work is really done.
        let guard = self.store.lock(id.volume()).await;
        let store = self.store.clone();
        let target = id.clone();
        let result = tokio::task::spawn_blocking(move || {
            let result = store.delete_archive(&target);
            drop(guard);
            result
        })
        .await
        .unwrap_or_else(|e| Err(task_failed(e)));
        self.sizes.forget(id);
        if result.is_err() {
            self.metrics.deletion_failures.inc();
        }
        result
    }

    /// Deletes every archive whose expiry has passed at `now`, each as [`Self::delete`]
    /// does, and logs each. Refreshes the archive metrics, starting the measurement of
    /// what is stale without waiting for it.
    pub(crate) async fn sweep(&self, now: OffsetDateTime) -> Result<Sweep, StoreError> {
        let mut sweep = Sweep::default();
        let mut kept = Vec::new();
        for archive in self.stored().await? {
            let expires_at = self.expires_at(&archive);
            if !is_expired(expires_at, now) {
                kept.push(archive);
                continue;
            }
            match self.delete(&archive.id).await {
                Ok(Deleted::Removed) => {
                    self.metrics.expired.inc();
                    let owner = &archive.record.owner;
                    tracing::info!(
                        archive = %archive.id,
                        path = %archive.id.volume(),
                        pvc_namespace = owner.pvc_namespace.as_deref().unwrap_or(""),
                        pvc_name = owner.pvc_name.as_deref().unwrap_or(""),
                        pv_name = owner.pv_name.as_deref().unwrap_or(""),
                        archived_at = archive.archived_at().map(rfc3339).unwrap_or_default(),
                        expired_at = expires_at.map(rfc3339).unwrap_or_default(),
                        "deleted an archive whose retention ran out"
                    );
                    sweep.deleted.push(archive.id);
                }
                // Deleted by a request meanwhile.
                Ok(Deleted::WasAbsent) => {}
                Err(error) => {
                    tracing::error!(
                        archive = %archive.id,
                        %error,
                        "could not delete an archive whose retention ran out; the next sweep tries again"
                    );
                    sweep.failed.push((archive.id.clone(), error));
                    kept.push(archive);
                }
            }
        }
        let sizes: Vec<Option<VolumeUsage>> = kept
            .iter()
            .map(|archive| {
                archive
                    .usage
                    .or_else(|| self.sizes.latest(&self.store, &archive.id))
            })
            .collect();
        self.observe(&kept, &sizes);
        Ok(sweep)
    }

    /// Sweeps at every interval of the settings, the first at once, for as long as the
    /// task runs.
    pub(crate) async fn sweep_forever(self: Arc<Self>) {
        let mut ticks = tokio::time::interval(self.settings.sweep_interval);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            ticks.tick().await;
            if let Err(error) = self.sweep(OffsetDateTime::now_utc()).await {
                tracing::error!(%error, "could not list the archives to sweep; the next sweep tries again");
            }
        }
    }

    async fn stored(&self) -> Result<Vec<StoredArchive>, StoreError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.list_archives(None))
            .await
            .unwrap_or_else(|e| Err(task_failed(e)))
            .map(|(all, _)| all)
    }

    fn expires_at(&self, archive: &StoredArchive) -> Option<OffsetDateTime> {
        let archived_at = archive.archived_at()?;
        self.settings
            .expires_at(archived_at, archive.retention_days())
    }

    fn describe(&self, archive: &StoredArchive, usage: Option<VolumeUsage>) -> Archive {
        Archive {
            id: archive.id.clone(),
            archive_path: archive.archive_path(),
            path: archive.id.volume().clone(),
            owner: archive.record.owner.clone(),
            archived_at: archive.archived_at().map(rfc3339).unwrap_or_default(),
            retention_days: archive.retention_days(),
            expires_at: self.expires_at(archive).map(rfc3339),
            size_bytes: usage.map(|u| u.used_bytes),
            inodes: usage.map(|u| u.used_inodes),
            capacity_bytes: Some(archive.record.capacity_bytes).filter(|bytes| *bytes > 0),
        }
    }

    /// Records how many archives there are and the bytes known of them, and forgets the
    /// sizes of archives that are gone.
    fn observe(&self, archives: &[StoredArchive], sizes: &[Option<VolumeUsage>]) {
        self.metrics
            .count
            .set(i64::try_from(archives.len()).unwrap_or(i64::MAX));
        let bytes = sizes
            .iter()
            .flatten()
            .fold(0u64, |sum, usage| sum.saturating_add(usage.used_bytes));
        self.metrics
            .bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
        let present: HashSet<&ArchivePath> = archives.iter().map(|a| &a.id).collect();
        self.sizes.retain(|id| present.contains(id));
    }
}

fn task_failed(error: tokio::task::JoinError) -> StoreError {
    StoreError::Io {
        context: "filesystem task failed".into(),
        source: std::io::Error::other(error),
    }
}

fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::{CreateVolumeRequest, VolumePath};
    use time::Duration as Days;

    use super::*;

    fn path(p: &str) -> VolumePath {
        VolumePath::parse(p).unwrap()
    }

    #[tokio::test]
    async fn a_sweep_deletes_exactly_the_expired_archives_and_never_a_volume() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(VolumeStore::open(dir.path()).unwrap());
        let now = OffsetDateTime::now_utc();
        let request = CreateVolumeRequest {
            capacity_bytes: 1,
            ..Default::default()
        };
        // Archived in the past as the store records it: the default (a week) or the
        // request's own retention decides.
        for (name, age_days, retention) in [
            ("old", 10, None),
            ("kept-longer", 10, Some(30)),
            ("young", 1, None),
            ("short", 2, Some(1)),
        ] {
            store.create(&path(name), &request).unwrap();
            store
                .archive_at(&path(name), retention, now - Days::days(age_days))
                .unwrap();
        }
        store.create(&path("live"), &request).unwrap();
        std::fs::write(dir.path().join("live/data"), b"tenant").unwrap();
        let metrics = ArchiveMetrics::default();
        let archives = Archives::new(
            store.clone(),
            ArchiveSettings {
                default_retention: Some(crate::archive::retention::days(7)),
                ..Default::default()
            },
            metrics.clone(),
        );

        let sweep = archives.sweep(now).await.unwrap();
        assert!(sweep.failed.is_empty(), "{:?}", sweep.failed);
        let mut deleted: Vec<&str> = sweep
            .deleted
            .iter()
            .map(|id| id.volume().as_str())
            .collect();
        deleted.sort();
        assert_eq!(deleted, ["old", "short"]);
        let left: Vec<String> = archives
            .list(None)
            .await
            .unwrap()
            .0
            .into_iter()
            .map(|a| a.path.to_string())
            .collect();
        assert_eq!(left, ["kept-longer", "young"]);
        assert_eq!(store.get(&path("live")).unwrap().path, path("live"));
        assert!(dir.path().join("live/data").is_file());
        assert_eq!((metrics.expired.get(), metrics.count.get()), (2, 2));
        assert_eq!(store.leftover_count().unwrap(), 0);

        // Nothing else is due until the young one's week is over.
        assert!(archives.sweep(now).await.unwrap().deleted.is_empty());
        let later = archives.sweep(now + Days::days(6)).await.unwrap();
        assert_eq!(later.deleted.len(), 1);
        assert_eq!(later.deleted[0].volume().as_str(), "young");
        assert_eq!(metrics.expired.get(), 3);
        assert!(store.get(&path("live")).is_ok());
    }

    #[tokio::test]
    async fn without_a_retention_nothing_is_ever_swept() {
        let dir = tempfile::tempdir().unwrap();
        let store = Arc::new(VolumeStore::open(dir.path()).unwrap());
        let request = CreateVolumeRequest {
            capacity_bytes: 1,
            ..Default::default()
        };
        store.create(&path("a"), &request).unwrap();
        store
            .archive_at(&path("a"), None, OffsetDateTime::UNIX_EPOCH)
            .unwrap();
        let archives = Archives::new(store, ArchiveSettings::default(), Default::default());
        let far = OffsetDateTime::now_utc() + Days::days(365 * 100);
        assert!(archives.sweep(far).await.unwrap().deleted.is_empty());
        let (listed, _) = archives.list(None).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].expires_at, None);
        assert_eq!(listed[0].archived_at, "1970-01-01T00:00:00Z");
    }
}
