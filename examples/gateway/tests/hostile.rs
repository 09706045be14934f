//! Hostile peers against the gateway, in-process on loopback, bounded in count and time:
//! HTTP/2 rapid reset, a CONTINUATION flood, oversized heads, slowloris before and after
//! TLS, and peers that never read. Each test checks that the gateway keeps serving honest
//! requests during and after the attack, and that this test process (gateway, backend and
//! attackers together) stays under [`RSS_BOUND_KIB`] of resident memory.

mod support;

use std::time::{Duration, Instant};

use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The resident memory the test process may reach during any of these attacks: generous,
/// several times what it needs, so that it fails only on growth without bound.
const RSS_BOUND_KIB: u64 = 512 * 1024;

fn assert_rss_bounded(when: &str) {
    let rss = rss_kib();
    eprintln!("{when}: VmRSS {rss} KiB");
    assert!(rss < RSS_BOUND_KIB, "{when}: resident set {rss} KiB");
}

/// Honest requests, plain and HTTP/2 over TLS, answered by the backend.
async fn honest_traffic(h: &Harness) {
    honest(h.http).await;
    honest_tls_h2(h).await;
}

#[tokio::test]
async fn http2_rapid_reset() {
    let h = start(|s| s).await;
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let addr = h.http;
        attackers.push(tokio::spawn(async move {
            let mut sock = TcpStream::connect(addr).await.expect("connect");
            let mut out = h2_preface();
            // 2,000 requests, each reset right after its HEADERS.
            for n in 0..2000u32 {
                let stream = 2 * n + 1;
                out.extend(frame(
                    HEADERS,
                    END_HEADERS | END_STREAM,
                    stream,
                    &get_block(),
                ));
                out.extend(frame(RST_STREAM, 0, stream, &8u32.to_be_bytes()));
            }
            let (mut r, mut w) = sock.split();
            let drain = async {
                let mut buf = [0u8; 16384];
                while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
            };
            let write = async {
                let _ = w.write_all(&out).await;
                std::future::pending::<()>().await;
            };
            tokio::select! {
                () = drain => {}
                () = write => {}
                () = tokio::time::sleep(Duration::from_secs(5)) => {}
            }
        }));
    }
    honest_traffic(&h).await;
    for a in attackers {
        a.await.expect("attacker");
    }
    assert_rss_bounded("after rapid reset");
    honest_traffic(&h).await;
}

#[tokio::test]
async fn http2_continuation_flood() {
    let h = start(|s| s).await;
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    sock.write_all(&h2_preface()).await.expect("preface");
    sock.write_all(&frame(HEADERS, 0, 1, &get_block()))
        .await
        .expect("headers");
    // CONTINUATION frames of 16 KiB without END_HEADERS, up to 64 MiB or until the gateway
    // closes the connection.
    let chunk = frame(CONTINUATION, 0, 1, &filler_block(16 * 1024 - 200));
    let started = Instant::now();
    let mut sent = 0usize;
    let (mut r, mut w) = sock.split();
    let drain = async {
        let mut buf = [0u8; 16384];
        while matches!(r.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    let flood = async {
        while sent < 64 << 20 && started.elapsed() < Duration::from_secs(10) {
            if w.write_all(&chunk).await.is_err() {
                return;
            }
            sent += chunk.len();
        }
        std::future::pending::<()>().await;
    };
    tokio::select! {
        () = drain => {}
        () = flood => {}
        () = tokio::time::sleep(Duration::from_secs(10)) => {}
    }
    eprintln!("CONTINUATION bytes written before the gateway closed: {sent}");
    assert!(sent < 64 << 20, "the gateway read a 64 MiB header block");
    assert_rss_bounded("after a CONTINUATION flood");
    honest_traffic(&h).await;
}

#[tokio::test]
async fn oversized_heads_are_refused() {
    let h = start(|s| s.with_max_header_bytes(16 * 1024)).await;
    // HTTP/1: 431.
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    let mut head = format!("GET / HTTP/1.1\r\nHost: {HOST}\r\n").into_bytes();
    for i in 0..400 {
        head.extend_from_slice(format!("x-big-{i}: {}\r\n", "a".repeat(100)).as_bytes());
    }
    head.extend_from_slice(b"\r\n");
    let _ = sock.write_all(&head).await;
    // 431, and the connection closed (a reset, if the gateway closes with the rest of the
    // head unread, is a close too).
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(PATIENCE, sock.read_to_end(&mut answer))
        .await
        .expect("the connection closed after the 431");
    let text = String::from_utf8_lossy(&answer);
    assert!(text.starts_with("HTTP/1.1 431"), "answer: {text:?}");

    // HTTP/2: a 48 KiB header list gets no answer from the backend; the stream is refused
    // or the connection closed, and the gateway goes on.
    let mut sock = TcpStream::connect(h.http).await.expect("connect");
    let mut out = h2_preface();
    let mut block = get_block();
    block.extend(filler_block(48 * 1024));
    let (first, rest) = block.split_at(8 * 1024);
    out.extend(frame(HEADERS, END_STREAM, 1, first));
    let pieces: Vec<&[u8]> = rest.chunks(8 * 1024).collect();
    for (i, piece) in pieces.iter().enumerate() {
        let flags = if i + 1 == pieces.len() {
            END_HEADERS
        } else {
            0
        };
        out.extend(frame(CONTINUATION, flags, 1, piece));
    }
    let _ = sock.write_all(&out).await;
    let mut frames = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let mut buf = [0u8; 16384];
        while let Ok(n) = sock.read(&mut buf).await {
            if n == 0 {
                break;
            }
            frames.extend_from_slice(&buf[..n]);
        }
    })
    .await;
    assert!(
        !frames.windows(5).any(|w| w == b"got 0"),
        "an oversized header list was forwarded"
    );
    assert_rss_bounded("after oversized heads");
    honest_traffic(&h).await;
}

