//! A whole nfsprov installation for one test: NFS server, agents, Kubernetes API and
//! controllers, plus the kubectl-like steps the scenarios take.

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Event, Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use serde_json::json;

use crate::agent::AgentProcess;
use crate::cluster::{ControllerProcess, KubeApi};
use crate::ganesha_dbus::{Ganesha, PrivateBus};
use crate::nfs::{NfsServer, nfs_url};

/// Namespace the scenarios create their claims in, on a simulator of their own.
pub const NAMESPACE: &str = "e2e";
/// The provisioner name the controllers run with, on a simulator of their own.
pub const PROVISIONER: &str = "nfsprov.dev/nfs";
/// Label of the StorageClasses one run made on a shared cluster, for its cleanup.
const RUN_LABEL: &str = "nfsprov.dev/e2e-run";
/// What a provisioned PV names its provisioner by.
const PROVISIONED_BY: &str = "pv.kubernetes.io/provisioned-by";

/// The names one installation uses. On a shared (real) cluster every run has its own
/// namespace, provisioner, class names and Lease, so runs never see each other's objects
/// and what one leaves behind cannot break the next.
#[derive(Debug, Clone)]
pub struct Names {
    /// Set on a shared cluster only.
    pub run: Option<String>,
    pub namespace: String,
    pub provisioner: String,
}

impl Names {
    fn for_api(api: &KubeApi) -> Self {
        if !api.is_shared() {
            return Self {
                run: None,
                namespace: NAMESPACE.to_owned(),
                provisioner: PROVISIONER.to_owned(),
            };
        }
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let run = format!(
            "{:x}{:x}{}",
            std::process::id(),
            nanos & 0xfff,
            NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        );
        Self {
            namespace: format!("e2e-{run}"),
            provisioner: format!("nfsprov.dev/e2e-{run}"),
            run: Some(run),
        }
    }

    /// The name a scenario's class `name` has in this run.
    pub fn class(&self, name: &str) -> String {
        self.cluster_scoped(name)
    }

    /// The name a scenario's cluster-scoped object `name` (a class, a Node) has in this
    /// run.
    pub fn cluster_scoped(&self, name: &str) -> String {
        match &self.run {
            Some(run) => format!("{name}-{run}"),
            None => name.to_owned(),
        }
    }

    /// The labels that mark a cluster-scoped object as this run's, for its cleanup.
    pub fn run_labels(&self) -> serde_json::Value {
        match &self.run {
            Some(run) => json!({ RUN_LABEL: run }),
            None => json!({}),
        }
    }

    /// What the controllers need to act on this run's objects only.
    fn controller_args(&self) -> Vec<String> {
        let mut args = vec![format!("--provisioner-name={}", self.provisioner)];
        if let Some(run) = &self.run {
            args.push(format!("--lease-name=nfsprov-e2e-{run}"));
        }
        args
    }
}

/// How to start one agent of a [`System`].
#[derive(Debug, Clone, Default)]
pub struct AgentSpec {
    pub name: String,
    /// An existing directory to serve (e.g. on a filesystem made by the test); a new
    /// directory in the system's temp dir when `None`.
    pub root: Option<PathBuf>,
    /// TOML appended to the agent's settings (e.g. a `[quota]` section).
    pub settings: String,
}

impl AgentSpec {
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            ..Self::default()
        }
    }
}

/// The NFS server of a [`System`].
pub enum NfsService {
    /// ganesha exporting each export root whole, as an operator exports a share by hand.
    Whole(NfsServer),
    /// ganesha on a private bus, whose exports the agent manages one per volume.
    PerVolume { ganesha: Ganesha, _bus: PrivateBus },
    /// The NFS server of another [`System`], whose agents this one shares (a second
    /// cluster on the same NFS server, see [`System::another_cluster`]); that System runs
    /// it.
    OfAnotherSystem { port: u16 },
}

impl NfsService {
    pub fn port(&self) -> u16 {
        match self {
            Self::Whole(server) => server.port(),
            Self::PerVolume { ganesha, .. } => ganesha.port(),
            Self::OfAnotherSystem { port } => *port,
        }
    }

    /// URL of `path` (absolute, as clients mount it) on this server.
    pub fn url(&self, path: &str) -> String {
        nfs_url("127.0.0.1", self.port(), path)
    }

