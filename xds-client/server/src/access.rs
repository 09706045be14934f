//! Who may open a stream, and what each stream is served: the hook through which a control
//! plane authenticates its clients and scopes their view of the snapshot.
//!
//! An [`AccessPolicy`] set with [`AdsServer::with_access`](crate::AdsServer::with_access) is
//! asked once per stream, with the call's gRPC metadata (where a bearer token travels), for a
//! [`StreamAccess`]. That value then checks the node of every request that names one (the
//! first request of a stream must) and picks, from each new snapshot, the part the stream may
//! see. Nothing is read from the snapshot, and nothing is sent, before the stream's node has
//! been accepted.
//!
//! Without a policy every stream is served the whole snapshot, as before.

use std::sync::Arc;

use envoy_types::pb::envoy::config::core::v3::Node;
use tonic::Status;
use tonic::metadata::MetadataMap;

use crate::snapshot::Snapshot;
use futures::future::BoxFuture;

/// Decides whether a stream may open, from its gRPC metadata; asynchronously, so that a
/// credential can be checked with another service (a Kubernetes `TokenReview`, say).
/// Implemented for closures `Fn(&MetadataMap) -> Result<Box<dyn StreamAccess>, Status>`.
pub trait AccessPolicy: Send + Sync + 'static {
    /// The access of a new stream, or the status that refuses it (typically
    /// `UNAUTHENTICATED` without valid credentials). A refused call ends before any request
    /// is read.
    ///
    /// # Errors
    ///
    /// The status the call ends with.
    fn open<'a>(
        &'a self,
        metadata: &'a MetadataMap,
    ) -> BoxFuture<'a, Result<Box<dyn StreamAccess>, Status>>;
}

/// One stream's access rights: which node it may speak for and what it may see.
pub trait StreamAccess: Send + 'static {
    /// Called with the node of every request that carries one. The first request of a stream
    /// must carry one; without it the stream ends with `INVALID_ARGUMENT`.
    ///
    /// # Errors
    ///
    /// The status the stream ends with (typically `PERMISSION_DENIED` when the node is not
    /// the one the credentials name).
    fn check_node(&mut self, node: &Node) -> Result<(), Status>;

    /// The part of `snapshot` this stream is served. Called once per snapshot (the server
    /// keeps the result until the snapshot changes). Types left out are not served to the
    /// stream at all; resources left out do not exist for it.
    fn view(&mut self, snapshot: &Arc<Snapshot>) -> Arc<Snapshot>;
}

impl<F> AccessPolicy for F
where
    F: Fn(&MetadataMap) -> Result<Box<dyn StreamAccess>, Status> + Send + Sync + 'static,
{
    fn open<'a>(
        &'a self,
        metadata: &'a MetadataMap,
    ) -> BoxFuture<'a, Result<Box<dyn StreamAccess>, Status>> {
        Box::pin(std::future::ready(self(metadata)))
    }
}

/// The per-stream state the server keeps for a [`StreamAccess`].
pub(crate) struct Guard {
    access: Box<dyn StreamAccess>,
    node_accepted: bool,
    /// The last snapshot seen and the view made of it.
    cached: Option<(Arc<Snapshot>, Arc<Snapshot>)>,
}

// === impl Guard ===

impl Guard {
    pub(crate) fn new(access: Box<dyn StreamAccess>) -> Self {
        Self {
            access,
            node_accepted: false,
            cached: None,
        }
    }

    /// Checks the node of a request (`None`: the request names none).
    pub(crate) fn check(&mut self, node: Option<&Node>) -> Result<(), Status> {
        match node {
            Some(node) => {
                self.access.check_node(node)?;
                self.node_accepted = true;
                Ok(())
            }
            None if self.node_accepted => Ok(()),
            None => Err(Status::invalid_argument(
                "the first request of a stream must name its node",
            )),
        }
    }

    /// The stream's view of `snapshot`; empty until a node has been accepted.
    pub(crate) fn view(&mut self, snapshot: &Arc<Snapshot>) -> Arc<Snapshot> {
        if !self.node_accepted {
            return Arc::new(Snapshot::default());
        }
        if let Some((source, view)) = &self.cached
            && Arc::ptr_eq(source, snapshot)
        {
            return Arc::clone(view);
        }
        let view = self.access.view(snapshot);
        self.cached = Some((Arc::clone(snapshot), Arc::clone(&view)));
        view
    }
}
