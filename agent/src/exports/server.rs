use std::fmt;

use nfsprov_api_types::{ApiError, ErrorCode, ExportManager, VolumePath};

use super::record::ExportRecord;

/// The whole export table, by volume: a persistent map, so that the table after a change
/// is made from the one before in O(log n) while readers keep theirs.
pub type Table = imbl::OrdMap<VolumePath, ExportRecord>;

/// One change of an export: what was served (`None`: nothing) and what is to be.
pub type Change<'a> = (Option<&'a ExportRecord>, &'a ExportRecord);

/// What a start-up or a pass of the reconciler found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Restored {
    /// Exports the NFS server already served as recorded.
    pub kept: usize,
    /// Recorded exports the NFS server had lost (its restart, or a crash before the
    /// agent told it) and serves again.
    pub added: usize,
    /// Exports changed or removed half-way by an interrupted run, set back to the record.
    pub repaired: usize,
    /// Exports of the agent's whose volume is gone, or that no record names.
    pub removed: usize,
    /// The volumes counted in `added`: what the server's listing lacked and serves again.
    pub re_added: Vec<VolumePath>,
    /// Recorded exports the server's listing lacked and refused to serve again (its
    /// answer is in the log); the next pass tries again.
    pub unserved: Vec<VolumePath>,
}

/// An NFS server whose export table the agent manages.
pub trait NfsServer: Send + Sync + fmt::Debug {
    fn kind(&self) -> ExportManager;
    /// Whether each export needs an id of its own (ganesha's `Export_Id`).
    fn needs_id(&self) -> bool;
    /// Whether an export can be served at a path other than its volume's (ganesha's
    /// `Pseudo`), so that new exports can be given opaque names.
    fn serves_opaque_paths(&self) -> bool {
        false
    }
    /// Whether each new export gets an `fsid` of its own (knfsd over volumes that are
    /// filesystems of their own).
    fn gives_fsids(&self) -> bool {
        false
    }
    /// The exports an earlier run recorded.
    fn load(&self) -> Result<Vec<ExportRecord>, ExportError>;
    /// Serves `next` in place of `previous`, persisting it; `all` is the table with
    /// `next` in it.
    fn apply(
        &self,
        previous: Option<&ExportRecord>,
        next: &ExportRecord,
        all: &Table,
    ) -> Result<(), ExportError>;
    /// Serves each of `changes` as [`Self::apply`] would, with one result per change in
    /// order; `all` is the table with every change in it. A server that can take several
    /// changes in one call, with one sync of its files for all, overrides this; the
    /// default applies them one by one and stops calling a server that does not answer.
    fn apply_all(&self, changes: &[Change<'_>], all: &Table) -> Vec<Result<(), ExportError>> {
        let mut results = Vec::with_capacity(changes.len());
        let mut unanswered: Option<String> = None;
        for (previous, next) in changes {
            let result = match &unanswered {
                Some(why) => Err(ExportError::Unavailable(why.clone())),
                None => self.apply(*previous, next, all),
            };
            if let Err(ExportError::Unavailable(why)) = &result {
                unanswered = Some(why.clone());
            }
            results.push(result);
        }
        results
    }
    /// Stops serving `record` and forgets it; `all` is the table without it.
    fn remove(&self, record: &ExportRecord, all: &Table) -> Result<(), ExportError>;
    /// Stops serving `record` for a while and keeps it: the server lets go of the
    /// volume's filesystem (so that it can be unmounted), and serves it again at
    /// [`Self::resume`] or, after a crash, at the next start.
    fn suspend(&self, record: &ExportRecord) -> Result<(), ExportError>;
    /// Serves again, unchanged, the `record` [`Self::suspend`] stopped serving.
    fn resume(&self, record: &ExportRecord) -> Result<(), ExportError>;
    /// At start: makes the server serve exactly `all`.
    fn restore(&self, all: &Table) -> Result<Restored, ExportError>;
    /// A pass of the reconciler: compares what the server serves with `all` and
    /// serves again what is missing or differs, as a start does.
    fn reconcile(&self, all: &Table) -> Result<Restored, ExportError> {
        self.restore(all)
    }
    /// Calls `restarted` whenever the server is seen to start again, for as long as it
    /// answers `true` (its table is still there); nothing for a server whose restarts
    /// cannot be seen.
    fn watch_restarts(&self, restarted: Box<dyn Fn() -> bool + Send>) {
        drop(restarted);
    }
    /// Whether what the server serves can be compared with the table cheaply enough
    /// to do it on a timer (one query), not only after a failure.
    fn compares_cheaply(&self) -> bool {
        false
    }
}

/// Why an export could not be changed.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("this agent exports no volume by itself (no export manager)")]
    NoManager,
    #[error("no free export id left in exports.ganesha_first_export_id .. ganesha_last_export_id")]
    NoFreeId,
    #[error("the NFS server refused: {0}")]
    Server(String),
    /// The server or the bus to it did not answer in time, or is not there: nothing
    /// was changed that the reconciler will not set right.
    #[error("the NFS server does not answer: {0}")]
    Unavailable(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Corrupt(String),
}

impl ExportError {
    pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| ExportError::Io { what, source }
    }

    pub fn to_api_error(&self) -> ApiError {
        let code = match self {
            ExportError::NoManager => ErrorCode::Unsupported,
            ExportError::NoFreeId => ErrorCode::Conflict,
            ExportError::Unavailable(_) => ErrorCode::NfsServerUnavailable,
            _ => ErrorCode::Internal,
        };
        ApiError::new(code, self.to_string())
    }
}
