//! W3C trace context (`traceparent`) for tunnels: the node proxy sees no HTTP of the
//! applications at L4, so an outbound connection starts a trace of its own and carries it in
//! the HBONE CONNECT; the inbound side reads it back.

/// A new `traceparent` (version 00, sampled) and its trace id, both lowercase hex. Ids are
/// random and never all zeros, as the W3C format requires.
pub(crate) fn start() -> (String, String) {
    let trace = loop {
        let t = fastrand::u128(..);
        if t != 0 {
            break t;
        }
    };
    let parent = loop {
        let p = fastrand::u64(..);
        if p != 0 {
            break p;
        }
    };
    let id = format!("{trace:032x}");
    (format!("00-{id}-{parent:016x}-01"), id)
}

/// The trace id of a `traceparent` header value, when it is well formed: a two-digit version
/// other than `ff`, a 32-digit trace id and a 16-digit parent id, neither all zeros, and
/// two flag digits; lowercase hex; version 00 has exactly these four fields.
pub(crate) fn trace_id(traceparent: &str) -> Option<&str> {
    let mut fields = traceparent.split('-');
    let (version, trace, parent, flags) = (
        fields.next()?,
        fields.next()?,
        fields.next()?,
        fields.next()?,
    );
    let hex = |s: &str, len: usize| {
        s.len() == len
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let zeros = |s: &str| s.bytes().all(|b| b == b'0');
    let valid = hex(version, 2)
        && version != "ff"
        && (version != "00" || fields.next().is_none())
        && hex(trace, 32)
        && !zeros(trace)
        && hex(parent, 16)
        && !zeros(parent)
        && hex(flags, 2);
    valid.then_some(trace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_started_traceparent_reads_back() {
        let (traceparent, id) = start();
        assert_eq!(traceparent.len(), 55);
        assert_eq!(trace_id(&traceparent), Some(id.as_str()));
        assert_ne!(start().1, id, "each connection starts its own trace");
    }

    #[test]
    fn malformed_traceparents_are_ignored() {
        let ok = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(trace_id(ok), Some("4bf92f3577b34da6a3ce929d0e0e4736"));
        for bad in [
            "",
            "00",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-1",
        ] {
            assert_eq!(trace_id(bad), None, "{bad:?}");
        }
        // A later version may add fields.
        assert!(trace_id("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz").is_some());
    }
}
