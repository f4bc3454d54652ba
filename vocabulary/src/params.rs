//! StorageClass `parameters`: parsed strictly, so a typo fails the claim with an event
//! instead of silently provisioning with defaults.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use nfsprov_api_types::{
    ExportClient, ExportClientError, MAX_EXPORT_CLIENTS, Mode, QuotaPolicy, Squash,
    validate_component,
};

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
pub const PARAM_EXPORT_CLIENTS: &str = "exportClients";
pub const PARAM_SQUASH: &str = "squash";

const KNOWN: [&str; 12] = [
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
    PARAM_EXPORT_CLIENTS,
    PARAM_SQUASH,
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

/// Who may mount the volumes of a class (`exportClients`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ExportClients {
    /// Every host (`*`): the default, and what an export root shared by hand gives.
    #[default]
    All,
    /// The InternalIP addresses of every Node of the cluster.
    Nodes,
    /// The InternalIP addresses of the Nodes where a pod using the claim is scheduled.
    Pods,
    /// A fixed list of addresses and networks.
    List(Vec<ExportClient>),
}

impl ExportClients {
    pub fn as_str(&self) -> &'static str {
        match self {
            ExportClients::All => "all",
            ExportClients::Nodes => "nodes",
            ExportClients::Pods => "pods",
            ExportClients::List(_) => "list",
        }
    }

    /// Whether the clients follow the cluster (Nodes and Pods come and go).
    pub fn follows_cluster(&self) -> bool {
        matches!(self, ExportClients::Nodes | ExportClients::Pods)
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
    /// `exportClients`; `None` when the class does not say (every host).
    pub export_clients: Option<ExportClients>,
    /// `squash`; `None` when the class does not say (root is squashed).
    pub squash: Option<Squash>,
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
            export_clients: None,
            squash: None,
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
    #[error(
        "StorageClass parameter exportClients={value:?} is invalid: {source}; expected all, nodes, pods or a comma-separated list of addresses and networks"
    )]
    ExportClient {
        value: String,
        #[source]
        source: ExportClientError,
    },
    #[error(
        "StorageClass parameter exportClients lists {0} clients; at most {MAX_EXPORT_CLIENTS} are allowed"
    )]
    TooManyExportClients(usize),
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
                PARAM_EXPORT_CLIENTS => params.export_clients = Some(parse_export_clients(value)?),
                PARAM_SQUASH => params.squash = Some(parse_squash(value)?),
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

/// `all`, `nodes` and `pods` in any case; anything else is a list, each entry read by
/// [`ExportClient`]'s own parser so the agent and the class agree on every spelling.
/// Repeats are dropped: they change nothing about who may mount.
fn parse_export_clients(value: &str) -> Result<ExportClients, ParamError> {
    let trimmed = value.trim();
    for keyword in [
        ExportClients::All,
        ExportClients::Nodes,
        ExportClients::Pods,
    ] {
        if trimmed.eq_ignore_ascii_case(keyword.as_str()) {
            return Ok(keyword);
        }
    }
    let mut clients = Vec::new();
    for part in trimmed.split(',') {
        let client = part
            .trim()
            .parse::<ExportClient>()
            .and_then(|client| client.refuse_unspecified().map(|()| client))
            .map_err(|source| ParamError::ExportClient {
                value: value.to_owned(),
                source,
            })?;
        if !clients.contains(&client) {
            clients.push(client);
        }
        if clients.len() > MAX_EXPORT_CLIENTS {
            return Err(ParamError::TooManyExportClients(clients.len()));
        }
    }
    Ok(ExportClients::List(clients))
}

fn parse_squash(value: &str) -> Result<Squash, ParamError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "none" => Ok(Squash::None),
        "root" => Ok(Squash::Root),
        "all" => Ok(Squash::All),
        _ => Err(ParamError::Invalid {
            key: PARAM_SQUASH,
            value: value.to_owned(),
            expected: "one of none, root, all",
        }),
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
    fn export_clients_keywords_and_lists() {
        let clients = |raw: &str| parse(&[("exportClients", raw)]).map(|p| p.export_clients);
        assert_eq!(parse(&[]).unwrap().export_clients, None);
        assert_eq!(clients("all").unwrap(), Some(ExportClients::All));
        assert_eq!(clients(" Nodes ").unwrap(), Some(ExportClients::Nodes));
        assert_eq!(clients("pods").unwrap(), Some(ExportClients::Pods));
        assert_eq!(
            clients("10.0.0.0/8, 192.0.2.7,fd00::/8,192.0.2.7").unwrap(),
            Some(ExportClients::List(vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.0.2.7".parse().unwrap(),
                "fd00::/8".parse().unwrap(),
            ]))
        );
        assert_eq!(
            clients("*").unwrap(),
            Some(ExportClients::List(vec![ExportClient::Everyone]))
        );
    }

    #[test]
    fn bad_export_clients_say_which_entry_and_why() {
        for (raw, expected) in [
            ("", "is not `*`, an IP address"),
            ("10.0.0.0/8,,10.1.0.0/16", "is not `*`, an IP address"),
            ("node-a", "\"node-a\" is not `*`"),
            ("10.1.2.3/24", "host bits set; the network is 10.1.2.0/24"),
            ("10.0.0.0/33", "longer than the address"),
            ("everyone", "\"everyone\" is not"),
            ("10.0.0.0/8,0.0.0.0", "unspecified address"),
            ("0.0.0.0/0", "write `*` to admit every host"),
            ("::/0", "unspecified address"),
        ] {
            let err = parse(&[("exportClients", raw)]).unwrap_err().to_string();
            assert!(
                err.contains("exportClients") && err.contains(expected),
                "{raw:?}: {err}"
            );
        }
        let many = (0..=MAX_EXPORT_CLIENTS)
            .map(|i| format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255))
            .collect::<Vec<_>>()
            .join(",");
        assert_eq!(
            parse(&[("exportClients", &many)]),
            Err(ParamError::TooManyExportClients(MAX_EXPORT_CLIENTS + 1))
        );
    }

    #[test]
    fn squash_values() {
        for (raw, expected) in [
            ("none", Squash::None),
            ("Root", Squash::Root),
            (" all ", Squash::All),
        ] {
            assert_eq!(parse(&[("squash", raw)]).unwrap().squash, Some(expected));
        }
        assert_eq!(parse(&[]).unwrap().squash, None);
        for bad in ["", "root_squash", "no", "anon"] {
            let err = parse(&[("squash", bad)]).unwrap_err().to_string();
            assert!(
                err.contains("squash") && err.contains("none, root, all"),
                "{err}"
            );
        }
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
