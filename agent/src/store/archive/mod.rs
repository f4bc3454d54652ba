//! The archive area beneath the root, `.archive`: how archives are named in it
//! (`naming`), how they are found, opened and tidied away once deleted (`area`), and how
//! a new volume is made from one (`restore`).

pub(super) mod area;
pub(super) mod naming;
mod restore;
