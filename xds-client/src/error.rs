//! The crate's opaque error.

use std::error::Error as StdError;
use std::fmt;

type BoxError = Box<dyn StdError + Send + Sync>;

/// Why the client stopped. Opaque: ask with the `is_*` methods, read the chain with
/// [`source`](StdError::source). `Display` says what failed at this level only (for example
/// "cannot connect to the xDS server"); the cause (a tonic transport error, a gRPC status, the
/// last failure before giving up) is the source.
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
        // This level only: the cause is `source()`, so a printed chain says it once.
        f.write_str(match self.kind {
            Kind::Config => "invalid xDS client configuration",
            Kind::Connect => "cannot connect to the xDS server",
            Kind::Stream => "xDS stream failed",
            Kind::GaveUp => "no response from the xDS server in time",
        })
    }
}

impl StdError for Error {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn StdError + 'static))
    }
}

/// Shows an error with its chain of sources, `what: why: root cause`, for logs. A source whose
/// message its parent already ends with is left out (some dependencies print their cause).
pub(crate) struct Chain<'a>(pub(crate) &'a (dyn StdError + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let message = e.to_string();
            if !shown.ends_with(&message) {
                write!(f, ": {message}")?;
            }
            shown = message;
            next = e.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_this_level_only_and_the_cause_is_the_source() {
        let err = Error::gave_up(Error::stream("the server closed the stream"));
        assert_eq!(err.to_string(), "no response from the xDS server in time");
        let stream = err.source().expect("the last failure");
        assert_eq!(stream.to_string(), "xDS stream failed");
        let cause = stream.source().expect("why the stream failed");
        assert_eq!(cause.to_string(), "the server closed the stream");
        assert!(cause.source().is_none());
        assert_eq!(
            Chain(&err).to_string(),
            "no response from the xDS server in time: xDS stream failed: \
             the server closed the stream"
        );
    }
}
