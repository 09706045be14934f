//! A strict reader of the OpenMetrics text format (what prometheus-client writes and
//! Prometheus scrapes), for tests that assert exact counters: every line must be a
//! `# HELP`, `# TYPE`, `# UNIT`, a sample of the family declared last, or the final `# EOF`;
//! names, labels, escapes, values and the sample suffixes of each type are checked, and a
//! family may appear only once. Anything else is an error naming the line.

use std::collections::{BTreeMap, HashSet};

/// One sample: its full name (with suffix), labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The sample's name, `family_total`, `family_bucket`, ...
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its value.
    pub value: f64,
}

/// A parsed exposition: the type of each family and every sample in order.
#[derive(Debug, Clone, Default)]
pub struct Exposition {
    /// Family name to its type (`counter`, `gauge`, `histogram`, `info`, `unknown`, ...).
    pub types: BTreeMap<String, String>,
    /// Every sample, in the order written.
    pub samples: Vec<Sample>,
}

impl Exposition {
    /// The value of the sample `name` whose labels include every pair of `labels`; `None`
    /// if there is none, panics if more than one matches.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let found: Vec<&Sample> = self
            .samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert!(
            found.len() <= 1,
            "{} samples of {name} match {labels:?}: {found:?}",
            found.len()
        );
        found.first().map(|s| s.value)
    }

    /// The sum of every sample `name` whose labels include `labels`.
    pub fn sum(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.samples
            .iter()
            .filter(|s| {
                s.name == name
                    && labels
                        .iter()
                        .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|s| s.value)
            .sum()
    }
}

/// Parses `text` strictly.
///
/// # Errors
///
/// The first line that breaks the format, with its number.
pub fn parse(text: &str) -> Result<Exposition, String> {
    let mut out = Exposition::default();
    let mut seen = HashSet::new();
    let mut current: Option<(String, String)> = None;
    let mut eof = false;
    for (n, line) in text.split_terminator('\n').enumerate() {
        let n = n + 1;
        let err = |why: &str| format!("line {n}: {why}: {line:?}");
        if eof {
            return Err(err("text after # EOF"));
        }
        if line == "# EOF" {
            eof = true;
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kind, name) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            let arg = parts.next();
            if !is_metric_name(name) {
                return Err(err("not a metric name"));
            }
            match kind {
                "TYPE" => {
                    let ty = arg.ok_or_else(|| err("TYPE without a type"))?;
                    if ![
                        "counter",
                        "gauge",
                        "histogram",
                        "gaugehistogram",
                        "stateset",
                        "info",
                        "summary",
                        "unknown",
                    ]
                    .contains(&ty)
                    {
                        return Err(err("unknown type"));
                    }
                    if !seen.insert(name.to_owned()) {
                        return Err(err("family declared twice"));
                    }
                    out.types.insert(name.to_owned(), ty.to_owned());
                    current = Some((name.to_owned(), ty.to_owned()));
                }
                "HELP" | "UNIT" => {
                    if current.as_ref().is_some_and(|(f, _)| f != name) || current.is_none() {
                        // HELP may come before TYPE for the same family.
                        if kind == "HELP" && !seen.contains(name) {
                            current = None;
                            continue;
                        }
                        return Err(err("metadata for a family other than the current one"));
                    }
                }
                _ => return Err(err("unknown comment")),
            }
            continue;
        }
        if line.starts_with('#') {
            return Err(err("a comment that is not HELP, TYPE, UNIT or EOF"));
        }
        let sample = sample(line).map_err(|why| err(&why))?;
        let Some((family, ty)) = &current else {
            return Err(err("a sample before its family's TYPE"));
        };
        let suffix = sample
            .name
            .strip_prefix(family.as_str())
            .ok_or_else(|| err("a sample of another family than the current one"))?;
        let allowed: &[&str] = match ty.as_str() {
            "counter" => &["_total", "_created"],
            "gauge" | "unknown" | "stateset" => &[""],
            "info" => &["_info"],
            "histogram" => &["_bucket", "_count", "_sum", "_created"],
            "gaugehistogram" => &["_bucket", "_gcount", "_gsum"],
            "summary" => &["", "_count", "_sum", "_created"],
            _ => &[],
        };
        if !allowed.contains(&suffix) {
            return Err(err("a sample suffix its family's type does not have"));
        }
        if suffix == "_bucket" && !sample.labels.contains_key("le") {
            return Err(err("a bucket without le"));
        }
        out.samples.push(sample);
    }
    if !eof {
        return Err("no # EOF at the end".to_owned());
    }
    Ok(out)
}

