//! What each configured agent says about itself, asked concurrently.

use nfsprov_api_types::client::{AgentClient, ClientError};
use nfsprov_api_types::{AgentInfo, Health, Volume};

use crate::credentials::Agents;

/// One agent's answers; each call's failure is kept separately, so an agent that is up
/// but not ready still shows its version.
pub struct AgentProbe {
    pub name: String,
    pub secret: String,
    pub url: Option<String>,
    /// Its Secret made a client; when not, nothing was asked and `ready` says why.
    pub readable: bool,
    pub ready: Result<Health, String>,
    pub info: Result<AgentInfo, String>,
    /// Only asked for when the command needs the listing.
    pub volumes: Option<Result<Vec<Volume>, String>>,
}

impl AgentProbe {
    /// Reachable and ready.
    pub fn healthy(&self) -> bool {
        self.ready.as_ref().is_ok_and(|h| h.status == "ok")
    }

    /// Why it is not healthy, in one phrase.
    pub fn problem(&self) -> Option<String> {
        match &self.ready {
            Ok(h) if h.status == "ok" => None,
            Ok(h) => Some(format!(
                "not ready: {}",
                h.reason.as_deref().unwrap_or("no reason given")
            )),
            Err(e) => Some(e.clone()),
        }
    }
}

async fn probe_one(
    name: &str,
    secret: &str,
    url: Option<&str>,
    client: Result<&AgentClient, &String>,
    with_volumes: bool,
) -> AgentProbe {
    let (ready, info, volumes) = match client {
        Ok(client) => {
            let ready = async {
                // readyz answers 503 with a Health body when not ready, which the client
                // reports as an unexpected answer; it is still the agent's answer.
                match client.readyz().await {
                    Ok(h) => Ok(h),
                    Err(ClientError::UnexpectedResponse { status: 503, body }) => {
                        serde_json::from_str::<Health>(&body).map_err(|_| {
                            format!("agent answered 503 with an unexpected body: {body}")
                        })
                    }
                    Err(e) => Err(e.to_string()),
                }
            };
            let info = async { client.info(None).await.map_err(|e| e.to_string()) };
            let volumes = async {
                if with_volumes {
                    Some(client.list_volumes(None).await.map_err(|e| e.to_string()))
                } else {
                    None
                }
            };
            tokio::join!(ready, info, volumes)
        }
        Err(e) => (
            Err(e.clone()),
            Err(e.clone()),
            with_volumes.then(|| Err(e.clone())),
        ),
    };
    AgentProbe {
        name: name.to_owned(),
        secret: secret.to_owned(),
        url: url.map(str::to_owned),
        readable: client.is_ok(),
        ready,
        info,
        volumes,
    }
}

/// Asks every agent at once.
pub async fn probe_all(agents: &Agents, with_volumes: bool) -> Vec<AgentProbe> {
    futures::future::join_all(agents.agents.iter().map(|a| {
        probe_one(
            &a.name,
            &a.secret,
            a.url.as_deref(),
            a.client.as_ref(),
            with_volumes,
        )
    }))
    .await
}
