//! Generates `src/validate/generated.rs`, the schema checks of the five Envoy resource types,
//! from the protoc-gen-validate annotations in the `.proto` files that the `envoy-types` crate
//! ships, and fails when the checked-in copy differs.
//!
//! Refresh after an `envoy-types` upgrade or a change below:
//! `MESHKIT_REGENERATE=1 cargo test -p meshkit-xds-client --test validate_codegen`.
//!
//! The generator compiles the five roots' files with protox, reads each field's
//! `(validate.rules)` and each oneof's `(validate.required)` through prost-reflect, walks every
//! message reachable from the roots (not into `google.protobuf.Any` payloads), and writes one
//! function per message that checks its fields on the envoy-types prost struct. A rule kind it
//! does not implement stops it (see `UNSUPPORTED`), so an upgrade cannot silently drop a rule.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use envoy_types::pb::google::protobuf::Duration as PbDuration;
use envoy_types::pb::validate::{
    self as pgv, FieldRules, bytes_rules, field_rules::Type as RuleType, string_rules,
};
use protox::prost::Message as _;
use protox::prost_reflect::{
    Cardinality, DescriptorPool, ExtensionDescriptor, FieldDescriptor, Kind, MessageDescriptor,
    Value,
};

/// The resource types: the proto file that declares each, its full name, and the name of the
/// generated entry point.
const ROOTS: &[(&str, &str, &str)] = &[
    (
        "envoy/config/listener/v3/listener.proto",
        "envoy.config.listener.v3.Listener",
        "listener",
    ),
    (
        "envoy/config/route/v3/route.proto",
        "envoy.config.route.v3.RouteConfiguration",
        "route_configuration",
    ),
    (
        "envoy/config/cluster/v3/cluster.proto",
        "envoy.config.cluster.v3.Cluster",
        "cluster",
    ),
    (
        "envoy/config/endpoint/v3/endpoint.proto",
        "envoy.config.endpoint.v3.ClusterLoadAssignment",
        "cluster_load_assignment",
    ),
    (
        "envoy/extensions/transport_sockets/tls/v3/secret.proto",
        "envoy.extensions.transport_sockets.tls.v3.Secret",
        "secret",
    ),
];

/// Include folders under the envoy-types crate's `proto/`.
const INCLUDES: &[&str] = &[
    "data-plane-api",
    "xds",
    "protoc-gen-validate",
    "googleapis",
    "cel-spec/proto",
    "opentelemetry-proto",
    "client_model",
];

/// Rule kinds the generator does not implement; meeting one in the graph stops it.
const UNSUPPORTED: &[&str] = &[
    "string.pattern (other than the patterns in `PATTERNS`)",
    "string.well_known email, uri, uri_ref",
    "bytes.pattern, bytes.well_known",
    "map.no_sparse (prost cannot tell an unset map value from a default one)",
    "repeated.unique on float and double items",
    "timestamp.lt_now, timestamp.gt_now, timestamp.within (they depend on the clock)",
    "message options validate.disabled and validate.ignored",
];

/// `string.pattern` values the generator knows, each with the support function that decides it
/// (RE2 semantics, whole-string match as written).
const PATTERNS: &[(&str, &str)] = &[("^[^?#]+[^?#/]$", "s::path_separated_prefix")];

fn crate_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `proto/` folder of the envoy-types version in Cargo.lock, in the cargo registry.
fn envoy_types_proto_dir() -> PathBuf {
    let lock = std::fs::read_to_string(crate_dir().join("../Cargo.lock")).expect("Cargo.lock");
    let mut version = None;
    let mut lines = lock.lines();
    while let Some(l) = lines.next() {
        if l == "name = \"envoy-types\"" {
            let v = lines.next().expect("version line");
            version = v
                .strip_prefix("version = \"")
                .and_then(|v| v.strip_suffix('"'))
                .map(str::to_owned);
            break;
        }
    }
    let version = version.expect("envoy-types in Cargo.lock");
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .expect("CARGO_HOME or HOME");
    let registry = home.join("registry/src");
    for entry in std::fs::read_dir(&registry).expect("cargo registry") {
        let dir = entry
            .expect("registry entry")
            .path()
            .join(format!("envoy-types-{version}"))
            .join("proto");
        if dir.is_dir() {
            return dir;
        }
    }
    panic!(
        "envoy-types-{version} not found under {}",
        registry.display()
    );
}

// === generation ===

/// One check, counted by kind for the header.
struct Gen {
    rules: ExtensionDescriptor,
    required: ExtensionDescriptor,
    disabled: ExtensionDescriptor,
    ignored: ExtensionDescriptor,
    /// Messages that get a function, with the function's name.
    fns: BTreeMap<String, String>,
    /// Kinds used in each message's own checks.
    /// Kinds used in each message's own checks, each with the first field that uses it.
    kinds: BTreeMap<String, BTreeMap<&'static str, String>>,
    /// The field being written, for `kinds`.
    field: String,
    out: String,
    /// For the function being written: the next free local name.
    var: usize,
}

/// Where a value sits, for the violation's path: the Rust expression of the segment.
#[derive(Clone)]
struct Loc {
    seg: String,
}

impl Loc {
    fn field(name: &str) -> Self {
        Self {
            seg: format!("Seg::Field({name:?})"),
        }
    }
    fn index(name: &str, i: &str) -> Self {
        Self {
            seg: format!("Seg::Index({name:?}, {i})"),
        }
    }
    fn key(name: &str, k: &str) -> Self {
        Self {
            seg: format!("Seg::Key({name:?}, s::key({k}))"),
        }
    }
}

fn is_keyword(s: &str) -> bool {
    matches!(
        s,
        "as" | "break"
            | "const"
            | "continue"
            | "else"
            | "enum"
            | "false"
            | "fn"
            | "for"
            | "if"
            | "impl"
            | "in"
            | "let"
            | "loop"
            | "match"
            | "mod"
            | "move"
            | "mut"
            | "pub"
            | "ref"
            | "return"
            | "static"
            | "struct"
            | "trait"
            | "true"
            | "type"
            | "unsafe"
            | "use"
            | "where"
            | "while"
            | "dyn"
            | "abstract"
            | "become"
            | "box"
            | "do"
            | "final"
            | "macro"
            | "override"
            | "priv"
            | "typeof"
            | "unsized"
            | "virtual"
            | "yield"
            | "async"
            | "await"
            | "try"
            | "gen"
    )
}

/// prost-build's identifier rules: raw identifiers for keywords, a trailing `_` for the few
/// that cannot be raw.
fn sanitize(ident: String) -> String {
    if is_keyword(&ident) {
        format!("r#{ident}")
    } else if matches!(
        ident.as_str(),
        "_" | "super" | "self" | "Self" | "extern" | "crate"
    ) {
        format!("{ident}_")
    } else if ident.starts_with(|c: char| c.is_ascii_digit()) {
        format!("_{ident}")
    } else {
        ident
    }
}

