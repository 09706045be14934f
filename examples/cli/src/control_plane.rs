//! The flags with which every program reaches the control plane: its CA bundle, an alternate
//! server name and a token file, the same for `node-proxy`, `ingress-gateway` and `xds-watch`.

use std::path::{Path, PathBuf};

use meshkit_xds_client::{ClientConfig, ControlPlaneTls};

use crate::CliError;

/// How to reach the control plane over TLS, with a token. Flatten it into a program's flags
/// (`#[command(flatten)]`).
///
/// An `https://` URL (of `--xds`, `--server` or `--ca`) is dialled over TLS, checking the
/// control plane's certificate against `--xds-ca` (for the CA: `--xds-ca`, else the mesh root
/// the program already takes); an `http://` URL is plaintext, which the control plane serves
/// only on loopback.
#[derive(clap::Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct ControlPlaneArgs {
    /// PEM bundle the control plane's serving certificate chains to (the mesh root that
    /// `control-plane --root-out` writes).
    #[arg(long, value_name = "FILE")]
    pub xds_ca: Option<PathBuf>,
    /// Check the control plane's certificate against this name instead of the URL's host
    /// (the control plane's certificate names `istiod.istio-system.svc` by default).
    #[arg(long, value_name = "NAME")]
    pub xds_server_name: Option<String>,
    /// File with the bearer token for the control plane (re-read for every xDS stream); also
    /// sent to the CA unless a CA token is given.
    #[arg(long, value_name = "FILE")]
    pub xds_token_file: Option<PathBuf>,
}

// === impl ControlPlaneArgs ===

impl ControlPlaneArgs {
    /// TLS settings from `roots` and `--xds-server-name`, with the programs' crypto provider.
    fn tls_with(&self, roots: &Path) -> Result<ControlPlaneTls, CliError> {
        let mut tls = ControlPlaneTls::from_pem_file(roots)
            .map_err(|e| format!("--xds-ca {}: {}", roots.display(), crate::error_chain(&e)))?
            .with_provider(crate::crypto_provider());
        if let Some(name) = &self.xds_server_name {
            tls = tls
                .with_server_name(name)
                .map_err(|e| format!("--xds-server-name: {}", crate::error_chain(&e)))?;
        }
        Ok(tls)
    }

    /// `config` (for the URL `uri`) with TLS for an `https://` URL and the token file.
    ///
    /// # Errors
    ///
    /// An `https://` URL without `--xds-ca`, or an unreadable bundle.
    pub fn xds_config(&self, uri: &str, config: ClientConfig) -> Result<ClientConfig, CliError> {
        let mut config = config;
        if uri.starts_with("https://") {
            let roots = self
                .xds_ca
                .as_deref()
                .ok_or("an https:// control plane URL needs --xds-ca")?;
            config = config
                .with_control_plane_tls(&self.tls_with(roots)?)
                .map_err(|e| crate::error_chain(&e))?;
        }
        if let Some(path) = &self.xds_token_file {
            token_may_go_to("--xds-token-file", uri)?;
            config = config.bearer_token_file(path);
        }
        Ok(config)
    }

    /// A lazily connecting channel to the CA at `uri`: TLS for `https://`, checked against
    /// `--xds-ca` or else `mesh_root`.
    ///
    /// # Errors
    ///
    /// When `uri` does not parse or the bundle cannot be read.
    pub fn ca_channel(
        &self,
        uri: &str,
        mesh_root: &Path,
    ) -> Result<tonic::transport::Channel, CliError> {
        if uri.starts_with("https://") {
            let roots = self.xds_ca.as_deref().unwrap_or(mesh_root);
            return self
                .tls_with(roots)?
                .connect_lazy(uri)
                .map_err(|e| format!("--ca {uri:?}: {}", crate::error_chain(&e)).into());
        }
        Ok(tonic::transport::Endpoint::from_shared(uri.to_owned())
            .map_err(|e| format!("--ca {uri:?}: {e}"))?
            .connect_lazy())
    }

