//! Volume health: what the usage poll's answers say of each bound volume's condition,
//! turned into events on its claim when it changes. The agent reports a condition with
//! every volume it returns (missing, not exported, read-only, quota full, filesystem
//! errors, or normal, and the newest abnormal condition it repaired by itself); an agent
//! answering 404 for a bound volume means the volume is missing; an agent that failed every
//! request for longer than `--agent-unreachable-seconds` makes each of its claims
//! `agent_unreachable`.
//!
//! Only changes are published: an unchanged condition is never repeated. The tracker lives
//! in memory, so a controller that restarts (or a new leader) reports a still-abnormal
//! condition once again, and never reports a volume normal that it did not see abnormal.
//! A repair the agent reports is published (abnormal, then normal) only when it is newer
//! than what this tracker saw first of the volume: repairs from before the first look are
//! not replayed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::{Duration, Instant};

use k8s_openapi::jiff::Timestamp;
use nfsprov_api_types::{AbnormalReason, RepairedCondition, VolumeCondition};

pub(crate) const REASON_ABNORMAL: &str = "VolumeConditionAbnormal";
pub(crate) const REASON_NORMAL: &str = "VolumeConditionNormal";

/// The `reason` label (and event wording) of an agent that answers nothing.
pub(crate) const AGENT_UNREACHABLE: &str = "agent_unreachable";

/// Why a claim's volume is abnormal: a reason its agent reported, or the agent itself is
/// out of reach.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Reason {
    Volume(AbnormalReason),
    AgentUnreachable,
}

impl Reason {
    /// Every reason the `nfsprov_volume_abnormal` gauge shows for every agent, at zero
    /// when no claim has it, so that alerts see the first one.
    pub(crate) const ALWAYS_PUBLISHED: [Reason; 6] = [
        Reason::Volume(AbnormalReason::Missing),
        Reason::Volume(AbnormalReason::NotExported),
        Reason::Volume(AbnormalReason::ReadOnly),
        Reason::Volume(AbnormalReason::QuotaFull),
        Reason::Volume(AbnormalReason::FilesystemError),
        Reason::AgentUnreachable,
    ];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Reason::Volume(reason) => reason.as_str(),
            Reason::AgentUnreachable => AGENT_UNREACHABLE,
        }
    }

    /// What the owner of the claim (or the administrator) does about it.
    fn advice(self) -> &'static str {
        match self {
            Reason::Volume(AbnormalReason::Missing) => {
                "its directory is gone from the NFS server: pods mounting it fail or see an empty volume. Move it back to its path if it was moved; otherwise restore its data into a new claim from a Snapshot or an archive (kubectl nfsprov orphans lists it)"
            }
            Reason::Volume(AbnormalReason::NotExported) => {
                "the NFS server does not serve it: new mounts fail. Check the NFS server's exports and log; the agent exports it again where it can"
            }
            Reason::Volume(AbnormalReason::ReadOnly) => {
                "its filesystem is read-only on the NFS server: every write fails. Check the server's kernel log and remount the filesystem read-write"
            }
            Reason::Volume(AbnormalReason::QuotaFull) => {
                "it is full: writes that need space fail. Expand the claim or free space"
            }
            Reason::Volume(AbnormalReason::FilesystemError) => {
                "its filesystem answers with I/O errors. Check the NFS server's kernel log and disks; stop the agent and the NFS server, repair and mount the filesystem, start them again"
            }
            Reason::Volume(AbnormalReason::Unknown) => {
                "the agent reports a reason this controller does not know. See the agent's log"
            }
            Reason::AgentUnreachable => {
                "the volume's state is unknown and I/O on it may hang. Check that the agent and its NFS server are up and reachable from the controller"
            }
        }
    }
}

