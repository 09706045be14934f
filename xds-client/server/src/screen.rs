//! What both protocol variants do first with a request, before their own subscription rules:
//! remember the client's node, log the ACK or NACK, and check the type URL against the
//! stream's limit.

use envoy_types::pb::envoy::config::core::v3::Node;

use crate::error::RequestError;

/// The parts of a request, of either variant, that [`screen`] looks at.
pub(crate) struct Seen<'a> {
    /// `SotW` or `Delta`, for the logs.
    pub(crate) variant: &'static str,
    pub(crate) node: Option<&'a Node>,
    pub(crate) type_url: &'a str,
    pub(crate) nonce: &'a str,
    /// SotW's `version_info`; empty for Delta, whose requests carry none.
    pub(crate) version: &'a str,
    pub(crate) error: Option<&'a str>,
}

/// Records the node on the stream's first request that names one, logs an ACK or NACK, and
/// refuses a request without a type URL, or for a type beyond the stream's limit. `known` says
/// whether the stream already has this type, `types` how many it has. On success, whether the
/// type is new to the stream.
pub(crate) fn screen(
    stream_node: &mut String,
    seen: Seen<'_>,
    known: bool,
    types: usize,
    max_types: usize,
) -> Result<bool, RequestError> {
    let Seen {
        variant,
        node,
        type_url,
        nonce,
        version,
        error,
    } = seen;
    if let Some(node) = node
        && stream_node.is_empty()
    {
        stream_node.clone_from(&node.id);
        tracing::info!(node = %stream_node, "{variant} ADS stream opened");
    }
    if let Some(error) = error {
        tracing::warn!(
            node = %stream_node, %type_url, %nonce, %version, %error,
            "NACK: client rejected configuration"
        );
    } else if !nonce.is_empty() {
        tracing::debug!(node = %stream_node, %type_url, %nonce, %version, "ACK");
    }
    if type_url.is_empty() {
        return Err(RequestError::MissingTypeUrl);
    }
    if !known && types >= max_types {
        return Err(RequestError::TooManyTypes {
            type_url: type_url.to_owned(),
            limit: max_types,
        });
    }
    Ok(!known)
}
