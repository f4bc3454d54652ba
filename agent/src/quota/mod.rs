//! Quota backends: how a volume's capacity is enforced by the filesystem under the
//! export root.

pub mod command;