/// The words of an identifier as prost-build (through heck) splits them: on non-alphanumerics,
/// after a lower-case letter (or a digit following one) that an upper-case letter follows, and
/// before the last capital of a run that a lower-case letter follows.
fn words(s: &str) -> Vec<String> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mode {
        Boundary,
        Lower,
        Upper,
    }
    let mut out = Vec::new();
    for part in s.split(|c: char| !c.is_alphanumeric()) {
        let chars: Vec<char> = part.chars().collect();
        let mut start = 0;
        let mut mode = Mode::Boundary;
        for (i, &c) in chars.iter().enumerate() {
            let Some(&next) = chars.get(i + 1) else {
                out.push(chars[start..].iter().collect());
                break;
            };
            let next_mode = if c.is_lowercase() {
                Mode::Lower
            } else if c.is_uppercase() {
                Mode::Upper
            } else {
                mode
            };
            if next_mode == Mode::Lower && next.is_uppercase() {
                out.push(chars[start..=i].iter().collect());
                start = i + 1;
                mode = Mode::Boundary;
            } else if mode == Mode::Upper && c.is_uppercase() && next.is_lowercase() {
                out.push(chars[start..i].iter().collect());
                start = i;
                mode = Mode::Boundary;
            } else {
                mode = next_mode;
            }
        }
    }
    out
}

fn snake(s: &str) -> String {
    sanitize(
        words(s)
            .iter()
            .map(|w| w.to_lowercase())
            .collect::<Vec<_>>()
            .join("_"),
    )
}

fn upper_camel(s: &str) -> String {
    sanitize(
        words(s)
            .iter()
            .map(|w| {
                let mut c = w.chars();
                match c.next() {
                    Some(f) => f
                        .to_uppercase()
                        .chain(c.flat_map(char::to_lowercase))
                        .collect(),
                    None => String::new(),
                }
            })
            .collect(),
    )
}

/// The Rust module path of a message's package and enclosing messages.
fn module_path(m: &MessageDescriptor) -> String {
    let mut path = String::from("pb");
    for p in m.package_name().split('.') {
        path.push_str("::");
        path.push_str(&snake(p));
    }
    let mut parents = Vec::new();
    let mut p = m.parent_message();
    while let Some(pm) = p {
        parents.push(snake(pm.name()));
        p = pm.parent_message();
    }
    for p in parents.iter().rev() {
        path.push_str("::");
        path.push_str(p);
    }
    path
}

fn rust_type(m: &MessageDescriptor) -> String {
    format!("{}::{}", module_path(m), upper_camel(m.name()))
}

fn fn_name(m: &MessageDescriptor) -> String {
    let mut name = String::from("m");
    for part in m.full_name().split('.') {
        name.push('_');
        name.push_str(snake(part).trim_start_matches("r#").trim_end_matches('_'));
    }
    name
}

fn is_wrapper(name: &str) -> bool {
    matches!(
        name,
        "google.protobuf.DoubleValue"
            | "google.protobuf.FloatValue"
            | "google.protobuf.Int64Value"
            | "google.protobuf.UInt64Value"
            | "google.protobuf.Int32Value"
            | "google.protobuf.UInt32Value"
            | "google.protobuf.BoolValue"
            | "google.protobuf.StringValue"
            | "google.protobuf.BytesValue"
    )
}

/// Message types checked inline where they are used, never with a function of their own.
fn is_leaf(name: &str) -> bool {
    is_wrapper(name)
        || matches!(
            name,
            "google.protobuf.Any"
                | "google.protobuf.Duration"
                | "google.protobuf.Timestamp"
                | "google.protobuf.Empty"
        )
}

fn lit_duration(d: &PbDuration) -> String {
    format!(
        "{}_i128",
        i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos)
    )
}

fn show_duration(d: &PbDuration) -> String {
    if d.nanos == 0 {
        format!("{}s", d.seconds)
    } else {
        format!("{}.{:09}s", d.seconds, d.nanos)
    }
}

/// Numeric rules in one shape: (const, lt, lte, gt, gte, in, not_in, ignore_empty), each bound
/// already a Rust literal with its display form.
struct Num {
    konst: Option<(String, String)>,
    lt: Option<(String, String)>,
    lte: Option<(String, String)>,
    gt: Option<(String, String)>,
    gte: Option<(String, String)>,
    r#in: Vec<(String, String)>,
    not_in: Vec<(String, String)>,
    ignore_empty: bool,
    /// For comparing bounds when both ends are given.
    order: Option<std::cmp::Ordering>,
}

macro_rules! num_rules {
    ($r:expr, $suffix:literal, $fmt:expr) => {{
        let r = $r;
        let f = $fmt;
        let lit = |v| (format!("{}{}", f(v), $suffix), format!("{}", v));
        let upper = r.lt.or(r.lte);
        let lower = r.gt.or(r.gte);
        Num {
            konst: r.r#const.map(lit),
            lt: r.lt.map(lit),
            lte: r.lte.map(lit),
            gt: r.gt.map(lit),
            gte: r.gte.map(lit),
            r#in: r.r#in.iter().copied().map(lit).collect(),
            not_in: r.not_in.iter().copied().map(lit).collect(),
            ignore_empty: r.ignore_empty(),
            order: match (upper, lower) {
                (Some(u), Some(l)) => u.partial_cmp(&l),
                _ => None,
            },
        }
    }};
}

fn int_lit<T: std::fmt::Display>(v: T) -> String {
    v.to_string()
}

fn float_lit<T: std::fmt::Debug>(v: T) -> String {
    format!("{v:?}")
}

impl Gen {
    fn new(pool: &DescriptorPool) -> Self {
        let ext = |n: &str| pool.get_extension_by_name(n).expect(n);
        Self {
            rules: ext("validate.rules"),
            required: ext("validate.required"),
            disabled: ext("validate.disabled"),
            ignored: ext("validate.ignored"),
            fns: BTreeMap::new(),
            kinds: BTreeMap::new(),
            field: String::new(),
            out: String::new(),
            var: 0,
        }
    }

    fn field_rules(&self, f: &FieldDescriptor) -> Option<FieldRules> {
        let opts = f.options();
        if !opts.has_extension(&self.rules) {
            return None;
        }
        let v = opts.get_extension(&self.rules);
        let Value::Message(dm) = v.as_ref() else {
            panic!("{}: validate.rules is not a message", f.full_name())
        };
        Some(FieldRules::decode(dm.encode_to_vec().as_slice()).expect("FieldRules"))
    }

    fn oneof_required(&self, o: &protox::prost_reflect::OneofDescriptor) -> bool {
        let opts = o.options();
        opts.has_extension(&self.required)
            && matches!(
                opts.get_extension(&self.required).as_ref(),
                Value::Bool(true)
            )
    }

    /// Whether a message has checks of its own (before following message fields).
    fn has_local_checks(&self, m: &MessageDescriptor) -> bool {
        let opts = m.options();
        for e in [&self.disabled, &self.ignored] {
            if opts.has_extension(e) {
                panic!(
                    "{}: message option {} is not supported",
                    m.full_name(),
                    e.full_name()
                );
            }
        }
        if m.oneofs().any(|o| self.oneof_required(&o)) {
            return true;
        }
        m.fields().any(|f| {
            self.field_rules(&f).is_some()
                || matches!(f.kind(), Kind::Enum(_))
                || matches!(&f.kind(), Kind::Message(mm) if mm.full_name() == "google.protobuf.Duration")
                || (f.is_map() && {
                    let Kind::Message(entry) = f.kind() else { unreachable!() };
                    let v = entry.map_entry_value_field();
                    matches!(v.kind(), Kind::Enum(_))
                        || matches!(&v.kind(), Kind::Message(mm) if mm.full_name() == "google.protobuf.Duration")
                })
        })
    }

