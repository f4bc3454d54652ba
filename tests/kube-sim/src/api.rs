//! The API semantics independent of HTTP: create, update, patch and delete with the
//! metadata rules, optimistic concurrency, status subresources, finalizers and the
//! admission plugins the real server runs. The HTTP layer and the in-process controllers
//! both go through here, so they obey the same rules.

use std::sync::Arc;

use serde_json::{Value, json};

use crate::errors::ApiError;
use crate::events;
use crate::managed::{self, WriteOp};
use crate::meta::{self, meta_mut};
use crate::patch;
use crate::resize_admission;
use crate::resources::Kind;
use crate::schema;
use crate::store::{Mutation, Store, View};
use crate::validate;

pub const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
pub const PV_PROTECTION: &str = "kubernetes.io/pv-protection";
pub const DEFAULT_CLASS_ANN: &str = "storageclass.kubernetes.io/is-default-class";
/// The field manager of writes made by the in-process controllers.
pub const CONTROLLER_MANAGER: &str = "kube-controller-manager";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
    /// A Pod's `binding`: the one way to set its `spec.nodeName` once it exists.
    Binding,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PatchType {
    Merge,
    Json,
    Strategic,
    Apply,
}

impl PatchType {
    pub fn from_content_type(ct: &str) -> Result<PatchType, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+cbor" => Ok(PatchType::Apply),
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

#[derive(Default, Debug, Clone)]
pub struct DeleteOptions {
    pub uid: Option<String>,
    pub resource_version: Option<String>,
    pub dry_run: bool,
}

pub enum DeleteOutcome {
    /// Finalizers remain: the object is kept with `deletionTimestamp` set.
    Pending(Arc<Value>),
    Deleted(Arc<Value>),
}

#[derive(Clone)]
pub struct Api {
    pub store: Arc<Store>,
    /// Whether the StorageObjectInUseProtection admission plugin adds the pvc/pv
    /// protection finalizers. Only on when a controller that removes them runs.
    pub protection: bool,
}

fn check_type_meta(kind: Kind, body: &mut Value) -> Result<(), ApiError> {
    let Some(o) = body.as_object_mut() else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let want = kind.api_version();
    let text = |key: &str| {
        o.get(key)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned()
    };
    let (api_version, named) = (text("apiVersion"), text("kind"));
    if crate::custom::schema(kind).is_some() {
        // Custom objects are decoded by their own type (see `check_raw_type_meta` for
        // one without `kind`); a kind of the same group is the CRD validation's to refuse.
        if api_version != want {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({api_version}) does not match the expected API version ({want})"
            )));
        }
        if !named.is_empty() && named != kind.info().kind {
            let name = o
                .get("metadata")
                .and_then(|m| m.get("name"))
                .and_then(Value::as_str)
                .unwrap_or_default();
            return Err(ApiError::invalid_kind(kind, name, &named));
        }
    } else if (!api_version.is_empty() && api_version != want)
        || (!named.is_empty() && named != kind.info().kind)
    {
        // A built-in kind takes its type from the URL when the body names none.
        let api_version = if api_version.is_empty() {
            want.clone()
        } else {
            api_version
        };
        let named = if named.is_empty() {
            kind.info().kind.to_owned()
        } else {
            named
        };
        return Err(ApiError::cannot_handle(kind, &api_version, &named));
    }
    o.insert("apiVersion".into(), json!(want));
    o.insert("kind".into(), json!(kind.info().kind));
    if !o.get("metadata").is_some_and(Value::is_object) {
        o.insert("metadata".into(), json!({}));
    }
    Ok(())
}

/// The decoding step before any other of a create or replace: the real server reads a
/// custom object as unstructured data, which cannot be decoded without `kind`. Its answer
/// quotes the body as sent, so this looks at the raw bytes.
pub fn check_raw_type_meta(kind: Kind, raw: &[u8], body: &Value) -> Result<(), ApiError> {
    if crate::custom::schema(kind).is_none() {
        return Ok(());
    }
    let named = body.get("kind").and_then(Value::as_str).unwrap_or_default();
    if named.is_empty() {
        return Err(ApiError::unrecognized(kind, raw));
    }
    Ok(())
}

