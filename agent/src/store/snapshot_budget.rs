//! What each namespace's snapshots may take from the filesystem:
//! `limits.max_snapshot_bytes_per_namespace`.
//!
//! A snapshot never changes once it is taken, so the bytes it references then (its
//! `sizeBytes`) are the most it can ever come to hold alone, however its source is
//! rewritten afterwards. The sum of those over a namespace's snapshots therefore bounds
//! the space they can take from every other tenant, on every backend, even where the
//! filesystem charges a snapshot to no volume's quota (a btrfs snapshot's qgroup, a ZFS
//! snapshot beside the `refquota`, a reflinked copy in the agent's area). A snapshot that
//! would take its namespace past the limit is refused with 507 `snapshot_limit`, and
//! nothing of it is kept.
//!
//! The namespace is the source claim's, as the controller recorded it on the volume
//! (`owner.pvcNamespace`); a volume made without one counts with the others that have
//! none. A snapshot keeps the namespace it was charged to in its record, so deleting or
//! re-creating its source changes nothing. The sums are counted from the records when the
//! store opens and moved by each snapshot taken or deleted; they are never written.

use std::collections::HashMap;
use std::sync::Mutex;

use nfsprov_api_types::SnapshotName;

use super::error::{Result, StoreError};

/// The sums per namespace, and what each snapshot added to them.
#[derive(Debug, Default)]
struct Sums {
    by_namespace: HashMap<String, u64>,
    by_snapshot: HashMap<SnapshotName, (String, u64)>,
}

/// The bytes each namespace's snapshots hold at most, bounded by a limit if one is set.
#[derive(Debug, Default)]
pub struct SnapshotBudget {
    limit: Option<u64>,
    sums: Mutex<Sums>,
}

impl SnapshotBudget {
    pub fn new(limit: Option<u64>) -> Self {
        Self {
            limit,
            sums: Mutex::default(),
        }
    }

    pub fn limit(&self) -> Option<u64> {
        self.limit
    }

    fn locked(&self) -> std::sync::MutexGuard<'_, Sums> {
        // Sums are plain numbers, consistent after every statement: a panic elsewhere
        // while the lock was held leaves nothing half-changed.
        self.sums.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts a snapshot found in its record when the store opens.
    pub fn count(&self, name: &SnapshotName, namespace: &str, bytes: u64) {
        let mut sums = self.locked();
        let held = sums.by_namespace.entry(namespace.to_owned()).or_default();
        *held = held.saturating_add(bytes);
        sums.by_snapshot
            .insert(name.clone(), (namespace.to_owned(), bytes));
    }

    /// The bytes the snapshots of `namespace` hold at most.
    pub fn bytes(&self, namespace: &str) -> u64 {
        self.locked()
            .by_namespace
            .get(namespace)
            .copied()
            .unwrap_or(0)
    }

    /// Each namespace with snapshots, and what they hold at most.
    pub fn sums(&self) -> Vec<(String, u64)> {
        self.locked()
            .by_namespace
            .iter()
            .map(|(namespace, bytes)| (namespace.clone(), *bytes))
            .collect()
    }

    /// Refuses a snapshot of `namespace` at once when its snapshots are at the limit
    /// already, before anything is copied; whether it fits is known only once it is made
    /// ([`SnapshotBudget::charge`]).
    pub fn check_room(&self, name: &SnapshotName, namespace: &str) -> Result<()> {
        let Some(limit) = self.limit else {
            return Ok(());
        };
        let held = self.bytes(namespace);
        if held >= limit {
            return Err(self.refusal(name, namespace, 0, held, limit));
        }
        Ok(())
    }

