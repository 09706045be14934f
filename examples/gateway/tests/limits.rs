//! The gateway's bounds on what one client can hold (issue 12, items 4 and 16): the protocol
//! sniff, HTTP/1 heads (plain and after TLS), request bodies (size and time, apart from the
//! response timeout, and counted from when the body starts to go to the backend), the
//! connection cap, HTTP/2 idleness and keepalive, clients that stop reading an answer (the
//! write-stall timeout), and the forwarding and backend headers a client may set or see.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use meshkit_gateway::{BACKEND_IDENTITY, BACKEND_WORKLOAD};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const SECOND: Duration = Duration::from_secs(1);
/// How long a test waits for the gateway to close a connection or answer: far above the
/// timeouts it tests, so that a loaded machine does not fail it.
const WITHIN: Duration = Duration::from_secs(10);
const TRICKLE: &[u8] = b"GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";

#[tokio::test]
async fn a_silent_connection_is_closed_after_the_sniff_timeout() {
    let h = start(|s| s.with_sniff_timeout(SECOND)).await;
    let sock = TcpStream::connect(h.http).await.expect("connect");
    assert!(
        closed_within(sock, b"", SECOND, WITHIN).await,
        "a connection that sends nothing stays open"
    );
    // After TLS too: a client that completes the handshake and goes silent.
    let tls = tls_connect(&h, &[b"h2"]).await;
    assert!(
        closed_within(tls, b"", SECOND, WITHIN).await,
        "a TLS connection that sends nothing stays open"
    );
    honest(h.http).await;
}

#[tokio::test]
async fn a_head_trickled_byte_by_byte_is_cut_off() {
    let h = start(|s| s.with_header_read_timeout(SECOND)).await;
    let sock = TcpStream::connect(h.http).await.expect("connect");
    assert!(
        closed_within(sock, TRICKLE, Duration::from_millis(50), WITHIN).await,
        "slowloris over plain HTTP/1 keeps its connection"
    );
    let tls = tls_connect(&h, &[b"http/1.1"]).await;
    assert!(
        closed_within(tls, TRICKLE, Duration::from_millis(50), WITHIN).await,
        "slowloris over HTTP/1 after TLS keeps its connection"
    );
    honest(h.http).await;
}

/// `POST /` for HOST with a declared length, its body written by the caller.
async fn post_head(addr: std::net::SocketAddr, length: usize) -> TcpStream {
    let mut sock = TcpStream::connect(addr).await.expect("connect");
    let head = format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {length}\r\n\r\n");
    sock.write_all(head.as_bytes()).await.expect("head");
    sock
}

/// Reads an HTTP/1 answer's status line (up to `within`).
async fn status_line(sock: &mut TcpStream, within: Duration) -> Option<String> {
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            match sock.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::time::timeout(within, read).await.ok()?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    text.lines().next().map(str::to_owned)
}

#[tokio::test]
async fn a_slow_upload_gets_408() {
    let h = start(|s| s.with_request_body_timeout(SECOND)).await;
    let mut sock = post_head(h.http, 1000).await;
    let (mut r, mut w) = sock.split();
    let trickle = async {
        for _ in 0..100 {
            if w.write_all(b"0123456789").await.is_err() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        std::future::pending::<()>().await;
    };
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::select! {
        () = trickle => {}
        _ = tokio::time::timeout(WITHIN, read) => {}
    }
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 408"), "answer: {text:?}");
    honest(h.http).await;
}

#[tokio::test]
async fn the_response_timeout_starts_after_the_upload() {
    // An upload of 3 s, twice the response timeout, within the body timeout; the backend
    // then has the whole response timeout (1.5 s) to answer.
    let h = start(|s| {
        s.with_response_timeout(Duration::from_millis(1500))
            .with_request_body_timeout(20 * SECOND)
    })
    .await;
    let mut sock = post_head(h.http, 10).await;
    for b in b"0123456789" {
        sock.write_all(&[*b]).await.expect("body");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let line = status_line(&mut sock, WITHIN).await;
    assert_eq!(line.as_deref(), Some("HTTP/1.1 200 OK"));
}

/// A TCP relay on loopback to port `to` that holds each connection back for `delay` before
/// it passes anything on: an HBONE server whose tunnels take that long to open. Its port.
fn slow_relay(to: u16, delay: Duration) -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind relay");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let listener = tokio::net::TcpListener::from_std(listener).expect("relay listener");
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                tokio::time::sleep(delay).await;
                let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", to)).await else {
                    return;
                };
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    port
}

