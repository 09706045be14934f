//! TLS for ADS and the CA: a serving certificate from the control plane's own CA, and an
//! accept loop that runs each handshake on its own task with a deadline.
//!
//! The serving certificate carries the DNS names of [`ServingTls::dns_names`] (default
//! `istiod.istio-system.svc`, the name Istio's clients check), every listen IP that is not a
//! wildcard as an IP SAN, and `spiffe://TRUST_DOMAIN/ns/istio-system/sa/istiod` as its URI
//! SAN; it chains to the mesh root, so a client needs only the root
//! ([`crate::ControlPlane::root_pem`]) and, when it dials an address the certificate does not
//! name, an alternate server name.
//!
//! It is signed by an intermediate of the mesh CA that the control plane makes at start and
//! keeps in memory only, so that it can be renewed while running: at half its validity
//! ([`ServingTls::validity`], default 30 days) a new certificate replaces it for new
//! connections (open ones keep theirs); a failed renewal is retried every minute.

use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use meshkit_identity::{CaSigner, SignError};
use rcgen::{
    CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa, KeyUsagePurpose,
    SanType,
};
use rustls::crypto::CryptoProvider;
use rustls::server::ResolvesServerCert;
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use tokio_rustls::TlsAcceptor;

use meshkit_hbone::fair::{FairSlots, source_key};

/// How ADS and the CA serve TLS. Build with [`ServingTls::default`] and the `with_*` methods.
#[derive(Debug, Clone)]
pub struct ServingTls {
    /// DNS SANs of the serving certificate. Default `["istiod.istio-system.svc"]`.
    pub dns_names: Vec<String>,
    /// Validity of the serving certificate, never beyond the CA's own; it is renewed at half
    /// of it. Default 30 days.
    pub validity: Duration,
    /// Deadline of each TLS handshake. Default 10 s.
    pub handshake_timeout: Duration,
    /// Handshakes in progress at once on each listener, shared fairly among sources as its
    /// connections are ([`ControlPlaneConfig::max_connections_per_source`](crate::ControlPlaneConfig::max_connections_per_source));
    /// a connection refused a place is closed at once. Default 1024.
    pub max_handshakes: usize,
    /// The crypto provider. Default meshkit-identity's (ring).
    pub provider: Option<Arc<CryptoProvider>>,
}

