//! A cache of SVIDs per identity that renews each one before it expires.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use tokio::sync::{OnceCell, watch};
use tokio::task::AbortHandle;

use rustls::crypto::CryptoProvider;

use crate::ca::{CaClient, CaError, DEFAULT_MAX_CLOCK_SKEW, request_checked};
use crate::spiffe::SpiffeId;
use crate::svid::X509Svid;

/// When and how the cache renews certificates, and the provider that loads their keys.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RotationConfig {
    /// Validity requested from the CA. Default: 24 hours.
    pub validity: Duration,
    /// Fraction of the lifetime after which a certificate is renewed. Default: 0.5 (half-life).
    pub refresh_fraction: f64,
    /// Up to this fraction of the lifetime is taken off the refresh time at random, so that
    /// certificates issued together are not renewed together. Default: 0.1.
    pub jitter_fraction: f64,
    /// First wait after a failed renewal. Default: 1 second.
    pub initial_backoff: Duration,
    /// Longest wait between failed renewals; the wait doubles up to it. Default: 60 seconds.
    pub max_backoff: Duration,
    /// Shortest wait between two renewals of one identity, however early the certificate
    /// says it is due (a CA that grants a tiny validity, or whose clock lags, hands out
    /// certificates already past their refresh point). While renewals keep coming back due,
    /// the wait doubles from this, with jitter, up to `max_backoff`. Zero turns the minimum
    /// off. Default: 1 second.
    pub min_refresh_delay: Duration,
    /// How far in the future a new certificate's `notBefore` may be (clocks differ a little);
    /// a certificate valid only later, or already expired, is refused
    /// ([`CaError::NotValidNow`]), the current one kept and the request retried with backoff.
    /// Default: [`DEFAULT_MAX_CLOCK_SKEW`](crate::DEFAULT_MAX_CLOCK_SKEW), 60 seconds.
    pub max_clock_skew: Duration,
    /// The crypto provider that loads each new SVID's private key, and so signs the
    /// handshakes made with it. Default: [`default_provider`](crate::default_provider).
    pub provider: Arc<CryptoProvider>,
}

impl PartialEq for RotationConfig {
    fn eq(&self, other: &Self) -> bool {
        self.validity == other.validity
            && self.refresh_fraction == other.refresh_fraction
            && self.jitter_fraction == other.jitter_fraction
            && self.initial_backoff == other.initial_backoff
            && self.max_backoff == other.max_backoff
            && self.min_refresh_delay == other.min_refresh_delay
            && self.max_clock_skew == other.max_clock_skew
            && Arc::ptr_eq(&self.provider, &other.provider)
    }
}

impl Default for RotationConfig {
    fn default() -> Self {
        Self {
            validity: Duration::from_secs(24 * 60 * 60),
            refresh_fraction: 0.5,
            jitter_fraction: 0.1,
            initial_backoff: Duration::from_secs(1),
            max_backoff: Duration::from_secs(60),
            min_refresh_delay: Duration::from_secs(1),
            max_clock_skew: DEFAULT_MAX_CLOCK_SKEW,
            provider: crate::default_provider(),
        }
    }
}

impl RotationConfig {
    /// Sets the validity requested from the CA.
    pub fn with_validity(mut self, validity: Duration) -> Self {
        self.validity = validity;
        self
    }

    /// Sets the renewal point and its jitter, as fractions of the lifetime.
    pub fn with_refresh(mut self, refresh_fraction: f64, jitter_fraction: f64) -> Self {
        self.refresh_fraction = refresh_fraction.clamp(0.0, 1.0);
        self.jitter_fraction = jitter_fraction.clamp(0.0, self.refresh_fraction);
        self
    }

    /// Sets the crypto provider that loads the SVIDs' keys.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = provider;
        self
    }

    /// Sets the retry backoff after a failed renewal.
    pub fn with_backoff(mut self, initial: Duration, max: Duration) -> Self {
        self.initial_backoff = initial;
        self.max_backoff = max.max(initial);
        self
    }

    /// Sets the shortest wait between two renewals ([`RotationConfig::min_refresh_delay`]).
    pub fn with_min_refresh_delay(mut self, delay: Duration) -> Self {
        self.min_refresh_delay = delay;
        self
    }

    /// Sets the clock skew allowed for a new certificate's `notBefore`
    /// ([`RotationConfig::max_clock_skew`]).
    pub fn with_max_clock_skew(mut self, skew: Duration) -> Self {
        self.max_clock_skew = skew;
        self
    }

    /// How long after `now` to renew `svid`: at `refresh_fraction` of its lifetime, minus a
    /// random share of up to `jitter_fraction` of it; zero when that point has passed.
    pub fn refresh_delay(&self, svid: &X509Svid, now: SystemTime) -> Duration {
        let lifetime = svid
            .not_after()
            .duration_since(svid.not_before())
            .unwrap_or_default();
        let jitter = lifetime.mul_f64(self.jitter_fraction * fastrand::f64());
        let at = svid.not_before() + lifetime.mul_f64(self.refresh_fraction);
        let at = at.checked_sub(jitter).unwrap_or(at);
        at.duration_since(now).unwrap_or_default()
    }

    fn backoff_with_jitter(&self, backoff: Duration) -> Duration {
        // Up to a quarter of the backoff at random, so that proxies that lost the CA together
        // do not all come back at once; the cap holds after jitter.
        (backoff + backoff.mul_f64(0.25 * fastrand::f64())).min(self.max_backoff)
    }
}

type Slot = Arc<OnceCell<watch::Receiver<Arc<X509Svid>>>>;

