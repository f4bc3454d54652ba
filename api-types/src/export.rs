//! Per-volume NFS exports: which clients may mount a volume, and with which options.
//!
//! The controller decides who may mount (the class's `exportClients`, `squash` and the
//! claim's access modes) and sends it as an [`ExportRequest`]; the agent's export
//! manager (knfsd or nfs-ganesha) makes the NFS server serve exactly that, and reports
//! what it serves as a [`VolumeExport`] in the volume.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Most clients one export may list. A class's `nodes` list holds one address per node,
/// so this is also the most nodes a `nodes` or `pods` export can follow.
pub const MAX_EXPORT_CLIENTS: usize = 10_000;

/// One client an export admits: every host, one address, or a network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ExportClient {
    /// Every host that reaches the NFS server (`*`).
    Everyone,
    /// One address.
    Host(IpAddr),
    /// A network in CIDR form, its host bits zero (`10.0.0.0/24`).
    Network { address: IpAddr, prefix: u8 },
}

/// Why a client spelling was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportClientError {
    #[error("{0:?} is not `*`, an IP address or a network in CIDR form (10.0.0.0/24)")]
    Malformed(String),
    #[error("{raw:?}: a prefix length of {prefix} is longer than the address ({max} bits)")]
    PrefixTooLong { raw: String, prefix: u8, max: u8 },
    #[error("{raw:?} has host bits set; the network is {network}")]
    HostBitsSet { raw: String, network: String },
    #[error(
        "{0:?} names the unspecified address, which NFS servers read as every host: write `*` to admit every host, or list the networks meant"
    )]
    UnspecifiedAddress(String),
}

impl ExportClient {
    /// Whether the client admits `address`.
    pub fn admits(&self, address: IpAddr) -> bool {
        match *self {
            ExportClient::Everyone => true,
            ExportClient::Host(host) => host == address,
            ExportClient::Network {
                address: network,
                prefix,
            } => mask(address, prefix).is_some_and(|masked| masked == network),
        }
    }

    /// Whether every address this client admits is one `bound` admits too: a host
    /// inside the bound's network, a network inside it, `*` only inside `*`.
    pub fn is_within(&self, bound: &ExportClient) -> bool {
        match (*self, *bound) {
            (_, ExportClient::Everyone) => true,
            (ExportClient::Everyone, _) => false,
            (ExportClient::Host(address), bound) => bound.admits(address),
            (ExportClient::Network { address, prefix }, ExportClient::Host(host)) => {
                let full = if address.is_ipv4() { 32 } else { 128 };
                prefix == full && address == host
            }
            (
                ExportClient::Network { address, prefix },
                ExportClient::Network {
                    address: network,
                    prefix: bound_prefix,
                },
            ) => {
                prefix >= bound_prefix
                    && bound.admits(address)
                    && address.is_ipv4() == network.is_ipv4()
            }
        }
    }
}

impl ExportClient {
    /// Refuses a client whose address is the unspecified one (`0.0.0.0`, `::`, or a
    /// network at it such as `0.0.0.0/0`): ganesha reads `0.0.0.0` as its wildcard and
    /// knfsd reads it as a hostname pattern, so what such a spelling admits depends on
    /// the server, never on what the operator wrote. `*` says "every host" plainly.
    ///
    /// Kept apart from parsing so that an export recorded by an older agent still loads.
    pub fn refuse_unspecified(&self) -> Result<(), ExportClientError> {
        let address = match *self {
            ExportClient::Everyone => return Ok(()),
            ExportClient::Host(address) | ExportClient::Network { address, .. } => address,
        };
        if address.to_canonical().is_unspecified() {
            Err(ExportClientError::UnspecifiedAddress(self.to_string()))
        } else {
            Ok(())
        }
    }
}

/// `address` with every bit past the first `prefix` cleared, or `None` when the prefix is
/// longer than the address or the families differ from what the caller compares with.
fn mask(address: IpAddr, prefix: u8) -> Option<IpAddr> {
    match address {
        IpAddr::V4(v4) => {
            let bits = u32::from(v4);
            let kept = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            (prefix <= 32).then(|| IpAddr::V4((bits & kept).into()))
        }
        IpAddr::V6(v6) => {
            let bits = u128::from(v6);
            let kept = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            (prefix <= 128).then(|| IpAddr::V6((bits & kept).into()))
        }
    }
}

impl FromStr for ExportClient {
    type Err = ExportClientError;

