//! Provisioning: which claims are ours, and turning one into an agent directory plus a PV.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::api::{Api, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use nfsprov_api_types::client::{ClientError, CloneOutcome, CreateOutcome, RestoreOutcome};
use nfsprov_api_types::{
    Capabilities, CloneMethod, CloneProgress, CloneVolumeRequest, CreateVolumeRequest, ErrorCode,
    ExportRequest, NfsExport, QuotaBackend, QuotaPolicy, RestoreProgress, RestoreSource,
    RestoreVolumeRequest, VolumeOwner, VolumePath,
};
use nfsprov_vocabulary::archive_restore::{self, ArchiveSource};
use nfsprov_vocabulary::names::{ACTION_REFUSE, ANN_RESTORED_FROM_ARCHIVE};
use nfsprov_vocabulary::params::ClassParams;
use nfsprov_vocabulary::pattern::RenderInput;
use nfsprov_vocabulary::quantity;
use nfsprov_vocabulary::snapshots::ANN_RESTORED_FROM;
use tracing::{debug, error, info};

use crate::agents::{Agent, BUSY_RETRY, InfoError, request_id};
use crate::context::{Context, Error};
use crate::datasource::{
    ReadySnapshot, Requested, SourceProblem, SourceVolume, requested_source, resolve,
    resolve_archive, resolve_snapshot,
};
use crate::objects::{
    ANN_CLONE_METHOD, ANN_SELECTED_NODE, claim_class, claim_is_bound, claim_key, claim_provisioner,
    claim_state_key, pv_name_for,
};
use crate::pv::{NewVolume, build_pv};

pub(crate) const REASON_PROVISIONING: &str = "Provisioning";
pub(crate) const REASON_SUCCEEDED: &str = "ProvisioningSucceeded";
pub(crate) const REASON_FAILED: &str = "ProvisioningFailed";
const ACTION: &str = "Provision";
/// How often a claim asks the agent again about a clone it is still copying.
const CLONE_POLL: std::time::Duration = std::time::Duration::from_secs(3);

/// Why a claim is left alone (logged at debug level only: most claims are not ours).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Skip {
    Deleting,
    Bound,
    NotOurs,
    NoClass,
    ClassNotFound(String),
    ClassNotOurs,
    WaitingForNode,
    AlreadyProvisioned,
}

/// Decides whether to provision `pvc` now: the library's `shouldProvision`.
pub(crate) fn should_provision(
    pvc: &PersistentVolumeClaim,
    ctx: &Context,
) -> Result<(Arc<StorageClass>, String), Skip> {
    if pvc.metadata.deletion_timestamp.is_some() {
        return Err(Skip::Deleting);
    }
    if claim_is_bound(pvc) {
        return Err(Skip::Bound);
    }
    if !claim_provisioner(pvc).is_some_and(|name| ctx.provisioner.contains(name)) {
        return Err(Skip::NotOurs);
    }
    let class_name = claim_class(pvc).ok_or(Skip::NoClass)?;
    let class = ctx
        .class(class_name)
        .ok_or_else(|| Skip::ClassNotFound(class_name.to_owned()))?;
    if !ctx.provisioner.contains(&class.provisioner) {
        return Err(Skip::ClassNotOurs);
    }
    let wait_for_consumer = class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer");
    // An empty value is no choice, as for the library: provisioning on it would ignore the
    // scheduler's pick once it comes.
    let has_node = pvc
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_SELECTED_NODE))
        .is_some_and(|node| !node.is_empty());
    if wait_for_consumer && !has_node {
        return Err(Skip::WaitingForNode);
    }
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    if ctx
        .volumes
        .get(&ObjectRef::new(&pv_name_for(uid)))
        .is_some()
    {
        return Err(Skip::AlreadyProvisioned);
    }
    Ok((class, class_name.to_owned()))
}

/// The kind of the claim's data source, as the library labels its metrics: empty for
/// none. `dataSourceRef` is read too, since a Snapshot of this project's API group is
/// named only there, and a claim made from an archive is labelled `Archive`.
fn source_kind(pvc: &PersistentVolumeClaim) -> &str {
    let spec = pvc.spec.as_ref();
    if let Some(kind) = spec
        .and_then(|s| s.data_source.as_ref())
        .map(|source| source.kind.as_str())
        .or_else(|| {
            spec.and_then(|s| s.data_source_ref.as_ref())
                .map(|r| r.kind.as_str())
        })
    {
        return kind;
    }
    if matches!(
        archive_restore::requested(pvc.metadata.annotations.as_ref()),
        Ok(Some(_))
    ) {
        return ARCHIVE_SOURCE_KIND;
    }
    ""
}

/// The `source` label of a claim made from an archive: not a Kubernetes kind, since an
/// archive is named by annotations.
const ARCHIVE_SOURCE_KIND: &str = "Archive";

