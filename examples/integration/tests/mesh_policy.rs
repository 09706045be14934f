//! An Istio AuthorizationPolicy through the whole demo mesh: the control plane translates
//! `shop-policy.yaml`, node-a's proxy enforces it on tunnels to the API, and an edit of the
//! manifest changes the decision for new connections and cuts an open one that the new policy
//! refuses.
//!
//! One test function: the demo binds fixed loopback workload addresses.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use meshkit_demo::{DemoMesh, MeshOptions, write_samples};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Bound on every wait for the mesh to reach a state: far above what any step needs.
const PATIENCE: Duration = Duration::from_secs(20);

const WEB_2: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 12);

/// A connection from `from` to `to` (a node proxy's outbound listener).
async fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4()?;
    socket.bind(SocketAddr::from((from, 0)))?;
    socket.connect(to).await
}

/// One keep-alive GET on `stream`: the body of the answer. An error when the connection is
/// reset or closed before a whole answer.
async fn get(stream: &mut TcpStream) -> std::io::Result<String> {
    stream
        .write_all(b"GET /policy HTTP/1.1\r\nHost: api.shop.svc.cluster.local\r\n\r\n")
        .await?;
    let mut buf = Vec::new();
    loop {
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        let Some((head, body)) = text.split_once("\r\n\r\n") else {
            continue;
        };
        let length = head
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .ok_or(std::io::ErrorKind::InvalidData)?;
        if body.len() >= length {
            return Ok(body[..length].to_owned());
        }
    }
}

/// Whether a new connection from web-2 to the API is answered, within [`PATIENCE`].
async fn web_reaches_api(outbound: SocketAddr) -> bool {
    let attempt = async {
        let mut stream = connect_from(WEB_2, outbound).await?;
        get(&mut stream).await
    };
    match tokio::time::timeout(PATIENCE, attempt).await {
        Ok(Ok(body)) => {
            assert!(body.contains("\"api-1\""), "{body}");
            true
        }
        Ok(Err(_)) => false,
        Err(_) => panic!("no answer and no refusal within {PATIENCE:?}"),
    }
}

/// Polls until `web_reaches_api` is `want`, for at most [`PATIENCE`].
async fn until_web_reaches_api(outbound: SocketAddr, want: bool, what: &str) {
    let started = Instant::now();
    while web_reaches_api(outbound).await != want {
        assert!(
            started.elapsed() < PATIENCE,
            "{what}: not after {PATIENCE:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_edit_changes_decisions_and_cuts_the_tunnels_it_refuses() {
    let dir = std::env::temp_dir().join(format!("meshkit-policy-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    write_samples(&dir).unwrap();
    let mesh = DemoMesh::start(dir.clone(), MeshOptions::default(), |_| {})
        .await
        .expect("demo mesh starts");
    let outbound = mesh
        .outbound_addr("node-b")
        .expect("node-b's outbound listener");

    // web is an allowed caller: a keep-alive connection answers, twice.
    let mut open = connect_from(WEB_2, outbound).await.unwrap();
    for _ in 0..2 {
        let body = tokio::time::timeout(PATIENCE, get(&mut open))
            .await
            .expect("bounded")
            .expect("web is allowed");
        assert!(body.contains("\"api-1\""), "{body}");
    }

    // The policy loses web: the open tunnel is cut, and new ones are refused.
    let policy = dir.join("shop-policy.yaml");
    let original = std::fs::read_to_string(&policy).unwrap();
    let edited = original.replace("        - cluster.local/ns/shop/sa/web\n", "");
    assert_ne!(edited, original, "the sample policy lists web");
    std::fs::write(&policy, &edited).unwrap();
    let edited_at = Instant::now();
    let mut rest = Vec::new();
    let cut = tokio::time::timeout(PATIENCE, open.read_to_end(&mut rest))
        .await
        .expect("the open tunnel is cut within PATIENCE");
    // A reset, never a clean end that could pass for a complete exchange.
    let err = cut.expect_err("the cut is a reset");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    eprintln!(
        "open tunnel cut {:?} after the manifest edit",
        edited_at.elapsed()
    );
    until_web_reaches_api(outbound, false, "web refused").await;

    // Restored: web is admitted again.
    std::fs::write(&policy, &original).unwrap();
    until_web_reaches_api(outbound, true, "web admitted again").await;

    drop(mesh);
    let _ = std::fs::remove_dir_all(&dir);
}
