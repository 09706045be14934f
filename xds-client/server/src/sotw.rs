//! State-of-the-World protocol state of one stream, without I/O.

use std::collections::{BTreeMap, BTreeSet};
use std::hash::Hasher;

use envoy_types::pb::envoy::service::discovery::v3::{DiscoveryRequest, DiscoveryResponse};

use crate::config::ServerConfig;
use crate::error::RequestError;
use crate::screen::{Seen, screen};
use crate::snapshot::{Snapshot, TypeSnapshot, VersionedResource};

/// State-of-the-World protocol state of one stream: requests and snapshots in, responses out.
///
/// A type is answered when it is first requested, when its subscription changes, and when the
/// response would differ from the last one sent on the stream: the subscribed resources
/// (names and versions) changed, or the type's explicit version changed. An ACK or a NACK
/// alone sends nothing, and a type the snapshot does not have gets no answer. Each response
/// carries every subscribed resource of its type, as State of the World requires.
///
/// Subscriptions follow the xDS rules: `*` subscribes to every resource, also next to names;
/// a type whose every request so far named nothing is a (legacy) wildcard subscription; once
/// a request has named something, an empty list means no resources.
///
/// ```
/// use meshkit_xds_server::{SnapshotBuilder, SotwStream};
/// use meshkit_xds_server::envoy::DiscoveryRequest;
/// use meshkit_xds_server::envoy_types::pb::google::protobuf::Any;
///
/// const URL: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
/// let mut b = SnapshotBuilder::new();
/// b.add(URL, "a", &Any::default());
/// let snapshot = b.build();
///
/// let mut stream = SotwStream::default();
/// stream.handle_request(DiscoveryRequest { type_url: URL.into(), ..Default::default() });
/// let out = stream.poll(&snapshot);
/// assert_eq!(out[0].resources.len(), 1);
///
/// // The ACK: nothing more to send.
/// let ack = DiscoveryRequest {
///     type_url: URL.into(),
///     version_info: out[0].version_info.clone(),
///     response_nonce: out[0].nonce.clone(),
///     ..Default::default()
/// };
/// stream.handle_request(ack);
/// assert!(stream.poll(&snapshot).is_empty());
/// ```
#[derive(Debug)]
pub struct SotwStream {
    node: String,
    types: BTreeMap<String, SotwType>,
    nonce: u64,
    max_types: usize,
    max_names: usize,
}

#[derive(Debug, Default)]
struct SotwType {
    /// Some request has named a resource (or `*`): the legacy wildcard no longer applies.
    named: bool,
    wildcard: bool,
    names: BTreeSet<String>,
    /// The subscription changed since the last response: answer even if nothing else did.
    dirty: bool,
    /// `(content, version)` of the type snapshot last looked at, to skip unchanged types.
    seen: Option<(u128, String)>,
    /// Fingerprint of the last response sent.
    sent: Option<u64>,
    /// "Not served" was logged.
    logged_unserved: bool,
}

// === impl SotwStream ===

impl Default for SotwStream {
    fn default() -> Self {
        Self::new(&ServerConfig::default())
    }
}

impl SotwStream {
    /// A stream with the limits of `config`.
    pub fn new(config: &ServerConfig) -> Self {
        Self {
            node: String::new(),
            types: BTreeMap::new(),
            nonce: 0,
            max_types: config.max_types_per_stream,
            max_names: config.max_names_per_stream,
        }
    }

    /// The node id of the first request that named a node; empty before one did.
    pub fn node_id(&self) -> &str {
        &self.node
    }

    /// Takes one request: records the node, logs ACK/NACK, updates the subscription. A request
    /// [`try_handle_request`](Self::try_handle_request) refuses is logged and ignored.
    pub fn handle_request(&mut self, req: DiscoveryRequest) {
        if let Err(e) = self.try_handle_request(req) {
            tracing::warn!(node = %self.node, error = %e, "SotW request ignored");
        }
    }