/// Reconciles one unbound claim: provisions it when it is ours.
pub(crate) async fn reconcile_unbound_claim(
    pvc: &PersistentVolumeClaim,
    ctx: &Context,
) -> Result<Action, Error> {
    let (class, class_name) = match should_provision(pvc, ctx) {
        Ok(found) => found,
        Err(skip) => {
            debug!(claim = %claim_key(pvc), ?skip, "not provisioning");
            return Ok(Action::await_change());
        }
    };
    let started = Instant::now();
    let reference = pvc.object_ref(&());
    let state_key = claim_state_key(pvc);
    match provision(pvc, &class, &class_name, ctx).await {
        Ok(Provisioned::AgentBusy(agent)) => {
            debug!(claim = %claim_key(pvc), %agent, "every reconcile slot of the agent is taken; waiting");
            Ok(Action::requeue(BUSY_RETRY))
        }
        Ok(Provisioned::AgentQueueFull { agent, retry_after }) => {
            debug!(
                claim = %claim_key(pvc), %agent, ?retry_after,
                "the agent's job queue is full; asking again when it says"
            );
            Ok(Action::requeue(retry_after))
        }
        Ok(Provisioned::Cloning(progress)) => {
            debug!(
                claim = %claim_key(pvc), source = %progress.source,
                running_seconds = progress.running_seconds, "the agent is still cloning"
            );
            Ok(Action::requeue(CLONE_POLL))
        }
        Ok(Provisioned::Restoring(progress)) => {
            debug!(
                claim = %claim_key(pvc), source = %progress.source,
                running_seconds = progress.running_seconds, "the agent is still restoring"
            );
            Ok(Action::requeue(CLONE_POLL))
        }
        Ok(Provisioned::Volume(pv_name)) => {
            ctx.reported.forget(&state_key);
            ctx.reported.forget(&announced_key(&state_key));
            ctx.metrics
                .provision_succeeded(&class_name, source_kind(pvc), started.elapsed());
            info!(claim = %claim_key(pvc), pv = %pv_name, "provisioned");
            ctx.event(
                &reference,
                EventType::Normal,
                REASON_SUCCEEDED,
                ACTION,
                &format!("Successfully provisioned volume {pv_name}"),
            )
            .await;
            Ok(Action::await_change())
        }
        Err(failure) => {
            ctx.reported.forget(&announced_key(&state_key));
            // A permanent failure is reported once per version of the claim and its class:
            // nothing but a change of either can help, and both trigger a new reconcile, so
            // retrying with backoff would only repeat the event and the metric.
            let report = if failure.permanent {
                let fingerprint =
                    format!("{}{}", version_fingerprint(pvc, &class), failure.message);
                let first = ctx.reported.first_time(&state_key, fingerprint);
                if first {
                    info!(claim = %claim_key(pvc), reason = %failure.message, "cannot provision until the claim or its class changes");
                }
                first
            } else {
                ctx.reported.forget(&state_key);
                true
            };
            if report {
                ctx.metrics.provision_failed(&class_name, source_kind(pvc));
                // The action tells a refusal for good from a failure that is retried, so
                // whoever waits for the claim (`kubectl nfsprov restore --wait`) can stop.
                let action = if failure.permanent {
                    ACTION_REFUSE
                } else {
                    ACTION
                };
                ctx.event(
                    &reference,
                    EventType::Warning,
                    REASON_FAILED,
                    action,
                    &failure.message,
                )
                .await;
            }
            if failure.permanent {
                Ok(Action::await_change())
            } else {
                Err(failure.error.unwrap_or(Error::Reported(failure.message)))
            }
        }
    }
}

/// A failure to report on the claim; `error` keeps the cause when there is one.
#[derive(Debug)]
struct Failure {
    message: String,
    error: Option<Error>,
    /// Only a change of the claim or its class can cure it.
    permanent: bool,
}

/// What a provisioning attempt that did not fail came to.
enum Provisioned {
    /// The PV, by name: made now, or found made by an earlier attempt.
    Volume(String),
    /// Not a failure: every reconcile slot of this agent is taken, so the claim waits its
    /// turn without holding one of the controller's.
    AgentBusy(String),
    /// Not a failure either: the agent has as many clones or restores waiting as it
    /// allows, started none for this claim, and asked to be asked again after
    /// `retry_after`.
    AgentQueueFull {
        agent: String,
        retry_after: Duration,
    },
    /// The agent is still copying the source into the clone.
    Cloning(CloneProgress),
    /// The agent is still copying the snapshot into the restored volume.
    Restoring(RestoreProgress),
}

/// Where a new volume's data comes from, once checked.
#[derive(Debug)]
enum Origin {
    Clone(SourceVolume),
    Restore(ReadySnapshot),
    /// An archive of the claim's namespace, checked on its agent.
    Archive(ArchiveSource),
}

impl Origin {
    fn agent(&self) -> &str {
        match self {
            Origin::Clone(source) => &source.agent,
            Origin::Restore(snapshot) => &snapshot.agent,
            Origin::Archive(archive) => &archive.agent,
        }
    }

    /// The source in words, and what is made from it, for refusals.
    fn words(&self) -> (String, &'static str) {
        match self {
            Origin::Clone(source) => (format!("the source claim {}", source.claim), "a clone"),
            Origin::Restore(snapshot) => (
                format!("the snapshot {}", snapshot.snapshot),
                "a restored volume",
            ),
            Origin::Archive(archive) => (
                format!("the archive {}", archive.id),
                "a volume made from an archive",
            ),
        }
    }
}