    fn from_str(raw: &str) -> Result<Self, Self::Err> {
        if raw == "*" {
            return Ok(ExportClient::Everyone);
        }
        let malformed = || ExportClientError::Malformed(raw.to_owned());
        let Some((address, prefix)) = raw.split_once('/') else {
            return raw.parse().map(ExportClient::Host).map_err(|_| malformed());
        };
        let address: IpAddr = address.parse().map_err(|_| malformed())?;
        // Digits only: `u8::from_str` would also take a leading `+`.
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(malformed());
        }
        let prefix: u8 = prefix.parse().map_err(|_| malformed())?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        if prefix > max {
            return Err(ExportClientError::PrefixTooLong {
                raw: raw.to_owned(),
                prefix,
                max,
            });
        }
        let network = mask(address, prefix).ok_or_else(malformed)?;
        if network != address {
            return Err(ExportClientError::HostBitsSet {
                raw: raw.to_owned(),
                network: format!("{network}/{prefix}"),
            });
        }
        Ok(ExportClient::Network { address, prefix })
    }
}

impl fmt::Display for ExportClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ExportClient::Everyone => f.write_str("*"),
            ExportClient::Host(address) => write!(f, "{address}"),
            ExportClient::Network { address, prefix } => write!(f, "{address}/{prefix}"),
        }
    }
}

impl Serialize for ExportClient {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ExportClient {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let raw = String::deserialize(deserializer)?;
        raw.parse().map_err(serde::de::Error::custom)
    }
}

/// Whether clients may write.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExportAccess {
    #[default]
    ReadWrite,
    /// Every write is refused by the NFS server (claims whose access modes are all
    /// `ReadOnlyMany`).
    ReadOnly,
    /// A value newer than this side knows: refused by the agent, never acted on.
    #[serde(other)]
    Unknown,
}

/// Which users the NFS server maps to the anonymous ids (`anon_uid` / `anon_gid`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum Squash {
    /// Nobody: root on a client is root on the volume.
    None,
    /// Root only (`root_squash`), the NFS servers' own default.
    #[default]
    Root,
    /// Every user (`all_squash`).
    All,
    /// A value newer than this side knows: refused by the agent, never acted on.
    #[serde(other)]
    Unknown,
}

/// An RPC security flavour (`sec=`) the export accepts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SecFlavor {
    /// The client's word for its uid and gid (`AUTH_SYS`).
    Sys,
    Krb5,
    Krb5i,
    Krb5p,
    /// A flavour newer than this side knows: refused by the agent, never acted on.
    #[serde(other)]
    Unknown,
}

impl SecFlavor {
    pub fn as_str(self) -> &'static str {
        match self {
            SecFlavor::Sys => "sys",
            SecFlavor::Krb5 => "krb5",
            SecFlavor::Krb5i => "krb5i",
            SecFlavor::Krb5p => "krb5p",
            SecFlavor::Unknown => "unknown",
        }
    }
}

fn default_sec() -> Vec<SecFlavor> {
    vec![SecFlavor::Sys]
}

/// Who may mount a volume, and how: the `export` field of a create, clone or adoption,
/// and the body of `PUT /v1/exports/{path}`, which replaces a volume's export as a whole
/// (the controller sends it when the clients a class admits change, say a node joined).
///
/// An empty `clients` list is an export nobody may mount (a claim of an `exportClients:
/// pods` class before any pod of it is scheduled).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ExportRequest {
    pub clients: Vec<ExportClient>,
    #[serde(default)]
    pub access: ExportAccess,
    #[serde(default)]
    pub squash: Squash,
    /// The uid squashed users get; the NFS server's own default (65534) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_uid: Option<u32>,
    /// The gid squashed users get; the NFS server's own default (65534) when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_gid: Option<u32>,
    /// Flavours accepted, in order of preference; `[sys]` when absent.
    #[serde(default = "default_sec")]
    pub sec: Vec<SecFlavor>,
    /// Serve the volume's first export at a random name below the export root instead of
    /// at its volume path: NFSv4 clients browse the server's pseudo-filesystem, and a
    /// path of the volume's own would show its namespace and claim to every client,
    /// admitted or not. The answer's `export.path` is then the path to mount. Sent only
    /// to agents whose capabilities say `opaque_export_paths` (older agents refuse the
    /// field); once a volume is exported its path never changes (a PV's `spec.nfs.path`
    /// cannot), so a later request's value is not looked at.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub opaque_path: bool,
}

impl Default for ExportRequest {
    /// Nobody may mount, read-write, root squashed, `AUTH_SYS`.
    fn default() -> Self {
        ExportRequest {
            clients: Vec::new(),
            access: ExportAccess::default(),
            squash: Squash::default(),
            anon_uid: None,
            anon_gid: None,
            sec: default_sec(),
            opaque_path: false,
        }
    }
}

