//! What the control plane's admin endpoint shows beyond its metrics: the config dump, and
//! summaries of its certificates. Never a private key, never a token.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, OnceLock};

use meshkit_xds_server::SnapshotCache;
use serde_json::{Value, json};
use tokio::sync::watch;

use crate::LoadStatus;
use crate::metrics::xds_type_label;
use crate::tls::ServingCert;

/// The config dump's sources.
pub(crate) struct Dump {
    /// What the source is: the folder's path, or `kubernetes`.
    pub(crate) source: String,
    pub(crate) cache: SnapshotCache,
    pub(crate) status: watch::Receiver<LoadStatus>,
    /// Set once start-up has made them.
    pub(crate) facts: Arc<OnceLock<Facts>>,
}

/// What start-up fixes: addresses, the CA, the serving certificate, the grants.
pub(crate) struct Facts {
    pub(crate) ads_addr: SocketAddr,
    pub(crate) ca_addr: SocketAddr,
    pub(crate) admin_addr: Option<SocketAddr>,
    pub(crate) trust_domain: String,
    /// The root certificate's summary.
    pub(crate) root: Value,
    pub(crate) serving: Option<Arc<ServingCert>>,
    /// The token grants as they are now (dumped without the tokens).
    pub(crate) grants: tokio::sync::watch::Receiver<std::sync::Arc<crate::ca::TokenGrants>>,
}

// === impl Dump ===

impl Dump {
    /// The control plane's current configuration as JSON.
    pub(crate) fn render(&self) -> Value {
        let status = self.status.borrow().clone();
        let snapshot = self.cache.current();
        let mut types = serde_json::Map::new();
        for url in snapshot.type_urls() {
            let Some(ts) = snapshot.get_type(url) else {
                continue;
            };
            let resources: serde_json::Map<String, Value> = ts
                .resources()
                .iter()
                .map(|(name, r)| (name.to_owned(), Value::String(r.version.clone())))
                .collect();
            types.insert(
                url.to_owned(),
                json!({
                    "label": xds_type_label(url),
                    "version": ts.version(),
                    "resources": resources,
                }),
            );
        }
        let manifests = json!({
            "source": self.source,
            "loads": status.loads,
            "applied": status.applied,
            "errors": status.errors.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "warnings": status.warnings.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "gateway_api_status": status.gateway_api,
        });
        let Some(facts) = self.facts.get() else {
            return json!({ "starting": true, "manifests": manifests, "snapshot": types });
        };
        json!({
            "listeners": {
                "ads": facts.ads_addr.to_string(),
                "ca": facts.ca_addr.to_string(),
                "admin": facts.admin_addr.map(|a| a.to_string()),
                "tls": facts.serving.is_some(),
            },
            "manifests": manifests,
            "snapshot": types,
            "ca": {
                "trust_domain": facts.trust_domain,
                "root": facts.root,
            },
            "serving_certificate": facts
                .serving
                .as_ref()
                .map(|cert| cert_summary(cert.current().cert[0].as_ref())),
            "tokens": facts.grants.borrow().describe(),
        })
    }
}

/// A certificate's subject, names and validity, from its DER.
pub(crate) fn cert_summary(der: &[u8]) -> Value {
    let cert = match x509_parser::parse_x509_certificate(der) {
        Ok((_, cert)) => cert,
        Err(e) => return json!({ "error": e.to_string() }),
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        use x509_parser::extensions::GeneralName;
        for name in &san.value.general_names {
            match name {
                GeneralName::DNSName(dns) => names.push(format!("DNS:{dns}")),
                GeneralName::URI(uri) => names.push(format!("URI:{uri}")),
                GeneralName::IPAddress(bytes) => {
                    let ip = match bytes.len() {
                        4 => <[u8; 4]>::try_from(*bytes).ok().map(IpAddr::from),
                        16 => <[u8; 16]>::try_from(*bytes).ok().map(IpAddr::from),
                        _ => None,
                    };
                    if let Some(ip) = ip {
                        names.push(format!("IP:{ip}"));
                    }
                }
                _ => {}
            }
        }
    }
    let validity = cert.validity();
    json!({
        "subject": cert.subject().to_string(),
        "issuer": cert.issuer().to_string(),
        "subject_alt_names": names,
        "not_before": rfc3339(validity.not_before),
        "not_after": rfc3339(validity.not_after),
        "not_after_unix": validity.not_after.timestamp(),
    })
}

/// When a certificate (DER) expires, in Unix seconds.
pub(crate) fn not_after_unix(der: &[u8]) -> Option<i64> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some(cert.validity().not_after.timestamp())
}

fn rfc3339(t: x509_parser::time::ASN1Time) -> String {
    t.to_datetime()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| t.timestamp().to_string())
}
