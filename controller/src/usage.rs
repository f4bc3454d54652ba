//! Volume usage and health: every bound volume of ours is asked from its agent at a fixed
//! interval. Its figures are published as per-claim gauges, and a claim whose volume fills
//! up gets a `VolumeNearlyFull` warning; its condition goes to the [`HealthTracker`], whose
//! changes become `VolumeConditionAbnormal` and `VolumeConditionNormal` events on the claim
//! and the `nfsprov_volume_abnormal` gauge. Runs only where the controllers run, that is on
//! the leader.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kube::runtime::events::EventType;
use nfsprov_api_types::client::ClientError;
use nfsprov_api_types::{Volume, VolumePath};
use tokio::sync::watch;
use tokio::time::{Instant, MissedTickBehavior};
use tracing::{debug, info, warn};

use crate::agents::request_id;
use crate::context::{Context, stopped};
use crate::health::{Answer, HealthEvent, HealthTracker, Reason};
use crate::metrics::{VolumeFigures, VolumeLabels};
use crate::objects::{ANN_PATH, CachedVolume, VolumeClaimRef, bound_claim_of, is_ours};

pub(crate) const REASON_NEARLY_FULL: &str = "VolumeNearlyFull";
const ACTION: &str = "MeasureUsage";
const HEALTH_ACTION: &str = "CheckHealth";

/// Warn when a volume reaches this share of its capacity...
const WARN_PERCENT: u64 = 90;
/// ...and warn again only after it went below this one: a volume hovering around the
/// threshold warns once, not at every poll.
const REARM_PERCENT: u64 = 85;

/// Most agent requests one poll has in flight: enough to measure thousands of volumes
/// within a minute, few enough not to crowd out provisioning on the agents.
const CONCURRENT_REQUESTS: usize = 16;

/// Most health events one poll has in flight: an agent out of reach changes every claim it
/// serves at once, and thousands of event creations at once would crowd out the
/// reconcilers' own requests to the API server (and its rate limits).
const CONCURRENT_EVENTS: usize = 4;

/// One bound volume of ours, as the volume cache holds it: a poll over 10,000 volumes
/// copies no names. Its claim is the one its `claimRef` names.
#[derive(Debug, Clone)]
struct Target {
    volume: Arc<CachedVolume>,
}

impl Target {
    fn pv_name(&self) -> &str {
        self.volume.metadata.name.as_deref().unwrap_or_default()
    }

    fn agent(&self) -> &str {
        self.volume.recorded.agent.as_deref().unwrap_or_default()
    }

    fn path(&self) -> &str {
        self.volume.recorded.path.as_deref().unwrap_or_default()
    }

    fn claim(&self) -> &VolumeClaimRef {
        // `targets` keeps only volumes that name their claim.
        bound_claim_of(&self.volume).expect("a target names its claim")
    }

    fn labels(&self) -> VolumeLabels {
        let claim = self.claim();
        VolumeLabels {
            namespace: claim.namespace.clone().unwrap_or_default(),
            persistentvolumeclaim: claim.name.clone().unwrap_or_default(),
            agent: self.agent().to_owned(),
        }
    }
}