/// Server-side apply types the configuration by its own `apiVersion` and `kind`.
pub fn check_apply_type_meta(body: &Value) -> Result<(), ApiError> {
    let text = |key: &str| body.get(key).and_then(Value::as_str).unwrap_or_default();
    if text("apiVersion").is_empty() || text("kind").is_empty() {
        return Err(ApiError::invalid_object_type(
            text("apiVersion"),
            text("kind"),
        ));
    }
    Ok(())
}

fn check_namespace(kind: Kind, ns: &str, body: &mut Value) -> Result<(), ApiError> {
    let m = meta_mut(body);
    if kind.info().namespaced {
        match m.get("namespace").and_then(Value::as_str) {
            Some(n) if !n.is_empty() && n != ns => {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            _ => {
                m.insert("namespace".into(), json!(ns));
            }
        }
    } else if m
        .get("namespace")
        .and_then(Value::as_str)
        .is_some_and(|n| !n.is_empty())
    {
        // Cluster-scoped objects drop a namespace silently in the real API.
        m.remove("namespace");
    }
    Ok(())
}

/// Where a kind's objects are stored: events.k8s.io Events live with core Events.
fn storage(kind: Kind) -> Kind {
    match kind {
        Kind::EventsV1Event => Kind::CoreEvent,
        k => k,
    }
}

/// The stored object as the requested kind shows it.
pub fn present(kind: Kind, obj: Arc<Value>) -> Arc<Value> {
    match kind {
        Kind::EventsV1Event => Arc::new(events::core_to_v1(&obj)),
        _ => obj,
    }
}

fn strip(obj: &mut Value) {
    if let Some(o) = obj.as_object_mut() {
        o.retain(|_, v| !v.is_null());
    }
}

impl Api {
    pub fn new(store: Arc<Store>, protection: bool) -> Self {
        Api { store, protection }
    }

    pub fn get(&self, kind: Kind, ns: &str, name: &str) -> Result<Arc<Value>, ApiError> {
        self.store
            .get(storage(kind), ns, name)
            .map(|o| present(kind, o))
            .ok_or_else(|| ApiError::not_found(kind, name))
    }

    /// Shape a new object: type meta, namespace, name or generateName, server-owned
    /// metadata, status reset and defaults. Done before taking the store lock.
    fn prepare_create(&self, kind: Kind, ns: &str, mut obj: Value) -> Result<Value, ApiError> {
        check_type_meta(kind, &mut obj)?;
        check_namespace(kind, ns, &mut obj)?;
        let m = meta_mut(&mut obj);
        if m.get("resourceVersion")
            .and_then(Value::as_str)
            .is_some_and(|s| !s.is_empty())
        {
            return Err(ApiError::unreasoned(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let name = m.get("name").and_then(Value::as_str).unwrap_or("");
        if name.is_empty()
            && let Some(prefix) = m
                .get("generateName")
                .and_then(Value::as_str)
                .filter(|s| !s.is_empty())
        {
            // The real server truncates the prefix so the result stays within 63.
            let prefix: String = prefix.chars().take(58).collect();
            m.insert(
                "name".into(),
                json!(format!("{prefix}{}", meta::random_suffix())),
            );
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(meta::now_time()));
        for f in [
            "deletionTimestamp",
            "deletionGracePeriodSeconds",
            "selfLink",
            "managedFields",
            "resourceVersion",
        ] {
            m.remove(f);
        }
        match kind {
            Kind::PersistentVolumeClaim => {
                obj["status"] = json!({ "phase": "Pending" });
            }
            Kind::PersistentVolume => {
                obj["status"] =
                    json!({ "phase": "Pending", "lastPhaseTransitionTime": meta::now_time() });
            }
            Kind::Namespace => {
                obj["status"] = json!({ "phase": "Active" });
            }
            // A CRD with a status subresource ignores the status of a create.
            Kind::Snapshot | Kind::SnapshotSchedule => {
                if let Some(o) = obj.as_object_mut() {
                    o.remove("status");
                }
            }
            _ => {}
        }
        validate::apply_defaults(kind, &mut obj);
        strip(&mut obj);
        schema::normalize(kind, obj)
    }

    /// The checks that need the rest of the store, and the admission plugins.
    fn admit_create(&self, view: &View<'_>, kind: Kind, obj: &mut Value) -> Result<(), ApiError> {
        if kind.info().namespaced {
            let ns = meta::namespace(obj);
            match view.get(Kind::Namespace, "", ns) {
                None => return Err(ApiError::namespace_not_found(ns)),
                Some(n) if meta::is_deleting(&n) => {
                    return Err(ApiError::forbidden_for(
                        kind,
                        meta::name(obj),
                        &format!(
                            "unable to create new content in namespace {ns} because it is being terminated"
                        ),
                    ));
                }
                Some(_) => {}
            }
        }
        if kind == Kind::PersistentVolumeClaim
            && obj
                .get("spec")
                .and_then(|s| s.get("storageClassName"))
                .is_none_or(Value::is_null)
        {
            // DefaultStorageClass admission: a claim that names no class gets the default
            // (the newest one when several are marked).
            let default = view
                .iter(Kind::StorageClass)
                .filter(|sc| meta::annotation(sc, DEFAULT_CLASS_ANN) == Some("true"))
                .max_by(|a, b| {
                    meta::meta_str(a, "creationTimestamp")
                        .cmp(&meta::meta_str(b, "creationTimestamp"))
                        .then_with(|| meta::name(b).cmp(meta::name(a)))
                })
                .map(|sc| meta::name(sc).to_string());
            if let Some(class) = default
                && let Some(spec) = obj.get_mut("spec").and_then(Value::as_object_mut)
            {
                spec.insert("storageClassName".into(), json!(class));
            }
        }
        if self.protection {
            let fin = match kind {
                Kind::PersistentVolumeClaim => Some(PVC_PROTECTION),
                Kind::PersistentVolume => Some(PV_PROTECTION),
                _ => None,
            };
            if let Some(fin) = fin {
                let mut fins = meta::finalizers(obj);
                if !fins.iter().any(|f| f == fin) {
                    fins.push(fin.into());
                    meta_mut(obj).insert("finalizers".into(), json!(fins));
                }
            }
        }
        Ok(())
    }

    /// Create as an anonymous manager (test setup and in-process controllers).
    pub fn create(
        &self,
        kind: Kind,
        ns: &str,
        body: Value,
        dry_run: bool,
    ) -> Result<Arc<Value>, ApiError> {
        self.create_as(kind, ns, body, dry_run, CONTROLLER_MANAGER)
    }

    pub fn create_as(
        &self,
        kind: Kind,
        ns: &str,
        body: Value,
        dry_run: bool,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let obj = self.prepare_create(kind, ns, body)?;
        validate::validate(kind, &obj)?;
        let name = meta::name(&obj).to_string();
        let ns = meta::namespace(&obj).to_string();
        let skind = storage(kind);
        let obj = if kind == skind {
            obj
        } else {
            events::v1_to_core(&obj)
        };
        let mut dry = None;
        let (stored, _) = self.store.mutate(skind, &ns, &name, |view, cur| {
            if cur.is_some() {
                return Err(ApiError::already_exists(kind, &name));
            }
            let mut obj = obj;
            self.admit_create(view, skind, &mut obj)?;
            validate::validate(skind, &obj)?;
            managed::record(
                None,
                &mut obj,
                &WriteOp::update(manager),
                &kind.api_version(),
            );
            if dry_run {
                dry = Some(obj);
                return Ok(Mutation::Unchanged);
            }
            Ok(Mutation::Put(obj))
        })?;
        if let Some(d) = dry {
            return Ok(present(kind, Arc::new(d)));
        }
        stored
            .map(|o| present(kind, o))
            .ok_or_else(|| ApiError::internal("create stored nothing"))
    }

    /// Turn a proposed new state into a mutation of `cur`, with every rule of an update.
    #[allow(clippy::too_many_arguments)]
    fn decide_update(
        &self,
        view: &View<'_>,
        kind: Kind,
        name: &str,
        cur: &Value,
        mut body: Value,
        sub: Sub,
        op: &WriteOp<'_>,
    ) -> Result<Mutation, ApiError> {
        check_type_meta(kind, &mut body)?;
        if kind == Kind::EventsV1Event {
            // Validate as the requested version, store as the core form.
            let ns = meta::namespace(cur).to_string();
            check_namespace(kind, &ns, &mut body)?;
            let body = schema::normalize(kind, body)?;
            validate::validate(kind, &body)?;
            return self.decide_update(
                view,
                Kind::CoreEvent,
                name,
                cur,
                events::v1_to_core(&body),
                sub,
                op,
            );
        }
        let ns = meta::namespace(cur).to_string();
        check_namespace(kind, &ns, &mut body)?;
        let body_name = meta::name(&body).to_string();
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        let body_rv = meta::resource_version(&body);
        if !body_rv.is_empty() && body_rv != meta::resource_version(cur) {
            return Err(ApiError::conflict_modified(kind, name));
        }
        let cur_uid = meta::meta_str(cur, "uid").unwrap_or("");
        if let Some(uid) = meta::meta_str(&body, "uid").filter(|u| !u.is_empty())
            && uid != cur_uid
        {
            return Err(ApiError::uid_precondition(kind, name, uid, cur_uid));
        }
        let mut new = if sub == Sub::Status {
            // A status write changes status only; spec and metadata stay as stored.
            let mut n = cur.clone();
            match body.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
            n
        } else {
            let mut n = body;
            if kind.info().has_status {
                match cur.get("status") {
                    Some(s) => n["status"] = s.clone(),
                    None => {
                        if let Some(o) = n.as_object_mut() {
                            o.remove("status");
                        }
                    }
                }
            }
            n
        };
        // Server-owned metadata cannot be changed by clients.
        {
            let cm = meta::meta(cur).cloned().unwrap_or_default();
            let m = meta_mut(&mut new);
            for f in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "resourceVersion",
                "generation",
            ] {
                match cm.get(f) {
                    Some(v) => {
                        m.insert(f.into(), v.clone());
                    }
                    None => {
                        m.remove(f);
                    }
                }
            }
            m.remove("selfLink");
            match cm.get("managedFields") {
                Some(v) => {
                    m.insert("managedFields".into(), v.clone());
                }
                None => {
                    m.remove("managedFields");
                }
            }
        }
        if kind == Kind::PersistentVolume
            && sub == Sub::Status
            && meta::path(cur, &["status", "phase"]) != meta::path(&new, &["status", "phase"])
        {
            new["status"]["lastPhaseTransitionTime"] = json!(meta::now_time());
        }
        validate::apply_defaults(kind, &mut new);
        strip(&mut new);
        let mut new = schema::normalize(kind, new)?;
        validate::validate(kind, &new)?;
        validate::validate_update(kind, cur, &new)?;
        if kind == Kind::Pod
            && sub != Sub::Binding
            && meta::path(cur, &["spec", "nodeName"]) != meta::path(&new, &["spec", "nodeName"])
        {
            return Err(validate::pod_spec_immutable(name, cur, &new));
        }
        match sub {
            Sub::Status => validate::validate_status_update(kind, &new)?,
            Sub::Binding => {}
            // Admission runs after validation, as in the real server.
            Sub::Main if kind == Kind::PersistentVolumeClaim => {
                resize_admission::admit(view, cur, &new)?
            }
            Sub::Main => {}
        }
        if &new == cur {
            return Ok(Mutation::Unchanged);
        }
        if let Some(config) = op.apply
            && !op.force
        {
            let conflicts = managed::apply_conflicts(cur, config, op.manager);
            if !conflicts.is_empty() {
                return Err(ApiError::apply_conflicts(kind, name, &conflicts));
            }
        }
        if sub == Sub::Main {
            managed::record(Some(cur), &mut new, op, &kind.api_version());
        }
        if meta::is_deleting(&new) && meta::finalizers(&new).is_empty() && kind != Kind::Namespace {
            return Ok(Mutation::Delete(Some(new)));
        }
        Ok(Mutation::Put(new))
    }

    #[allow(clippy::too_many_arguments)]
    pub fn update(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        body: Value,
        sub: Sub,
        dry_run: bool,
        manager: &str,
    ) -> Result<Arc<Value>, ApiError> {
        let mut dry = None;
        let body_name = meta::name(&body);
        if body_name != name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({name})"
            )));
        }
        if crate::custom::schema(kind).is_some() && meta::resource_version(&body).is_empty() {
            return Err(ApiError::resource_version_required(kind, name));
        }
        let (stored, _) = self.store.mutate(storage(kind), ns, name, |view, cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(kind, name))?;
            let m =
                self.decide_update(view, kind, name, cur, body, sub, &WriteOp::update(manager))?;
            Ok(capture_dry(m, dry_run, &mut dry))
        })?;
        finish(stored, dry).map(|o| present(kind, o))
    }

    /// Read-modify-write in one step under the store lock; for in-process controllers.
    /// Returns `Ok(None)` when the object is gone.
    pub fn modify<F>(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        expected_rv: &str,
        sub: Sub,
        f: F,
    ) -> Result<Option<Arc<Value>>, ApiError>
    where
        F: FnOnce(&mut Value),
    {
        let (stored, _) = self.store.mutate(kind, ns, name, |view, cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(kind, name))?;
            if meta::resource_version(cur) != expected_rv {
                return Err(ApiError::conflict_modified(kind, name));
            }
            let mut body = (**cur).clone();
            f(&mut body);
            self.decide_update(
                view,
                kind,
                name,
                cur,
                body,
                sub,
                &WriteOp::update(CONTROLLER_MANAGER),
            )
        })?;
        Ok(stored)
    }

    #[allow(clippy::too_many_arguments)]
    pub fn patch(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        patch_type: PatchType,
        patch_body: Value,
        sub: Sub,
        manager: &str,
        force: bool,
        dry_run: bool,
    ) -> Result<(Arc<Value>, bool), ApiError> {
        let op = WriteOp {
            manager,
            apply: (patch_type == PatchType::Apply).then_some(&patch_body),
            force,
        };
        let mut dry = None;
        let mut created = false;
        let skind = storage(kind);
        let result = self.store.mutate(skind, ns, name, |view, cur| {
            let Some(cur) = cur else {
                if patch_type != PatchType::Apply {
                    return Err(ApiError::not_found(kind, name));
                }
                // Server-side apply creates what does not exist yet; the name comes from
                // the URL when the applied configuration leaves it out.
                let mut body = patch_body.clone();
                if body.is_object() && meta::name(&body).is_empty() {
                    meta_mut(&mut body).insert("name".into(), json!(name));
                }
                let mut obj = self.prepare_create(kind, ns, body)?;
                if meta::name(&obj) != name {
                    return Err(ApiError::bad_request(format!(
                        "the name of the object ({}) does not match the name on the URL ({name})",
                        meta::name(&obj)
                    )));
                }
                validate::validate(kind, &obj)?;
                if kind != skind {
                    obj = events::v1_to_core(&obj);
                }
                self.admit_create(view, skind, &mut obj)?;
                validate::validate(skind, &obj)?;
                managed::record(None, &mut obj, &op, &kind.api_version());
                created = true;
                return Ok(capture_dry(Mutation::Put(obj), dry_run, &mut dry));
            };
            let mut work = if kind == skind {
                (**cur).clone()
            } else {
                events::core_to_v1(cur)
            };
            match patch_type {
                PatchType::Merge => patch::merge_patch(&mut work, &patch_body),
                PatchType::Json => patch::json_patch(&mut work, &patch_body)?,
                // Custom resources have no patch strategy: the real server refuses it.
                PatchType::Strategic if crate::custom::schema(kind).is_some() => {
                    return Err(ApiError::no_strategic_merge());
                }
                PatchType::Strategic | PatchType::Apply => {
                    if !patch_body.is_object() {
                        return Err(ApiError::bad_request("the patch must be a JSON object"));
                    }
                    patch::strategic_merge_patch(&mut work, &patch_body)?
                }
            }
            let m = self.decide_update(view, kind, name, cur, work, sub, &op)?;
            Ok(capture_dry(m, dry_run, &mut dry))
        });
        let (stored, _) = result?;
        Ok((present(kind, finish(stored, dry)?), created))
    }

    /// Binds a Pod to a node, as the scheduler does through `pods/<name>/binding`.
    pub fn bind_pod(&self, ns: &str, name: &str, binding: &Value) -> Result<(), ApiError> {
        let node = binding
            .get("target")
            .and_then(|t| t.get("name"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_owned();
        self.store.mutate(Kind::Pod, ns, name, |view, cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(Kind::Pod, name))?;
            if let Some(bound) = meta::path(cur, &["spec", "nodeName"])
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
            {
                return Err(ApiError::conflict(
                    Kind::Pod,
                    name,
                    &format!("pod {name} is already assigned to node \"{bound}\""),
                ));
            }
            let mut new = (**cur).clone();
            new["spec"]["nodeName"] = json!(node);
            self.decide_update(
                view,
                Kind::Pod,
                name,
                cur,
                new,
                Sub::Binding,
                &WriteOp::update("kube-scheduler"),
            )
        })?;
        Ok(())
    }

    pub fn delete(
        &self,
        kind: Kind,
        ns: &str,
        name: &str,
        opts: &DeleteOptions,
    ) -> Result<DeleteOutcome, ApiError> {
        let mut pending = false;
        let mut dry = None;
        let (stored, _) = self.store.mutate(storage(kind), ns, name, |_, cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(kind, name))?;
            let cur_uid = meta::meta_str(cur, "uid").unwrap_or("");
            if let Some(uid) = &opts.uid
                && uid != cur_uid
            {
                return Err(ApiError::uid_precondition(kind, name, uid, cur_uid));
            }
            let cur_rv = meta::resource_version(cur);
            if let Some(rv) = &opts.resource_version
                && rv != cur_rv
            {
                return Err(ApiError::conflict(
                    kind,
                    name,
                    &format!(
                        "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {cur_rv}"
                    ),
                ));
            }
            let has_spec_finalizers = kind == Kind::Namespace
                && meta::path(cur, &["spec", "finalizers"])
                    .and_then(Value::as_array)
                    .is_some_and(|a| !a.is_empty());
            if meta::finalizers(cur).is_empty() && !has_spec_finalizers {
                return Ok(capture_dry(Mutation::Delete(None), opts.dry_run, &mut dry));
            }
            pending = true;
            if meta::is_deleting(cur) {
                return Ok(Mutation::Unchanged);
            }
            let mut new = (**cur).clone();
            let m = meta_mut(&mut new);
            m.insert("deletionTimestamp".into(), json!(meta::now_time()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            if kind == Kind::Namespace {
                new["status"]["phase"] = json!("Terminating");
            }
            Ok(capture_dry(Mutation::Put(new), opts.dry_run, &mut dry))
        })?;
        let obj = present(kind, finish(stored, dry)?);
        Ok(if pending {
            DeleteOutcome::Pending(obj)
        } else {
            DeleteOutcome::Deleted(obj)
        })
    }

    /// Remove a namespace whose content is gone (the namespace controller's last step).
    pub fn finalize_namespace(&self, name: &str) -> Result<(), ApiError> {
        self.store.mutate(Kind::Namespace, "", name, |_, cur| {
            let cur = cur.ok_or_else(|| ApiError::not_found(Kind::Namespace, name))?;
            if !meta::is_deleting(cur) || !meta::finalizers(cur).is_empty() {
                return Ok(Mutation::Unchanged);
            }
            let mut last = (**cur).clone();
            last["spec"]["finalizers"] = json!([]);
            Ok(Mutation::Delete(Some(last)))
        })?;
        Ok(())
    }
}

/// Under dry run the decided state is returned to the client but never stored.
fn capture_dry(m: Mutation, dry_run: bool, out: &mut Option<Value>) -> Mutation {
    if !dry_run {
        return m;
    }
    match m {
        Mutation::Put(v) | Mutation::Delete(Some(v)) => {
            *out = Some(v);
            Mutation::Unchanged
        }
        Mutation::Delete(None) | Mutation::Unchanged => Mutation::Unchanged,
    }
}

fn finish(stored: Option<Arc<Value>>, dry: Option<Value>) -> Result<Arc<Value>, ApiError> {
    if let Some(d) = dry {
        return Ok(Arc::new(d));
    }
    stored.ok_or_else(|| ApiError::internal("write returned no object"))
}
