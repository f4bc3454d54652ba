//! A volume's condition: whether clients can use it as it is, and if not, why.
//!
//! The agent checks every volume it holds (cheaply: no walk of the tree) and reports the
//! outcome in each answer that carries a volume; the controller turns a change of
//! condition into an event on the claim.

use serde::{Deserialize, Serialize};

/// Why a volume is abnormal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AbnormalReason {
    /// The volume's directory (or its own filesystem) is not there.
    Missing,
    /// The agent's record says the volume is exported, and the NFS server does not
    /// serve it.
    NotExported,
    /// The volume's filesystem is mounted read-only: every write fails.
    ReadOnly,
    /// The volume's quota (or its own filesystem) is full: writes that need space fail.
    QuotaFull,
    /// The filesystem answers with I/O errors (shut down after corruption, a lost
    /// device).
    FilesystemError,
    /// A reason newer than this side knows.
    #[serde(other)]
    Unknown,
}

impl AbnormalReason {
    pub const ALL: [AbnormalReason; 5] = [
        AbnormalReason::Missing,
        AbnormalReason::NotExported,
        AbnormalReason::ReadOnly,
        AbnormalReason::QuotaFull,
        AbnormalReason::FilesystemError,
    ];

    /// The name on the wire, in metrics labels and in events.
    pub fn as_str(&self) -> &'static str {
        match self {
            AbnormalReason::Missing => "missing",
            AbnormalReason::NotExported => "not_exported",
            AbnormalReason::ReadOnly => "read_only",
            AbnormalReason::QuotaFull => "quota_full",
            AbnormalReason::FilesystemError => "filesystem_error",
            AbnormalReason::Unknown => "unknown",
        }
    }
}

impl std::fmt::Display for AbnormalReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A volume's condition when the agent answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VolumeCondition {
    /// Absent when the volume is normal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub abnormal: Option<AbnormalReason>,
    /// What was found, for people: empty when normal.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The newest abnormal condition the agent found and repaired by itself (an export
    /// the NFS server had lost, served again): a repair between two looks of the
    /// controller is still seen and reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub repaired: Option<RepairedCondition>,
}

impl VolumeCondition {
    pub fn normal() -> Self {
        Self {
            abnormal: None,
            message: String::new(),
            repaired: None,
        }
    }

    pub fn abnormal(reason: AbnormalReason, message: impl Into<String>) -> Self {
        Self {
            abnormal: Some(reason),
            message: message.into(),
            repaired: None,
        }
    }

    pub fn is_normal(&self) -> bool {
        self.abnormal.is_none()
    }
}

/// An abnormal condition the agent repaired.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairedCondition {
    pub reason: AbnormalReason,
    pub message: String,
    /// RFC 3339 UTC time the agent found it.
    pub found_at: String,
    /// RFC 3339 UTC time the agent repaired it: a controller that saw an older one
    /// reports this one.
    pub repaired_at: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_normal_condition_is_an_empty_object_and_reads_back() {
        let normal = VolumeCondition::normal();
        assert_eq!(serde_json::to_string(&normal).unwrap(), "{}");
        assert_eq!(
            serde_json::from_str::<VolumeCondition>("{}").unwrap(),
            normal
        );
    }

    #[test]
    fn every_reason_reads_back_under_its_name_and_a_newer_one_is_unknown() {
        for reason in AbnormalReason::ALL {
            let text = serde_json::to_string(&reason).unwrap();
            assert_eq!(text, format!("\"{}\"", reason.as_str()));
            assert_eq!(
                serde_json::from_str::<AbnormalReason>(&text).unwrap(),
                reason
            );
        }
        assert_eq!(
            serde_json::from_str::<AbnormalReason>("\"melted\"").unwrap(),
            AbnormalReason::Unknown
        );
    }
}