/// What one poll learnt of one volume.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Answer<'a> {
    /// The agent returned the volume, with its condition unless the agent does not check
    /// (then it counts as normal: the volume is there and answered for).
    Volume(Option<&'a VolumeCondition>),
    /// The agent answered that it has no such volume.
    NotFound,
    /// No answer at all; the error, for the event should the agent stay out of reach.
    Failed(&'a str),
    /// An answer that says nothing of the volume's condition (an error of the agent's
    /// about this volume): the agent is there, and the volume's last condition stands.
    Unknown,
}

/// An event to publish on a volume's claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HealthEvent {
    /// `VolumeConditionAbnormal` (Warning).
    Abnormal { reason: Reason, note: String },
    /// `VolumeConditionNormal` (Normal).
    Normal { was: Reason, note: String },
}

impl HealthEvent {
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            HealthEvent::Abnormal { .. } => REASON_ABNORMAL,
            HealthEvent::Normal { .. } => REASON_NORMAL,
        }
    }

    pub(crate) fn note(&self) -> &str {
        match self {
            HealthEvent::Abnormal { note, .. } | HealthEvent::Normal { note, .. } => note,
        }
    }
}

#[derive(Debug)]
struct VolumeHealth {
    agent: String,
    /// The abnormal reason last published on the claim; `None`: normal, or not known yet.
    reported: Option<Reason>,
    /// The newest repair seen, once the agent answered for the volume at least once.
    repaired_seen: Option<Option<Timestamp>>,
}

#[derive(Debug, Default)]
struct AgentHealth {
    /// Since when every request to it failed; `None` while it answers.
    failing_since: Option<Instant>,
    /// Whether its claims were told it is out of reach.
    unreachable: bool,
}

/// What the current poll saw of one agent.
#[derive(Debug, Default)]
struct PassOfAgent {
    answered: bool,
    /// The volumes it failed for, with the last error.
    failed: Vec<String>,
    last_error: String,
}

/// The last condition reported for each bound volume, and since when each agent failed.
#[derive(Debug)]
pub(crate) struct HealthTracker {
    unreachable_after: Duration,
    volumes: HashMap<String, VolumeHealth>,
    agents: HashMap<String, AgentHealth>,
    pass: HashMap<String, PassOfAgent>,
}

