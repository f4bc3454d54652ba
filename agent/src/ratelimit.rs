//! A bound on how many lines a kind of event may write to the log: whoever can reach the
//! port can cause unauthenticated requests and failed handshakes at will, and must not be
//! able to fill the disk or drown the lines that matter.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most `per_second` events a second; the ones over it are counted, and the count is
/// logged with the next allowed one.
#[derive(Debug)]
pub(crate) struct RateLimit {
    per_second: u32,
    /// What is counted, for the line that says how many were not logged.
    what: &'static str,
    window: Mutex<(Instant, u32, u64)>,
}

impl RateLimit {
    pub(crate) fn new(per_second: u32, what: &'static str) -> Self {
        Self {
            per_second,
            what,
            window: Mutex::new((Instant::now(), 0, 0)),
        }
    }

    /// Whether one more event may be logged now.
    pub(crate) fn allow(&self) -> bool {
        let mut window = self.window.lock().unwrap_or_else(|e| e.into_inner());
        let (started, _, suppressed) = &mut *window;
        if started.elapsed() >= Duration::from_secs(1) {
            if *suppressed > 0 {
                tracing::warn!(target: "audit", suppressed = *suppressed, what = self.what, "events not logged in the last second");
            }
            *window = (Instant::now(), 0, 0);
        }
        let (_, count, suppressed) = &mut *window;
        if *count < self.per_second {
            *count += 1;
            true
        } else {
            *suppressed += 1;
            false
        }
    }
}
