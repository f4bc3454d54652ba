//! A claim made from an archive: how a claim names the archive (two annotations), and
//! which archives it may be made from. The controller applies these rules to annotated
//! claims and `kubectl nfsprov restore` applies them before it creates one, so both
//! refuse with the same words.
//!
//! An archive id is a path on an agent, not an object a namespace owns, and a tenant may
//! annotate its own claims as it likes. Were any archive restorable into any claim, a
//! tenant who learnt (or guessed) another namespace's archive id would read that
//! namespace's data. So an archive is made into a claim only of the namespace its volume
//! was made for, as the archive records it; an archive recording no namespace (a volume
//! made through the agent's API without an owner) is made into no claim.

use std::collections::BTreeMap;
use std::fmt;

use nfsprov_api_types::{Archive, ArchivePath, Capabilities};

use crate::names::{ANN_RESTORE_ARCHIVE, ANN_RESTORE_ARCHIVE_AGENT};

/// The archive a claim asks to be made from, and the agent holding it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSource {
    pub agent: String,
    pub id: ArchivePath,
}

/// `agent:id`, as the restored PV records it.
impl fmt::Display for ArchiveSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.agent, self.id)
    }
}

/// The archive a claim's annotations name, `None` when they name none; an error when
/// only one of the two annotations is there, or the id is not an archive id.
pub fn requested(
    annotations: Option<&BTreeMap<String, String>>,
) -> Result<Option<ArchiveSource>, String> {
    let get = |key| annotations.and_then(|a| a.get(key)).map(String::as_str);
    match (get(ANN_RESTORE_ARCHIVE), get(ANN_RESTORE_ARCHIVE_AGENT)) {
        (None, None) => Ok(None),
        (Some(id), Some(agent)) => {
            let id = ArchivePath::parse(id).map_err(|e| {
                format!("annotation {ANN_RESTORE_ARCHIVE} is not an archive id: {e}")
            })?;
            if agent.is_empty() {
                return Err(format!(
                    "annotation {ANN_RESTORE_ARCHIVE_AGENT} is empty: name the agent holding archive {id}"
                ));
            }
            Ok(Some(ArchiveSource {
                agent: agent.to_owned(),
                id,
            }))
        }
        (Some(_), None) => Err(format!(
            "annotation {ANN_RESTORE_ARCHIVE} names an archive but {ANN_RESTORE_ARCHIVE_AGENT} names no agent: a claim made from an archive names both (kubectl nfsprov restore sets them)"
        )),
        (None, Some(_)) => Err(format!(
            "annotation {ANN_RESTORE_ARCHIVE_AGENT} names an agent but {ANN_RESTORE_ARCHIVE} names no archive: a claim made from an archive names both (kubectl nfsprov restore sets them)"
        )),
    }
}

/// Whether the agent holding the archive can make a volume from it. An agent from before
/// archive restores has no `GET /v1/archives/{id}`: asked anyway, it would answer as if the
/// archive did not exist, and send its user looking for an archive that is there.
pub fn check_agent(source: &ArchiveSource, capabilities: &Capabilities) -> Result<(), String> {
    if capabilities.archive_restores {
        return Ok(());
    }
    Err(format!(
        "agent {agent} cannot make a volume from an archive (its version is older than archive restores): upgrade agent {agent} to restore archive {id}",
        agent = source.agent,
        id = source.id
    ))
}

/// Whether a claim of `namespace` may be made from `archive` (see the module's doc).
pub fn check_namespace(
    source: &ArchiveSource,
    archive: &Archive,
    namespace: &str,
) -> Result<(), String> {
    match archive.owner.pvc_namespace.as_deref() {
        Some(recorded) if recorded == namespace => Ok(()),
        Some(recorded) => Err(format!(
            "archive {source} holds a volume of namespace {recorded}, not {namespace}: a claim is made only from an archive of its own namespace"
        )),
        None => Err(format!(
            "archive {source} records no namespace: a claim is made only from an archive of its own namespace, and this one has none"
        )),
    }
}

