//! Every endpoint of the agent API, written once: its method, path template, parameter,
//! request body and answer. The agent routes from this table and labels its metrics with
//! the templates; the client sends every request through one generic call over its
//! [`ApiEndpoint`] types; test doubles of the agent route from it too. An endpoint added
//! here is one the agent must serve (its router matches on [`Endpoint`]).

use http::Method;
use serde::Serialize;

use crate::answer::{CloneOutcome, CreateOutcome, ReadAnswer, RestoreOutcome};
use crate::archive::ArchivePath;
use crate::export::ExportRequest;
use crate::path::VolumePath;
use crate::snapshot::{CreateSnapshotRequest, RestoreVolumeRequest, Snapshot, SnapshotList};
use crate::snapshot_name::SnapshotName;
use crate::transfer::{
    CreateTransferRequest, ReceiveReplicaRequest, ReplicaOutcome, TransferGrant,
};
use crate::types::{
    AdoptVolumeRequest, AgentInfo, Archive, ArchiveList, ArchiveRequest, ArchiveResult,
    CloneVolumeRequest, CreateVolumeRequest, Health, ResizeVolumeRequest, Volume, VolumeList,
};

/// Prepends the API version prefix to a literal path, so the prefix is spelled once.
macro_rules! v1 {
    ($rest:literal) => {
        concat!("/v1", $rest)
    };
}

/// The API version prefix every endpoint but the probes and `/metrics` lives under.
pub const API_PREFIX: &str = v1!("");

/// The parameter of a template, in the router's syntax: the rest of the path, slashes
/// included (a volume path, an archive id or a snapshot name).
pub const PATH_PARAM: &str = "{*path}";