    /// Charges `bytes` for the snapshot `name` to `namespace`, or refuses it when that
    /// would take the namespace past the limit. The charge lasts once
    /// kept (`Charge::keep`); dropped, it is given back.
    pub fn charge(&self, name: &SnapshotName, namespace: &str, bytes: u64) -> Result<Charge<'_>> {
        let mut sums = self.locked();
        let held = sums.by_namespace.get(namespace).copied().unwrap_or(0);
        if let Some(limit) = self.limit
            && held.saturating_add(bytes) > limit
        {
            return Err(self.refusal(name, namespace, bytes, held, limit));
        }
        sums.by_namespace
            .insert(namespace.to_owned(), held.saturating_add(bytes));
        Ok(Charge {
            budget: self,
            name: name.clone(),
            namespace: namespace.to_owned(),
            bytes,
            kept: false,
        })
    }

    /// Gives back what the snapshot `name` was charged, once it is deleted.
    pub fn release(&self, name: &SnapshotName) {
        let mut sums = self.locked();
        if let Some((namespace, bytes)) = sums.by_snapshot.remove(name) {
            Self::subtract(&mut sums, &namespace, bytes);
        }
    }

    fn subtract(sums: &mut Sums, namespace: &str, bytes: u64) {
        if let Some(held) = sums.by_namespace.get_mut(namespace) {
            *held = held.saturating_sub(bytes);
            if *held == 0 {
                sums.by_namespace.remove(namespace);
            }
        }
    }

    fn refusal(
        &self,
        name: &SnapshotName,
        namespace: &str,
        bytes: u64,
        held: u64,
        limit: u64,
    ) -> StoreError {
        let whose = if namespace.is_empty() {
            "volumes without a namespace".to_owned()
        } else {
            format!("namespace {namespace}")
        };
        let past = if bytes == 0 {
            "which is limits.max_snapshot_bytes_per_namespace or more".to_owned()
        } else {
            format!("{bytes} more would pass limits.max_snapshot_bytes_per_namespace")
        };
        StoreError::SnapshotLimit(format!(
            "snapshot {name}: the snapshots of {whose} hold {held} bytes; {past} ({limit} bytes); nothing was kept. Delete snapshots of the namespace, or raise the limit"
        ))
    }
}

/// Bytes charged to a namespace for a snapshot being recorded.
#[must_use = "a charge is given back when dropped unless kept"]
pub struct Charge<'a> {
    budget: &'a SnapshotBudget,
    name: SnapshotName,
    namespace: String,
    bytes: u64,
    kept: bool,
}

impl Charge<'_> {
    /// The snapshot is recorded: its charge lasts until it is deleted.
    pub fn keep(mut self) {
        self.kept = true;
        let mut sums = self.budget.locked();
        let entry = (std::mem::take(&mut self.namespace), self.bytes);
        sums.by_snapshot.insert(self.name.clone(), entry);
    }
}

