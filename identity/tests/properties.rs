//! Property tests: the SPIFFE ID parser against an independent reference written from the
//! SPIFFE-ID standard, on valid IDs built from the grammar and on near misses made from them
//! by one to three mutations; printing and parsing are inverse on every valid ID; the parsers
//! of untrusted input never panic.

use std::sync::atomic::{AtomicUsize, Ordering};

use meshkit_identity::{
    MAX_ID_LEN, MAX_TRUST_DOMAIN_LEN, SpiffeId, SpiffeIdError, TrustBundle, TrustBundleSet,
    TrustDomain, parse_leaf,
};
use proptest::prelude::*;
use proptest::sample::Index;
use proptest::test_runner::{Config, TestRunner};

// === the reference ===

/// A rule of the SPIFFE-ID standard that a string breaks, as the reference sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Broken {
    Empty,
    /// Not `spiffe://` in lowercase at the start.
    Scheme,
    NoTrustDomain,
    /// The first character of the trust domain outside `a-z 0-9 . - _`, and its byte offset.
    TrustDomainChar(char, usize),
    TrustDomainLen(usize),
    /// The first character of the path outside `a-z A-Z 0-9 . - _` and `/`, and its byte offset
    /// in the path.
    PathChar(char, usize),
    /// `//` inside the path.
    EmptySegment,
    DotSegment,
    TrailingSlash,
    /// Longer than the 2,048 bytes meshkit accepts.
    Length(usize),
}

/// What the reference makes of a string: every rule it breaks (none: a valid ID), and the
/// trust domain and path when it starts with the scheme.
#[derive(Debug)]
struct Reference<'a> {
    broken: Vec<Broken>,
    parts: Option<(&'a str, &'a str)>,
}

fn trust_domain_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b)
}

fn path_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"._-".contains(&b)
}

/// The first character of `s` whose first byte fails `ok` (a non-ASCII character always
/// does), with its byte offset.
fn first_bad(s: &str, ok: impl Fn(u8) -> bool) -> Option<(char, usize)> {
    let offset = s.bytes().position(|b| !ok(b))?;
    Some((s[offset..].chars().next().expect("a character"), offset))
}

/// The rules a bare trust domain name breaks.
fn reference_trust_domain(td: &str) -> Vec<Broken> {
    let mut broken = Vec::new();
    if td.is_empty() {
        broken.push(Broken::NoTrustDomain);
    }
    if let Some((c, at)) = first_bad(td, trust_domain_byte) {
        broken.push(Broken::TrustDomainChar(c, at));
    }
    if td.len() > MAX_TRUST_DOMAIN_LEN {
        broken.push(Broken::TrustDomainLen(td.len()));
    }
    broken
}

fn reference(s: &str) -> Reference<'_> {
    let mut broken = Vec::new();
    if s.is_empty() {
        broken.push(Broken::Empty);
    }
    if s.len() > MAX_ID_LEN {
        broken.push(Broken::Length(s.len()));
    }
    let Some(rest) = s.as_bytes().starts_with(b"spiffe://").then(|| &s[9..]) else {
        if !s.is_empty() {
            broken.push(Broken::Scheme);
        }
        return Reference {
            broken,
            parts: None,
        };
    };
    // The authority ends at the first '/': everything after it is the path.
    let (td, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    broken.extend(reference_trust_domain(td));
    if !path.is_empty() {
        let segments: Vec<&str> = path[1..].split('/').collect();
        let last = segments.len() - 1;
        for (i, segment) in segments.iter().enumerate() {
            match *segment {
                "" if i == last => broken.push(Broken::TrailingSlash),
                "" => broken.push(Broken::EmptySegment),
                "." | ".." => broken.push(Broken::DotSegment),
                _ => {}
            }
        }
        if let Some((c, at)) = first_bad(path, |b| b == b'/' || path_byte(b)) {
            broken.push(Broken::PathChar(c, at));
        }
    }
    Reference {
        broken,
        parts: Some((td, path)),
    }
}