/// Whether `requested_bytes` holds the archive: at least the capacity its volume had,
/// where the archive records it.
pub fn check_capacity(
    source: &ArchiveSource,
    archive: &Archive,
    requested_bytes: u64,
) -> Result<(), String> {
    match archive.capacity_bytes {
        Some(capacity) if requested_bytes < capacity => Err(format!(
            "{requested_bytes} bytes requested, less than the {capacity} bytes the volume of archive {source} had: a volume made from an archive must be at least as large"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const ID: &str = "team/data/@20260101T000000.000000000Z";

    fn annotations(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn archive(namespace: Option<&str>, capacity: Option<u64>) -> Archive {
        serde_json::from_value(json!({
            "id": ID,
            "archive_path": format!(".archive/{ID}"),
            "path": "team/data",
            "owner": {"pvc_namespace": namespace, "pvc_name": "data"},
            "archived_at": "2026-01-01T00:00:00Z",
            "capacity_bytes": capacity,
        }))
        .unwrap()
    }

    fn source() -> ArchiveSource {
        ArchiveSource {
            agent: "nfs1".into(),
            id: ArchivePath::parse(ID).unwrap(),
        }
    }

    #[test]
    fn a_claim_names_an_archive_by_both_annotations_or_by_neither() {
        assert_eq!(requested(None), Ok(None));
        assert_eq!(requested(Some(&annotations(&[("other", "x")]))), Ok(None));
        let both = annotations(&[
            (ANN_RESTORE_ARCHIVE, ID),
            (ANN_RESTORE_ARCHIVE_AGENT, "nfs1"),
        ]);
        assert_eq!(requested(Some(&both)), Ok(Some(source())));
        assert_eq!(source().to_string(), format!("nfs1:{ID}"));
        let only_id = requested(Some(&annotations(&[(ANN_RESTORE_ARCHIVE, ID)]))).unwrap_err();
        assert!(only_id.contains("names no agent"), "{only_id}");
        let only_agent =
            requested(Some(&annotations(&[(ANN_RESTORE_ARCHIVE_AGENT, "nfs1")]))).unwrap_err();
        assert!(only_agent.contains("names no archive"), "{only_agent}");
        let bad = annotations(&[
            (ANN_RESTORE_ARCHIVE, "../etc/@x"),
            (ANN_RESTORE_ARCHIVE_AGENT, "nfs1"),
        ]);
        assert!(
            requested(Some(&bad))
                .unwrap_err()
                .contains("is not an archive id")
        );
        let no_agent = annotations(&[(ANN_RESTORE_ARCHIVE, ID), (ANN_RESTORE_ARCHIVE_AGENT, "")]);
        assert!(requested(Some(&no_agent)).unwrap_err().contains("is empty"));
    }

    #[test]
    fn only_an_agent_that_says_it_restores_archives_is_asked_for_one() {
        let mut capabilities: Capabilities = serde_json::from_value(json!({
            "quota": "none", "quota_enforced": false, "archive": true,
        }))
        .unwrap();
        let old = check_agent(&source(), &capabilities).unwrap_err();
        assert_eq!(
            old,
            format!(
                "agent nfs1 cannot make a volume from an archive (its version is older than archive restores): upgrade agent nfs1 to restore archive {ID}"
            )
        );
        capabilities.archive_restores = true;
        assert_eq!(check_agent(&source(), &capabilities), Ok(()));
    }

    #[test]
    fn only_the_archives_own_namespace_and_a_large_enough_claim_may_have_it() {
        let own = archive(Some("team"), Some(1 << 30));
        assert_eq!(check_namespace(&source(), &own, "team"), Ok(()));
        let other = check_namespace(&source(), &own, "intruder").unwrap_err();
        assert_eq!(
            other,
            format!(
                "archive nfs1:{ID} holds a volume of namespace team, not intruder: a claim is made only from an archive of its own namespace"
            )
        );
        let unowned = check_namespace(&source(), &archive(None, None), "team").unwrap_err();
        assert!(unowned.contains("records no namespace"), "{unowned}");

        assert_eq!(check_capacity(&source(), &own, 1 << 30), Ok(()));
        let small = check_capacity(&source(), &own, (1 << 30) - 1).unwrap_err();
        assert!(small.contains("less than the 1073741824 bytes"), "{small}");
        assert_eq!(
            check_capacity(&source(), &archive(Some("team"), None), 1),
            Ok(()),
            "an archive recording no capacity fits any claim"
        );
    }
}
