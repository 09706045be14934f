//! The server's limits on connections and on streams per connection, and what the client does
//! with a server's stream limit.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use meshkit_hbone::{ClientConfig, Forward, ServerConfig, Target};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn target(server: SocketAddr, destination: SocketAddr) -> Target {
    Target::new(server, destination, id(CLIENT), id(SERVER))
}

/// HTTP/2 frame types and codes these tests read (RFC 9113 sections 6 and 7).
const SETTINGS: u8 = 0x4;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS_MAX_CONCURRENT_STREAMS: u16 = 0x3;
const REFUSED_STREAM: u32 = 0x7;
/// HPACK, static table index 8: `:status: 200`, as the first byte of a response's block.
const STATUS_200: u8 = 0x88;

/// A raw TCP connection to `server` from 127.0.0.`host`, which never starts TLS.
async fn silent_from(host: u8, server: SocketAddr) -> tokio::net::TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().unwrap();
    sock.bind(SocketAddr::from(([127, 0, 0, host], 0))).unwrap();
    sock.connect(server).await.unwrap()
}

/// Whether the server closed `sock` (EOF or a reset) within the patience of these tests.
async fn closed(sock: &mut tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 1];
    matches!(
        tokio::time::timeout(Duration::from_secs(10), sock.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// `max_connections` places are shared fairly among sources: one source that fills them
/// with connections that never authenticate keeps a client of another source out only until
/// it asks. The client's connection takes the place of the filler's least recently active
/// one, which is closed; a further connection from the filler, which now holds as many as
/// is fair, is closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_source_filling_max_connections_gives_a_place_to_another() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default()
            .with_max_connections(4)
            .with_handshake_timeout(Duration::from_secs(60)),
        Forward::new(),
    )
    .await;
    let mut filler = Vec::new();
    for _ in 0..4 {
        filler.push(silent_from(3, server.addr).await);
    }
    // Each of the four holds its place (in its TLS handshake).
    within("the four places held", async {
        while server.stats.connections_open() < 4 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    // A client of another source (127.0.0.1) is served at once.
    let client = pki.client(CLIENT, ClientConfig::default());
    let tunnel = within(
        "the other source's tunnel",
        client.open(target(server.addr, backend)),
    )
    .await
    .expect("a place for another source");
    assert_eq!(round_trip(tunnel, b"served").await, b"served");
    let shares = server.stats.connection_shares().expect("fair shares");
    assert_eq!(shares.evicted(), 1);
    // One of the filler's connections was closed to make room.
    let mut closed_count = 0;
    for sock in &mut filler {
        let mut buf = [0u8; 1];
        if let Ok(Ok(0) | Err(_)) =
            tokio::time::timeout(Duration::from_millis(200), sock.read(&mut buf)).await
        {
            closed_count += 1;
        }
    }
    assert_eq!(closed_count, 1);
    // The filler holds 3 and the client 1 of the 4: one more from the filler is closed.
    let mut more = silent_from(3, server.addr).await;
    assert!(
        closed(&mut more).await,
        "a fifth connection of the filler was kept"
    );
    assert_eq!(shares.refused_full(), 1);
}

/// One source holds at most `max_connections_per_source` connections, in their handshakes
/// or not; one more is closed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_a_sources_share_are_closed() {
    let pki = Pki::new();
    let server = start(
        &pki,
        ServerConfig::default()
            .with_max_connections_per_source(2)
            .with_handshake_timeout(Duration::from_secs(60)),
        Forward::new(),
    )
    .await;
    let _held = [
        silent_from(4, server.addr).await,
        silent_from(4, server.addr).await,
    ];
    let mut third = silent_from(4, server.addr).await;
    assert!(
        closed(&mut third).await,
        "a third connection of one source was kept"
    );
    let shares = server.stats.connection_shares().expect("fair shares");
    assert_eq!(shares.refused_share(), 1);
    // Another source is served.
    let mut other = silent_from(5, server.addr).await;
    let mut buf = [0u8; 1];
    assert!(
        tokio::time::timeout(Duration::from_millis(300), other.read(&mut buf))
            .await
            .is_err(),
        "another source's connection was closed"
    );
}

/// The server announces its stream limit in SETTINGS_MAX_CONCURRENT_STREAMS and refuses a
/// stream past it with REFUSED_STREAM, never handing it to the service; once a stream ends,
/// the next one is served. A raw client, since h2's own waits for the limit.
#[tokio::test]
async fn streams_past_max_streams_per_connection_are_refused() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default().with_max_streams_per_connection(2),
        Forward::new(),
    )
    .await;
    let authority = backend.to_string();
    let block = frame::connect_block(&authority);
    let mut tls = raw_tls(&pki, server.addr).await;
    let mut out = frame::PREFACE.to_vec();
    out.extend(frame::settings(&[]));
    out.extend(frame::settings_ack());
    // Three CONNECTs at once, before reading anything: streams 1, 3 and 5.
    for stream in [1, 3, 5] {
        out.extend(frame::frame(HEADERS, frame::END_HEADERS, stream, &block));
    }
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();

    let (mut limit, mut answered, mut refused) = (None, Vec::new(), Vec::new());
    within(
        "the server's SETTINGS, two answers and one refusal",
        async {
            while limit.is_none() || answered.len() < 2 || refused.is_empty() {
                let (kind, flags, stream, payload) = read_frame(&mut tls).await.unwrap();
                match kind {
                    SETTINGS if flags & 0x1 == 0 => {
                        for setting in payload.chunks(6) {
                            let id = u16::from_be_bytes([setting[0], setting[1]]);
                            if id == SETTINGS_MAX_CONCURRENT_STREAMS {
                                limit = Some(u32::from_be_bytes(setting[2..6].try_into().unwrap()));
                            }
                        }
                    }
                    HEADERS => {
                        assert_eq!(payload.first(), Some(&STATUS_200), "stream {stream}");
                        answered.push(stream);
                    }
                    RST_STREAM => {
                        let code = u32::from_be_bytes(payload[..4].try_into().unwrap());
                        refused.push((stream, code));
                    }
                    _ => {}
                }
            }
        },
    )
    .await;
    assert_eq!(limit, Some(2), "SETTINGS_MAX_CONCURRENT_STREAMS");
    answered.sort();
    assert_eq!(answered, [1, 3]);
    assert_eq!(refused, [(5, REFUSED_STREAM)]);
    assert_eq!(
        server.stats.streams(),
        2,
        "the refused stream never reached the service"
    );

    // Stream 1 ends (reset by the client): a new stream fits again.
    let mut out = frame::rst_stream(1, 0x8);
    out.extend(frame::frame(HEADERS, frame::END_HEADERS, 7, &block));
    tls.write_all(&out).await.unwrap();
    tls.flush().await.unwrap();
    within("the answer to a stream opened once another ended", async {
        loop {
            let (kind, _, stream, payload) = read_frame(&mut tls).await.unwrap();
            if kind == RST_STREAM && stream == 7 {
                panic!("stream 7 was reset: {payload:?}");
            }
            if kind == HEADERS && stream == 7 {
                assert_eq!(payload.first(), Some(&STATUS_200));
                return;
            }
        }
    })
    .await;
    assert_eq!(server.stats.streams(), 3);
}