/// Why an export request was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExportRequestError {
    #[error("an export lists at most {MAX_EXPORT_CLIENTS} clients, this one {0}")]
    TooManyClients(usize),
    #[error("an export needs at least one security flavour")]
    NoSecFlavor,
    #[error("{0} is a value this agent does not know")]
    UnknownValue(&'static str),
    #[error("client {0}")]
    Client(#[from] ExportClientError),
}

impl ExportRequest {
    /// Checks what the types alone cannot: sizes, and values a newer controller sent that
    /// this side cannot honour.
    pub fn validate(&self) -> Result<(), ExportRequestError> {
        if self.clients.len() > MAX_EXPORT_CLIENTS {
            return Err(ExportRequestError::TooManyClients(self.clients.len()));
        }
        if self.sec.is_empty() {
            return Err(ExportRequestError::NoSecFlavor);
        }
        for client in &self.clients {
            client.refuse_unspecified()?;
        }
        if self.access == ExportAccess::Unknown {
            return Err(ExportRequestError::UnknownValue("access"));
        }
        if self.squash == Squash::Unknown {
            return Err(ExportRequestError::UnknownValue("squash"));
        }
        if self.sec.contains(&SecFlavor::Unknown) {
            return Err(ExportRequestError::UnknownValue("sec"));
        }
        Ok(())
    }
}

/// A volume's export as the NFS server serves it (`export` of a [`crate::Volume`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeExport {
    /// The path NFS clients mount (the PV's `spec.nfs.path`).
    pub path: String,
    pub clients: Vec<ExportClient>,
    pub access: ExportAccess,
    pub squash: Squash,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub anon_gid: Option<u32>,
    pub sec: Vec<SecFlavor>,
}

impl VolumeExport {
    /// Whether the export serves what `request` asks for (clients compared as sets).
    pub fn matches(&self, request: &ExportRequest) -> bool {
        let sorted = |clients: &[ExportClient]| {
            let mut clients = clients.to_vec();
            clients.sort_unstable();
            clients.dedup();
            clients
        };
        sorted(&self.clients) == sorted(&request.clients)
            && self.access == request.access
            && self.squash == request.squash
            && self.anon_uid == request.anon_uid
            && self.anon_gid == request.anon_gid
            && self.sec == request.sec
    }
}

/// Which export manager an agent runs (`[exports] manager`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ExportManager {
    /// The operator exports the export root by hand; volumes carry no export of their own.
    #[default]
    None,
    /// The kernel NFS server, through `exportfs` and a file under `/etc/exports.d/`.
    Knfsd,
    /// nfs-ganesha, through its D-Bus export manager.
    Ganesha,
    /// A manager newer than this side knows: shown as `unknown`; the controller does not
    /// send exports to it.
    #[serde(other)]
    Unknown,
}

impl ExportManager {
    pub fn as_str(self) -> &'static str {
        match self {
            ExportManager::None => "none",
            ExportManager::Knfsd => "knfsd",
            ExportManager::Ganesha => "ganesha",
            ExportManager::Unknown => "unknown",
        }
    }

    /// Whether volumes get exports of their own (the controller sends [`ExportRequest`]s).
    pub fn per_volume(self) -> bool {
        matches!(self, ExportManager::Knfsd | ExportManager::Ganesha)
    }
}

impl fmt::Display for ExportManager {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_within_a_bound_that_admits_all_it_admits() {
        let client = |raw: &str| raw.parse::<ExportClient>().unwrap();
        for (inner, outer) in [
            ("10.1.2.3", "10.0.0.0/8"),
            ("10.1.0.0/16", "10.0.0.0/8"),
            ("10.0.0.0/8", "10.0.0.0/8"),
            ("10.1.2.3/32", "10.1.2.3"),
            ("10.1.2.3", "10.1.2.3"),
            ("*", "*"),
            ("10.0.0.0/8", "*"),
            ("fd00::1", "fd00::/8"),
        ] {
            assert!(
                client(inner).is_within(&client(outer)),
                "{inner} in {outer}"
            );
        }
        for (inner, outer) in [
            ("10.0.0.0/8", "10.1.0.0/16"),
            ("11.0.0.1", "10.0.0.0/8"),
            ("*", "10.0.0.0/8"),
            ("10.1.2.0/24", "10.1.2.3"),
            ("10.1.2.4", "10.1.2.3"),
            ("fd00::/8", "10.0.0.0/8"),
            ("::a01:203", "10.0.0.0/8"),
        ] {
            assert!(
                !client(inner).is_within(&client(outer)),
                "{inner} not in {outer}"
            );
        }
    }

    #[test]
    fn clients_parse_and_print_back() {
        for raw in [
            "*",
            "10.1.2.3",
            "10.0.0.0/8",
            "0.0.0.0/0",
            "fd00::/8",
            "::1",
            "10.1.2.3/32",
        ] {
            let client: ExportClient = raw.parse().unwrap();
            assert_eq!(client.to_string(), raw);
        }
    }