    pub fn log_text(&self) -> String {
        match self {
            Self::Whole(server) => server.log_text(),
            Self::PerVolume { ganesha, .. } => ganesha.log_text(),
            Self::OfAnotherSystem { .. } => String::new(),
        }
    }
}

/// One agent with its own export root.
pub struct AgentUnderTest {
    pub process: AgentProcess,
    pub root: PathBuf,
    pub export: String,
}

pub struct System {
    pub nfs: NfsService,
    pub agents: Vec<AgentUnderTest>,
    pub api: KubeApi,
    pub controllers: Vec<ControllerProcess>,
    pub client: Client,
    pub agents_dir: PathBuf,
    pub names: Names,
    /// Whether this run made Nodes or Pods, which its cleanup must then remove.
    pub(crate) placed: std::sync::atomic::AtomicBool,
    _base: tempfile::TempDir,
}

impl System {
    /// Starts one export root and agent per name in `agent_names`, all exported by one
    /// NFS server, the API, and `controllers` controller processes.
    pub async fn start(
        agent_names: &[&str],
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_on(
            KubeApi::start().await?,
            agent_names,
            controllers,
            controller_args,
        )
        .await
    }

    /// As [`System::start`], against a given API.
    pub async fn start_on(
        api: KubeApi,
        agent_names: &[&str],
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        let specs: Vec<AgentSpec> = agent_names.iter().map(|n| AgentSpec::named(n)).collect();
        Self::start_with_agents(api, &specs, controllers, controller_args).await
    }

    /// As [`System::start_on`], with each agent described in full.
    pub async fn start_with_agents(
        api: KubeApi,
        specs: &[AgentSpec],
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_exporting(api, specs, controllers, controller_args, false).await
    }

    /// As [`System::start_on`], the NFS server serving NFSv3 too (see
    /// [`NfsServer::start_with_v3`]): for a person trying the system with libnfs-utils.
    pub async fn start_with_nfs_v3(
        api: KubeApi,
        agent_names: &[&str],
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        let specs: Vec<AgentSpec> = agent_names.iter().map(|n| AgentSpec::named(n)).collect();
        Self::start_exporting(api, &specs, controllers, controller_args, true).await
    }

    async fn start_exporting(
        api: KubeApi,
        specs: &[AgentSpec],
        controllers: usize,
        controller_args: &[&str],
        nfs_v3: bool,
    ) -> anyhow::Result<Self> {
        let base = tempfile::tempdir()?;
        let roots = export_roots(&base, specs)?;
        let exports: Vec<&std::path::Path> = roots.iter().map(|r| r.as_path()).collect();
        let server = if nfs_v3 {
            NfsServer::start_with_v3(&exports).await?
        } else {
            NfsServer::start(&exports).await?
        };
        let nfs = NfsService::Whole(server);
        Self::assemble(
            base,
            nfs,
            api,
            specs,
            roots,
            "",
            controllers,
            controller_args,
        )
        .await
    }

    /// One agent with the `ganesha` export manager: ganesha serves each volume by itself,
    /// to the clients its class admits, and nothing else (not the export root).
    pub async fn start_with_exports(
        api: KubeApi,
        spec: AgentSpec,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        Self::start_with_exports_settings(api, spec, "", controller_args).await
    }

    /// As [`System::start_with_exports`], with `exports_settings` (TOML keys, e.g.
    /// `reconcile_interval_seconds = 1`) added to the agent's `[exports]` section, which
    /// the ganesha manager's settings open.
    pub async fn start_with_exports_settings(
        api: KubeApi,
        spec: AgentSpec,
        exports_settings: &str,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        let base = tempfile::tempdir()?;
        let specs = [spec];
        let roots = export_roots(&base, &specs)?;
        let bus = PrivateBus::start().await?;
        let ganesha = Ganesha::start(&bus, &base.path().join("ganesha.d")).await?;
        let settings = format!("{}{exports_settings}\n", ganesha.agent_settings());
        let nfs = NfsService::PerVolume { ganesha, _bus: bus };
        Self::assemble(base, nfs, api, &specs, roots, &settings, 1, controller_args).await
    }