    /// The reachable messages and, of them, those that need a function.
    fn plan(&mut self, roots: &[MessageDescriptor]) -> BTreeMap<String, MessageDescriptor> {
        let mut all = BTreeMap::new();
        let mut stack: Vec<MessageDescriptor> = roots.to_vec();
        while let Some(m) = stack.pop() {
            if all.contains_key(m.full_name()) || is_leaf(m.full_name()) {
                continue;
            }
            for f in m.fields() {
                if let Kind::Message(mm) = f.kind() {
                    if mm.is_map_entry() {
                        if let Kind::Message(v) = mm.map_entry_value_field().kind() {
                            stack.push(v);
                        }
                    } else {
                        stack.push(mm);
                    }
                }
            }
            all.insert(m.full_name().to_owned(), m);
        }
        let mut needs: BTreeSet<String> = all
            .values()
            .filter(|m| self.has_local_checks(m))
            .map(|m| m.full_name().to_owned())
            .collect();
        loop {
            let before = needs.len();
            for m in all.values() {
                if needs.contains(m.full_name()) {
                    continue;
                }
                let follows = m.fields().any(|f| match self.message_of(&f) {
                    Some(mm) => needs.contains(mm.full_name()) && !self.skipped(&f),
                    None => false,
                });
                if follows {
                    needs.insert(m.full_name().to_owned());
                }
            }
            if needs.len() == before {
                break;
            }
        }
        let mut names = HashMap::new();
        for n in &needs {
            let m = &all[n];
            let f = fn_name(m);
            if let Some(other) = names.insert(f.clone(), n.clone()) {
                panic!("{n} and {other} both map to {f}");
            }
            self.fns.insert(n.clone(), f);
        }
        all
    }

    /// The message a field holds (the value type for a map), if any and not a leaf.
    fn message_of(&self, f: &FieldDescriptor) -> Option<MessageDescriptor> {
        let Kind::Message(mm) = f.kind() else {
            return None;
        };
        let mm = if mm.is_map_entry() {
            match mm.map_entry_value_field().kind() {
                Kind::Message(v) => v,
                _ => return None,
            }
        } else {
            mm
        };
        (!is_leaf(mm.full_name())).then_some(mm)
    }

