//! How each endpoint's success answer reads. Some endpoints answer with a status that says
//! what happened (201 made, 200 found as asked, 202 still running), so the types a caller
//! gets carry that beside the body.

use http::StatusCode;
use serde::de::Error as _;

use crate::snapshot::{RestoreProgress, Snapshot, SnapshotList};
use crate::transfer::{ReplicaOutcome, TransferGrant};
use crate::types::{
    AgentInfo, Archive, ArchiveList, ArchiveResult, CloneProgress, Health, Volume, VolumeList,
};

/// What an endpoint's success answer becomes: the [`Answer`](crate::endpoints::ApiEndpoint::Answer)
/// type of each endpoint implements it.
pub trait ReadAnswer: Sized {
    /// The value of a success answer: a 2xx `status` and its `body`. An error when the
    /// body is not what the endpoint answers.
    fn read(status: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error>;

    /// The value an agent's `not_found` error stands for, when this type has one.
    fn when_not_found() -> Option<Self> {
        None
    }
}

/// Answers that are their JSON body, whatever the 2xx status.
macro_rules! json_answers {
    ($($answer:ty),*) => {$(
        impl ReadAnswer for $answer {
            fn read(_: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
                serde_json::from_slice(body)
            }
        }
    )*};
}

json_answers!(
    Health,
    AgentInfo,
    Volume,
    VolumeList,
    Archive,
    ArchiveList,
    ArchiveResult,
    Snapshot,
    SnapshotList,
    TransferGrant,
    ReplicaOutcome
);

/// A delete's `204 No Content`: there is nothing to read, and whatever comes is ignored.
impl ReadAnswer for () {
    fn read(_: StatusCode, _: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(())
    }
}

/// Bytes as they came: a file's framed content.
impl ReadAnswer for Vec<u8> {
    fn read(_: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(body.to_vec())
    }
}

/// Text, as Prometheus reads it.
impl ReadAnswer for String {
    fn read(_: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
        String::from_utf8(body.to_vec()).map_err(serde_json::Error::custom)
    }
}

/// Something the agent may not have: its `not_found` error reads as `None`.
impl<T: ReadAnswer> ReadAnswer for Option<T> {
    fn read(status: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
        T::read(status, body).map(Some)
    }

    fn when_not_found() -> Option<Self> {
        Some(None)
    }
}

/// The outcome of `PUT /v1/volumes/{path}` and of `POST /v1/adoptions/{path}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreateOutcome {
    pub volume: Volume,
    /// `true` when this call made the volume (created the directory, or adopted it),
    /// `false` when it was already a volume with the same settings.
    pub created: bool,
}

impl ReadAnswer for CreateOutcome {
    fn read(status: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
        Ok(CreateOutcome {
            volume: serde_json::from_slice(body)?,
            created: status == StatusCode::CREATED,
        })
    }
}

/// The outcome of an endpoint that makes a volume in the background, `P` telling how far
/// it is: a clone or a restore.
// Returned once per call and never held in bulk, so the larger variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JobOutcome<P> {
    /// The volume is at its path: made by this call, by an earlier one, or found again.
    Ready(CreateOutcome),
    /// The agent is still making it (`202 Accepted`); repeat the same request later.
    InProgress(P),
}

/// The outcome of `POST /v1/clones/{path}`.
pub type CloneOutcome = JobOutcome<CloneProgress>;

/// The outcome of `POST /v1/restores/{path}`.
pub type RestoreOutcome = JobOutcome<RestoreProgress>;

impl<P: serde::de::DeserializeOwned> ReadAnswer for JobOutcome<P> {
    fn read(status: StatusCode, body: &[u8]) -> Result<Self, serde_json::Error> {
        if status == StatusCode::ACCEPTED {
            return serde_json::from_slice(body).map(JobOutcome::InProgress);
        }
        CreateOutcome::read(status, body).map(JobOutcome::Ready)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume_json() -> serde_json::Value {
        serde_json::json!({
            "path": "team/data",
            "mode": "0770",
            "uid": 0,
            "gid": 0,
            "capacity_bytes": 1024,
            "created_at": "2026-01-01T00:00:00Z",
        })
    }

    #[test]
    fn the_status_says_whether_a_volume_was_made_or_is_still_being_made() {
        let body = serde_json::to_vec(&volume_json()).unwrap();
        assert!(
            CreateOutcome::read(StatusCode::CREATED, &body)
                .unwrap()
                .created
        );
        assert!(!CreateOutcome::read(StatusCode::OK, &body).unwrap().created);
        let ready = CloneOutcome::read(StatusCode::OK, &body).unwrap();
        assert!(matches!(
            ready,
            JobOutcome::Ready(CreateOutcome { created: false, .. })
        ));
        // A 202 carries progress, not a volume: reading it as a volume fails.
        assert!(CloneOutcome::read(StatusCode::ACCEPTED, &body).is_err());
    }

    #[test]
    fn only_an_optional_answer_stands_for_not_found() {
        assert_eq!(<Option<Volume>>::when_not_found(), Some(None));
        assert_eq!(Volume::when_not_found(), None);
        assert!(<()>::read(StatusCode::NO_CONTENT, b"anything").is_ok());
        assert!(String::read(StatusCode::OK, &[0xff]).is_err());
        assert!(Volume::read(StatusCode::OK, b"null").is_err());
        assert!(<Option<Volume>>::read(StatusCode::OK, b"null").is_err());
    }
}