impl Drop for Charge<'_> {
    fn drop(&mut self) {
        if !self.kept {
            SnapshotBudget::subtract(&mut self.budget.locked(), &self.namespace, self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(n: &str) -> SnapshotName {
        SnapshotName::parse(n).unwrap()
    }

    #[test]
    fn kept_charges_add_up_per_namespace_and_dropped_ones_leave_nothing() {
        let budget = SnapshotBudget::new(Some(100));
        budget.charge(&name("a"), "team-a", 60).unwrap().keep();
        drop(budget.charge(&name("b"), "team-a", 30).unwrap());
        assert_eq!(budget.bytes("team-a"), 60, "a dropped charge is given back");
        let refused = budget.charge(&name("c"), "team-a", 41).err().unwrap();
        assert!(matches!(refused, StoreError::SnapshotLimit(_)));
        let message = refused.to_string();
        assert!(
            message.contains("namespace team-a hold 60 bytes; 41 more")
                && message.contains("max_snapshot_bytes_per_namespace (100 bytes)"),
            "{message}"
        );
        budget.charge(&name("c"), "team-a", 40).unwrap().keep();
        budget.charge(&name("d"), "team-b", 100).unwrap().keep();
        assert!(budget.check_room(&name("e"), "team-a").is_err());
        assert!(budget.check_room(&name("e"), "team-c").is_ok());
        budget.release(&name("a"));
        assert_eq!(budget.bytes("team-a"), 40);
        budget.release(&name("a"));
        assert_eq!(budget.bytes("team-a"), 40, "a second release gives nothing");
        assert!(budget.check_room(&name("e"), "team-a").is_ok());
        assert_eq!(budget.bytes("team-b"), 100, "another namespace is its own");
    }

    #[test]
    fn without_a_limit_everything_is_counted_and_nothing_refused() {
        let budget = SnapshotBudget::new(None);
        budget.count(&name("old"), "", 1 << 60);
        budget.charge(&name("new"), "", 10).unwrap().keep();
        assert_eq!(budget.bytes(""), (1 << 60) + 10);
        assert!(budget.check_room(&name("more"), "").is_ok());
        budget.release(&name("old"));
        assert_eq!(budget.bytes(""), 10);
    }

    /// The store charges what each snapshot references to its source claim's namespace,
    /// refuses what would pass the limit with nothing left of it, gives back what a
    /// delete frees, and a new start counts the same sums again from the records.
    mod store {
        use nfsprov_api_types::{CreateVolumeRequest, SnapshotName, VolumeOwner, VolumePath};

        use crate::store::{CopyProgress, StoreError, VolumeStore};

        const MIB: u64 = 1 << 20;

        fn path(p: &str) -> VolumePath {
            VolumePath::parse(p).unwrap()
        }

        fn name(n: &str) -> SnapshotName {
            SnapshotName::parse(n).unwrap()
        }

        fn counted(root: &std::path::Path, limit: Option<u64>) -> VolumeStore {
            VolumeStore::open(root)
                .unwrap()
                .count_snapshots(limit)
                .unwrap()
        }

        /// A volume of the claim's `namespace` holding `data_mib` MiB.
        fn volume(store: &VolumeStore, root: &std::path::Path, at: &str, namespace: &str) {
            let request = CreateVolumeRequest {
                capacity_bytes: 10 * MIB,
                owner: VolumeOwner {
                    pvc_namespace: Some(namespace.to_owned()),
                    ..VolumeOwner::default()
                },
                ..Default::default()
            };
            store.create(&path(at), &request).unwrap();
            std::fs::write(root.join(at).join("data"), vec![0x5a_u8; MIB as usize]).unwrap();
        }

        fn snapshot(store: &VolumeStore, snapshot: &str, source: &str) -> Result<(), StoreError> {
            let progress = CopyProgress::default();
            store
                .take_snapshot(&name(snapshot), &path(source), &progress, &|_| true)
                .map(drop)
        }

        fn names(store: &VolumeStore) -> Vec<String> {
            let (snapshots, _) = store.list_snapshots(None).unwrap();
            snapshots.iter().map(|s| s.name.to_string()).collect()
        }

        /// Entries of the snapshot area's data directory: a refused snapshot leaves none.
        fn trees(root: &std::path::Path) -> Vec<String> {
            let data = root.join(".nfsprov/snapshots/data");
            let mut entries: Vec<String> = std::fs::read_dir(data)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            entries.sort();
            entries
        }

        #[test]
        fn snapshots_past_their_namespaces_limit_are_refused_and_leave_nothing() {
            let dir = tempfile::tempdir().unwrap();
            let root = dir.path();
            // Two snapshots of 1 MiB of data fit, with room for their metadata; a third
            // does not.
            let limit = 2 * MIB + MIB / 2;
            let store = counted(root, Some(limit));
            volume(&store, root, "a", "team-a");
            volume(&store, root, "b", "team-b");
            snapshot(&store, "a1", "a").unwrap();
            snapshot(&store, "a2", "a").unwrap();
            let held = store.snapshot_budget().bytes("team-a");
            assert!(
                (2 * MIB..=limit).contains(&held),
                "two snapshots of 1 MiB are charged {held} bytes"
            );
            let refused = snapshot(&store, "a3", "a").unwrap_err();
            assert!(
                matches!(refused, StoreError::SnapshotLimit(_)),
                "{refused:?}"
            );
            assert_eq!(
                refused.to_api_error().code,
                nfsprov_api_types::ErrorCode::SnapshotLimit
            );
            assert_eq!(names(&store), ["a1", "a2"], "nothing of it is listed");
            assert_eq!(trees(root), ["a1", "a2"], "nor left on disk");
            assert_eq!(store.snapshot_budget().bytes("team-a"), held);
            snapshot(&store, "b1", "b").unwrap();
            assert!(
                store.snapshot_budget().bytes("team-b") >= MIB,
                "another namespace is its own"
            );

            // Deleting the source changes nothing: its snapshots still hold their bytes.
            store.delete(&path("a")).unwrap();
            volume(&store, root, "a", "team-a");
            assert!(matches!(
                snapshot(&store, "a3", "a"),
                Err(StoreError::SnapshotLimit(_))
            ));
            // Deleting a snapshot gives its bytes back.
            store.delete_snapshot(&name("a1")).unwrap();
            snapshot(&store, "a3", "a").unwrap();

            // A new start counts the same sums again, including a snapshot recorded before
            // snapshots were charged (no namespace in its record: its source's owner).
            let record = root.join(".nfsprov/snapshots/records/a3.json");
            let mut json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(&record).unwrap()).unwrap();
            assert_eq!(json["namespace"], "team-a");
            json.as_object_mut().unwrap().remove("namespace");
            std::fs::write(&record, serde_json::to_vec(&json).unwrap()).unwrap();
            let before = store.snapshot_budget().bytes("team-a");
            drop(store);
            let store = counted(root, Some(limit));
            assert_eq!(store.snapshot_budget().bytes("team-a"), before);
            assert!(matches!(
                snapshot(&store, "a4", "a"),
                Err(StoreError::SnapshotLimit(_))
            ));
            assert_eq!(names(&store), ["a2", "a3", "b1"]);
        }
    }
}
