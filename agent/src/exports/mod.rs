//! Per-volume NFS exports: the table of what each volume is exported to, kept in step
//! with the NFS server (knfsd or nfs-ganesha) and persisted so that a restart of the
//! agent, of the NFS server or of the machine restores exactly the current set.
//!
//! The record of an export lives in the NFS server's own configuration the agent owns
//! (ganesha's EXPORT files, knfsd's files under /etc/exports.d/), so there is one truth
//! for what the server serves after its restart and what the agent believes it serves.

mod fault;
mod files;
mod ganesha;
mod knfsd;
mod reconciler;
mod record;
mod server;
mod settings;
mod subvolume_mount;
mod table;

pub use fault::{FaultPoint, crash_if_asked};
pub use ganesha::{Ganesha, GaneshaExport, ShownExport};
pub use knfsd::Knfsd;
pub use reconciler::{Pass, PassStep, Reconciler};
pub use record::ExportRecord;
pub use server::Restored;
pub use server::{Change, ExportError, NfsServer, Table};
pub use settings::{ExportSettings, VolumeLayout};
pub use table::{ExportHealth, Exports};
