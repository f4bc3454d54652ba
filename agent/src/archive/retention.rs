//! How long archives are kept: the agent's default retention, which the retention an
//! archive request asked for (recorded with the archive) overrides, and when an archive
//! therefore expires. Pure arithmetic; the sweep that acts on it is in `catalog`.

use std::time::Duration;

use time::OffsetDateTime;

/// Seconds in a day of retention (UTC days: no daylight saving, no leap seconds).
const DAY_SECONDS: u64 = 86_400;

/// A retention given in days.
pub fn days(days: u32) -> Duration {
    Duration::from_secs(u64::from(days) * DAY_SECONDS)
}

/// `[archive]` as the agent runs with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ArchiveSettings {
    /// How long an archive without a retention of its own is kept; `None`: until it is
    /// deleted by hand.
    pub default_retention: Option<Duration>,
    /// How often the agent looks for expired archives.
    pub sweep_interval: Duration,
}

impl Default for ArchiveSettings {
    fn default() -> Self {
        Self {
            default_retention: None,
            sweep_interval: Duration::from_secs(300),
        }
    }
}

impl ArchiveSettings {
    /// When an archive made at `archived_at` expires: after the retention recorded with
    /// it, else after the default; `None` when nothing limits it, or when the expiry lies
    /// beyond what a time can hold (as good as never).
    pub fn expires_at(
        &self,
        archived_at: OffsetDateTime,
        recorded_days: Option<u32>,
    ) -> Option<OffsetDateTime> {
        let retention = match recorded_days {
            Some(recorded) => days(recorded),
            None => self.default_retention?,
        };
        archived_at.checked_add(time::Duration::try_from(retention).ok()?)
    }
}

/// Whether an archive expiring at `expires_at` is due for deletion at `now`.
pub fn is_expired(expires_at: Option<OffsetDateTime>, now: OffsetDateTime) -> bool {
    expires_at.is_some_and(|expiry| expiry <= now)
}

#[cfg(test)]
mod tests {
    use time::macros::datetime;

    use super::*;

    const ARCHIVED: OffsetDateTime = datetime!(2026-03-01 12:00:00.5 UTC);

    fn settings(default_days: Option<u32>) -> ArchiveSettings {
        ArchiveSettings {
            default_retention: default_days.map(days),
            ..Default::default()
        }
    }

    #[test]
    fn a_recorded_retention_overrides_the_default() {
        let week = settings(Some(7));
        assert_eq!(
            week.expires_at(ARCHIVED, None),
            Some(datetime!(2026-03-08 12:00:00.5 UTC))
        );
        assert_eq!(
            week.expires_at(ARCHIVED, Some(30)),
            Some(datetime!(2026-03-31 12:00:00.5 UTC))
        );
        // Shorter than the default too: the class decides.
        assert_eq!(
            week.expires_at(ARCHIVED, Some(1)),
            Some(datetime!(2026-03-02 12:00:00.5 UTC))
        );
    }

    #[test]
    fn without_any_retention_an_archive_never_expires() {
        let forever = settings(None);
        assert_eq!(forever.expires_at(ARCHIVED, None), None);
        assert!(!is_expired(None, datetime!(9999-12-31 23:59:59 UTC)));
        // A retention of its own still applies when the agent keeps archives forever.
        assert_eq!(
            forever.expires_at(ARCHIVED, Some(2)),
            Some(datetime!(2026-03-03 12:00:00.5 UTC))
        );
    }

    #[test]
    fn expiry_is_due_from_the_exact_instant_on() {
        let expiry = settings(Some(1)).expires_at(ARCHIVED, None);
        let at = datetime!(2026-03-02 12:00:00.5 UTC);
        assert!(!is_expired(expiry, at - time::Duration::nanoseconds(1)));
        assert!(is_expired(expiry, at));
        assert!(is_expired(expiry, at + time::Duration::days(365)));
    }

    #[test]
    fn retentions_too_long_to_represent_never_expire_and_never_overflow() {
        let late = datetime!(9999-12-30 00:00:00 UTC);
        assert_eq!(settings(None).expires_at(late, Some(u32::MAX)), None);
        assert_eq!(settings(None).expires_at(ARCHIVED, Some(u32::MAX)), None);
        assert_eq!(settings(Some(3)).expires_at(late, None), None);
        let huge = ArchiveSettings {
            default_retention: Some(Duration::MAX),
            ..Default::default()
        };
        assert_eq!(huge.expires_at(ARCHIVED, None), None);
        // Days are whole days of 24 hours, not calendar months.
        assert_eq!(
            settings(None).expires_at(ARCHIVED, Some(365)),
            Some(datetime!(2027-03-01 12:00:00.5 UTC))
        );
    }
}