impl From<SourceProblem> for Failure {
    fn from(problem: SourceProblem) -> Self {
        if problem.may_resolve {
            Failure::new(problem.message)
        } else {
            Failure::permanent(problem.message)
        }
    }
}

impl Failure {
    /// A failure a later attempt may not meet (an agent down, an API error).
    fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            error: None,
            permanent: false,
        }
    }

    /// A failure that the claim or its class must change to cure.
    fn permanent(message: impl Into<String>) -> Self {
        Self {
            permanent: true,
            ..Self::new(message)
        }
    }
}

/// The `Provisioning` event, published before anything can refuse the claim, as the
/// library publishes it before calling Provision: every claim that fails gets one first.
/// Once per attempt that ends (in a volume or a failure): not for each retry while the
/// agent's slots are taken or a clone is being copied, and not again for a version of the
/// claim and its class already refused for good (that refusal is not repeated either).
async fn announce(pvc: &PersistentVolumeClaim, class: &StorageClass, ctx: &Context) {
    let state_key = claim_state_key(pvc);
    let version = version_fingerprint(pvc, class);
    if ctx.reported.holds_version(&state_key, &version) {
        return;
    }
    let source = requested_source(pvc).ok().flatten();
    let attempt = format!(
        "{version}{}",
        source.as_ref().map(ToString::to_string).unwrap_or_default()
    );
    if !ctx.reported.first_time(&announced_key(&state_key), attempt) {
        return;
    }
    let namespace = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    let cloning = source
        .map(|s| match s {
            Requested::Claim(claim) => format!(", cloning claim {claim}"),
            Requested::Snapshot(snapshot) => format!(", restoring snapshot {snapshot}"),
            Requested::Archive(archive) => format!(", restoring archive {archive}"),
        })
        .unwrap_or_default();
    ctx.event(
        &pvc.object_ref(&()),
        EventType::Normal,
        REASON_PROVISIONING,
        ACTION,
        &format!(
            "External provisioner is provisioning volume for claim \"{namespace}/{name}\"{cloning}"
        ),
    )
    .await;
}

/// What a permanent refusal is recorded under, before its message: the versions of the
/// claim and of its class.
fn version_fingerprint(pvc: &PersistentVolumeClaim, class: &StorageClass) -> String {
    format!(
        "{}/{}/",
        pvc.metadata.resource_version.as_deref().unwrap_or_default(),
        class
            .metadata
            .resource_version
            .as_deref()
            .unwrap_or_default(),
    )
}

/// Refuses what this provisioner cannot honour, with messages a user can act on.
/// Returns the requested capacity as written and in bytes.
fn check_claim(pvc: &PersistentVolumeClaim) -> Result<(Quantity, u64), Failure> {
    let Some(spec) = pvc.spec.as_ref() else {
        return Err(Failure::permanent("claim has no spec"));
    };
    if spec.selector.is_some() {
        return Err(Failure::permanent(
            "claim Selector is not supported: remove spec.selector to get a dynamically provisioned volume",
        ));
    }
    if spec.volume_mode.as_deref() == Some("Block") {
        return Err(Failure::permanent(
            "volumeMode Block is not supported: NFS volumes are filesystems; use volumeMode Filesystem",
        ));
    }
    let request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| Failure::permanent("claim has no spec.resources.requests.storage"))?;
    let bytes = quantity::parse_bytes(&request.0)
        .map_err(|e| Failure::permanent(format!("claim storage request: {e}")))?;
    Ok((request.clone(), bytes))
}

/// Returns the name of the PV, created now or by an earlier attempt. The library's
/// Provision and provisionClaimOperation, as steps: read what is asked ([`wanted`]), find
/// the source and the agent (which may ask the API server and the agents), [`plan`] the
/// volume (pure), [`make`] it on the agent, [`save`] its PV.
async fn provision(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    class_name: &str,
    ctx: &Context,
) -> Result<Provisioned, Failure> {
    announce(pvc, class, ctx).await;
    let wanted = wanted(pvc, class, class_name)?;
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    let rid = request_id(&pv_name_for(uid));
    let source = match requested_source(pvc).map_err(Failure::from)? {
        Some(Requested::Claim(claim)) => Some(Origin::Clone(
            resolve(ctx, &claim, class_name, wanted.capacity_bytes).await?,
        )),
        Some(Requested::Snapshot(snapshot)) => Some(Origin::Restore(
            resolve_snapshot(ctx, &snapshot, wanted.capacity_bytes).await?,
        )),
        // The class must allow the archive's agent before that agent is asked anything.
        Some(Requested::Archive(archive)) => {
            let origin = Origin::Archive(archive.clone());
            let agent = source_agent(ctx, &wanted.params.agents, class_name, &origin)?;
            let namespace = pvc.namespace().unwrap_or_default();
            resolve_archive(&agent, &archive, &namespace, wanted.capacity_bytes, &rid).await?;
            Some(origin)
        }
        None => None,
    };
    let agent = match &source {
        Some(source) => source_agent(ctx, &wanted.params.agents, class_name, source)?,
        None => ctx
            .agents
            .select(&wanted.params.agents, &rid)
            .await
            .map_err(|e| {
                let message = format!("StorageClass {class_name:?}: {e}");
                if e.is_retriable() {
                    Failure::new(message)
                } else {
                    Failure::permanent(message)
                }
            })?,
    };
    let Some(_slot) = agent.try_slot() else {
        return Ok(Provisioned::AgentBusy(agent.name().to_owned()));
    };
    let mut plan = plan(pvc, class_name, &wanted, source.as_ref())?;
    let calls = AgentCalls {
        agent: &agent,
        class_name,
        quota: wanted.params.quota,
    };
    let nfs = checked_agent(&calls, &rid).await?;
    // Who may mount it: from the class, the claim's pods and the agent's export manager.
    let export = crate::exports::for_new_volume(ctx, &agent, pvc, &wanted.params, class_name, &rid)
        .await
        .map_err(|refusal| Failure {
            message: refusal.message,
            error: refusal.error,
            permanent: false,
        })?;
    plan.request.set_export(export);
    match make(&plan, &calls, nfs, &rid).await? {
        Making::Cloning(progress) => Ok(Provisioned::Cloning(progress)),
        Making::Restoring(progress) => Ok(Provisioned::Restoring(progress)),
        Making::QueueFull(retry_after) => Ok(Provisioned::AgentQueueFull {
            agent: agent.name().to_owned(),
            retry_after,
        }),
        Making::Done(made) => save(ctx, pvc, class, &wanted, &plan, &calls, &made).await,
    }
}

