//! Transfer grants: a token that lets another agent read exactly one snapshot, through
//! the transfer endpoints only, until it expires. A grant is the whole of what a target
//! agent ever holds of its source: it confers no general access, names no volume path,
//! and cannot be widened. Only the token's SHA-256 is kept, in memory: a restart of the
//! agent ends every grant (the target asks for a new one and resumes where it was).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use nfsprov_api_types::{MAX_TRANSFER_TTL_SECONDS, SnapshotName};

/// The most grants alive at once: beyond it the oldest-expiring go first.
const MAX_GRANTS: usize = 4096;

/// What a grant lets its bearer read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Grant {
    pub(crate) snapshot: SnapshotName,
    pub(crate) expires_at: SystemTime,
    /// The credential that asked for it, for the audit log.
    pub(crate) issued_to: String,
}

/// The grants alive, by their token's SHA-256.
#[derive(Debug, Default)]
pub(crate) struct Grants {
    alive: Mutex<HashMap<[u8; 32], Grant>>,
}

fn digest(token: &[u8]) -> [u8; 32] {
    let digest = ring::digest::digest(&ring::digest::SHA256, token);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    out
}

impl Grants {
    /// A new grant of `snapshot` living `ttl` (at most a day), and its token.
    pub(crate) fn issue(
        &self,
        snapshot: &SnapshotName,
        ttl: Duration,
        issued_to: &str,
        now: SystemTime,
    ) -> std::io::Result<(String, Grant)> {
        let token = crate::init::random_token()?;
        let grant = Grant {
            snapshot: snapshot.clone(),
            expires_at: now + ttl.min(Duration::from_secs(MAX_TRANSFER_TTL_SECONDS)),
            issued_to: issued_to.to_owned(),
        };
        let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        alive.retain(|_, grant| grant.expires_at > now);
        while alive.len() >= MAX_GRANTS {
            let Some(first) = alive
                .iter()
                .min_by_key(|(_, grant)| grant.expires_at)
                .map(|(key, _)| *key)
            else {
                break;
            };
            alive.remove(&first);
        }
        alive.insert(digest(token.as_bytes()), grant.clone());
        Ok((token, grant))
    }

    /// The grant `presented` is the token of, while it has not expired. The lookup is by
    /// the token's SHA-256, so its time says nothing of how much of a token matched.
    pub(crate) fn find(&self, presented: &[u8], now: SystemTime) -> Option<Grant> {
        let key = digest(presented);
        let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        match alive.get(&key) {
            Some(grant) if grant.expires_at > now => Some(grant.clone()),
            Some(_) => {
                alive.remove(&key);
                None
            }
            None => None,
        }
    }

    /// Ends every grant of `snapshot`: it was deleted.
    pub(crate) fn revoke_snapshot(&self, snapshot: &SnapshotName) {
        let mut alive = self.alive.lock().unwrap_or_else(|e| e.into_inner());
        alive.retain(|_, grant| grant.snapshot != *snapshot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(raw: &str) -> SnapshotName {
        SnapshotName::parse(raw).unwrap()
    }

    #[test]
    fn a_grant_holds_its_own_token_until_it_expires_and_no_other() {
        let grants = Grants::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (token, grant) = grants
            .issue(&name("snap-a"), Duration::from_secs(60), "controller", now)
            .unwrap();
        assert_eq!(token.len(), 64);
        assert_eq!(grant.snapshot, name("snap-a"));
        assert_eq!(grants.find(token.as_bytes(), now), Some(grant.clone()));
        assert_eq!(grants.find(&token.as_bytes()[..63], now), None);
        assert_eq!(grants.find(b"", now), None);
        let later = now + Duration::from_secs(59);
        assert!(grants.find(token.as_bytes(), later).is_some());
        let expired = now + Duration::from_secs(60);
        assert_eq!(grants.find(token.as_bytes(), expired), None);
        // Gone for good, even if the clock went back.
        assert_eq!(grants.find(token.as_bytes(), now), None);
    }

    #[test]
    fn a_grant_lives_a_day_at_most_and_ends_with_its_snapshot() {
        let grants = Grants::default();
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let (token, grant) = grants
            .issue(&name("snap-b"), Duration::from_secs(10 * 86_400), "c", now)
            .unwrap();
        assert_eq!(
            grant.expires_at,
            now + Duration::from_secs(MAX_TRANSFER_TTL_SECONDS)
        );
        let (other, _) = grants
            .issue(&name("snap-c"), Duration::from_secs(60), "c", now)
            .unwrap();
        grants.revoke_snapshot(&name("snap-b"));
        assert_eq!(grants.find(token.as_bytes(), now), None);
        assert!(grants.find(other.as_bytes(), now).is_some());
    }
}
