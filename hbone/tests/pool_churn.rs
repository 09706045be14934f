//! The pool forgets identities the SVID cache forgets: no connection or cached TLS
//! configuration keeps presenting a certificate that is no longer renewed, and the pool's maps
//! stay bounded while workloads (and so identities) come and go.

mod support;

use std::sync::Arc;

use meshkit_hbone::{Client, ClientConfig, Forward, ServerConfig, Target};
use meshkit_identity::{
    BoxFuture, CaClient, CaError, CertificateRequest, RotationConfig, SvidCache,
};
use rustls::pki_types::CertificateDer;
use support::*;

/// The test PKI's CA as the SVID cache's CA.
struct PkiCa(Arc<Pki>);

impl CaClient for PkiCa {
    fn sign<'a>(
        &'a self,
        request: &'a CertificateRequest,
    ) -> BoxFuture<'a, Result<Vec<CertificateDer<'static>>, CaError>> {
        self.0.ca.sign(request)
    }
}

fn workload(i: usize) -> meshkit_identity::SpiffeId {
    id(&format!("spiffe://cluster.local/ns/churn/sa/w{i}"))
}

/// Forgets `who` in `certs` and waits until its SVID's channel has ended (the renewal task is
/// aborted, not yet gone, when `forget` returns): what the pool looks at.
async fn forget_and_wait(certs: &SvidCache, who: &meshkit_identity::SpiffeId) {
    let mut rx = certs.get(who).await.unwrap();
    certs.forget(who);
    within("the forgotten identity's SVID channel ending", async {
        while rx.changed().await.is_ok() {}
    })
    .await;
}

#[tokio::test]
async fn a_forgotten_identity_is_fetched_again_not_served_from_the_pool() {
    let pki = Arc::new(Pki::new());
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let certs = SvidCache::new(PkiCa(pki.clone()), RotationConfig::default());
    let client = Client::new(ClientConfig::default(), certs.clone(), pki.ca.bundle_set());
    let target = || Target::new(server.addr, backend, id(CLIENT), id(SERVER));

    let t = client.open(target()).await.unwrap();
    assert_eq!(round_trip(t, b"one").await, b"one");
    assert_eq!((pki.ca.requests(), client.connections_opened()), (1, 1));

    // The identity leaves the cache (its workload left this node): its SVID is no longer
    // renewed, so the pool must not keep presenting it.
    forget_and_wait(&certs, &id(CLIENT)).await;
    let t = client.open(target()).await.unwrap();
    assert_eq!(round_trip(t, b"two").await, b"two");
    assert_eq!(pki.ca.requests(), 2, "the SVID was requested again");
    assert_eq!(client.connections_opened(), 2, "on a new connection");
}

#[tokio::test]
async fn the_pool_stays_bounded_under_identity_churn() {
    let pki = Arc::new(Pki::new());
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let certs = SvidCache::new(PkiCa(pki.clone()), RotationConfig::default());
    let client = Client::new(ClientConfig::default(), certs.clone(), pki.ca.bundle_set());
    let mut largest = 0;
    for i in 0..300 {
        let t = client
            .open(Target::new(server.addr, backend, workload(i), id(SERVER)))
            .await
            .unwrap();
        assert_eq!(round_trip(t, b"x").await, b"x");
        forget_and_wait(&certs, &workload(i)).await;
        largest = largest.max(client.pool_entries());
    }
    assert!(
        largest <= 64,
        "{largest} pool entries for 300 identities, one at a time"
    );
    assert_eq!(certs.identities().len(), 0);
}

#[tokio::test]
async fn forget_identity_drops_its_pool_entries() {
    let pki = Arc::new(Pki::new());
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let t = client
        .open(Target::new(server.addr, backend, id(CLIENT), id(SERVER)))
        .await
        .unwrap();
    assert_eq!(client.pool_entries(), 1);
    client.forget_identity(&id(CLIENT));
    assert_eq!(client.pool_entries(), 0);
    // The tunnel already open keeps working.
    assert_eq!(round_trip(t, b"still").await, b"still");
}