/// What the claim and its class ask for, read before anything is looked up.
#[derive(Debug)]
struct Wanted {
    /// The requested capacity as written, and in bytes.
    capacity: Quantity,
    capacity_bytes: u64,
    params: ClassParams,
}

fn wanted(
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    class_name: &str,
) -> Result<Wanted, Failure> {
    let (capacity, capacity_bytes) = check_claim(pvc)?;
    let params = ClassParams::parse(class.parameters.as_ref())
        .map_err(|e| Failure::permanent(format!("StorageClass {class_name:?}: {e}")))?;
    Ok(Wanted {
        capacity,
        capacity_bytes,
        params,
    })
}

/// Everything an attempt does on the agent, decided before the agent is asked anything.
#[derive(Debug, PartialEq, Eq)]
struct Plan {
    /// The claim, `namespace/name`, for the log.
    claim: String,
    pv_name: String,
    path: VolumePath,
    request: Request,
}

/// The request that makes the volume.
#[derive(Debug, PartialEq, Eq)]
enum Request {
    Create(CreateVolumeRequest),
    /// A clone of the volume of the claim `from` (`namespace/name`).
    Clone {
        request: CloneVolumeRequest,
        from: String,
    },
    /// A restore of the Snapshot `from` (`namespace/name`), or of the archive `from`
    /// (`agent:id`) when the request names an archive.
    Restore {
        request: RestoreVolumeRequest,
        from: String,
    },
}

impl Request {
    /// Who may mount the volume: decided once the agent is chosen and checked, since it
    /// depends on the agent's export manager.
    fn set_export(&mut self, export: Option<ExportRequest>) {
        match self {
            Request::Create(request) => request.export = export,
            Request::Clone { request, .. } => request.export = export,
            Request::Restore { request, .. } => request.export = export,
        }
    }

    /// Whether the volume's export was asked for at an opaque path: the PV must then
    /// mount the path the agent answers, which nothing here can work out.
    fn opaque_export(&self) -> bool {
        let export = match self {
            Request::Create(request) => &request.export,
            Request::Clone { request, .. } => &request.export,
            Request::Restore { request, .. } => &request.export,
        };
        export.as_ref().is_some_and(|export| export.opaque_path)
    }
}

/// The volume's name, its path on the agent and the request that makes it, from the
/// claim, what it and its class ask for, and the source's volume when it is a clone.
/// Pure: nothing is asked of anyone.
fn plan(
    pvc: &PersistentVolumeClaim,
    class_name: &str,
    wanted: &Wanted,
    source: Option<&Origin>,
) -> Result<Plan, Failure> {
    let params = &wanted.params;
    let namespace = pvc.namespace().unwrap_or_default();
    let name = pvc.name_any();
    let uid = pvc.metadata.uid.as_deref().unwrap_or_default();
    let pv_name = pv_name_for(uid);
    let path = params
        .path_pattern
        .render(&RenderInput {
            pvc_namespace: &namespace,
            pvc_name: &name,
            pvc_labels: pvc.metadata.labels.as_ref(),
            pvc_annotations: pvc.metadata.annotations.as_ref(),
            pv_name: &pv_name,
        })
        .map_err(|e| Failure::permanent(format!("StorageClass {class_name:?}: {e}")))?;
    let owner = VolumeOwner {
        pvc_namespace: Some(namespace),
        pvc_name: Some(name),
        pv_name: Some(pv_name.clone()),
    };
    let request = match source {
        None => Request::Create(CreateVolumeRequest {
            mode: params.mode,
            uid: params.uid,
            gid: params.gid,
            capacity_bytes: wanted.capacity_bytes,
            owner,
            quota: params.quota,
            export: None,
        }),
        // The class's mode, uid and gid are not applied: a clone keeps its source's.
        Some(Origin::Clone(source)) => Request::Clone {
            request: CloneVolumeRequest {
                source: source.path.clone(),
                capacity_bytes: wanted.capacity_bytes,
                owner,
                quota: params.quota,
                export: None,
            },
            from: source.claim.to_string(),
        },
        // As a clone, a restored volume keeps the mode and owner its files had.
        Some(Origin::Restore(snapshot)) => Request::Restore {
            request: RestoreVolumeRequest {
                quota: params.quota,
                ..RestoreVolumeRequest::from_source(
                    RestoreSource::Snapshot(snapshot.name.clone()),
                    wanted.capacity_bytes,
                    owner,
                )
            },
            from: snapshot.snapshot.to_string(),
        },
        Some(Origin::Archive(archive)) => Request::Restore {
            request: RestoreVolumeRequest {
                quota: params.quota,
                ..RestoreVolumeRequest::from_source(
                    RestoreSource::Archive(archive.id.clone()),
                    wanted.capacity_bytes,
                    owner,
                )
            },
            from: archive.to_string(),
        },
    };
    Ok(Plan {
        claim: claim_key(pvc),
        pv_name,
        path,
        request,
    })
}

