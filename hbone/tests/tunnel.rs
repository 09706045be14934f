//! Tunnels end to end over loopback: echo, half-close, statuses, resets, bulk transfer,
//! many streams, flow control, PROXY headers, double HBONE, shutdown and limits.

mod support;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use meshkit_hbone::{
    Client, ClientConfig, ConnectRequest, Decision, Forward, Server, ServerConfig, Target,
    TunnelConnector, decide_fn, proxy_protocol,
};
use meshkit_identity::{Authorize, SingleIdentity, VerifyError};
use sha2::{Digest, Sha256};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

fn target(server: SocketAddr, destination: SocketAddr) -> Target {
    Target::new(server, destination, id(CLIENT), id(SERVER))
}

/// A tunnel through `server` to 127.0.0.1:`port`, for services that decide by the port alone.
async fn open_to_port(
    client: &meshkit_hbone::Client,
    server: SocketAddr,
    port: u16,
) -> meshkit_hbone::Tunnel {
    let destination = SocketAddr::from(([127, 0, 0, 1], port));
    client.open(target(server, destination)).await.unwrap()
}

#[tokio::test]
async fn echo_through_the_forwarder() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"hello hbone").await, b"hello hbone");
}

/// A target that asks the client to present an identity it does not hold fails before any
/// connection, with a typed cause naming both identities.
#[tokio::test]
async fn an_identity_the_client_does_not_hold_is_a_local_identity_error() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let other = Target::new(
        server.addr,
        backend,
        id("spiffe://cluster.local/ns/shop/sa/someone-else"),
        id(SERVER),
    );
    let err = client.open(other).await.unwrap_err();
    assert!(err.is_local_identity(), "{err:?}");
    let cause = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<meshkit_hbone::LocalIdentityError>())
        .expect("a typed cause");
    assert!(
        matches!(cause, meshkit_hbone::LocalIdentityError::NotHeld { held, asked }
            if *held == id(CLIENT) && *asked == id("spiffe://cluster.local/ns/shop/sa/someone-else")),
        "{cause:?}"
    );
    assert_eq!(server.stats.connections_accepted(), 0);
}

