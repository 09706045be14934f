//! Why a request ends its stream.

use std::fmt;

/// A request the server refuses; the stream it came on ends with the matching gRPC status
/// (`From<RequestError> for tonic::Status`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum RequestError {
    /// The request has no `type_url`. ADS carries every type on one stream, so each request
    /// must say which one it is about. Status `INVALID_ARGUMENT`.
    MissingTypeUrl,
    /// The request is for a type beyond
    /// [`ServerConfig::max_types_per_stream`](crate::ServerConfig::max_types_per_stream).
    /// Status `RESOURCE_EXHAUSTED`.
    TooManyTypes {
        /// The type URL refused.
        type_url: String,
        /// The limit.
        limit: usize,
    },
    /// The request would take the stream past
    /// [`ServerConfig::max_names_per_stream`](crate::ServerConfig::max_names_per_stream)
    /// resource names. Status `RESOURCE_EXHAUSTED`.
    TooManyNames {
        /// How many names the stream would have.
        names: usize,
        /// The limit.
        limit: usize,
    },
}

// === impl RequestError ===

impl fmt::Display for RequestError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::MissingTypeUrl => f.write_str("request without a type_url"),
            Self::TooManyTypes { type_url, limit } => {
                write!(
                    f,
                    "type {type_url} refused: at most {limit} types per stream"
                )
            }
            Self::TooManyNames { names, limit } => write!(
                f,
                "request refused: it would subscribe the stream to {names} resource names, at most {limit} per stream"
            ),
        }
    }
}

impl std::error::Error for RequestError {}

impl From<RequestError> for tonic::Status {
    fn from(e: RequestError) -> Self {
        let code = match e {
            RequestError::MissingTypeUrl => tonic::Code::InvalidArgument,
            RequestError::TooManyTypes { .. } | RequestError::TooManyNames { .. } => {
                tonic::Code::ResourceExhausted
            }
        };
        tonic::Status::new(code, e.to_string())
    }
}
