//! Request-level parity of the simulator with kube-apiserver: one list of requests, each
//! with the answer the real server gives (status code, `reason`, the key parts of its
//! message), sent to the simulator in the ordinary run and to the real server of
//! `E2E_KUBECONFIG` in the real-API tier. The simulator is only worth its tests while it
//! refuses what the real server refuses, so a case answered differently by either fails
//! this test by name.
//!
//! The cases are the requests this project sends or could send by mistake: custom
//! objects with and without their type, names, `generateName`, a `resourceVersion` on
//! create, a namespace that differs from the URL's, updates of immutable fields, the
//! status subresource, patch types and field managers. Steps that prepare a later case
//! (an object to update) are cases too, with the success they expect.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use nfsprov_e2e::cluster::KubeApi;
use serde_json::{Value, json};

/// What a case expects back.
struct Answer {
    code: u16,
    /// The Status' `reason`; empty when the real server sends none.
    reason: &'static str,
    /// Parts the message must contain, after the placeholders of [`expand`].
    message: &'static [&'static str],
    /// For a success: values the returned object must hold, by JSON pointer.
    holds: &'static [(&'static str, &'static str)],
}

struct Case {
    name: &'static str,
    method: &'static str,
    /// Placeholders: `{ns}` the test's namespace, `{u}` a suffix unique to the run (for
    /// cluster-scoped names: one real cluster serves every test).
    path: &'static str,
    content_type: &'static str,
    body: &'static str,
    answer: Answer,
}

const JSON: &str = "application/json";
const MERGE: &str = "application/merge-patch+json";
const STRATEGIC: &str = "application/strategic-merge-patch+json";
const APPLY: &str = "application/apply-patch+yaml";
const SNAPSHOTS: &str = "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots";
const CLAIMS: &str = "/api/v1/namespaces/{ns}/persistentvolumeclaims";

const fn ok(code: u16, holds: &'static [(&'static str, &'static str)]) -> Answer {
    Answer {
        code,
        reason: "",
        message: &[],
        holds,
    }
}