#[tokio::test]
async fn server_service_sees_verified_peer_addresses_and_headers() {
    let pki = Pki::new();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<ConnectRequest>();
    let service = decide_fn(move |req: ConnectRequest| {
        let _ = tx.send(req);
        async { Decision::refuse(StatusCode::FORBIDDEN) }
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let source: SocketAddr = "10.1.2.3:4567".parse().unwrap();
    let t = target(server.addr, "127.0.0.1:9".parse().unwrap())
        .forwarded_for(source)
        .traceparent("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
        .unwrap()
        .baggage("tenant=blue")
        .unwrap();
    let err = client.open(t).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::FORBIDDEN));

    let req = within("the request the service saw", rx.recv())
        .await
        .unwrap();
    assert_eq!(req.peer, id(CLIENT));
    assert_eq!(req.target, "127.0.0.1:9".parse().unwrap());
    assert_eq!(req.destination, server.addr);
    assert_eq!(req.source.ip(), server.addr.ip());
    assert_eq!(req.headers["forwarded"], "for=\"10.1.2.3:4567\"");
    assert_eq!(req.headers["baggage"], "tenant=blue");
    assert!(req.headers.contains_key("traceparent"));
}

#[tokio::test]
async fn half_close_works_in_both_directions() {
    let pki = Pki::new();
    // The server reads to EOF, then answers with what it got, reversed; then half-closes.
    let service = decide_fn(|_req| async {
        Decision::accept(|mut tunnel| async move {
            let mut got = Vec::new();
            tunnel.read_to_end(&mut got).await.unwrap();
            got.reverse();
            tunnel.write_all(&got).await.unwrap();
            tunnel.shutdown().await.unwrap();
        })
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut tunnel = client
        .open(target(server.addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    tunnel.write_all(b"abc").await.unwrap();
    tunnel.shutdown().await.unwrap(); // our side done; theirs still flows
    let mut back = Vec::new();
    within(
        "the answer after our half-close",
        tunnel.read_to_end(&mut back),
    )
    .await
    .unwrap();
    assert_eq!(back, b"cba");

    // The other way round: the server finishes first while the client keeps sending; what
    // the server then reads comes back to the test.
    let (got_tx, got_rx) = tokio::sync::mpsc::unbounded_channel::<std::io::Result<Vec<u8>>>();
    let service = decide_fn(move |_req| {
        let got_tx = got_tx.clone();
        async move {
            Decision::accept(|mut tunnel| async move {
                tunnel.write_all(b"greeting").await.unwrap();
                tunnel.shutdown().await.unwrap();
                let mut got = Vec::new();
                let read = tunnel.read_to_end(&mut got).await.map(|_| got);
                let _ = got_tx.send(read);
            })
        }
    });
    let mut got_rx = got_rx;
    let server = start(&pki, ServerConfig::default(), service).await;
    let mut tunnel = client
        .open(target(server.addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    let mut greeting = Vec::new();
    within(
        "the server's greeting and half-close",
        tunnel.read_to_end(&mut greeting),
    )
    .await
    .unwrap();
    assert_eq!(greeting, b"greeting");
    tunnel.write_all(b"late data").await.unwrap();
    tunnel.shutdown().await.unwrap();
    let late = within("what the server read after its half-close", got_rx.recv())
        .await
        .unwrap()
        .expect("the server read our data to its end");
    assert_eq!(late, b"late data");
}

#[tokio::test]
async fn status_codes_for_refusals() {
    let pki = Pki::new();
    let client = pki.client(CLIENT, ClientConfig::default());

    // 403: refused by policy.
    let server = start(
        &pki,
        ServerConfig::default(),
        Forward::new().with_policy(|req: &ConnectRequest| req.target.port() != 6666),
    )
    .await;
    let err = client
        .open(target(server.addr, "127.0.0.1:6666".parse().unwrap()))
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::FORBIDDEN));

    // 503: nothing listens at the target.
    let closed = TcpListener::bind("127.0.0.1:0")
        .await
        .unwrap()
        .local_addr()
        .unwrap();
    let err = client.open(target(server.addr, closed)).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::SERVICE_UNAVAILABLE));

    // 504: the target does not complete the TCP handshake in time (its backlog is full).
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let full = socket.listen(1).unwrap();
    let full_addr = full.local_addr().unwrap();
    let mut fillers = Vec::new();
    for _ in 0..4 {
        if let Ok(Ok(s)) =
            tokio::time::timeout(Duration::from_millis(200), TcpStream::connect(full_addr)).await
        {
            fillers.push(s);
        }
    }
    let slow = start(
        &pki,
        ServerConfig::default(),
        Forward::new().with_connect_timeout(Duration::from_millis(300)),
    )
    .await;
    let err = client.open(target(slow.addr, full_addr)).await.unwrap_err();
    assert_eq!(err.status(), Some(StatusCode::GATEWAY_TIMEOUT));
    drop((full, fillers));
}

/// A raw HTTP/2 client over the same mutual TLS, to send what the HBONE client never would.
async fn raw_h2(pki: &Pki, server: SocketAddr) -> h2::client::SendRequest<bytes::Bytes> {
    let tls = meshkit_identity::TlsSettings::default()
        .client_config(
            pki.ca.issue(id(CLIENT)),
            meshkit_identity::SpiffeVerifier::new(pki.ca.bundle_set(), Authorize::AnyTrusted),
        )
        .unwrap();
    let sock = TcpStream::connect(server).await.unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls))
        .connect(
            rustls::pki_types::ServerName::IpAddress(server.ip().into()),
            sock,
        )
        .await
        .unwrap();
    let (send, conn) = h2::client::handshake(tls).await.unwrap();
    tokio::spawn(conn);
    send
}

#[tokio::test]
async fn non_connect_is_405_and_bad_authority_is_400() {
    let pki = Pki::new();
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let mut h2 = raw_h2(&pki, server.addr).await;

    let get = http::Request::get("https://127.0.0.1/").body(()).unwrap();
    let (resp, _) = h2.send_request(get, true).unwrap();
    assert_eq!(
        within("the answer to a GET", resp).await.unwrap().status(),
        StatusCode::METHOD_NOT_ALLOWED
    );

    for authority in ["example.com:80", "127.0.0.1", "[::1]"] {
        let mut h2 = within("a free stream", h2.clone().ready()).await.unwrap();
        let connect = http::Request::connect(authority).body(()).unwrap();
        let (resp, _) = h2.send_request(connect, false).unwrap();
        assert_eq!(
            within("the answer to a bad authority", resp)
                .await
                .unwrap()
                .status(),
            StatusCode::BAD_REQUEST,
            "{authority}"
        );
    }
}

#[tokio::test]
async fn wrong_server_identity_fails_with_a_typed_error() {
    let pki = Pki::new();
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let expected_other = Target::new(
        server.addr,
        "127.0.0.1:1".parse().unwrap(),
        id(CLIENT),
        id("spiffe://cluster.local/ns/shop/sa/cache"),
    );
    let err = client.open(expected_other).await.unwrap_err();
    assert!(err.is_peer_identity(), "{err}");
    assert_eq!(
        err.peer_identity_error(),
        Some(&VerifyError::Unauthorized(id(SERVER)))
    );
    // Display says this level only; the cause is the source, so a printed chain says it once.
    let cause = VerifyError::Unauthorized(id(SERVER)).to_string();
    assert_eq!(err.to_string(), "HBONE peer identity refused");
    let source = std::error::Error::source(&err).expect("the verifier's error is the source");
    assert_eq!(source.to_string(), cause);
}

/// A server that takes only P-256 key shares answers the client's X25519 one with a
/// HelloRetryRequest: the client's second ClientHello (after a ChangeCipherSpec) must go out at
/// once, not be held with the final flight, or the handshake would wait for its timeout.
#[tokio::test]
async fn a_hello_retry_request_is_answered_at_once() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let p256_only = rustls::crypto::CryptoProvider {
        kx_groups: vec![rustls::crypto::ring::kx_group::SECP256R1],
        ..rustls::crypto::ring::default_provider()
    };
    let tls = pki.server_tls_with(
        meshkit_identity::TlsSettings::default().with_provider(Arc::new(p256_only)),
        SERVER,
        Authorize::AnyTrusted,
    );
    let server = Server::new(
        ServerConfig::default(),
        SingleIdentity::new(tls),
        Forward::new(),
    );
    tokio::spawn(server.serve(listener));
    let client = pki.client(
        CLIENT,
        ClientConfig::default().with_timeouts(
            Duration::from_secs(5),
            Duration::from_secs(2),
            Duration::from_secs(5),
        ),
    );
    let tunnel = client.open(target(addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"after a retry").await, b"after a retry");
}

