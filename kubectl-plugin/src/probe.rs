//! What each configured agent says about itself, asked concurrently.

use nfsprov_api_types::client::{AgentClient, ClientError};
use nfsprov_api_types::{AgentInfo, Health, MAX_PAGE_LIMIT, Volume};

use crate::credentials::Agents;

/// One agent's answers; each call's failure is kept separately, so an agent that is up
/// but not ready still shows its version.
pub(crate) struct AgentProbe {
    pub name: String,
    pub secret: String,
    pub url: Option<String>,
    /// Its Secret made a client; when not, nothing was asked and `ready` says why.
    pub readable: bool,
    pub ready: Result<Health, String>,
    pub info: Result<AgentInfo, String>,
    /// Only asked for when the command needs the listing.
    pub volumes: Option<Result<VolumeListing, String>>,
}

/// What a command keeps of one agent's volumes, read a page at a time: how many there
/// are, and only the volumes it needs, so an agent of 100,000 volumes is never held whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeListing {
    pub count: usize,
    pub kept: Vec<Volume>,
}

/// Which of an agent's volumes (the agent's name, then the volume) a command keeps.
pub(crate) type Keep<'a> = &'a (dyn Fn(&str, &Volume) -> bool + Sync);

/// Whether the agents' volumes are listed, and which are kept of them.
#[derive(Clone, Copy)]
pub(crate) enum Volumes<'a> {
    NotListed,
    /// Listed page by page; those `Keep` says yes to are kept.
    Listed(Keep<'a>),
}

impl Volumes<'_> {
    /// Only counted.
    pub(crate) const COUNTED: Volumes<'static> = Volumes::Listed(&|_, _| false);
}

/// Pages through the volumes of agent `agent`, `page_size` at a time, keeping those
/// `keep` says yes to.
pub async fn list_volumes(
    client: &AgentClient,
    agent: &str,
    page_size: u32,
    keep: Keep<'_>,
) -> Result<VolumeListing, String> {
    let mut listing = VolumeListing::default();
    client
        .for_each_volume_page(page_size, None, |page| {
            listing.count += page.len();
            listing
                .kept
                .extend(page.into_iter().filter(|volume| keep(agent, volume)));
        })
        .await
        .map_err(|e| e.to_string())?;
    Ok(listing)
}

impl AgentProbe {
    /// Why it is not healthy, in one phrase.
    pub(crate) fn problem(&self) -> Option<String> {
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
    volumes: Volumes<'_>,
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
                match volumes {
                    Volumes::NotListed => None,
                    Volumes::Listed(keep) => {
                        Some(list_volumes(client, name, MAX_PAGE_LIMIT, keep).await)
                    }
                }
            };
            tokio::join!(ready, info, volumes)
        }
        Err(e) => (
            Err(e.clone()),
            Err(e.clone()),
            match volumes {
                Volumes::NotListed => None,
                Volumes::Listed(_) => Some(Err(e.clone())),
            },
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
pub(crate) async fn probe_all(agents: &Agents, volumes: Volumes<'_>) -> Vec<AgentProbe> {
    futures::future::join_all(agents.agents.iter().map(|a| {
        probe_one(
            &a.name,
            &a.secret,
            a.url.as_deref(),
            a.client.as_ref(),
            volumes,
        )
    }))
    .await
}