const fn refused(code: u16, reason: &'static str, message: &'static [&'static str]) -> Answer {
    Answer {
        code,
        reason,
        message,
        holds: &[],
    }
}

/// The real server's words for a custom object without `kind`: the body as sent, then
/// its first 30 bytes (`{summary}`).
const KIND_MISSING: &str = "Object 'Kind' is missing in '{body}' ({summary})";

const CASES: &[Case] = &[
    // Custom objects are decoded by their type: without it, nothing is stored.
    Case {
        name: "a Snapshot without apiVersion and kind is unrecognized",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the object provided is unrecognized (must be of type Snapshot): ",
                KIND_MISSING,
            ],
        ),
    },
    Case {
        name: "a Snapshot with apiVersion but no kind is unrecognized",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the object provided is unrecognized (must be of type Snapshot): ",
                KIND_MISSING,
            ],
        ),
    },
    Case {
        name: "a SnapshotSchedule without apiVersion and kind is unrecognized",
        method: "POST",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshotschedules",
        content_type: JSON,
        body: r#"{"metadata":{"name":"s"},"spec":{"interval":"1h"}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the object provided is unrecognized (must be of type SnapshotSchedule): ",
                KIND_MISSING,
            ],
        ),
    },
    Case {
        name: "a Snapshot with kind but no apiVersion does not match the URL's version",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"kind":"Snapshot","metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the API version in the data () does not match the expected API version (nfsprov.dev/v1alpha1)",
            ],
        ),
    },
    Case {
        name: "a Snapshot of another version does not match the URL's version",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1","kind":"Snapshot","metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the API version in the data (nfsprov.dev/v1) does not match the expected API version (nfsprov.dev/v1alpha1)",
            ],
        ),
    },
    Case {
        name: "a SnapshotSchedule posted as a Snapshot is an invalid kind",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"SnapshotSchedule","metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"SnapshotSchedule.nfsprov.dev "a" is invalid: kind: Invalid value: "SnapshotSchedule": must be Snapshot"#,
            ],
        ),
    },
    Case {
        name: "a namespace other than the URL's is refused",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"a","namespace":"elsewhere"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the namespace of the provided object does not match the namespace sent on the request",
            ],
        ),
    },
    Case {
        name: "a resourceVersion on create is refused, without a reason",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"a","resourceVersion":"5"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            500,
            "",
            &["resourceVersion should not be set on objects to be created"],
        ),
    },
    Case {
        name: "an object needs a name or generateName",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"Snapshot.nfsprov.dev "" is invalid: "#,
                "metadata.name: Required value: name or generateName is required",
            ],
        ),
    },
    Case {
        name: "a name that is no DNS subdomain is invalid",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"Bad_Name"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"Snapshot.nfsprov.dev "Bad_Name" is invalid: metadata.name: Invalid value: "Bad_Name": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters"#,
            ],
        ),
    },
    Case {
        name: "generateName makes a name",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"generateName":"g-"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: ok(
            201,
            &[
                ("/metadata/generateName", "g-"),
                ("/spec/deletionPolicy", "Delete"),
                ("/kind", "Snapshot"),
            ],
        ),
    },
    Case {
        name: "a typed Snapshot is created, its default filled in",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"ok"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: ok(
            201,
            &[("/metadata/name", "ok"), ("/spec/deletionPolicy", "Delete")],
        ),
    },
    Case {
        name: "the same name again already exists",
        method: "POST",
        path: SNAPSHOTS,
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"ok"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            409,
            "AlreadyExists",
            &[r#"snapshots.nfsprov.dev "ok" already exists"#],
        ),
    },
    Case {
        name: "a replace without kind is unrecognized",
        method: "PUT",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: JSON,
        body: r#"{"metadata":{"name":"ok"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the object provided is unrecognized (must be of type Snapshot): ",
                KIND_MISSING,
            ],
        ),
    },
    Case {
        name: "a replace of another name than the URL's is refused",
        method: "PUT",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"other"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &["the name of the object (other) does not match the name on the URL (ok)"],
        ),
    },
    Case {
        name: "a status replace without kind is unrecognized",
        method: "PUT",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok/status",
        content_type: JSON,
        body: r#"{"metadata":{"name":"ok"},"status":{"readyToUse":true}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                "the object provided is unrecognized (must be of type Snapshot): ",
                KIND_MISSING,
            ],
        ),
    },
    Case {
        name: "a custom object is never replaced without a resourceVersion",
        method: "PUT",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok/status",
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"ok"},"spec":{"source":{"persistentVolumeClaimName":"c"}},"status":{"readyToUse":true}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"snapshots.nfsprov.dev "ok" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"#,
            ],
        ),
    },
    Case {
        name: "a merge patch of the status subresource writes the status",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok/status",
        content_type: MERGE,
        body: r#"{"status":{"method":"copy"}}"#,
        answer: ok(200, &[("/status/method", "copy")]),
    },
    Case {
        name: "a patch of the main resource leaves the status alone",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: MERGE,
        body: r#"{"metadata":{"labels":{"l":"v"}},"status":{"method":"reflink"}}"#,
        answer: ok(
            200,
            &[("/status/method", "copy"), ("/metadata/labels/l", "v")],
        ),
    },
    Case {
        name: "a patch of the status subresource leaves the labels alone",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok/status",
        content_type: MERGE,
        body: r#"{"metadata":{"labels":{"l":"w"}},"status":{"method":"reflink"}}"#,
        answer: ok(
            200,
            &[("/status/method", "reflink"), ("/metadata/labels/l", "v")],
        ),
    },
    Case {
        name: "the source of a Snapshot cannot change",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: MERGE,
        body: r#"{"spec":{"source":{"persistentVolumeClaimName":"other"}}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"Snapshot.nfsprov.dev "ok" is invalid: spec.source: Invalid value: the source of a snapshot cannot change"#,
            ],
        ),
    },
    Case {
        name: "a merge patch naming another kind is an invalid kind",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: MERGE,
        body: r#"{"kind":"Foo"}"#,
        answer: refused(
            422,
            "Invalid",
            &[r#"Foo.nfsprov.dev "ok" is invalid: kind: Invalid value: "Foo": must be Snapshot"#],
        ),
    },
    Case {
        name: "a patch with a stale resourceVersion conflicts",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: MERGE,
        body: r#"{"metadata":{"resourceVersion":"1"}}"#,
        answer: refused(
            409,
            "Conflict",
            &[
                r#"Operation cannot be fulfilled on snapshots.nfsprov.dev "ok": the object has been modified; please apply your changes to the latest version and try again"#,
            ],
        ),
    },
    Case {
        name: "custom objects take no strategic merge patch",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: STRATEGIC,
        body: r#"{"metadata":{"labels":{"a":"b"}}}"#,
        answer: refused(
            415,
            "UnsupportedMediaType",
            &[
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
            ],
        ),
    },
    Case {
        name: "an apply needs a field manager",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/ok",
        content_type: APPLY,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"ok"}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"PatchOptions.meta.k8s.io "" is invalid: fieldManager: Required value: is required for apply patch"#,
            ],
        ),
    },
    Case {
        name: "an apply without apiVersion and kind is an invalid object type",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/applied?fieldManager=parity",
        content_type: APPLY,
        body: r#"{"metadata":{"name":"applied"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(400, "BadRequest", &["invalid object type: /, Kind="]),
    },
    Case {
        name: "an apply of a typed object creates it",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/applied?fieldManager=first",
        content_type: APPLY,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"applied","labels":{"owner":"first"}},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: ok(201, &[("/metadata/labels/owner", "first")]),
    },
    Case {
        name: "another manager's apply of an owned field conflicts",
        method: "PATCH",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}/snapshots/applied?fieldManager=second",
        content_type: APPLY,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"applied","labels":{"owner":"second"}}}"#,
        answer: refused(
            409,
            "Conflict",
            &[r#"Apply failed with 1 conflict: conflict with "first": .metadata.labels.owner"#],
        ),
    },
    Case {
        name: "a namespace that does not exist is not found",
        method: "POST",
        path: "/apis/nfsprov.dev/v1alpha1/namespaces/{ns}-gone/snapshots",
        content_type: JSON,
        body: r#"{"apiVersion":"nfsprov.dev/v1alpha1","kind":"Snapshot","metadata":{"name":"a"},"spec":{"source":{"persistentVolumeClaimName":"c"}}}"#,
        answer: refused(404, "NotFound", &[r#"namespaces "{ns}-gone" not found"#]),
    },
    // Built-in kinds take their type from the URL when the body has none.
    Case {
        name: "a claim without apiVersion and kind is created",
        method: "POST",
        path: CLAIMS,
        content_type: JSON,
        body: r#"{"metadata":{"name":"c"},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}},"storageClassName":"parity-{u}"}}"#,
        answer: ok(
            201,
            &[("/kind", "PersistentVolumeClaim"), ("/apiVersion", "v1")],
        ),
    },
    Case {
        name: "a claim is replaced without a resourceVersion",
        method: "PUT",
        path: "/api/v1/namespaces/{ns}/persistentvolumeclaims/c",
        content_type: JSON,
        body: r#"{"metadata":{"name":"c","labels":{"l":"v"}},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}},"storageClassName":"parity-{u}"}}"#,
        answer: ok(200, &[("/metadata/labels/l", "v")]),
    },
    Case {
        name: "a claim's spec is immutable while it is not bound",
        method: "PATCH",
        path: "/api/v1/namespaces/{ns}/persistentvolumeclaims/c",
        content_type: MERGE,
        body: r#"{"spec":{"accessModes":["ReadWriteOnce"]}}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"PersistentVolumeClaim "c" is invalid: spec: Forbidden: spec is immutable after creation except resources.requests and volumeAttributesClassName for bound claims"#,
            ],
        ),
    },
    Case {
        name: "a claim posted as another kind cannot be handled",
        method: "POST",
        path: CLAIMS,
        content_type: JSON,
        body: r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"c2"},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[r#"Pod in version "v1" cannot be handled as a PersistentVolumeClaim"#],
        ),
    },
    Case {
        name: "a claim of an unknown version cannot be handled",
        method: "POST",
        path: CLAIMS,
        content_type: JSON,
        body: r#"{"apiVersion":"v2","kind":"PersistentVolumeClaim","metadata":{"name":"c2"},"spec":{"accessModes":["ReadWriteMany"],"resources":{"requests":{"storage":"1Gi"}}}}"#,
        answer: refused(
            400,
            "BadRequest",
            &[
                r#"PersistentVolumeClaim in version "v2" cannot be handled as a PersistentVolumeClaim"#,
            ],
        ),
    },
    Case {
        name: "a StorageClass is created",
        method: "POST",
        path: "/apis/storage.k8s.io/v1/storageclasses",
        content_type: JSON,
        body: r#"{"metadata":{"name":"parity-{u}"},"provisioner":"parity.nfsprov.dev/none"}"#,
        answer: ok(
            201,
            &[
                ("/reclaimPolicy", "Delete"),
                ("/volumeBindingMode", "Immediate"),
            ],
        ),
    },
    Case {
        name: "a StorageClass's provisioner is immutable",
        method: "PATCH",
        path: "/apis/storage.k8s.io/v1/storageclasses/parity-{u}",
        content_type: MERGE,
        body: r#"{"provisioner":"parity.nfsprov.dev/other"}"#,
        answer: refused(
            422,
            "Invalid",
            &[
                r#"StorageClass.storage.k8s.io "parity-{u}" is invalid: provisioner: Invalid value: "parity.nfsprov.dev/other": field is immutable"#,
            ],
        ),
    },
    Case {
        name: "a StorageClass is deleted",
        method: "DELETE",
        path: "/apis/storage.k8s.io/v1/storageclasses/parity-{u}",
        content_type: JSON,
        body: "",
        answer: ok(200, &[]),
    },
];