    fn skipped(&self, f: &FieldDescriptor) -> bool {
        let Some(r) = self.field_rules(f) else {
            return false;
        };
        let item = if f.is_list() {
            match &r.r#type {
                Some(RuleType::Repeated(rr)) => rr.items.as_deref().cloned(),
                _ => None,
            }
        } else if f.is_map() {
            match &r.r#type {
                Some(RuleType::Map(mr)) => mr.values.as_deref().cloned(),
                _ => None,
            }
        } else {
            Some(r)
        };
        item.and_then(|i| i.message).is_some_and(|m| m.skip())
    }

    fn fresh(&mut self, base: &str) -> String {
        self.var += 1;
        format!("{base}{}", self.var)
    }

    fn kind(&mut self, m: &MessageDescriptor, k: &'static str) {
        let field = self.field.clone();
        self.kinds
            .entry(m.full_name().to_owned())
            .or_default()
            .entry(k)
            .or_insert(field);
    }

    fn fail(loc: &Loc, rule: &str, message: &str) -> String {
        format!(
            "return Err(Violation::new({}, {rule:?}, {message:?}));\n",
            loc.seg
        )
    }

    fn fail_fmt(loc: &Loc, rule: &str, fmt_args: &str) -> String {
        format!(
            "return Err(Violation::new({}, {rule:?}, format!({fmt_args})));\n",
            loc.seg
        )
    }

    fn write_message(&mut self, m: &MessageDescriptor) {
        self.var = 0;
        let name = self.fns[m.full_name()].clone();
        let mut body = String::new();
        for o in m.oneofs() {
            if o.is_synthetic() {
                continue;
            }
            let field = snake(o.name());
            self.field = o.name().to_owned();
            if self.oneof_required(&o) {
                self.kind(m, "oneof.required");
                let _ = write!(
                    body,
                    "if m.{field}.is_none() {{\n{}}}\n",
                    Self::fail(
                        &Loc::field(o.name()),
                        "oneof.required",
                        "exactly one field of the oneof must be set"
                    )
                );
            }
            let enum_path = format!(
                "{}::{}::{}",
                module_path(m),
                snake(m.name()),
                upper_camel(o.name())
            );
            let mut arms = String::new();
            for f in o.fields() {
                self.field = f.name().to_owned();
                let checks = self.value_checks(
                    m,
                    &f,
                    self.field_rules(&f).as_ref(),
                    "v",
                    &Loc::field(f.name()),
                    false,
                );
                if !checks.is_empty() {
                    let _ = write!(
                        arms,
                        "Some({enum_path}::{}(v)) => {{\n{checks}}}\n",
                        upper_camel(f.name())
                    );
                }
            }
            if !arms.is_empty() {
                let _ = write!(body, "match &m.{field} {{\n{arms}_ => {{}}\n}}\n");
            }
        }
        for f in m.fields() {
            if f.containing_oneof().is_some_and(|o| !o.is_synthetic()) {
                continue;
            }
            self.field = f.name().to_owned();
            let rules = self.field_rules(&f);
            let access = format!("m.{}", snake(f.name()));
            let synthetic = f.containing_oneof().is_some_and(|o| o.is_synthetic());
            let checks = if f.is_map() {
                self.map_checks(m, &f, rules.as_ref(), &access)
            } else if f.is_list() {
                self.list_checks(m, &f, rules.as_ref(), &access)
            } else if synthetic {
                let inner =
                    self.value_checks(m, &f, rules.as_ref(), "v", &Loc::field(f.name()), false);
                if inner.is_empty() {
                    String::new()
                } else {
                    format!("if let Some(v) = &{access} {{\n{inner}}}\n")
                }
            } else {
                let inner =
                    self.value_checks(m, &f, rules.as_ref(), "v", &Loc::field(f.name()), true);
                if inner.is_empty() {
                    String::new()
                } else {
                    format!("{{\nlet v = &{access};\n{inner}}}\n")
                }
            };
            body.push_str(&checks);
        }
        let _ = write!(
            self.out,
            "/// `{}`\npub(super) fn {name}(m: &{}) -> R {{\n{body}Ok(())\n}}\n\n",
            m.full_name(),
            rust_type(m)
        );
    }

    /// Checks of a repeated field: the list rules, then each item.
    fn list_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        rules: Option<&FieldRules>,
        access: &str,
    ) -> String {
        let mut out = String::new();
        let loc = Loc::field(f.name());
        let mut items = None;
        if let Some(r) = rules {
            let Some(RuleType::Repeated(rr)) = &r.r#type else {
                panic!("{}: repeated field without repeated rules", f.full_name());
            };
            let mut list = String::new();
            if let Some(n) = rr.min_items.filter(|n| *n > 0) {
                self.kind(m, "repeated.min_items");
                let cond = if n == 1 {
                    format!("{access}.is_empty()")
                } else {
                    format!("{access}.len() < {n}")
                };
                let _ = write!(
                    list,
                    "if {cond} {{\n{}}}\n",
                    Self::fail(
                        &loc,
                        "repeated.min_items",
                        &format!("must have at least {n} items")
                    )
                );
            }
            if let Some(n) = rr.max_items {
                self.kind(m, "repeated.max_items");
                let _ = write!(
                    list,
                    "if {access}.len() > {n} {{\n{}}}\n",
                    Self::fail(
                        &loc,
                        "repeated.max_items",
                        &format!("must have at most {n} items")
                    )
                );
            }
            if rr.unique() {
                if matches!(f.kind(), Kind::Float | Kind::Double | Kind::Message(_)) {
                    panic!("{}: repeated.unique on this item type", f.full_name());
                }
                self.kind(m, "repeated.unique");
                let _ = write!(
                    list,
                    "if !s::unique(&{access}) {{\n{}}}\n",
                    Self::fail(&loc, "repeated.unique", "items must be unique")
                );
            }
            if rr.ignore_empty() && !list.is_empty() {
                self.kind(m, "repeated.ignore_empty");
                list = format!("if !{access}.is_empty() {{\n{list}}}\n");
            }
            out.push_str(&list);
            items = rr.items.as_deref().cloned();
            if items.is_some() {
                self.kind(m, "repeated.items");
            }
        }
        let i = self.fresh("i");
        let item_loc = Loc::index(f.name(), &i);
        let inner = self.value_checks(m, f, items.as_ref(), "v", &item_loc, false);
        if !inner.is_empty() {
            let _ = write!(
                out,
                "for ({i}, v) in {access}.iter().enumerate() {{\n{inner}}}\n"
            );
        }
        out
    }

    /// Checks of a map field: the map rules, then each key and value.
    fn map_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        rules: Option<&FieldRules>,
        access: &str,
    ) -> String {
        let Kind::Message(entry) = f.kind() else {
            unreachable!()
        };
        let key_field = entry.map_entry_key_field();
        let value_field = entry.map_entry_value_field();
        let mut out = String::new();
        let loc = Loc::field(f.name());
        let (mut keys, mut values) = (None, None);
        if let Some(r) = rules {
            let Some(RuleType::Map(mr)) = &r.r#type else {
                panic!("{}: map field without map rules", f.full_name());
            };
            let mut map = String::new();
            if let Some(n) = mr.min_pairs.filter(|n| *n > 0) {
                self.kind(m, "map.min_pairs");
                let cond = if n == 1 {
                    format!("{access}.is_empty()")
                } else {
                    format!("{access}.len() < {n}")
                };
                let _ = write!(
                    map,
                    "if {cond} {{\n{}}}\n",
                    Self::fail(
                        &loc,
                        "map.min_pairs",
                        &format!("must have at least {n} entries")
                    )
                );
            }
            if let Some(n) = mr.max_pairs {
                self.kind(m, "map.max_pairs");
                let _ = write!(
                    map,
                    "if {access}.len() > {n} {{\n{}}}\n",
                    Self::fail(
                        &loc,
                        "map.max_pairs",
                        &format!("must have at most {n} entries")
                    )
                );
            }
            if mr.no_sparse() {
                panic!("{}: map.no_sparse is not supported", f.full_name());
            }
            if mr.ignore_empty() && !map.is_empty() {
                self.kind(m, "map.ignore_empty");
                map = format!("if !{access}.is_empty() {{\n{map}}}\n");
            }
            out.push_str(&map);
            keys = mr.keys.as_deref().cloned();
            values = mr.values.as_deref().cloned();
            if keys.is_some() {
                self.kind(m, "map.keys");
            }
            if values.is_some() {
                self.kind(m, "map.values");
            }
        }
        let k = self.fresh("k");
        let entry_loc = Loc::key(f.name(), &k);
        let key_checks = if keys.is_some() {
            self.value_checks(m, &key_field, keys.as_ref(), &k, &entry_loc, false)
        } else {
            String::new()
        };
        let value_checks =
            self.value_checks(m, &value_field, values.as_ref(), "v", &entry_loc, false);
        if value_checks.is_empty() {
            if !key_checks.is_empty() {
                let _ = write!(out, "for {k} in {access}.keys() {{\n{key_checks}}}\n");
            }
        } else {
            let _ = write!(
                out,
                "for ({k}, v) in &{access} {{\n{key_checks}{value_checks}}}\n"
            );
        }
        out
    }

    /// Checks of one value (`v`, a reference) of field `f`'s element type: the rules given,
    /// then what every value of the type gets (defined enum values, Envoy's duration range, the
    /// checks of a message). `optional_message` is true where a message value is an `Option`.
    fn value_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        rules: Option<&FieldRules>,
        v: &str,
        loc: &Loc,
        optional_message: bool,
    ) -> String {
        let mut out = String::new();
        match f.kind() {
            Kind::Message(mm) => {
                let full = mm.full_name().to_owned();
                let (required, skip) = rules
                    .and_then(|r| r.message)
                    .map_or((false, false), |mr| (mr.required(), mr.skip()));
                let mut inner = String::new();
                if full == "google.protobuf.Duration" {
                    self.kind(m, "envoy.duration");
                    let _ = write!(
                        inner,
                        "if let Err(e) = s::duration_in_range({v}) {{\nreturn Err(Violation::new({}, \"envoy.duration\", e));\n}}\n",
                        loc.seg
                    );
                }
                let mut required_by_type: Option<&'static str> = None;
                if let Some(r) = rules.and_then(|r| r.r#type.as_ref()) {
                    match r {
                        RuleType::Duration(d) => {
                            assert_eq!(full, "google.protobuf.Duration", "{}", f.full_name());
                            required_by_type = d.required().then_some("duration.required");
                            inner.push_str(&self.duration_checks(m, d, v, loc));
                        }
                        RuleType::Any(a) => {
                            // Upstream also writes `any = {required: true}` on fields of other
                            // message types (ExtensionConfigSource.config_source): there it can
                            // only mean "required".
                            assert!(
                                full == "google.protobuf.Any"
                                    || (a.r#in.is_empty() && a.not_in.is_empty()),
                                "{}: any.in on a {full}",
                                f.full_name()
                            );
                            required_by_type = a.required().then_some("any.required");
                            inner.push_str(&self.any_checks(m, a, v, loc));
                        }
                        RuleType::Timestamp(t) => {
                            assert_eq!(full, "google.protobuf.Timestamp", "{}", f.full_name());
                            required_by_type = t.required().then_some("timestamp.required");
                            inner.push_str(&self.timestamp_checks(m, t, v, loc));
                        }
                        other => {
                            assert!(is_wrapper(&full), "{}: {other:?} on {full}", f.full_name());
                            let value_kind = mm.get_field_by_name("value").expect("value").kind();
                            let checks = self.scalar_checks(m, f, &value_kind, other, "w", loc);
                            if !checks.is_empty() {
                                let _ = write!(inner, "{{\nlet w = &{v}.value;\n{checks}}}\n");
                            }
                        }
                    }
                }
                if !skip && let Some(func) = self.fns.get(&full).cloned() {
                    let _ = writeln!(inner, "{func}({v}).map_err(|e| e.at({}))?;", loc.seg);
                }
                let required = required_by_type.or(required.then_some("message.required"));
                if optional_message {
                    if let Some(rule) = required {
                        self.kind(m, rule);
                        if inner.is_empty() {
                            let _ = write!(
                                out,
                                "if {v}.is_none() {{\n{}}}\n",
                                Self::fail(loc, rule, "is required")
                            );
                        } else {
                            let _ = write!(
                                out,
                                "let Some(v) = {v} else {{\n{}}};\n",
                                Self::fail(loc, rule, "is required")
                            );
                            out.push_str(&inner);
                        }
                    } else if !inner.is_empty() {
                        let _ = write!(out, "if let Some(v) = {v} {{\n{inner}}}\n");
                    }
                } else {
                    out.push_str(&inner);
                }
            }
            kind => {
                if let Some(r) = rules.and_then(|r| r.r#type.as_ref()) {
                    out.push_str(&self.scalar_checks(m, f, &kind, r, v, loc));
                }
                if let Kind::Enum(e) = &kind {
                    let explicit = matches!(
                        rules.and_then(|r| r.r#type.as_ref()),
                        Some(RuleType::Enum(er)) if er.defined_only()
                    );
                    let rule = if explicit {
                        "enum.defined_only"
                    } else {
                        "enum.defined"
                    };
                    self.kind(m, rule);
                    let mut numbers: Vec<i32> = e.values().map(|v| v.number()).collect();
                    numbers.sort_unstable();
                    numbers.dedup();
                    let _ = write!(
                        out,
                        "if !matches!(*{v}, {}) {{\n{}}}\n",
                        pattern_of(&numbers),
                        Self::fail_fmt(
                            loc,
                            rule,
                            &format!("\"{{}} is not a defined value of {}\", *{v}", e.full_name())
                        )
                    );
                }
            }
        }
        out
    }

    fn duration_checks(
        &mut self,
        m: &MessageDescriptor,
        d: &pgv::DurationRules,
        v: &str,
        loc: &Loc,
    ) -> String {
        let mut cond = Vec::new();
        let mut what = Vec::new();
        if let Some(c) = &d.r#const {
            self.kind(m, "duration.const");
            cond.push(format!("n == {}", lit_duration(c)));
            what.push(format!("equal to {}", show_duration(c)));
        }
        let lower = match (&d.gt, &d.gte) {
            (Some(b), _) => Some((b, ">", "duration.gt")),
            (None, Some(b)) => Some((b, ">=", "duration.gte")),
            _ => None,
        };
        let upper = match (&d.lt, &d.lte) {
            (Some(b), _) => Some((b, "<", "duration.lt")),
            (None, Some(b)) => Some((b, "<=", "duration.lte")),
            _ => None,
        };
        for (_, _, k) in lower.iter().chain(upper.iter()) {
            self.kind(m, k);
        }
        let bound = |(b, op, _): (&PbDuration, &str, &str)| {
            (
                format!("n {op} {}", lit_duration(b)),
                format!("{op} {}", show_duration(b)),
            )
        };
        match (lower, upper) {
            (Some(l), Some(u)) => {
                // protoc-gen-validate: a lower bound above the upper one means "outside".
                let join = if lit_nanos(u.0) > lit_nanos(l.0) {
                    ("&&", "and")
                } else {
                    ("||", "or")
                };
                let (lc, lw) = bound(l);
                let (uc, uw) = bound(u);
                cond.push(format!("({lc} {} {uc})", join.0));
                what.push(format!("{lw} {} {uw}", join.1));
            }
            (Some(b), None) | (None, Some(b)) => {
                let (c, w) = bound(b);
                cond.push(c);
                what.push(w);
            }
            (None, None) => {}
        }
        if !d.r#in.is_empty() {
            self.kind(m, "duration.in");
            let set: Vec<String> = d.r#in.iter().map(lit_duration).collect();
            cond.push(format!("[{}].contains(&n)", set.join(", ")));
            let shown: Vec<String> = d.r#in.iter().map(show_duration).collect();
            what.push(format!("one of [{}]", shown.join(", ")));
        }
        if !d.not_in.is_empty() {
            self.kind(m, "duration.not_in");
            let set: Vec<String> = d.not_in.iter().map(lit_duration).collect();
            cond.push(format!("![{}].contains(&n)", set.join(", ")));
            let shown: Vec<String> = d.not_in.iter().map(show_duration).collect();
            what.push(format!("none of [{}]", shown.join(", ")));
        }
        if cond.is_empty() {
            return String::new();
        }
        format!(
            "{{\nlet n = s::nanos({v});\nif !({}) {{\n{}}}\n}}\n",
            cond.join(" && "),
            Self::fail(
                loc,
                &duration_rule_name(d),
                &format!("must be {}", what.join(", "))
            )
        )
    }

    fn any_checks(
        &mut self,
        m: &MessageDescriptor,
        a: &pgv::AnyRules,
        v: &str,
        loc: &Loc,
    ) -> String {
        let mut out = String::new();
        if !a.r#in.is_empty() {
            self.kind(m, "any.in");
            let _ = write!(
                out,
                "if !matches!({v}.type_url.as_str(), {}) {{\n{}}}\n",
                a.r#in
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(" | "),
                Self::fail(
                    loc,
                    "any.in",
                    &format!("type_url must be one of {:?}", a.r#in)
                )
            );
        }
        if !a.not_in.is_empty() {
            self.kind(m, "any.not_in");
            let _ = write!(
                out,
                "if matches!({v}.type_url.as_str(), {}) {{\n{}}}\n",
                a.not_in
                    .iter()
                    .map(|s| format!("{s:?}"))
                    .collect::<Vec<_>>()
                    .join(" | "),
                Self::fail(
                    loc,
                    "any.not_in",
                    &format!("type_url must not be one of {:?}", a.not_in)
                )
            );
        }
        out
    }

    fn timestamp_checks(
        &mut self,
        m: &MessageDescriptor,
        t: &pgv::TimestampRules,
        _v: &str,
        _loc: &Loc,
    ) -> String {
        if t.lt_now.is_some() || t.gt_now.is_some() || t.within.is_some() {
            panic!(
                "{}: timestamp rules relative to now are not supported",
                m.full_name()
            );
        }
        if t.r#const.is_some()
            || t.lt.is_some()
            || t.lte.is_some()
            || t.gt.is_some()
            || t.gte.is_some()
        {
            panic!(
                "{}: timestamp bounds are not implemented (none occur today)",
                m.full_name()
            );
        }
        String::new()
    }

    /// Rules on a scalar (or a wrapper's `value`): `v` is a reference to it.
    fn scalar_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        kind: &Kind,
        r: &RuleType,
        v: &str,
        loc: &Loc,
    ) -> String {
        match (r, kind) {
            (RuleType::String(sr), Kind::String) => self.string_checks(m, f, sr, v, loc),
            (RuleType::Bytes(br), Kind::Bytes) => self.bytes_checks(m, f, br, v, loc),
            (RuleType::Bool(b), Kind::Bool) => {
                let mut out = String::new();
                if let Some(c) = b.r#const {
                    self.kind(m, "bool.const");
                    let cond = if c { format!("!*{v}") } else { format!("*{v}") };
                    let _ = write!(
                        out,
                        "if {cond} {{\n{}}}\n",
                        Self::fail(loc, "bool.const", &format!("must be {c}"))
                    );
                }
                out
            }
            (RuleType::Enum(er), Kind::Enum(_)) => {
                let mut out = String::new();
                if let Some(c) = er.r#const {
                    self.kind(m, "enum.const");
                    let _ = write!(
                        out,
                        "if *{v} != {c} {{\n{}}}\n",
                        Self::fail(loc, "enum.const", &format!("must be {c}"))
                    );
                }
                if !er.r#in.is_empty() {
                    self.kind(m, "enum.in");
                    let _ = write!(
                        out,
                        "if !matches!(*{v}, {}) {{\n{}}}\n",
                        pattern_of(&er.r#in),
                        Self::fail(loc, "enum.in", &format!("must be one of {:?}", er.r#in))
                    );
                }
                if !er.not_in.is_empty() {
                    self.kind(m, "enum.not_in");
                    let _ = write!(
                        out,
                        "if matches!(*{v}, {}) {{\n{}}}\n",
                        pattern_of(&er.not_in),
                        Self::fail(
                            loc,
                            "enum.not_in",
                            &format!("must not be one of {:?}", er.not_in)
                        )
                    );
                }
                out
            }
            (RuleType::Float(x), Kind::Float) => {
                self.num_checks(m, "float", num_rules!(x, "_f32", float_lit), v, loc)
            }
            (RuleType::Double(x), Kind::Double) => {
                self.num_checks(m, "double", num_rules!(x, "_f64", float_lit), v, loc)
            }
            (RuleType::Int32(x), Kind::Int32) => {
                self.num_checks(m, "int32", num_rules!(x, "_i32", int_lit), v, loc)
            }
            (RuleType::Int64(x), Kind::Int64) => {
                self.num_checks(m, "int64", num_rules!(x, "_i64", int_lit), v, loc)
            }
            (RuleType::Uint32(x), Kind::Uint32) => {
                self.num_checks(m, "uint32", num_rules!(x, "_u32", int_lit), v, loc)
            }
            (RuleType::Uint64(x), Kind::Uint64) => {
                self.num_checks(m, "uint64", num_rules!(x, "_u64", int_lit), v, loc)
            }
            (RuleType::Sint32(x), Kind::Sint32) => {
                self.num_checks(m, "sint32", num_rules!(x, "_i32", int_lit), v, loc)
            }
            (RuleType::Sint64(x), Kind::Sint64) => {
                self.num_checks(m, "sint64", num_rules!(x, "_i64", int_lit), v, loc)
            }
            (RuleType::Fixed32(x), Kind::Fixed32) => {
                self.num_checks(m, "fixed32", num_rules!(x, "_u32", int_lit), v, loc)
            }
            (RuleType::Fixed64(x), Kind::Fixed64) => {
                self.num_checks(m, "fixed64", num_rules!(x, "_u64", int_lit), v, loc)
            }
            (RuleType::Sfixed32(x), Kind::Sfixed32) => {
                self.num_checks(m, "sfixed32", num_rules!(x, "_i32", int_lit), v, loc)
            }
            (RuleType::Sfixed64(x), Kind::Sfixed64) => {
                self.num_checks(m, "sfixed64", num_rules!(x, "_i64", int_lit), v, loc)
            }
            (r, k) => panic!("{}: rules {r:?} do not fit a {k:?} field", f.full_name()),
        }
    }

    fn num_checks(
        &mut self,
        m: &MessageDescriptor,
        ty: &'static str,
        n: Num,
        v: &str,
        loc: &Loc,
    ) -> String {
        let mut out = String::new();
        let kind = |this: &mut Self, rule: &str| {
            let leaked: &'static str = Box::leak(format!("{ty}.{rule}").into_boxed_str());
            this.kind(m, leaked);
            leaked
        };
        if let Some((c, shown)) = &n.konst {
            let rule = kind(self, "const");
            let _ = write!(
                out,
                "if *{v} != {c} {{\n{}}}\n",
                Self::fail(loc, rule, &format!("must be {shown}"))
            );
        }
        // `gte: 0` on an unsigned type holds for every value.
        let vacuous = matches!(ty, "uint32" | "uint64" | "fixed32" | "fixed64")
            && n.gte.as_ref().is_some_and(|(_, shown)| shown == "0");
        let gte = if vacuous { None } else { n.gte.as_ref() };
        let lower =
            n.gt.as_ref()
                .map(|b| (b, ">", "gt"))
                .or(gte.map(|b| (b, ">=", "gte")));
        let upper =
            n.lt.as_ref()
                .map(|b| (b, "<", "lt"))
                .or(n.lte.as_ref().map(|b| (b, "<=", "lte")));
        match (lower, upper) {
            (Some((l, lop, lname)), Some((u, uop, uname))) => {
                let lr = kind(self, lname);
                let ur = kind(self, uname);
                let normal = n.order == Some(std::cmp::Ordering::Greater);
                let (cond, what) = if normal {
                    (
                        format!("*{v} {lop} {} && *{v} {uop} {}", l.0, u.0),
                        format!("{lop} {} and {uop} {}", l.1, u.1),
                    )
                } else {
                    (
                        format!("*{v} {lop} {} || *{v} {uop} {}", l.0, u.0),
                        format!("{lop} {} or {uop} {}", l.1, u.1),
                    )
                };
                let rule = Box::leak(
                    format!("{lr}+{}", ur.rsplit('.').next().unwrap_or(ur)).into_boxed_str(),
                );
                let _ = write!(
                    out,
                    "if !({cond}) {{\n{}}}\n",
                    Self::fail(loc, rule, &format!("must be {what}"))
                );
            }
            (Some((b, op, name)), None) | (None, Some((b, op, name))) => {
                let rule = kind(self, name);
                let _ = write!(
                    out,
                    "if !(*{v} {op} {}) {{\n{}}}\n",
                    b.0,
                    Self::fail(loc, rule, &format!("must be {op} {}", b.1))
                );
            }
            (None, None) => {}
        }
        if !n.r#in.is_empty() {
            let rule = kind(self, "in");
            let set: Vec<&str> = n.r#in.iter().map(|x| x.0.as_str()).collect();
            let shown: Vec<&str> = n.r#in.iter().map(|x| x.1.as_str()).collect();
            let _ = write!(
                out,
                "if ![{}].contains({v}) {{\n{}}}\n",
                set.join(", "),
                Self::fail(loc, rule, &format!("must be one of [{}]", shown.join(", ")))
            );
        }
        if !n.not_in.is_empty() {
            let rule = kind(self, "not_in");
            let set: Vec<&str> = n.not_in.iter().map(|x| x.0.as_str()).collect();
            let shown: Vec<&str> = n.not_in.iter().map(|x| x.1.as_str()).collect();
            let _ = write!(
                out,
                "if [{}].contains({v}) {{\n{}}}\n",
                set.join(", "),
                Self::fail(
                    loc,
                    rule,
                    &format!("must not be one of [{}]", shown.join(", "))
                )
            );
        }
        if n.ignore_empty && !out.is_empty() {
            kind(self, "ignore_empty");
            out = format!("if *{v} != Default::default() {{\n{out}}}\n");
        }
        out
    }

    fn string_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        sr: &pgv::StringRules,
        v: &str,
        loc: &Loc,
    ) -> String {
        use string_rules::WellKnown;
        let mut out = String::new();
        let mut add = |this: &mut Self, rule: &'static str, cond: String, msg: String| {
            this.kind(m, rule);
            let _ = write!(out, "if {cond} {{\n{}}}\n", Self::fail(loc, rule, &msg));
        };
        if let Some(c) = &sr.r#const {
            add(
                self,
                "string.const",
                format!("{v} != {c:?}"),
                format!("must be {c:?}"),
            );
        }
        if let Some(n) = sr.len {
            add(
                self,
                "string.len",
                format!("s::chars({v}) != {n}"),
                format!("must be {n} characters long"),
            );
        }
        if let Some(n) = sr.min_len.filter(|n| *n > 0) {
            let cond = if n == 1 {
                format!("{v}.is_empty()")
            } else {
                format!("s::chars({v}) < {n}")
            };
            add(
                self,
                "string.min_len",
                cond,
                format!("must be at least {n} characters long"),
            );
        }
        if let Some(n) = sr.max_len {
            add(
                self,
                "string.max_len",
                format!("{v}.len() > {n} && s::chars({v}) > {n}"),
                format!("must be at most {n} characters long"),
            );
        }
        if let Some(n) = sr.len_bytes {
            add(
                self,
                "string.len_bytes",
                format!("{v}.len() != {n}"),
                format!("must be {n} bytes long"),
            );
        }
        if let Some(n) = sr.min_bytes.filter(|n| *n > 0) {
            let cond = if n == 1 {
                format!("{v}.is_empty()")
            } else {
                format!("{v}.len() < {n}")
            };
            add(
                self,
                "string.min_bytes",
                cond,
                format!("must be at least {n} bytes long"),
            );
        }
        if let Some(n) = sr.max_bytes {
            add(
                self,
                "string.max_bytes",
                format!("{v}.len() > {n}"),
                format!("must be at most {n} bytes long"),
            );
        }
        if let Some(p) = &sr.pattern {
            let Some((_, func)) = PATTERNS.iter().find(|(pat, _)| pat == p) else {
                panic!("{}: string.pattern {p:?} is not in PATTERNS", f.full_name());
            };
            add(
                self,
                "string.pattern",
                format!("!{func}({v})"),
                format!("must match the pattern {p:?}"),
            );
        }
        if let Some(p) = &sr.prefix {
            add(
                self,
                "string.prefix",
                format!("!{v}.starts_with({p:?})"),
                format!("must start with {p:?}"),
            );
        }
        if let Some(p) = &sr.suffix {
            add(
                self,
                "string.suffix",
                format!("!{v}.ends_with({p:?})"),
                format!("must end with {p:?}"),
            );
        }
        if let Some(p) = &sr.contains {
            add(
                self,
                "string.contains",
                format!("!{v}.contains({p:?})"),
                format!("must contain {p:?}"),
            );
        }
        if let Some(p) = &sr.not_contains {
            add(
                self,
                "string.not_contains",
                format!("{v}.contains({p:?})"),
                format!("must not contain {p:?}"),
            );
        }
        if !sr.r#in.is_empty() {
            let alts = sr
                .r#in
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" | ");
            add(
                self,
                "string.in",
                format!("!matches!({v}.as_str(), {alts})"),
                format!("must be one of {:?}", sr.r#in),
            );
        }
        if !sr.not_in.is_empty() {
            let alts = sr
                .not_in
                .iter()
                .map(|s| format!("{s:?}"))
                .collect::<Vec<_>>()
                .join(" | ");
            add(
                self,
                "string.not_in",
                format!("matches!({v}.as_str(), {alts})"),
                format!("must not be one of {:?}", sr.not_in),
            );
        }
        match &sr.well_known {
            None => {}
            Some(WellKnown::Hostname(true)) => add(
                self,
                "string.hostname",
                format!("!s::hostname({v})"),
                "must be a valid hostname".into(),
            ),
            Some(WellKnown::Ip(true)) => add(
                self,
                "string.ip",
                format!("!s::ip({v})"),
                "must be a valid IP address".into(),
            ),
            Some(WellKnown::Ipv4(true)) => add(
                self,
                "string.ipv4",
                format!("!s::ipv4({v})"),
                "must be a valid IPv4 address".into(),
            ),
            Some(WellKnown::Ipv6(true)) => add(
                self,
                "string.ipv6",
                format!("!s::ipv6({v})"),
                "must be a valid IPv6 address".into(),
            ),
            Some(WellKnown::Address(true)) => add(
                self,
                "string.address",
                format!("!s::address({v})"),
                "must be a valid hostname or IP address".into(),
            ),
            Some(WellKnown::Uuid(true)) => add(
                self,
                "string.uuid",
                format!("!s::uuid({v})"),
                "must be a valid UUID".into(),
            ),
            Some(WellKnown::WellKnownRegex(r)) => {
                let strict = sr.strict();
                match pgv::KnownRegex::try_from(*r) {
                    Ok(pgv::KnownRegex::HttpHeaderName) => add(
                        self,
                        "string.well_known_regex",
                        format!("!s::header_name({v}, {strict})"),
                        format!(
                            "must be a valid HTTP header name{}",
                            if strict { "" } else { " (loose)" }
                        ),
                    ),
                    Ok(pgv::KnownRegex::HttpHeaderValue) => add(
                        self,
                        "string.well_known_regex",
                        format!("!s::header_value({v}, {strict})"),
                        format!(
                            "must be a valid HTTP header value{}",
                            if strict { "" } else { " (loose)" }
                        ),
                    ),
                    other => panic!("{}: well_known_regex {other:?}", f.full_name()),
                }
            }
            Some(w @ (WellKnown::Email(true) | WellKnown::Uri(true) | WellKnown::UriRef(true))) => {
                panic!(
                    "{}: string.well_known {w:?} is not supported",
                    f.full_name()
                )
            }
            Some(_) => {}
        }
        if sr.ignore_empty() && !out.is_empty() {
            self.kind(m, "string.ignore_empty");
            out = format!("if !{v}.is_empty() {{\n{out}}}\n");
        }
        out
    }

    fn bytes_checks(
        &mut self,
        m: &MessageDescriptor,
        f: &FieldDescriptor,
        br: &pgv::BytesRules,
        v: &str,
        loc: &Loc,
    ) -> String {
        let mut out = String::new();
        let mut add = |this: &mut Self, rule: &'static str, cond: String, msg: String| {
            this.kind(m, rule);
            let _ = write!(out, "if {cond} {{\n{}}}\n", Self::fail(loc, rule, &msg));
        };
        if let Some(c) = &br.r#const {
            add(
                self,
                "bytes.const",
                format!("{v}.as_slice() != &{c:?}[..]"),
                format!("must be {c:?}"),
            );
        }
        if let Some(n) = br.len {
            add(
                self,
                "bytes.len",
                format!("{v}.len() != {n}"),
                format!("must be {n} bytes long"),
            );
        }
        if let Some(n) = br.min_len.filter(|n| *n > 0) {
            let cond = if n == 1 {
                format!("{v}.is_empty()")
            } else {
                format!("{v}.len() < {n}")
            };
            add(
                self,
                "bytes.min_len",
                cond,
                format!("must be at least {n} bytes long"),
            );
        }
        if let Some(n) = br.max_len {
            add(
                self,
                "bytes.max_len",
                format!("{v}.len() > {n}"),
                format!("must be at most {n} bytes long"),
            );
        }
        if let Some(p) = &br.prefix {
            add(
                self,
                "bytes.prefix",
                format!("!{v}.starts_with(&{p:?})"),
                format!("must start with {p:?}"),
            );
        }
        if let Some(p) = &br.suffix {
            add(
                self,
                "bytes.suffix",
                format!("!{v}.ends_with(&{p:?})"),
                format!("must end with {p:?}"),
            );
        }
        if br.pattern.is_some()
            || br.contains.is_some()
            || !br.r#in.is_empty()
            || !br.not_in.is_empty()
        {
            panic!(
                "{}: bytes pattern, contains, in and not_in are not implemented (none occur today)",
                f.full_name()
            );
        }
        if let Some(w) = &br.well_known
            && !matches!(
                w,
                bytes_rules::WellKnown::Ip(false)
                    | bytes_rules::WellKnown::Ipv4(false)
                    | bytes_rules::WellKnown::Ipv6(false)
            )
        {
            panic!("{}: bytes.well_known {w:?} is not supported", f.full_name());
        }
        if br.ignore_empty() && !out.is_empty() {
            self.kind(m, "bytes.ignore_empty");
            out = format!("if !{v}.is_empty() {{\n{out}}}\n");
        }
        out
    }
}

