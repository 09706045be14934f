//! The SVID cache on paused tokio time: renewal before expiry, CA outages, deduplication, and
//! TLS connections across a rotation.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, BoxFuture, CaClient, CaError, CertificateRequest, PeerRole, RotationConfig,
    SpiffeId, SpiffeVerifier, SvidCache, SvidError, TlsSettings, TrustDomain, X509Svid,
    check_validity, peer_spiffe_id,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::{Instant, sleep};
use tokio_rustls::{TlsAcceptor, TlsConnector};

fn id(s: &str) -> SpiffeId {
    s.parse().unwrap()
}

const WEB: &str = "spiffe://a.test/ns/shop/sa/web";

fn ca() -> Arc<TestCa> {
    Arc::new(TestCa::new(TrustDomain::new("a.test").unwrap()))
}

/// Awaits `fut` for at most `limit` (simulated time in the paused tests), failing with `what`.
async fn within<F: Future>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(out) => out,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

/// A wall clock that follows tokio's paused clock: `SystemTime` stands still while paused
/// tests jump ahead, so validity "now" is the start's wall time plus the simulated time since.
struct SimulatedWallClock {
    wall: SystemTime,
    start: Instant,
}

impl SimulatedWallClock {
    fn start() -> Self {
        Self {
            wall: SystemTime::now(),
            start: Instant::now(),
        }
    }

    fn now(&self) -> SystemTime {
        self.wall + self.start.elapsed()
    }
}

/// 1,000 s certificates renewed at half-life minus up to 10%, retried every 1 s doubling to 8 s.
fn config() -> RotationConfig {
    RotationConfig::default()
        .with_validity(Duration::from_secs(1000))
        .with_refresh(0.5, 0.1)
        .with_backoff(Duration::from_secs(1), Duration::from_secs(8))
}

#[test]
fn refresh_delay_is_at_half_life_minus_jitter() {
    let ca = TestCa::new(TrustDomain::new("a.test").unwrap());
    let svid = ca.issue(id(WEB)); // valid from 60 s ago for 3,600 s: lifetime 3,660 s
    let lifetime = svid.not_after().duration_since(svid.not_before()).unwrap();
    let cfg = RotationConfig::default();
    let now = svid.not_before();
    for _ in 0..200 {
        let delay = cfg.refresh_delay(&svid, now);
        assert!(delay <= lifetime / 2, "{delay:?}");
        assert!(delay >= lifetime.mul_f64(0.4), "{delay:?}");
    }
    // Past the refresh point the delay is zero, not negative.
    assert_eq!(cfg.refresh_delay(&svid, svid.not_after()), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn certificate_is_replaced_before_it_expires() {
    let ca = ca();
    let cache = SvidCache::new(ca.clone(), config());
    let mut rx = cache.get(&id(WEB)).await.unwrap();
    let first = rx.borrow_and_update().clone();
    assert_eq!(first.spiffe_id(), &id(WEB));
    assert_eq!(ca.requests(), 1);
    // Lifetime is 1,060 s (60 s backdated); renewal at 424..530 s after not_before, that is
    // 364..470 s from now.
    let start = Instant::now();
    sleep(Duration::from_secs(360)).await;
    assert!(!rx.has_changed().unwrap());
    assert_eq!(ca.requests(), 1);

    within(Duration::from_secs(600), "the first renewal", rx.changed())
        .await
        .unwrap();
    let elapsed = start.elapsed();
    assert!(
        elapsed >= Duration::from_secs(364) && elapsed <= Duration::from_secs(471),
        "renewed after {elapsed:?}"
    );
    let second = rx.borrow_and_update().clone();
    assert_ne!(second.leaf(), first.leaf());
    assert_eq!(second.spiffe_id(), &id(WEB));
    assert_eq!(ca.requests(), 2);
    assert_eq!(cache.current(&id(WEB)).unwrap().leaf(), second.leaf());

    // And again, one renewal per lifetime half.
    within(Duration::from_secs(600), "the second renewal", rx.changed())
        .await
        .unwrap();
    assert_eq!(ca.requests(), 3);
}

#[tokio::test(start_paused = true)]
async fn ca_outage_is_retried_with_capped_backoff_while_the_old_certificate_serves() {
    let ca = ca();
    let cache = SvidCache::new(ca.clone(), config());
    let mut rx = cache.get(&id(WEB)).await.unwrap();
    let first = rx.borrow_and_update().clone();
    ca.set_failing(true);
    let clock = SimulatedWallClock::start();

    // Wait for the first renewal attempt (364..470 s from now), which fails.
    within(
        Duration::from_secs(471),
        "the first renewal attempt",
        async {
            while ca.requests() < 2 {
                sleep(Duration::from_millis(100)).await;
            }
        },
    )
    .await;

    // Retries after 1, 2, 4, then 8 s each (jitter adds up to 25% and the cap holds after it):
    // at +1..1.25, +3..3.75, +7..8.75, +15..16.75, then every 8 s: 14 in the next 100 s.
    sleep(Duration::from_secs(100)).await;
    let attempts = ca.requests() - 2;
    assert!(
        (13..=15).contains(&attempts),
        "{attempts} attempts in 100 s"
    );
    assert!(
        !rx.has_changed().unwrap(),
        "a failed renewal publishes nothing"
    );
    assert_eq!(
        rx.borrow().leaf(),
        first.leaf(),
        "the old SVID keeps serving"
    );
    // And it is still valid, on the clock that has moved with the outage (524..630 s into
    // its 1,060 s lifetime): a peer verifying it now accepts it.
    let now = clock.now();
    check_validity(&rx.borrow(), now, Duration::ZERO).expect("and it is still valid");
    let verifier = SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(id(WEB)));
    let verified = verifier.verify(
        rx.borrow().chain(),
        PeerRole::Server,
        UnixTime::since_unix_epoch(now.duration_since(SystemTime::UNIX_EPOCH).unwrap()),
    );
    assert_eq!(verified, Ok(id(WEB)), "a peer accepts it at {now:?}");

    ca.set_failing(false);
    tokio::time::timeout(Duration::from_secs(9), rx.changed())
        .await
        .expect("renewed within one backoff period")
        .unwrap();
    assert_ne!(rx.borrow_and_update().leaf(), first.leaf());

    // Renewal succeeded: no more requests until the next half-life.
    let after = ca.requests();
    sleep(Duration::from_secs(300)).await;
    assert_eq!(ca.requests(), after);
}

/// A CA that answers slowly and counts calls.
struct SlowCa {
    inner: Arc<TestCa>,
    calls: AtomicUsize,
}

impl CaClient for SlowCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            sleep(Duration::from_secs(2)).await;
            self.inner.sign(request).await
        })
    }
}

