//! Archives: volumes archived instead of deleted, kept in the export root's archive area
//! until their retention runs out or they are deleted by hand.
//!
//! `retention` says how long an archive is kept (the settings, and when an archive
//! expires); `catalog` is the archives as the API and the retention sweep see them (the
//! listing, deletion, the sweep of expired ones). The store names and finds them on disk,
//! and the API's types are `nfsprov_api_types`'s.

pub(crate) mod catalog;
pub mod retention;
