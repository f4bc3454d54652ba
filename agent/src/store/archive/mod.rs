//! The archive area beneath the root, `.archive`: how archives are named in it
//! (`naming`), and how they are found, opened and tidied away once deleted (`area`).

pub(super) mod area;
pub(super) mod naming;
