//! Rotation edge cases: a CA whose certificates are already due for renewal (tiny validity,
//! a lagging clock) does not make the cache spin, and a certificate that is not valid now is
//! refused, the old one kept and the request retried with backoff.
//!
//! The tests that count renewals run on paused tokio time, so that a loaded machine cannot
//! change the count; the CAs' clocks (and so the certificates' validity) are the machine's.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    BoxFuture, CaClient, CaError, CertificateRequest, RotationConfig, SpiffeId, SvidCache,
    TrustDomain, check_validity,
};
use rcgen::{
    CertificateParams, CertificateSigningRequestParams, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::CertificateDer;
use tokio::time::{Instant, sleep};

const WEB: &str = "spiffe://a.test/ns/shop/sa/web";

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

/// A CA whose clock is `offset` seconds off this machine's (negative: behind), issuing
/// certificates valid from its "now" for `validity` seconds.
struct ClockCa {
    issuer: Issuer<'static, KeyPair>,
    offset: AtomicI64,
    validity: i64,
    requests: AtomicUsize,
}

impl ClockCa {
    fn new(offset: i64, validity: i64) -> Self {
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign];
        let key = KeyPair::generate().unwrap();
        Self {
            issuer: Issuer::new(params, key),
            offset: AtomicI64::new(offset),
            validity,
            requests: AtomicUsize::new(0),
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl CaClient for ClockCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let mut csr = CertificateSigningRequestParams::from_pem(&request.csr_pem).unwrap();
        let now = time::OffsetDateTime::now_utc()
            + time::Duration::seconds(self.offset.load(Ordering::SeqCst));
        csr.params.not_before = now;
        csr.params.not_after = now + time::Duration::seconds(self.validity);
        csr.params.is_ca = IsCa::ExplicitNoCa;
        csr.params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let cert = csr.signed_by(&self.issuer).unwrap();
        Box::pin(std::future::ready(Ok(vec![cert.der().clone()])))
    }
}

/// Counts the requests to `inner`, and past `cap` never answers: a cache that spins then
/// waits on it, paused time moves on, and the count assertion fails instead of the test
/// hanging on a runtime that is never idle.
struct Capped<C> {
    inner: C,
    cap: usize,
    requests: AtomicUsize,
}

impl<C> Capped<C> {
    fn new(inner: C, cap: usize) -> Self {
        Self {
            inner,
            cap,
            requests: AtomicUsize::new(0),
        }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

impl<C: CaClient> CaClient for Capped<C> {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        if self.requests.fetch_add(1, Ordering::SeqCst) >= self.cap {
            return Box::pin(std::future::pending());
        }
        self.inner.sign(request)
    }
}

/// Awaits `fut` for at most `limit` (simulated time in the paused tests), failing with `what`.
async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

/// The machine's wall time moved on by the simulated time since `start`: `SystemTime` stands
/// still while paused time jumps ahead.
fn simulated_now(wall_start: SystemTime, start: Instant) -> SystemTime {
    wall_start + start.elapsed()
}

fn config() -> RotationConfig {
    RotationConfig::default()
        .with_validity(Duration::from_secs(1000))
        .with_backoff(Duration::from_secs(1), Duration::from_secs(8))
}

#[tokio::test(start_paused = true)]
async fn certificates_already_due_for_renewal_do_not_make_the_cache_spin() {
    // Leaves of one second (backdated a minute): every one is past its refresh point the moment
    // it arrives. Two and a half seconds of paused time.
    let test_ca = TestCa::new(TrustDomain::new("a.test").unwrap());
    test_ca.set_max_validity(Some(Duration::from_secs(1)));
    let ca = Arc::new(Capped::new(test_ca, 10));
    let cache = SvidCache::new(ca.clone(), config());
    let _rx = cache.get(&id(WEB)).await.unwrap();
    sleep(Duration::from_millis(2500)).await;
    // The minimum delay (1 s, then doubling with jitter): renewals at +1..1.25 s and
    // +3..3.75 s, so the first request and one renewal.
    let requests = ca.requests();
    assert!(
        (2..=4).contains(&requests),
        "{requests} CA requests in 2.5 s"
    );
    cache.forget(&id(WEB));
}

#[tokio::test(start_paused = true)]
async fn a_lagging_ca_clock_does_not_make_the_cache_spin() {
    // The CA's clock is 700 s behind: its 1,000 s certificates are valid for 300 s more but
    // past half-life already, so renewal is always due. Two and a half seconds of paused time.
    let ca = Arc::new(Capped::new(ClockCa::new(-700, 1000), 10));
    let cache = SvidCache::new(ca.clone(), config());
    let _rx = cache.get(&id(WEB)).await.unwrap();
    sleep(Duration::from_millis(2500)).await;
    let requests = ca.requests();
    assert!(
        (2..=4).contains(&requests),
        "{requests} CA requests in 2.5 s"
    );
    cache.forget(&id(WEB));
}

#[tokio::test]
async fn an_expired_certificate_from_the_ca_is_refused() {
    // The CA's clock is two hours behind: its 1,000 s certificates expired before they arrive.
    let ca = ClockCa::new(-7200, 1000);
    let cache = SvidCache::new(ca, config());
    let err = cache.get(&id(WEB)).await.unwrap_err();
    assert!(matches!(err, CaError::NotValidNow { .. }), "{err:?}");
    assert!(cache.current(&id(WEB)).is_none());
}

#[tokio::test]
async fn a_certificate_valid_only_later_is_refused_beyond_the_allowed_skew() {
    // An hour ahead: not valid for an hour yet.
    let cache = SvidCache::new(ClockCa::new(3600, 7200), config());
    let err = cache.get(&id(WEB)).await.unwrap_err();
    assert!(matches!(err, CaError::NotValidNow { .. }), "{err:?}");
    // Twenty seconds ahead is within the default skew (60 s): accepted.
    let cache = SvidCache::new(ClockCa::new(20, 7200), config());
    assert!(cache.get(&id(WEB)).await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn an_expired_renewal_keeps_the_old_certificate_and_is_retried_with_backoff() {
    // Paused time: 10 s certificates renewed at a fifth of their lifetime (about 1.5..2 s),
    // retried after 0.5 s doubling to 2 s.
    let (wall_start, start) = (SystemTime::now(), Instant::now());
    let ca = Arc::new(ClockCa::new(0, 10));
    let config = RotationConfig::default()
        .with_validity(Duration::from_secs(10))
        .with_refresh(0.2, 0.05)
        .with_backoff(Duration::from_millis(500), Duration::from_secs(2));
    let cache = SvidCache::new(ca.clone(), config);
    let mut rx = cache.get(&id(WEB)).await.unwrap();
    let first = rx.borrow_and_update().clone();
    // From now on the CA's clock lags two hours: every answer is expired.
    ca.offset.store(-7200, Ordering::SeqCst);
    within(
        Duration::from_secs(30),
        "the first renewal attempt",
        async {
            while ca.requests() < 2 {
                sleep(Duration::from_millis(20)).await;
            }
        },
    )
    .await;
    sleep(Duration::from_millis(3000)).await;
    // Retries at +0.5, +1.5, then +3.5 s (jitter adds up to 25%, the 2 s cap holds after
    // it): two in 3 s.
    let attempts = ca.requests() - 2;
    assert_eq!(attempts, 2, "{attempts} retries in 3 s");
    assert!(
        !rx.has_changed().unwrap(),
        "an expired certificate is never published"
    );
    assert_eq!(
        rx.borrow().leaf(),
        first.leaf(),
        "the old one keeps serving"
    );
    // Still valid on the clock that moved with the retries.
    check_validity(&first, simulated_now(wall_start, start), Duration::ZERO)
        .expect("the old one is still valid");

    ca.offset.store(0, Ordering::SeqCst);
    within(
        Duration::from_secs(3),
        "renewed within one backoff period",
        rx.changed(),
    )
    .await
    .unwrap();
    check_validity(
        &rx.borrow(),
        simulated_now(wall_start, start),
        Duration::ZERO,
    )
    .expect("the new one is valid");
    cache.forget(&id(WEB));
}
