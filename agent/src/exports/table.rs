use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

use nfsprov_api_types::{ExportManager, ExportRequest, Volume, VolumeExport, VolumePath};

use super::ganesha::Ganesha;
use super::knfsd::Knfsd;
use super::record::ExportRecord;
use super::server::{ExportError, NfsServer, Restored, Table};
use super::settings::ExportSettings;

/// The agent's export table and the NFS server it keeps in step with it.
///
/// One lock orders every change: the server's own files (ganesha's include list,
/// knfsd's exports file) are rewritten whole, so two changes must not interleave.
#[derive(Debug)]
pub struct Exports {
    server: Option<Box<dyn NfsServer>>,
    /// The path clients mount for the export root (`nfs.path`).
    mount_root: String,
    ids: std::ops::RangeInclusive<u16>,
    table: Mutex<Table>,
}

impl Exports {
    /// No manager: volumes carry no export of their own.
    pub fn none(mount_root: &str) -> Self {
        Self::with_server(None, mount_root, 0..=0)
    }

    /// The manager `settings` name, its table restored from what an earlier run
    /// recorded: exports of volumes that are gone are removed, the rest served again.
    pub fn open(
        settings: &ExportSettings,
        export_root: &Path,
        mount_root: &str,
        volume_exists: impl Fn(&VolumePath) -> bool,
    ) -> Result<(Self, Restored), ExportError> {
        let server: Box<dyn NfsServer> = match settings.manager {
            ExportManager::None | ExportManager::Unknown => {
                return Ok((Self::none(mount_root), Restored::default()));
            }
            ExportManager::Ganesha => Box::new(Ganesha::new(settings, export_root, mount_root)?),
            ExportManager::Knfsd => Box::new(Knfsd::new(settings, export_root)),
        };
        Self::open_with(server, settings, mount_root, volume_exists)
    }

    /// As [`Exports::open`] with a server made by the caller.
    pub fn open_with(
        server: Box<dyn NfsServer>,
        settings: &ExportSettings,
        mount_root: &str,
        volume_exists: impl Fn(&VolumePath) -> bool,
    ) -> Result<(Self, Restored), ExportError> {
        let mut table = Table::new();
        let mut gone = Vec::new();
        for record in server.load()? {
            if volume_exists(&record.volume) {
                table.insert(record.volume.clone(), record);
            } else {
                gone.push(record);
            }
        }
        // The volume was deleted or archived by a run that crashed before it forgot
        // the export (or by hand): nothing may be served at its path any more.
        for record in &gone {
            server.remove(record, &table)?;
        }
        let mut restored = server.restore(&table)?;
        restored.removed += gone.len();
        let exports = Self::with_server(
            Some(server),
            mount_root,
            settings.ganesha_export_ids.clone(),
        );
        *exports.lock() = table;
        Ok((exports, restored))
    }

    fn with_server(
        server: Option<Box<dyn NfsServer>>,
        mount_root: &str,
        ids: std::ops::RangeInclusive<u16>,
    ) -> Self {
        Self {
            server,
            mount_root: mount_root.to_owned(),
            ids,
            table: Mutex::new(Table::new()),
        }
    }

    pub fn kind(&self) -> ExportManager {
        self.server
            .as_ref()
            .map_or(ExportManager::None, |server| server.kind())
    }

    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many volumes are exported.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The volume's export, as served.
    pub fn get(&self, volume: &VolumePath) -> Option<VolumeExport> {
        self.lock()
            .get(volume)
            .map(|record| record.to_volume_export(&self.mount_root))
    }

    /// Fills in `volume.export`.
    pub fn describe(&self, volume: &mut Volume) {
        if self.server.is_some() {
            volume.export = self.get(&volume.path);
        }
    }

    /// Makes the NFS server serve `request` for `volume`, in place of what it served.
    /// Asking again for what is served already changes nothing and calls no server.
    pub fn set(
        &self,
        volume: &VolumePath,
        request: &ExportRequest,
    ) -> Result<VolumeExport, ExportError> {
        let server = self.server.as_ref().ok_or(ExportError::NoManager)?;
        let mut table = self.lock();
        let previous = table.get(volume).cloned();
        if let Some(previous) = &previous {
            let served = previous.to_volume_export(&self.mount_root);
            if served.matches(request) {
                return Ok(served);
            }
        }
        let id = match (&previous, server.needs_id()) {
            (Some(previous), _) => previous.id,
            (None, true) => Some(self.free_id(&table)?),
            (None, false) => None,
        };
        let next = ExportRecord::new(volume.clone(), id, request.clone());
        table.insert(volume.clone(), next.clone());
        if let Err(error) = server.apply(previous.as_ref(), &next, &table) {
            match previous {
                Some(previous) => table.insert(volume.clone(), previous),
                None => table.remove(volume),
            };
            return Err(error);
        }
        Ok(next.to_volume_export(&self.mount_root))
    }

    /// Stops exporting `volume` (nothing to do when it is not exported).
    pub fn remove(&self, volume: &VolumePath) -> Result<(), ExportError> {
        let Some(server) = self.server.as_ref() else {
            return Ok(());
        };
        let mut table = self.lock();
        let Some(record) = table.remove(volume) else {
            return Ok(());
        };
        if let Err(error) = server.remove(&record, &table) {
            table.insert(volume.clone(), record);
            return Err(error);
        }
        Ok(())
    }

    fn free_id(&self, table: &Table) -> Result<u16, ExportError> {
        let used: BTreeSet<u16> = table.values().filter_map(|record| record.id).collect();
        self.ids
            .clone()
            .find(|id| !used.contains(id))
            .ok_or(ExportError::NoFreeId)
    }
}
