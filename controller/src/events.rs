//! Events on claims and volumes, through `events.k8s.io/v1`.
//!
//! kube-runtime's `Recorder` folds an event into the series of an earlier one with the same
//! reason and object but keeps the earlier note: a second expansion within minutes would
//! read "now 2Gi" when the volume is 3Gi, and a new failure would show the previous cause.
//! Here the note is part of what makes two events the same, as in client-go's recorder: a
//! repeated message grows the series of its first occurrence, a new message is a new event.
//!
//! A burst of thousands of claims publishes tens of thousands of events within one series
//! window, so what is remembered of each is small: a 64-bit digest of what makes it the
//! same (two different events share one with a chance of about 1 in 10^11 at 20,000
//! events), its name, when it was first and last seen and its count. A repeat rebuilds the
//! rest from the event being published, which is the same event by definition.

use std::collections::HashMap;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1;
use k8s_openapi::api::events::v1::EventSeries;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};
use nfsprov_api_types::logsafe;

/// The longest note the events API accepts is 1 kB; a margin is kept for UTF-8 boundaries.
pub(crate) const MAX_NOTE_BYTES: usize = 1000;

/// A note fit to publish. Much of a note comes from an agent's error, which can name
/// files a tenant chose: control and invisible characters are shown escaped (a name
/// cannot add lines or drive the terminal of whoever reads the events) and the note is
/// cut, marked, to what the API accepts.
pub(crate) fn note_text(note: &str) -> String {
    let escaped = logsafe::escape(note);
    if escaped.len() <= MAX_NOTE_BYTES {
        return escaped.into_owned();
    }
    // Room for the marker `bound` appends.
    logsafe::bound(&escaped, MAX_NOTE_BYTES - 32).into_owned()
}

/// How long after its last occurrence an event can still grow a series (the figure of
/// client-go and kube-runtime).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// What makes two events the same occurrence.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct EventKey {
    type_: &'static str,
    reason: String,
    action: String,
    note: Option<String>,
    regarding: ObjectKey,
    related: Option<ObjectKey>,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ObjectKey {
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl From<&ObjectReference> for ObjectKey {
    fn from(reference: &ObjectReference) -> Self {
        Self {
            kind: reference.kind.clone(),
            namespace: reference.namespace.clone(),
            name: reference.name.clone(),
            uid: reference.uid.clone(),
        }
    }
}

fn type_name(type_: EventType) -> &'static str {
    match type_ {
        EventType::Normal => "Normal",
        EventType::Warning => "Warning",
    }
}

/// What a repeat needs of an event published earlier.
#[derive(Debug, Clone)]
struct Sent {
    name: String,
    first_seen: Timestamp,
    last_seen: Timestamp,
    /// 1 until the first repeat.
    count: i32,
}

pub(crate) struct EventRecorder {
    client: Client,
    reporter: Reporter,
    recent: Mutex<Recent>,
    digests: RandomState,
}

/// The events published within the series window, by the digest of their key.
struct Recent {
    sent: HashMap<u64, Sent>,
    /// Expired entries are swept at most once a second: sweeping at every publish would
    /// make a burst quadratic.
    last_sweep: Timestamp,
}

