//! StorageClass `parameters`: parsed strictly, so a typo fails the claim with an event
//! instead of silently provisioning with defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use nfsprov_api_types::{Mode, QuotaPolicy, validate_component};

use crate::pattern::{PathPattern, PatternError};

pub const PARAM_AGENT: &str = "agent";
pub const PARAM_AGENTS: &str = "agents";
pub const PARAM_PATH_PATTERN: &str = "pathPattern";
pub const PARAM_ON_DELETE: &str = "onDelete";
pub const PARAM_ARCHIVE_ON_DELETE: &str = "archiveOnDelete";
pub const PARAM_MODE: &str = "mode";
pub const PARAM_UID: &str = "uid";
pub const PARAM_GID: &str = "gid";
pub const PARAM_QUOTA: &str = "quota";
pub const PARAM_ARCHIVE_RETENTION_DAYS: &str = "archiveRetentionDays";

const KNOWN: [&str; 10] = [
    PARAM_AGENT,
    PARAM_AGENTS,
    PARAM_PATH_PATTERN,
    PARAM_ON_DELETE,
    PARAM_ARCHIVE_ON_DELETE,
    PARAM_MODE,
    PARAM_UID,
    PARAM_GID,
    PARAM_QUOTA,
    PARAM_ARCHIVE_RETENTION_DAYS,
];

/// What happens to the data when a PV with reclaimPolicy Delete is released.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OnDelete {
    Delete,
    Retain,
    /// The default: no silent data loss, as with the peers.
    #[default]
    Archive,
}

impl OnDelete {
    pub fn as_str(self) -> &'static str {
        match self {
            OnDelete::Delete => "delete",
            OnDelete::Retain => "retain",
            OnDelete::Archive => "archive",
        }
    }
}

impl fmt::Display for OnDelete {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnDelete {
    type Err = ParamError;
    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        match raw.trim().to_ascii_lowercase().as_str() {
            "delete" => Ok(OnDelete::Delete),
            "retain" => Ok(OnDelete::Retain),
            "archive" => Ok(OnDelete::Archive),
            _ => Err(ParamError::Invalid {
                key: PARAM_ON_DELETE,
                value: raw.to_owned(),
                expected: "one of delete, retain, archive",
            }),
        }
    }
}

/// The parsed parameters of one StorageClass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClassParams {
    /// The agents a new volume may go to, from `agent` or `agents`: none means the default
    /// agent, several mean the one with the most space available.
    pub agents: Vec<String>,
    pub path_pattern: PathPattern,
    pub on_delete: OnDelete,
    pub mode: Mode,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    /// Whether the agent must, may or must not hold the volume to its capacity.
    pub quota: QuotaPolicy,
    /// Days the agent keeps an archive of this class's volumes; `None`: the agent's own
    /// retention (or forever).
    pub archive_retention_days: Option<u32>,
}