#[tokio::test]
async fn the_body_timeout_starts_when_the_body_starts_to_go_to_the_backend() {
    // The tunnel takes 2 s to open and the body 2.5 s to arrive: past a body timeout of
    // 2 s counted from the request head, well within it counted from the body's first read
    // (once the tunnel is open, with 0.5 s of the body left), which is when the gateway
    // starts it.
    let h = start(|s| {
        let relay = slow_relay(s.hbone_port, 2 * SECOND);
        s.with_hbone_port(relay)
            .with_request_body_timeout(2 * SECOND)
    })
    .await;
    let mut sock = post_head(h.http, 10).await;
    for b in b"0123456789" {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if sock.write_all(&[*b]).await.is_err() {
            // Answered (and closed) before the body's end: the status says why.
            break;
        }
    }
    let line = status_line(&mut sock, WITHIN).await;
    assert_eq!(line.as_deref(), Some("HTTP/1.1 200 OK"));
}

/// A connection to `addr` with a small receive buffer, so that an answer it does not read
/// backs up into the gateway after a few MiB.
async fn small_buffer_connect(addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.set_recv_buffer_size(64 * 1024)
        .expect("receive buffer");
    sock.connect(addr).await.expect("connect")
}

/// Reads (and drops) until the gateway ends the connection (EOF or reset) or `within`
/// passes: the bytes read, and whether it ended.
async fn drain(sock: &mut TcpStream, within: Duration) -> (usize, bool) {
    let mut total = 0;
    let mut buf = vec![0u8; 1 << 16];
    let ended = tokio::time::timeout(within, async {
        loop {
            match sock.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => total += n,
            }
        }
    })
    .await
    .is_ok();
    (total, ended)
}

#[tokio::test]
async fn a_client_that_stops_reading_is_closed_after_the_write_stall_timeout() {
    // A second: an honest reader on a loaded machine may pause, but not for that long.
    let h = start(|s| s.with_write_stall_timeout(SECOND)).await;
    // HTTP/1.1: the head of a 64 MiB answer, then nothing read.
    let mut h1 = small_buffer_connect(h.http).await;
    let get = format!("GET /huge HTTP/1.1\r\nHost: {HOST}\r\n\r\n");
    h1.write_all(get.as_bytes()).await.expect("request");
    let line = status_line(&mut h1, WITHIN).await;
    assert_eq!(line.as_deref(), Some("HTTP/1.1 200 OK"));
    // HTTP/2: windows opened wide, so that only the socket holds the answer back; its
    // HEADERS, then nothing read.
    let mut h2 = small_buffer_connect(h.http).await;
    let mut out = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
    // SETTINGS_INITIAL_WINDOW_SIZE 2^31-1, and the connection window to match.
    out.extend(frame(0x4, 0, 0, &[0, 4, 0x7f, 0xff, 0xff, 0xff]));
    out.extend(frame(0x8, 0, 0, &(0x7fff_ffff_u32 - 65_535).to_be_bytes()));
    let mut block = get_block();
    // :path /huge instead of / (literal with indexed name 4).
    block[2] = 0x04;
    block.insert(3, 5);
    block.splice(4..4, *b"/huge");
    out.extend(frame(HEADERS, END_HEADERS | END_STREAM, 1, &block));
    h2.write_all(&out).await.expect("requests");
    let answered = tokio::time::timeout(WITHIN, async {
        loop {
            let mut head = [0u8; 9];
            h2.read_exact(&mut head).await.expect("frame head");
            let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; len];
            h2.read_exact(&mut payload).await.expect("frame payload");
            if head[3] == HEADERS && head[5..9] == [0, 0, 0, 1] {
                return;
            }
        }
    })
    .await;
    assert!(answered.is_ok(), "no HTTP/2 answer head");
    // Meanwhile an honest client reads a whole 4 MiB answer.
    let big = http::Request::get("/big")
        .header("host", HOST)
        .body(Full::new(Bytes::new()))
        .expect("request");
    // Neither stalled client reads for three write-stall timeouts: the stall the gateway
    // must see, with room for a loaded machine to run its timer late (reading earlier would
    // let the answer flow again).
    let (answer, ()) = tokio::join!(request_in_time(h.http, big), tokio::time::sleep(3 * SECOND));
    assert_eq!((answer.status, answer.body.len()), (200, 4 << 20));
    // The gateway has given up on both: what the sockets held, then the end.
    let ((read1, ended1), (read2, ended2)) =
        tokio::join!(drain(&mut h1, WITHIN), drain(&mut h2, WITHIN));
    assert!(
        ended1 && read1 < HUGE,
        "HTTP/1.1: {read1} bytes, ended: {ended1}"
    );
    assert!(
        ended2 && read2 < HUGE,
        "HTTP/2: {read2} bytes, ended: {ended2}"
    );
    honest(h.http).await;
}

