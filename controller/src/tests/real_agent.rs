//! The controller library against the REAL agent (`nfsprov_agent_testkit::TestAgent`: real
//! HTTPS with mTLS and token, a real export root in a temp dir) and a mocked Kubernetes API:
//! the directory must really appear on disk when a claim is provisioned and really leave
//! its place when the released PV is deleted or archived.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use http::Method;
use nfsprov_agent_testkit::TestAgent;
use serde_json::json;

use crate::agents::AgentRegistry;
use crate::metrics::Metrics;
use crate::objects::{self, CachedClaim, CachedVolume};
use crate::reconciler::reconcile;
use crate::tests::builders::*;
use crate::tests::mock_api::*;

fn pv_uri() -> String {
    format!("/api/v1/persistentvolumes/{PV_NAME}?")
}

fn finalize_and_delete(fresh: &k8s_openapi::api::core::v1::PersistentVolume) -> Vec<Call> {
    vec![
        Call::new(
            Method::GET,
            &format!("/api/v1/persistentvolumes/{PV_NAME}"),
            BodyCheck::Exact(serde_json::Value::Null),
        )
        .respond(serde_json::to_value(fresh).unwrap()),
        Call::new(
            Method::PATCH,
            &pv_uri(),
            BodyCheck::Exact(json!({
                "metadata": {"finalizers": ["kubernetes.io/pv-protection"], "resourceVersion": "200"}
            })),
        ),
        Call::new(
            Method::DELETE,
            &pv_uri(),
            BodyCheck::Subset(json!({"preconditions": {"uid": "pv-uid-1"}})),
        )
        .respond(json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200})),
    ]
}

/// Provisions the test claim through the real agent; returns the volume's directory.
async fn provision(agent: &TestAgent, root: &Path, params: &[(&str, &str)], path: &str) -> PathBuf {
    let registry = AgentRegistry::new(&[agent.connection()], Arc::new(Metrics::new())).unwrap();
    let (ctx, api) = context(registry, vec![class("nfs", params)], vec![]);
    let server = api.run(vec![
        Call::event("team-a", "Normal", "Provisioning", "data", "team-a/data"),
        Call::new(
            Method::POST,
            "/api/v1/persistentvolumes?",
            BodyCheck::Subset(json!({
                "metadata": {"name": PV_NAME, "annotations": {
                    "nfsprov.dev/agent": "test",
                    "nfsprov.dev/path": path,
                }},
                "spec": {"nfs": {
                    "server": "127.0.0.1",
                    "path": format!("{}/{path}", root.display()),
                }},
            })),
        )
        .status(201),
        Call::event("team-a", "Normal", "ProvisioningSucceeded", "data", PV_NAME),
    ]);
    reconcile::<CachedClaim>(Arc::new(claim("nfs").into()), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
    root.join(path)
}

async fn delete(agent: &TestAgent, on_delete: &str, path: &str) {
    let registry = AgentRegistry::new(&[agent.connection()], Arc::new(Metrics::new())).unwrap();
    let (ctx, api) = context(registry, vec![class("nfs", &[])], vec![]);
    let mut volume = released_pv(Some(on_delete), path);
    volume
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(objects::ANN_AGENT.into(), "test".into());
    let server = api.run(finalize_and_delete(&volume));
    reconcile::<CachedVolume>(Arc::new(cached(volume)), ctx.clone())
        .await
        .unwrap();
    finish(ctx, server).await;
}

fn find_file(dir: &Path, name: &str) -> Option<PathBuf> {
    for entry in std::fs::read_dir(dir).ok()?.flatten() {
        let path = entry.path();
        if entry.file_type().ok()?.is_dir() {
            if let Some(found) = find_file(&path, name) {
                return Some(found);
            }
        } else if entry.file_name() == name {
            return Some(path);
        }
    }
    None
}

#[tokio::test]
async fn directory_appears_then_is_deleted() {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let params = [
        ("agent", "test"),
        ("pathPattern", "${.PVC.namespace}/${.PVC.name}"),
        ("onDelete", "delete"),
    ];
    let dir = provision(&agent, root.path(), &params, "team-a/data").await;
    assert!(dir.is_dir(), "{} was not created", dir.display());
    std::fs::write(dir.join("payload"), "hello").unwrap();

    delete(&agent, "delete", "team-a/data").await;
    assert!(!dir.exists(), "{} is still there", dir.display());
    assert_eq!(
        find_file(root.path(), "payload"),
        None,
        "data survived a delete"
    );
}

#[tokio::test]
async fn directory_appears_then_is_archived() {
    let root = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(root.path()).await.unwrap();
    let params = [("pathPattern", "${.PVC.namespace}/${.PVC.name}")];
    let dir = provision(&agent, root.path(), &params, "team-a/data").await;
    assert!(dir.is_dir(), "{} was not created", dir.display());
    std::fs::write(dir.join("payload"), "keep me").unwrap();

    delete(&agent, "archive", "team-a/data").await;
    assert!(!dir.exists(), "{} is still in place", dir.display());
    let archived = find_file(root.path(), "payload").expect("archived data is kept");
    assert_eq!(std::fs::read_to_string(archived).unwrap(), "keep me");
}