/// The first 30 bytes of a body as the real server quotes it in a decoding error.
fn summary(body: &str) -> String {
    if body.len() > 30 {
        format!("{} ...", &body[..30])
    } else {
        body.to_owned()
    }
}

fn expand(text: &str, namespace: &str, unique: &str) -> String {
    text.replace("{ns}", namespace).replace("{u}", unique)
}

/// Sends one case; the answer's status code and JSON body.
async fn send(
    client: &kube::Client,
    case: &Case,
    namespace: &str,
    unique: &str,
) -> anyhow::Result<(u16, String, Value)> {
    let body = expand(case.body, namespace, unique);
    let request = http::Request::builder()
        .method(case.method)
        .uri(expand(case.path, namespace, unique))
        .header(http::header::CONTENT_TYPE, case.content_type)
        .body(kube::client::Body::from(body.clone().into_bytes()))?;
    let response = client.send(request).await?;
    let code = response.status().as_u16();
    let bytes = response.into_body().collect_bytes().await?;
    let answer = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    Ok((code, body, answer))
}

/// How an answer differs from the expected one; `None` when it does not.
fn difference(
    case: &Case,
    sent: &str,
    namespace: &str,
    unique: &str,
    code: u16,
    answer: &Value,
) -> Option<String> {
    let expected = &case.answer;
    let mut wrong = Vec::new();
    if code != expected.code {
        wrong.push(format!("code {code}, not {}", expected.code));
    }
    if expected.code >= 400 {
        let reason = answer["reason"].as_str().unwrap_or("");
        if reason != expected.reason {
            wrong.push(format!("reason {reason:?}, not {:?}", expected.reason));
        }
        if answer["code"].as_u64() != Some(u64::from(expected.code)) {
            wrong.push(format!("Status code field {}", answer["code"]));
        }
        let message = answer["message"].as_str().unwrap_or("");
        for part in expected.message {
            let part = expand(part, namespace, unique)
                .replace("{body}", sent)
                .replace("{summary}", &summary(sent));
            if !message.contains(&part) {
                wrong.push(format!("message {message:?} lacks {part:?}"));
            }
        }
    }
    for (pointer, value) in expected.holds {
        let held = answer.pointer(pointer).and_then(Value::as_str);
        if held != Some(*value) {
            wrong.push(format!("{pointer} is {held:?}, not {value:?}"));
        }
    }
    (!wrong.is_empty()).then(|| wrong.join("; "))
}