/// The reference's name for the rule the crate reports.
fn as_broken(err: &SpiffeIdError) -> Broken {
    match err {
        SpiffeIdError::Empty => Broken::Empty,
        SpiffeIdError::WrongScheme => Broken::Scheme,
        SpiffeIdError::MissingTrustDomain => Broken::NoTrustDomain,
        SpiffeIdError::BadTrustDomainChar { found, index } => {
            Broken::TrustDomainChar(*found, *index)
        }
        SpiffeIdError::TrustDomainTooLong { len } => Broken::TrustDomainLen(*len),
        SpiffeIdError::BadPathChar { found, index } => Broken::PathChar(*found, *index),
        SpiffeIdError::EmptySegment => Broken::EmptySegment,
        SpiffeIdError::DotSegment => Broken::DotSegment,
        SpiffeIdError::TrailingSlash => Broken::TrailingSlash,
        SpiffeIdError::TooLong { len } => Broken::Length(*len),
        other => panic!("an error the reference does not know: {other:?}"),
    }
}

/// The crate and the reference agree on `s`: both accept it, with the same trust domain and
/// path, or both reject it, the crate naming a rule that `s` does break. Returns whether it
/// was accepted.
fn agrees(s: &str) -> Result<bool, TestCaseError> {
    let expected = reference(s);
    match (SpiffeId::new(s), expected.parts) {
        (Ok(id), Some((td, path))) => {
            prop_assert!(
                expected.broken.is_empty(),
                "{s:?} accepted, but it breaks {:?}",
                expected.broken
            );
            prop_assert_eq!(id.as_str(), s);
            prop_assert_eq!(id.to_string(), s);
            prop_assert_eq!(id.trust_domain_str(), td);
            prop_assert_eq!(id.trust_domain(), TrustDomain::new(td).unwrap());
            prop_assert_eq!(id.path(), path);
            prop_assert_eq!(id.has_path(), !path.is_empty());
            prop_assert_eq!(s.parse::<SpiffeId>(), Ok(id.clone()));
            Ok(true)
        }
        (Ok(id), None) => Err(TestCaseError::fail(format!(
            "{s:?} accepted as {id:?} without the scheme"
        ))),
        (Err(err), _) => {
            prop_assert!(
                !expected.broken.is_empty(),
                "{s:?} rejected with {err:?}, but the reference accepts it"
            );
            let rule = as_broken(&err);
            prop_assert!(
                expected.broken.contains(&rule),
                "{s:?} rejected with {err:?}, a rule it does not break; it breaks {:?}",
                expected.broken
            );
            Ok(false)
        }
    }
}

/// `TrustDomain::new` and the reference agree on `td`.
fn trust_domain_agrees(td: &str) -> Result<(), TestCaseError> {
    let broken = reference_trust_domain(td);
    match TrustDomain::new(td) {
        Ok(parsed) => {
            prop_assert!(
                broken.is_empty(),
                "{td:?} accepted, but it breaks {broken:?}"
            );
            prop_assert_eq!(parsed.as_str(), td);
            prop_assert_eq!(parsed.id().to_string(), format!("spiffe://{td}"));
        }
        Err(err) => {
            let rule = as_broken(&err);
            prop_assert!(
                broken.contains(&rule),
                "{td:?} rejected with {err:?}; the reference says {broken:?}"
            );
        }
    }
    Ok(())
}

// === the generators ===

/// A valid trust domain: short ones, and ones around the 255-byte limit (half of them over).
fn trust_domain() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z0-9._-]{1,40}",
        1 => Just("cluster.local".to_owned()),
        1 => (250usize..=260, "[a-z0-9.-]{1,8}").prop_map(|(len, unit)| repeated(&unit, len)),
    ]
}

/// `unit` repeated to exactly `len` bytes (ASCII only): long names without generating each
/// character, which would make the test slow.
fn repeated(unit: &str, len: usize) -> String {
    unit.repeat(len / unit.len() + 1)[..len].to_owned()
}