impl EventRecorder {
    pub(crate) fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recent: Mutex::new(Recent {
                sent: HashMap::new(),
                last_sweep: Timestamp::UNIX_EPOCH,
            }),
            digests: RandomState::new(),
        }
    }

    /// Creates the event, or counts it in the series of the same event published less than
    /// six minutes ago. Events of cluster-scoped objects go to the `default` namespace.
    pub(crate) async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = EventKey {
            type_: type_name(event.type_),
            reason: event.reason.clone(),
            action: event.action.clone(),
            note: event.note.clone(),
            regarding: regarding.into(),
            related: event.secondary.as_ref().map(ObjectKey::from),
        };
        let digest = self.digests.hash_one(&key);
        let earlier = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            if recent.last_sweep + SignedDuration::from_secs(1) <= now {
                recent.last_sweep = now;
                let sent = &mut recent.sent;
                sent.retain(|_, sent| sent.last_seen + SERIES_WINDOW > now);
                // A table never shrinks by itself: after a burst it would keep the
                // burst's size for good.
                if sent.capacity() > 64 && sent.len() < sent.capacity() / 4 {
                    sent.shrink_to_fit();
                }
            }
            recent
                .sent
                .get(&digest)
                .filter(|sent| sent.last_seen + SERIES_WINDOW > now)
                .cloned()
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api = Api::<v1::Event>::namespaced(self.client.clone(), namespace);
        let sent = match earlier {
            Some(earlier) => {
                let count = earlier.count.saturating_add(1);
                let mut repeat = self.occurrence(
                    event,
                    regarding,
                    namespace,
                    &earlier.name,
                    earlier.first_seen,
                );
                repeat.series = Some(EventSeries {
                    count,
                    last_observed_time: MicroTime(now),
                });
                api.patch(
                    &earlier.name,
                    &PatchParams::default(),
                    &Patch::Merge(&repeat),
                )
                .await?;
                Sent {
                    last_seen: now,
                    count,
                    ..earlier
                }
            }
            None => {
                let object = regarding
                    .name
                    .as_deref()
                    .unwrap_or(&self.reporter.controller);
                // Unique per occurrence; the nanoseconds also order them.
                let name = format!("{object}.{:x}", now.as_nanosecond());
                let first = self.occurrence(event, regarding, namespace, &name, now);
                api.create(&PostParams::default(), &first).await?;
                Sent {
                    name,
                    first_seen: now,
                    last_seen: now,
                    count: 1,
                }
            }
        };
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .sent
            .insert(digest, sent);
        Ok(())
    }

    /// The event as first published under `name` at `first_seen`.
    fn occurrence(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        namespace: &str,
        name: &str,
        first_seen: Timestamp,
    ) -> v1::Event {
        v1::Event {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_name(event.type_).to_owned()),
            event_time: Some(MicroTime(first_seen)),
            regarding: Some(regarding.clone()),
            related: event.secondary.clone(),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..v1::Event::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::ObjectReference;
    use kube::runtime::events::EventType;

    use serde_json::json;

    use crate::tests::mock_api::{BodyCheck, Call, context, finish};

    use super::{MAX_NOTE_BYTES, note_text};

    #[test]
    fn a_note_naming_a_tenant_file_is_escaped_and_bounded() {
        let note = "agent nfs1: conflict: m\n2026-11-25T00:00:00Z INFO audit: forged\u{1b}[2J is a mount point";
        let published = note_text(note);
        assert!(!published.chars().any(char::is_control), "{published:?}");
        assert!(
            published.contains("m\\n2026-11-25T00:00:00Z"),
            "{published}"
        );
        assert!(published.contains("\\u{1b}[2J"), "{published}");
        assert_eq!(note_text("plain note"), "plain note");

        let long = format!("{}\n", "é".repeat(2000));
        let published = note_text(&long);
        assert!(
            published.len() <= MAX_NOTE_BYTES,
            "{} bytes",
            published.len()
        );
        assert!(published.ends_with("bytes]"), "{published}");
        assert!(!published.chars().any(char::is_control));
    }

    /// A series patch that must carry the note of the event it continues.
    fn repeat_of(note: &str, count: u32) -> Call {
        let mut call = Call::event_repeat("team-a", "VolumeResizeSuccessful", count);
        call.body = BodyCheck::Subset(json!({
            "reason": "VolumeResizeSuccessful",
            "note": note,
            "series": {"count": count},
        }));
        call
    }

    #[tokio::test]
    async fn a_repeated_note_grows_a_series_and_a_new_note_is_a_new_event() {
        let (ctx, api) = context(Default::default(), vec![], vec![]);
        let server = api.run(vec![
            Call::event(
                "team-a",
                "Normal",
                "VolumeResizeSuccessful",
                "data",
                "now 2Gi",
            ),
            repeat_of("now 2Gi", 2),
            Call::event(
                "team-a",
                "Normal",
                "VolumeResizeSuccessful",
                "data",
                "now 3Gi",
            ),
            repeat_of("now 2Gi", 3),
            // Another object: its own event even with the same note.
            Call::event(
                "team-a",
                "Normal",
                "VolumeResizeSuccessful",
                "logs",
                "now 3Gi",
            ),
        ]);
        let claim = |name: &str| ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some("team-a".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            ..ObjectReference::default()
        };
        let publish = |name: &'static str, note: &'static str| {
            let ctx = ctx.clone();
            let regarding = claim(name);
            async move {
                ctx.event(
                    &regarding,
                    EventType::Normal,
                    "VolumeResizeSuccessful",
                    "Resize",
                    note,
                )
                .await
            }
        };
        publish("data", "now 2Gi").await;
        publish("data", "now 2Gi").await;
        publish("data", "now 3Gi").await;
        // The 2Gi series is still there; repeating it continues it.
        publish("data", "now 2Gi").await;
        publish("logs", "now 3Gi").await;
        finish(ctx, server).await;
    }
}
