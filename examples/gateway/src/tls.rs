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

/// Picks the certificate for the SNI from the newest configuration at the time of the
/// handshake: on a port of a Gateway API HTTPS listener, the first available Secret of the
/// listener that takes the name; elsewhere the Secret that an Ingress's `spec.tls` names.
#[derive(Debug)]
pub(super) struct SniResolver {
    pub(super) current: watch::Receiver<Arc<Compiled>>,
    /// `Some(port)` on a Gateway API listener of that port: the certificate is the Gateway
    /// listener's.
    pub(super) gateway_api: Option<u16>,
}

impl ResolvesServerCert for SniResolver {
    fn resolve(&self, hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let compiled = self.current.borrow().clone();
        if let Some(port) = self.gateway_api {
            // Without SNI, the listener without a hostname (if there is one) takes it.
            let name = hello.server_name().unwrap_or("");
            let refs = compiled.http_routes.certificates_for(port, name)?;
            let key = refs
                .iter()
                .find_map(|r| compiled.certs.get(&(r.namespace.clone(), r.name.clone())))
                .cloned();
            if key.is_none() {
                tracing::info!(
                    sni = name,
                    port,
                    "no certificate of the Gateway listener is available"
                );
            }
            return key;
        }
        let name = hello.server_name()?;
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

/// What a TLS Secret's certificate is, for the config dump and the expiry gauge: never its
/// key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CertInfo {
    pub(super) namespace: String,
    pub(super) name: String,
    /// The leaf's DNS names (subject alternative names), else its common name.
    pub(super) dns_names: Vec<String>,
    /// The leaf's `notAfter`, seconds since the Unix epoch.
    pub(super) not_after: Option<i64>,
    /// Why the Secret is not served, if it is not.
    pub(super) error: Option<String>,
}

/// Describes each Secret's leaf certificate (and whether the gateway could load the pair).
pub(super) fn describe(secrets: &[TlsCertificate], store: &CertStore) -> Vec<CertInfo> {
    secrets
        .iter()
        .map(|s| {
            let mut info = CertInfo {
                namespace: s.namespace.clone(),
                name: s.name.clone(),
                dns_names: Vec::new(),
                not_after: None,
                error: None,
            };
            match CertificateDer::pem_slice_iter(s.cert_pem.as_bytes()).next() {
                Some(Ok(der)) => match x509_parser::parse_x509_certificate(&der) {
                    Ok((_, cert)) => {
                        info.not_after = Some(cert.validity().not_after.timestamp());
                        if let Ok(Some(san)) = cert.subject_alternative_name() {
                            for name in &san.value.general_names {
                                if let x509_parser::extensions::GeneralName::DNSName(dns) = name {
                                    info.dns_names.push((*dns).to_owned());
                                }
                            }
                        }
                        if info.dns_names.is_empty() {
                            info.dns_names.extend(
                                cert.subject()
                                    .iter_common_name()
                                    .filter_map(|cn| cn.as_str().ok())
                                    .map(str::to_owned),
                            );
                        }
                    }
                    Err(e) => info.error = Some(format!("tls.crt: {e}")),
                },
                Some(Err(e)) => info.error = Some(format!("tls.crt: {e}")),
                None => info.error = Some("tls.crt holds no certificate".into()),
            }
            if info.error.is_none() && !store.contains_key(&(s.namespace.clone(), s.name.clone())) {
                info.error = Some("not loaded (see the gateway's log)".into());
            }
            info
        })
        .collect()
}