#[tokio::test]
async fn a_backend_that_reads_no_body_and_never_answers_gets_504() {
    // More body than the sockets and the tunnel's windows hold, so the upload stalls on the
    // backend, not the client: the body's deadline plus the response timeout, then 504.
    let h = start(|s| {
        s.with_max_request_body_bytes(64 << 20)
            .with_request_body_timeout(SECOND)
            .with_response_timeout(Duration::from_millis(500))
    })
    .await;
    let length = 48 << 20;
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    let head = format!("POST /stall HTTP/1.1\r\nHost: {HOST}\r\nContent-Length: {length}\r\n\r\n");
    sock.write_all(head.as_bytes()).await.expect("head");
    let (mut r, mut w) = sock.split();
    let upload = async {
        let chunk = vec![b'a'; 1 << 20];
        for _ in 0..48 {
            if w.write_all(&chunk).await.is_err() {
                break;
            }
        }
        std::future::pending::<()>().await;
    };
    let mut buf = Vec::new();
    let read = async {
        let mut chunk = [0u8; 1024];
        while !buf.windows(2).any(|w| w == b"\r\n") {
            match r.read(&mut chunk).await {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    tokio::select! {
        () = upload => {}
        _ = tokio::time::timeout(WITHIN, read) => {}
    }
    let text = String::from_utf8_lossy(&buf);
    assert!(text.starts_with("HTTP/1.1 504"), "answer: {text:?}");
}

#[tokio::test]
async fn a_body_over_the_limit_gets_413() {
    let h = start(|s| s.with_max_request_body_bytes(1000)).await;
    // Declared: refused before anything is forwarded.
    let req = http::Request::post("/")
        .header("host", HOST)
        .body(Full::new(Bytes::from(vec![b'a'; 2000])))
        .expect("request");
    let answer = request_in_time(h.http, req).await;
    assert_eq!(answer.status, 413, "{answer:?}");
    // Chunked: cut off once it grows past the limit.
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    let mut req = format!("POST / HTTP/1.1\r\nHost: {HOST}\r\nTransfer-Encoding: chunked\r\n\r\n")
        .into_bytes();
    for _ in 0..4 {
        req.extend_from_slice(b"1f4\r\n");
        req.extend_from_slice(&[b'a'; 500]);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    sock.write_all(&req).await.expect("request");
    let line = status_line(&mut sock, WITHIN).await;
    assert_eq!(line.as_deref(), Some("HTTP/1.1 413 Payload Too Large"));
    // Within the limit: forwarded.
    let req = http::Request::post("/")
        .header("host", HOST)
        .body(Full::new(Bytes::from(vec![b'a'; 1000])))
        .expect("request");
    let answer = request_in_time(h.http, req).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "got 1000"));
}

/// An HTTP/1.1 connection to `addr` that has had one answer (so the gateway has accepted and
/// counted it), kept open until the sender is dropped.
async fn answered_connection(
    addr: SocketAddr,
) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let sock = TcpStream::connect(addr).await.expect("connect");
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let resp = tokio::time::timeout(WITHIN, send.send_request(get(&[])))
        .await
        .expect("answered in time")
        .expect("answer");
    assert_eq!(resp.status(), 200);
    send
}

#[tokio::test]
async fn connections_beyond_the_cap_are_closed_at_once() {
    let h = start(|s| s.with_max_connections(2)).await;
    let first = answered_connection(h.http).await;
    let second = answered_connection(h.http).await;
    let third = TcpStream::connect(h.http).await.expect("connect");
    assert!(
        closed_within(third, b"", SECOND, WITHIN).await,
        "a connection beyond the cap stays open"
    );
    // The place comes back once the gateway has seen the first connection end.
    drop(first);
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        let sock = TcpStream::connect(h.http).await.expect("connect");
        let attempt = async {
            let (mut send, conn) =
                hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
                    .await
                    .ok()?;
            tokio::spawn(conn);
            send.send_request(get(&[])).await.ok()
        };
        let status = tokio::time::timeout(WITHIN, attempt)
            .await
            .expect("answered or closed in time")
            .map(|resp| resp.status());
        if status == Some(http::StatusCode::OK) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no place came back after a connection closed: {status:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(second);
}

/// A TCP connection to `addr` from 127.0.0.`host`.
async fn connect_from(host: u8, addr: SocketAddr) -> TcpStream {
    let sock = tokio::net::TcpSocket::new_v4().expect("socket");
    sock.bind(SocketAddr::from(([127, 0, 0, host], 0)))
        .expect("bind");
    sock.connect(addr).await.expect("connect")
}

/// The cap is shared fairly among sources: one that fills it with idle connections keeps
/// another out only until it asks. The other source's request is answered, in the place of
/// the filler's least recently active connection, which is closed.
#[tokio::test]
async fn one_source_filling_the_cap_gives_a_place_to_another() {
    let mut h = start(|s| s.with_max_connections(4)).await;
    let admin_addr = admin(&mut h).await;
    let mut filler = Vec::new();
    for _ in 0..4 {
        filler.push(connect_from(7, h.http).await);
    }
    let sock = connect_from(8, h.http).await;
    let (mut send, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(sock))
            .await
            .expect("handshake");
    tokio::spawn(conn);
    let resp = tokio::time::timeout(WITHIN, send.send_request(get(&[])))
        .await
        .expect("answered in time")
        .expect("another source is served");
    assert_eq!(resp.status(), 200);
    let mut closed = 0;
    for sock in filler {
        if closed_within(sock, b"", Duration::ZERO, Duration::from_millis(300)).await {
            closed += 1;
        }
    }
    assert_eq!(closed, 1, "one of the filler's connections gives its place");
    let metrics = scrape(admin_addr).await;
    assert_eq!(
        metrics.value(
            "meshkit_gateway_downstream_connections_refused_total",
            &[("reason", "evicted")]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn an_idle_http2_connection_is_closed() {
    let h = start(|s| s.with_idle_timeout(Duration::from_millis(500))).await;
    let sock = TcpStream::connect(h.http).await.expect("connect");
    let (mut send, conn) = hyper::client::conn::http2::handshake(
        hyper_util::rt::TokioExecutor::new(),
        hyper_util::rt::TokioIo::new(sock),
    )
    .await
    .expect("h2 handshake");
    let conn = tokio::spawn(conn);
    let req = http::Request::get(format!("http://{HOST}/"))
        .body(Full::new(Bytes::new()))
        .expect("request");
    let resp = tokio::time::timeout(WITHIN, send.send_request(req))
        .await
        .expect("answered in time")
        .expect("answer");
    assert_eq!(resp.status(), 200);
    drop(resp);
    let ended = tokio::time::timeout(WITHIN, conn).await;
    assert!(ended.is_ok(), "an idle HTTP/2 connection stays open");
}

#[tokio::test]
async fn an_http2_client_that_does_not_answer_pings_is_closed() {
    let h = start(|s| {
        s.with_http2_keepalive(Some(Duration::from_millis(300)), Duration::from_millis(300))
    })
    .await;
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    sock.write_all(&h2_preface()).await.expect("preface");
    // Reads (and ignores) every frame, PINGs included.
    assert!(
        closed_within(sock, b"", SECOND, WITHIN).await,
        "a client that answers no PING stays connected"
    );
}

#[tokio::test]
async fn forwarding_headers_are_kept_only_from_trusted_proxies() {
    let spoofed = [
        ("x-forwarded-for", "203.0.113.9"),
        ("forwarded", "for=203.0.113.9"),
    ];
    let h = start(|s| s).await;
    let answer = request_in_time(h.http, get(&spoofed)).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert_eq!(answer.headers["x-seen-xff"], "127.0.0.1");
    let forwarded = answer.headers["x-seen-forwarded"].to_str().expect("ascii");
    assert!(!forwarded.contains("203.0.113.9"), "{forwarded}");
    assert!(forwarded.starts_with("for=127.0.0.1;"), "{forwarded}");

    let h = start(|s| s.with_trusted_proxies(["127.0.0.0/8".parse().expect("cidr")])).await;
    let answer = request_in_time(h.http, get(&spoofed)).await;
    assert_eq!(answer.headers["x-seen-xff"], "203.0.113.9, 127.0.0.1");
    let forwarded = answer.headers["x-seen-forwarded"].to_str().expect("ascii");
    assert!(
        forwarded.starts_with("for=203.0.113.9, for=127.0.0.1;"),
        "{forwarded}"
    );
}

#[tokio::test]
async fn backend_headers_are_sent_only_when_asked() {
    let h = start(|s| s).await;
    let answer = request_in_time(h.http, get(&[])).await;
    assert_eq!(answer.status, 200, "{answer:?}");
    assert!(!answer.headers.contains_key(BACKEND_WORKLOAD), "{answer:?}");
    assert!(!answer.headers.contains_key(BACKEND_IDENTITY), "{answer:?}");

    let h = start(|s| s.with_backend_headers(true)).await;
    let answer = request_in_time(h.http, get(&[])).await;
    assert_eq!(answer.headers[BACKEND_WORKLOAD], "web-1");
    assert_eq!(
        answer.headers[BACKEND_IDENTITY],
        "spiffe://cluster.local/ns/shop/sa/web"
    );
}
