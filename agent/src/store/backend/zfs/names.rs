//! The names and properties by which datasets are recognised as the agent's, and the
//! limits ZFS puts on them; shared by the command lines, the parsing and the backend.

/// Marks the dataset as one the agent created; its value is the volume path.
pub(crate) const PATH_PROPERTY: &str = "nfsprov:path";
/// The volume's metadata JSON; its presence marks a finished volume.
pub(crate) const META_PROPERTY: &str = "nfsprov:volume";
/// Start of an archived dataset's name below the configured dataset.
pub(crate) const ARCHIVE_NAME_PREFIX: &str = ":archive:";
/// Start of the snapshots the agent takes of a volume to clone it. A dataset whose origin
/// is such a snapshot was cloned by the agent, and the snapshot goes when it does.
pub(crate) const CLONE_SNAPSHOT_PREFIX: &str = "nfsprov-clone-";
/// Start of the snapshots the agent keeps as snapshots the API names
/// (`nfsprov-snapshot-<snapshot name>`); names are unique per agent, so one is found
/// by its name wherever promotions and archives moved it.
pub(crate) const SNAPSHOT_PREFIX: &str = "nfsprov-snapshot-";
/// Start of a deleted or expired volume's dataset name below the configured dataset while
/// snapshots of it remain (`:held:<guid>`): unmounted, never listed, destroyed with its
/// last snapshot.
pub(super) const HELD_NAME_PREFIX: &str = ":held:";
/// ZFS's limit on a whole dataset name (a snapshot's `<dataset>@<snapshot>` included).
pub(super) const MAX_DATASET_NAME_LEN: usize = 255;
/// Longest user property value zfs accepts (zfs-fuse aborts on 8192 bytes).
pub(super) const MAX_PROPERTY_VALUE_BYTES: usize = 8191;
/// Digits of the largest guid, for the archived name's length.
pub(super) const MAX_GUID_DIGITS: usize = 20;