fn is_metric_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn is_label_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn sample(line: &str) -> Result<Sample, String> {
    let name_end = line
        .find(['{', ' '])
        .ok_or_else(|| "a sample without a value".to_owned())?;
    let name = &line[..name_end];
    if !is_metric_name(name) {
        return Err("not a metric name".into());
    }
    let mut rest = &line[name_end..];
    let mut labels = BTreeMap::new();
    if let Some(body) = rest.strip_prefix('{') {
        let mut chars = body.char_indices().peekable();
        let mut end = None;
        while let Some(&(start, c)) = chars.peek() {
            if c == '}' {
                end = Some(start + 1);
                break;
            }
            if c == ',' && !labels.is_empty() {
                chars.next();
                continue;
            }
            let eq = body[start..]
                .find('=')
                .ok_or_else(|| "a label without =".to_owned())?;
            let label = &body[start..start + eq];
            if !is_label_name(label) {
                return Err(format!("not a label name: {label:?}"));
            }
            while chars.peek().is_some_and(|&(i, _)| i <= start + eq) {
                chars.next();
            }
            if chars.next().map(|(_, c)| c) != Some('"') {
                return Err("a label value not in quotes".into());
            }
            let mut value = String::new();
            loop {
                match chars.next() {
                    Some((_, '"')) => break,
                    Some((_, '\\')) => match chars.next() {
                        Some((_, 'n')) => value.push('\n'),
                        Some((_, '"')) => value.push('"'),
                        Some((_, '\\')) => value.push('\\'),
                        _ => return Err("a bad escape in a label value".into()),
                    },
                    Some((_, '\n')) | None => return Err("an unterminated label value".into()),
                    Some((_, c)) => value.push(c),
                }
            }
            if labels.insert(label.to_owned(), value).is_some() {
                return Err(format!("label {label} twice"));
            }
        }
        let end = end.ok_or_else(|| "labels without }".to_owned())?;
        rest = &body[end..];
    }
    let rest = rest
        .strip_prefix(' ')
        .ok_or_else(|| "no space before the value".to_owned())?;
    let mut fields = rest.split(' ');
    let value = fields.next().unwrap_or("");
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        "NaN" => f64::NAN,
        v => v
            .parse::<f64>()
            .map_err(|_| format!("not a number: {v:?}"))?,
    };
    if let Some(ts) = fields.next() {
        ts.parse::<f64>()
            .map_err(|_| format!("not a timestamp: {ts:?}"))?;
    }
    if fields.next().is_some() {
        return Err("more than a value and a timestamp".into());
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_well_formed_exposition_is_read() {
        let text = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{code=\"200\",route=\"a \\\"b\\\"\"} 3\n# TYPE up gauge\nup 1\n# TYPE d histogram\nd_bucket{le=\"1.0\"} 1\nd_bucket{le=\"+Inf\"} 2\nd_sum 3.5\nd_count 2\n# EOF\n";
        let e = parse(text).unwrap();
        assert_eq!(e.value("a_requests_total", &[("code", "200")]), Some(3.0));
        assert_eq!(
            e.value("a_requests_total", &[("route", "a \"b\"")]),
            Some(3.0)
        );
        assert_eq!(e.value("up", &[]), Some(1.0));
        assert_eq!(e.sum("d_bucket", &[]), 3.0);
        assert_eq!(e.types["d"], "histogram");
    }

    #[test]
    fn every_kind_of_break_is_refused() {
        for bad in [
            "# TYPE a counter\na_total 1\n",                 // no EOF
            "# TYPE a counter\na 1\n# EOF\n",                // counter without _total
            "# TYPE a counter\nb_total 1\n# EOF\n",          // another family
            "a 1\n# EOF\n",                                  // no TYPE
            "# TYPE a gauge\na{x=1} 1\n# EOF\n",             // unquoted value
            "# TYPE a gauge\na{x=\"1\",x=\"2\"} 1\n# EOF\n", // label twice
            "# TYPE a gauge\na one\n# EOF\n",                // not a number
            "# TYPE a gauge\n# TYPE a gauge\n# EOF\n",       // family twice
            "# TYPE a gauge\na 1\n# EOF\nb 1\n",             // after EOF
            "# TYPE a histogram\na_bucket 1\n# EOF\n",       // bucket without le
            "# TYPE 1a gauge\n# EOF\n",                      // bad name
            "# TYPE a gauge\na{x=\"\\q\"} 1\n# EOF\n",       // bad escape
            "# TYPE a gauge\n# junk\n# EOF\n",               // unknown comment
        ] {
            assert!(parse(bad).is_err(), "accepted {bad:?}");
        }
    }
}