/// The client holds its last handshake flight back to send it with the HTTP/2 preface; when it
/// refuses the server instead, the alert saying so must still reach the server.
#[tokio::test]
async fn a_refused_server_hears_the_clients_alert() {
    let pki = Pki::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(
        pki.server_tls(SERVER, Authorize::Exact(id(CLIENT))),
    ));
    let accepted = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        acceptor.accept(socket).await.map(drop)
    });
    let client = pki.client(CLIENT, ClientConfig::default());
    let expected_other = Target::new(
        addr,
        "127.0.0.1:1".parse().unwrap(),
        id(CLIENT),
        id("spiffe://cluster.local/ns/shop/sa/cache"),
    );
    let err = client.open(expected_other).await.unwrap_err();
    assert!(err.is_peer_identity(), "{err}");
    let server_err = tokio::time::timeout(Duration::from_secs(5), accepted)
        .await
        .expect("the server learns of the refusal at once")
        .unwrap()
        .expect_err("the handshake failed");
    let inner = server_err
        .get_ref()
        .and_then(|e| e.downcast_ref::<rustls::Error>())
        .unwrap_or_else(|| panic!("not a TLS error: {server_err}"));
    assert!(
        matches!(inner, rustls::Error::AlertReceived(_)),
        "the server saw {inner:?}, not the client's alert"
    );
}

#[tokio::test]
async fn unauthorized_client_is_refused_by_the_server() {
    let pki = Pki::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let only_web = SingleIdentity::new(pki.server_tls(SERVER, Authorize::Exact(id(CLIENT))));
    let server = Server::new(ServerConfig::default(), only_web, Forward::new());
    let stats = server.stats();
    tokio::spawn(server.serve(listener));
    let intruder = pki.client(
        "spiffe://cluster.local/ns/evil/sa/x",
        ClientConfig::default(),
    );
    let t = Target::new(
        addr,
        "127.0.0.1:1".parse().unwrap(),
        id("spiffe://cluster.local/ns/evil/sa/x"),
        id(SERVER),
    );
    let err = intruder.open(t).await.unwrap_err();
    // TLS 1.3: the client's handshake is done before the server checks its certificate, so the
    // refusal arrives as the server's alert, at the first read of the HTTP/2 connection.
    // (h2 keeps an I/O error's kind and text only.)
    let io = std::error::Error::source(&err)
        .and_then(|e| e.downcast_ref::<h2::Error>())
        .and_then(h2::Error::get_io);
    assert!(
        io.is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData
            && io.to_string().starts_with("received fatal alert")),
        "the server's refusal, not another failure: {err:?}"
    );
    wait_until("the server counting the refused handshake", || {
        stats.handshake_failures() >= 1
    })
    .await;
    assert_eq!(stats.handshake_failures(), 1);
}