/// The agent an attempt works with, and the failures its calls come to, in the words a
/// claim's events use.
struct AgentCalls<'a> {
    agent: &'a Agent,
    class_name: &'a str,
    quota: QuotaPolicy,
}

impl AgentCalls<'_> {
    fn message(&self, what: &str, source: &dyn std::fmt::Display) -> String {
        format!(
            "failed to provision volume with StorageClass {:?}: agent {} {what}: {source}",
            self.class_name,
            self.agent.name()
        )
    }

    /// A failed call, kept as the error the reconcile returns (so it is retried).
    fn failure(&self, what: &str, source: &dyn std::fmt::Display, error: Error) -> Failure {
        Failure {
            error: Some(error),
            ..Failure::new(self.message(what, source))
        }
    }

    fn agent_failure(&self, what: &str, source: ClientError) -> Failure {
        let agent = self.agent.name().to_owned();
        self.failure(what, &source.to_string(), Error::Agent { agent, source })
    }

    fn info_failure(&self, what: &str, source: InfoError) -> Failure {
        let agent = self.agent.name().to_owned();
        self.failure(
            what,
            &source.to_string(),
            Error::AgentInfo { agent, source },
        )
    }

    fn cannot_enforce(&self, backend: &str) -> Failure {
        Failure::new(format!(
            "StorageClass {:?} asks for quota enforce, but agent {} cannot enforce quotas ({backend}); no directory was created. Use quota bestEffort or off in the class, or an agent whose export root has a quota backend",
            self.class_name,
            self.agent.name()
        ))
    }

    fn refused(&self, e: ClientError, what: &str) -> Failure {
        match e.code() {
            // The cached capabilities said yes, but the agent (the authority) says no.
            Some(ErrorCode::Unsupported) if self.quota == QuotaPolicy::Enforce => {
                self.cannot_enforce(&format!("it refused: {e}"))
            }
            // Nothing was made; the same request succeeds once the agent has room.
            Some(ErrorCode::OvercommitLimit) => {
                let agent = self.agent.name().to_owned();
                let cause = format!(
                    "{e}; retried until the agent has room again (volumes deleted, its filesystem grown or its limits.max_overcommit_ratio raised)"
                );
                self.failure(what, &cause, Error::Agent { agent, source: e })
            }
            _ => self.agent_failure(what, e),
        }
    }
}

/// What the agent made: the volume, and the export its PV mounts.
struct Made {
    outcome: CreateOutcome,
    export: NfsExport,
}

enum Making {
    Done(Box<Made>),
    /// The agent is still copying the source into the clone.
    Cloning(CloneProgress),
    Restoring(RestoreProgress),
    /// The agent refused to start the job for now; ask again after this long.
    QueueFull(Duration),
}

/// Asks the agent for its export and, when the class enforces quotas, whether it can;
/// then sends the plan's request: the directory is there when this returns `Done`.
/// The agent's NFS export, once the agent has shown it can make what the class asks
/// (a quota it can enforce, when the class says `enforce`).
async fn checked_agent(calls: &AgentCalls<'_>, rid: &str) -> Result<NfsExport, Failure> {
    let agent = calls.agent;
    let export = agent
        .export(rid)
        .await
        .map_err(|e| calls.info_failure("did not report its NFS export", e))?;
    if calls.quota == QuotaPolicy::Enforce {
        let capabilities = agent
            .capabilities(rid)
            .await
            .map_err(|e| calls.info_failure("did not report its capabilities", e))?;
        if !capabilities.quota_enforced {
            return Err(calls.cannot_enforce(&describe_quota(&capabilities)));
        }
    }
    Ok(export)
}