fn timestamp(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

impl HealthTracker {
    pub(crate) fn new(unreachable_after: Duration) -> Self {
        Self {
            unreachable_after,
            volumes: HashMap::new(),
            agents: HashMap::new(),
            pass: HashMap::new(),
        }
    }

    /// Records one answer of the current poll for the volume `pv` on `agent`; returns the
    /// events it calls for, in order.
    pub(crate) fn observe(
        &mut self,
        pv: &str,
        agent: &str,
        answer: Answer<'_>,
    ) -> Vec<HealthEvent> {
        // Looked up before inserting: a poll over thousands of volumes copies no names
        // but those of volumes seen for the first time.
        if !self.pass.contains_key(agent) {
            self.pass.insert(agent.to_owned(), PassOfAgent::default());
        }
        let pass = self.pass.get_mut(agent).expect("inserted above");
        if !self.volumes.contains_key(pv) {
            self.volumes.insert(
                pv.to_owned(),
                VolumeHealth {
                    agent: agent.to_owned(),
                    reported: None,
                    repaired_seen: None,
                },
            );
        }
        let volume = self.volumes.get_mut(pv).expect("inserted above");
        if volume.agent != agent {
            agent.clone_into(&mut volume.agent);
        }
        let (now, message) = match answer {
            Answer::Failed(error) => {
                pass.failed.push(pv.to_owned());
                error.clone_into(&mut pass.last_error);
                return Vec::new();
            }
            Answer::Unknown => {
                pass.answered = true;
                return Vec::new();
            }
            Answer::NotFound => {
                pass.answered = true;
                (
                    Some(Reason::Volume(AbnormalReason::Missing)),
                    format!("agent {agent} has no directory for this volume"),
                )
            }
            Answer::Volume(condition) => {
                pass.answered = true;
                let now = condition.and_then(|c| c.abnormal).map(Reason::Volume);
                let message = condition.map(|c| c.message.clone()).unwrap_or_default();
                (now, message)
            }
        };
        let mut events = Vec::new();
        let repaired = match answer {
            Answer::Volume(Some(condition)) => condition.repaired.as_ref(),
            _ => None,
        };
        let newer_repair = Self::newer_repair(volume, repaired);
        let before = volume.reported;
        if let Some(repaired) = newer_repair {
            let reason = Reason::Volume(repaired.reason);
            if before == Some(reason) && now != Some(reason) {
                // The tracker saw it abnormal: one Normal, naming the repair.
                volume.reported = now;
                events.push(HealthEvent::Normal {
                    was: reason,
                    note: format!(
                        "volume {pv} is normal again (was {reason}): repaired by the agent at {at}",
                        reason = reason.as_str(),
                        at = repaired.repaired_at,
                    ),
                });
                if let Some(now) = now {
                    events.push(abnormal(pv, agent, now, &message));
                }
                return events;
            }
            if before != Some(reason) {
                // Found and repaired between two looks: the claim learns both.
                events.push(HealthEvent::Abnormal {
                    reason,
                    note: format!(
                        "volume {pv} on agent {agent} was abnormal: {reason}: {message} (found by the agent at {found}); {advice}",
                        reason = reason.as_str(),
                        message = repaired.message,
                        found = repaired.found_at,
                        advice = reason.advice(),
                    ),
                });
                events.push(HealthEvent::Normal {
                    was: reason,
                    note: format!(
                        "volume {pv}: {reason} was repaired by the agent at {at}",
                        reason = reason.as_str(),
                        at = repaired.repaired_at,
                    ),
                });
            }
        }
        if before != now {
            volume.reported = now;
            match (before, now) {
                (_, Some(now)) => events.push(abnormal(pv, agent, now, &message)),
                (Some(was), None) => events.push(HealthEvent::Normal {
                    was,
                    note: format!("volume {pv} is normal again (was {})", was.as_str()),
                }),
                (None, None) => {}
            }
        }
        events
    }

    /// The repair to report, if `repaired` is newer than what was seen of the volume; it
    /// becomes what was seen. The first answer only sets the mark.
    fn newer_repair<'a>(
        volume: &mut VolumeHealth,
        repaired: Option<&'a RepairedCondition>,
    ) -> Option<&'a RepairedCondition> {
        let at = repaired.and_then(|r| timestamp(&r.repaired_at));
        let Some(seen) = volume.repaired_seen else {
            volume.repaired_seen = Some(at);
            return None;
        };
        let newer = match (at, seen) {
            (Some(at), Some(seen)) => at > seen,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if newer {
            volume.repaired_seen = Some(at);
            repaired
        } else {
            None
        }
    }

    /// Ends the current poll at `now`: decides which agents are out of reach (or back) and
    /// forgets the volumes `live` no longer holds. Returns the events per PV name.
    pub(crate) fn finish_pass(
        &mut self,
        now: Instant,
        live: &HashSet<&str>,
    ) -> Vec<(String, HealthEvent)> {
        let mut events = Vec::new();
        let pass = std::mem::take(&mut self.pass);
        for (name, seen) in pass {
            let agent = self.agents.entry(name.clone()).or_default();
            if seen.answered {
                agent.failing_since = None;
                agent.unreachable = false;
                continue;
            }
            if seen.failed.is_empty() {
                continue;
            }
            let since = *agent.failing_since.get_or_insert(now);
            let failing_for = now.saturating_duration_since(since);
            if failing_for < self.unreachable_after {
                continue;
            }
            agent.unreachable = true;
            let reason = Reason::AgentUnreachable;
            for pv in seen.failed {
                let Some(volume) = self.volumes.get_mut(&pv) else {
                    continue;
                };
                if volume.reported == Some(reason) {
                    continue;
                }
                volume.reported = Some(reason);
                let note = format!(
                    "volume {pv} on agent {name} is abnormal: {reason}: the agent has answered no request for {secs} s (last error: {error}); {advice}",
                    reason = reason.as_str(),
                    secs = failing_for.as_secs(),
                    error = seen.last_error,
                    advice = reason.advice(),
                );
                events.push((pv, HealthEvent::Abnormal { reason, note }));
            }
        }
        self.volumes.retain(|pv, _| live.contains(pv.as_str()));
        // Agents no volume of which is left: nothing to report about them any more.
        let agents_in_use: HashSet<&str> =
            self.volumes.values().map(|v| v.agent.as_str()).collect();
        self.agents
            .retain(|name, _| agents_in_use.contains(name.as_str()));
        events.sort_by(|a, b| a.0.cmp(&b.0));
        events
    }

    /// Claims whose volume is abnormal now, by agent and reason.
    pub(crate) fn abnormal_counts(&self) -> BTreeMap<(String, Reason), u64> {
        let mut counts = BTreeMap::new();
        for volume in self.volumes.values() {
            if let Some(reason) = volume.reported {
                *counts.entry((volume.agent.clone(), reason)).or_default() += 1;
            }
        }
        counts
    }
}

