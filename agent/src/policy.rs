//! What the agent lets a create request ask for, whoever sends it: the controller turns
//! StorageClass parameters (which anyone allowed to create classes writes) into modes and
//! owners, so the agent holds the line on the server. Refusals name the setting to change.

use std::ops::RangeInclusive;

use nfsprov_api_types::CreateVolumeRequest;
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
}

impl Default for Policy {
    fn default() -> Self {
        Self {
            allow_setgid: false,
            allow_root_owner: false,
            // 4294967295 is (uid_t)-1, "no change" to chown: never an owner.
            uids: [1, u32::MAX - 1],
            gids: [1, u32::MAX - 1],
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
}
