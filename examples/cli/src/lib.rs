//! Shared pieces of meshkit's command-line programs (`control-plane`, `node-proxy`,
//! `ingress-gateway`, `mesh-demo` and the tools): the crypto provider they all use, loading
//! credentials from PEM files, logging, the runtime, waiting for a stop signal, and the flags
//! with which they reach the control plane ([`ControlPlaneArgs`]).
//!
//! Nothing here is global state: a program calls these functions from its `main`. The global
//! allocator is chosen by each binary itself, never by a library.
//!
//! ```
//! // The provider every TLS endpoint of a program should share.
//! let provider = meshkit_cli::crypto_provider();
//! let tls = meshkit_cli::tls_settings();
//! assert!(std::sync::Arc::ptr_eq(tls.provider(), &provider));
//! ```
//!
//! # Feature flags
//!
//! - `aws-lc-rs`: aws-lc-rs instead of ring as [`crypto_provider`].
//!
//! # Stability
//!
//! Pre-1.0: the API may change between minor versions.

// docs.rs builds with `--cfg docsrs`: items behind a feature show it.
#![cfg_attr(docsrs, feature(doc_cfg))]

mod control_plane;

use std::path::Path;
use std::sync::Arc;

pub use control_plane::{CaToken, ControlPlaneArgs};
pub use meshkit_admin::LogFilter;

use meshkit_identity::{
    RotationConfig, SpiffeId, TlsSettings, TrustBundle, TrustBundleSet, TrustDomain, X509Svid,
};
use rustls::crypto::CryptoProvider;

/// The crypto provider of every TLS endpoint in meshkit's programs, with TLS 1.3
/// AES-128-GCM preferred: meshkit-identity's ring [`default_provider`], or aws-lc-rs when this
/// crate is built with its `aws-lc-rs` feature.
///
/// The choice is made here, by the binaries, and not by a feature of the library crates,
/// which take a provider as a value ([`TlsSettings::with_provider`]). On CPUs with AVX-512
/// and VAES, aws-lc-rs's AES-GCM is about twice as fast as ring's (1.58x through rustls's
/// record layer); see docs/performance.md.
///
/// [`default_provider`]: meshkit_identity::default_provider
pub fn crypto_provider() -> Arc<CryptoProvider> {
    #[cfg(feature = "aws-lc-rs")]
    {
        static PROVIDER: std::sync::OnceLock<Arc<CryptoProvider>> = std::sync::OnceLock::new();
        PROVIDER
            .get_or_init(|| {
                Arc::new(meshkit_identity::prefer_aes_128_gcm(
                    rustls::crypto::aws_lc_rs::default_provider(),
                ))
            })
            .clone()
    }
    #[cfg(not(feature = "aws-lc-rs"))]
    meshkit_identity::default_provider()
}

/// [`TlsSettings`] (ALPN `h2`) with [`crypto_provider`].
pub fn tls_settings() -> TlsSettings {
    TlsSettings::default().with_provider(crypto_provider())
}

/// An HBONE client configuration with the defaults and [`crypto_provider`].
pub fn hbone_client_config() -> meshkit_hbone::ClientConfig {
    meshkit_hbone::ClientConfig::default().with_tls(tls_settings())
}

/// Certificate rotation with the defaults, loading keys with [`crypto_provider`].
pub fn rotation_config() -> RotationConfig {
    RotationConfig::default().with_provider(crypto_provider())
}

/// An error a person can act on: what failed and with which file or value.
pub type CliError = Box<dyn std::error::Error + Send + Sync>;

/// An error and its causes on one line, `what failed: why: why`, each level once (meshkit's
/// errors print one level in `Display` and keep the cause in `source()`): meshkit-identity's
/// [`ErrorChain`](meshkit_identity::ErrorChain) as a string.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    meshkit_identity::ErrorChain(error).to_string()
}

fn read(path: &Path, what: &str) -> Result<String, CliError> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read {what} file {}: {e}", path.display()).into())
}

/// Loads this workload's SVID from a PEM chain and a PEM key.
///
/// # Errors
///
/// Names the file that could not be read or the X509-SVID rule the certificate breaks.
pub fn load_svid(cert: &Path, key: &Path) -> Result<X509Svid, CliError> {
    let chain = read(cert, "certificate")?;
    let key_pem = read(key, "private key")?;
    X509Svid::from_pem_with_provider(&chain, &key_pem, &crypto_provider()).map_err(|e| {
        format!(
            "{} and {} are not a usable X.509-SVID: {e}",
            cert.display(),
            key.display()
        )
        .into()
    })
}