#[tokio::test(flavor = "multi_thread")]
async fn the_simulator_answers_each_request_as_the_real_api_server() -> anyhow::Result<()> {
    let api = KubeApi::start().await?;
    let client = api.client().await?;
    let unique = format!(
        "{}-{}",
        std::process::id(),
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .subsec_nanos()
    );
    let namespace = format!("parity-{unique}");
    let namespaces = Api::<Namespace>::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}}))?,
        )
        .await?;
    let mut differences = BTreeMap::new();
    for case in CASES {
        let (code, sent, answer) = send(&client, case, &namespace, &unique).await?;
        if let Some(wrong) = difference(case, &sent, &namespace, &unique, code, &answer) {
            differences.insert(case.name, format!("{wrong}\n    answer: {answer}"));
        }
    }
    // Also after a failed case: one real cluster serves every test.
    let classes = Api::<StorageClass>::all(client.clone());
    let _ = classes
        .delete(&format!("parity-{unique}"), &DeleteParams::default())
        .await;
    namespaces
        .delete(&namespace, &DeleteParams::default())
        .await?;
    let tier = if api.is_shared() {
        "the real API server"
    } else {
        "the simulator"
    };
    assert!(
        differences.is_empty(),
        "{} of {} cases answered otherwise by {tier}:\n{}",
        differences.len(),
        CASES.len(),
        differences
            .iter()
            .map(|(name, wrong)| format!("- {name}: {wrong}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    Ok(())
}
