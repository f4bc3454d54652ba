//! Volumes made by the agent's own store with quota backend `image`, for the attack on
//! what the agent really makes: A and C created, B a clone of A (a reflink of A's frozen
//! image given a UUID of its own).

use std::path::Path;

use nfsprov_agent::quota::QuotaSettings;
use nfsprov_agent::store::{CopyProgress, VolumeStore, backend_for};
use nfsprov_api_types::{
    CloneVolumeRequest, CreateVolumeRequest, QuotaBackend, QuotaPolicy, VolumeOwner, VolumePath,
};

use crate::setup::{Result, SetupError};

const CAPACITY: u64 = 64 << 20;

/// The store and the volumes it made; they are deleted (unmounted, images removed) when
/// dropped.
pub struct AgentVolumes {
    store: VolumeStore,
    made: Vec<VolumePath>,
}

fn failed(what: &str, error: impl std::fmt::Display) -> SetupError {
    SetupError::Failed(format!("{what}: {error}"))
}

impl AgentVolumes {
    /// Makes `a` and `c`, then `b` as a clone of `a`, beneath `export_root` (paths
    /// relative to it).
    pub fn make(export_root: &Path, a: &str, b: &str, c: &str) -> Result<Self> {
        let settings = QuotaSettings {
            backend: QuotaBackend::Image,
            ..QuotaSettings::default()
        };
        let backend =
            backend_for(&settings, export_root).map_err(|e| failed("image backend", e))?;
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
