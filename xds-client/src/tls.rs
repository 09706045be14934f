//! TLS to the control plane (feature `tls`): a connector for tonic that dials TCP and runs a
//! rustls client handshake with the caller's configuration.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Dials `host:port` of the URI and wraps the socket in TLS.
#[derive(Clone)]
pub(crate) struct TlsConnector {
    config: Arc<rustls::ClientConfig>,
    server_name: Option<ServerName<'static>>,
}

impl TlsConnector {
    pub(crate) fn new(
        config: Arc<rustls::ClientConfig>,
        server_name: Option<ServerName<'static>>,
    ) -> Self {
        Self {
            config,
            server_name,
        }
    }
}

impl std::fmt::Debug for TlsConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsConnector")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

impl tower_service::Service<http::Uri> for TlsConnector {
    type Response = TokioIo<TlsStream<TcpStream>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let config = Arc::clone(&self.config);
        let name = self.server_name.clone();
        Box::pin(async move {
            let host = uri
                .host()
                .ok_or("the server URI has no host")?
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_owned();
            let port = uri.port_u16().unwrap_or(443);
            let name = match name {
                Some(n) => n,
                None => ServerName::try_from(host.clone())?,
            };
            let tcp = TcpStream::connect((host.as_str(), port)).await?;
            tcp.set_nodelay(true)?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(name, tcp)
                .await?;
            Ok(TokioIo::new(tls))
        })
    }
}