impl Default for ClassParams {
    fn default() -> Self {
        Self {
            agents: Vec::new(),
            path_pattern: PathPattern::default(),
            on_delete: OnDelete::default(),
            mode: Mode::DEFAULT,
            uid: None,
            gid: None,
            quota: QuotaPolicy::default(),
            archive_retention_days: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParamError {
    #[error("unknown StorageClass parameter {key:?}; known parameters: {}", KNOWN.join(", "))]
    Unknown { key: String },
    #[error("StorageClass parameter {key}={value:?} is invalid: expected {expected}")]
    Invalid {
        key: &'static str,
        value: String,
        expected: &'static str,
    },
    #[error(
        "StorageClass parameters agent and agents exclude each other: use agents alone to name several"
    )]
    AgentAndAgents,
    #[error("StorageClass parameter agents={value:?} names agent {name:?} twice")]
    DuplicateAgent { value: String, name: String },
    #[error("StorageClass parameter pathPattern is invalid: {0}")]
    Pattern(#[from] PatternError),
}

impl ClassParams {
    /// Parses a class's parameters; any key not in the StorageClass reference
    /// (docs/storageclass.md) is an error.
    pub fn parse(parameters: Option<&BTreeMap<String, String>>) -> Result<Self, ParamError> {
        let mut params = ClassParams::default();
        let Some(parameters) = parameters else {
            return Ok(params);
        };
        let mut on_delete = None;
        let mut archive_on_delete = None;
        let mut agent = None;
        let mut agents = None;
        for (key, value) in parameters {
            match key.as_str() {
                PARAM_AGENT => agent = Some(parse_agent_name(PARAM_AGENT, value, value)?),
                PARAM_AGENTS => agents = Some(parse_agents(value)?),
                PARAM_PATH_PATTERN => params.path_pattern = PathPattern::parse(value)?,
                PARAM_ON_DELETE => on_delete = Some(value.parse::<OnDelete>()?),
                PARAM_ARCHIVE_ON_DELETE => {
                    archive_on_delete = Some(parse_archive_on_delete(value)?)
                }
                PARAM_MODE => {
                    params.mode = Mode::parse_octal(value).map_err(|_| ParamError::Invalid {
                        key: PARAM_MODE,
                        value: value.clone(),
                        expected: "an octal mode such as \"0775\" (at most 07777)",
                    })?
                }
                PARAM_UID => params.uid = Some(parse_id(PARAM_UID, value)?),
                PARAM_GID => params.gid = Some(parse_id(PARAM_GID, value)?),
                PARAM_QUOTA => params.quota = parse_quota(value)?,
                PARAM_ARCHIVE_RETENTION_DAYS => {
                    params.archive_retention_days = Some(parse_retention_days(value)?)
                }
                _ => return Err(ParamError::Unknown { key: key.clone() }),
            }
        }
        params.agents = match (agent, agents) {
            (Some(_), Some(_)) => return Err(ParamError::AgentAndAgents),
            (Some(one), None) => vec![one],
            (None, Some(several)) => several,
            (None, None) => Vec::new(),
        };
        // onDelete overrides the legacy archiveOnDelete, as in nfs-subdir-external-provisioner.
        params.on_delete = on_delete.or(archive_on_delete).unwrap_or_default();
        Ok(params)
    }
}

impl ClassParams {
    /// What `onDelete` and `archiveOnDelete` say, every other parameter left unread: for
    /// the classes of a provisioner whose volumes are adopted (nfs-subdir-external-
    /// provisioner has the same two, with the same meaning and precedence).
    pub fn on_delete_of(
        parameters: Option<&BTreeMap<String, String>>,
    ) -> Result<OnDelete, ParamError> {
        let get = |key: &str| parameters.and_then(|p| p.get(key));
        let on_delete = get(PARAM_ON_DELETE)
            .map(|v| v.parse::<OnDelete>())
            .transpose()?;
        let archive_on_delete = get(PARAM_ARCHIVE_ON_DELETE)
            .map(|v| parse_archive_on_delete(v))
            .transpose()?;
        Ok(on_delete.or(archive_on_delete).unwrap_or_default())
    }
}

fn parse_archive_on_delete(value: &str) -> Result<OnDelete, ParamError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "true" => Ok(OnDelete::Archive),
        "false" => Ok(OnDelete::Delete),
        _ => Err(ParamError::Invalid {
            key: PARAM_ARCHIVE_ON_DELETE,
            value: value.to_owned(),
            expected: "\"true\" or \"false\"",
        }),
    }
}

fn parse_agent_name(key: &'static str, value: &str, name: &str) -> Result<String, ParamError> {
    let name = name.trim();
    validate_component(name).map_err(|_| ParamError::Invalid {
        key,
        value: value.to_owned(),
        expected: if key == PARAM_AGENTS {
            "a comma-separated list of agent names from the controller's agent list"
        } else {
            "the name of an agent from the controller's agent list"
        },
    })?;
    Ok(name.to_owned())
}