fn segment() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9._-]{1,12}".prop_filter("not a dot segment", |s| s != "." && s != "..")
}

/// A valid path (possibly empty): a few segments, or one long enough to cross the 2,048-byte
/// limit of the whole ID now and then.
fn path() -> impl Strategy<Value = String> {
    prop_oneof![
        6 => proptest::collection::vec(segment(), 0..8)
            .prop_map(|segments| segments.iter().map(|s| format!("/{s}")).collect()),
        1 => (1990usize..=2040, segment()).prop_map(|(len, unit)| format!("/{}", repeated(&unit, len))),
    ]
}

fn valid_id() -> impl Strategy<Value = String> {
    (trust_domain(), path()).prop_map(|(td, path)| format!("spiffe://{td}{path}"))
}

/// Characters that break a rule somewhere, or are allowed only in some places.
const CHARS: &[char] = &[
    '%', '?', '#', ':', '@', ' ', '/', '.', '-', '_', 'A', 'Z', 'a', '0', '~', '+', '*', '\0', 'é',
    'ß', '\u{200b}', 'K',
];

/// One change that turns a valid ID into a near miss (or, now and then, another valid ID).
#[derive(Debug, Clone)]
enum Mutation {
    Insert(Index, char),
    Replace(Index, char),
    Delete(Index),
    Truncate(Index),
    /// Inserted inside the trust domain: uppercase, a port, userinfo, percent-encoding.
    InTrustDomain(Index, &'static str),
    /// Inserted where a segment starts (or at the end).
    AtSegment(Index, &'static str),
    Append(&'static str),
    /// Replaces `spiffe://`.
    Scheme(&'static str),
    /// Percent-encodes one character.
    PercentEncode(Index),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let chars = proptest::sample::select(CHARS);
    prop_oneof![
        (any::<Index>(), chars.clone()).prop_map(|(i, c)| Mutation::Insert(i, c)),
        (any::<Index>(), chars).prop_map(|(i, c)| Mutation::Replace(i, c)),
        any::<Index>().prop_map(Mutation::Delete),
        any::<Index>().prop_map(Mutation::Truncate),
        (
            any::<Index>(),
            proptest::sample::select(&["A", "E", ":8080", "user@", "%41", "é", "..", "_", "/"][..])
        )
            .prop_map(|(i, t)| Mutation::InTrustDomain(i, t)),
        (
            any::<Index>(),
            proptest::sample::select(
                &["/", "/.", "/..", "/%2e", "/a?b", "/.x", "/...", "/x#y"][..]
            )
        )
            .prop_map(|(i, t)| Mutation::AtSegment(i, t)),
        proptest::sample::select(&["/", "?q=1", "#frag", "/.", "/..", "//x", "%20", "/ok"][..])
            .prop_map(Mutation::Append),
        proptest::sample::select(
            &[
                "SPIFFE://",
                "Spiffe://",
                "spiffe:/",
                "spiffe:///",
                "https://",
                "",
                "spiffe//"
            ][..]
        )
        .prop_map(Mutation::Scheme),
        any::<Index>().prop_map(Mutation::PercentEncode),
    ]
}

/// Byte offsets of the trust domain in `s` (empty when there is no scheme).
fn trust_domain_range(s: &str) -> std::ops::Range<usize> {
    match s.strip_prefix("spiffe://") {
        Some(rest) => 9..9 + rest.find('/').unwrap_or(rest.len()),
        None => 0..0,
    }
}

fn char_boundaries(s: &str) -> Vec<usize> {
    s.char_indices()
        .map(|(i, _)| i)
        .chain(std::iter::once(s.len()))
        .collect()
}

fn apply(s: &mut String, m: &Mutation) {
    let bounds = char_boundaries(s);
    let chars = bounds.len() - 1;
    match m {
        Mutation::Insert(i, c) => s.insert(bounds[i.index(bounds.len())], *c),
        Mutation::Replace(i, c) if chars > 0 => {
            let k = i.index(chars);
            s.replace_range(bounds[k]..bounds[k + 1], c.encode_utf8(&mut [0; 4]));
        }
        Mutation::Delete(i) if chars > 0 => {
            let k = i.index(chars);
            s.replace_range(bounds[k]..bounds[k + 1], "");
        }
        Mutation::PercentEncode(i) if chars > 0 => {
            let k = i.index(chars);
            let c = s[bounds[k]..].chars().next().expect("a character");
            let encoded: String = c
                .encode_utf8(&mut [0; 4])
                .bytes()
                .map(|b| format!("%{b:02X}"))
                .collect();
            s.replace_range(bounds[k]..bounds[k + 1], &encoded);
        }
        Mutation::Replace(..) | Mutation::Delete(_) | Mutation::PercentEncode(_) => {}
        Mutation::Truncate(i) => s.truncate(bounds[i.index(bounds.len())]),
        Mutation::InTrustDomain(i, text) => {
            let td = trust_domain_range(s);
            let at = td.start + i.index(td.len() + 1);
            if s.is_char_boundary(at) {
                s.insert_str(at, text);
            }
        }
        Mutation::AtSegment(i, text) => {
            let starts: Vec<usize> = s
                .char_indices()
                .filter(|&(at, c)| c == '/' && at >= trust_domain_range(s).end)
                .map(|(at, _)| at)
                .chain(std::iter::once(s.len()))
                .collect();
            let at = starts[i.index(starts.len())];
            s.insert_str(at, text);
        }
        Mutation::Append(text) => s.push_str(text),
        Mutation::Scheme(text) => {
            if s.starts_with("spiffe://") {
                s.replace_range(..9, text);
            }
        }
    }
}

/// A valid ID, untouched about a third of the time, otherwise changed one to three times.
fn candidate() -> impl Strategy<Value = String> {
    let mutations = prop_oneof![
        1 => Just(Vec::new()),
        2 => proptest::collection::vec(mutation(), 1..=3),
    ];
    (valid_id(), mutations).prop_map(|(mut s, mutations)| {
        for m in &mutations {
            apply(&mut s, m);
        }
        s
    })
}

// === the properties ===

/// The main property, with a check that the generator does its job: a good share of the
/// candidates is accepted and a good share rejected, so both branches are compared.
#[test]
fn parser_agrees_with_the_reference_on_valid_and_near_valid_ids() {
    const CASES: u32 = 4000;
    let mut runner = TestRunner::new(Config {
        cases: CASES,
        failure_persistence: None,
        ..Config::default()
    });
    let (accepted, rejected) = (AtomicUsize::new(0), AtomicUsize::new(0));
    let outcome = runner.run(&candidate(), |s| {
        let counter = if agrees(&s)? { &accepted } else { &rejected };
        counter.fetch_add(1, Ordering::Relaxed);
        trust_domain_agrees(&s[trust_domain_range(&s)])
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
    let (accepted, rejected) = (accepted.into_inner(), rejected.into_inner());
    let share = CASES as usize / 5;
    assert!(
        accepted >= share && rejected >= share,
        "accepted {accepted}, rejected {rejected} of {CASES}: both should be at least {share}"
    );
}

/// The reference itself, on the standard's examples and on each rule alone: a wrong
/// reference would make the property above agree with a wrong parser.
#[test]
fn the_reference_knows_the_rules() {
    let broken = |s: &str| reference(s).broken;
    for valid in [
        "spiffe://example.org",
        "spiffe://example.org/ns/default/sa/web",
        "spiffe://a-b_c.9/Path.With-Mixed_Case/..x/.y",
        "spiffe://td/a",
    ] {
        assert_eq!(broken(valid), [], "{valid}");
    }
    use Broken::*;
    for (s, rule) in [
        ("", Empty),
        ("SPIFFE://example.org/a", Scheme),
        ("spiffe:/example.org/a", Scheme),
        ("spiffe:///a", NoTrustDomain),
        ("spiffe://Example.org", TrustDomainChar('E', 0)),
        ("spiffe://example.org:8080/a", TrustDomainChar(':', 11)),
        ("spiffe://user@example.org/a", TrustDomainChar('@', 4)),
        ("spiffe://ex%41mple.org", TrustDomainChar('%', 2)),
        ("spiffe://exämple.org", TrustDomainChar('ä', 2)),
        ("spiffe://example.org/a?q=1", PathChar('?', 2)),
        ("spiffe://example.org/a#f", PathChar('#', 2)),
        ("spiffe://example.org/a/b%20", PathChar('%', 4)),
        ("spiffe://example.org/a//b", EmptySegment),
        ("spiffe://example.org/./a", DotSegment),
        ("spiffe://example.org/a/..", DotSegment),
        ("spiffe://example.org/", TrailingSlash),
        ("spiffe://example.org/a/", TrailingSlash),
    ] {
        assert_eq!(broken(s), [rule], "{s}");
    }
    assert_eq!(
        broken("spiffe://example.org//"),
        [EmptySegment, TrailingSlash]
    );
    let td = "a".repeat(256);
    assert_eq!(broken(&format!("spiffe://{td}/x")), [TrustDomainLen(256)]);
    assert_eq!(broken(&format!("spiffe://{}/x", &td[1..])), []);
    let long = format!("spiffe://example.org/{}", "a".repeat(2028));
    assert_eq!(long.len(), 2049);
    assert_eq!(broken(&long), [Length(2049)]);
    assert_eq!(broken(&long[..2048]), []);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn display_then_parse_is_identity(td in "[a-z0-9._-]{1,40}", path in path()) {
        let text = format!("spiffe://{td}{path}");
        prop_assume!(text.len() <= MAX_ID_LEN);
        let id: SpiffeId = text.parse().unwrap();
        prop_assert_eq!(id.to_string(), text.clone());
        prop_assert_eq!(id.trust_domain_str(), td.as_str());
        prop_assert_eq!(id.path(), path.as_str());
        let again: SpiffeId = id.to_string().parse().unwrap();
        prop_assert_eq!(again, id);
    }

    /// Arbitrary text: almost always rejected, and always for a rule it breaks.
    #[test]
    fn any_text_is_judged_as_the_reference_judges_it(s in "\\PC{0,80}") {
        agrees(&s)?;
        trust_domain_agrees(&s)?;
    }

    #[test]
    fn near_miss_tails_are_judged_as_the_reference_judges_them(
        td in trust_domain(),
        tail in "[/a-zA-Z0-9.%?#:@_-]{0,30}",
    ) {
        agrees(&format!("spiffe://{td}{tail}"))?;
    }

    #[test]
    fn leaf_parser_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..600)) {
        let _ = parse_leaf(&bytes);
    }

    #[test]
    fn bundle_parsers_never_panic(s in "\\PC{0,200}") {
        let _ = TrustBundle::from_jwks(TrustDomain::new("a.test").unwrap(), &s);
        let _ = TrustBundle::from_pem(TrustDomain::new("a.test").unwrap(), &s);
        let _ = TrustBundleSet::from_jwks_map(&s);
    }
}

/// Mutating a real certificate byte by byte must never panic the leaf parser.
#[test]
fn leaf_parser_survives_corrupted_certificates() {
    let ca = meshkit_identity::test_util::TestCa::new(TrustDomain::new("a.test").unwrap());
    let svid = ca.issue("spiffe://a.test/ns/a/sa/b".parse().unwrap());
    let der = svid.leaf().to_vec();
    for i in 0..der.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = der.clone();
            bad[i] ^= flip;
            let _ = parse_leaf(&bad);
        }
        let _ = parse_leaf(&der[..i]);
    }
}
