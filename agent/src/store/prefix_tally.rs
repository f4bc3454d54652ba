//! The live volumes by path with their capacities, and the limits some credentials put
//! on the volumes beneath their prefix: a staging cluster cannot fill the server that
//! production shares, nor make more volumes than it was given.
//!
//! The tally is read from the records once when the agent starts and moved by each
//! operation that makes, grows or removes a volume, like the provisioned figure it sits
//! beside; it is never written anywhere. A prefix's figures are the sum over the paths
//! beneath it, which lie together in the tally's order, so a check reads only that
//! prefix's own volumes. A new volume or a growth is held in the tally before it is
//! made, so two made at once are both counted against a limit.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use arc_swap::ArcSwap;
use nfsprov_api_types::VolumePath;

use super::error::{Result, StoreError};

/// What one credential may make beneath its prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixLimit {
    /// The credential's name, for the refusal and the metrics.
    pub credential: String,
    /// `None`: the whole export root.
    pub prefix: Option<VolumePath>,
    pub max_volumes: Option<u64>,
    /// The most capacity its volumes may add up to.
    pub max_bytes: Option<u64>,
}

/// The live volumes beneath a prefix.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixUse {
    pub volumes: u64,
    pub bytes: u64,
}

/// The live volumes' capacities, and the limits on them.
#[derive(Debug, Default)]
pub struct PrefixTally {
    volumes: Mutex<BTreeMap<String, u64>>,
    limits: ArcSwap<Vec<PrefixLimit>>,
}

impl PrefixTally {
    /// Starts from the live volumes and their capacities.
    pub fn new(volumes: impl IntoIterator<Item = (VolumePath, u64)>) -> Self {
        Self {
            volumes: Mutex::new(
                volumes
                    .into_iter()
                    .map(|(path, bytes)| (path.as_str().to_owned(), bytes))
                    .collect(),
            ),
            limits: ArcSwap::default(),
        }
    }

    /// The limits in force from now on (the credentials were read again).
    pub fn set_limits(&self, limits: Vec<PrefixLimit>) {
        self.limits.store(Arc::new(limits));
    }

    pub fn limits(&self) -> Arc<Vec<PrefixLimit>> {
        self.limits.load_full()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<String, u64>> {
        // A panic elsewhere under the lock leaves whole entries only.
        self.volumes
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The live volumes beneath `prefix` (all of them for `None`).
    pub fn usage(&self, prefix: Option<&VolumePath>) -> PrefixUse {
        usage(&self.lock(), prefix)
    }

    /// Holds `capacity` for the volume at `path` (made now, or grown to it), unless that
    /// would take a limited prefix holding `path` past its limit while adding to it. What
    /// is held goes back when the hold is dropped without being kept.
    pub fn hold(&self, path: &VolumePath, capacity: u64) -> Result<TallyHold<'_>> {
        let limits = self.limits.load();
        let mut volumes = self.lock();
        let before = volumes.get(path.as_str()).copied();
        let capacity = capacity.max(before.unwrap_or(0));
        for limit in limits.iter() {
            let bounded = limit.max_volumes.is_some() || limit.max_bytes.is_some();
            let holds = limit
                .prefix
                .as_ref()
                .is_none_or(|prefix| path.is_beneath(prefix));
            if bounded && holds {
                check(
                    limit,
                    &usage(&volumes, limit.prefix.as_ref()),
                    path,
                    before,
                    capacity,
                )?;
            }
        }
        volumes.insert(path.as_str().to_owned(), capacity);
        Ok(TallyHold {
            tally: self,
            path: path.as_str().to_owned(),
            before: Some(before),
        })
    }

    /// Counts a volume made without asking the limits: an adoption takes over data that
    /// is there already.
    pub fn count(&self, path: &VolumePath, capacity: u64) {
        self.lock().insert(path.as_str().to_owned(), capacity);
    }

    /// The volume at `path` is gone (deleted or archived).
    pub fn forget(&self, path: &VolumePath) {
        self.lock().remove(path.as_str());
    }
}

fn usage(volumes: &BTreeMap<String, u64>, prefix: Option<&VolumePath>) -> PrefixUse {
    let sum = |entries: &mut dyn Iterator<Item = &u64>| {
        entries.fold(PrefixUse::default(), |total, bytes| PrefixUse {
            volumes: total.volumes + 1,
            bytes: total.bytes.saturating_add(*bytes),
        })
    };
    match prefix {
        None => sum(&mut volumes.values()),
        // Every path beneath `p` starts with `p/`, and `0` follows `/`.
        Some(prefix) => sum(&mut volumes
            .range(format!("{prefix}/")..format!("{prefix}0"))
            .map(|(_, bytes)| bytes)),
    }
}

/// Refuses what would take `limit` past its bound while adding to it: a volume already
/// counted at least as large passes, so a repeated request is confirmed as ever.
fn check(
    limit: &PrefixLimit,
    now: &PrefixUse,
    path: &VolumePath,
    before: Option<u64>,
    capacity: u64,
) -> Result<()> {
    let new_volume = before.is_none();
    let more = capacity.saturating_sub(before.unwrap_or(0));
    let scope = Beneath(limit.prefix.as_ref());
    if let Some(max) = limit.max_volumes
        && new_volume
        && now.volumes + 1 > max
    {
        return Err(StoreError::CredentialLimit(format!(
            "{path}: refused: credential {} may have {max} volumes {scope}, and has {} already; nothing was made. Delete volumes or raise its max_volumes",
            limit.credential, now.volumes
        )));
    }
    if let Some(max) = limit.max_bytes
        && more > 0
        && now.bytes.saturating_add(more) > max
    {
        return Err(StoreError::CredentialLimit(format!(
            "{path}: refused: {more} more bytes would make the capacity of credential {}'s volumes {scope} {} bytes, past its max_bytes {max}; nothing was made or changed. Delete volumes or raise the limit",
            limit.credential,
            now.bytes.saturating_add(more)
        )));
    }
    Ok(())
}

struct Beneath<'a>(Option<&'a VolumePath>);