    /// Takes one request, as [`handle_request`](Self::handle_request) does.
    ///
    /// # Errors
    ///
    /// The request has no type URL, is for a new type beyond the stream's limit, or names
    /// more resources than the stream may subscribe to
    /// ([`ServerConfig::max_names_per_stream`], counting the latest names of every type); the
    /// stream's state is unchanged (the node is still recorded). The server ends the stream
    /// with the error's status.
    pub fn try_handle_request(&mut self, req: DiscoveryRequest) -> Result<(), RequestError> {
        let seen = Seen {
            variant: "SotW",
            node: req.node.as_ref(),
            type_url: &req.type_url,
            nonce: &req.response_nonce,
            version: &req.version_info,
            error: req.error_detail.as_ref().map(|e| e.message.as_str()),
        };
        let known = self.types.contains_key(&req.type_url);
        let first = screen(
            &mut self.node,
            seen,
            known,
            self.types.len(),
            self.max_types,
        )?;
        let others: usize = self
            .types
            .iter()
            .filter(|(url, _)| **url != req.type_url)
            .map(|(_, t)| t.names.len())
            .sum();
        let total = others.saturating_add(req.resource_names.len());
        if total > self.max_names {
            return Err(RequestError::TooManyNames {
                names: total,
                limit: self.max_names,
            });
        }
        let sub = self.types.entry(req.type_url).or_default();
        let mut names: BTreeSet<String> = req.resource_names.into_iter().collect();
        let star = names.remove("*");
        sub.named |= star || !names.is_empty();
        let wildcard = star || !sub.named;
        if first || wildcard != sub.wildcard || names != sub.names {
            sub.wildcard = wildcard;
            sub.names = names;
            sub.dirty = true;
        }
        Ok(())
    }

    /// The responses due for `snapshot`: types first requested, re-subscribed, or whose
    /// response would differ from the last one sent.
    pub fn poll(&mut self, snapshot: &Snapshot) -> Vec<DiscoveryResponse> {
        let mut out = Vec::new();
        for (url, sub) in &mut self.types {
            let Some(ts) = snapshot.get_type(url) else {
                if !sub.logged_unserved {
                    tracing::debug!(node = %self.node, type_url = %url, "type not served");
                    sub.logged_unserved = true;
                }
                continue;
            };
            sub.logged_unserved = false;
            if !sub.dirty
                && sub
                    .seen
                    .as_ref()
                    .is_some_and(|(c, v)| *c == ts.content() && v == ts.version())
            {
                continue;
            }
            sub.seen = Some((ts.content(), ts.version().to_owned()));
            let dirty = std::mem::take(&mut sub.dirty);
            if !sub.wildcard && sub.names.is_empty() {
                // Subscribed to nothing: nothing to say until the subscription changes.
                sub.sent = None;
                continue;
            }
            let covered = sub.covered(ts);
            let fingerprint = fingerprint(ts, &covered);
            if !dirty && sub.sent == Some(fingerprint) {
                continue;
            }
            sub.sent = Some(fingerprint);
            self.nonce += 1;
            out.push(DiscoveryResponse {
                version_info: ts.version().to_owned(),
                resources: covered
                    .into_iter()
                    .map(|(_, r)| r.resource.clone())
                    .collect(),
                type_url: url.clone(),
                nonce: self.nonce.to_string(),
                ..Default::default()
            });
        }
        out
    }
}

// === impl SotwType ===

impl SotwType {
    /// The subscribed resources that exist, in name order.
    fn covered<'a>(&self, ts: &'a TypeSnapshot) -> Vec<(&'a str, &'a VersionedResource)> {
        if self.wildcard {
            ts.resources().iter().map(|(n, r)| (n, &**r)).collect()
        } else {
            self.names
                .iter()
                .filter_map(|n| ts.resources().get_key_value(n))
                .map(|(n, r)| (n, &**r))
                .collect()
        }
    }
}

