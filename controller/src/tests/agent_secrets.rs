//! Reading the agents from their Secrets: a broken or duplicate Secret is named and leaves
//! the others alone, a Secret read as before keeps its agent, a changed one (a rotated
//! token) makes a new client that shares the reconcile slots, and a class naming a
//! missing agent learns what is wrong with its Secret. The agents are `MockAgent`s
//! (in-test HTTPS fakes) reached with the clients the Secrets make.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;

use crate::agent_secrets::read;
use crate::agents::{AgentRegistry, AgentSource, SelectError};
use crate::metrics::Metrics;
use crate::tests::mock_agent::MockAgent;

fn secret(name: &str, data: &[(&str, &[u8])]) -> Arc<Secret> {
    let mut secret = Secret::default();
    secret.metadata.name = Some(name.to_owned());
    secret.data = Some(
        data.iter()
            .map(|(k, v)| ((*k).to_owned(), ByteString(v.to_vec())))
            .collect::<BTreeMap<_, _>>(),
    );
    Arc::new(secret)
}

/// The Secret `nfsprov-agent init` would print for `agent`, token-only.
fn agent_secret(name: &str, agent: &MockAgent, token: &str) -> Arc<Secret> {
    let config = &agent.config;
    let settings = format!(
        "name = \"{}\"\nurl = \"{}\"\nca_file = \"{0}-ca.pem\"\ntoken_file = \"{0}-token\"\n",
        config.name, config.url
    );
    let ca = std::fs::read(&config.ca_file).unwrap();
    secret(
        name,
        &[
            (&format!("{}.toml", config.name), settings.as_bytes()),
            (&format!("{}-ca.pem", config.name), &ca),
            (&format!("{}-token", config.name), token.as_bytes()),
        ],
    )
}

#[tokio::test]
async fn broken_secrets_are_named_and_the_others_work() {
    let nfs1 = MockAgent::start("nfs1").await;
    let token = std::fs::read_to_string(nfs1.config.token_file.as_ref().unwrap()).unwrap();
    let registry = AgentRegistry::empty(
        AgentSource::Secrets {
            namespace: "nfsprov".into(),
        },
        Arc::new(Metrics::new()),
        4,
    );
    let good = agent_secret("nfsprov-agent-nfs1", &nfs1, &token);
    let broken = secret(
        "nfsprov-agent-nfs2",
        &[(
            "nfs2.toml",
            b"name = \"nfs2\"\nurl = \"https://nfs2:8443\"\nca_file = \"nfs2-ca.pem\"\ntoken_file = \"nfs2-token\"\n",
        )],
    );
    let twice = agent_secret("zz-copy-of-nfs1", &nfs1, &token);
    let empty = secret("nfsprov-agent-empty", &[]);
    let secrets = vec![twice, broken, good, empty];
    let reading = read(&secrets, &registry);
    assert_eq!(reading.agents.keys().collect::<Vec<_>>(), ["nfs1"]);
    assert_eq!(
        reading.invalid.keys().collect::<Vec<_>>(),
        [
            "nfsprov-agent-empty",
            "nfsprov-agent-nfs2",
            "zz-copy-of-nfs1"
        ]
    );
    assert_eq!(
        reading.invalid["zz-copy-of-nfs1"],
        "key nfs1.toml: agent nfs1 is already configured by Secret nfsprov-agent-nfs1"
    );
    assert_eq!(
        reading.invalid["nfsprov-agent-empty"],
        "no *.toml key with agent settings"
    );
    registry.install(reading.agents, reading.problems);
    // The class naming the broken agent is told what is wrong with its Secret.
    let err = registry
        .select(&["nfs2".to_owned()], "rid")
        .await
        .unwrap_err();
    assert!(matches!(err, SelectError::Unknown { .. }));
    assert!(
        err.to_string().contains(
            "(its Secret nfsprov-agent-nfs2: key nfs2.toml: ca_file names key nfs2-ca.pem, which the Secret does not hold)"
        ),
        "{err}"
    );
    let first = registry.get("nfs1").unwrap();
    first.export("rid").await.unwrap();

    // Read again unchanged: the same agent, its cache and slots with it.
    let reading = read(&secrets, &registry);
    assert!(Arc::ptr_eq(&reading.agents["nfs1"], &first));

    // A rotated token: a new client, the same slots.
    let rotated = vec![agent_secret("nfsprov-agent-nfs1", &nfs1, "not-the-token")];
    let reading = read(&rotated, &registry);
    let second = reading.agents["nfs1"].clone();
    assert!(!Arc::ptr_eq(&second, &first));
    assert!(Arc::ptr_eq(&second.slots(), &first.slots()));
    // The mock agent checks the token: the new client presents the new one.
    let refused = second.export("rid").await.unwrap_err().to_string();
    assert!(refused.contains("401"), "{refused}");
    registry.install(reading.agents, reading.problems);
    assert!(Arc::ptr_eq(&registry.get("nfs1").unwrap(), &second));
}
