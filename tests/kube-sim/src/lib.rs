//! A strict in-process Kubernetes API simulator for nfsprov's tests: kube-apiserver for the
//! kinds the provisioner uses, plus kube-controller-manager's PV binder. It speaks the real
//! HTTP API to an unmodified kube-rs client. Test infrastructure only.

pub mod api;
pub mod binder;
pub mod claim_validation;
pub mod custom;
pub mod discovery;
pub mod errors;
pub mod events;
pub mod expander;
pub mod faults;
pub mod handlers;
pub mod kubeconfig;
pub mod list;
pub mod managed;
pub mod meta;
pub mod names;
pub mod patch;
pub mod quantity;
pub mod recorder;
pub mod resize_admission;
pub mod resources;
pub mod schema;
pub mod selectors;
pub mod store;
pub mod validate;
pub mod watch;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use crate::faults::{FaultControl, InjectedError};
use crate::handlers::AppState;
use crate::store::Store;

/// How to run a [`Simulator`].
#[derive(Clone, Debug)]
pub struct SimOptions {
    /// Address to listen on; port 0 picks a free port on each fresh start (a restart
    /// reuses the port first bound).
    pub address: SocketAddr,
    /// Run the PV binder, PVC/PV protection and their admission (kube-controller-manager's
    /// part). Off, claims and volumes are only what clients write.
    pub binder: bool,
    /// Watch events kept per kind for resuming watches; older versions get `410 Gone`.
    pub watch_history: usize,
    /// Upper bound of a watch request's duration (the real server's is 30-60 minutes).
    pub max_watch_timeout: Duration,
    /// How often watches that asked for bookmarks get one (the real server: about 1/min).
    pub bookmark_interval: Duration,
    /// The binder's periodic full resync (kube-controller-manager's is 15 s).
    pub resync_interval: Duration,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            address: SocketAddr::from(([127, 0, 0, 1], 0)),
            binder: true,
            watch_history: 10_000,
            max_watch_timeout: Duration::from_secs(1800),
            bookmark_interval: Duration::from_secs(5),
            resync_interval: Duration::from_secs(15),
        }
    }
}

struct Running {
    shutdown: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

/// A running simulator. State (objects, resourceVersions, watch history) lives as long as
/// this value, across [`Simulator::restart`].
pub struct Simulator {
    addr: SocketAddr,
    state: Arc<AppState>,
    faults: Arc<FaultControl>,
    server: Option<Running>,
    controllers: JoinHandle<()>,
}

impl Simulator {
    pub async fn start(options: SimOptions) -> anyhow::Result<Simulator> {
        let store = Arc::new(Store::new(options.watch_history));
        let faults = Arc::new(FaultControl::new());
        let api = api::Api::new(store.clone(), options.binder);
        let state = Arc::new(AppState {
            api: api.clone(),
            faults: faults.clone(),
            continues: list::ContinueCache::default(),
            max_watch_timeout: options.max_watch_timeout,
            bookmark_interval: options.bookmark_interval,
        });
        bootstrap(&api)?;
        let listener = TcpListener::bind(options.address)
            .await
            .with_context(|| format!("binding {}", options.address))?;
        let addr = listener.local_addr()?;
        let server = serve(listener, state.clone());
        let controllers = tokio::spawn(binder::run(api, options.binder, options.resync_interval));
        Ok(Simulator {
            addr,
            state,
            faults,
            server: Some(server),
            controllers,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn kubeconfig_yaml(&self) -> String {
        kubeconfig::kubeconfig_yaml(&self.url())
    }

    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A stock kube client configured from [`Simulator::kubeconfig_yaml`].
    pub async fn client(&self) -> kube::Client {
        match self.try_client().await {
            Ok(c) => c,
            // The kubeconfig is generated here; failing to load it is a bug in this crate.
            Err(e) => panic!("kube client for the simulator: {e:#}"),
        }
    }

    pub async fn try_client(&self) -> anyhow::Result<kube::Client> {
        let kc = kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml())?;
        let config =
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await?;
        Ok(kube::Client::try_from(config)?)
    }

    pub fn faults(&self) -> &FaultControl {
        &self.faults
    }

    /// Direct access to the API semantics (no HTTP), for test setup and assertions.
    pub fn api(&self) -> &api::Api {
        &self.state.api
    }

    /// Forget all watch history, as an etcd compaction: any watch from an older
    /// resourceVersion gets `410 Gone` and must relist.
    pub fn compact(&self) {
        self.state.api.store.compact();
    }

    /// Stop serving (open connections and watches are cut), then serve again on the same
    /// address with the same objects and resourceVersions, like an API server restart.
    pub async fn restart(&mut self) {
        self.stop_server().await;
        // The port was ours a moment ago; another process grabbing it in between would be a
        // test environment problem, so keep trying briefly rather than fail at once.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    tracing::debug!("rebinding {}: {e}", self.addr);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(e) => panic!("rebinding {} after restart: {e}", self.addr),
            }
        };
        self.server = Some(serve(listener, self.state.clone()));
    }

    async fn stop_server(&mut self) {
        if let Some(r) = self.server.take() {
            let _ = r.shutdown.send(());
            // Watches hold their connections open; ending them lets the graceful shutdown
            // finish.
            self.faults.drop_watches();
            let mut task = r.task;
            if tokio::time::timeout(Duration::from_secs(5), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }
    }

    pub async fn shutdown(mut self) {
        self.stop_server().await;
        self.controllers.abort();
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        self.controllers.abort();
        if let Some(r) = self.server.take() {
            r.task.abort();
        }
    }
}

fn serve(listener: TcpListener, state: Arc<AppState>) -> Running {
    let (tx, rx) = oneshot::channel();
    let app = handlers::router(state);
    let task = tokio::spawn(async move {
        let res = axum::serve(listener, app)
            .with_graceful_shutdown(async {
                let _ = rx.await;
            })
            .await;
        if let Err(e) = res {
            tracing::warn!("simulator server ended: {e}");
        }
    });
    Running { shutdown: tx, task }
}

/// The namespaces every cluster has.
fn bootstrap(api: &api::Api) -> anyhow::Result<()> {
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        api.create_as(
            resources::Kind::Namespace,
            "",
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
            false,
            "kube-apiserver",
        )
        .map_err(|e| anyhow::anyhow!("creating namespace {ns}: {e}"))?;
    }
    Ok(())
}