#[tokio::test(start_paused = true)]
async fn concurrent_requests_for_one_identity_share_one_ca_call() {
    let slow = Arc::new(SlowCa {
        inner: ca(),
        calls: AtomicUsize::new(0),
    });
    let cache = SvidCache::new(slow.clone(), config());
    let gets: Vec<_> = (0..20)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.get(&id(WEB)).await.unwrap() })
        })
        .collect();
    let mut leaves = Vec::new();
    for get in gets {
        leaves.push(get.await.unwrap().borrow().leaf().clone());
    }
    assert_eq!(slow.calls.load(Ordering::SeqCst), 1);
    assert!(leaves.windows(2).all(|w| w[0] == w[1]));

    // Another identity is its own request.
    cache
        .get(&id("spiffe://a.test/ns/shop/sa/db"))
        .await
        .unwrap();
    assert_eq!(slow.calls.load(Ordering::SeqCst), 2);
    assert_eq!(cache.identities().len(), 2);
}

#[tokio::test(start_paused = true)]
async fn first_request_failure_is_reported_and_retried_by_the_next_call() {
    let ca = ca();
    ca.set_failing(true);
    let cache = SvidCache::new(ca.clone(), config());
    assert!(matches!(
        cache.get(&id(WEB)).await,
        Err(CaError::Unavailable(_))
    ));
    assert!(cache.current(&id(WEB)).is_none());
    ca.set_failing(false);
    assert!(cache.get(&id(WEB)).await.is_ok());
    assert_eq!(ca.requests(), 2);
}

#[tokio::test(start_paused = true)]
async fn forget_stops_renewal() {
    let ca = ca();
    let cache = SvidCache::new(ca.clone(), config());
    let _rx = cache.get(&id(WEB)).await.unwrap();
    cache.forget(&id(WEB));
    sleep(Duration::from_secs(2000)).await;
    assert_eq!(ca.requests(), 1);
    assert!(cache.current(&id(WEB)).is_none());
}

