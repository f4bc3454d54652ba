//! The names nfsprov reads and writes on Kubernetes objects: its provisioner name, the
//! annotations and finalizer on claims and volumes, and the names Kubernetes itself gives
//! to storage, reclaim policies and dynamically provisioned volumes.

/// The provisioner name StorageClasses use when nothing else is configured.
pub const DEFAULT_PROVISIONER: &str = "nfsprov.dev/nfs";

/// Set on every PV to name the provisioner that made it (as the library does).
pub const ANN_PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";
/// Set on claims by the PV controller: which provisioner should act on the claim.
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
/// Set by the scheduler under WaitForFirstConsumer.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";
/// The pre-`storageClassName` way to name a claim's class; still honoured first.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";
/// Keeps a PV with reclaimPolicy Delete until its data was dealt with.
pub const FINALIZER: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// Agent holding the volume (its name from the controller's agent list).
pub const ANN_AGENT: &str = "nfsprov.dev/agent";
/// Volume path relative to that agent's export root.
pub const ANN_PATH: &str = "nfsprov.dev/path";
/// What to do with the data on delete, fixed at provisioning time so that deleting never
/// depends on the class still existing or being unchanged.
pub const ANN_ON_DELETE: &str = "nfsprov.dev/on-delete";
/// The class's quota policy when the volume was made. Expansion reads it to explain why a
/// new capacity is not enforced, and it tells an operator looking at the PV what the
/// capacity means without tracing the (possibly edited) class.
pub const ANN_QUOTA: &str = "nfsprov.dev/quota";
/// Days the agent keeps the archive made when the PV is released (the class's
/// `archiveRetentionDays` when the volume was made); absent: the agent's own retention.
pub const ANN_ARCHIVE_RETENTION_DAYS: &str = "nfsprov.dev/archive-retention-days";

/// The claim (`namespace/name`) the volume was cloned from.
pub const ANN_CLONED_FROM: &str = "nfsprov.dev/cloned-from";
/// How the agent cloned it: `btrfs-snapshot`, `zfs-clone`, `reflink` or `copy`.
pub const ANN_CLONE_METHOD: &str = "nfsprov.dev/clone-method";

/// On a claim: the archive (its id on the agent named by [`ANN_RESTORE_ARCHIVE_AGENT`])
/// the claim's volume is made from. Honoured only for an archive of a volume of the
/// claim's own namespace, on an agent the claim's class allows; `kubectl nfsprov restore`
/// sets both.
pub const ANN_RESTORE_ARCHIVE: &str = "nfsprov.dev/restore-archive";
/// On a claim: the agent holding the archive of [`ANN_RESTORE_ARCHIVE`].
pub const ANN_RESTORE_ARCHIVE_AGENT: &str = "nfsprov.dev/restore-archive-agent";
/// On a PV: the archive (`agent:id`) its volume was restored from.
pub const ANN_RESTORED_FROM_ARCHIVE: &str = "nfsprov.dev/restored-from-archive";

/// The `action` of a claim's `ProvisioningFailed` event when the controller refuses the
/// claim for good: only a change can cure it (of the claim, its class, or an agent's
/// upgrade), so it is not retried with backoff. Its other failures (an agent down, a
/// source not ready yet) have the action `Provision` and are retried.
pub const ACTION_REFUSE: &str = "Refuse";

/// The resource name claims and volumes size themselves by.
pub const STORAGE: &str = "storage";

pub const RECLAIM_DELETE: &str = "Delete";
pub const RECLAIM_RETAIN: &str = "Retain";

/// The deterministic PV name of a claim: a retry after a crash finds the same volume.
pub fn pv_name_for(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}