fn lit_nanos(d: &PbDuration) -> i128 {
    i128::from(d.seconds) * 1_000_000_000 + i128::from(d.nanos)
}

/// The rule name of a duration check: the bounds it has, joined.
fn duration_rule_name(d: &pgv::DurationRules) -> String {
    let mut parts = Vec::new();
    if d.r#const.is_some() {
        parts.push("const");
    }
    if d.gt.is_some() {
        parts.push("gt");
    } else if d.gte.is_some() {
        parts.push("gte");
    }
    if d.lt.is_some() {
        parts.push("lt");
    } else if d.lte.is_some() {
        parts.push("lte");
    }
    if !d.r#in.is_empty() {
        parts.push("in");
    }
    if !d.not_in.is_empty() {
        parts.push("not_in");
    }
    format!("duration.{}", parts.join("+"))
}

/// A `matches!` pattern for a set of integers, runs written as ranges.
fn pattern_of(numbers: &[i32]) -> String {
    let mut sorted = numbers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut parts = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let start = sorted[i];
        let mut end = start;
        while i + 1 < sorted.len() && sorted[i + 1] == end + 1 {
            i += 1;
            end = sorted[i];
        }
        parts.push(if start == end {
            format!("{start}")
        } else {
            format!("{start}..={end}")
        });
        i += 1;
    }
    parts.join(" | ")
}

