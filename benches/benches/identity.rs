//! meshkit-identity: SPIFFE ID parsing, chain verification and full mutual-TLS handshakes,
//! each beside rustls's stock WebPKI verifiers (or a plain copy) in the same run.
//!
//! `cargo bench -p meshkit-benches --bench identity`

use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group};
use meshkit_benches::{Ratio, Run};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, PeerRole, SpiffeId, SpiffeVerifier, SvidResolver, TlsSettings, TrustDomain, X509Svid,
};
use rcgen::SanType;
use rustls::client::Resumption;
use rustls::client::danger::ServerCertVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection};
use rustls_pki_types::{ServerName, UnixTime};

const ID: &str = "spiffe://cluster.local/ns/shop/sa/web-frontend";
const SERVER_ID: &str = "spiffe://cluster.local/ns/shop/sa/db";
const SERVER_DNS: &str = "db.shop.svc.cluster.local";

struct Setup {
    ca: TestCa,
    client: X509Svid,
    server: X509Svid,
}

fn setup() -> Setup {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    let client = ca.issue(ID.parse().unwrap());
    // The server also carries a DNS name so that the stock verifier can check it.
    let server_id: SpiffeId = SERVER_ID.parse().unwrap();
    let mut params = TestCa::leaf_params(&server_id);
    params
        .subject_alt_names
        .push(SanType::DnsName(SERVER_DNS.try_into().unwrap()));
    let (chain, key) = ca.sign_params(&params);
    let server = X509Svid::from_der(chain, key).unwrap();
    Setup { ca, client, server }
}

fn roots(ca: &TestCa) -> Arc<RootCertStore> {
    let mut roots = RootCertStore::empty();
    roots.add(ca.root().clone()).unwrap();
    Arc::new(roots)
}

fn bench_parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("spiffe_id_parse");
    g.throughput(Throughput::Elements(1));
    g.bench_function("meshkit", |b| {
        b.iter(|| std::hint::black_box(ID).parse::<SpiffeId>().unwrap())
    });
    // Baseline: owning the same bytes, the least any parsed ID costs.
    g.bench_function("string_copy", |b| {
        b.iter(|| String::from(std::hint::black_box(ID)))
    });
    g.finish();
}

fn bench_chain(c: &mut Criterion) {
    let s = setup();
    let provider = meshkit_identity::default_provider();
    let ours = SpiffeVerifier::new(s.ca.bundle_set(), Authorize::AnyTrusted);
    let stock = WebPkiClientVerifier::builder_with_provider(roots(&s.ca), provider)
        .build()
        .unwrap();
    let chain = s.client.chain();
    let now = UnixTime::now();

    let mut g = c.benchmark_group("chain_verify");
    g.throughput(Throughput::Elements(1));
    g.bench_function("meshkit", |b| {
        b.iter(|| ours.verify(chain, PeerRole::Client, now).unwrap())
    });
    g.bench_function("webpki", |b| {
        b.iter(|| {
            stock
                .verify_client_cert(&chain[0], &chain[1..], now)
                .unwrap()
        })
    });
    g.finish();
}

/// Drives one full handshake between fresh connections in memory.
fn handshake(client: &Arc<ClientConfig>, server: &Arc<ServerConfig>) {
    let name = ServerName::try_from(SERVER_DNS).unwrap();
    let mut c = ClientConnection::new(client.clone(), name).unwrap();
    let mut s = ServerConnection::new(server.clone()).unwrap();
    let mut buf = Vec::with_capacity(16 * 1024);
    // Bounded: a handshake that stops making progress fails here instead of spinning.
    let mut flights = 0;
    while c.is_handshaking() || s.is_handshaking() {
        flights += 1;
        assert!(
            flights <= 16,
            "in-memory handshake unfinished after 16 flights"
        );
        buf.clear();
        while c.wants_write() {
            c.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            s.read_tls(&mut rd).unwrap();
        }
        s.process_new_packets().unwrap();
        buf.clear();
        while s.wants_write() {
            s.write_tls(&mut buf).unwrap();
        }
        let mut rd = &buf[..];
        while !rd.is_empty() {
            c.read_tls(&mut rd).unwrap();
        }
        c.process_new_packets().unwrap();
    }
}

fn bench_handshake(c: &mut Criterion) {
    let s = setup();
    let tls = TlsSettings::default();
    let provider = tls.provider().clone();

    let mut ours_client = tls
        .client_config(
            s.client.clone(),
            SpiffeVerifier::new(
                s.ca.bundle_set(),
                Authorize::Exact(SERVER_ID.parse().unwrap()),
            ),
        )
        .unwrap();
    let ours_server = tls
        .server_config(
            s.server.clone(),
            SpiffeVerifier::new(s.ca.bundle_set(), Authorize::Exact(ID.parse().unwrap())),
        )
        .unwrap();

    // The same handshake with rustls's stock verifiers: the roots, no SPIFFE checks. Both
    // sides present their certificates the same way, so only verification differs.
    let stock_server_verifier: Arc<dyn ServerCertVerifier> =
        rustls::client::WebPkiServerVerifier::builder_with_provider(roots(&s.ca), provider.clone())
            .build()
            .unwrap();
    let stock_client_verifier: Arc<dyn ClientCertVerifier> =
        WebPkiClientVerifier::builder_with_provider(roots(&s.ca), provider.clone())
            .build()
            .unwrap();
    let mut stock_client = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(stock_server_verifier)
        .with_client_cert_resolver(Arc::new(SvidResolver::new(s.client.clone())));
    stock_client.alpn_protocols = vec![b"h2".to_vec()];
    let mut stock_server = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .unwrap()
        .with_client_cert_verifier(stock_client_verifier)
        .with_cert_resolver(Arc::new(SvidResolver::new(s.server.clone())));
    stock_server.alpn_protocols = vec![b"h2".to_vec()];

    // Every iteration is a full handshake: no resumption on either side.
    for client in [&mut ours_client, &mut stock_client] {
        client.resumption = Resumption::disabled();
    }
    let (ours_client, stock_client) = (Arc::new(ours_client), Arc::new(stock_client));
    let mut ours_server = ours_server;
    ours_server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    ours_server.send_tls13_tickets = 0;
    stock_server.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    stock_server.send_tls13_tickets = 0;
    let (ours_server, stock_server) = (Arc::new(ours_server), Arc::new(stock_server));

    let mut g = c.benchmark_group("mtls_handshake");
    g.throughput(Throughput::Elements(1));
    g.bench_function("meshkit", |b| {
        b.iter(|| handshake(&ours_client, &ours_server))
    });
    g.bench_function("webpki", |b| {
        b.iter(|| handshake(&stock_client, &stock_server))
    });
    g.finish();
}

criterion_group!(benches, bench_parse, bench_chain, bench_handshake);

fn main() {
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.report_ratios(&[
        Ratio {
            group: "spiffe_id_parse",
            subject: "meshkit",
            baseline: "string_copy",
        },
        Ratio {
            group: "chain_verify",
            subject: "meshkit",
            baseline: "webpki",
        },
        Ratio {
            group: "mtls_handshake",
            subject: "meshkit",
            baseline: "webpki",
        },
    ]);
}
