//! Creating a volume (staged and renamed into place, or made in place and finished by
//! its record) and adopting a directory as one.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use nfsprov_api_types::{AdoptVolumeRequest, CreateVolumeRequest, QuotaPolicy, Volume, VolumePath};
use rustix::fs::{AtFlags, FileType, Mode, RenameFlags};
use rustix::io::Errno;

use crate::store::confine::{STAGING_DIR, open_child, open_or_create_dir};
use crate::store::error::{io_error, not_found, walk_error};
use crate::store::mounts;
use crate::store::record::now_rfc3339;

use crate::store::{
    Created, KnownQuota, Layout, Result, STATE_DIR, Staged, StoreError, VolumeRecord, VolumeStore,
    claim_differences, confirmed, quota_difference, record_as_found,
};

impl VolumeStore {
    /// The record a create request asks for, to compare with an existing volume's.
    pub(in crate::store) fn wanted_record(&self, request: &CreateVolumeRequest) -> VolumeRecord {
        VolumeRecord {
            mode: request.mode,
            uid: request.uid.unwrap_or(self.default_uid),
            gid: request.gid.unwrap_or(self.default_gid),
            capacity_bytes: request.capacity_bytes,
            owner: request.owner.clone(),
            created_at: String::new(),
            quota: None,
            archive: None,
            clone: None,
            restore: None,
        }
    }

    /// Whether a new volume gets a quota, or why the request cannot be honoured.
    pub(in crate::store) fn enforcement(
        &self,
        path: &VolumePath,
        policy: QuotaPolicy,
    ) -> Result<bool> {
        let can_enforce = self.backend.can_enforce();
        match policy {
            QuotaPolicy::Off => Ok(false),
            QuotaPolicy::BestEffort => Ok(can_enforce),
            QuotaPolicy::Enforce if can_enforce => Ok(true),
            QuotaPolicy::Enforce => Err(StoreError::Unsupported(format!(
                "{path}: quota enforcement was required, but this agent's quota backend is none, so capacity cannot be enforced; configure a quota backend on the agent or use quota bestEffort or off"
            ))),
            QuotaPolicy::Unknown => Err(StoreError::Unsupported(format!(
                "{path}: the request asks for a quota policy this agent does not know (the controller is newer); upgrade the agent, or use quota enforce, bestEffort or off"
            ))),
        }
    }

