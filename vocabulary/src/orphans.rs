//! The orphan rules: which PVs expect their directory, and how one agent's listing compares
//! with the PVs pointing to it. The controller's periodic check and `kubectl nfsprov
//! orphans` both decide by these, so an operator sees what the controller would report.

use std::collections::HashSet;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use nfsprov_api_types::{Volume, VolumeOwner};

/// Where one PV says its data lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PvPointer {
    pub pv: String,
    pub agent: String,
    pub path: String,
    /// `namespace/name` of the claim it is bound to, if any.
    pub claim: Option<String>,
    /// Whether its directory is expected to exist now ([`expects_directory`]).
    pub expects_directory: bool,
}

/// Whether a PV in `phase` expects its directory to exist: not while it is Released or
/// being deleted, when the deletion path handles (and may already have removed) it.
pub fn expects_directory(phase: &str, being_deleted: bool) -> bool {
    !being_deleted && !matches!(phase, "Released" | "Failed")
}

/// One thing the check found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Finding {
    /// The agent holds this volume and no PV points to it.
    Unreferenced {
        agent: String,
        path: String,
        owner: VolumeOwner,
        created_at: String,
    },
    /// This PV points to a volume its agent does not hold.
    Missing {
        agent: String,
        path: String,
        pv: String,
        claim: Option<String>,
    },
}

/// Compares one agent's listing with the PVs that point to it: those known before the
/// listing was asked for (`expected`) and those known after it (`later`). Both protect
/// their directory (a PV made after a snapshot still does); only `expected` can be
/// reported missing, so a volume made after the listing never is. Volumes created less than `grace`
/// before `now` (or at an unreadable time) are left out: their PV may be on its way.
pub fn compare(
    agent: &str,
    listed: &[Volume],
    later: &[PvPointer],
    expected: &[PvPointer],
    grace: Duration,
    now: Timestamp,
) -> Vec<Finding> {
    let mut listing = Listing::new(agent, expected, grace, now);
    listing.add(listed);
    listing.finish(later)
}

/// [`compare`] fed one page of the listing at a time: what is held is what may become a
/// finding (volumes no expected PV points to, expected PVs whose volume was not listed
/// yet), never the listing itself.
#[derive(Debug)]
pub struct Listing<'a> {
    agent: &'a str,
    expected: &'a [PvPointer],
    pointed: HashSet<&'a str>,
    /// Paths of `expected` PVs that expect a directory, not listed so far.
    unseen: HashSet<&'a str>,
    /// Listed volumes no expected PV points to; `later` PVs may still.
    unreferenced: Vec<Finding>,
    grace: Duration,
    now: Timestamp,
}

impl<'a> Listing<'a> {
    pub fn new(agent: &'a str, expected: &'a [PvPointer], grace: Duration, now: Timestamp) -> Self {
        let ours = || expected.iter().filter(move |p| p.agent == agent);
        Self {
            agent,
            expected,
            pointed: ours().map(|p| p.path.as_str()).collect(),
            unseen: ours()
                .filter(|p| p.expects_directory)
                .map(|p| p.path.as_str())
                .collect(),
            unreferenced: Vec::new(),
            grace,
            now,
        }
    }

    /// One page of the agent's listing.
    pub fn add(&mut self, page: &[Volume]) {
        for volume in page {
            self.unseen.remove(volume.path.as_str());
            if !self.pointed.contains(volume.path.as_str())
                && older_than(&volume.created_at, self.grace, self.now)
            {
                self.unreferenced.push(Finding::Unreferenced {
                    agent: self.agent.to_owned(),
                    path: volume.path.to_string(),
                    owner: volume.owner.clone(),
                    created_at: volume.created_at.clone(),
                });
            }
        }
    }

    /// The findings once the whole listing was added, `later` being the PVs known after it.
    pub fn finish(self, later: &[PvPointer]) -> Vec<Finding> {
        let pointed_later: HashSet<&str> = later
            .iter()
            .filter(|p| p.agent == self.agent)
            .map(|p| p.path.as_str())
            .collect();
        let mut found: Vec<Finding> = self
            .unreferenced
            .into_iter()
            .filter(|finding| match finding {
                Finding::Unreferenced { path, .. } => !pointed_later.contains(path.as_str()),
                Finding::Missing { .. } => true,
            })
            .collect();
        found.extend(
            self.expected
                .iter()
                .filter(|p| p.agent == self.agent && p.expects_directory)
                .filter(|p| self.unseen.contains(p.path.as_str()))
                .map(|p| Finding::Missing {
                    agent: self.agent.to_owned(),
                    path: p.path.clone(),
                    pv: p.pv.clone(),
                    claim: p.claim.clone(),
                }),
        );
        found
    }
}

