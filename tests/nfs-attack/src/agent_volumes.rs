//! Volumes made by the agent's own store, for the attack on what the agent really makes:
//! A and C created, B a clone of A, by the backend the quota settings name (`image`: a
//! reflink of A's frozen image given a UUID of its own; `zfs`: a ZFS clone of a snapshot
//! of A's dataset).

use std::path::Path;

use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent::store::{CopyProgress, VolumeStore, backend_for};
use nfsprov_api_types::{
    CloneVolumeRequest, CreateVolumeRequest, QuotaBackend, QuotaPolicy, VolumeOwner, VolumePath,
};

use crate::setup::{Result, SetupError};

const CAPACITY: u64 = 64 << 20;

/// The store and the volumes it made; they are deleted (unmounted and their images
/// removed, or their datasets destroyed) when dropped.
pub struct AgentVolumes {
    store: VolumeStore,
    made: Vec<VolumePath>,
}

fn failed(what: &str, error: impl std::fmt::Display) -> SetupError {
    SetupError::Failed(format!("{what}: {error}"))
}

impl AgentVolumes {
    /// The quota settings of the `image` backend, whose images live in the export root.
    pub fn image_settings() -> QuotaSettings {
        QuotaSettings {
            backend: QuotaBackend::Image,
            ..QuotaSettings::default()
        }
    }

    /// Makes `a` and `c`, then `b` as a clone of `a`, beneath `export_root` (paths
    /// relative to it), with the backend `settings` name.
    pub fn make(
        settings: &QuotaSettings,
        export_root: &Path,
        a: &str,
        b: &str,
        c: &str,
    ) -> Result<Self> {
        let backend = backend_for(settings, export_root)
            .map_err(|e| failed(&format!("{} backend", settings.backend), e))?;
        let store = VolumeStore::open_with_backend(export_root, backend)
            .map_err(|e| failed("open the store", e))?;
        let mut volumes = Self {
            store,
            made: Vec::new(),
        };
        let path = |p: &str| VolumePath::parse(p).map_err(|e| failed(p, e));
        let (a, b, c) = (path(a)?, path(b)?, path(c)?);
        let create = CreateVolumeRequest {
            capacity_bytes: CAPACITY,
            quota: QuotaPolicy::Enforce,
            ..CreateVolumeRequest::default()
        };
        for volume in [&a, &c] {
            volumes
                .store
                .create(volume, &create)
                .map_err(|e| failed(&format!("create {volume}"), e))?;
            volumes.made.push(volume.clone());
        }
        let clone = CloneVolumeRequest {
            source: a.clone(),
            capacity_bytes: CAPACITY,
            owner: VolumeOwner::default(),
            quota: QuotaPolicy::Enforce,
            export: None,
        };
        volumes
            .store
            .clone_volume(&b, &clone, &CopyProgress::default())
            .map_err(|e| failed(&format!("clone {a} to {b}"), e))?;
        volumes.made.push(b);
        Ok(volumes)
    }
}

impl Drop for AgentVolumes {
    fn drop(&mut self) {
        for volume in self.made.iter().rev() {
            if let Err(e) = self.store.delete(volume) {
                eprintln!("could not delete {volume}: {e}");
            }
        }
    }
}