    /// Creates the volume, or confirms it exists with the same settings.
    pub fn create(
        &self,
        path: &VolumePath,
        request: &CreateVolumeRequest,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        let _nesting = self.nesting.making(path.as_str());
        let reservation = self.promise(path, request.capacity_bytes)?;
        let wanted = self.wanted_record(request);
        let parent = self
            .walk_parents(path, true)?
            .ok_or_else(|| not_found(path))?;
        if let Some(existing) = self.backend.find(&self.root, parent.as_fd(), path)? {
            // Confirmed only once durable: it may be what a request that failed to sync made.
            let confirmed = confirm(path, existing, &wanted, request.quota)?;
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        let limit = self
            .enforcement(path, request.quota)?
            .then_some(request.capacity_bytes);
        let record = VolumeRecord {
            created_at: now_rfc3339(),
            ..wanted.clone()
        };
        let made = match self.backend.layout() {
            Layout::Directories => {
                self.create_staged(path, parent.as_fd(), record, limit, &wanted, request.quota)
            }
            Layout::Mounts => self.create_in_place(path, parent.as_fd(), record, limit),
        }?;
        reservation.keep_if(made.1 == Created::New);
        self.settle(path, parent.as_fd())?;
        Ok(made)
    }

    /// Makes the directory already at `path` a volume as it is, by writing a record of it:
    /// mode, uid and gid as found, the request's capacity and owner, no quota. Nothing
    /// inside is read or changed and nothing moves, so data a tenant reaches over NFS
    /// stays exactly where and what it was. A volume already there with the same owner
    /// and capacity is confirmed.
    pub fn adopt(
        &self,
        path: &VolumePath,
        request: &AdoptVolumeRequest,
    ) -> Result<(Volume, Created)> {
        self.root.ensure_present()?;
        self.backend.check_adoptable(path)?;
        let _nesting = self.nesting.adopting(path.as_str());
        let parent = self
            .walk_parents(path, false)?
            .ok_or_else(|| no_directory(path))?;
        let dir = open_adoptable(parent.as_fd(), path)?;
        if self.backend.is_volume(&self.root, dir.as_fd())? {
            let existing = self
                .backend
                .find(&self.root, parent.as_fd(), path)?
                .ok_or_else(|| no_directory(path))?;
            let wanted = VolumeRecord {
                capacity_bytes: request.capacity_bytes,
                owner: request.owner.clone(),
                ..existing.clone()
            };
            let confirmed = confirm(path, existing, &wanted, QuotaPolicy::BestEffort)?;
            drop(dir);
            self.settle(path, parent.as_fd())?;
            return Ok(confirmed);
        }
        self.refuse_volumes_below(path)?;
        self.refuse_mount_points_around(path)?;
        let record = record_as_found(dir.as_fd(), path, request.capacity_bytes, &request.owner)?;
        self.backend.write_record(dir.as_fd(), path, &record)?;
        self.provisioned.add(record.capacity_bytes);
        self.prefix_tally.count(path, record.capacity_bytes);
        drop(dir);
        self.settle(path, parent.as_fd())?;
        tracing::info!(
            %path,
            capacity_bytes = record.capacity_bytes,
            quota_backend = %self.backend.kind(),
            "adopted an existing directory as a volume; no quota enforces its capacity"
        );
        Ok((record.to_volume(path), Created::New))
    }

    /// Refuses to adopt a directory that holds volumes: they would be nested in it.
    pub(in crate::store) fn refuse_volumes_below(&self, path: &VolumePath) -> Result<()> {
        let prefix = format!("{path}/");
        let below: Vec<String> = self
            .backend
            .list(&self.root)?
            .into_iter()
            .map(|(volume, _)| volume.to_string())
            .filter(|volume| volume.starts_with(&prefix))
            .collect();
        if below.is_empty() {
            return Ok(());
        }
        let shown = below.iter().take(5).cloned().collect::<Vec<_>>().join(", ");
        let more = below.len().saturating_sub(5);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        Err(StoreError::Conflict(format!(
            "{path} holds volumes ({shown}{more}); volumes cannot be nested, so it cannot be adopted"
        )))
    }

    /// Refuses to adopt a directory that is, holds or lies beneath a mount point: its
    /// volume would span filesystems, and could then be neither deleted nor archived.
    pub(in crate::store) fn refuse_mount_points_around(&self, path: &VolumePath) -> Result<()> {
        let points = self.mount_points(path.as_str(), mounts::MountTable::mount_points_around)?;
        if points.is_empty() {
            return Ok(());
        }
        Err(StoreError::Conflict(format!(
            "{path} is, holds or lies beneath mount points ({}); a volume never spans a mount point, so it cannot be adopted; unmount them and retry",
            points.join(", ")
        )))
    }

    /// Sets a directory volume up in staging, then renames it into place.
    pub(in crate::store) fn create_staged(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        mut record: VolumeRecord,
        limit: Option<u64>,
        wanted: &VolumeRecord,
        policy: QuotaPolicy,
    ) -> Result<(Volume, Created)> {
        let staging = self.root.open_internal(&[STATE_DIR, STAGING_DIR], false)?;
        let staged = self.unique_name("new");
        record.quota = self.backend.make(
            &self.root,
            staging.as_fd(),
            &staged,
            path,
            limit,
            record.capacity_bytes,
        )?;
        let quota = record.quota.clone();
        self.place_staged(
            path,
            parent,
            Staged {
                dir: staging.as_fd(),
                name: &staged,
                quota: quota.as_ref(),
            },
            |dir| {
                self.finish(dir, path, &record)?;
                Ok(record)
            },
            |existing| confirm(path, existing, wanted, policy),
        )
    }

    /// Finishes the volume made in staging (`finish` sets it up, writes its record and
    /// answers it) and renames it into place. When anything fails it is removed; when the
    /// path was taken meanwhile, what is there is judged by `confirm_taken`.
    pub(in crate::store) fn place_staged(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        staged: Staged<'_>,
        finish: impl FnOnce(BorrowedFd<'_>) -> Result<VolumeRecord>,
        confirm_taken: impl FnOnce(VolumeRecord) -> Result<(Volume, Created)>,
    ) -> Result<(Volume, Created)> {
        let result = (|| -> Result<(VolumeRecord, rustix::io::Result<()>)> {
            let dir = open_child(staged.dir, staged.name, false)?;
            let record = finish(dir.as_fd())?;
            let moved = rustix::fs::renameat_with(
                staged.dir,
                staged.name,
                parent,
                path.file_name(),
                RenameFlags::NOREPLACE,
            );
            Ok((record, moved))
        })();
        let discard = || {
            self.backend.remove(
                staged.dir,
                staged.name,
                None,
                KnownQuota::Known(staged.quota),
            )
        };
        match result {
            Ok((record, Ok(()))) => Ok((record.to_volume(path), Created::New)),
            Ok((_, Err(Errno::EXIST))) => {
                // Someone (another request, or a stray file) took the name meanwhile.
                discard()?;
                match self.backend.find(&self.root, parent, path)? {
                    Some(existing) => confirm_taken(existing),
                    None => Err(StoreError::Conflict(format!(
                        "{path} was created concurrently"
                    ))),
                }
            }
            Ok((_, Err(e))) => {
                discard()?;
                Err(io_error(format!("move new volume {path} into place"), e))
            }
            Err(e) => {
                discard()?;
                Err(e)
            }
        }
    }

    /// Makes a volume at its path; writing its record last finishes it.
    pub(in crate::store) fn create_in_place(
        &self,
        path: &VolumePath,
        parent: BorrowedFd<'_>,
        mut record: VolumeRecord,
        limit: Option<u64>,
    ) -> Result<(Volume, Created)> {
        let leaf = path.file_name();
        record.quota =
            self.backend
                .make(&self.root, parent, leaf, path, limit, record.capacity_bytes)?;
        let finished =
            open_child(parent, leaf, false).and_then(|dir| self.finish(dir.as_fd(), path, &record));
        match finished {
            Ok(()) => Ok((record.to_volume(path), Created::New)),
            Err(e) => {
                // Unfinished: nothing refers to it yet, so it goes at once.
                let _ = self.backend.remove(
                    parent,
                    leaf,
                    Some(path),
                    KnownQuota::Known(record.quota.as_ref()),
                );
                Err(e)
            }
        }
    }

    /// Gives a new volume its owner and mode, then its record.
    pub(in crate::store) fn finish(
        &self,
        dir: BorrowedFd<'_>,
        path: &VolumePath,
        record: &VolumeRecord,
    ) -> Result<()> {
        // chown before chmod: chown clears the setuid and setgid bits.
        rustix::fs::fchown(
            dir,
            Some(rustix::fs::Uid::from_raw(record.uid)),
            Some(rustix::fs::Gid::from_raw(record.gid)),
        )
        .map_err(|e| io_error(format!("chown {path} to {}:{}", record.uid, record.gid), e))?;
        rustix::fs::fchmod(dir, Mode::from_raw_mode(record.mode.bits()))
            .map_err(|e| io_error(format!("chmod {path}"), e))?;
        self.backend.write_record(dir, path, record)
    }
}

pub(in crate::store) fn no_directory(path: &VolumePath) -> StoreError {
    StoreError::NotFound(format!("no directory at {path} to adopt"))
}

/// The directory at `path` in `parent`, opened without following a link. A link there is
/// refused as on every path (never followed, whatever it points to); anything else that is
/// not a directory is a conflict, as a foreign directory is for a create.
pub(in crate::store) fn open_adoptable(
    parent: BorrowedFd<'_>,
    path: &VolumePath,
) -> Result<OwnedFd> {
    let name = path.file_name();
    match open_or_create_dir(parent, name, false) {
        Ok(dir) => Ok(dir),
        Err(Errno::NOENT) => Err(no_directory(path)),
        Err(Errno::NOTDIR | Errno::LOOP) => {
            let is_link = rustix::fs::statat(parent, name, AtFlags::SYMLINK_NOFOLLOW)
                .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
            if is_link {
                Err(walk_error(path.as_str(), Errno::LOOP))
            } else {
                Err(StoreError::Conflict(format!(
                    "{path} is not a directory; only a directory can be adopted"
                )))
            }
        }
        Err(e) => Err(walk_error(path.as_str(), e)),
    }
}

/// A repeated create is confirmed only when the volume has exactly the settings asked for.
pub(in crate::store) fn confirm(
    path: &VolumePath,
    existing: VolumeRecord,
    wanted: &VolumeRecord,
    policy: QuotaPolicy,
) -> Result<(Volume, Created)> {
    let mut differences: Vec<String> = quota_difference(&existing, policy).into_iter().collect();
    if existing.mode != wanted.mode {
        differences.push(format!(
            "mode {} (requested {})",
            existing.mode, wanted.mode
        ));
    }
    if existing.uid != wanted.uid {
        differences.push(format!("uid {} (requested {})", existing.uid, wanted.uid));
    }
    if existing.gid != wanted.gid {
        differences.push(format!("gid {} (requested {})", existing.gid, wanted.gid));
    }
    differences.extend(claim_differences(
        &existing,
        wanted.capacity_bytes,
        &wanted.owner,
    ));
    confirmed(path, existing, differences)
}
