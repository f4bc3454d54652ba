//! The router against the endpoint table: every route served is one of the table's, with
//! its method, and labelled by its template.

use std::collections::BTreeSet;
use std::path::Path as FsPath;
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request as HttpRequest, StatusCode};
use nfsprov_api_types::{ArchivePath, SnapshotName, VolumePath};
use tower::ServiceExt;

use super::*;
use crate::auth::Authenticator;
use crate::config::{AgentConfig, AuthConfig, LogFormat, TokenSection};
use crate::store::VolumeStore;

const TOKEN: &str = "table-test-token";

/// The agent's real state over a temporary export root, with one token.
fn state(dir: &FsPath) -> Arc<AppState> {
    let root = dir.join("export");
    std::fs::create_dir(&root).unwrap();
    let token = dir.join("token");
    std::fs::write(&token, TOKEN).unwrap();
    let config = AgentConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        export_root: root.clone(),
        nfs_server: "127.0.0.1".into(),
        nfs_path: root.display().to_string(),
        log_format: LogFormat::Text,
        cert_file: dir.join("unused-cert.pem"),
        key_file: dir.join("unused-key.pem"),
        auth: AuthConfig {
            client_ca_file: None,
            allowed_client_names: Vec::new(),
            tokens: vec![TokenSection::whole_root("controller", token)],
            certificate_scopes: Vec::new(),
            credentials_file: dir.join("credentials.toml"),
            disabled: false,
        },
        max_body_bytes: 64 * 1024,
        request_timeout: Duration::from_secs(30),
        max_connections: 16,
        max_tls_handshakes: 256,
        tls_handshake_timeout: Duration::from_secs(5),
        max_unauthenticated_connections: 512,
        max_unauthenticated_per_source: 128,
        unauthenticated_timeout: Duration::from_secs(5),
        header_read_timeout: Duration::from_secs(10),
        idle_timeout: Duration::from_secs(60),
        body_read_timeout: Duration::from_secs(10),
        max_concurrent_requests: 4,
        max_clone_jobs: 1,
        max_queued_jobs: 64,
        overcommit: Default::default(),
        max_snapshot_bytes_per_namespace: None,
        shutdown_grace: Duration::from_secs(1),
        min_free_bytes: 0,
        min_free_inodes: 0,
        quota: Default::default(),
        policy: Default::default(),
        archive: Default::default(),
        exports: Default::default(),
    };
    let store = Arc::new(VolumeStore::open(&root).unwrap());
    let auth = Authenticator::new(&config.auth, Box::new(|_| {})).unwrap();
    Arc::new(AppState::new(store, auth, &config))
}

/// The concrete path of an endpoint, its parameter filled with a valid sample.
fn sample_path(endpoint: Endpoint) -> String {
    match endpoint {
        Endpoint::GetArchive | Endpoint::DeleteArchive => endpoint
            .path_for(&ArchivePath::parse("table/probe/@20260101T000000.000000000Z").unwrap()),
        Endpoint::CreateSnapshot | Endpoint::GetSnapshot | Endpoint::DeleteSnapshot => {
            endpoint.path_for(&SnapshotName::parse("table-probe").unwrap())
        }
        _ if endpoint.takes_path() => endpoint.path_for(&VolumePath::parse("table/probe").unwrap()),
        _ => endpoint.path().to_owned(),
    }
}

async fn send(router: &Router, method: Method, path: &str) -> (StatusCode, String) {
    let request = HttpRequest::builder()
        .method(method)
        .uri(path)
        .header(header::AUTHORIZATION, format!("Bearer {TOKEN}"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from("{}"))
        .unwrap();
    let response = router.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let body = axum::body::to_bytes(response.into_body(), 1 << 20)
        .await
        .unwrap();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// What the router answers for a path or method none of its routes serves.
fn unrouted(status: StatusCode, body: &str) -> bool {
    status == StatusCode::METHOD_NOT_ALLOWED || body.contains("no such endpoint")
}

#[test]
fn every_routed_path_is_in_the_endpoint_table() {
    let dir = tempfile::tempdir().unwrap();
    let router = router(state(dir.path()), 4);
    // axum keeps no public list of its routes; its Debug output names the paths of
    // the path router (and the fallback router's, which holds only the fallback).
    let debug = format!("{router:?}");
    let (paths, _fallbacks) = debug
        .split_once("fallback_router")
        .expect("the router's Debug output names its fallback router");
    let routed: BTreeSet<&str> = paths
        .split('"')
        .skip(1)
        .step_by(2)
        .filter(|text| text.starts_with('/'))
        .collect();
    let table: BTreeSet<&str> = Endpoint::templates().collect();
    assert_eq!(routed, table, "routes served and the endpoint table differ");
}

#[tokio::test]
async fn every_endpoint_is_served_with_its_method_and_labelled_by_its_template() {
    let dir = tempfile::tempdir().unwrap();
    let state = state(dir.path());
    let router = router(state.clone(), 4);
    for endpoint in Endpoint::ALL {
        let path = sample_path(endpoint);
        let (status, body) = send(&router, endpoint.method(), &path).await;
        assert!(
            !unrouted(status, &body),
            "{endpoint:?} ({} {path}) is not served: {status} {body}",
            endpoint.method()
        );
    }
    let metrics = state.metrics.encode();
    for endpoint in Endpoint::ALL {
        let series = format!(
            "nfsprov_agent_http_requests_total{{method=\"{}\",route=\"{}\",",
            endpoint.method(),
            endpoint.template()
        );
        assert!(metrics.contains(&series), "{series} missing:\n{metrics}");
    }
    assert!(!metrics.contains("unmatched"), "{metrics}");

    // No method the table does not list is served on a template (GET brings HEAD).
    for template in Endpoint::templates() {
        let listed: Vec<Method> = Endpoint::ALL
            .into_iter()
            .filter(|e| e.template() == template)
            .map(Endpoint::method)
            .collect();
        let endpoint = Endpoint::ALL
            .into_iter()
            .find(|e| e.template() == template)
            .unwrap();
        let path = sample_path(endpoint);
        for method in [
            Method::GET,
            Method::PUT,
            Method::POST,
            Method::PATCH,
            Method::DELETE,
            Method::OPTIONS,
        ] {
            if listed.contains(&method) {
                continue;
            }
            let (status, body) = send(&router, method.clone(), &path).await;
            assert_eq!(
                status,
                StatusCode::METHOD_NOT_ALLOWED,
                "{method} {path} is served but not in the table: {body}"
            );
        }
    }
    // A path outside the table is answered by the fallback and labelled unmatched.
    let (status, body) = send(&router, Method::GET, "/v1/no-such-collection").await;
    assert!(unrouted(status, &body), "{status} {body}");
    assert!(state.metrics.encode().contains("route=\"unmatched\""));
}