    /// The token for the CA at `uri`: `explicit` (a `--ca-token`), else the token file, read
    /// anew for every request so that a rotated token (a projected ServiceAccount token) is
    /// sent once it is written.
    ///
    /// # Errors
    ///
    /// When the token file cannot be read now, or a token would go in plaintext (`http://`)
    /// to a host that is not loopback.
    pub fn ca_token(&self, explicit: Option<&str>, uri: &str) -> Result<Option<CaToken>, CliError> {
        if let Some(token) = explicit {
            token_may_go_to("--ca-token", uri)?;
            return Ok(Some(CaToken::Value(token.to_owned())));
        }
        let Some(path) = &self.xds_token_file else {
            return Ok(None);
        };
        token_may_go_to("--xds-token-file", uri)?;
        // Read once now, so that a missing file is an error at start rather than a CA
        // refusing every request.
        std::fs::read_to_string(path)
            .map_err(|e| format!("--xds-token-file {}: {e}", path.display()))?;
        Ok(Some(CaToken::File(path.clone())))
    }
}

/// The bearer token a part sends to the CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CaToken {
    /// This token.
    Value(String),
    /// The contents of this file, read for each request.
    File(PathBuf),
}

/// Refuses to send a bearer token in plaintext beyond this host: over `http://` it may only go
/// to a loopback address, where nobody on the path can read it. A name (`localhost`
/// included) is resolved as the connection will resolve it, and every address it has must be
/// loopback: `/etc/hosts` or DNS may point `localhost` elsewhere.
fn token_may_go_to(flag: &str, uri: &str) -> Result<(), CliError> {
    token_may_go_to_resolved(flag, uri, |host, port| {
        use std::net::ToSocketAddrs;
        Ok((host, port).to_socket_addrs()?.map(|a| a.ip()).collect())
    })
}

type Resolve = fn(&str, u16) -> std::io::Result<Vec<std::net::IpAddr>>;

fn token_may_go_to_resolved(flag: &str, uri: &str, resolve: Resolve) -> Result<(), CliError> {
    let parsed: tonic::codegen::http::Uri = uri
        .parse()
        .map_err(|e| format!("control plane URL {uri:?}: {e}"))?;
    if parsed.scheme_str() != Some("http") {
        return Ok(());
    }
    let host = parsed.host().unwrap_or_default();
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let addresses = match host.parse::<std::net::IpAddr>() {
        Ok(ip) => vec![ip],
        Err(_) => resolve(host, parsed.port_u16().unwrap_or(80))
            .map_err(|e| {
                format!("{flag}: refusing to send a token in plaintext to {uri}: {host:?} does not resolve: {e}")
            })?,
    };
    if !addresses.is_empty() && addresses.iter().all(std::net::IpAddr::is_loopback) {
        Ok(())
    } else {
        Err(format!(
            "{flag}: refusing to send a token in plaintext to {uri} ({host} is {addresses:?}, not only loopback); use an https:// URL with --xds-ca"
        )
        .into())
    }
}

#[cfg(test)]
mod tests {
    use super::{token_may_go_to, token_may_go_to_resolved};

    #[test]
    fn tokens_go_in_plaintext_only_to_loopback() {
        for ok in [
            "http://127.0.0.1:15010",
            "http://[::1]:15010",
            "https://10.0.0.5:15012",
            "https://istiod.istio-system.svc:15012",
        ] {
            assert!(token_may_go_to("--t", ok).is_ok(), "{ok}");
        }
        for refused in ["http://10.0.0.5:15010", "http://[2001:db8::1]:1"] {
            let err = token_may_go_to("--t", refused).unwrap_err().to_string();
            assert!(err.contains("plaintext"), "{refused}: {err}");
        }
    }

    /// A name is held to what it resolves to, `localhost` like any other.
    #[test]
    fn a_name_goes_in_plaintext_only_when_all_its_addresses_are_loopback() {
        let resolve: super::Resolve = |host, _| {
            Ok(match host {
                "localhost" => vec!["10.0.0.9".parse().unwrap()],
                "loop" => vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()],
                "mixed" => vec!["127.0.0.1".parse().unwrap(), "10.0.0.9".parse().unwrap()],
                _ => Vec::new(),
            })
        };
        assert!(token_may_go_to_resolved("--t", "http://loop:15010", resolve).is_ok());
        for refused in ["http://localhost:15010", "http://mixed:1", "http://none:1"] {
            let err = token_may_go_to_resolved("--t", refused, resolve)
                .unwrap_err()
                .to_string();
            assert!(err.contains("plaintext"), "{refused}: {err}");
        }
        let fails: super::Resolve = |_, _| Err(std::io::Error::other("no such host"));
        let err = token_may_go_to_resolved("--t", "http://localhost:1", fails)
            .unwrap_err()
            .to_string();
        assert!(err.contains("does not resolve"), "{err}");
    }
}
