//! The fixed set of resource kinds the simulator serves, with the facts about each that
//! routing, discovery and validation need.

/// One served resource kind. The set is closed on purpose: an unknown resource answers
/// 404 like a real server without that API, so a controller asking for something we do not
/// simulate fails loudly instead of getting a made-up answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Namespace,
    PersistentVolumeClaim,
    PersistentVolume,
    CoreEvent,
    StorageClass,
    Lease,
    EventsV1Event,
    Node,
    Pod,
    /// nfsprov's custom resources, as their CRD manifests describe them.
    Snapshot,
    SnapshotSchedule,
}

pub struct KindInfo {
    /// API group; empty for the core group.
    pub group: &'static str,
    pub version: &'static str,
    pub plural: &'static str,
    pub singular: &'static str,
    pub kind: &'static str,
    pub namespaced: bool,
    pub has_status: bool,
    pub short_names: &'static [&'static str],
}

impl Kind {
    pub const ALL: [Kind; 11] = [
        Kind::Namespace,
        Kind::PersistentVolumeClaim,
        Kind::PersistentVolume,
        Kind::CoreEvent,
        Kind::StorageClass,
        Kind::Lease,
        Kind::EventsV1Event,
        Kind::Node,
        Kind::Pod,
        Kind::Snapshot,
        Kind::SnapshotSchedule,
    ];

    pub fn info(self) -> &'static KindInfo {
        match self {
            Kind::Namespace => &KindInfo {
                group: "",
                version: "v1",
                plural: "namespaces",
                singular: "namespace",
                kind: "Namespace",
                namespaced: false,
                has_status: true,
                short_names: &["ns"],
            },
            Kind::PersistentVolumeClaim => &KindInfo {
                group: "",
                version: "v1",
                plural: "persistentvolumeclaims",
                singular: "persistentvolumeclaim",
                kind: "PersistentVolumeClaim",
                namespaced: true,
                has_status: true,
                short_names: &["pvc"],
            },
            Kind::PersistentVolume => &KindInfo {
                group: "",
                version: "v1",
                plural: "persistentvolumes",
                singular: "persistentvolume",
                kind: "PersistentVolume",
                namespaced: false,
                has_status: true,
                short_names: &["pv"],
            },
            Kind::CoreEvent => &KindInfo {
                group: "",
                version: "v1",
                plural: "events",
                singular: "event",
                kind: "Event",
                namespaced: true,
                has_status: false,
                short_names: &["ev"],
            },
            Kind::StorageClass => &KindInfo {
                group: "storage.k8s.io",
                version: "v1",
                plural: "storageclasses",
                singular: "storageclass",
                kind: "StorageClass",
                namespaced: false,
                has_status: false,
                short_names: &["sc"],
            },
            Kind::Lease => &KindInfo {
                group: "coordination.k8s.io",
                version: "v1",
                plural: "leases",
                singular: "lease",
                kind: "Lease",
                namespaced: true,
                has_status: false,
                short_names: &[],
            },
            Kind::EventsV1Event => &KindInfo {
                group: "events.k8s.io",
                version: "v1",
                plural: "events",
                singular: "event",
                kind: "Event",
                namespaced: true,
                has_status: false,
                short_names: &["ev"],
            },
            // Nodes and Pods are stored as written: no scheduler or kubelet runs here, so a
            // test binds a pod by writing its `spec.nodeName` itself.
            Kind::Node => &KindInfo {
                group: "",
                version: "v1",
                plural: "nodes",
                singular: "node",
                kind: "Node",
                namespaced: false,
                has_status: true,
                short_names: &["no"],
            },
            Kind::Pod => &KindInfo {
                group: "",
                version: "v1",
                plural: "pods",
                singular: "pod",
                kind: "Pod",
                namespaced: true,
                has_status: true,
                short_names: &["po"],
            },
            Kind::Snapshot => &KindInfo {
                group: "nfsprov.dev",
                version: "v1alpha1",
                plural: "snapshots",
                singular: "snapshot",
                kind: "Snapshot",
                namespaced: true,
                has_status: true,
                short_names: &["nfssnap"],
            },
            Kind::SnapshotSchedule => &KindInfo {
                group: "nfsprov.dev",
                version: "v1alpha1",
                plural: "snapshotschedules",
                singular: "snapshotschedule",
                kind: "SnapshotSchedule",
                namespaced: true,
                has_status: true,
                short_names: &["nfssnapsched"],
            },
        }
    }

    pub fn api_version(self) -> String {
        let i = self.info();
        if i.group.is_empty() {
            i.version.to_string()
        } else {
            format!("{}/{}", i.group, i.version)
        }
    }

    /// The `group/resource` spelling real error messages use, e.g.
    /// `storageclasses.storage.k8s.io`.
    /// `Kind.group` (`Kind` alone in the core group), as the real server names a kind in
    /// an `Invalid` message.
    pub fn qualified_kind(self) -> String {
        let i = self.info();
        if i.group.is_empty() {
            i.kind.to_string()
        } else {
            format!("{}.{}", i.kind, i.group)
        }
    }

    pub fn qualified_resource(self) -> String {
        let i = self.info();
        if i.group.is_empty() {
            i.plural.to_string()
        } else {
            format!("{}.{}", i.plural, i.group)
        }
    }

    pub fn lookup(group: &str, version: &str, plural: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| {
            let i = k.info();
            i.group == group && i.version == version && i.plural == plural
        })
    }
}
