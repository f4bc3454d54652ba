//! What the agent lets a create request ask for, whoever sends it: the controller turns
//! StorageClass parameters (which anyone allowed to create classes writes) into modes and
//! owners, so the agent holds the line on the server. The same holds for who a volume is
//! exported to and as whom: a class's `squash` reaches the agent as an export request of
//! a create, clone, adoption or export change alike, and all of them pass
//! [`Policy::check_export`]. Refusals name the setting to change.

use std::ops::RangeInclusive;

use nfsprov_api_types::{CreateVolumeRequest, ExportRequest, Squash};
use serde::Deserialize;

/// `[policy]` of `agent.toml`.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Policy {
    /// The setgid bit on a volume (mode 2775, so new files inherit its group). Off by
    /// default: the shipped unit forbids setting it (`RestrictSUIDSGID=yes`); turning it
    /// on needs the drop-in that lifts that and grants `CAP_FSETID`.
    pub allow_setgid: bool,
    /// Volumes owned by uid 0 or gid 0, asked for explicitly.
    pub allow_root_owner: bool,
    /// Owners a request may name (root aside, see `allow_root_owner`).
    pub uids: [u32; 2],
    pub gids: [u32; 2],
    /// The squash modes an export may ask for. All three by default, so classes with
    /// `squash: none` keep working; an operator who wants client root never to be root
    /// on a volume leaves `none` out.
    pub export_squash: Vec<Squash>,
    /// Anonymous uid or gid 0 in an export: with `squash: all` every client user would
    /// be root on the volume. Off by default.
    pub allow_root_anon: bool,
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_setgid: false,
            allow_root_owner: false,
            // 4294967295 is (uid_t)-1, "no change" to chown: never an owner.
            uids: [1, u32::MAX - 1],
            gids: [1, u32::MAX - 1],
            export_squash: vec![Squash::Root, Squash::All, Squash::None],
            allow_root_anon: false,
        }
    }
}

const SETUID: u32 = 0o4000;
const SETGID: u32 = 0o2000;

impl Policy {
    /// A mistake in the settings, in one line.
    pub fn check_settings(&self) -> Result<(), String> {
        for (name, range) in [("policy.uids", self.uids), ("policy.gids", self.gids)] {
            if range[0] > range[1] {
                return Err(format!("{name} = [{}, {}] is empty", range[0], range[1]));
            }
        }
        if self.export_squash.contains(&Squash::Unknown) {
            return Err(
                "policy.export_squash lists a value other than \"root\", \"all\" and \"none\""
                    .to_owned(),
            );
        }
        Ok(())
    }

    /// Why an export may not be served as asked, if it may not: the same rules for a
    /// create, a clone, an adoption and a change of a volume's export.
    pub fn check_export(&self, request: &ExportRequest) -> Result<(), String> {
        if !self.export_squash.contains(&request.squash) {
            let allowed: Vec<String> = self
                .export_squash
                .iter()
                .map(|squash| format!("{:?}", squash_name(*squash)))
                .collect();
            return Err(format!(
                "export squash {:?} is not allowed by this agent (policy.export_squash = [{}] in agent.toml)",
                squash_name(request.squash),
                allowed.join(", ")
            ));
        }
        for (what, id) in [
            ("anon_uid", request.anon_uid),
            ("anon_gid", request.anon_gid),
        ] {
            if id == Some(0) && !self.allow_root_anon {
                return Err(format!(
                    "export {what} 0 would make squashed client users root on the volume, which this agent does not allow (policy.allow_root_anon = false in agent.toml)"
                ));
            }
        }
        Ok(())
    }

    /// Why the request may not be served, if it may not. A request without uid or gid
    /// gets the agent's own user and group, as always; the ranges bound what is asked.
    pub fn check(&self, request: &CreateVolumeRequest) -> Result<(), String> {
        let mode = request.mode.bits();
        if mode & SETUID != 0 {
            return Err(format!(
                "mode {mode:04o} sets the setuid bit, which the agent never sets on a volume"
            ));
        }
        if mode & SETGID != 0 && !self.allow_setgid {
            return Err(format!(
                "mode {mode:04o} sets the setgid bit, which this agent does not allow (policy.allow_setgid = false in agent.toml)"
            ));
        }
        self.check_owner("uid", "policy.uids", request.uid, self.uids)?;
        self.check_owner("gid", "policy.gids", request.gid, self.gids)
    }

