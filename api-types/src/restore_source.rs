//! What a restored volume is made from: a snapshot or an archive. Apart from both so that
//! the volume's record (`types`) and the restore request (`snapshot`) can name it without
//! depending on each other.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::archive::ArchivePath;
use crate::snapshot_name::SnapshotName;

/// What a restored volume is made from. On the wire, one field named after the kind:
/// `"snapshot": NAME` or `"archive": ID`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RestoreSource {
    Snapshot(SnapshotName),
    Archive(ArchivePath),
}

impl fmt::Display for RestoreSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RestoreSource::Snapshot(name) => write!(f, "snapshot {name}"),
            RestoreSource::Archive(id) => write!(f, "archive {id}"),
        }
    }
}