#[tokio::test(start_paused = true)]
async fn open_connection_survives_rotation_and_new_ones_get_the_new_certificate() {
    let ca = ca();
    let cache = SvidCache::new(ca.clone(), config());
    let server_id = id("spiffe://a.test/ns/shop/sa/db");
    let mut rx = cache.get(&server_id).await.unwrap();
    let first_leaf = rx.borrow_and_update().leaf().clone();

    let tls = TlsSettings::default();
    let server = Arc::new(
        tls.server_config(
            rx.clone(),
            SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted),
        )
        .unwrap(),
    );
    let client = Arc::new(
        tls.client_config(
            ca.issue(id(WEB)),
            SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(server_id.clone())),
        )
        .unwrap(),
    );

    let connect = |server: Arc<rustls::ServerConfig>, client: Arc<rustls::ClientConfig>| async move {
        let (c, s) = tokio::io::duplex(16 * 1024);
        let name = ServerName::try_from("db.shop").unwrap();
        let (c, s) = within(Duration::from_secs(20), "the TLS handshake", async {
            tokio::join!(
                TlsConnector::from(client).connect(name, c),
                TlsAcceptor::from(server).accept(s)
            )
        })
        .await;
        let (c, mut s) = (c.unwrap(), s.unwrap());
        // An echo server on the accepted side.
        tokio::spawn(async move {
            let mut buf = [0; 64];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => s.write_all(&buf[..n]).await.unwrap(),
                }
            }
        });
        c
    };

    let mut old = connect(server.clone(), client.clone()).await;
    assert_eq!(old.get_ref().1.peer_certificates().unwrap()[0], first_leaf);

    within(Duration::from_secs(600), "the renewal", rx.changed())
        .await
        .unwrap();
    let second_leaf = rx.borrow().leaf().clone();
    assert_ne!(second_leaf, first_leaf);

    let mut new = connect(server, client).await;
    assert_eq!(new.get_ref().1.peer_certificates().unwrap()[0], second_leaf);
    assert_eq!(peer_spiffe_id(new.get_ref().1), Some(server_id));

    for conn in [&mut old, &mut new] {
        conn.write_all(b"still here").await.unwrap();
        let mut buf = [0; 10];
        within(
            Duration::from_secs(20),
            "the echo",
            conn.read_exact(&mut buf),
        )
        .await
        .unwrap();
        assert_eq!(&buf, b"still here");
    }
}

/// A CA that signs the CSR's key, as asked, but for another identity.
struct Confused {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    issued: SpiffeId,
}

impl Confused {
    fn new(issued: &str) -> Self {
        let mut params = rcgen::CertificateParams::default();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![rcgen::KeyUsagePurpose::KeyCertSign];
        Self {
            issuer: rcgen::Issuer::new(params, rcgen::KeyPair::generate().unwrap()),
            issued: id(issued),
        }
    }
}

impl CaClient for Confused {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(&request.csr_pem).unwrap();
        let leaf = TestCa::leaf_params(&self.issued);
        csr.params.subject_alt_names = leaf.subject_alt_names;
        csr.params.not_before = leaf.not_before;
        csr.params.not_after = leaf.not_after;
        csr.params.is_ca = rcgen::IsCa::ExplicitNoCa;
        csr.params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        let cert = csr.signed_by(&self.issuer).unwrap();
        Box::pin(std::future::ready(Ok(vec![cert.der().clone()])))
    }
}

#[tokio::test]
async fn wrong_identity_from_the_ca_is_refused() {
    let cache = SvidCache::new(Confused::new("spiffe://a.test/ns/other/sa/x"), config());
    let err = cache.get(&id(WEB)).await.unwrap_err();
    assert_eq!(
        err,
        CaError::WrongIdentity {
            requested: id(WEB),
            issued: id("spiffe://a.test/ns/other/sa/x"),
        }
    );
    assert!(cache.current(&id(WEB)).is_none());
}

#[tokio::test]
async fn a_certificate_for_another_key_from_the_ca_is_refused() {
    /// A CA that returns a valid SVID of the right identity, for a key of its own.
    struct OwnKey(Arc<TestCa>);
    impl CaClient for OwnKey {
        fn sign<'a>(
            &'a self,
            request: &'a CertificateRequest,
        ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
            let svid: X509Svid = self.0.issue(request.id.clone());
            Box::pin(std::future::ready(Ok(svid.chain().to_vec())))
        }
    }
    let cache = SvidCache::new(OwnKey(ca()), config());
    let err = cache.get(&id(WEB)).await.unwrap_err();
    assert!(
        matches!(err, CaError::InvalidSvid(SvidError::Key(_))),
        "{err:?}"
    );
}