/// A server that allows fewer streams per connection than the client would put on one: the
/// client opens another connection instead of waiting for one of the open tunnels to end.
#[tokio::test]
async fn the_client_opens_another_connection_when_the_server_allows_fewer_streams() {
    let pki = Pki::new();
    let backend = echo_backend().await;
    let server = start(
        &pki,
        ServerConfig::default().with_max_streams_per_connection(2),
        Forward::new(),
    )
    .await;
    // The client would carry 100 tunnels per connection.
    let client = pki.client(CLIENT, ClientConfig::default());
    let mut held = Vec::new();
    for i in 0..5 {
        let tunnel = within(
            &format!("tunnel {i} of 5, all held open"),
            client.open(target(server.addr, backend)),
        )
        .await
        .unwrap();
        held.push(tunnel);
    }
    // 2 + 2 + 1.
    assert_eq!(client.connections_opened(), 3);
    assert_eq!(server.stats.connections_accepted(), 3);
    for (i, tunnel) in held.iter_mut().enumerate() {
        let msg = format!("tunnel {i}");
        tunnel.write_all(msg.as_bytes()).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        within("an echo on a held tunnel", tunnel.read_exact(&mut back))
            .await
            .unwrap();
        assert_eq!(back, msg.as_bytes());
    }
}
