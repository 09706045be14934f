//! The gateway's configuration from xDS: Ingresses, IngressClasses, the Gateway API objects,
//! TLS Secrets (SDS) and workload API Addresses in, a [`GatewayConfig`] on a `tokio::sync::watch` channel out.

use std::collections::BTreeMap;

use envoy_types::pb::envoy::config::core::v3::{DataSource, data_source};
use envoy_types::pb::envoy::extensions::transport_sockets::tls::v3::{Secret, secret};
use meshkit_ingress_model::gateway::manifest::GatewayApiObjects;
use meshkit_ingress_model::gateway::types::{Gateway, GatewayClass, HttpRoute, ReferenceGrant};
use meshkit_mesh::feed::{apply, mesh_config, spawn_client};
use meshkit_mesh::resources::{
    AddressResource, GatewayApiResource, IngressClassResource, IngressResource,
};
use meshkit_xds_client::{ClientConfig, XdsClient};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::{GatewayConfig, TlsCertificate};

/// Follows the Ingresses, IngressClasses, TLS Secrets and workload Addresses of the ADS
/// server that `config` names, as a gateway's configuration. Returns the view and the two
/// spawned tasks (the xDS driver and the feed); aborting them ends the subscription.
///
/// Must be called inside a tokio runtime.
pub fn gateway_config_over_xds(
    config: ClientConfig,
) -> (watch::Receiver<GatewayConfig>, Vec<JoinHandle<()>>) {
    let (client, driver) = spawn_client(config);
    let (tx, rx) = watch::channel(GatewayConfig::default());
    (rx, vec![driver, tokio::spawn(feed_gateway(client, tx))])
}

/// Keeps `tx` at the gateway configuration `client` receives. Returns when the client is gone.
pub async fn feed_gateway(client: XdsClient, tx: watch::Sender<GatewayConfig>) {
    let mut addresses = client.watch_all::<AddressResource>();
    let mut ingresses = client.watch_all::<IngressResource>();
    let mut classes = client.watch_all::<IngressClassResource>();
    let mut secrets = client.watch_all::<Secret>();
    let mut gateway_classes = client.watch_all::<GatewayApiResource<GatewayClass>>();
    let mut gateways = client.watch_all::<GatewayApiResource<Gateway>>();
    let mut http_routes = client.watch_all::<GatewayApiResource<HttpRoute>>();
    let mut grants = client.watch_all::<GatewayApiResource<ReferenceGrant>>();
    let (mut a, mut i, mut c, mut s) = (
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
    );
    let (mut gc, mut g, mut r, mut rg) = (
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
        BTreeMap::new(),
    );
    loop {
        let changed = tokio::select! {
            Some(e) = addresses.next() => apply(&mut a, e),
            Some(e) = ingresses.next() => apply(&mut i, e),
            Some(e) = classes.next() => apply(&mut c, e),
            Some(e) = secrets.next() => apply(&mut s, e),
            Some(e) = gateway_classes.next() => apply(&mut gc, e),
            Some(e) = gateways.next() => apply(&mut g, e),
            Some(e) = http_routes.next() => apply(&mut r, e),
            Some(e) = grants.next() => apply(&mut rg, e),
            else => return,
        };
        if changed {
            tx.send_replace(GatewayConfig {
                ingresses: i
                    .values()
                    .map(|r: &IngressResource| r.ingress.clone())
                    .collect(),
                ingress_classes: c
                    .values()
                    .map(|r: &IngressClassResource| r.class.clone())
                    .collect(),
                secrets: s.values().filter_map(tls_certificate).collect(),
                mesh: mesh_config(a.values()),
                gateway_api: GatewayApiObjects {
                    gateway_classes: objects(&gc),
                    gateways: objects(&g),
                    http_routes: objects(&r),
                    reference_grants: objects(&rg),
                },
            });
        }
    }
}

/// The objects of a set of Gateway API resources, in name order.
fn objects<K: Clone>(resources: &BTreeMap<String, GatewayApiResource<K>>) -> Vec<K> {
    resources.values().map(|r| r.object.clone()).collect()
}

/// A serving certificate from an SDS `Secret` named `namespace/name` with inline PEM; `None`
/// for any other kind of Secret.
pub fn tls_certificate(s: &Secret) -> Option<TlsCertificate> {
    let (namespace, name) = s.name.split_once('/')?;
    let Some(secret::Type::TlsCertificate(cert)) = &s.r#type else {
        return None;
    };
    let inline = |d: &Option<DataSource>| match d.as_ref()?.specifier.as_ref()? {
        data_source::Specifier::InlineBytes(b) => String::from_utf8(b.clone()).ok(),
        data_source::Specifier::InlineString(s) => Some(s.clone()),
        _ => None,
    };
    Some(TlsCertificate {
        namespace: namespace.to_owned(),
        name: name.to_owned(),
        cert_pem: inline(&cert.certificate_chain)?,
        key_pem: inline(&cert.private_key)?,
    })
}
