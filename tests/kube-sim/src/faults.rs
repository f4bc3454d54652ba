//! Fault injection switched on by tests (library API) or over HTTP (`/_sim/faults`):
//! dropped watch connections, a fraction of requests answered 500 or 429, added latency.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::errors::ApiError;

/// Which error injected requests get.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectedError {
    /// 500 InternalError: not retried by kube's default client.
    Internal,
    /// 429 TooManyRequests with `Retry-After` (seconds): retried by kube's default client.
    TooManyRequests { retry_after_secs: u32 },
}

#[derive(Debug, Clone, Copy, Default)]
struct Settings {
    error_rate: f64,
    error: Option<InjectedError>,
    latency: Duration,
}

/// Shared fault switches. Cheap to consult on every request.
pub struct FaultControl {
    settings: Mutex<Settings>,
    drop_tx: watch::Sender<u64>,
    rng: AtomicU64,
    injected: AtomicU64,
}

impl Default for FaultControl {
    fn default() -> Self {
        Self::new()
    }
}

impl FaultControl {
    pub fn new() -> Self {
        use std::hash::{BuildHasher, RandomState};
        let seed = RandomState::new().hash_one(0u64) | 1;
        FaultControl {
            settings: Mutex::new(Settings::default()),
            drop_tx: watch::channel(0).0,
            rng: AtomicU64::new(seed),
            injected: AtomicU64::new(0),
        }
    }

    fn settings(&self) -> std::sync::MutexGuard<'_, Settings> {
        self.settings.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// End every open watch stream now (clients see the connection's response end and
    /// must resume from their last resourceVersion).
    pub fn drop_watches(&self) {
        self.drop_tx.send_modify(|g| *g += 1);
    }

    /// Answer `fraction` (0.0..=1.0) of API requests with `error` instead of serving them.
    pub fn set_error_rate(&self, fraction: f64, error: InjectedError) {
        let mut s = self.settings();
        s.error_rate = fraction.clamp(0.0, 1.0);
        s.error = Some(error);
    }

    /// Delay every API request (and the start of every watch) by `latency`.
    pub fn set_latency(&self, latency: Duration) {
        self.settings().latency = latency;
    }

    /// Back to normal service (open watches are not affected).
    pub fn clear(&self) {
        *self.settings() = Settings::default();
    }

    /// How many requests have been answered with an injected error so far.
    pub fn injected_errors(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }

    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_tx.subscribe()
    }

    fn next_random(&self) -> f64 {
        // xorshift64*: good enough to spread injected failures, no RNG dependency.
        let mut x = self.rng.load(Ordering::Relaxed);
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.store(x, Ordering::Relaxed);
        (x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Decide the fate of one request: the latency to add and maybe an error to answer.
    pub(crate) fn on_request(&self) -> (Duration, Option<ApiError>) {
        let s = *self.settings();
        let err = match s.error {
            Some(e) if s.error_rate > 0.0 && self.next_random() < s.error_rate => {
                self.injected.fetch_add(1, Ordering::Relaxed);
                Some(match e {
                    InjectedError::Internal => ApiError::internal(
                        "an error on the server (injected fault) has prevented the request from succeeding",
                    ),
                    InjectedError::TooManyRequests { retry_after_secs } => {
                        ApiError::too_many_requests(retry_after_secs)
                    }
                })
            }
            _ => None,
        };
        (s.latency, err)
    }
}
