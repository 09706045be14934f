//! TLS termination: the certificate is chosen by SNI from the Ingresses' `spec.tls` and the
//! TLS Secrets of the current configuration.

use std::collections::HashMap;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio::sync::watch;

use rustls::crypto::CryptoProvider;

use super::{Compiled, TlsCertificate};

/// Parsed TLS Secrets by (namespace, name).
pub(super) type CertStore = HashMap<(String, String), Arc<CertifiedKey>>;

/// Parses the Secrets; a Secret that does not parse is logged and left out.
pub(super) fn load(secrets: &[TlsCertificate], provider: &Arc<CryptoProvider>) -> CertStore {
    let mut store = HashMap::new();
    for s in secrets {
        match certified_key(s, provider) {
            Ok(key) => {
                store.insert((s.namespace.clone(), s.name.clone()), Arc::new(key));
            }
            Err(e) => {
                tracing::warn!(namespace = %s.namespace, secret = %s.name, error = %e, "TLS secret skipped");
            }
        }
    }
    store
}

fn certified_key(
    secret: &TlsCertificate,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, String> {
    let certs = CertificateDer::pem_slice_iter(secret.cert_pem.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls.crt: {e}"))?;
    if certs.is_empty() {
        return Err("tls.crt holds no certificate".into());
    }
    let key = PrivateKeyDer::from_pem_slice(secret.key_pem.as_bytes())
        .map_err(|e| format!("tls.key: {e}"))?;
    let key = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| format!("tls.key: {e}"))?;
    Ok(CertifiedKey::new(certs, key))
}

/// Picks the certificate of the Secret that `spec.tls` names for the SNI, from the newest
/// configuration at the time of the handshake.
#[derive(Debug)]
pub(super) struct SniResolver(pub(super) watch::Receiver<Arc<Compiled>>);

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let name = hello.server_name()?;
        let compiled = self.0.borrow().clone();
        let secret = compiled.table.tls_secret_for(name)?;
        let key = compiled
            .certs
            .get(&(secret.namespace.to_owned(), secret.secret_name.to_owned()))
            .cloned();
        if key.is_none() {
            tracing::info!(
                sni = name,
                namespace = secret.namespace,
                secret = secret.secret_name,
                "TLS secret not available"
            );
        }
        key
    }
}

/// A server configuration that resolves certificates with `resolver`, offering HTTP/2 and
/// HTTP/1.1.
pub(super) fn server_config(
    resolver: SniResolver,
    provider: Arc<CryptoProvider>,
) -> Result<rustls::ServerConfig, rustls::Error> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(Arc::new(resolver));
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}