fn generate() -> String {
    let proto = envoy_types_proto_dir();
    let includes: Vec<PathBuf> = INCLUDES.iter().map(|p| proto.join(p)).collect();
    let mut compiler = protox::Compiler::new(includes).expect("protox compiler");
    compiler.include_imports(true);
    compiler
        .open_files(ROOTS.iter().map(|(file, _, _)| *file))
        .expect("compile the resource protos");
    let pool = compiler.descriptor_pool();
    let roots: Vec<MessageDescriptor> = ROOTS
        .iter()
        .map(|(_, name, _)| pool.get_message_by_name(name).expect(name))
        .collect();
    let mut g = Gen::new(&pool);
    let all = g.plan(&roots);
    let with_fns: Vec<MessageDescriptor> = g.fns.keys().map(|n| all[n].clone()).collect();
    for m in &with_fns {
        g.write_message(m);
    }

    // Per root: the kinds reachable from it, with the shortest path to one field of each kind.
    let mut per_root = Vec::new();
    for (root, (_, _, entry)) in roots.iter().zip(ROOTS) {
        let mut found: BTreeMap<&'static str, String> = BTreeMap::new();
        let mut seen = BTreeSet::new();
        let mut queue = std::collections::VecDeque::from([(root.clone(), String::new())]);
        while let Some((m, path)) = queue.pop_front() {
            if !seen.insert(m.full_name().to_owned()) {
                continue;
            }
            if let Some(kinds) = g.kinds.get(m.full_name()) {
                for (k, field) in kinds {
                    found.entry(k).or_insert_with(|| {
                        if path.is_empty() {
                            format!("{field} ({})", m.name())
                        } else {
                            format!("{path}.{field} ({})", m.name())
                        }
                    });
                }
            }
            for f in m.fields() {
                if let Some(mm) = g.message_of(&f)
                    && g.fns.contains_key(mm.full_name())
                {
                    let step = match f.cardinality() {
                        Cardinality::Repeated if f.is_map() => format!("{}[k]", f.name()),
                        Cardinality::Repeated => format!("{}[]", f.name()),
                        _ => f.name().to_owned(),
                    };
                    let next = if path.is_empty() {
                        step
                    } else {
                        format!("{path}.{step}")
                    };
                    queue.push_back((mm, next));
                }
            }
        }
        per_root.push((*entry, root.full_name().to_owned(), found));
    }

    let mut totals: BTreeMap<&'static str, usize> = BTreeMap::new();
    for kinds in g.kinds.values() {
        for k in kinds.keys() {
            *totals.entry(k).or_default() += 1;
        }
    }

    let mut head = String::new();
    let version = proto
        .parent()
        .and_then(Path::file_name)
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = writeln!(
        head,
        "// @generated by xds-client/tests/validate_codegen.rs from the protoc-gen-validate annotations\n\
         // of {version}; do not edit. Refresh with\n\
         // `MESHKIT_REGENERATE=1 cargo test -p meshkit-xds-client --test validate_codegen`.\n\
         //\n\
         // {} messages reachable from the five roots, {} of them with checks (a function each).\n\
         // Beside protoc-gen-validate's rules: `enum.defined` (every enum field holds a value its\n\
         // enum defines; `enum.defined_only` where the proto asks for it) and `envoy.duration`\n\
         // (every Duration non-negative and within protobuf's range, as Envoy's\n\
         // MessageUtil::validateDurationFields checks).\n\
         //\n\
         // Not supported (the generator stops if one appears):",
        all.len(),
        with_fns.len()
    );
    for u in UNSUPPORTED {
        let _ = writeln!(head, "// - {u}");
    }
    let _ = writeln!(head, "//\n// Kinds, and in how many messages each is used:");
    for (k, n) in &totals {
        let _ = writeln!(head, "// - {k}: {n}");
    }
    let _ = writeln!(
        head,
        "//\n// Kinds reachable from each root, with a path to one field that has it:"
    );
    for (entry, name, found) in &per_root {
        let _ = writeln!(head, "// {entry} ({name}):");
        for (k, p) in found {
            let _ = writeln!(head, "//   {k}: {p}");
        }
    }
    let mut file = head;
    file.push_str(
        "\nuse envoy_types::pb;\n\nuse super::support::{self as s, Seg, Violation};\n\ntype R = Result<(), Violation>;\n\n",
    );
    for (i, (_, name, entry)) in ROOTS.iter().enumerate() {
        let m = &roots[i];
        let _ = write!(
            file,
            "/// The schema checks of `{name}`.\npub(crate) fn {entry}(m: &{}) -> R {{\n{}(m)\n}}\n\n",
            rust_type(m),
            g.fns[m.full_name()]
        );
    }
    file.push_str(&g.out);
    file
}