/// Loads the CA bundle at `path` as the roots of `trust_domain`.
///
/// # Errors
///
/// Names the file and the problem.
pub fn load_bundle(path: &Path, trust_domain: &TrustDomain) -> Result<TrustBundleSet, CliError> {
    let pem = read(path, "CA bundle")?;
    let bundle = TrustBundle::from_pem(trust_domain.clone(), &pem)
        .map_err(|e| format!("CA bundle {}: {e}", path.display()))?;
    Ok(bundle.into())
}

/// Parses a SPIFFE ID given on the command line, naming the flag on error.
///
/// # Errors
///
/// Says which flag held an invalid ID and why.
pub fn parse_id(flag: &str, value: &str) -> Result<SpiffeId, CliError> {
    value
        .parse()
        .map_err(|e| format!("{flag} {value:?} is not a SPIFFE ID: {e}").into())
}

/// Completes on SIGINT or SIGTERM.
pub async fn stop_signal() {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(term) => term,
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
            return;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Re-reads a configuration every second with `load` and publishes it on `tx` when it
/// differs from the current one; a load that fails is logged and the last good value stays.
/// Never returns.
pub async fn reload_every_second<T: PartialEq>(
    tx: &tokio::sync::watch::Sender<T>,
    what: &str,
    mut load: impl FnMut() -> Result<T, CliError>,
) {
    let mut interval = tokio::time::interval(std::time::Duration::from_secs(1));
    loop {
        interval.tick().await;
        match load() {
            Ok(next) => {
                tx.send_if_modified(|current| {
                    let changed = *current != next;
                    if changed {
                        tracing::info!("{what} changed");
                        *current = next;
                    }
                    changed
                });
            }
            Err(e) => tracing::warn!(error = %e, "keeping the last good {what}"),
        }
    }
}

/// A tokio runtime with `threads` worker threads; one thread means the current-thread
/// scheduler (everything on the main thread, as a proxy pinned to one core runs).
///
/// # Errors
///
/// When the runtime cannot be built (for example, no threads can be spawned).
pub fn runtime(threads: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()
    }
}

/// Logs to standard error, at `info` unless `RUST_LOG` says otherwise.
pub fn init_logging() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// As [`init_logging`], with the filter changeable while the program runs: the returned
/// [`LogFilter`] sets it from a filter string (`debug`, `meshkit_hbone=debug,info`), for the
/// admin endpoint's `/logging?level=`.
pub fn init_logging_with_filter() -> LogFilter {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let initial =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into());
    let (filter, handle) = tracing_subscriber::reload::Layer::new(initial);
    tracing_subscriber::registry()
        .with(filter)
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
        )
        .init();
    LogFilter::new(move |spec| {
        let filter = tracing_subscriber::EnvFilter::try_new(spec).map_err(|e| e.to_string())?;
        handle.reload(filter).map_err(|e| e.to_string())
    })
}

/// Logs warnings and errors only (unless `RUST_LOG` says otherwise), for programs whose own
/// output is the report.
pub fn init_logging_quiet() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// The `main` of a command-line tool: runs `job` on a runtime of `threads` workers and turns
/// its outcome into an exit code, printing an error as `NAME: error` on standard error.
pub fn run_main<F>(name: &str, threads: usize, job: F) -> std::process::ExitCode
where
    F: std::future::Future<Output = Result<(), CliError>>,
{
    match runtime(threads)
        .map_err(CliError::from)
        .and_then(|rt| rt.block_on(job))
    {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {}", error_chain(&*e));
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use rustls::{CipherSuite, NamedGroup};

    #[test]
    fn crypto_provider_follows_the_feature() {
        let provider = super::crypto_provider();
        assert_eq!(
            provider.cipher_suites[0].suite(),
            CipherSuite::TLS13_AES_128_GCM_SHA256
        );
        // aws-lc-rs supports the hybrid post-quantum group; ring has no ML-KEM.
        let ml_kem = provider
            .kx_groups
            .iter()
            .any(|group| group.name() == NamedGroup::X25519MLKEM768);
        assert_eq!(ml_kem, cfg!(feature = "aws-lc-rs"));
        // Every TLS endpoint of the binaries gets it.
        assert!(std::sync::Arc::ptr_eq(
            super::tls_settings().provider(),
            &provider
        ));
        assert!(std::sync::Arc::ptr_eq(
            super::hbone_client_config().tls.provider(),
            &provider
        ));
        assert!(std::sync::Arc::ptr_eq(
            &super::rotation_config().provider,
            &provider
        ));
    }
}