async fn make(
    plan: &Plan,
    calls: &AgentCalls<'_>,
    export: NfsExport,
    rid: &str,
) -> Result<Making, Failure> {
    let agent = calls.agent;
    let path = &plan.path;
    let outcome = match &plan.request {
        Request::Create(request) => agent
            .client()
            .create_volume(path, request, Some(rid))
            .await
            .map_err(|e| calls.refused(e, &format!("could not create directory {path}")))?,
        Request::Clone { request, .. } => {
            let what = format!("could not clone {} into {path}", request.source);
            match agent.client().clone_volume(path, request, Some(rid)).await {
                Ok(CloneOutcome::Ready(outcome)) => outcome,
                Ok(CloneOutcome::InProgress(progress)) => return Ok(Making::Cloning(progress)),
                Err(e) if e.code() == Some(ErrorCode::JobQueueFull) => {
                    return Ok(Making::QueueFull(queue_retry(&e)));
                }
                // The request itself is wrong (the source is too large for the claim, or
                // gone): only a change of the claim helps.
                Err(e)
                    if matches!(e.code(), Some(ErrorCode::Unsupported | ErrorCode::NotFound))
                        && calls.quota != QuotaPolicy::Enforce =>
                {
                    return Err(Failure::permanent(calls.message(&what, &e)));
                }
                Err(e) => return Err(calls.refused(e, &what)),
            }
        }
        Request::Restore { request, from } => {
            let kind = if request.archive.is_some() {
                "archive"
            } else {
                "snapshot"
            };
            let what = format!("could not restore {kind} {from} into {path}");
            match agent
                .client()
                .restore_volume(path, request, Some(rid))
                .await
            {
                Ok(RestoreOutcome::Ready(outcome)) => outcome,
                Ok(RestoreOutcome::InProgress(progress)) => {
                    return Ok(Making::Restoring(progress));
                }
                Err(e) if e.code() == Some(ErrorCode::JobQueueFull) => {
                    return Ok(Making::QueueFull(queue_retry(&e)));
                }
                // The snapshot or archive is gone from the agent, or the agent cannot
                // restore: only a change of the claim (or of the Snapshot, which triggers
                // one) helps.
                Err(e)
                    if matches!(e.code(), Some(ErrorCode::Unsupported | ErrorCode::NotFound))
                        && calls.quota != QuotaPolicy::Enforce =>
                {
                    return Err(Failure::permanent(calls.message(&what, &e)));
                }
                Err(e) => return Err(calls.refused(e, &what)),
            }
        }
    };
    info!(
        claim = %plan.claim, agent = agent.name(), %path, created = outcome.created,
        request_id = %rid, "volume directory ready"
    );
    Ok(Making::Done(Box::new(Made { outcome, export })))
}

/// When to ask again an agent whose job queue was full: when it said, or as a running
/// clone is polled.
fn queue_retry(error: &ClientError) -> Duration {
    error.retry_after().unwrap_or(CLONE_POLL)
}

/// Saves the PV of the volume the agent made.
async fn save(
    ctx: &Context,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
    wanted: &Wanted,
    plan: &Plan,
    calls: &AgentCalls<'_>,
    made: &Made,
) -> Result<Provisioned, Failure> {
    let (agent, class_name) = (calls.agent, calls.class_name);
    let (pv_name, path) = (&plan.pv_name, &plan.path);
    let cloned_from = match &plan.request {
        Request::Create(_) | Request::Restore { .. } => None,
        Request::Clone { from, .. } => {
            let method = made
                .outcome
                .volume
                .clone
                .as_ref()
                .map_or(CloneMethod::Copy, |origin| origin.method);
            Some((from.as_str(), method))
        }
    };
    let export_path = if plan.request.opaque_export() {
        Some(reported_export_path(made, calls, path)?)
    } else {
        None
    };
    let volume = build_pv(&NewVolume {
        pvc,
        class,
        class_name,
        // Always our own name, whichever of ours the class uses: the PV stays ours when
        // the name of a replaced provisioner is dropped after its classes are migrated.
        provisioner: ctx.provisioner.own(),
        pv_name,
        agent: agent.name(),
        path,
        on_delete: wanted.params.on_delete,
        quota: wanted.params.quota,
        archive_retention_days: wanted.params.archive_retention_days,
        export: &made.export,
        export_path: export_path.as_deref(),
        capacity: &wanted.capacity,
        cloned_from,
    });
    let mut volume = volume;
    if let Request::Restore { from, request } = &plan.request {
        let method = made
            .outcome
            .volume
            .restore
            .as_ref()
            .map_or(CloneMethod::Copy, |origin| origin.method);
        let annotations = volume
            .metadata
            .annotations
            .get_or_insert_with(Default::default);
        let key = if request.archive.is_some() {
            ANN_RESTORED_FROM_ARCHIVE
        } else {
            ANN_RESTORED_FROM
        };
        annotations.insert(key.to_owned(), from.clone());
        annotations.insert(ANN_CLONE_METHOD.to_owned(), method.to_string());
    }
    let api = Api::<PersistentVolume>::all(ctx.client.clone());
    match api.create(&PostParams::default(), &volume).await {
        Ok(_) => Ok(Provisioned::Volume(pv_name.clone())),
        // A previous attempt (perhaps of a crashed replica) saved it; the directory was just
        // confirmed with the same settings, so this attempt succeeded as well, and is
        // reported as such (as the library does) since the earlier one may not have been.
        Err(kube::Error::Api(status)) if status.code == 409 => {
            info!(claim = %plan.claim, pv = %pv_name, "PV already exists; reusing it");
            Ok(Provisioned::Volume(pv_name.clone()))
        }
        Err(e) => {
            // The directory exists now: never leave it behind silently.
            error!(
                claim = %plan.claim, pv = %pv_name, agent = agent.name(), %path, error = %e,
                "volume directory exists but its PV could not be saved; retrying"
            );
            Err(Failure {
                message: format!(
                    "volume directory \"{path}\" on agent {} was created but PersistentVolume {pv_name} could not be saved: {e}; retrying (the directory will be reused)",
                    agent.name()
                ),
                error: Some(Error::Kube(e)),
                permanent: false,
            })
        }
    }
}