    /// Starts the agents (with `more_settings` after each one's own) once their NFS
    /// server is up, makes the namespace and starts the controllers.
    #[allow(clippy::too_many_arguments)]
    async fn assemble(
        base: tempfile::TempDir,
        nfs: NfsService,
        api: KubeApi,
        specs: &[AgentSpec],
        roots: Vec<PathBuf>,
        more_settings: &str,
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        let agents_dir = base.path().join("agents");
        let mut agents = Vec::new();
        for (spec, root) in specs.iter().zip(roots) {
            let export = root.display().to_string();
            let settings = [spec.settings.as_str(), more_settings]
                .into_iter()
                .filter(|s| !s.is_empty())
                .collect::<Vec<_>>()
                .join("\n");
            let process = AgentProcess::start_with_settings(
                &spec.name,
                &root,
                "127.0.0.1",
                &export,
                &settings,
            )
            .await?;
            process.write_secret_files(&agents_dir)?;
            agents.push(AgentUnderTest {
                process,
                root,
                export,
            });
        }
        let client = api.client().await?;
        let names = Names::for_api(&api);
        let namespace: Namespace =
            serde_json::from_value(json!({"metadata": {"name": names.namespace}}))?;
        match Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
        let mut system = Self {
            nfs,
            agents,
            api,
            controllers: Vec::new(),
            client,
            agents_dir,
            names,
            placed: std::sync::atomic::AtomicBool::new(false),
            _base: base,
        };
        for _ in 0..controllers {
            system.start_controller(controller_args).await?;
        }
        Ok(system)
    }

    /// A second cluster on this System's NFS server and agents: the API `api`, a
    /// namespace of its own there, and `controllers` controller processes reading their
    /// agents' connection files from `agents_dir` (the credentials that cluster was
    /// given). Its `agents` is empty: the agents and the NFS server stay with `self`,
    /// which must outlive it.
    pub async fn another_cluster(
        &self,
        api: KubeApi,
        agents_dir: PathBuf,
        controllers: usize,
        controller_args: &[&str],
    ) -> anyhow::Result<Self> {
        let base = tempfile::tempdir()?;
        let nfs = NfsService::OfAnotherSystem {
            port: self.nfs.port(),
        };
        let mut system = Self::assemble(base, nfs, api, &[], Vec::new(), "", 0, &[]).await?;
        system.agents_dir = agents_dir;
        for _ in 0..controllers {
            system.start_controller(controller_args).await?;
        }
        Ok(system)
    }

    /// Starts one more controller process.
    pub async fn start_controller(&mut self, args: &[&str]) -> anyhow::Result<()> {
        let mut all_args = self.names.controller_args();
        all_args.extend(args.iter().map(|a| (*a).to_owned()));
        let all_args: Vec<&str> = all_args.iter().map(String::as_str).collect();
        let controller = ControllerProcess::start(&self.api, &self.agents_dir, &all_args).await?;
        self.controllers.push(controller);
        Ok(())
    }

    /// Kills controller `index` (SIGKILL, as an out-of-memory kill) and starts it again
    /// with `args`, waiting up to `limit` for it to be ready.
    pub async fn restart_controller(
        &mut self,
        index: usize,
        args: &[&str],
        limit: Duration,
    ) -> anyhow::Result<()> {
        self.controllers[index].kill();
        let mut all_args = self.names.controller_args();
        all_args.extend(args.iter().map(|a| (*a).to_owned()));
        let all_args: Vec<&str> = all_args.iter().map(String::as_str).collect();
        self.controllers[index] =
            ControllerProcess::start_within(&self.api, Some(&self.agents_dir), &all_args, limit)
                .await?;
        Ok(())
    }

    /// Every controller's log, for failure messages.
    pub fn logs(&self) -> String {
        self.controllers
            .iter()
            .enumerate()
            .map(|(i, c)| format!("--- controller {i} ---\n{}", c.log_text()))
            .collect()
    }