/// `nfs1,nfs2`: spaces around names are allowed, empty names and repeats are not (a
/// repeat is almost always a typo for another agent).
fn parse_agents(value: &str) -> Result<Vec<String>, ParamError> {
    let mut names: Vec<String> = Vec::new();
    for part in value.split(',') {
        let name = parse_agent_name(PARAM_AGENTS, value, part)?;
        if names.contains(&name) {
            return Err(ParamError::DuplicateAgent {
                value: value.to_owned(),
                name,
            });
        }
        names.push(name);
    }
    Ok(names)
}

/// Case-insensitive like `onDelete`, so `Enforce` or `besteffort` are not a trap; the
/// canonical spellings are the ones [`QuotaPolicy::as_str`] gives.
fn parse_quota(value: &str) -> Result<QuotaPolicy, ParamError> {
    [
        QuotaPolicy::Enforce,
        QuotaPolicy::BestEffort,
        QuotaPolicy::Off,
    ]
    .into_iter()
    .find(|policy| policy.as_str().eq_ignore_ascii_case(value.trim()))
    .ok_or_else(|| ParamError::Invalid {
        key: PARAM_QUOTA,
        value: value.to_owned(),
        expected: "one of enforce, bestEffort, off",
    })
}

/// Whole days, at least 1: an archive kept for no time would be a delete by another name.
pub fn parse_retention_days(value: &str) -> Result<u32, ParamError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        .filter(|days| *days > 0)
        .ok_or_else(|| ParamError::Invalid {
            key: PARAM_ARCHIVE_RETENTION_DAYS,
            value: value.to_owned(),
            expected: "a whole number of days, at least 1",
        })
}

