//! HBONE for meshkit: HTTP/2 `CONNECT` tunnels over mutual TLS 1.3 on port 15008.
//!
//! # Status
//!
//! This crate is a placeholder in the workspace. It exposes no API yet: the client, server and
//! tunnel types described in the project's design are delivered by the HBONE work item, on top
//! of [`meshkit-identity`](https://docs.rs/meshkit-identity) for SPIFFE certificates and peer
//! verification. Nothing here pretends to work in the meantime.
