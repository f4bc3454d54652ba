//! Durable changes of the files in the image area: each synced, and its directory too,
//! so that what a start finds after a crash is what was acknowledged.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::store::error::{Result, StoreError};

pub(super) fn failed(context: impl Into<String>, error: impl Into<io::Error>) -> StoreError {
    StoreError::Io {
        context: context.into(),
        source: error.into(),
    }
}

/// Sets the length of `image` (a sparse file: no data is written), synced.
pub(super) fn set_size(image: &Path, size: u64) -> Result<()> {
    let file = OpenOptions::new()
        .write(true)
        .open(image)
        .map_err(|e| failed(format!("open {}", image.display()), e))?;
    file.set_len(size)
        .map_err(|e| failed(format!("grow {}", image.display()), e))?;
    file.sync_all()
        .map_err(|e| failed(format!("sync {}", image.display()), e))
}

pub(super) fn make_parents(file: &Path) -> Result<()> {
    let Some(parent) = file.parent() else {
        return Ok(());
    };
    fs::create_dir_all(parent).map_err(|e| failed(format!("make {}", parent.display()), e))
}

pub(super) fn sync_file(file: &Path) -> Result<()> {
    File::open(file)
        .and_then(|f| f.sync_all())
        .map_err(|e| failed(format!("sync {}", file.display()), e))
}

pub(super) fn sync_parent(file: &Path) -> Result<()> {
    let Some(parent) = file.parent() else {
        return Ok(());
    };
    File::open(parent)
        .and_then(|dir| dir.sync_all())
        .map_err(|e| failed(format!("sync {}", parent.display()), e))
}

/// Replaces `file` with `bytes`, durably: written and synced aside, renamed over it, the
/// directory synced.
pub(super) fn write_synced(file: &Path, bytes: &[u8]) -> Result<()> {
    make_parents(file)?;
    let aside = file.with_extension("tmp");
    let context = || format!("write {}", file.display());
    let mut out = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&aside)
        .map_err(|e| failed(context(), e))?;
    out.write_all(bytes).map_err(|e| failed(context(), e))?;
    out.sync_all().map_err(|e| failed(context(), e))?;
    fs::rename(&aside, file).map_err(|e| failed(context(), e))?;
    sync_parent(file)
}

pub(super) fn remove_synced(file: &Path) -> Result<()> {
    match fs::remove_file(file) {
        Ok(()) => sync_parent(file),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(failed(format!("remove {}", file.display()), e)),
    }
}
