//! Error chains for logs: every error type of this crate prints its own level only, so a log
//! line that should say everything walks `source()`.

use std::error::Error;
use std::fmt;

/// Displays an error and its sources, `outer: inner: innermost`.
pub(crate) struct Report<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for Report<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(err) = source {
            write!(f, ": {err}")?;
            source = err.source();
        }
        Ok(())
    }
}