/// The bound volumes of ours that name their agent, directory and claim, in PV name order.
fn targets(ctx: &Context) -> Vec<Target> {
    let mut found: Vec<Target> = ctx
        .volumes
        .state()
        .into_iter()
        .filter(|volume| is_ours(volume, &ctx.provisioner))
        .filter(|volume| volume.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
        .filter(|volume| volume.recorded.agent.is_some() && volume.recorded.path.is_some())
        .filter(|volume| bound_claim_of(volume).is_some())
        .map(|volume| Target { volume })
        .collect();
    found.sort_by(|a, b| a.pv_name().cmp(b.pv_name()));
    found
}

/// `VolumeNearlyFull` hysteresis, per PV: warn on crossing 90 %, re-arm below 85 %.
#[derive(Debug, Default)]
pub(crate) struct NearlyFull {
    warned: BTreeSet<String>,
}

impl NearlyFull {
    /// Records a measurement; `true` when it is a crossing to warn about.
    pub(crate) fn observe(&mut self, pv_name: &str, used_bytes: u64, capacity_bytes: u64) -> bool {
        if capacity_bytes == 0 {
            return false;
        }
        // Whole numbers in u128: no float rounding at the thresholds, no overflow.
        let used = u128::from(used_bytes) * 100;
        let capacity = u128::from(capacity_bytes);
        if used >= capacity * u128::from(WARN_PERCENT) {
            return self.warned.insert(pv_name.to_owned());
        }
        if used < capacity * u128::from(REARM_PERCENT) {
            self.warned.remove(pv_name);
        }
        false
    }

    fn retain(&mut self, live: &HashSet<&str>) {
        self.warned
            .retain(|pv_name| live.contains(pv_name.as_str()));
    }
}

/// What one poll leaves for the next. The published figures themselves live in
/// [`crate::metrics::Metrics`], which drops those of volumes a poll no longer finds.
#[derive(Debug)]
pub(crate) struct UsageTracker {
    nearly_full: NearlyFull,
    health: HealthTracker,
}

impl UsageTracker {
    /// `unreachable_after`: how long an agent fails every request before its claims are
    /// told it is out of reach.
    pub(crate) fn new(unreachable_after: Duration) -> Self {
        Self {
            nearly_full: NearlyFull::default(),
            health: HealthTracker::new(unreachable_after),
        }
    }
}

impl Default for UsageTracker {
    /// With the command line's default threshold for agents out of reach.
    fn default() -> Self {
        Self::new(Duration::from_secs(120))
    }
}

#[derive(Debug, thiserror::Error)]
enum MeasureError {
    #[error("agent {0:?} is not configured")]
    UnknownAgent(String),
    #[error("annotation {ann} is not a valid volume path: {0}", ann = ANN_PATH)]
    InvalidPath(String),
    #[error("agent {agent}: {source}")]
    Agent {
        agent: String,
        #[source]
        source: ClientError,
    },
    /// Not asked: the agent gave no answer to this poll's probe.
    #[error("agent {agent}: {error}")]
    OutOfReach { agent: String, error: String },
}

/// The agents of `targets` that give no answer at all to `/healthz` now, each with the
/// error: their volumes are not asked about in this poll. An agent whose packets are
/// dropped then costs the poll one time limit, not one per volume (sixteen at a time),
/// which would put its claims' `agent_unreachable` many polls late.
async fn out_of_reach(ctx: &Context, targets: &[Target]) -> HashMap<String, ClientError> {
    let names: BTreeSet<&str> = targets.iter().map(Target::agent).collect();
    let probes = names.into_iter().filter_map(|name| {
        let agent = ctx.agents.get(name)?;
        Some(async move { (name.to_owned(), agent.client().healthz().await) })
    });
    futures::future::join_all(probes)
        .await
        .into_iter()
        .filter_map(|(name, answer)| match answer {
            Err(error @ ClientError::Transport(_)) => Some((name, error)),
            // Any answer, even an error, says the agent is there: its volumes are asked.
            _ => None,
        })
        .collect()
}

async fn measure(
    ctx: &Context,
    target: &Target,
    unreachable: &HashMap<String, ClientError>,
) -> Result<Option<Volume>, MeasureError> {
    if let Some(error) = unreachable.get(target.agent()) {
        return Err(MeasureError::OutOfReach {
            agent: target.agent().to_owned(),
            error: error.to_string(),
        });
    }
    let agent = ctx
        .agents
        .get(target.agent())
        .ok_or_else(|| MeasureError::UnknownAgent(target.agent().to_owned()))?;
    let path =
        VolumePath::parse(target.path()).map_err(|e| MeasureError::InvalidPath(e.to_string()))?;
    agent
        .client()
        .get_volume(&path, Some(&request_id(target.pv_name())))
        .await
        .map_err(|source| MeasureError::Agent {
            agent: target.agent().to_owned(),
            source,
        })
}

/// Measures every bound volume of ours once and publishes the figures.
pub(crate) async fn poll_once(ctx: &Context, tracker: &mut UsageTracker) {
    let targets = targets(ctx);
    // Answers are handled as they arrive, so only the rare crossing is held until the end.
    // By index: a stream borrowing the targets themselves would not be `Send` for every
    // lifetime, which the spawned controller future needs.
    let unreachable = out_of_reach(ctx, &targets).await;
    let unreachable = &unreachable;
    let all = &targets;
    let mut answers = futures::stream::iter(0..targets.len())
        .map(|i| async move { (i, measure(ctx, &all[i], unreachable).await) })
        .buffer_unordered(CONCURRENT_REQUESTS);
    let mut live: HashSet<&str> = HashSet::with_capacity(targets.len());
    let mut crossings = Vec::new();
    let mut failures = 0usize;
    let mut health_events: BTreeMap<usize, Vec<HealthEvent>> = BTreeMap::new();
    while let Some((i, result)) = answers.next().await {
        let target = &targets[i];
        let answer = match &result {
            Ok(Some(volume)) => Some(Answer::Volume(volume.condition.as_ref())),
            Ok(None) => Some(Answer::NotFound),
            Err(MeasureError::Agent {
                source: source @ ClientError::Transport(_),
                ..
            }) => Some(Answer::Failed(&source.to_string())),
            // The agent answered, with an error about this volume.
            Err(MeasureError::Agent { .. }) => Some(Answer::Unknown),
            Err(MeasureError::OutOfReach { error, .. }) => Some(Answer::Failed(error)),
            // A PV this controller cannot ask about says nothing of its volume's health.
            Err(_) => None,
        };
        if let Some(answer) = answer {
            let events = tracker
                .health
                .observe(target.pv_name(), target.agent(), answer);
            if !events.is_empty() {
                health_events.entry(i).or_default().extend(events);
            }
        }
        match result {
            Ok(Some(volume)) => {
                // The agent's first measurement of a large tree can take a while; until it
                // has one, only the capacity is known.
                let used = volume.usage.map(|u| (u.used_bytes, u.used_inodes));
                ctx.metrics.set_volume(
                    target.pv_name(),
                    &target.labels(),
                    VolumeFigures {
                        capacity_bytes: volume.capacity_bytes,
                        used,
                    },
                );
                if let Some((used_bytes, _)) = used
                    && tracker.nearly_full.observe(
                        target.pv_name(),
                        used_bytes,
                        volume.capacity_bytes,
                    )
                {
                    crossings.push((target, volume));
                }
                live.insert(target.pv_name());
            }
            Ok(None) => {
                warn!(pv = %target.pv_name(), agent = %target.agent(), path = %target.path(),
                    "bound volume has no directory on its agent");
            }
            Err(e) => {
                failures += 1;
                debug!(pv = %target.pv_name(), error = %e, "could not measure volume");
                // The claim still exists: its last figures stay until the agent answers
                // again (the agent error counter shows the outage).
                live.insert(target.pv_name());
            }
        }
    }
    drop(answers);
    if failures > 0 {
        warn!(
            failures,
            volumes = targets.len(),
            "some volumes could not be measured"
        );
    }
    ctx.metrics.retain_volumes(|pv_name| live.contains(pv_name));
    tracker.nearly_full.retain(&live);
    // A missing volume has no figures but still has its claim and its condition.
    let bound: HashSet<&str> = targets.iter().map(Target::pv_name).collect();
    for (pv_name, event) in tracker
        .health
        .finish_pass(std::time::Instant::now(), &bound)
    {
        if let Ok(i) = targets.binary_search_by(|t| t.pv_name().cmp(&pv_name)) {
            health_events.entry(i).or_default().push(event);
        }
    }
    publish_abnormal(ctx, &tracker.health);
    let health_events: Vec<_> = health_events
        .into_iter()
        .map(|(i, events)| (targets[i].claim().object_reference(), events))
        .collect();
    publish_health_events(ctx, health_events).await;
    // Events in a stable order whatever order the agents answered in.
    crossings.sort_by(|a, b| a.0.pv_name().cmp(b.0.pv_name()));
    for (target, volume) in crossings {
        warn_nearly_full(ctx, target, &volume).await;
    }
}

/// Publishes each claim's events in order, a few claims at a time.
async fn publish_health_events(
    ctx: &Context,
    events: Vec<(
        k8s_openapi::api::core::v1::ObjectReference,
        Vec<HealthEvent>,
    )>,
) {
    futures::stream::iter(events)
        .for_each_concurrent(CONCURRENT_EVENTS, |(claim, events)| async move {
            for event in events {
                let type_ = match event {
                    HealthEvent::Abnormal { .. } => EventType::Warning,
                    HealthEvent::Normal { .. } => EventType::Normal,
                };
                ctx.event(&claim, type_, event.reason(), HEALTH_ACTION, event.note())
                    .await;
            }
        })
        .await;
}

/// `nfsprov_volume_abnormal`: every reason of every configured agent (zero when no claim
/// has it), and whatever else the tracker counts (a reason newer than this controller, an
/// agent no longer configured whose claims are still bound).
fn publish_abnormal(ctx: &Context, health: &HealthTracker) {
    let mut counts = health.abnormal_counts();
    let mut agents = ctx.agents.names();
    agents.sort();
    let mut series = Vec::new();
    for agent in agents {
        for reason in Reason::ALWAYS_PUBLISHED {
            let count = counts.remove(&(agent.clone(), reason)).unwrap_or(0);
            series.push((agent.clone(), reason.as_str().to_owned(), count));
        }
    }
    series.extend(
        counts
            .into_iter()
            .map(|((agent, reason), count)| (agent, reason.as_str().to_owned(), count)),
    );
    ctx.metrics.set_volume_abnormal(series);
}

async fn warn_nearly_full(ctx: &Context, target: &Target, volume: &Volume) {
    let (used, inodes) = volume
        .usage
        .as_ref()
        .map_or((0, 0), |u| (u.used_bytes, u.used_inodes));
    let capacity = volume.capacity_bytes;
    let capacity_nonzero = u128::from(capacity.max(1));
    let percent = (u128::from(used) * 100 + capacity_nonzero / 2) / capacity_nonzero;
    let enforcement = if volume.quota_enforced {
        "writes fail once it is full"
    } else {
        "the capacity is not enforced, so writes go on until the NFS server's filesystem is full"
    };
    ctx.event(
        &target.claim().object_reference(),
        EventType::Warning,
        REASON_NEARLY_FULL,
        ACTION,
        &format!(
            "volume {} is {percent}% full: {} of {} used ({used} of {capacity} bytes, {inodes} inodes); {enforcement}. Expand the claim or free space",
            target.pv_name(),
            human_bytes(used),
            human_bytes(capacity),
        ),
    )
    .await;
}

/// `9.3 GiB`-style figures for messages (the exact byte count goes alongside).
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Polls every `every` until `shutdown` turns true (or the future is dropped, as when the
/// Lease is lost). The first poll comes one interval after the caches are synced, so a
/// restart or a handover does not add a burst of agent requests to the initial sync.
pub(crate) async fn run(
    ctx: Arc<Context>,
    every: Duration,
    unreachable_after: Duration,
    shutdown: watch::Receiver<bool>,
) {
    let work = async {
        if ctx.volumes.wait_until_ready().await.is_err() {
            return;
        }
        info!(every = ?every, unreachable_after = ?unreachable_after, "measuring volume usage and health");
        let mut interval = tokio::time::interval_at(Instant::now() + every, every);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut tracker = UsageTracker::new(unreachable_after);
        // At zero from the start, so that alerts see the first abnormal volume.
        publish_abnormal(&ctx, &tracker.health);
        loop {
            interval.tick().await;
            poll_once(&ctx, &mut tracker).await;
        }
    };
    tokio::select! {
        () = work => {}
        () = stopped(shutdown) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn warns_once_per_crossing_and_rearms_below_85_percent() {
        let mut full = NearlyFull::default();
        let capacity = 1000;
        assert!(!full.observe("a", 899, capacity));
        assert!(full.observe("a", 900, capacity), "crossing 90 % warns");
        assert!(!full.observe("a", 950, capacity), "still above: no repeat");
        assert!(
            !full.observe("a", 870, capacity),
            "between 85 and 90 %: stays quiet"
        );
        assert!(!full.observe("a", 905, capacity), "not re-armed yet");
        assert!(!full.observe("a", 849, capacity), "below 85 %: re-armed");
        assert!(
            full.observe("a", 901, capacity),
            "a new crossing warns again"
        );
        // Volumes are independent; zero capacity never warns.
        assert!(full.observe("b", 1000, capacity));
        assert!(!full.observe("c", 5, 0));
        // Huge figures do not overflow.
        assert!(full.observe("d", u64::MAX, u64::MAX));
    }

    #[test]
    fn forgetting_a_volume_rearms_it() {
        let mut full = NearlyFull::default();
        assert!(full.observe("a", 95, 100));
        full.retain(&HashSet::new());
        assert!(full.observe("a", 95, 100));
    }

    #[test]
    fn human_figures() {
        assert_eq!(human_bytes(512), "512 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(10 << 30), "10.0 GiB");
        assert_eq!(human_bytes(u64::MAX), "16.0 EiB");
    }
}
