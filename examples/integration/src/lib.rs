//! Tests of meshkit that span several parts; the library is empty and the tests are in
//! `tests/`:
//!
//! - `dataplane`: node proxies and the gateway wired by hand, over real sockets.
//! - `mesh_e2e`: the demo mesh in process, every route and identity checked.
//! - `mesh_processes`: the `control-plane`, `node-proxy` and `ingress-gateway` binaries as
//!   separate processes.
//! - `envoy_gateway`: Envoy fed by the control plane, routing like meshkit's gateway
//!   (`#[ignore]`d: needs `MESHKIT_ENVOY`).