/// Why the serving certificate could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsSetupError {
    /// A DNS name is not valid in a certificate.
    #[error("{0:?} is not a valid DNS name for the serving certificate")]
    DnsName(String),
    /// The CA could not sign it.
    #[error("the CA could not sign the serving certificate")]
    Sign(#[source] SignError),
    /// rustls refused the configuration.
    #[error("the TLS configuration was refused")]
    Rustls(#[source] rustls::Error),
    /// The serving intermediate could not be made.
    #[error("the serving intermediate CA could not be made")]
    Intermediate(#[source] meshkit_identity::CaLoadError),
}

/// The current serving certificate, renewed by [`ServingCert::renew`]; the TLS acceptor asks
/// it for the certificate of each handshake.
pub(crate) struct ServingCert {
    signer: CaSigner,
    settings: ServingTls,
    ips: Vec<IpAddr>,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

// === impl ServingTls ===

impl Default for ServingTls {
    fn default() -> Self {
        Self {
            dns_names: vec!["istiod.istio-system.svc".to_owned()],
            validity: Duration::from_secs(30 * 24 * 3600),
            handshake_timeout: Duration::from_secs(10),
            max_handshakes: 1024,
            provider: None,
        }
    }
}

impl ServingTls {
    /// Sets the DNS SANs.
    pub fn with_dns_names(mut self, names: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.dns_names = names.into_iter().map(Into::into).collect();
        self
    }

    /// Sets the crypto provider.
    pub fn with_provider(mut self, provider: Arc<CryptoProvider>) -> Self {
        self.provider = Some(provider);
        self
    }

    /// Makes the serving intermediate of `ca`, issues the serving certificate for `ips` and
    /// builds the acceptor (TLS 1.3 and 1.2, ALPN `h2`, no client certificate: clients
    /// authenticate with tokens).
    pub(crate) fn acceptor(
        &self,
        ca: &CaSigner,
        ips: &[IpAddr],
    ) -> Result<(TlsAcceptor, Arc<ServingCert>), TlsSetupError> {
        let signer = ca.intermediate().map_err(TlsSetupError::Intermediate)?;
        let provider = self
            .provider
            .clone()
            .unwrap_or_else(meshkit_identity::default_provider);
        let first = issue(self, &signer, ips, &provider)?;
        let cert = Arc::new(ServingCert {
            signer,
            settings: self.clone(),
            ips: ips.to_vec(),
            provider: Arc::clone(&provider),
            current: RwLock::new(first),
        });
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsSetupError::Rustls)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::clone(&cert) as Arc<dyn ResolvesServerCert>);
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok((TlsAcceptor::from(Arc::new(config)), cert))
    }
}

// === impl ServingCert ===

impl ServingCert {
    /// Issues a new certificate and serves it from now on.
    pub(crate) fn renew(&self) -> Result<(), TlsSetupError> {
        let next = issue(&self.settings, &self.signer, &self.ips, &self.provider)?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = next;
        Ok(())
    }

    /// The certificate served now.
    pub(crate) fn current(&self) -> Arc<CertifiedKey> {
        Arc::clone(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// How long after an issue to renew: half the validity, at least a second.
    fn renew_after(&self) -> Duration {
        (self.settings.validity / 2).max(Duration::from_secs(1))
    }

    /// Renews at half-life until `stop` turns true; a failure is logged and retried after a
    /// minute (or the renewal period, when shorter).
    pub(crate) async fn renew_until(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let mut wait = self.renew_after();
        loop {
            tokio::select! {
                () = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            wait = match self.renew() {
                Ok(()) => {
                    tracing::info!("serving certificate renewed");
                    self.renew_after()
                }
                Err(e) => {
                    tracing::warn!(
                        error = %meshkit_identity::ErrorChain(&e),
                        "serving certificate renewal failed; retrying"
                    );
                    self.renew_after().min(Duration::from_secs(60))
                }
            };
        }
    }
}

impl std::fmt::Debug for ServingCert {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingCert")
            .field("dns_names", &self.settings.dns_names)
            .field("ips", &self.ips)
            .finish_non_exhaustive()
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current())
    }
}

/// One serving certificate signed by `ca`, as `settings` and `ips` say.
fn issue(
    settings: &ServingTls,
    ca: &CaSigner,
    ips: &[IpAddr],
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<CertifiedKey>, TlsSetupError> {
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    if let Some(first) = settings.dns_names.first() {
        dn.push(DnType::CommonName, first.as_str());
    }
    params.distinguished_name = dn;
    for name in &settings.dns_names {
        let dns = name
            .as_str()
            .try_into()
            .map_err(|_| TlsSetupError::DnsName(name.clone()))?;
        params.subject_alt_names.push(SanType::DnsName(dns));
    }
    for ip in ips.iter().filter(|ip| !ip.is_unspecified()) {
        if !params.subject_alt_names.contains(&SanType::IpAddress(*ip)) {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
    }
    let uri = format!("spiffe://{}/ns/istio-system/sa/istiod", ca.trust_domain());
    if let Ok(uri) = uri.as_str().try_into() {
        params.subject_alt_names.push(SanType::URI(uri));
    }
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let now = SystemTime::now();
    let not_after = (now + settings.validity).min(ca.not_after());
    params.not_before = (now - Duration::from_secs(60)).into();
    params.not_after = not_after.into();
    let (chain, key) = ca.sign_params(&params).map_err(TlsSetupError::Sign)?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(TlsSetupError::Rustls)?;
    Ok(Arc::new(CertifiedKey::new(chain, key)))
}

/// A served connection, plain or TLS, as tonic takes it. Its socket holds the connection's
/// place among the listener's ([`FairSlots`]) until it is dropped, and fails once the place
/// is taken for another source.
pub(crate) struct Conn(Box<dyn Io>, IpAddr);

impl crate::ca::PeerSource for Conn {
    fn source(&self) -> Option<IpAddr> {
        Some(self.1)
    }
}

trait Io: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> Io for T {}

impl AsyncRead for Conn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut *self.0).poll_shutdown(cx)
    }
    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut *self.0).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }
}