fn older_than(created_at: &str, grace: Duration, now: Timestamp) -> bool {
    let Ok(created) = created_at.parse::<Timestamp>() else {
        return false;
    };
    let age = now
        .as_millisecond()
        .saturating_sub(created.as_millisecond());
    u128::try_from(age).is_ok_and(|age| age >= grace.as_millis())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn volume(path: &str, created_at: &str) -> Volume {
        serde_json::from_value(json!({
            "path": path, "mode": "0777", "uid": 0, "gid": 0, "capacity_bytes": 1,
            "owner": {"pvc_namespace": "ns", "pvc_name": "old", "pv_name": "pvc-1"},
            "created_at": created_at,
        }))
        .unwrap()
    }

    fn pointer(pv: &str, agent: &str, path: &str, expects_directory: bool) -> PvPointer {
        PvPointer {
            pv: pv.into(),
            agent: agent.into(),
            path: path.into(),
            claim: Some(format!("ns/{pv}")),
            expects_directory,
        }
    }

    const NOW: &str = "2026-11-24T12:00:00Z";
    const OLD: &str = "2026-11-24T11:00:00Z";
    const GRACE: Duration = Duration::from_secs(600);

    fn now() -> Timestamp {
        NOW.parse().unwrap()
    }

    #[test]
    fn unreferenced_directories_and_missing_ones() {
        let listed = [volume("ns/kept", OLD), volume("ns/left", OLD)];
        let pvs = [
            pointer("pvc-kept", "nfs1", "ns/kept", true),
            pointer("pvc-gone", "nfs1", "ns/gone", true),
            // The same path on another agent is another directory.
            pointer("pvc-other", "nfs2", "ns/left", true),
        ];
        let found = compare("nfs1", &listed, &pvs, &pvs, GRACE, now());
        assert_eq!(
            found,
            [
                Finding::Unreferenced {
                    agent: "nfs1".into(),
                    path: "ns/left".into(),
                    owner: listed[1].owner.clone(),
                    created_at: OLD.into(),
                },
                Finding::Missing {
                    agent: "nfs1".into(),
                    path: "ns/gone".into(),
                    pv: "pvc-gone".into(),
                    claim: Some("ns/pvc-gone".into()),
                },
            ]
        );
    }

    #[test]
    fn young_and_undated_directories_are_never_reported() {
        let listed = [
            volume("ns/new", "2026-11-24T11:55:00Z"),
            volume("ns/odd", "not a time"),
            volume("ns/edge", "2026-11-24T11:50:00Z"),
        ];
        let found = compare("nfs1", &listed, &[], &[], GRACE, now());
        let paths: Vec<_> = found
            .iter()
            .map(|f| match f {
                Finding::Unreferenced { path, .. } => path.as_str(),
                Finding::Missing { path, .. } => path.as_str(),
            })
            .collect();
        assert_eq!(paths, ["ns/edge"], "exactly the grace period old counts");
    }

    #[test]
    fn a_pv_seen_only_after_the_listing_protects_but_is_not_missing() {
        // Seen after the listing: its directory may be newer than the listing.
        let late = pointer("pvc-late", "nfs1", "ns/late", true);
        let found = compare("nfs1", &[], std::slice::from_ref(&late), &[], GRACE, now());
        assert!(found.is_empty(), "{found:?}");
        // Its directory, listed, is referenced by it.
        let found = compare(
            "nfs1",
            &[volume("ns/late", OLD)],
            std::slice::from_ref(&late),
            &[],
            GRACE,
            now(),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn released_or_deleted_pvs_do_not_expect_their_directory() {
        let released = pointer("pvc-rel", "nfs1", "ns/rel", false);
        let found = compare(
            "nfs1",
            &[],
            std::slice::from_ref(&released),
            std::slice::from_ref(&released),
            GRACE,
            now(),
        );
        assert!(found.is_empty(), "{found:?}");
    }

    #[test]
    fn a_listing_fed_in_pages_finds_what_the_whole_one_does() {
        let listed: Vec<Volume> = (0..40)
            .map(|i| volume(&format!("ns/v{i:02}"), if i % 3 == 0 { NOW } else { OLD }))
            .collect();
        let expected: Vec<PvPointer> = (0..50)
            .filter(|i| i % 4 != 1)
            .map(|i| {
                pointer(
                    &format!("pv{i}"),
                    "nfs1",
                    &format!("ns/v{i:02}"),
                    i % 7 != 0,
                )
            })
            .collect();
        let later = [pointer("late", "nfs1", "ns/v05", true)];
        let whole = compare("nfs1", &listed, &later, &expected, GRACE, now());
        assert!(whole.iter().any(|f| matches!(f, Finding::Missing { .. })));
        assert!(
            whole
                .iter()
                .any(|f| matches!(f, Finding::Unreferenced { .. }))
        );
        for size in [1, 3, 39, 40] {
            let mut listing = Listing::new("nfs1", &expected, GRACE, now());
            for page in listed.chunks(size) {
                listing.add(page);
            }
            assert_eq!(listing.finish(&later), whole, "pages of {size}");
        }
    }
}