/// Declares [`Endpoint`], its [`Endpoint::ALL`], its method and template, and for each
/// endpoint a marker type of the same name implementing [`ApiEndpoint`], from one list:
/// no endpoint can be left out of the table, and its types are written beside its path.
macro_rules! endpoints {
    ($(
        $(#[$doc:meta])*
        $name:ident = $method:ident $template:expr; $param:ty, $request:ty => $answer:ty;
    )*) => {
        /// One endpoint of the agent API.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Endpoint {
            $($(#[$doc])* $name),*
        }

        impl Endpoint {
            /// The whole table, in declaration order.
            pub const ALL: [Endpoint; [$(stringify!($name)),*].len()] =
                [$(Endpoint::$name),*];

            /// The HTTP method. A `GET` endpoint answers `HEAD` too (without a body).
            pub fn method(self) -> Method {
                match self {
                    $(Endpoint::$name => Method::$method),*
                }
            }

            /// The path template, `{*path}` standing for a volume path, an archive id or
            /// a snapshot name. Also the `route` label of the agent's request metrics.
            pub fn template(self) -> &'static str {
                match self {
                    $(Endpoint::$name => $template),*
                }
            }
        }

        $(
            #[doc = concat!("The types of [`Endpoint::", stringify!($name), "`].")]
            #[derive(Debug, Clone, Copy)]
            pub struct $name;

            impl ApiEndpoint for $name {
                const ENDPOINT: Endpoint = Endpoint::$name;
                type Param = $param;
                type Request = $request;
                type Answer = $answer;
            }
        )*

        /// Each endpoint with whether its parameter type fills a path exactly when its
        /// template has a `{*path}` (for the table's own test).
        #[cfg(test)]
        fn params_match_templates() -> Vec<(Endpoint, bool)> {
            vec![$((
                Endpoint::$name,
                <$param as PathArg>::IN_PATH == Endpoint::$name.takes_path(),
            )),*]
        }
    };
}

endpoints! {
    /// Liveness probe, open to anyone.
    Healthz = GET "/healthz"; (), NoBody => Health;
    /// Readiness probe, open to anyone.
    Readyz = GET "/readyz"; (), NoBody => Health;
    /// Prometheus text, not JSON.
    Metrics = GET "/metrics"; (), NoBody => String;
    Info = GET v1!("/info"); (), NoBody => AgentInfo;
    /// Every volume, or one page of them with a [`ListQuery`](crate::ListQuery).
    ListVolumes = GET v1!("/volumes"); (), NoBody => VolumeList;
    CreateVolume = PUT v1!("/volumes/{*path}"); VolumePath, CreateVolumeRequest => CreateOutcome;
    /// A volume; `not_found` reads as `None`.
    GetVolume = GET v1!("/volumes/{*path}"); VolumePath, NoBody => Option<Volume>;
    ResizeVolume = PATCH v1!("/volumes/{*path}"); VolumePath, ResizeVolumeRequest => Volume;
    DeleteVolume = DELETE v1!("/volumes/{*path}"); VolumePath, NoBody => ();
    AdoptVolume = POST v1!("/adoptions/{*path}"); VolumePath, AdoptVolumeRequest => CreateOutcome;
    CloneVolume = POST v1!("/clones/{*path}"); VolumePath, CloneVolumeRequest => CloneOutcome;
    SetVolumeExport = PUT v1!("/exports/{*path}"); VolumePath, ExportRequest => Volume;
    /// Every archive, or one page of them.
    ListArchives = GET v1!("/archives"); (), NoBody => ArchiveList;
    /// The body is optional: none leaves the retention to the agent's default.
    ArchiveVolume = POST v1!("/archives/{*path}"); VolumePath, ArchiveRequest => ArchiveResult;
    GetArchive = GET v1!("/archives/{*path}"); ArchivePath, NoBody => Archive;
    DeleteArchive = DELETE v1!("/archives/{*path}"); ArchivePath, NoBody => ();
    /// Every snapshot, or one page of them.
    ListSnapshots = GET v1!("/snapshots"); (), NoBody => SnapshotList;
    CreateSnapshot = PUT v1!("/snapshots/{*path}"); SnapshotName, CreateSnapshotRequest => Snapshot;
    GetSnapshot = GET v1!("/snapshots/{*path}"); SnapshotName, NoBody => Snapshot;
    DeleteSnapshot = DELETE v1!("/snapshots/{*path}"); SnapshotName, NoBody => ();
    RestoreVolume = POST v1!("/restores/{*path}"); VolumePath, RestoreVolumeRequest => RestoreOutcome;
    /// A grant to read one snapshot through the transfer endpoints, for another agent.
    CreateTransfer = POST v1!("/transfers/{*path}"); SnapshotName, CreateTransferRequest => TransferGrant;
    /// The granted snapshot's manifest, one JSON entry per line; a grant's token only.
    TransferManifest = GET v1!("/transfer/manifest"); (), NoBody => String;
    /// One regular file of the granted snapshot, its data extents framed (holes kept), by
    /// a [`TransferContentQuery`](crate::TransferContentQuery); a grant's token only.
    TransferContent = GET v1!("/transfer/content"); (), NoBody => Vec<u8>;
    /// Receives a granted snapshot of another agent as this agent's snapshot.
    ReceiveReplica = PUT v1!("/replicas/{*path}"); SnapshotName, ReceiveReplicaRequest => ReplicaOutcome;
}

/// One endpoint with the types of its exchange: what fills its path, the JSON body it is
/// sent, and what its success answer reads as. Implemented by the marker type of each
/// endpoint of the table, so that one generic call serves every endpoint.
pub trait ApiEndpoint {
    const ENDPOINT: Endpoint;
    /// What fills the template's `{*path}`; `()` when it has none.
    type Param: PathArg;
    /// The request body; [`NoBody`] when the endpoint takes none.
    type Request: Serialize;
    /// The success answer, as [`ReadAnswer`] reads it.
    type Answer: ReadAnswer;
}

/// The request type of an endpoint that takes no body: it has no value, so no body can
/// be given where none belongs.
#[derive(Debug, Clone, Copy, Serialize)]
pub enum NoBody {}

impl Endpoint {
    /// Whether the caller must present a client certificate or a token; the probes are
    /// open so that a kubelet or load balancer can ask them.
    pub fn authenticated(self) -> bool {
        !matches!(self, Endpoint::Healthz | Endpoint::Readyz)
    }

    /// Whether the template ends in [`PATH_PARAM`].
    pub fn takes_path(self) -> bool {
        self.template().ends_with(PATH_PARAM)
    }

    /// The path to request for an endpoint that takes no parameter.
    pub fn path(self) -> &'static str {
        debug_assert!(!self.takes_path(), "{self:?} takes a path");
        self.template()
    }

    /// The path to request for an endpoint that takes a volume path or archive id: the
    /// template with its parameter filled in. Nothing is escaped: validated volume paths
    /// and archive ids hold only characters a URL path segment allows as they are (`@`
    /// included).
    pub fn path_for(self, param: &impl PathParam) -> String {
        debug_assert!(self.takes_path(), "{self:?} takes no path");
        let prefix = self
            .template()
            .strip_suffix(PATH_PARAM)
            .unwrap_or(self.template());
        format!("{prefix}{param}")
    }

    /// The distinct path templates, in table order: what a router serves.
    pub fn templates() -> impl Iterator<Item = &'static str> {
        Self::ALL
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                !Self::ALL[..*i]
                    .iter()
                    .any(|earlier| earlier.template() == e.template())
            })
            .map(|(_, e)| e.template())
    }
}

/// What may fill a template's `{*path}`: the validated types only, never a raw string.
pub trait PathParam: std::fmt::Display + sealed::Sealed {}

impl PathParam for VolumePath {}
impl PathParam for ArchivePath {}
impl PathParam for SnapshotName {}

/// What an endpoint names as its parameter: a [`PathParam`] filling the template's
/// `{*path}`, or `()` for a template without one.
pub trait PathArg: sealed::Sealed {
    /// Whether a value of this type fills a `{*path}`.
    const IN_PATH: bool;