fn abnormal(pv: &str, agent: &str, reason: Reason, message: &str) -> HealthEvent {
    let found = if message.is_empty() {
        String::new()
    } else {
        format!(": {message}")
    };
    HealthEvent::Abnormal {
        reason,
        note: format!(
            "volume {pv} on agent {agent} is abnormal: {reason}{found}; {advice}",
            reason = reason.as_str(),
            advice = reason.advice(),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    fn tracker() -> HealthTracker {
        HealthTracker::new(Duration::from_secs(120))
    }

    fn condition(reason: AbnormalReason, message: &str) -> VolumeCondition {
        VolumeCondition::abnormal(reason, message)
    }

    fn repaired(condition: VolumeCondition, found: &str, at: &str) -> VolumeCondition {
        VolumeCondition {
            repaired: Some(RepairedCondition {
                reason: AbnormalReason::NotExported,
                message: "the NFS server had lost the export".into(),
                found_at: found.into(),
                repaired_at: at.into(),
            }),
            ..condition
        }
    }

    /// The (reason, kind) of each event, for compact comparisons.
    fn kinds(events: &[HealthEvent]) -> Vec<(&'static str, &'static str)> {
        events
            .iter()
            .map(|e| match e {
                HealthEvent::Abnormal { reason, .. } => (e.reason(), reason.as_str()),
                HealthEvent::Normal { was, .. } => (e.reason(), was.as_str()),
            })
            .collect()
    }

    #[test]
    fn only_changes_are_reported_and_never_normal_for_a_volume_never_seen_abnormal() {
        let mut health = tracker();
        let normal = VolumeCondition::normal();
        let full = condition(AbnormalReason::QuotaFull, "no space left");
        let read_only = condition(AbnormalReason::ReadOnly, "mounted ro");
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&normal)))
                .is_empty()
        );
        assert!(
            health
                .observe("pv-b", "nfs1", Answer::Volume(None))
                .is_empty()
        );

        let events = health.observe("pv-a", "nfs1", Answer::Volume(Some(&full)));
        assert_eq!(kinds(&events), [(REASON_ABNORMAL, "quota_full")]);
        let note = events[0].note();
        assert!(note.contains("no space left"), "{note}");
        assert!(note.contains("Expand the claim"), "{note}");
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&full)))
                .is_empty(),
            "unchanged: not repeated"
        );
        assert_eq!(
            kinds(&health.observe("pv-a", "nfs1", Answer::Volume(Some(&read_only)))),
            [(REASON_ABNORMAL, "read_only")],
            "another reason is a change"
        );
        assert_eq!(
            kinds(&health.observe("pv-a", "nfs1", Answer::Volume(Some(&normal)))),
            [(REASON_NORMAL, "read_only")]
        );
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&normal)))
                .is_empty()
        );
        assert_eq!(health.abnormal_counts(), BTreeMap::new());
    }

    #[test]
    fn a_404_is_missing_and_an_answer_again_is_normal() {
        let mut health = tracker();
        let events = health.observe("pv-a", "nfs1", Answer::NotFound);
        assert_eq!(kinds(&events), [(REASON_ABNORMAL, "missing")]);
        assert!(events[0].note().contains("agent nfs1 has no directory"));
        assert!(health.observe("pv-a", "nfs1", Answer::NotFound).is_empty());
        assert_eq!(
            health.abnormal_counts(),
            BTreeMap::from([(
                ("nfs1".to_owned(), Reason::Volume(AbnormalReason::Missing)),
                1
            )])
        );
        // An agent that does not check conditions: the volume is back, so it is normal.
        assert_eq!(
            kinds(&health.observe("pv-a", "nfs1", Answer::Volume(None))),
            [(REASON_NORMAL, "missing")]
        );
    }

    #[test]
    fn a_restart_reports_a_still_abnormal_volume_once_again() {
        let full = condition(AbnormalReason::QuotaFull, "no space left");
        let mut before = tracker();
        assert_eq!(
            before
                .observe("pv-a", "nfs1", Answer::Volume(Some(&full)))
                .len(),
            1
        );
        // A new tracker, as after a restart: the abnormal condition once more, then quiet.
        let mut after = tracker();
        assert_eq!(
            kinds(&after.observe("pv-a", "nfs1", Answer::Volume(Some(&full)))),
            [(REASON_ABNORMAL, "quota_full")]
        );
        assert!(
            after
                .observe("pv-a", "nfs1", Answer::Volume(Some(&full)))
                .is_empty()
        );
    }

    #[test]
    fn a_repair_between_two_looks_is_reported_once_and_an_old_one_never() {
        let mut health = tracker();
        let normal = VolumeCondition::normal();
        let old = repaired(
            normal.clone(),
            "2026-11-01T10:00:00Z",
            "2026-11-01T10:00:05Z",
        );
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&old)))
                .is_empty(),
            "a repair from before the first look is not replayed"
        );
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&old)))
                .is_empty()
        );

        let new = repaired(
            normal.clone(),
            "2026-11-28T10:00:00Z",
            "2026-11-28T10:00:30Z",
        );
        let events = health.observe("pv-a", "nfs1", Answer::Volume(Some(&new)));
        assert_eq!(
            kinds(&events),
            [
                (REASON_ABNORMAL, "not_exported"),
                (REASON_NORMAL, "not_exported")
            ]
        );
        assert!(
            events[0].note().contains("2026-11-28T10:00:00Z"),
            "{events:?}"
        );
        assert!(
            events[1]
                .note()
                .contains("repaired by the agent at 2026-11-28T10:00:30Z")
        );
        assert!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&new)))
                .is_empty(),
            "the same repair once"
        );
        assert_eq!(health.abnormal_counts(), BTreeMap::new());

        // A volume first seen with no repair at all: its first repair counts.
        assert!(
            health
                .observe("pv-b", "nfs1", Answer::Volume(Some(&normal)))
                .is_empty()
        );
        assert_eq!(
            health
                .observe("pv-b", "nfs1", Answer::Volume(Some(&new)))
                .len(),
            2
        );
    }

    #[test]
    fn a_repair_of_a_condition_the_tracker_saw_is_one_normal_event() {
        let mut health = tracker();
        let lost = condition(AbnormalReason::NotExported, "not served");
        assert_eq!(
            health
                .observe("pv-a", "nfs1", Answer::Volume(Some(&lost)))
                .len(),
            1
        );
        let fixed = repaired(
            VolumeCondition::normal(),
            "2026-11-28T10:00:00Z",
            "2026-11-28T10:00:30Z",
        );
        let events = health.observe("pv-a", "nfs1", Answer::Volume(Some(&fixed)));
        assert_eq!(kinds(&events), [(REASON_NORMAL, "not_exported")]);
        assert!(
            events[0]
                .note()
                .contains("repaired by the agent at 2026-11-28T10:00:30Z")
        );
    }

    #[test]
    fn an_agent_out_of_reach_past_the_threshold_is_reported_once_per_claim_and_back_once() {
        let mut health = tracker();
        let live: HashSet<&str> = ["pv-a", "pv-b", "pv-c"].into();
        let normal = VolumeCondition::normal();
        let start = Instant::now();
        for pv in ["pv-a", "pv-b"] {
            health.observe(pv, "nfs1", Answer::Volume(Some(&normal)));
        }
        health.observe("pv-c", "nfs2", Answer::Volume(Some(&normal)));
        assert!(health.finish_pass(start, &live).is_empty());

        let fail_pass = |health: &mut HealthTracker, at: Instant| {
            for pv in ["pv-a", "pv-b"] {
                assert!(
                    health
                        .observe(pv, "nfs1", Answer::Failed("connection refused"))
                        .is_empty()
                );
            }
            health.observe("pv-c", "nfs2", Answer::Volume(Some(&normal)));
            health.finish_pass(at, &live)
        };
        assert!(
            fail_pass(&mut health, start + MINUTE).is_empty(),
            "failing since now"
        );
        assert!(
            fail_pass(&mut health, start + 2 * MINUTE).is_empty(),
            "60 s < 120 s"
        );
        let events = fail_pass(&mut health, start + 3 * MINUTE);
        assert_eq!(
            events
                .iter()
                .map(|(pv, e)| (pv.as_str(), e.reason()))
                .collect::<Vec<_>>(),
            [("pv-a", REASON_ABNORMAL), ("pv-b", REASON_ABNORMAL)]
        );
        let note = events[0].1.note();
        assert!(
            note.contains("on agent nfs1 is abnormal: agent_unreachable: the agent has answered no request for 120 s"),
            "{note}"
        );
        assert!(note.contains("connection refused"), "{note}");
        assert_eq!(
            health.abnormal_counts(),
            BTreeMap::from([(("nfs1".to_owned(), Reason::AgentUnreachable), 2)])
        );
        assert!(
            fail_pass(&mut health, start + 4 * MINUTE).is_empty(),
            "once, not per poll"
        );

        // Back: each claim learns it, once.
        let full = condition(AbnormalReason::QuotaFull, "full");
        assert_eq!(
            kinds(&health.observe("pv-a", "nfs1", Answer::Volume(Some(&normal)))),
            [(REASON_NORMAL, AGENT_UNREACHABLE)]
        );
        assert_eq!(
            kinds(&health.observe("pv-b", "nfs1", Answer::Volume(Some(&full)))),
            [(REASON_ABNORMAL, "quota_full")],
            "back with another condition: that one"
        );
        assert!(health.finish_pass(start + 5 * MINUTE, &live).is_empty());

        // Failing again starts a new count.
        assert!(fail_pass(&mut health, start + 6 * MINUTE).is_empty());
        assert!(fail_pass(&mut health, start + 7 * MINUTE).is_empty());
        assert_eq!(fail_pass(&mut health, start + 8 * MINUTE).len(), 2);
    }

    #[test]
    fn one_answer_keeps_an_agent_reachable_and_forgotten_volumes_leave_the_counts() {
        let mut health = tracker();
        let start = Instant::now();
        let both: HashSet<&str> = ["pv-a", "pv-b"].into();
        for minute in 0..5 {
            health.observe("pv-a", "nfs1", Answer::Failed("timed out"));
            health.observe("pv-b", "nfs1", Answer::Volume(None));
            assert!(
                health
                    .finish_pass(start + minute * MINUTE, &both)
                    .is_empty()
            );
        }
        health.observe("pv-a", "nfs1", Answer::NotFound);
        health.finish_pass(start + 6 * MINUTE, &both);
        assert_eq!(health.abnormal_counts().len(), 1);
        health.finish_pass(start + 7 * MINUTE, &HashSet::new());
        assert!(health.abnormal_counts().is_empty());
        assert!(health.agents.is_empty());
    }
}