    #[test]
    fn bad_clients_are_refused_with_the_reason() {
        for raw in [
            "",
            "host.example",
            "10.0.0.0/",
            "10.0.0.0/+8",
            "10.0.0.0/x",
            "*/8",
            "10.0.0/8",
        ] {
            assert!(
                matches!(
                    raw.parse::<ExportClient>(),
                    Err(ExportClientError::Malformed(_))
                ),
                "{raw:?}"
            );
        }
        assert_eq!(
            "10.0.0.0/33".parse::<ExportClient>(),
            Err(ExportClientError::PrefixTooLong {
                raw: "10.0.0.0/33".into(),
                prefix: 33,
                max: 32
            })
        );
        assert_eq!(
            "10.1.2.3/24".parse::<ExportClient>(),
            Err(ExportClientError::HostBitsSet {
                raw: "10.1.2.3/24".into(),
                network: "10.1.2.0/24".into()
            })
        );
    }

    #[test]
    fn spellings_a_server_reads_as_every_host_are_refused_in_requests() {
        for raw in [
            "0.0.0.0",
            "0.0.0.0/0",
            "0.0.0.0/8",
            "::",
            "::/0",
            "::ffff:0.0.0.0",
        ] {
            let client: ExportClient = raw.parse().unwrap();
            let refused = client.refuse_unspecified().unwrap_err();
            assert!(
                refused.to_string().contains("write `*`"),
                "{raw}: {refused}"
            );
            let request = ExportRequest {
                clients: vec!["10.0.0.0/8".parse().unwrap(), client],
                ..ExportRequest::default()
            };
            assert_eq!(
                request.validate(),
                Err(ExportRequestError::Client(refused)),
                "{raw}"
            );
        }
        for raw in ["*", "10.0.0.0/8", "127.0.0.2", "::1", "1.0.0.0/8"] {
            let client: ExportClient = raw.parse().unwrap();
            assert_eq!(client.refuse_unspecified(), Ok(()), "{raw}");
        }
    }

    #[test]
    fn networks_admit_their_addresses_only() {
        let network: ExportClient = "127.0.0.0/30".parse().unwrap();
        assert!(network.admits("127.0.0.3".parse().unwrap()));
        assert!(!network.admits("127.0.0.4".parse().unwrap()));
        assert!(!network.admits("::1".parse().unwrap()));
        let host: ExportClient = "127.0.0.2".parse().unwrap();
        assert!(host.admits("127.0.0.2".parse().unwrap()));
        assert!(!host.admits("127.0.0.3".parse().unwrap()));
        assert!(ExportClient::Everyone.admits("::1".parse().unwrap()));
        let everything: ExportClient = "0.0.0.0/0".parse().unwrap();
        assert!(everything.admits("192.0.2.1".parse().unwrap()));
    }

    #[test]
    fn a_request_reads_with_defaults_and_refuses_unknown_fields() {
        let request: ExportRequest =
            serde_json::from_str(r#"{"clients":["127.0.0.2","10.0.0.0/8"]}"#).unwrap();
        assert_eq!(request.access, ExportAccess::ReadWrite);
        assert_eq!(request.squash, Squash::Root);
        assert_eq!(request.sec, vec![SecFlavor::Sys]);
        assert_eq!(request.validate(), Ok(()));
        assert!(serde_json::from_str::<ExportRequest>(r#"{"clients":[],"pnfs":true}"#).is_err());
        assert!(serde_json::from_str::<ExportRequest>(r#"{"clients":["10.1.2.3/24"]}"#).is_err());
    }

    #[test]
    fn values_from_a_newer_side_are_read_as_unknown_and_refused() {
        let request: ExportRequest =
            serde_json::from_str(r#"{"clients":[],"access":"appendOnly","sec":["sys","tls"]}"#)
                .unwrap();
        assert_eq!(request.access, ExportAccess::Unknown);
        assert_eq!(request.sec, vec![SecFlavor::Sys, SecFlavor::Unknown]);
        assert_eq!(
            request.validate(),
            Err(ExportRequestError::UnknownValue("access"))
        );
        let manager: ExportManager = serde_json::from_str(r#""nfsd4""#).unwrap();
        assert_eq!(manager, ExportManager::Unknown);
        assert!(!manager.per_volume());
    }

    #[test]
    fn an_export_matches_a_request_whatever_the_order_of_its_clients() {
        let request = ExportRequest {
            clients: vec!["127.0.0.2".parse().unwrap(), "127.0.0.3".parse().unwrap()],
            ..ExportRequest::default()
        };
        let mut export = VolumeExport {
            path: "/export/ns/claim".into(),
            clients: vec!["127.0.0.3".parse().unwrap(), "127.0.0.2".parse().unwrap()],
            access: ExportAccess::ReadWrite,
            squash: Squash::Root,
            anon_uid: None,
            anon_gid: None,
            sec: vec![SecFlavor::Sys],
        };
        assert!(export.matches(&request));
        export.clients.pop();
        assert!(!export.matches(&request));
    }
}