#[tokio::test]
async fn slowloris_before_and_after_tls() {
    let h = start(|s| {
        s.with_header_read_timeout(Duration::from_secs(1))
            .with_sniff_timeout(Duration::from_secs(1))
    })
    .await;
    let head = b"GET / HTTP/1.1\r\nHost: shop.example.com\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    let mut attackers = tokio::task::JoinSet::new();
    for i in 0..200 {
        let h_http = h.http;
        let tls = if i % 2 == 1 {
            Some(tls_connect(&h, &[b"http/1.1"]).await)
        } else {
            None
        };
        attackers.spawn(async move {
            let every = Duration::from_millis(100);
            let within = Duration::from_secs(6);
            match tls {
                Some(tls) => closed_within(tls, head, every, within).await,
                None => {
                    let sock = TcpStream::connect(h_http).await.expect("connect");
                    closed_within(sock, head, every, within).await
                }
            }
        });
    }
    // While they trickle, honest clients are served.
    honest_traffic(&h).await;
    let mut closed = 0;
    while let Some(done) = attackers.join_next().await {
        if done.expect("attacker") {
            closed += 1;
        }
    }
    assert_eq!(closed, 200, "slowloris connections the gateway kept open");
    assert_rss_bounded("after slowloris");
    honest_traffic(&h).await;
}

#[tokio::test]
async fn peers_that_never_read() {
    let h = start(|s| {
        s.with_http2_keepalive(Some(Duration::from_millis(500)), Duration::from_millis(500))
    })
    .await;
    // HTTP/1: 50 pipelined requests for 4 MiB answers, never read.
    let mut h1 = TcpStream::connect(h.http).await.expect("connect");
    let mut pipelined = Vec::new();
    for _ in 0..50 {
        pipelined
            .extend_from_slice(format!("GET /big HTTP/1.1\r\nHost: {HOST}\r\n\r\n").as_bytes());
    }
    h1.write_all(&pipelined).await.expect("requests");
    // HTTP/2: 100 streams asking for 4 MiB answers, and no byte read.
    let mut h2 = TcpStream::connect(h.http).await.expect("connect");
    let mut out = h2_preface();
    for n in 0..100u32 {
        let mut block = get_block();
        // :path /big instead of / (literal with indexed name 4).
        block[2] = 0x04;
        block.insert(3, 4);
        block.splice(4..4, *b"/big");
        out.extend(frame(HEADERS, END_HEADERS | END_STREAM, 2 * n + 1, &block));
    }
    h2.write_all(&out).await.expect("requests");
    tokio::time::sleep(Duration::from_secs(1)).await;
    honest_traffic(&h).await;
    assert_rss_bounded("while peers do not read");
    // The HTTP/2 peer answers no PING: the keepalive closes its connection (reading is not
    // answering: the PINGs it reads go unanswered).
    let mut buf = vec![0u8; 1 << 20];
    let closed = tokio::time::timeout(PATIENCE, async {
        loop {
            match h2.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(
        closed.is_ok(),
        "the non-reading HTTP/2 peer is still connected"
    );
    honest_traffic(&h).await;
    drop(h1);
}