fn rustfmt(code: &str) -> String {
    let mut child = std::process::Command::new("rustfmt")
        .args(["--edition", "2024", "--emit", "stdout"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("run rustfmt");
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(code.as_bytes()).expect("write to rustfmt");
    }
    let out = child.wait_with_output().expect("rustfmt output");
    assert!(out.status.success(), "rustfmt failed");
    String::from_utf8(out.stdout).expect("utf-8")
}

#[test]
fn checked_in_code_matches_the_envoy_annotations() {
    let path = crate_dir().join("src/validate/generated.rs");
    let fresh = rustfmt(&generate());
    if std::env::var_os("MESHKIT_REGENERATE").is_some() {
        std::fs::write(&path, fresh).expect("write generated.rs");
        return;
    }
    let current = std::fs::read_to_string(&path).expect("checked-in generated.rs");
    assert!(
        fresh == current,
        "src/validate/generated.rs is stale; run \
         `MESHKIT_REGENERATE=1 cargo test -p meshkit-xds-client --test validate_codegen`"
    );
}

#[test]
fn identifiers_follow_prost_build() {
    assert_eq!(snake("HTTPHeaderName"), "http_header_name");
    assert_eq!(snake("Http2ProtocolOptions"), "http2_protocol_options");
    assert_eq!(snake("type"), "r#type");
    assert_eq!(snake("Match"), "r#match");
    assert_eq!(upper_camel("socket_address"), "SocketAddress");
    assert_eq!(upper_camel("ipv4_compat"), "Ipv4Compat");
    assert_eq!(
        upper_camel("SPIFFECertValidatorConfig"),
        "SpiffeCertValidatorConfig"
    );
    assert_eq!(upper_camel("self"), "Self_");
    assert_eq!(pattern_of(&[0, 1, 2, 5, 7, 8]), "0..=2 | 5 | 7..=8");
}
