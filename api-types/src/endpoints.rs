//! Every endpoint of the agent API, its method and path template, written once. The
//! agent routes from this table and labels its metrics with the templates; the client
//! builds its URLs from it; test doubles of the agent route from it too. An endpoint
//! added here is one the agent must serve (its router matches on [`Endpoint`]).

use http::Method;

use crate::archive::ArchivePath;
use crate::path::VolumePath;
use crate::snapshot_name::SnapshotName;

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

/// Declares [`Endpoint`] and its [`Endpoint::ALL`] from one list, so no endpoint can be
/// left out of the table.
macro_rules! endpoints {
    ($($name:ident),* $(,)?) => {
        /// One endpoint of the agent API.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Endpoint {
            $($name),*
        }

        impl Endpoint {
            /// The whole table, in declaration order.
            pub const ALL: [Endpoint; [$(stringify!($name)),*].len()] =
                [$(Endpoint::$name),*];
        }
    };
}

endpoints![
    Healthz,
    Readyz,
    Metrics,
    Info,
    ListVolumes,
    CreateVolume,
    GetVolume,
    ResizeVolume,
    DeleteVolume,
    AdoptVolume,
    CloneVolume,
    SetVolumeExport,
    ListArchives,
    ArchiveVolume,
    GetArchive,
    DeleteArchive,
    ListSnapshots,
    CreateSnapshot,
    GetSnapshot,
    DeleteSnapshot,
    RestoreVolume,
];

impl Endpoint {
    /// The HTTP method. A `GET` endpoint answers `HEAD` too (without a body).
    pub fn method(self) -> Method {
        match self {
            Endpoint::Healthz
            | Endpoint::Readyz
            | Endpoint::Metrics
            | Endpoint::Info
            | Endpoint::ListVolumes
            | Endpoint::GetVolume
            | Endpoint::ListArchives
            | Endpoint::GetArchive
            | Endpoint::ListSnapshots
            | Endpoint::GetSnapshot => Method::GET,
            Endpoint::CreateVolume | Endpoint::SetVolumeExport | Endpoint::CreateSnapshot => {
                Method::PUT
            }
            Endpoint::ResizeVolume => Method::PATCH,
            Endpoint::DeleteVolume | Endpoint::DeleteArchive | Endpoint::DeleteSnapshot => {
                Method::DELETE
            }
            Endpoint::AdoptVolume
            | Endpoint::CloneVolume
            | Endpoint::ArchiveVolume
            | Endpoint::RestoreVolume => Method::POST,
        }
    }

    /// The path template, `{*path}` standing for a volume path or an archive id. Also the
    /// `route` label of the agent's request metrics.
    pub fn template(self) -> &'static str {
        match self {
            Endpoint::Healthz => "/healthz",
            Endpoint::Readyz => "/readyz",
            Endpoint::Metrics => "/metrics",
            Endpoint::Info => v1!("/info"),
            Endpoint::ListVolumes => v1!("/volumes"),
            Endpoint::CreateVolume
            | Endpoint::GetVolume
            | Endpoint::ResizeVolume
            | Endpoint::DeleteVolume => v1!("/volumes/{*path}"),
            Endpoint::AdoptVolume => v1!("/adoptions/{*path}"),
            Endpoint::CloneVolume => v1!("/clones/{*path}"),
            Endpoint::SetVolumeExport => v1!("/exports/{*path}"),
            Endpoint::ListArchives => v1!("/archives"),
            Endpoint::ArchiveVolume | Endpoint::GetArchive | Endpoint::DeleteArchive => {
                v1!("/archives/{*path}")
            }
            Endpoint::ListSnapshots => v1!("/snapshots"),
            Endpoint::CreateSnapshot | Endpoint::GetSnapshot | Endpoint::DeleteSnapshot => {
                v1!("/snapshots/{*path}")
            }
            Endpoint::RestoreVolume => v1!("/restores/{*path}"),
        }
    }

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

mod sealed {
    pub trait Sealed {}
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
            ]
        );
    }
}
