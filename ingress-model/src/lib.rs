//! Kubernetes `networking.k8s.io/v1` Ingress for meshkit: generated types, manifest loading,
//! validation and Ingress routing semantics.
//!
//! # Status
//!
//! This crate is a placeholder in the workspace. It exposes no API yet: the generated types,
//! the manifest loader, the validator and the route table are delivered by the ingress-model
//! work item. Nothing here pretends to work in the meantime.
