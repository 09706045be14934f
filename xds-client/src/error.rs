//! The crate's opaque error.

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why the client stopped. Opaque: ask with the `is_*` methods, read the chain with
/// [`source`](StdError::source).
pub struct Error {
    kind: Kind,
    source: Option<BoxError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Config,
    Connect,
    Stream,
    GaveUp,
}

// === impl Error ===

impl Error {
    pub(crate) fn config(source: impl Into<BoxError>) -> Self {
        Self {
            kind: Kind::Config,
            source: Some(source.into()),
        }
    }

    pub(crate) fn connect(source: impl Into<BoxError>) -> Self {
        Self {
            kind: Kind::Connect,
            source: Some(source.into()),
        }
    }

    pub(crate) fn stream(source: impl Into<BoxError>) -> Self {
        Self {
            kind: Kind::Stream,
            source: Some(source.into()),
        }
    }

    pub(crate) fn gave_up(last: Error) -> Self {
        Self {
            kind: Kind::GaveUp,
            source: Some(Box::new(last)),
        }
    }

    /// The configuration is unusable (for example the server URI does not parse).
    pub fn is_config(&self) -> bool {
        self.kind == Kind::Config
    }

    /// Connecting to the server failed (TCP, TLS or HTTP/2).
    pub fn is_connect(&self) -> bool {
        self.kind == Kind::Connect
    }

    /// An established stream failed (a gRPC status, a reset, a dead connection).
    pub fn is_stream(&self) -> bool {
        self.kind == Kind::Stream
    }

    /// No response arrived within the configured give-up time; the source is the last failure.
    pub fn is_timeout(&self) -> bool {
        self.kind == Kind::GaveUp
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Error")
            .field("kind", &self.kind)
            .field("source", &self.source)
            .finish()
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            Kind::Config => "invalid xDS client configuration",
            Kind::Connect => "cannot connect to the xDS server",
            Kind::Stream => "xDS stream failed",
            Kind::GaveUp => "no response from the xDS server in time",
        };
        match &self.source {
            Some(s) => write!(f, "{what}: {s}"),
            None => f.write_str(what),
        }
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}
