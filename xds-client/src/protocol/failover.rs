//! Which of several ADS servers to use, by gRFC A71 ("xDS Fallback"), without I/O and without
//! a clock of its own.
//!
//! The servers are in priority order. The client streams from one, the *active* server, and
//! moves to the next when the active one fails: it cannot be reached, or its stream ends
//! before it sent a response. A stream that ends after a response is not a failure: the same
//! server is dialled again. While a lower-priority server is active, every higher-priority one
//! keeps being retried with its own backoff (a *probe*); the first of them to send a response
//! becomes the active server again, and the streams of the servers after it are closed. The
//! cache is the session's and is never touched by a switch.

use std::time::{Duration, Instant};

/// The server-choosing state machine. Feed it what happened to each server
/// ([`on_failure`](Failover::on_failure), [`on_response`](Failover::on_response),
/// [`on_closed`](Failover::on_closed)); ask it what to dial
/// ([`poll_connect`](Failover::poll_connect)) and when to ask again
/// ([`poll_timeout`](Failover::poll_timeout)).
///
/// ```
/// use std::time::{Duration, Instant};
/// use meshkit_xds_client::protocol::Failover;
///
/// let now = Instant::now();
/// let mut servers = Failover::new(2, now);
/// assert_eq!(servers.poll_connect(now), Some(0));
/// servers.on_failure(0, now); // the primary cannot be reached
/// assert_eq!(servers.active(), 1);
/// assert_eq!(servers.poll_connect(now), Some(1)); // the fallback, at once
/// servers.on_response(1, now);
/// // The primary is retried after its backoff; its first response makes it active again.
/// let retry = servers.poll_timeout().unwrap();
/// assert!(retry <= now + Duration::from_millis(500));
/// assert_eq!(servers.poll_connect(retry), Some(0));
/// assert!(servers.on_response(0, retry));
/// assert_eq!(servers.active(), 0);
/// ```
#[derive(Debug)]
pub struct Failover {
    servers: Vec<Server>,
    active: usize,
    backoff_initial: Duration,
    backoff_max: Duration,
    rng: fastrand::Rng,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Nothing open; dialled at `retry_at`, if set.
    Idle,
    /// Dialled and not yet answered.
    Connecting,
    /// Its current stream has sent a response.
    Answered,
}

#[derive(Debug)]
struct Server {
    phase: Phase,
    /// When an idle server is dialled next; `None`: not planned (a server after the active one).
    retry_at: Option<Instant>,
    /// Failures since it last answered: the exponent of its backoff.
    failures: u32,
}

// === impl Failover ===

impl Failover {
    /// `servers` servers in priority order (at least one is assumed), the first due at `now`.
    /// Backoff: 500 ms doubling to 30 s, each delay jittered to 50–100 %.
    pub fn new(servers: usize, now: Instant) -> Self {
        let mut list: Vec<Server> = (0..servers.max(1))
            .map(|_| Server {
                phase: Phase::Idle,
                retry_at: None,
                failures: 0,
            })
            .collect();
        list[0].retry_at = Some(now);
        Self {
            servers: list,
            active: 0,
            backoff_initial: Duration::from_millis(500),
            backoff_max: Duration::from_secs(30),
            rng: fastrand::Rng::new(),
        }
    }

    /// The backoff of each server: the first delay after a failure (or after a stream that had
    /// answered ends) is `initial`, doubling with each further failure up to `max`; each delay
    /// is jittered to between half and all of its nominal value.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.backoff_initial = initial;
        self.backoff_max = max.max(initial);
        self
    }

    /// The server whose stream feeds the session (or is being dialled for it).
    pub fn active(&self) -> usize {
        self.active
    }

    /// The next server to dial now, if any: the active server or, while a fallback is active,
    /// a higher-priority one to probe. The server is then connecting until the caller reports
    /// [`on_response`](Self::on_response) or [`on_failure`](Self::on_failure).
    pub fn poll_connect(&mut self, now: Instant) -> Option<usize> {
        let i = self.servers[..=self.active]
            .iter()
            .position(|s| s.phase == Phase::Idle && s.retry_at.is_some_and(|at| at <= now))?;
        let s = &mut self.servers[i];
        s.phase = Phase::Connecting;
        s.retry_at = None;
        Some(i)
    }

    /// When a server is next due to be dialled; call [`poll_connect`](Self::poll_connect) then.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.servers[..=self.active]
            .iter()
            .filter(|s| s.phase == Phase::Idle)
            .filter_map(|s| s.retry_at)
            .min()
    }

    /// `server` could not be reached, or its stream ended before it sent a response. It is
    /// retried after its backoff; if it was the active server and another follows it, that one
    /// becomes active and is due at once (or when its own backoff ends). Reports about a
    /// server after the active one (whose streams the caller has closed) are ignored.
    pub fn on_failure(&mut self, server: usize, now: Instant) {
        if server > self.active {
            return;
        }
        let delay = self.delay(self.servers[server].failures);
        let s = &mut self.servers[server];
        s.phase = Phase::Idle;
        s.failures = s.failures.saturating_add(1);
        s.retry_at = Some(now.checked_add(delay).unwrap_or(now));
        if server == self.active && server + 1 < self.servers.len() {
            self.active = server + 1;
            let next = &mut self.servers[self.active];
            if next.phase == Phase::Idle {
                next.retry_at = Some(next.retry_at.map_or(now, |at| at.max(now)));
            }
        }
    }

    /// `server` sent a response on its current stream (the first one is what counts). Its
    /// backoff resets. Returns true when it thereby becomes the active server: it had lower
    /// index than the active one, which, with every server after it, the caller now closes
    /// (gRFC A71: once a higher-priority server answers again, the fallback is dropped).
    pub fn on_response(&mut self, server: usize, _now: Instant) -> bool {
        if server > self.active {
            return false;
        }
        let s = &mut self.servers[server];
        s.phase = Phase::Answered;
        s.failures = 0;
        s.retry_at = None;
        if server == self.active {
            return false;
        }
        self.active = server;
        for s in &mut self.servers[server + 1..] {
            *s = Server {
                phase: Phase::Idle,
                retry_at: None,
                failures: 0,
            };
        }
        true
    }

    /// The stream of `server`, which had sent a response, ended: not a failure of the server,
    /// which is dialled again after the first backoff delay.
    pub fn on_closed(&mut self, server: usize, now: Instant) {
        if server > self.active {
            return;
        }
        let delay = self.delay(0);
        let s = &mut self.servers[server];
        s.phase = Phase::Idle;
        s.failures = 0;
        s.retry_at = Some(now.checked_add(delay).unwrap_or(now));
    }

    /// The jittered backoff delay after `failures` earlier failures.
    fn delay(&mut self, failures: u32) -> Duration {
        let nominal = self
            .backoff_initial
            .checked_mul(1u32 << failures.min(20))
            .unwrap_or(self.backoff_max)
            .min(self.backoff_max);
        // Jitter in [nominal/2, nominal] spreads the clients that lost the same server.
        nominal.mul_f64(0.5 + self.rng.f64() * 0.5)
    }
}