fn parse_id(key: &'static str, value: &str) -> Result<u32, ParamError> {
    value
        .trim()
        .parse::<u32>()
        .ok()
        // u32::MAX is the kernel's "no change" marker for chown, never a real owner.
        .filter(|id| *id != u32::MAX)
        .ok_or_else(|| ParamError::Invalid {
            key,
            value: value.to_owned(),
            expected: "a numeric id between 0 and 4294967294",
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(pairs: &[(&str, &str)]) -> Result<ClassParams, ParamError> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ClassParams::parse(Some(&map))
    }

    #[test]
    fn defaults_archive_with_mode_0777() {
        let params = ClassParams::parse(None).unwrap();
        assert_eq!(params, ClassParams::default());
        assert_eq!(params.on_delete, OnDelete::Archive);
        assert_eq!(params.mode.bits(), 0o777);
        assert_eq!(
            params.path_pattern.as_str(),
            crate::pattern::DEFAULT_PATTERN
        );
        assert_eq!(parse(&[]).unwrap(), params);
        assert_eq!(params.quota, QuotaPolicy::BestEffort);
    }

    #[test]
    fn on_delete_alone_from_another_provisioners_class() {
        let of = |pairs: &[(&str, &str)]| {
            let map: BTreeMap<String, String> = pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect();
            ClassParams::on_delete_of(Some(&map))
        };
        assert_eq!(ClassParams::on_delete_of(None).unwrap(), OnDelete::Archive);
        // Parameters only the other provisioner knows are no error here.
        assert_eq!(
            of(&[("archiveOnDelete", "false"), ("server", "x")]).unwrap(),
            OnDelete::Delete
        );
        assert_eq!(
            of(&[("archiveOnDelete", "true")]).unwrap(),
            OnDelete::Archive
        );
        assert_eq!(
            of(&[("archiveOnDelete", "false"), ("onDelete", "retain")]).unwrap(),
            OnDelete::Retain
        );
        assert!(of(&[("archiveOnDelete", "yes")]).is_err());
        assert!(of(&[("onDelete", "shred")]).is_err());
    }

    #[test]
    fn archive_retention_in_whole_days() {
        assert_eq!(
            parse(&[("archiveRetentionDays", " 30 ")])
                .unwrap()
                .archive_retention_days,
            Some(30)
        );
        assert_eq!(parse(&[]).unwrap().archive_retention_days, None);
        for bad in ["0", "-1", "1.5", "30d", "", "4294967296"] {
            let err = parse(&[("archiveRetentionDays", bad)])
                .unwrap_err()
                .to_string();
            assert!(err.contains("archiveRetentionDays"), "{bad}: {err}");
        }
    }

    #[test]
    fn quota_policies() {
        for (raw, expected) in [
            ("enforce", QuotaPolicy::Enforce),
            ("bestEffort", QuotaPolicy::BestEffort),
            ("off", QuotaPolicy::Off),
            (" Enforce ", QuotaPolicy::Enforce),
            ("besteffort", QuotaPolicy::BestEffort),
        ] {
            assert_eq!(parse(&[("quota", raw)]).unwrap().quota, expected, "{raw}");
        }
        for bad in ["", "on", "hard", "true", "enforced"] {
            let err = parse(&[("quota", bad)]).unwrap_err().to_string();
            assert!(
                err.contains("quota") && err.contains("enforce, bestEffort, off"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn all_parameters() {
        let params = parse(&[
            ("agent", "nfs1"),
            ("pathPattern", "${.PVC.namespace}/${.PVC.name}"),
            ("onDelete", "Retain"),
            ("mode", "2770"),
            ("uid", "1000"),
            ("gid", "0"),
            ("quota", "off"),
        ])
        .unwrap();
        assert_eq!(params.agents, ["nfs1"]);
        assert_eq!(
            params.path_pattern.as_str(),
            "${.PVC.namespace}/${.PVC.name}"
        );
        assert_eq!(params.on_delete, OnDelete::Retain);
        assert_eq!(params.mode.bits(), 0o2770);
        assert_eq!((params.uid, params.gid), (Some(1000), Some(0)));
        assert_eq!(params.quota, QuotaPolicy::Off);
    }

    #[test]
    fn several_agents() {
        assert_eq!(
            parse(&[("agents", " nfs1 , nfs2,nfs3")]).unwrap().agents,
            ["nfs1", "nfs2", "nfs3"]
        );
        assert_eq!(parse(&[("agents", "nfs2")]).unwrap().agents, ["nfs2"]);
        assert!(parse(&[]).unwrap().agents.is_empty());
    }

    #[test]
    fn legacy_archive_on_delete_and_precedence() {
        assert_eq!(
            parse(&[("archiveOnDelete", "false")]).unwrap().on_delete,
            OnDelete::Delete
        );
        assert_eq!(
            parse(&[("archiveOnDelete", "true")]).unwrap().on_delete,
            OnDelete::Archive
        );
        let both = parse(&[("archiveOnDelete", "true"), ("onDelete", "delete")]).unwrap();
        assert_eq!(both.on_delete, OnDelete::Delete);
    }

    #[test]
    fn mistakes_are_errors() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (
                &[("archiveOnDelet", "true")],
                "unknown StorageClass parameter \"archiveOnDelet\"",
            ),
            (&[("server", "nfs.example")], "unknown"),
            (&[("onDelete", "shred")], "onDelete"),
            (&[("archiveOnDelete", "yes")], "archiveOnDelete"),
            (&[("mode", "0999")], "mode"),
            (&[("mode", "rwxr-xr-x")], "mode"),
            (&[("mode", "17777")], "mode"),
            (&[("uid", "-1")], "uid"),
            (&[("gid", "4294967295")], "gid"),
            (&[("uid", "root")], "uid"),
            (&[("agent", "../x")], "agent"),
            (&[("agent", "")], "agent"),
            (&[("agents", "")], "agents"),
            (&[("agents", "nfs1,,nfs2")], "comma-separated"),
            (&[("agents", "nfs1,../x")], "comma-separated"),
            (
                &[("agents", "nfs1, nfs2,nfs1")],
                "names agent \"nfs1\" twice",
            ),
            (
                &[("agent", "nfs1"), ("agents", "nfs1,nfs2")],
                "agent and agents exclude each other",
            ),
            (&[("pathPattern", "${.PVC.uid}")], "unknown variable"),
            (&[("pathPattern", "")], "pathPattern"),
        ];
        for (pairs, expected) in cases {
            let err = parse(pairs).unwrap_err().to_string();
            assert!(err.contains(expected), "{pairs:?}: {err}");
        }
    }
}