#[tokio::test]
async fn peer_reset_mid_transfer() {
    let pki = Pki::new();
    let service = decide_fn(|req: ConnectRequest| async move {
        let reason = if req.target.port() == 1 {
            h2::Reason::INTERNAL_ERROR
        } else {
            h2::Reason::CANCEL
        };
        Decision::accept(move |mut tunnel| async move {
            tunnel.write_all(&[7u8; 100_000]).await.unwrap();
            let mut buf = [0u8; 10];
            tunnel.read_exact(&mut buf).await.unwrap();
            tunnel.reset(reason);
        })
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    for port in [1, 2] {
        let mut tunnel = open_to_port(&client, server.addr, port).await;
        tunnel.write_all(&[1u8; 10]).await.unwrap();
        let mut got = Vec::new();
        let result = within("the reset tunnel's end", tunnel.read_to_end(&mut got)).await;
        // Every reset before END_STREAM is an error, CANCEL too, after whatever arrived.
        let err = result.unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        assert!(got.len() <= 100_000 && got.iter().all(|&b| b == 7));
    }
}

#[tokio::test]
async fn reset_reason_applies_when_a_split_tunnel_is_dropped() {
    let pki = Pki::new();
    // The handler sends "partial" and waits for the client's acknowledgement. Then, by target
    // port: 1, it sets CONNECT_ERROR and drops its split halves mid-stream; 2, it shuts its
    // sending direction down first, so the reason does not apply and the client reads EOF; 3,
    // it drops the halves without a reason: CANCEL, an error like any reset before EOF.
    let service = decide_fn(|req: ConnectRequest| async move {
        let port = req.target.port();
        Decision::accept(move |tunnel| async move {
            let reset = tunnel.reset_reason();
            let (mut recv, mut send) = tunnel.into_split();
            send.write_all(b"partial").await.unwrap();
            assert_eq!(recv.chunk().await.unwrap().as_deref(), Some(&b"ack"[..]));
            match port {
                1 => reset.set(h2::Reason::CONNECT_ERROR),
                2 => {
                    send.shutdown().await.unwrap();
                    reset.set(h2::Reason::CONNECT_ERROR);
                }
                _ => {}
            }
            drop((recv, send));
        })
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    for port in [1, 2, 3] {
        let mut tunnel = open_to_port(&client, server.addr, port).await;
        let mut partial = [0u8; 7];
        within("the partial data", tunnel.read_exact(&mut partial))
            .await
            .unwrap();
        assert_eq!(&partial, b"partial");
        tunnel.write_all(b"ack").await.unwrap();
        let mut rest = Vec::new();
        let result = within("the tunnel's end", tunnel.read_to_end(&mut rest)).await;
        if port != 2 {
            let err = result.unwrap_err();
            assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
            let reason = if port == 1 {
                h2::Reason::CONNECT_ERROR
            } else {
                h2::Reason::CANCEL
            };
            assert!(err.to_string().contains(&reason.to_string()), "{err}");
        } else {
            assert!(result.is_ok(), "port {port}: {result:?}");
            assert!(rest.is_empty());
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_mib_arrive_intact() {
    const SIZE: usize = 64 * 1024 * 1024;
    let pki = Pki::new();
    // The server hashes everything it receives and answers with the digest.
    let service = decide_fn(|_req| async {
        Decision::accept(|tunnel| async move {
            let (mut recv, mut send) = tunnel.into_split();
            let mut hasher = Sha256::new();
            let mut total = 0usize;
            while let Some(chunk) = recv.chunk().await.unwrap() {
                total += chunk.len();
                hasher.update(&chunk);
            }
            let mut answer = hasher.finalize().to_vec();
            answer.extend_from_slice(&(total as u64).to_be_bytes());
            send.send(answer.into()).await.unwrap();
            send.finish().unwrap();
        })
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = client
        .open(target(server.addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    let (mut recv, mut send) = tunnel.into_split();

    // Pseudo-random content, so that misordered or dropped chunks change the digest.
    let mut data = vec![0u8; SIZE];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for b in data.iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let expected = Sha256::digest(&data);
    let data = bytes::Bytes::from(data);
    let answer = within("64 MiB up and the digest back", async {
        for chunk in data.chunks(256 * 1024) {
            send.send(data.slice_ref(chunk)).await.unwrap();
        }
        send.finish().unwrap();
        let mut answer = Vec::new();
        while let Some(chunk) = recv.chunk().await.unwrap() {
            answer.extend_from_slice(&chunk);
        }
        answer
    })
    .await;
    assert_eq!(&answer[..32], expected.as_slice());
    assert_eq!(
        u64::from_be_bytes(answer[32..40].try_into().unwrap()),
        SIZE as u64
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_concurrent_tunnels_on_one_connection() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let client = pki.client(
        CLIENT,
        ClientConfig::default().with_max_streams_per_connection(1000),
    );
    // Warm the pool so that all tunnels find the one connection.
    drop(client.open(target(server.addr, backend)).await.unwrap());
    let tasks: Vec<_> = (0..1000)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut t = client.open(target(server.addr, backend)).await.unwrap();
                let msg = format!("tunnel {i}");
                t.write_all(msg.as_bytes()).await.unwrap();
                let mut buf = vec![0; msg.len()];
                t.read_exact(&mut buf).await.unwrap();
                assert_eq!(buf, msg.as_bytes());
                t // held until all are open
            })
        })
        .collect();
    let open = within("1,000 tunnels opened and echoed", async {
        let mut open = Vec::new();
        for t in tasks {
            open.push(t.await.unwrap());
        }
        open
    })
    .await;
    assert_eq!(open.len(), 1000);
    assert_eq!(client.connections_opened(), 1);
    assert_eq!(server.stats.connections_accepted(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_does_not_stall_other_tunnels() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    // Port 1: the server pushes 64 MiB that the client never reads, counting the MiB it has
    // handed to HTTP/2. Others: echo.
    let forward = Forward::new();
    let pushed = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let pushing = pushed.clone();
    let service = decide_fn(move |req: ConnectRequest| {
        let mut forward = forward.clone();
        let pushed = pushing.clone();
        async move {
            if req.target.port() == 1 {
                Decision::accept(|tunnel| async move {
                    let (_recv, mut send) = tunnel.into_split();
                    let block = bytes::Bytes::from(vec![0u8; 1024 * 1024]);
                    for _ in 0..64 {
                        if send.send(block.clone()).await.is_err() {
                            return;
                        }
                        pushed.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                    }
                })
            } else {
                tower::Service::call(&mut forward, req).await.unwrap()
            }
        }
    });
    let server = start(&pki, ServerConfig::default(), service).await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let _stalled = client
        .open(target(server.addr, "127.0.0.1:1".parse().unwrap()))
        .await
        .unwrap();
    // The flood has filled its 4 MiB stream window (the tunnel hands HTTP/2 only what flow
    // control allows, so the fifth MiB waits).
    wait_until("the flood filling the unread tunnel's window", || {
        pushed.load(std::sync::atomic::Ordering::SeqCst) >= 4
    })
    .await;
    for _ in 0..20 {
        let t = within(
            "an open beside the stalled stream",
            client.open(target(server.addr, backend)),
        )
        .await
        .unwrap();
        assert_eq!(round_trip(t, b"still moving").await, b"still moving");
    }
    assert_eq!(client.connections_opened(), 1, "all on the same connection");
}

#[tokio::test]
async fn proxy_protocol_header_carries_the_peer_identity() {
    let pki = Pki::new();
    let backend = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let backend_addr = backend.local_addr().unwrap();
    let server = start(
        &pki,
        ServerConfig::default(),
        Forward::new().with_proxy_protocol(true),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut tunnel = client
        .open(target(server.addr, backend_addr))
        .await
        .unwrap();
    tunnel.write_all(b"payload").await.unwrap();
    tunnel.shutdown().await.unwrap();

    let (mut sock, _) = within("the forwarded connection", backend.accept())
        .await
        .unwrap();
    let mut got = Vec::new();
    within(
        "the forwarded bytes to their end",
        sock.read_to_end(&mut got),
    )
    .await
    .unwrap();
    assert_eq!(&got[..12], &proxy_protocol::SIGNATURE);
    let len = u16::from_be_bytes([got[14], got[15]]) as usize;
    let header = &got[..16 + len];
    let tlv = &header[28..];
    assert_eq!(tlv[0], proxy_protocol::TLV_PEER_SPIFFE_ID);
    assert_eq!(&tlv[3..], CLIENT.as_bytes());
    assert_eq!(&got[16 + len..], b"payload");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hbone_inside_hbone() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    // The inner server: reached only through tunnels of the outer one.
    let inner = Arc::new(Server::new(
        ServerConfig::default(),
        SingleIdentity::new(pki.server_tls(SERVER, Authorize::AnyTrusted)),
        Forward::new(),
    ));
    let inner_addr: SocketAddr = "127.0.0.1:15008".parse().unwrap();
    let outer_service = decide_fn(move |req: ConnectRequest| {
        let inner = inner.clone();
        async move {
            Decision::accept(move |tunnel| async move {
                let _ = inner.serve_connection(tunnel, req.source, req.target).await;
            })
        }
    });
    let outer = start(&pki, ServerConfig::default(), outer_service).await;

    let outer_client = pki.client(CLIENT, ClientConfig::default());
    let outer_addr = outer.addr;
    let connector =
        TunnelConnector::new(outer_client.clone(), move |addr| target(outer_addr, addr));
    let inner_client = Client::with_connector(
        ClientConfig::default(),
        connector,
        pki.ca.issue(id(CLIENT)),
        pki.ca.bundle_set(),
    );
    let tunnel = inner_client
        .open(target(inner_addr, backend))
        .await
        .unwrap();
    assert_eq!(
        round_trip(tunnel, b"two layers deep").await,
        b"two layers deep"
    );
    assert_eq!(outer_client.connections_opened(), 1);
    assert_eq!(inner_client.connections_opened(), 1);
}

#[tokio::test]
async fn graceful_shutdown_drains_open_tunnels_then_stops() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    // A drain deadline far past anything this test waits for: the server ends because its
    // last tunnel did.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut server = start_on(
        &pki,
        listener,
        ServerConfig::default(),
        Forward::new(),
        Duration::from_secs(120),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut open = client.open(target(server.addr, backend)).await.unwrap();
    server.stop();
    // The drain has begun once the listener is closed.
    within("the listener closing at the shutdown", async {
        while TcpStream::connect(server.addr).await.is_ok() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;

    // The open tunnel keeps working while the server drains.
    open.write_all(b"during drain").await.unwrap();
    let mut buf = [0u8; 12];
    within("the echo during the drain", open.read_exact(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf, b"during drain");
    // New connections are refused: the listener is closed.
    let other = pki.client(
        "spiffe://cluster.local/ns/shop/sa/other",
        ClientConfig::default(),
    );
    let t = Target::new(
        server.addr,
        backend,
        id("spiffe://cluster.local/ns/shop/sa/other"),
        id(SERVER),
    );
    let err = other.open(t).await.unwrap_err();
    assert!(err.is_connect(), "refused at TCP: {err:?}");
    assert!(
        !server.task.is_finished(),
        "the server waits for its tunnel"
    );

    assert_eq!(round_trip(open, b"last").await, b"last");
    within("the server's end once its tunnels closed", &mut server.task)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn drain_deadline_closes_what_is_left() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut server = start_on(
        &pki,
        listener,
        ServerConfig::default(),
        Forward::new(),
        Duration::from_millis(300),
    )
    .await;
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut open = client.open(target(server.addr, backend)).await.unwrap();
    // The tunnel works, and its client keeps it open through the drain.
    open.write_all(b"before").await.unwrap();
    let mut echoed = [0u8; 6];
    within("the echo before the shutdown", open.read_exact(&mut echoed))
        .await
        .unwrap();
    assert_eq!(&echoed, b"before");
    server.stop();
    within(
        "the server's end at the drain deadline, with a tunnel still open",
        &mut server.task,
    )
    .await
    .unwrap()
    .unwrap();
    // The deadline cut the tunnel: its reader sees an error, not a clean end, and no data.
    let mut rest = Vec::new();
    let end = within(
        "the end of the tunnel the deadline cut",
        open.read_to_end(&mut rest),
    )
    .await;
    let err = end.expect_err("a tunnel cut by the drain deadline must not read as a clean end");
    // Like a reset stream, a cut connection reads as a reset (docs/hbone.md, "Resets").
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert!(rest.is_empty(), "{} bytes after the cut", rest.len());
}

#[tokio::test]
async fn handshake_timeout_and_garbage_never_take_the_server_down() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default().with_handshake_timeout(Duration::from_millis(200)),
        Forward::new(),
    )
    .await;
    // Silent client: closed after the handshake timeout.
    let mut silent = TcpStream::connect(server.addr).await.unwrap();
    let mut buf = [0u8; 16];
    let n = within(
        "the server closing the silent connection",
        silent.read(&mut buf),
    )
    .await
    .unwrap_or(0);
    assert_eq!(n, 0, "the server sent nothing to a silent client");
    // Garbage instead of a ClientHello: the server closes (whatever it answers first).
    let mut garbage = TcpStream::connect(server.addr).await.unwrap();
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    within("the server closing the garbage connection", async {
        while matches!(garbage.read(&mut buf).await, Ok(n) if n > 0) {}
    })
    .await;
    // Still serving.
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = client.open(target(server.addr, backend)).await.unwrap();
    assert_eq!(round_trip(tunnel, b"ok").await, b"ok");
    wait_until("the server counting both failed handshakes", || {
        server.stats.handshake_failures() >= 2
    })
    .await;
    assert_eq!(server.stats.handshake_failures(), 2);
}

/// TCP whose sockets count the writes and shutdowns they are given.
#[derive(Clone, Default)]
struct Counted(Arc<Counts>);

#[derive(Default)]
struct Counts {
    writes: std::sync::atomic::AtomicUsize,
    shutdowns: std::sync::atomic::AtomicUsize,
}

impl Counts {
    fn writes(&self) -> usize {
        self.writes.load(std::sync::atomic::Ordering::SeqCst)
    }
}

struct CountedIo {
    io: TcpStream,
    counts: Arc<Counts>,
}

impl meshkit_hbone::Connect for Counted {
    type Io = CountedIo;

    fn connect(
        &self,
        addr: SocketAddr,
    ) -> meshkit_hbone::BoxFuture<'static, std::io::Result<CountedIo>> {
        let counts = self.0.clone();
        Box::pin(async move {
            let io = meshkit_hbone::TcpConnector.connect(addr).await?;
            Ok(CountedIo { io, counts })
        })
    }
}

impl tokio::io::AsyncRead for CountedIo {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for CountedIo {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        self.poll_write_vectored(cx, &[std::io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let written = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if written.is_ready() {
            self.counts
                .writes
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        self.counts
            .shutdowns
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// A client closing its connection with a tunnel still open writes the tunnel's reset, GOAWAY
/// and close_notify, which h2 flushes one at a time in one poll, in one system call; the data
/// before them is all there.
#[tokio::test]
async fn a_closing_connection_sends_its_last_frames_in_one_write() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(&pki, ServerConfig::default(), Forward::new()).await;
    let counted = Counted::default();
    let client = Client::with_connector(
        ClientConfig::default(),
        counted.clone(),
        pki.ca.issue(id(CLIENT)),
        pki.ca.bundle_set(),
    );
    let tunnel = client.open(target(server.addr, backend)).await.unwrap();

    // 1 MiB each way, both at once: DATA and WINDOW_UPDATE through the corked writes.
    let payload: Vec<u8> = (0..1 << 20).map(|i: u32| (i % 251) as u8).collect();
    let (mut r, mut w) = tokio::io::split(tunnel);
    let mut echoed = vec![0; payload.len()];
    within("1 MiB echoed", async {
        tokio::join!(async { w.write_all(&payload).await.unwrap() }, async {
            r.read_exact(&mut echoed).await.unwrap()
        },)
    })
    .await;
    assert!(echoed == payload, "the echo differs from what was sent");
    let tunnel = r.unsplit(w);
    // Let the connection go quiet (the last WINDOW_UPDATEs).
    tokio::time::sleep(Duration::from_millis(100)).await;

    let before = counted.0.writes();
    drop(tunnel);
    drop(client);
    wait_until("the client's side shut down", || {
        counted
            .0
            .shutdowns
            .load(std::sync::atomic::Ordering::SeqCst)
            == 1
    })
    .await;
    assert_eq!(
        counted.0.writes() - before,
        1,
        "RST_STREAM, GOAWAY and close_notify in one write"
    );
}

/// Tunnels that answer in the same turn of the server's runtime, with answers small enough
/// to be held (a gateway's HTTP/1.1 responses, say), leave in one write of the server's
/// connection rather than one each: h2 flushes after every DATA frame of 256 bytes or more.
#[tokio::test]
async fn small_answers_of_many_tunnels_leave_the_server_in_one_write() {
    const TUNNELS: usize = 8;
    const ANSWER: usize = 300;
    let pki = Pki::new();
    let (go, ready) = tokio::sync::watch::channel(false);
    let waiting = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = waiting.clone();
    let service = decide_fn(move |_: ConnectRequest| {
        let (mut ready, waiting) = (ready.clone(), counted.clone());
        async move {
            Decision::accept(move |mut tunnel| async move {
                // Counted in the poll that starts the wait: every counted handler is woken by
                // the one send.
                waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let _ = ready.wait_for(|go| *go).await;
                tunnel.write_all(&[7; ANSWER]).await.unwrap();
                // Open until the client lets go.
                let _ = tunnel.read(&mut [0u8; 1]).await;
            })
        }
    });
    let selector = SingleIdentity::new(pki.server_tls(SERVER, Authorize::AnyTrusted));
    let server = Server::new(ServerConfig::default(), selector, service);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counts = Arc::new(Counts::default());
    let server_counts = counts.clone();
    tokio::spawn(async move {
        let (io, source) = listener.accept().await.unwrap();
        let io = CountedIo {
            io,
            counts: server_counts,
        };
        let _ = server.serve_connection(io, source, addr).await;
    });

    let client = pki.client(CLIENT, ClientConfig::default());
    let mut tunnels = Vec::new();
    for _ in 0..TUNNELS {
        let destination = SocketAddr::from(([127, 0, 0, 1], 9));
        tunnels.push(client.open(target(addr, destination)).await.unwrap());
    }
    assert_eq!(client.connections_opened(), 1);
    wait_until("every handler waiting", || {
        waiting.load(std::sync::atomic::Ordering::SeqCst) == TUNNELS
    })
    .await;
    // The connection quiet.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = counts.writes();
    go.send(true).unwrap();
    within("every answer read", async {
        for tunnel in &mut tunnels {
            let mut answer = [0u8; ANSWER];
            tunnel.read_exact(&mut answer).await.unwrap();
            assert_eq!(answer, [7; ANSWER]);
        }
    })
    .await;
    assert_eq!(
        counts.writes() - before,
        1,
        "{TUNNELS} answers of {ANSWER} bytes in one write"
    );
}

/// A new connection's client writes its ClientHello, then everything else up to the CONNECT
/// in one write: the ChangeCipherSpec rustls encodes while reading the server's flight, its
/// Certificate, CertificateVerify and Finished, and HTTP/2's preface, SETTINGS and HEADERS.
/// The only other write before the 200 is the ACK of the server's SETTINGS.
#[tokio::test]
async fn a_cold_tunnel_s_client_sends_its_last_flight_and_the_connect_in_one_write() {
    let pki = Pki::new();
    let (go, ready) = tokio::sync::watch::channel(false);
    let asked = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = asked.clone();
    let service = decide_fn(move |_: ConnectRequest| {
        let (mut ready, asked) = (ready.clone(), counted.clone());
        async move {
            asked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            // The 200 waits until the client's writes are counted.
            let _ = ready.wait_for(|go| *go).await;
            Decision::accept(|mut tunnel| async move {
                let _ = tunnel.read(&mut [0u8; 1]).await;
            })
        }
    });
    let server = start(&pki, ServerConfig::default(), service).await;

    let counted = Counted::default();
    let client = Client::with_connector(
        ClientConfig::default(),
        counted.clone(),
        pki.ca.issue(id(CLIENT)),
        pki.ca.bundle_set(),
    );
    let destination = SocketAddr::from(([127, 0, 0, 1], 9));
    let addr = server.addr;
    let open = tokio::spawn(async move { client.open(target(addr, destination)).await });
    wait_until("the CONNECT at the server", || {
        asked.load(std::sync::atomic::Ordering::SeqCst) == 1
    })
    .await;
    // The server's SETTINGS read and acknowledged.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(
        counted.0.writes(),
        3,
        "ClientHello; the last flight with the preface and the CONNECT; the SETTINGS ACK"
    );
    go.send(true).unwrap();
    within("the tunnel open", open).await.unwrap().unwrap();
}
