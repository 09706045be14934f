//! The ADS service as a tonic server routes it: gRPC framing of the two streaming methods,
//! with each response encoded into a buffer of its own size.
//!
//! A stream's responses differ in size by orders of magnitude: the first push to a node proxy
//! holds the whole mesh, each later one a change. Encoded into one buffer kept for the
//! stream's life, every stream would hold the largest response it ever sent for as long as
//! it is open. Here a response's bytes live from its encoding until the transport has written
//! them, so what an idle stream holds follows what it subscribed to, not what it was sent.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{BufMut, Bytes, BytesMut};
use envoy_types::pb::envoy::service::discovery::v3::aggregated_discovery_service_server::AggregatedDiscoveryService;
use futures::future::BoxFuture;
use futures::{Stream, StreamExt};
use http::header::{CONTENT_TYPE, HeaderMap, HeaderValue};
use http_body::{Body as HttpBody, Frame};
use prost::Message;
use tonic::body::Body;
use tonic::codec::Streaming;
use tonic::server::NamedService;
use tonic::{Request, Response, Status};
use tonic_prost::ProstDecoder;

use crate::ads::AdsServer;

/// The service name tonic routes by.
const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
/// State of the World.
const SOTW: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// Delta.
const DELTA: &str =
    "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources";

/// The length-prefixed message header of gRPC: a compression flag and a 32-bit length.
const HEADER: usize = 5;

/// An [`AdsServer`] as a tonic service ([`AdsServer::into_service`]): add it to a
/// `tonic::transport::Server` or a `Routes`. Requests are taken uncompressed (a compressed
/// one is refused with `UNIMPLEMENTED`, as a server that offers no compression does), and
/// responses are sent uncompressed.
#[derive(Clone)]
pub struct AdsService {
    server: AdsServer,
    max_decoding: usize,
    max_encoding: usize,
}

impl std::fmt::Debug for AdsService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdsService")
            .field("server", &self.server)
            .field("max_decoding", &self.max_decoding)
            .field("max_encoding", &self.max_encoding)
            .finish()
    }
}

impl AdsService {
    pub(crate) fn new(server: AdsServer, max_decoding: usize, max_encoding: usize) -> Self {
        Self {
            server,
            max_decoding,
            max_encoding,
        }
    }
}

impl NamedService for AdsService {
    const NAME: &'static str = SERVICE;
}

impl<B> tower_service::Service<http::Request<B>> for AdsService
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Self::Response, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let Self {
            server,
            max_decoding,
            max_encoding,
        } = self.clone();
        Box::pin(async move {
            Ok(match request.uri().path() {
                SOTW => {
                    let call = |r| async move { server.stream_aggregated_resources(r).await };
                    respond(request, max_decoding, max_encoding, call).await
                }
                DELTA => {
                    let call = |r| async move { server.delta_aggregated_resources(r).await };
                    respond(request, max_decoding, max_encoding, call).await
                }
                _ => Status::unimplemented("").into_http(),
            })
        })
    }
}

/// Runs one streaming method: its requests decoded from `request`'s body, its responses
/// framed into the response's body, ending with the stream's status in the trailers.
async fn respond<B, Req, Resp, S, F>(
    request: http::Request<B>,
    max_decoding: usize,
    max_encoding: usize,
    call: impl FnOnce(Request<Streaming<Req>>) -> F,
) -> http::Response<Body>
where
    B: HttpBody<Data = Bytes> + Send + 'static,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>> + Send + 'static,
    Req: Message + Default + Send + 'static,
    Resp: Message + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + Unpin + 'static,
    F: Future<Output = Result<Response<S>, Status>>,
{
    if let Some(encoding) = request.headers().get("grpc-encoding")
        && encoding != "identity"
    {
        let encoding = String::from_utf8_lossy(encoding.as_bytes()).into_owned();
        return Status::unimplemented(format!(
            "requests compressed with {encoding:?} are not taken: send them uncompressed"
        ))
        .into_http();
    }
    let requests = request.map(|body| {
        let decoder = ProstDecoder::<Req>::new(Default::default());
        Streaming::new_request(decoder, body, None, Some(max_decoding))
    });
    match call(Request::from_http(requests)).await {
        Ok(response) => {
            let (metadata, responses, extensions) = response.into_parts();
            let mut http = http::Response::new(Body::new(Framed {
                responses,
                max: max_encoding,
                ended: false,
            }));
            *http.headers_mut() = metadata.into_headers();
            http.headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            *http.extensions_mut() = extensions;
            http
        }
        Err(status) => status.into_http(),
    }
}