    fn check_owner(
        &self,
        what: &str,
        setting: &str,
        id: Option<u32>,
        range: [u32; 2],
    ) -> Result<(), String> {
        let Some(id) = id else {
            return Ok(());
        };
        if id == 0 {
            return if self.allow_root_owner {
                Ok(())
            } else {
                Err(format!(
                    "{what} 0 would give the volume to root, which this agent does not allow (policy.allow_root_owner = false in agent.toml)"
                ))
            };
        }
        if RangeInclusive::new(range[0], range[1]).contains(&id) {
            Ok(())
        } else {
            Err(format!(
                "{what} {id} is outside {setting} = [{}, {}] in agent.toml",
                range[0], range[1]
            ))
        }
    }
}

/// The spelling of a squash mode in requests, classes and `agent.toml`.
fn squash_name(squash: Squash) -> &'static str {
    match squash {
        Squash::None => "none",
        Squash::Root => "root",
        Squash::All => "all",
        Squash::Unknown => "unknown",
    }
}

#[cfg(test)]
mod tests {
    use nfsprov_api_types::Mode;

    use super::*;

    fn request(mode: u32, uid: Option<u32>, gid: Option<u32>) -> CreateVolumeRequest {
        CreateVolumeRequest {
            mode: Mode::new(mode).unwrap(),
            uid,
            gid,
            capacity_bytes: 1,
            ..Default::default()
        }
    }

    #[test]
    fn the_defaults_refuse_setuid_setgid_and_root_but_keep_the_default_owner() {
        let policy = Policy::default();
        assert_eq!(policy.check(&request(0o777, None, None)), Ok(()));
        assert_eq!(
            policy.check(&request(0o1777, Some(1000), Some(1000))),
            Ok(())
        );
        for (mode, uid, gid, needle) in [
            (0o4777, None, None, "setuid"),
            (0o7777, None, None, "setuid"),
            (0o2775, None, None, "policy.allow_setgid"),
            (0o775, Some(0), None, "policy.allow_root_owner"),
            (0o775, None, Some(0), "policy.allow_root_owner"),
            (0o775, Some(u32::MAX), None, "policy.uids"),
        ] {
            let refused = policy.check(&request(mode, uid, gid)).unwrap_err();
            assert!(
                refused.contains(needle),
                "{mode:o} {uid:?} {gid:?}: {refused}"
            );
        }
    }

    #[test]
    fn settings_open_what_they_name() {
        let policy = Policy {
            allow_setgid: true,
            allow_root_owner: true,
            uids: [1000, 1999],
            gids: [1000, 1999],
            ..Policy::default()
        };
        assert_eq!(policy.check(&request(0o2775, Some(0), Some(0))), Ok(()));
        assert!(policy.check(&request(0o4775, Some(1000), None)).is_err());
        assert!(
            policy
                .check(&request(0o775, Some(2000), None))
                .unwrap_err()
                .contains("[1000, 1999]")
        );
        let empty = Policy {
            uids: [5, 4],
            ..Policy::default()
        };
        assert!(empty.check_settings().unwrap_err().contains("policy.uids"));
    }

    fn export(squash: Squash, anon_uid: Option<u32>, anon_gid: Option<u32>) -> ExportRequest {
        ExportRequest {
            clients: vec!["10.0.0.0/8".parse().unwrap()],
            squash,
            anon_uid,
            anon_gid,
            ..ExportRequest::default()
        }
    }

    #[test]
    fn the_default_export_policy_keeps_every_squash_but_refuses_root_as_the_anonymous_user() {
        let policy = Policy::default();
        for squash in [Squash::Root, Squash::All, Squash::None] {
            assert_eq!(
                policy.check_export(&export(squash, Some(1000), None)),
                Ok(())
            );
        }
        for (uid, gid) in [(Some(0), None), (None, Some(0)), (Some(0), Some(0))] {
            let refused = policy
                .check_export(&export(Squash::All, uid, gid))
                .unwrap_err();
            assert!(refused.contains("policy.allow_root_anon"), "{refused}");
        }
        let open = Policy {
            allow_root_anon: true,
            ..Policy::default()
        };
        assert_eq!(
            open.check_export(&export(Squash::All, Some(0), Some(0))),
            Ok(())
        );
    }

    #[test]
    fn an_export_squash_left_out_of_the_policy_is_refused_by_name() {
        let policy: Policy = toml::from_str("export_squash = [\"root\", \"all\"]").unwrap();
        assert_eq!(policy.check_settings(), Ok(()));
        let refused = policy
            .check_export(&export(Squash::None, None, None))
            .unwrap_err();
        assert!(
            refused.contains("\"none\"") && refused.contains("[\"root\", \"all\"]"),
            "{refused}"
        );
        assert_eq!(
            policy.check_export(&export(Squash::Root, None, None)),
            Ok(())
        );
        let unknown: Policy = toml::from_str("export_squash = [\"root\", \"some\"]").unwrap();
        assert!(
            unknown
                .check_settings()
                .unwrap_err()
                .contains("policy.export_squash")
        );
    }
}
