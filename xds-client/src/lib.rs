//! Envoy xDS client for meshkit: Aggregated Discovery Service over gRPC, in both the
//! State-of-the-World and the Delta variant.
//!
//! # Status
//!
//! This crate is a placeholder in the workspace. It exposes no API yet: the protocol core
//! (subscriptions, ACK/NACK, caching, does-not-exist timers, with no I/O of its own) and the
//! async driver are delivered by the xDS work item. Nothing here pretends to work in the
//! meantime.