/// SVIDs per identity, fetched from a [`CaClient`] on first use and renewed in the background.
///
/// - Renewal happens at half-life (see [`RotationConfig`]) with jitter, and never sooner than
///   [`RotationConfig::min_refresh_delay`] after the previous one (backing off while
///   certificates keep arriving already due), so a tiny validity or a lagging CA clock cannot
///   make it spin.
/// - A failed renewal is retried with capped exponential backoff; meanwhile the current SVID
///   keeps being served (it is still valid: renewal starts at half-life). A certificate that is
///   expired or not yet valid ([`CaError::NotValidNow`]) counts as a failure: it is never
///   served or published.
/// - Each identity's SVID is published on a [`watch`] channel: new handshakes pick up the new
///   certificate (see [`SvidSource::Rotating`](crate::SvidSource::Rotating)), open connections
///   are untouched.
/// - Concurrent first requests for one identity share a single CA request.
///
/// Dropping the cache (every clone) stops the renewal tasks. Needs a tokio runtime.
#[derive(Clone)]
pub struct SvidCache {
    inner: Arc<Inner>,
}

struct Inner {
    ca: Arc<dyn CaClient>,
    config: RotationConfig,
    slots: Mutex<HashMap<SpiffeId, Slot>>,
    tasks: Mutex<HashMap<SpiffeId, AbortHandle>>,
}

// === impl SvidCache ===

impl SvidCache {
    /// A cache that requests certificates from `ca`.
    pub fn new(ca: impl CaClient + 'static, config: RotationConfig) -> Self {
        Self {
            inner: Arc::new(Inner {
                ca: Arc::new(ca),
                config,
                slots: Mutex::default(),
                tasks: Mutex::default(),
            }),
        }
    }

    /// The live SVID of `id`, requesting it from the CA the first time.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if this future is dropped while the CA request is in flight, another
    /// caller waiting for the same identity takes over, or the next call starts again.
    ///
    /// # Errors
    ///
    /// The [`CaError`] of the first request; the next call tries again.
    pub async fn get(&self, id: &SpiffeId) -> Result<watch::Receiver<Arc<X509Svid>>, CaError> {
        let slot = lock(&self.inner.slots)
            .entry(id.clone())
            .or_default()
            .clone();
        let rx = slot
            .get_or_try_init(|| async {
                let config = &self.inner.config;
                let svid = request_checked(
                    &*self.inner.ca,
                    id,
                    config.validity,
                    &config.provider,
                    config.max_clock_skew,
                )
                .await?;
                tracing::info!(%id, not_after = ?svid.not_after(), "obtained SVID");
                let (tx, rx) = watch::channel(Arc::new(svid));
                let task = tokio::spawn(renew(
                    self.inner.ca.clone(),
                    self.inner.config.clone(),
                    id.clone(),
                    tx,
                ));
                lock(&self.inner.tasks).insert(id.clone(), task.abort_handle());
                Ok::<_, CaError>(rx)
            })
            .await?;
        Ok(rx.clone())
    }

    /// The current SVID of `id`, if it has been obtained.
    pub fn current(&self, id: &SpiffeId) -> Option<Arc<X509Svid>> {
        let slot = lock(&self.inner.slots).get(id).cloned()?;
        slot.get().map(|rx| rx.borrow().clone())
    }

    /// Stops renewing `id` and drops it from the cache. Receivers already handed out keep
    /// their last value.
    pub fn forget(&self, id: &SpiffeId) {
        lock(&self.inner.slots).remove(id);
        if let Some(task) = lock(&self.inner.tasks).remove(id) {
            task.abort();
        }
    }

    /// The identities in the cache.
    pub fn identities(&self) -> Vec<SpiffeId> {
        lock(&self.inner.slots).keys().cloned().collect()
    }
}

impl fmt::Debug for SvidCache {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SvidCache")
            .field("config", &self.inner.config)
            .field("identities", &self.identities())
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for task in lock(&self.tasks).values() {
            task.abort();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps stay consistent even if a holder panicked; keep going.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Renews one identity forever: wait for the refresh point (at least the minimum delay), then
/// ask the CA until it answers with a certificate valid now.
async fn renew(
    ca: Arc<dyn CaClient>,
    config: RotationConfig,
    id: SpiffeId,
    tx: watch::Sender<Arc<X509Svid>>,
) {
    // The wait imposed when a certificate is already due: the minimum delay, doubling while
    // certificates keep arriving due, reset by one that is not.
    let mut due_backoff = config.min_refresh_delay;
    loop {
        let delay = config.refresh_delay(&tx.borrow(), SystemTime::now());
        let delay = if delay < config.min_refresh_delay {
            let wait = config
                .backoff_with_jitter(due_backoff)
                .max(config.min_refresh_delay);
            tracing::debug!(%id, wait = ?wait, "certificate already due for renewal; waiting the minimum delay");
            due_backoff = (due_backoff * 2).min(config.max_backoff);
            wait
        } else {
            due_backoff = config.min_refresh_delay;
            delay
        };
        tokio::time::sleep(delay).await;
        let mut backoff = config.initial_backoff;
        loop {
            match request_checked(
                &*ca,
                &id,
                config.validity,
                &config.provider,
                config.max_clock_skew,
            )
            .await
            {
                Ok(svid) => {
                    tracing::info!(%id, not_after = ?svid.not_after(), "renewed SVID");
                    tx.send_replace(Arc::new(svid));
                    break;
                }
                Err(error) => {
                    let wait = config.backoff_with_jitter(backoff);
                    tracing::warn!(%id, error = %crate::ErrorChain(&error), retry_in = ?wait, "SVID renewal failed; still serving the current one");
                    tokio::time::sleep(wait).await;
                    backoff = (backoff * 2).min(config.max_backoff);
                }
            }
        }
    }
}