    /// The path to request for `endpoint` with this parameter.
    fn path_of(&self, endpoint: Endpoint) -> String;
}

impl PathArg for () {
    const IN_PATH: bool = false;

    fn path_of(&self, endpoint: Endpoint) -> String {
        endpoint.path().to_owned()
    }
}

macro_rules! path_args {
    ($($param:ty),*) => {$(
        impl PathArg for $param {
            const IN_PATH: bool = true;

            fn path_of(&self, endpoint: Endpoint) -> String {
                endpoint.path_for(self)
            }
        }
    )*};
}

path_args!(VolumePath, ArchivePath, SnapshotName);

mod sealed {
    pub trait Sealed {}
    impl Sealed for () {}
    impl Sealed for crate::path::VolumePath {}
    impl Sealed for crate::archive::ArchivePath {}
    impl Sealed for crate::snapshot_name::SnapshotName {}
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;

    #[test]
    fn each_method_and_template_is_one_endpoint() {
        let mut seen = HashSet::new();
        for endpoint in Endpoint::ALL {
            assert!(
                seen.insert((endpoint.method(), endpoint.template())),
                "{endpoint:?} repeats another endpoint's method and template"
            );
        }
    }

    #[test]
    fn versioned_endpoints_live_under_the_prefix_and_take_a_path_only_at_the_end() {
        assert_eq!(API_PREFIX, "/v1");
        for endpoint in Endpoint::ALL {
            let template = endpoint.template();
            let unversioned = matches!(
                endpoint,
                Endpoint::Healthz | Endpoint::Readyz | Endpoint::Metrics
            );
            assert_eq!(
                template.starts_with(&format!("{API_PREFIX}/")),
                !unversioned,
                "{template}"
            );
            // A parameter is only ever the whole tail.
            assert_eq!(template.contains('{'), endpoint.takes_path(), "{template}");
        }
    }

    #[test]
    fn concrete_paths_fill_the_template_unescaped() {
        let volume = VolumePath::parse("team/data-2").unwrap();
        for (endpoint, expected) in [
            (Endpoint::CreateVolume, "/v1/volumes/team/data-2"),
            (Endpoint::GetVolume, "/v1/volumes/team/data-2"),
            (Endpoint::AdoptVolume, "/v1/adoptions/team/data-2"),
            (Endpoint::CloneVolume, "/v1/clones/team/data-2"),
            (Endpoint::ArchiveVolume, "/v1/archives/team/data-2"),
            (Endpoint::RestoreVolume, "/v1/restores/team/data-2"),
        ] {
            assert_eq!(endpoint.path_for(&volume), expected);
        }
        let id = ArchivePath::parse("team/data/@20260101T000000.000000000Z").unwrap();
        for endpoint in [Endpoint::GetArchive, Endpoint::DeleteArchive] {
            assert_eq!(
                endpoint.path_for(&id),
                "/v1/archives/team/data/@20260101T000000.000000000Z"
            );
        }
        let snapshot = SnapshotName::parse("snap-1").unwrap();
        for endpoint in [
            Endpoint::CreateSnapshot,
            Endpoint::GetSnapshot,
            Endpoint::DeleteSnapshot,
        ] {
            assert_eq!(endpoint.path_for(&snapshot), "/v1/snapshots/snap-1");
        }
        assert_eq!(Endpoint::Info.path(), "/v1/info");
        assert_eq!(Endpoint::Healthz.path(), "/healthz");
    }

    #[test]
    fn a_path_parameter_exactly_where_the_template_has_one() {
        for (endpoint, agrees) in params_match_templates() {
            assert!(
                agrees,
                "{endpoint:?}: its parameter type and template disagree"
            );
        }
        let volume = VolumePath::parse("team/data").unwrap();
        assert_eq!(
            volume.path_of(CreateVolume::ENDPOINT),
            "/v1/volumes/team/data"
        );
        assert_eq!(().path_of(Info::ENDPOINT), "/v1/info");
    }

    #[test]
    fn templates_are_listed_once_each() {
        let templates: Vec<_> = Endpoint::templates().collect();
        assert_eq!(
            templates,
            [
                "/healthz",
                "/readyz",
                "/metrics",
                "/v1/info",
                "/v1/volumes",
                "/v1/volumes/{*path}",
                "/v1/adoptions/{*path}",
                "/v1/clones/{*path}",
                "/v1/exports/{*path}",
                "/v1/archives",
                "/v1/archives/{*path}",
                "/v1/snapshots",
                "/v1/snapshots/{*path}",
                "/v1/restores/{*path}",
                "/v1/transfers/{*path}",
                "/v1/transfer/manifest",
                "/v1/transfer/content",
                "/v1/replicas/{*path}",
            ]
        );
    }
}
