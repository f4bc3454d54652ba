//! Generated requests against the real agent over HTTPS: whatever the path or body, the
//! agent answers with a client error or a success, never a server error, and nothing
//! appears outside the export root.

mod common;

use std::path::Path;

use nfsprov_agent::init::files;
use nfsprov_agent_testkit::TestAgent;
use proptest::prelude::*;

struct Fixture {
    runtime: tokio::runtime::Runtime,
    agent: TestAgent,
    http: reqwest::Client,
    token: String,
    _outside: tempfile::TempDir,
}

fn fixture() -> Fixture {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let outside = tempfile::tempdir().unwrap();
    let root = outside.path().join("export");
    std::fs::create_dir(&root).unwrap();
    let agent = runtime.block_on(TestAgent::start(&root)).unwrap();
    let ca = std::fs::read(agent.credentials_dir().join(files::CA_CERT)).unwrap();
    let http = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .build()
        .unwrap();
    let token = std::fs::read_to_string(agent.credentials_dir().join(files::TOKEN))
        .unwrap()
        .trim()
        .to_owned();
    Fixture {
        runtime,
        agent,
        http,
        token,
        _outside: outside,
    }
}

/// Path segments as a hostile client would send them: encodings of separators and dots,
/// traversal, and ordinary names.
fn raw_path() -> impl Strategy<Value = String> {
    proptest::collection::vec(
        prop_oneof![
            8 => "[a-z0-9]{1,8}",
            1 => Just("..".to_owned()),
            1 => Just(".".to_owned()),
            1 => Just("%2e%2e".to_owned()),
            1 => Just("%2F".to_owned()),
            1 => Just("..%2f..".to_owned()),
            1 => Just("%00".to_owned()),
            1 => Just(".nfsprov".to_owned()),
            1 => Just(".archive".to_owned()),
            1 => Just("".to_owned()),
            1 => ".{1,6}".prop_map(|s| urlencode(&s)),
        ],
        1..6,
    )
    .prop_map(|segments| segments.join("/"))
}

fn urlencode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        Just(br#"{"mode":"0750","capacity_bytes":1}"#.to_vec()),
        proptest::collection::vec(any::<u8>(), 0..64),
        (
            prop_oneof![
                Just("\"0777\"".to_owned()),
                Just("\"7777\"".to_owned()),
                Just("\"99999\"".to_owned()),
                Just("511".to_owned()),
                Just("-1".to_owned()),
                Just("null".to_owned()),
            ],
            prop_oneof![
                Just("0".to_owned()),
                Just("18446744073709551615".to_owned()),
                Just("-5".to_owned()),
                Just("1e30".to_owned())
            ],
            proptest::option::of(0u64..u64::from(u32::MAX) + 2),
        )
            .prop_map(|(mode, capacity, uid)| {
                let uid = uid.map_or(String::new(), |u| format!(",\"uid\":{u}"));
                format!("{{\"mode\":{mode},\"capacity_bytes\":{capacity}{uid}}}").into_bytes()
            }),
    ]
}

/// Every entry below `dir`, as paths relative to it.
fn entries(dir: &Path) -> Vec<std::path::PathBuf> {
    common::snapshot(dir).into_keys().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn no_request_makes_the_agent_fail_or_write_outside_its_root(
        method in prop_oneof![Just("PUT"), Just("GET"), Just("PATCH"), Just("DELETE"), Just("POST")],
        path in raw_path(),
        archive in any::<bool>(),
        payload in body(),
    ) {
        thread_local! {
            static FIXTURE: Fixture = fixture();
        }
        FIXTURE.with(|f| {
            let prefix = if archive && method == "POST" { "v1/archives" } else { "v1/volumes" };
            let url = format!("https://localhost:{}/{prefix}/{path}", f.agent.addr().port());
            let outside = f.agent.root().parent().unwrap();
            let before = entries(outside).into_iter().filter(|p| !p.starts_with("export")).count();
            let status = f.runtime.block_on(async {
                f.http
                    .request(method.parse().unwrap(), &url)
                    .bearer_auth(&f.token)
                    .header("content-type", "application/json")
                    .body(payload.clone())
                    .send()
                    .await
                    .map(|r| r.status().as_u16())
            });
            let status = status.unwrap_or(0);
            // reqwest itself refuses some URLs before sending (status 0).
            prop_assert!(status < 500, "{} {} -> {}", method, url, status);
            let after = entries(outside).into_iter().filter(|p| !p.starts_with("export")).count();
            prop_assert_eq!(before, after, "something appeared outside the export root");
            Ok(())
        })?;
    }
}