impl fmt::Display for Beneath<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(prefix) => write!(f, "beneath {prefix}"),
            None => f.write_str("on the agent"),
        }
    }
}

/// A volume's place in the tally, held while it is made or grown: given back when
/// dropped, unless kept.
#[derive(Debug)]
#[must_use = "a hold is given back when dropped"]
pub struct TallyHold<'a> {
    tally: &'a PrefixTally,
    path: String,
    /// What the tally held for the path before; `None` once kept.
    before: Option<Option<u64>>,
}

impl TallyHold<'_> {
    /// The volume was made or grown: it stays counted as held.
    pub fn keep(mut self) {
        self.before = None;
    }
}

impl Drop for TallyHold<'_> {
    fn drop(&mut self) {
        let Some(before) = self.before else {
            return;
        };
        let mut volumes = self.tally.lock();
        match before {
            Some(bytes) => volumes.insert(self.path.clone(), bytes),
            None => volumes.remove(&self.path),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path(raw: &str) -> VolumePath {
        VolumePath::parse(raw).unwrap()
    }

    fn limited(prefix: &str, max_volumes: Option<u64>, max_bytes: Option<u64>) -> PrefixTally {
        let tally = PrefixTally::new([
            (path("staging/a"), 10),
            (path("staging-old/b"), 100),
            (path("production/c"), 1000),
        ]);
        tally.set_limits(vec![PrefixLimit {
            credential: "staging".into(),
            prefix: Some(path(prefix)),
            max_volumes,
            max_bytes,
        }]);
        tally
    }

    #[test]
    fn a_prefix_counts_the_volumes_beneath_it_only() {
        let tally = limited("staging", None, None);
        assert_eq!(
            tally.usage(Some(&path("staging"))),
            PrefixUse {
                volumes: 1,
                bytes: 10
            }
        );
        assert_eq!(tally.usage(None).volumes, 3);
        assert_eq!(tally.usage(Some(&path("nothing"))), PrefixUse::default());
    }

    #[test]
    fn holds_past_a_limit_are_refused_and_dropped_ones_leave_nothing() {
        let tally = limited("staging", Some(2), Some(50));
        tally.hold(&path("staging/b"), 20).unwrap().keep();
        let refused = tally.hold(&path("staging/c"), 1).unwrap_err();
        assert!(
            matches!(refused, StoreError::CredentialLimit(_)),
            "{refused}"
        );
        assert!(
            refused
                .to_string()
                .contains("may have 2 volumes beneath staging"),
            "{refused}"
        );
        // Elsewhere the limit does not apply.
        tally.hold(&path("production/d"), 5000).unwrap().keep();
        // A growth within the bytes passes, past them is refused.
        tally.hold(&path("staging/b"), 40).unwrap().keep();
        let refused = tally.hold(&path("staging/b"), 41).unwrap_err();
        assert!(refused.to_string().contains("max_bytes 50"), "{refused}");
        // The same volume again adds nothing and passes at the limit.
        tally.hold(&path("staging/b"), 40).unwrap().keep();
        // A hold dropped unkept gives its place back.
        tally.set_limits(Vec::new());
        drop(tally.hold(&path("staging/x"), 7).unwrap());
        drop(tally.hold(&path("staging/b"), 45).unwrap());
        assert_eq!(
            tally.usage(Some(&path("staging"))),
            PrefixUse {
                volumes: 2,
                bytes: 50
            }
        );
        tally.forget(&path("staging/b"));
        assert_eq!(tally.usage(Some(&path("staging"))).volumes, 1);
    }

    #[test]
    fn concurrent_holds_never_pass_the_limit_together() {
        let tally = Arc::new(limited("staging", Some(5), None));
        let made: Vec<bool> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..16)
                .map(|n| {
                    let tally = tally.clone();
                    scope.spawn(
                        move || match tally.hold(&path(&format!("staging/n{n}")), 1) {
                            Ok(hold) => {
                                hold.keep();
                                true
                            }
                            Err(_) => false,
                        },
                    )
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert_eq!(
            made.iter().filter(|m| **m).count(),
            4,
            "1 there + 4 made = 5"
        );
        assert_eq!(tally.usage(Some(&path("staging"))).volumes, 5);
    }
}
