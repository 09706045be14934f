//! The TLS record layer with each crypto provider: 1 MiB of application data through a mutual
//! TLS 1.3 session (AES-128-GCM, meshkit's preferred suite) held in memory, sealed by the
//! client and opened by the server. ring (meshkit's default) is the baseline, aws-lc-rs the
//! subject; no sockets, so the figure is the crypto and rustls's record handling alone.
//!
//! `cargo bench -p meshkit-benches --bench crypto`

use std::io::{Read, Write};
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group};
use meshkit_benches::{Ratio, Run};
use meshkit_identity::test_util::TestCa;
use meshkit_identity::{
    Authorize, SpiffeId, SpiffeVerifier, TlsSettings, TrustDomain, prefer_aes_128_gcm,
};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConnection, ConnectionCommon, ServerConnection};

const GROUP: &str = "tls_record_layer";
const CHUNK: usize = 1024 * 1024;

/// A connected client and server over in-memory buffers, and the buffers the transfer reuses.
struct Session {
    client: ClientConnection,
    server: ServerConnection,
    wire: Vec<u8>,
    plain: Vec<u8>,
}

impl Session {
    fn new(ca: &TestCa, provider: CryptoProvider) -> Self {
        let tls = TlsSettings::default().with_provider(Arc::new(prefer_aes_128_gcm(provider)));
        let server_id: SpiffeId = "spiffe://cluster.local/ns/bench/sa/server".parse().unwrap();
        let client_id: SpiffeId = "spiffe://cluster.local/ns/bench/sa/client".parse().unwrap();
        let server_config = tls
            .server_config(
                ca.issue(server_id.clone()),
                SpiffeVerifier::new(ca.bundle_set(), Authorize::AnyTrusted),
            )
            .unwrap();
        let client_config = tls
            .client_config(
                ca.issue(client_id),
                SpiffeVerifier::new(ca.bundle_set(), Authorize::Exact(server_id)),
            )
            .unwrap();
        let name = "127.0.0.1".try_into().unwrap();
        let mut session = Session {
            client: ClientConnection::new(Arc::new(client_config), name).unwrap(),
            server: ServerConnection::new(Arc::new(server_config)).unwrap(),
            wire: Vec::with_capacity(2 * CHUNK),
            plain: vec![0; CHUNK],
        };
        // Bounded: a handshake that stops making progress fails here instead of spinning.
        let mut flights = 0;
        while session.client.is_handshaking() || session.server.is_handshaking() {
            flights += 1;
            assert!(
                flights <= 16,
                "in-memory handshake unfinished after 16 flights"
            );
            move_records(&mut session.client, &mut session.server, &mut session.wire);
            move_records(&mut session.server, &mut session.client, &mut session.wire);
        }
        // The server's session tickets, so that the transfers see only application data.
        move_records(&mut session.server, &mut session.client, &mut session.wire);
        let suite = session.client.negotiated_cipher_suite().unwrap().suite();
        assert_eq!(suite, rustls::CipherSuite::TLS13_AES_128_GCM_SHA256);
        session
    }

    /// Seals `data` on the client and opens it on the server; returns the bytes delivered.
    fn transfer(&mut self, data: &[u8]) -> usize {
        let mut sent = 0;
        let mut delivered = 0;
        while sent < data.len() {
            // rustls takes up to its buffer limit (64 KiB) of plaintext per call.
            sent += self.client.writer().write(&data[sent..]).unwrap();
            self.wire.clear();
            while self.client.wants_write() {
                self.client.write_tls(&mut self.wire).unwrap();
            }
            let mut wire = &self.wire[..];
            while !wire.is_empty() {
                self.server.read_tls(&mut wire).unwrap();
                self.server.process_new_packets().unwrap();
                loop {
                    match self.server.reader().read(&mut self.plain) {
                        Ok(0) => break,
                        Ok(n) => delivered += n,
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => panic!("reading plaintext: {e}"),
                    }
                }
            }
        }
        delivered
    }
}

/// Moves every record `from` has to send into `to`, and processes them there.
fn move_records<A, B>(
    from: &mut ConnectionCommon<A>,
    to: &mut ConnectionCommon<B>,
    wire: &mut Vec<u8>,
) {
    wire.clear();
    while from.wants_write() {
        from.write_tls(wire).unwrap();
    }
    let mut rest = &wire[..];
    while !rest.is_empty() {
        to.read_tls(&mut rest).unwrap();
        to.process_new_packets().unwrap();
    }
}

fn record_layer(c: &mut Criterion) {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    let data = vec![0x5a; CHUNK];
    let mut group = c.benchmark_group(GROUP);
    group.throughput(Throughput::Bytes(CHUNK as u64));
    let providers = [
        ("ring", rustls::crypto::ring::default_provider()),
        ("aws-lc-rs", rustls::crypto::aws_lc_rs::default_provider()),
    ];
    for (name, provider) in providers {
        let mut session = Session::new(&ca, provider);
        group.bench_function(name, |b| {
            b.iter(|| assert_eq!(session.transfer(&data), CHUNK));
        });
    }
    group.finish();
}

criterion_group!(benches, record_layer);

fn main() {
    let run = Run::start();
    benches();
    Criterion::default().configure_from_args().final_summary();
    run.report_ratios(&[Ratio {
        group: GROUP,
        subject: "aws-lc-rs",
        baseline: "ring",
    }]);
}