/// What a response for `covered` would say: the names and versions it carries, and the
/// type's version when that was set explicitly (a content-hash type version only restates
/// the resources, and covers resources a named subscriber does not see).
fn fingerprint(ts: &TypeSnapshot, covered: &[(&str, &VersionedResource)]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    for (name, r) in covered {
        h.write(name.as_bytes());
        h.write_u8(0);
        h.write(r.version.as_bytes());
        h.write_u8(0);
    }
    if ts.explicit() {
        h.write_u8(1);
        h.write(ts.version().as_bytes());
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::google::protobuf::Any;
    use envoy_types::pb::google::rpc::Status as RpcStatus;

    use super::*;
    use crate::snapshot::SnapshotBuilder;

    const A: &str = "type.googleapis.com/test.A";
    const B: &str = "type.googleapis.com/test.B";

    /// A snapshot of raw resources: `(type, name, bytes)`.
    fn snapshot(resources: &[(&str, &str, &[u8])]) -> Snapshot {
        let mut b = SnapshotBuilder::new();
        b.declare(A).declare(B);
        for (url, name, bytes) in resources {
            b.add(
                url,
                name,
                &Any {
                    type_url: "x".into(),
                    value: bytes.to_vec(),
                },
            );
        }
        b.build()
    }

    fn sotw_req(url: &str, names: &[&str], nonce: &str) -> DiscoveryRequest {
        DiscoveryRequest {
            type_url: url.into(),
            resource_names: names.iter().map(|n| n.to_string()).collect(),
            response_nonce: nonce.into(),
            ..Default::default()
        }
    }

    #[test]
    fn sotw_answers_subscriptions_and_changes_only() {
        let s1 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2"), (B, "b1", b"1")]);
        let mut st = SotwStream::default();
        st.handle_request(sotw_req(A, &[], ""));
        let out = st.poll(&s1);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources.len(), 2, "wildcard gets everything");
        // ACK: nothing.
        st.handle_request(sotw_req(A, &[], &out[0].nonce));
        assert!(st.poll(&s1).is_empty());
        // A change of another type: nothing for A.
        let s2 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"2"), (B, "b1", b"changed")]);
        assert!(st.poll(&s2).is_empty());
        // A change of A: the full set again.
        let s3 = snapshot(&[(A, "a1", b"1"), (A, "a2", b"new"), (B, "b1", b"changed")]);
        let out = st.poll(&s3);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].resources.len(), 2);
        // NACK: logged, not re-sent.
        let mut nack = sotw_req(A, &[], &out[0].nonce);
        nack.error_detail = Some(RpcStatus {
            message: "bad".into(),
            ..Default::default()
        });
        st.handle_request(nack);
        assert!(st.poll(&s3).is_empty());
    }

    #[test]
    fn sotw_named_subscriptions_see_only_their_resources() {
        let s1 = snapshot(&[(B, "b1", b"1"), (B, "b2", b"2")]);
        let mut st = SotwStream::default();
        st.handle_request(sotw_req(B, &["b1"], ""));
        let out = st.poll(&s1);
        assert_eq!(out[0].resources.len(), 1);
        // b2 changes: not subscribed, nothing sent.
        let s2 = snapshot(&[(B, "b1", b"1"), (B, "b2", b"changed")]);
        assert!(st.poll(&s2).is_empty());
        // Subscribing to more names answers at once.
        st.handle_request(sotw_req(B, &["b1", "b2"], "1"));
        let out = st.poll(&s2);
        assert_eq!(out[0].resources.len(), 2);
    }

    #[test]
    fn the_node_id_is_the_first_one_named() {
        let node = |id: &str| {
            Some(envoy_types::pb::envoy::config::core::v3::Node {
                id: id.into(),
                ..Default::default()
            })
        };
        let mut st = SotwStream::default();
        assert_eq!(st.node_id(), "");
        for id in ["n1", "n2"] {
            st.handle_request(DiscoveryRequest {
                node: node(id),
                type_url: A.into(),
                ..Default::default()
            });
        }
        assert_eq!(st.node_id(), "n1");
    }

    #[test]
    fn acks_do_not_rescan_unchanged_types() {
        let s1 = snapshot(&[(A, "a1", b"1")]);
        let mut st = SotwStream::default();
        st.handle_request(sotw_req(A, &[], ""));
        assert_eq!(st.poll(&s1).len(), 1);
        st.handle_request(sotw_req(A, &[], "1"));
        let seen = st.types[A].seen.clone();
        assert!(st.poll(&s1).is_empty());
        assert_eq!(st.types[A].seen, seen);
    }
}