/// The connections of `listener`, through TLS when `tls` is set. Each handshake runs on its
/// own task with `timeout`; connections and handshakes in progress are each shared fairly
/// among sources ([`meshkit_hbone::fair`]): at most `max` connections open and
/// `per_source` from one source (an IPv4 address or an IPv6 /64), and when all are open, one
/// from a source holding fewer than the largest holder closes that holder's least recently
/// active connection; any other is closed at accept. Handshakes are shared the same way, at
/// most the `tls` setting's number at once. Refusals and evictions are counted in `counts`.
/// Ends when the returned stream is dropped.
pub(crate) fn incoming(
    listener: TcpListener,
    tls: Option<(TlsAcceptor, Duration, usize)>,
    max: usize,
    per_source: usize,
    counts: ListenerShares,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let slots = FairSlots::new(max, per_source);
    let handshakes = tls
        .as_ref()
        .map(|(_, _, max_handshakes)| FairSlots::new(*max_handshakes, per_source));
    counts.follow(slots.clone(), handshakes.clone());
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                () = tx.closed() => return,
            };
            let (tcp, source) = match accepted {
                Ok((tcp, peer)) => (tcp, source_key(peer.ip())),
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // A TLS connection needs two places; the connection's is checked before the
            // handshake's is taken (which may close another source's handshake), so that a
            // connection never evicts another and is then refused.
            let early = match &handshakes {
                Some(handshakes) if slots.check(source).is_ok() => match handshakes.admit(source) {
                    Ok(handshake) => Some(handshake),
                    Err(refusal) => {
                        tracing::warn!(%source, ?refusal, "no TLS handshake place for this source; closed");
                        continue;
                    }
                },
                _ => None,
            };
            let slot = match slots.admit(source) {
                Ok(slot) => slot,
                Err(refusal) => {
                    tracing::warn!(%source, ?refusal, "no connection place for this source; closed");
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let tcp = slot.hold(tcp);
            let (Some((acceptor, timeout, _)), Some(handshakes)) = (&tls, &handshakes) else {
                if tx.send(Ok(Conn(Box::new(tcp), source))).await.is_err() {
                    return;
                }
                continue;
            };
            let handshake = match early {
                Some(handshake) => handshake,
                // A place came back between the check and the admission.
                None => match handshakes.admit(source) {
                    Ok(handshake) => handshake,
                    Err(refusal) => {
                        tracing::warn!(%source, ?refusal, "no TLS handshake place for this source; closed");
                        continue;
                    }
                },
            };
            let (acceptor, timeout, tx) = (acceptor.clone(), *timeout, tx.clone());
            tokio::spawn(async move {
                let result = tokio::select! {
                    result = tokio::time::timeout(timeout, acceptor.accept(tcp)) => result,
                    () = handshake.evicted() => {
                        tracing::debug!(%source, "TLS handshake closed: its place went to another source");
                        return;
                    }
                };
                drop(handshake);
                match result {
                    Ok(Ok(tls)) => {
                        let _ = tx.send(Ok(Conn(Box::new(tls), source))).await;
                    }
                    Ok(Err(e)) => tracing::debug!(error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!("TLS handshake timed out"),
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// The fair shares of one listener's connections and TLS handshakes, for its metrics: set once
/// the listener serves.
#[derive(Debug, Clone, Default)]
pub(crate) struct ListenerShares(Arc<std::sync::OnceLock<(FairSlots, Option<FairSlots>)>>);

impl ListenerShares {
    fn follow(&self, connections: FairSlots, handshakes: Option<FairSlots>) {
        let _ = self.0.set((connections, handshakes));
    }

    /// Each reason's count: connections refused at accept because their source held its
    /// share or every place was held fairly, and open ones closed for a source holding fewer;
    /// `tls_*` the same for handshakes.
    pub(crate) fn counts(&self) -> Vec<(&'static str, u64)> {
        let Some((conns, handshakes)) = self.0.get() else {
            return Vec::new();
        };
        let mut counts = vec![
            ("source_share", conns.stats().refused_share()),
            ("full", conns.stats().refused_full()),
            ("evicted", conns.stats().evicted()),
        ];
        if let Some(h) = handshakes {
            counts.extend([
                ("tls_source_share", h.stats().refused_share()),
                ("tls_full", h.stats().refused_full()),
                ("tls_evicted", h.stats().evicted()),
            ]);
        }
        counts
    }
}

/// The IPs to name in the serving certificate.
pub(crate) fn listen_ips(addrs: &[SocketAddr]) -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = addrs.iter().map(SocketAddr::ip).collect();
    ips.dedup();
    ips
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::client::danger::ServerCertVerifier;

    #[test]
    fn renewal_replaces_the_certificate_with_one_that_still_chains_to_the_root() {
        let td = meshkit_identity::TrustDomain::new("cluster.local").unwrap();
        let ca = CaSigner::generate(td).unwrap();
        let settings = ServingTls {
            validity: Duration::from_secs(120),
            ..ServingTls::default()
        };
        let ip = IpAddr::from([127, 0, 0, 1]);
        let (_acceptor, cert) = settings.acceptor(&ca, &[ip]).unwrap();
        let first = cert.current();
        cert.renew().unwrap();
        let second = cert.current();
        assert_ne!(first.cert[0], second.cert[0], "a new leaf");
        assert_eq!(cert.renew_after(), Duration::from_secs(60));
        // Leaf, then the serving intermediate; the root is the mesh's.
        assert_eq!(second.cert.len(), 2);
        let mut roots = rustls::RootCertStore::empty();
        roots.add(ca.root().clone()).unwrap();
        let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(
            Arc::new(roots),
            meshkit_identity::default_provider(),
        )
        .build()
        .unwrap();
        for name in ["istiod.istio-system.svc", "127.0.0.1"] {
            verifier
                .verify_server_cert(
                    &second.cert[0],
                    &second.cert[1..],
                    &rustls::pki_types::ServerName::try_from(name).unwrap(),
                    &[],
                    rustls::pki_types::UnixTime::now(),
                )
                .unwrap_or_else(|e| panic!("{name}: {e}"));
        }
    }
}
