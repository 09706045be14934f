//! SPIFFE identities for meshkit: what makes mutual TLS between workloads mean something.
//!
//! - [`SpiffeId`] and [`TrustDomain`]: strict parsing by the SPIFFE-ID standard, with a
//!   [`SpiffeIdError`] that says exactly what is wrong, and Istio `ns/sa` helpers.
//! - [`X509Svid`]: a workload's own chain and key, checked against the X509-SVID leaf rules
//!   ([`parse_leaf`]).
//! - [`TrustBundle`] / [`TrustBundleSet`]: roots per trust domain, from PEM or the SPIFFE JWKS
//!   bundle format; never merged across trust domains.
//! - [`SpiffeVerifier`]: leaf rules, the peer's own trust domain's roots, a webpki chain check,
//!   then an [`Authorizer`]; as rustls verifiers ([`SpiffeServerVerifier`],
//!   [`SpiffeClientVerifier`]) or directly on a DER chain ([`SpiffeVerifier::verify`]).
//!   [`peer_spiffe_id`] reads the verified peer ID after a handshake.
//! - [`TlsSettings`]: TLS 1.3-only client and server configs with ALPN `h2`.
//! - [`CertSelector`] and [`accept`]: per-connection certificate selection (by destination IP,
//!   by SNI, or a single identity) through tokio-rustls's `LazyConfigAcceptor`.
//! - [`SvidCache`]: SVIDs per identity from a [`CaClient`], renewed at half-life with jitter,
//!   retried with capped backoff, published on `watch` channels.
//! - [`CaSigner`]: a certificate authority for one trust domain, generated or loaded from PEM
//!   files (a root, or an intermediate with its chain), that signs CSRs into X509-SVIDs with
//!   the identity checked and the validity capped; the core of an Istio-protocol CA server.
//!
//! # Example
//!
//! Issue two SVIDs from a test CA and build a client and a server configuration that accept
//! each other (the `test-util` feature provides `test_util::TestCa`):
//!
//! ```
//! use meshkit_identity::{Authorize, SpiffeId, SpiffeVerifier, TlsSettings, TrustDomain};
//! use meshkit_identity::test_util::TestCa;
//!
//! let td = TrustDomain::new("cluster.local")?;
//! let ca = TestCa::new(td.clone());
//! let web = SpiffeId::from_istio(&td, "shop", "web")?;
//! let db = SpiffeId::from_istio(&td, "shop", "db")?;
//!
//! let tls = TlsSettings::default();
//! let server = tls.server_config(
//!     ca.issue(db.clone()),
//!     SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(web.clone())),
//! )?;
//! let client = tls.client_config(
//!     ca.issue(web),
//!     SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(db)),
//! )?;
//! # drop((server, client));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Feature flags
//!
//! - `test-util`: `test_util::TestCa`, an in-process CA for tests and demos: a [`CaSigner`]
//!   that can be told to fail and counts its requests. [`CaSigner`] itself needs no feature.
//! - `istio-ca`: a client (and a server adapter) for Istio's CA protocol,
//!   `istio.v1.auth.IstioCertificateService/CreateCertificate`, over tonic.
//! - `serde`: `Serialize` / `Deserialize` for [`SpiffeId`] and [`TrustDomain`] as strings.
//!
//! The crypto provider is rustls's ring provider unless another is passed to
//! [`TlsSettings::with_provider`] and [`SpiffeVerifier::with_provider`].
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions. Error enums are `#[non_exhaustive]`.
//! An error's `Display` says what failed at its own level only; the cause is its
//! [`source()`](std::error::Error::source), so print the chain to see everything.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod bundle;
mod ca;
#[cfg(feature = "istio-ca")]
pub mod istio;
mod report;
pub use report::ErrorChain;
mod rotate;
mod select;
mod signer;
mod spiffe;
mod svid;
#[cfg(feature = "test-util")]
pub mod test_util;
mod tls;
mod verify;

pub use bundle::{BundleError, TrustBundle, TrustBundleSet};
pub use ca::{
    CaClient, CaError, CertificateRequest, DEFAULT_MAX_CLOCK_SKEW, check_validity, generate_csr,
    request_svid, request_svid_with_provider,
};
pub use rotate::{RotationConfig, SvidCache};
pub use select::{
    AcceptError, BoxFuture, ByDestinationIp, BySni, CertSelector, ConnectionInfo, SingleIdentity,
    accept,
};
pub use signer::{CA_VALIDITY, CaLoadError, CaSigner, DEFAULT_MAX_VALIDITY, SignError};
pub use spiffe::{MAX_ID_LEN, MAX_TRUST_DOMAIN_LEN, SpiffeId, SpiffeIdError, TrustDomain};
pub use svid::{
    LeafInfo, SvidError, X509Svid, certs_from_pem, certs_to_pem, parse_leaf, private_key_to_pem,
};
pub use tls::{SvidResolver, SvidSource, TlsSettings, default_provider, prefer_aes_128_gcm};
pub use verify::{
    Authorize, Authorizer, PeerRole, SpiffeClientVerifier, SpiffeServerVerifier, SpiffeVerifier,
    VerifyError, peer_spiffe_id, verify_error,
};
