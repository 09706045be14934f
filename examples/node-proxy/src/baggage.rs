//! W3C `baggage` on HBONE CONNECTs, as ztunnel sends and reads it: who the source workload is
//! (its cluster, namespace, workload, canonical service and revision), for the destination's
//! telemetry.
//!
//! The outbound side sends what it knows of the source; the inbound side keeps, from a peer's
//! header, only the members ztunnel defines, with plain values, and shows them in the access
//! log. They are the peer's claims, not verified facts, so they never become metric labels:
//! a peer could otherwise grow the label sets without bound.

use http::HeaderValue;

use crate::telemetry::{PeerLabels, UNKNOWN};

/// The longest `baggage` header read; longer ones are ignored whole.
const MAX_HEADER: usize = 1024;

/// The longest value kept (a DNS name's length).
const MAX_VALUE: usize = 253;

/// The members read: ztunnel's.
const KEYS: [&str; 10] = [
    "k8s.cluster.name",
    "k8s.namespace.name",
    "k8s.deployment.name",
    "k8s.cronjob.name",
    "k8s.pod.name",
    "k8s.job.name",
    "service.name",
    "service.version",
    "cloud.region",
    "cloud.availability_zone",
];

/// The header for a connection from `source`, `None` when nothing is known of it.
pub(crate) fn of(source: &PeerLabels) -> Option<String> {
    let members: Vec<String> = [
        ("k8s.namespace.name", &source.namespace),
        ("k8s.deployment.name", &source.workload),
        ("service.name", &source.canonical_service),
        ("service.version", &source.canonical_revision),
    ]
    .into_iter()
    .filter(|(_, v)| v.as_str() != UNKNOWN && plain(v))
    .map(|(k, v)| format!("{k}={v}"))
    .collect();
    (!members.is_empty()).then(|| members.join(","))
}

/// The members of a peer's header that are kept, joined again; `None` when none is.
pub(crate) fn read(header: Option<&HeaderValue>) -> Option<Box<str>> {
    let text = header?.to_str().ok()?;
    if text.len() > MAX_HEADER {
        return None;
    }
    let kept: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|member| {
            // Properties after `;` are not ztunnel's; a member with one is left out.
            member
                .split_once('=')
                .is_some_and(|(k, v)| KEYS.contains(&k) && plain(v))
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join(",").into_boxed_str())
}

/// A value of letters, digits, `.`, `_` and `-`, not empty and not too long.
fn plain(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= MAX_VALUE
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(workload: &str, namespace: &str) -> PeerLabels {
        PeerLabels {
            workload: workload.into(),
            namespace: namespace.into(),
            principal: format!("spiffe://cluster.local/ns/{namespace}/sa/x"),
            canonical_service: workload.into(),
            canonical_revision: "v1".into(),
        }
    }

    #[test]
    fn sent_as_ztunnel_sends_it() {
        assert_eq!(
            of(&labels("web-1", "shop")).as_deref(),
            Some(
                "k8s.namespace.name=shop,k8s.deployment.name=web-1,service.name=web-1,service.version=v1"
            )
        );
        let unknown = PeerLabels {
            workload: UNKNOWN.into(),
            namespace: UNKNOWN.into(),
            principal: UNKNOWN.into(),
            canonical_service: UNKNOWN.into(),
            canonical_revision: UNKNOWN.into(),
        };
        assert_eq!(of(&unknown), None);
    }

    #[test]
    fn only_ztunnels_members_with_plain_values_are_read() {
        let read = |s: &str| read(Some(&HeaderValue::from_str(s).unwrap())).map(String::from);
        assert_eq!(
            read("k8s.cluster.name=Kubernetes,k8s.namespace.name=zt,k8s.deployment.name=zt-app,service.name=ztapp,service.version=latest").as_deref(),
            Some("k8s.cluster.name=Kubernetes,k8s.namespace.name=zt,k8s.deployment.name=zt-app,service.name=ztapp,service.version=latest")
        );
        assert_eq!(
            read("userId=alice, k8s.namespace.name=zt ,service.name=a b,service.version=v1;p=1")
                .as_deref(),
            Some("k8s.namespace.name=zt")
        );
        assert_eq!(read("nothing=here"), None);
        assert_eq!(read(&format!("service.name={}", "a".repeat(254))), None);
        assert_eq!(read(&"k8s.pod.name=a,".repeat(100)), None);
        assert_eq!(super::read(None), None);
    }
}
