//! The archive area beneath the root, `.archive`: how archives are named in it
//! (`naming`), how they are found, opened and tidied away once deleted (`area`), and how
//! a new volume is made from one (`restore`), the sorted ids a page of them starts from
//! (`index`); the store's operations on them
//! (`operations`: archiving a volume, listing, measuring and deleting archives).

pub(super) mod area;
pub(super) mod index;
pub(super) mod naming;
mod operations;
mod restore;