    pub fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.names.namespace)
    }

    pub fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Creates a StorageClass of this provisioner with reclaimPolicy Delete, named
    /// `self.names.class(name)`.
    pub async fn class(&self, name: &str, parameters: serde_json::Value) -> anyhow::Result<()> {
        self.class_with_expansion(name, parameters, false).await
    }

    /// As [`System::class`], with `allowVolumeExpansion` set as given.
    pub async fn class_with_expansion(
        &self,
        name: &str,
        parameters: serde_json::Value,
        allow_expansion: bool,
    ) -> anyhow::Result<()> {
        let labels = self.names.run_labels();
        let class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": self.names.class(name), "labels": labels},
            "provisioner": self.names.provisioner,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": "Immediate",
            "allowVolumeExpansion": allow_expansion,
            "parameters": parameters,
        }))?;
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await?;
        Ok(())
    }

    /// Creates the StorageClass of another provisioner, `provisioner`, as
    /// nfs-subdir-external-provisioner's are written (archiving on delete), named
    /// `self.names.class(name)`; returns that name.
    pub async fn legacy_class(&self, name: &str, provisioner: &str) -> anyhow::Result<String> {
        let class_name = self.names.class(name);
        let mut class: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": class_name},
            "provisioner": provisioner,
            "reclaimPolicy": "Delete",
            "parameters": {"archiveOnDelete": "true"},
        }))?;
        if let Some(run) = &self.names.run {
            class.metadata.labels = Some([(RUN_LABEL.to_owned(), run.clone())].into());
        }
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &class)
            .await?;
        Ok(class_name)
    }

    /// A volume `provisioner` made for the claim `name` of the class the scenario calls
    /// `class`, laid out as nfs-subdir-external-provisioner lays it out: the claim, its
    /// directory `<namespace>-<claim>-<pv>` on the first agent's export root, and a PV
    /// recording that provisioner, bound to the claim within `bind`. Returns the PV's name
    /// and the directory.
    pub async fn legacy_volume(
        &self,
        provisioner: &str,
        class: &str,
        name: &str,
        bind: Duration,
    ) -> anyhow::Result<(String, PathBuf)> {
        let claim = self.claim(name, class, json!({}), json!({})).await?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pv_name = format!("pvc-{uid}");
        let namespace = &self.names.namespace;
        let directory = format!("{namespace}-{name}-{pv_name}");
        std::fs::create_dir(self.agents[0].root.join(&directory))?;
        let export = &self.agents[0].export;
        let pv: PersistentVolume = serde_json::from_value(json!({
            "metadata": {
                "name": pv_name,
                "annotations": {PROVISIONED_BY: provisioner},
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": self.names.class(class),
                "nfs": {"server": "127.0.0.1", "path": format!("{export}/{directory}")},
                "claimRef": {"namespace": namespace, "name": name, "uid": uid},
            },
        }))?;
        self.volumes().create(&PostParams::default(), &pv).await?;
        self.bound_volume(name, bind).await?;
        Ok((pv_name, self.agents[0].root.join(directory)))
    }

    /// Creates a 1Gi ReadWriteMany claim of the class the scenario calls `class`.
    pub async fn claim(
        &self,
        name: &str,
        class: &str,
        labels: serde_json::Value,
        annotations: serde_json::Value,
    ) -> anyhow::Result<PersistentVolumeClaim> {
        let metadata = json!({"name": name, "namespace": self.names.namespace, "labels": labels, "annotations": annotations});
        self.create_claim(metadata, class, &["ReadWriteMany"], "1Gi")
            .await
    }

    /// Creates a claim of the class the scenario calls `class` with the given access
    /// modes and storage request.
    pub async fn claim_of(
        &self,
        name: &str,
        class: &str,
        access_modes: &[&str],
        storage: &str,
    ) -> anyhow::Result<PersistentVolumeClaim> {
        let metadata = json!({"name": name, "namespace": self.names.namespace});
        self.create_claim(metadata, class, access_modes, storage)
            .await
    }

    async fn create_claim(
        &self,
        metadata: serde_json::Value,
        class: &str,
        access_modes: &[&str],
        storage: &str,
    ) -> anyhow::Result<PersistentVolumeClaim> {
        let claim: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": metadata,
            "spec": {
                "storageClassName": self.names.class(class),
                "accessModes": access_modes,
                "resources": {"requests": {"storage": storage}},
            },
        }))?;
        Ok(self.claims().create(&PostParams::default(), &claim).await?)
    }

    /// Waits until the claim is Bound and returns its PV.
    pub async fn bound_volume(
        &self,
        name: &str,
        limit: Duration,
    ) -> anyhow::Result<PersistentVolume> {
        let bound = tokio::time::timeout(
            limit,
            await_condition(
                self.claims(),
                name,
                |claim: Option<&PersistentVolumeClaim>| {
                    claim
                        .and_then(|c| c.status.as_ref())
                        .and_then(|s| s.phase.as_deref())
                        == Some("Bound")
                },
            ),
        )
        .await
        .map_err(|_| anyhow::anyhow!("claim {name} not Bound within {limit:?}\n{}", self.logs()))??
        .ok_or_else(|| anyhow::anyhow!("claim {name} vanished"))?;
        let volume_name = bound
            .spec
            .and_then(|s| s.volume_name)
            .ok_or_else(|| anyhow::anyhow!("bound claim {name} without volumeName"))?;
        Ok(self.volumes().get(&volume_name).await?)
    }

    /// Asks for `size` in the claim's storage request, as a user expands a claim.
    pub async fn request_storage(&self, claim: &str, size: &str) -> kube::Result<()> {
        self.claims()
            .patch(
                claim,
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"resources": {"requests": {"storage": size}}}})),
            )
            .await
            .map(drop)
    }

    /// Waits until both the PV and the claim report `size`.
    pub async fn wait_for_size(
        &self,
        claim: &str,
        volume: &str,
        size: &str,
        limit: Duration,
    ) -> anyhow::Result<()> {
        let deadline = std::time::Instant::now() + limit;
        loop {
            let pv = self.volumes().get(volume).await?;
            let pvc = self.claims().get(claim).await?;
            if pv_capacity(&pv).as_deref() == Some(size)
                && claim_capacity(&pvc).as_deref() == Some(size)
            {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "PV {volume} / claim {claim} not at {size}: PV {:?}, claim status {:?}\n{}",
                    pv_capacity(&pv),
                    pvc.status,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Deletes the claim and waits until its PV is gone.
    pub async fn delete_claim_and_wait_for_volume(
        &self,
        claim: &str,
        volume: &str,
    ) -> anyhow::Result<()> {
        self.claims()
            .delete(claim, &DeleteParams::default())
            .await?;
        let uid = self
            .volumes()
            .get(volume)
            .await?
            .metadata
            .uid
            .unwrap_or_default();
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(self.volumes(), volume, conditions::is_deleted(&uid)),
        )
        .await
        .map_err(|_| anyhow::anyhow!("PV {volume} not deleted within 60s\n{}", self.logs()))??;
        Ok(())
    }

    /// (reason, message) of the events about the named object in the test namespace.
    pub async fn events_about(&self, name: &str) -> anyhow::Result<Vec<(String, String)>> {
        let events = Api::<Event>::namespaced(self.client.clone(), &self.names.namespace)
            .list(&ListParams::default())
            .await?;
        Ok(events
            .items
            .into_iter()
            .filter(|e| e.involved_object.name.as_deref() == Some(name))
            .map(|e| (e.reason.unwrap_or_default(), e.message.unwrap_or_default()))
            .collect())
    }

    /// Waits for an event with `reason` about `name` whose message contains `text`.
    pub async fn wait_for_event(
        &self,
        name: &str,
        reason: &str,
        text: &str,
    ) -> anyhow::Result<String> {
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some((_, message)) = self
                .events_about(name)
                .await?
                .into_iter()
                .find(|(r, m)| r == reason && m.contains(text))
            {
                return Ok(message);
            }
            if std::time::Instant::now() > deadline {
                anyhow::bail!(
                    "no {reason} event containing {text:?} about {name}; events: {:?}\n{}",
                    self.events_about(name).await?,
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// `nfs://server/path/file` for a file in the volume, from the PV as a kubelet reads it.
    pub fn file_url(&self, volume: &PersistentVolume, file: &str) -> String {
        let source = volume.spec.as_ref().and_then(|s| s.nfs.as_ref());
        let (server, path) = source.map_or(("", ""), |s| (s.server.as_str(), s.path.as_str()));
        nfs_url(server, self.nfs.port(), &format!("{path}/{file}"))
    }

    /// The NFSv3 URL of `file` in the volume, when the NFS server serves NFSv3.
    pub fn file_url_v3(&self, volume: &PersistentVolume, file: &str) -> Option<String> {
        let source = volume.spec.as_ref().and_then(|s| s.nfs.as_ref())?;
        match &self.nfs {
            NfsService::Whole(server) => {
                server.v3_url(&source.server, &format!("{}/{file}", source.path))
            }
            NfsService::PerVolume { .. } | NfsService::OfAnotherSystem { .. } => None,
        }
    }
}

impl Drop for System {
    /// On a shared cluster, removes what this run made there: its classes, its namespace
    /// (with the claims and events in it) and the PVs of its provisioner, finalizers and
    /// all. The controllers stop first so none of them acts on the removal.
    fn drop(&mut self) {
        let Some(run) = self.names.run.clone() else {
            return;
        };
        for controller in &mut self.controllers {
            controller.kill();
        }
        let kubeconfig = self.api.kubeconfig().display().to_string();
        let kubectl = |args: &[&str]| -> Option<String> {
            let output = std::process::Command::new("kubectl")
                .arg(format!("--kubeconfig={kubeconfig}"))
                .args(args)
                .output();
            match output {
                Ok(out) if out.status.success() => {
                    Some(String::from_utf8_lossy(&out.stdout).into_owned())
                }
                Ok(out) => {
                    eprintln!(
                        "cleanup of run {run}: kubectl {args:?}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    None
                }
                Err(e) => {
                    eprintln!("cleanup of run {run}: cannot run kubectl: {e}");
                    None
                }
            }
        };
        let selector = format!("{RUN_LABEL}={run}");
        kubectl(&["delete", "storageclass", "-l", &selector, "--wait=false"]);
        if self.placed.load(std::sync::atomic::Ordering::Relaxed) {
            // No kubelet confirms a bound pod's graceful deletion here: without a forced
            // one, the namespace would stay Terminating.
            kubectl(&[
                "delete",
                "pods",
                "--all",
                "-n",
                &self.names.namespace,
                "--grace-period=0",
                "--force",
                "--wait=false",
            ]);
            kubectl(&["delete", "nodes", "-l", &selector, "--wait=false"]);
        }
        kubectl(&[
            "delete",
            "namespace",
            &self.names.namespace,
            "--ignore-not-found",
            "--wait=false",
        ]);
        let Some(listed) = kubectl(&["get", "persistentvolumes", "-o", "json"]) else {
            return;
        };
        let listed: serde_json::Value = serde_json::from_str(&listed).unwrap_or_default();
        let ours = listed["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|pv| {
                pv["metadata"]["annotations"][PROVISIONED_BY].as_str()
                    == Some(self.names.provisioner.as_str())
            });
        for pv in ours {
            let Some(name) = pv["metadata"]["name"].as_str() else {
                continue;
            };
            kubectl(&[
                "patch",
                "persistentvolume",
                name,
                "--type=merge",
                "-p",
                r#"{"metadata":{"finalizers":null}}"#,
            ]);
            kubectl(&[
                "delete",
                "persistentvolume",
                name,
                "--ignore-not-found",
                "--wait=false",
            ]);
        }
    }
}

/// The PV's `spec.capacity.storage`.
pub fn pv_capacity(volume: &PersistentVolume) -> Option<String> {
    volume
        .spec
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

/// The claim's `status.capacity.storage`.
pub fn claim_capacity(claim: &PersistentVolumeClaim) -> Option<String> {
    claim
        .status
        .as_ref()?
        .capacity
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

/// A new directory per agent without a root of its own, in `base`.
fn export_roots(base: &tempfile::TempDir, specs: &[AgentSpec]) -> anyhow::Result<Vec<PathBuf>> {
    let mut roots = Vec::new();
    for spec in specs {
        let root = match &spec.root {
            Some(root) => root.clone(),
            None => {
                let root = base.path().join(format!("export-{}", spec.name));
                std::fs::create_dir(&root)?;
                root
            }
        };
        roots.push(root);
    }
    Ok(roots)
}

/// The paths of the volumes an agent holds, sorted, as its API lists them: the suite
/// counts volumes through the agent's answers (or reads files itself), never with the
/// agent's own code, which would make the code under test its own oracle.
pub async fn volume_dirs(agent: &AgentUnderTest) -> Vec<String> {
    let listed = async { anyhow::Ok(agent.process.client()?.list_volumes(None).await?) }
        .await
        .unwrap_or_else(|e| {
            panic!(
                "cannot list the volumes of agent {}: {e:#}",
                agent.process.name()
            )
        });
    let mut found: Vec<String> = listed
        .into_iter()
        .map(|volume| volume.path.to_string())
        .collect();
    found.sort();
    found
}
