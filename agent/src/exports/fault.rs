//! A crash at a chosen point between a volume change and its export change (or within
//! a change that needs both), for the tests that show the start-up repair. Only debug
//! builds read the switch, so a release agent cannot be made to crash by its
//! environment.

/// Where a change can be interrupted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultPoint {
    /// The volume was made (or found) and its export not yet applied.
    AfterVolume,
    /// The export was removed from the NFS server and the volume not yet deleted or
    /// archived.
    AfterUnexport,
    /// ganesha on btrfs: the volume's own mount was made and ganesha not yet asked to
    /// export it.
    AfterMount,
    /// An image volume being grown offline: its export withheld and its filesystem
    /// unmounted, not yet grown nor mounted again.
    GrowUnmounted,
}

impl FaultPoint {
    #[cfg(debug_assertions)]
    fn name(self) -> &'static str {
        match self {
            FaultPoint::AfterVolume => "after-volume",
            FaultPoint::AfterUnexport => "after-unexport",
            FaultPoint::AfterMount => "after-mount",
            FaultPoint::GrowUnmounted => "grow-unmounted",
        }
    }
}

/// Ends the process at once, as a power cut would, when `NFSPROV_AGENT_CRASH_AT` names
/// `point` (debug builds only).
pub fn crash_if_asked(point: FaultPoint) {
    #[cfg(debug_assertions)]
    if std::env::var("NFSPROV_AGENT_CRASH_AT").is_ok_and(|asked| asked == point.name()) {
        std::process::abort();
    }
    #[cfg(not(debug_assertions))]
    let _ = point;
}