/// A response stream as an HTTP body: a data frame per response, then the trailers.
struct Framed<S> {
    responses: S,
    max: usize,
    ended: bool,
}

impl<S, Resp> HttpBody for Framed<S>
where
    S: Stream<Item = Result<Resp, Status>> + Unpin,
    Resp: Message,
{
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        if self.ended {
            return Poll::Ready(None);
        }
        let status = match ready!(self.responses.poll_next_unpin(cx)) {
            Some(Ok(response)) => match frame(&response, self.max) {
                Ok(bytes) => return Poll::Ready(Some(Ok(Frame::data(bytes)))),
                Err(status) => status,
            },
            Some(Err(status)) => status,
            None => Status::ok(""),
        };
        self.ended = true;
        Poll::Ready(Some(Ok(Frame::trailers(trailers(&status)))))
    }

    fn is_end_stream(&self) -> bool {
        self.ended
    }
}

/// `message` as one length-prefixed gRPC message, in a buffer of exactly its size.
///
/// # Errors
///
/// `OUT_OF_RANGE` when it is longer than `max` (or than a gRPC length can say).
fn frame(message: &impl Message, max: usize) -> Result<Bytes, Status> {
    let len = message.encoded_len();
    let prefix = u32::try_from(len)
        .ok()
        .filter(|_| len <= max)
        .ok_or_else(|| {
            Status::out_of_range(format!(
                "a response of {len} bytes is over the limit of {max} bytes"
            ))
        })?;
    let mut buf = BytesMut::with_capacity(HEADER + len);
    buf.put_u8(0);
    buf.put_u32(prefix);
    message
        .encode(&mut buf)
        .map_err(|e| Status::internal(format!("encoding a response: {e}")))?;
    Ok(buf.freeze())
}

/// The trailers that end a stream with `status`.
fn trailers(status: &Status) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Err(unsayable) = status.add_header(&mut headers) {
        // A message that is no header value: the code alone.
        headers.clear();
        let code = Status::new(status.code(), "");
        if code.add_header(&mut headers).is_err() {
            tracing::error!(%unsayable, "a stream's status could not be put in its trailers");
        }
    }
    headers
}

#[cfg(test)]
mod tests {
    use super::*;
    use envoy_types::pb::envoy::service::discovery::v3::DiscoveryResponse;

    #[test]
    fn a_frame_is_the_length_prefixed_message_in_a_buffer_of_its_size() {
        let response = DiscoveryResponse {
            version_info: "v1".into(),
            type_url: "t".into(),
            ..Default::default()
        };
        let bytes = frame(&response, 1 << 20).expect("fits");
        let body = response.encode_to_vec();
        assert_eq!(bytes[0], 0, "uncompressed");
        assert_eq!(&bytes[1..HEADER], (body.len() as u32).to_be_bytes());
        assert_eq!(&bytes[HEADER..], body.as_slice());
        let status = frame(&response, body.len() - 1).expect_err("one byte over");
        assert_eq!(status.code(), tonic::Code::OutOfRange);
    }

    #[test]
    fn trailers_say_the_status_and_an_ok_end() {
        let ok = trailers(&Status::ok(""));
        assert_eq!(ok["grpc-status"], "0");
        let denied = trailers(&Status::permission_denied("not yours"));
        assert_eq!(denied["grpc-status"], "7");
        assert_eq!(denied["grpc-message"], "not%20yours");
    }
}
