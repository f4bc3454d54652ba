//! Events on claims and volumes, through `events.k8s.io/v1`.
//!
//! kube-runtime's `Recorder` folds an event into the series of an earlier one with the same
//! reason and object but keeps the earlier note: a second expansion within minutes would
//! read "now 2Gi" when the volume is 3Gi, and a new failure would show the previous cause.
//! Here the note is part of what makes two events the same, as in client-go's recorder: a
//! repeated message grows the series of its first occurrence, a new message is a new event.

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1;
use k8s_openapi::api::events::v1::EventSeries;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

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

fn last_seen(event: &v1::Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
}

pub struct EventRecorder {
    client: Client,
    reporter: Reporter,
    /// The events published within the series window, as sent.
    recent: Mutex<HashMap<EventKey, v1::Event>>,
}

impl EventRecorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter,
            recent: Mutex::new(HashMap::new()),
        }
    }

    /// Creates the event, or counts it in the series of the same event published less than
    /// six minutes ago. Events of cluster-scoped objects go to the `default` namespace.
    pub async fn publish(
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
        let earlier = {
            let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
            recent.retain(|_, sent| last_seen(sent).is_some_and(|at| at + SERIES_WINDOW > now));
            recent.get(&key).cloned()
        };
        let namespace = regarding.namespace.as_deref().unwrap_or("default");
        let api = Api::<v1::Event>::namespaced(self.client.clone(), namespace);
        let sent = match earlier {
            Some(mut repeat) => {
                repeat.series = Some(EventSeries {
                    count: repeat
                        .series
                        .as_ref()
                        .map_or(2, |s| s.count.saturating_add(1)),
                    last_observed_time: MicroTime(now),
                });
                let name = repeat.metadata.name.clone().unwrap_or_default();
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&repeat))
                    .await?;
                repeat
            }
            None => {
                let first = self.first_occurrence(event, regarding, namespace, now);
                api.create(&PostParams::default(), &first).await?;
                first
            }
        };
        self.recent
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(key, sent);
        Ok(())
    }

    fn first_occurrence(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        namespace: &str,
        now: Timestamp,
    ) -> v1::Event {
        let object = regarding
            .name
            .as_deref()
            .unwrap_or(&self.reporter.controller);
        v1::Event {
            metadata: ObjectMeta {
                // Unique per occurrence; the nanoseconds also order them.
                name: Some(format!("{object}.{:x}", now.as_nanosecond())),
                namespace: Some(namespace.to_owned()),
                ..ObjectMeta::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_name(event.type_).to_owned()),
            event_time: Some(MicroTime(now)),
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

    use crate::tests::fixtures::{BodyCheck, Call, context, finish};

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