/// The path the agent reports clients mount the volume's own export by. An answer
/// without one (or not an absolute path) leaves the PV unsaved and the claim retried:
/// a PV's path can never be corrected once saved.
fn reported_export_path(
    made: &Made,
    calls: &AgentCalls<'_>,
    path: &VolumePath,
) -> Result<String, Failure> {
    match made.outcome.volume.export.as_ref().map(|e| e.path.as_str()) {
        Some(reported) if reported.starts_with('/') => Ok(reported.to_owned()),
        reported => Err(Failure::new(format!(
            "agent {} made volume \"{path}\" but reported no path to mount its export by ({reported:?}); retrying",
            calls.agent.name()
        ))),
    }
}

/// The agent holding the source's volume or snapshot, which must be one the class places
/// volumes on: a clone or restore is made next to its source, never copied between agents.
fn source_agent(
    ctx: &Context,
    class_agents: &[String],
    class_name: &str,
    source: &Origin,
) -> Result<Arc<Agent>, Failure> {
    let agent = source.agent();
    let (source_words, made) = source.words();
    let allowed = match class_agents {
        [] => ctx.agents.default_name().as_deref() == Some(agent),
        named => named.iter().any(|a| a == agent),
    };
    if !allowed {
        let placed = match class_agents {
            [] => ctx
                .agents
                .default_name()
                .map_or("no default agent".to_owned(), |a| format!("agent {a}")),
            named => format!("agents {}", named.join(", ")),
        };
        return Err(Failure::permanent(format!(
            "{source_words} is on agent {agent}, but StorageClass {class_name:?} places volumes on {placed}: {made} is made on its source's agent"
        )));
    }
    ctx.agents.get(agent).ok_or_else(|| {
        Failure::permanent(format!(
            "{source_words} is on agent {agent}, which is not in this controller's agent list"
        ))
    })
}

/// The key under which the `Provisioning` event of the attempt under way is remembered.
fn announced_key(state_key: &str) -> String {
    format!("{state_key}#provisioning")
}

