//! One line for an error and its causes. meshkit's errors print their own level only in
//! `Display` and keep the cause in `source()`; a log line or a message for a person that
//! should say everything walks the chain with [`ErrorChain`].

use std::error::Error;
use std::fmt;

/// Displays an error and its sources on one line, `what failed: why: root cause`. A source
/// whose message its parent's already ends with is left out, for errors of other crates that
/// print their cause themselves.
///
/// ```
/// use meshkit_identity::ErrorChain;
///
/// let cause = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
/// let error = std::io::Error::new(std::io::ErrorKind::Other, cause);
/// assert_eq!(ErrorChain(&error).to_string(), "no such file");
/// ```
#[derive(Clone, Copy)]
pub struct ErrorChain<'a>(pub &'a (dyn Error + 'static));

impl fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(error) = next {
            let message = error.to_string();
            if !shown.ends_with(&message) {
                write!(f, ": {message}")?;
            }
            shown = message;
            next = error.source();
        }
        Ok(())
    }
}

impl fmt::Debug for ErrorChain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
