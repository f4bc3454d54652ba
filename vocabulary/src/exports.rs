//! The export a class asks for: who may mount a volume and how, from the class's
//! `exportClients` and `squash`, its `uid` and `gid`, and the claim's access modes. The
//! clients of `nodes` and `pods` classes are found in the cluster by the caller; everything
//! else is decided here, once for the controller and the plugin.

use nfsprov_api_types::{ExportAccess, ExportClient, ExportRequest, Squash};

use crate::params::{ClassParams, ExportClients, PARAM_EXPORT_CLIENTS, PARAM_SQUASH};

/// Whether a claim with these access modes gets a read-only export: only when it asks for
/// nothing but `ReadOnlyMany` (a claim with no modes at all is refused by the API server).
pub fn read_only<S: AsRef<str>>(access_modes: &[S]) -> bool {
    !access_modes.is_empty() && access_modes.iter().all(|m| m.as_ref() == "ReadOnlyMany")
}

/// The clients a class names itself (`all` or a list); `None` for `nodes` and `pods`,
/// whose clients are the cluster's.
pub fn fixed_clients(clients: Option<&ExportClients>) -> Option<Vec<ExportClient>> {
    match clients.unwrap_or(&ExportClients::All) {
        ExportClients::All => Some(vec![ExportClient::Everyone]),
        ExportClients::List(list) => Some(list.clone()),
        ExportClients::Nodes | ExportClients::Pods => None,
    }
}

/// The request for a volume of the class admitting `clients`. The anonymous ids are the
/// class's owner ids, so squashed users can still use the volume they own; they are left
/// out where nobody is squashed.
pub fn export_request(
    params: &ClassParams,
    read_only: bool,
    clients: Vec<ExportClient>,
) -> ExportRequest {
    let squash = params.squash.unwrap_or_default();
    let squashing = squash != Squash::None;
    ExportRequest {
        clients,
        access: if read_only {
            ExportAccess::ReadOnly
        } else {
            ExportAccess::ReadWrite
        },
        squash,
        anon_uid: params.uid.filter(|_| squashing),
        anon_gid: params.gid.filter(|_| squashing),
        ..ExportRequest::default()
    }
}

/// The class's parameters that only an agent with its own export per volume can honour,
/// as `key=value`, or `None` when the class asks for nothing beyond what a share exported
/// by hand gives (`exportClients` absent or `all`, no `squash`).
///
/// A claim's `ReadOnlyMany` is not among them: claims asked for it long before exports
/// were per volume, and refusing them on such agents would break every one of them on
/// upgrade; there the share's own options decide, as they always did.
pub fn needs_export_manager(params: &ClassParams) -> Option<String> {
    let mut asked = Vec::new();
    match &params.export_clients {
        None | Some(ExportClients::All) => {}
        Some(ExportClients::List(list)) => {
            let list: Vec<String> = list.iter().map(ToString::to_string).collect();
            asked.push(format!("{PARAM_EXPORT_CLIENTS}={}", list.join(",")));
        }
        Some(other) => asked.push(format!("{PARAM_EXPORT_CLIENTS}={}", other.as_str())),
    }
    if let Some(squash) = params.squash {
        let value = match squash {
            Squash::None => "none",
            Squash::Root => "root",
            Squash::All => "all",
            Squash::Unknown => "unknown",
        };
        asked.push(format!("{PARAM_SQUASH}={value}"));
    }
    (!asked.is_empty()).then(|| asked.join(", "))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use nfsprov_api_types::SecFlavor;

    use super::*;

    fn params(pairs: &[(&str, &str)]) -> ClassParams {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        ClassParams::parse(Some(&map)).unwrap()
    }

    #[test]
    fn only_claims_asking_read_only_alone_are_read_only() {
        assert!(read_only(&["ReadOnlyMany"]));
        assert!(read_only(&["ReadOnlyMany", "ReadOnlyMany"]));
        assert!(!read_only(&["ReadOnlyMany", "ReadWriteMany"]));
        assert!(!read_only(&["ReadWriteOnce"]));
        assert!(!read_only::<&str>(&[]));
    }

    #[test]
    fn fixed_clients_of_each_kind() {
        assert_eq!(fixed_clients(None), Some(vec![ExportClient::Everyone]));
        let list = params(&[("exportClients", "10.0.0.0/8,192.0.2.1")]);
        assert_eq!(
            fixed_clients(list.export_clients.as_ref()),
            Some(vec![
                "10.0.0.0/8".parse().unwrap(),
                "192.0.2.1".parse().unwrap()
            ])
        );
        assert_eq!(fixed_clients(Some(&ExportClients::Nodes)), None);
        assert_eq!(fixed_clients(Some(&ExportClients::Pods)), None);
    }

    #[test]
    fn squash_maps_to_the_class_owner() {
        let clients = vec![ExportClient::Everyone];
        let request = export_request(
            &params(&[("squash", "all"), ("uid", "1000"), ("gid", "2000")]),
            false,
            clients.clone(),
        );
        assert_eq!(
            request,
            ExportRequest {
                clients: clients.clone(),
                access: ExportAccess::ReadWrite,
                squash: Squash::All,
                anon_uid: Some(1000),
                anon_gid: Some(2000),
                sec: vec![SecFlavor::Sys],
                opaque_path: false,
            }
        );
        // Root is squashed unless the class says otherwise; ids only where given.
        let request = export_request(&params(&[("gid", "2000")]), true, clients.clone());
        assert_eq!(request.squash, Squash::Root);
        assert_eq!(request.access, ExportAccess::ReadOnly);
        assert_eq!((request.anon_uid, request.anon_gid), (None, Some(2000)));
        // Nobody squashed: no anonymous ids to carry.
        let request = export_request(
            &params(&[("squash", "none"), ("uid", "1000"), ("gid", "2000")]),
            false,
            clients,
        );
        assert_eq!(request.squash, Squash::None);
        assert_eq!((request.anon_uid, request.anon_gid), (None, None));
    }

    #[test]
    fn what_only_an_export_manager_can_honour() {
        assert_eq!(needs_export_manager(&params(&[])), None);
        assert_eq!(
            needs_export_manager(&params(&[("exportClients", "all")])),
            None
        );
        assert_eq!(
            needs_export_manager(&params(&[("exportClients", "pods")])).as_deref(),
            Some("exportClients=pods")
        );
        assert_eq!(
            needs_export_manager(&params(&[
                ("exportClients", "10.0.0.0/8, 192.0.2.1"),
                ("squash", "root")
            ]))
            .as_deref(),
            Some("exportClients=10.0.0.0/8,192.0.2.1, squash=root")
        );
    }
}