/// The agent's quota situation in words, for messages.
fn describe_quota(capabilities: &Capabilities) -> String {
    match capabilities.quota {
        QuotaBackend::None => "it has no quota backend".to_owned(),
        QuotaBackend::Unknown => {
            "its quota backend, one this controller does not know, is not enforcing".to_owned()
        }
        backend => format!("its {backend} quota backend is not enforcing"),
    }
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::Mode;
    use nfsprov_vocabulary::names::{ANN_RESTORE_ARCHIVE, ANN_RESTORE_ARCHIVE_AGENT};
    use nfsprov_vocabulary::params::{PARAM_GID, PARAM_MODE, PARAM_PATH_PATTERN, PARAM_QUOTA};

    use super::*;
    use crate::datasource::SourceClaim;
    use crate::objects;
    use crate::tests::builders::{CLAIM_UID, claim, class};

    fn wanted_of(parameters: &[(&str, &str)]) -> Wanted {
        wanted(&claim("nfs"), &class("nfs", parameters), "nfs").unwrap()
    }

    #[test]
    fn metrics_label_each_kind_of_source_a_claim_names() {
        let mut pvc = claim("nfs");
        assert_eq!(source_kind(&pvc), "");
        let spec = pvc.spec.get_or_insert_with(Default::default);
        spec.data_source_ref = Some(
            serde_json::from_value(serde_json::json!({
                "apiGroup": "nfsprov.dev", "kind": "Snapshot", "name": "nightly"
            }))
            .unwrap(),
        );
        assert_eq!(source_kind(&pvc), "Snapshot");
        let mut pvc = claim("nfs");
        pvc.spec.get_or_insert_with(Default::default).data_source = Some(
            serde_json::from_value(
                serde_json::json!({"kind": "PersistentVolumeClaim", "name": "origin"}),
            )
            .unwrap(),
        );
        assert_eq!(source_kind(&pvc), "PersistentVolumeClaim");
        let mut pvc = claim("nfs");
        pvc.metadata.annotations = Some(
            [
                (
                    ANN_RESTORE_ARCHIVE,
                    "team-a/data/@20260101T000000.000000000Z",
                ),
                (ANN_RESTORE_ARCHIVE_AGENT, "nfs1"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
        );
        assert_eq!(source_kind(&pvc), ARCHIVE_SOURCE_KIND);
    }

    #[test]
    fn a_new_volume_is_created_with_the_class_settings() {
        let wanted = wanted_of(&[
            (PARAM_MODE, "0750"),
            (PARAM_GID, "2000"),
            (PARAM_QUOTA, "off"),
        ]);
        let plan = plan(&claim("nfs"), "nfs", &wanted, None).unwrap();
        let pv_name = format!("pvc-{CLAIM_UID}");
        assert_eq!(plan.claim, "team-a/data");
        assert_eq!(plan.pv_name, pv_name);
        assert_eq!(plan.path.as_str(), format!("team-a-data-{pv_name}"));
        let Request::Create(request) = &plan.request else {
            panic!("a claim without a source is created: {plan:?}");
        };
        assert_eq!(request.mode, Mode::parse_octal("0750").unwrap());
        assert_eq!((request.uid, request.gid), (None, Some(2000)));
        assert_eq!(request.capacity_bytes, 1 << 30);
        assert_eq!(request.quota, QuotaPolicy::Off);
        assert_eq!(
            request.owner,
            VolumeOwner {
                pvc_namespace: Some("team-a".into()),
                pvc_name: Some("data".into()),
                pv_name: Some(pv_name),
            }
        );
    }

    #[test]
    fn a_clone_is_made_from_its_source_without_the_class_mode() {
        let wanted = wanted_of(&[(PARAM_MODE, "0700"), (PARAM_PATH_PATTERN, "c/${.PVC.name}")]);
        let source = SourceVolume {
            claim: SourceClaim {
                namespace: "team-a".into(),
                name: "origin".into(),
            },
            agent: "nfs1".into(),
            path: VolumePath::parse("team-a-origin").unwrap(),
        };
        let plan = plan(
            &claim("nfs"),
            "nfs",
            &wanted,
            Some(&Origin::Clone(source.clone())),
        )
        .unwrap();
        assert_eq!(plan.path.as_str(), "c/data");
        let Request::Clone { request, from } = &plan.request else {
            panic!("a claim with a source is cloned: {plan:?}");
        };
        assert_eq!(from, "team-a/origin");
        assert_eq!(request.source, source.path);
        assert_eq!(request.capacity_bytes, 1 << 30);
        assert_eq!(request.owner.pvc_name.as_deref(), Some("data"));
    }

    #[test]
    fn a_restore_is_made_from_its_snapshot_at_the_claims_size() {
        let wanted = wanted_of(&[(PARAM_MODE, "0700")]);
        let snapshot = ReadySnapshot {
            snapshot: crate::datasource::SourceSnapshot {
                namespace: "team-a".into(),
                name: "nightly".into(),
            },
            agent: "nfs1".into(),
            name: nfsprov_api_types::SnapshotName::parse("snap-1").unwrap(),
        };
        let plan = plan(
            &claim("nfs"),
            "nfs",
            &wanted,
            Some(&Origin::Restore(snapshot)),
        )
        .unwrap();
        let Request::Restore { request, from } = &plan.request else {
            panic!("a claim with a snapshot source is restored: {plan:?}");
        };
        assert_eq!(from, "team-a/nightly");
        assert_eq!(
            request.snapshot.as_ref().map(|s| s.as_str()),
            Some("snap-1")
        );
        assert_eq!(request.capacity_bytes, 1 << 30);
        assert_eq!(request.owner.pvc_name.as_deref(), Some("data"));
    }

    #[test]
    fn a_volume_from_an_archive_is_restored_at_the_claims_size_and_names_the_archive() {
        let wanted = wanted_of(&[(PARAM_MODE, "0700"), (PARAM_QUOTA, "off")]);
        let archive = ArchiveSource {
            agent: "nfs1".into(),
            id: nfsprov_api_types::ArchivePath::parse("team-a/old/@20260101T000000.000000000Z")
                .unwrap(),
        };
        let plan = plan(
            &claim("nfs"),
            "nfs",
            &wanted,
            Some(&Origin::Archive(archive.clone())),
        )
        .unwrap();
        let Request::Restore { request, from } = &plan.request else {
            panic!("a claim with an archive is restored: {plan:?}");
        };
        assert_eq!(from, "nfs1:team-a/old/@20260101T000000.000000000Z");
        assert_eq!(request.source(), Ok(RestoreSource::Archive(archive.id)));
        assert_eq!(request.capacity_bytes, 1 << 30);
        assert_eq!(request.quota, QuotaPolicy::Off);
        assert_eq!(request.owner.pvc_namespace.as_deref(), Some("team-a"));
    }

    #[test]
    fn a_path_the_pattern_cannot_make_is_refused_for_good() {
        // The claim's provisioner annotation holds a '/', which no substituted value may.
        let pattern = format!("${{.PVC.annotations.{}}}", objects::ANN_STORAGE_PROVISIONER);
        let wanted = wanted_of(&[(PARAM_PATH_PATTERN, pattern.as_str())]);
        let failure = plan(&claim("nfs"), "nfs", &wanted, None).unwrap_err();
        assert!(failure.permanent);
        assert!(
            failure.message.starts_with("StorageClass \"nfs\": "),
            "{}",
            failure.message
        );
    }

    #[test]
    fn what_the_claim_or_class_cannot_ask_for_is_refused_for_good() {
        let mut block = claim("nfs");
        block.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        let bad_class = class("nfs", &[(PARAM_QUOTA, "sometimes")]);
        for (pvc, class) in [(block, class("nfs", &[])), (claim("nfs"), bad_class)] {
            let failure = wanted(&pvc, &class, "nfs").unwrap_err();
            assert!(failure.permanent, "{}", failure.message);
        }
        let read = wanted_of(&[]);
        assert_eq!(
            (read.capacity.0.as_str(), read.capacity_bytes),
            ("1Gi", 1 << 30)
        );
    }
}
