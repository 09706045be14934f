//! A tiny HTTP echo application: answers every request with a JSON document naming itself and
//! describing the request. The demo's and the tests' workloads.

use std::collections::BTreeMap;
use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;

/// What the echo application answers, as JSON.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EchoReply {
    /// The name the application was started with.
    pub name: String,
    /// The request method.
    pub method: String,
    /// The request path and query.
    pub path: String,
    /// The HTTP version, as `HTTP/1.1`.
    pub version: String,
    /// The request headers (repeated headers joined with `, `).
    pub headers: BTreeMap<String, String>,
    /// The request body (lossy UTF-8, at most 64 KiB read).
    #[serde(default)]
    pub body: String,
}

/// The most of a request body the echo application reads.
const MAX_BODY: usize = 64 * 1024;

/// Serves the echo application on `listener` (HTTP/1.1 and HTTP/2 prior knowledge) until the
/// future is dropped.
pub async fn serve_echo(listener: TcpListener, name: String) {
    loop {
        let Ok((sock, _)) = listener.accept().await else {
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            continue;
        };
        let name = name.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| {
                let name = name.clone();
                async move { Ok::<_, Infallible>(echo(&name, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(sock), service)
                .await;
        });
    }
}

async fn echo(name: &str, req: Request<Incoming>) -> Response<Full<Bytes>> {
    let (parts, body) = req.into_parts();
    let body = Limited::new(body, MAX_BODY)
        .collect()
        .await
        .map(|b| String::from_utf8_lossy(&b.to_bytes()).into_owned())
        .unwrap_or_default();
    let req = Request::from_parts(parts, ());
    let mut headers: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in req.headers() {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        headers
            .entry(k.as_str().to_owned())
            .and_modify(|e| {
                e.push_str(", ");
                e.push_str(&v);
            })
            .or_insert(v);
    }
    let reply = EchoReply {
        name: name.to_owned(),
        method: req.method().to_string(),
        path: req
            .uri()
            .path_and_query()
            .map_or_else(|| "/".to_owned(), ToString::to_string),
        version: format!("{:?}", req.version()),
        headers,
        body,
    };
    let body = serde_json::to_vec(&reply).unwrap_or_default();
    let mut resp = Response::new(Full::new(Bytes::from(body)));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    resp
}
