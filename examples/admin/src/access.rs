//! Access logs: one line per connection or request at info level, on the `meshkit::access`
//! target, as plain `key=value` text (the default) or as one JSON object per line.

use std::fmt::Write;

/// The format of access-log lines. Clones are cheap; one per part.
///
/// ```
/// use meshkit_admin::{AccessLog, Field};
///
/// let log = AccessLog::text();
/// let line = log.line(&[
///     ("src", Field::Str("10.0.0.1:40000")),
///     ("bytes_sent", Field::Num(512)),
///     ("flags", Field::Str("-")),
/// ]);
/// assert_eq!(line, "src=10.0.0.1:40000 bytes_sent=512 flags=-");
/// assert_eq!(
///     AccessLog::json().line(&[("src", Field::Str("a\"b")), ("n", Field::Num(1))]),
///     r#"{"src":"a\"b","n":1}"#
/// );
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AccessLog {
    json: bool,
}

/// One value of an access-log line.
#[derive(Debug, Clone, Copy)]
pub enum Field<'a> {
    /// Text; quoted in the text format when it holds a space, a quote or `=`.
    Str(&'a str),
    /// A count (bytes, milliseconds, a status code).
    Num(u64),
}

impl AccessLog {
    /// `key=value` text.
    pub fn text() -> Self {
        Self { json: false }
    }

    /// One JSON object per line.
    pub fn json() -> Self {
        Self { json: true }
    }

    /// Whether lines are JSON.
    pub fn is_json(&self) -> bool {
        self.json
    }

    /// The line for `fields`, in order.
    pub fn line(&self, fields: &[(&str, Field<'_>)]) -> String {
        let mut out = String::with_capacity(32 * fields.len());
        if self.json {
            out.push('{');
            for (i, (key, value)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&serde_json::Value::from(*key).to_string());
                out.push(':');
                match value {
                    Field::Str(s) => out.push_str(&serde_json::Value::from(*s).to_string()),
                    Field::Num(n) => {
                        let _ = write!(out, "{n}");
                    }
                }
            }
            out.push('}');
        } else {
            for (i, (key, value)) in fields.iter().enumerate() {
                if i > 0 {
                    out.push(' ');
                }
                out.push_str(key);
                out.push('=');
                match value {
                    Field::Str(s) if s.is_empty() || s.contains([' ', '"', '=', '\n']) => {
                        let _ = write!(out, "{s:?}");
                    }
                    Field::Str(s) => out.push_str(s),
                    Field::Num(n) => {
                        let _ = write!(out, "{n}");
                    }
                }
            }
        }
        out
    }

    /// Logs the line for `fields` at info level on the `meshkit::access` target.
    pub fn log(&self, fields: &[(&str, Field<'_>)]) {
        if tracing::enabled!(target: "meshkit::access", tracing::Level::INFO) {
            let line = self.line(fields);
            tracing::info!(target: "meshkit::access", "{line}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_quotes_what_would_break_the_line() {
        let line = AccessLog::text().line(&[
            ("a", Field::Str("x y")),
            ("b", Field::Str("")),
            ("c", Field::Str("k=v")),
            ("d", Field::Num(7)),
        ]);
        assert_eq!(line, r#"a="x y" b="" c="k=v" d=7"#);
    }

    #[test]
    fn json_lines_parse_back() {
        let line = AccessLog::json().line(&[("a", Field::Str("x\ny\"")), ("d", Field::Num(7))]);
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v, serde_json::json!({"a": "x\ny\"", "d": 7}));
    }
}
