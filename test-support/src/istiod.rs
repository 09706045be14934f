//! istiod (`pilot-discovery`, built from the `istio.io/istio` module by
//! `test-support/kube/build.sh`) against the tests' API server ([`ApiServer`]), with ambient
//! on, as a mesh run by Istio has it.
//!
//! What is set, and why (istiod reads its settings from the environment and from flags):
//!
//! | setting | value | why |
//! |---|---|---|
//! | `--kubeconfig` | the API server's, admin token | its informers and TokenReviews |
//! | `--httpAddr`, `--grpcAddr`, `--secureGRPCAddr`, `--monitoringAddr` | free loopback ports | `/ready`; plaintext xDS; xDS and the CA over TLS; metrics |
//! | `--httpsAddr ""` | off | no webhook server: nothing calls it without admission webhooks configured |
//! | `--ctrlz_port 0` | any | its introspection port cannot be turned off |
//! | `PILOT_ENABLE_AMBIENT` | `true` | the ambient index: `Address` and `Authorization` for ztunnel-like clients |
//! | `CA_TRUSTED_NODE_ACCOUNTS` | `istio-system/ztunnel` | node proxies of that ServiceAccount may request their node's workloads' certificates (`ImpersonatedIdentity`) |
//! | `ISTIOD_CUSTOM_HOST` | `localhost,127.0.0.1` | the serving certificate also names the loopback address the tests dial |
//! | `POD_NAMESPACE`, `POD_NAME`, `CLUSTER_ID` | `istio-system`, `istiod-test`, `Kubernetes` | where its CA Secret and root ConfigMap go; the cluster its clients name in `clusterid` |
//! | `ENABLE_LEADER_ELECTION` | `false` | one istiod: its controllers (the root ConfigMap publisher) start at once |
//! | `VALIDATION_WEBHOOK_CONFIG_NAME`, `INJECT_ENABLED`, `PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER`, `AMBIENT_ENABLE_STATUS` | empty, `false`, `false`, `false` | no webhooks to patch, no injector, no Deployments for Gateways, no status writes into the tests' objects |
//! | working folder | an empty one | istiod reads `./etc/cacerts` and `./var/run/secrets/...` when they exist: there are none, so it makes its own self-signed CA, kept in the Secret `istio-system/istio-ca-secret` |
//!
//! istiod is ready when `/ready` answers 200 (its caches are synced); the fixture then waits
//! for the `istio-ca-root-cert` ConfigMap it publishes and hands out the root from it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, PostParams};

use crate::apiserver::{ApiServer, Binaries, REQUIRE_ENV, scratch_dir, spawn, tail};
use crate::{KillOnDrop, free_port};

/// The name istiod's serving certificate has for its clients (its Service's).
pub const SERVER_NAME: &str = "istiod.istio-system.svc";

/// The cluster id istiod runs as; clients send it as `clusterid`.
pub const CLUSTER_ID: &str = "Kubernetes";

/// The ServiceAccount istiod trusts as node proxies' (`CA_TRUSTED_NODE_ACCOUNTS`).
pub const NODE_ACCOUNT: (&str, &str) = ("istio-system", "ztunnel");

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running istiod; stopped, and its folder removed, on drop.
#[derive(Debug)]
pub struct Istiod {
    process: KillOnDrop,
    dir: PathBuf,
    log: PathBuf,
    http: SocketAddr,
    plaintext: SocketAddr,
    secure: SocketAddr,
    monitoring: SocketAddr,
    root_pem: String,
}

impl Istiod {
    /// Starts one against `api` for the test named `test`, or returns `None` after saying
    /// why when `pilot-discovery` is not built and [`REQUIRE_ENV`] is not set.
    ///
    /// # Panics
    ///
    /// When it is missing and [`REQUIRE_ENV`] is set, or does not become ready (with the end
    /// of its log).
    pub async fn start_or_skip(api: &ApiServer, test: &str) -> Option<Self> {
        let binary = Binaries::locate()
            .ok()
            .and_then(|b| b.pilot_discovery)
            .ok_or("pilot-discovery is not built: run test-support/kube/build.sh");
        match binary {
            Ok(binary) => Some(Self::start(api, &binary).await),
            Err(why) if std::env::var_os(REQUIRE_ENV).is_some() => {
                panic!("{test}: {REQUIRE_ENV} is set and there is no istiod: {why}")
            }
            Err(why) => {
                eprintln!("{test}: skipped, no istiod: {why}");
                None
            }
        }
    }

    /// Starts `binary` against `api` (see the [module](self) table), waits until it is ready
    /// and its root ConfigMap is published.
    ///
    /// # Panics
    ///
    /// When it exits or is not ready within two minutes, with the end of its log.
    pub async fn start(api: &ApiServer, binary: &Path) -> Self {
        let started = Instant::now();
        let namespaces: Api<Namespace> = Api::all(api.client());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "istio-system" }
        }))
        .expect("a Namespace");
        match namespaces.create(&PostParams::default(), &namespace).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("creating namespace istio-system: {e}"),
        }
        api.ensure_service_account(NODE_ACCOUNT.0, NODE_ACCOUNT.1)
            .await;

        let dir = scratch_dir();
        let work = dir.join("istiod");
        std::fs::create_dir_all(&work).expect("istiod's working folder");
        let log = dir.join("istiod.log");
        let loopback = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let (http, plaintext, secure, monitoring) = (
            loopback(free_port()),
            loopback(free_port()),
            loopback(free_port()),
            loopback(free_port()),
        );
        let mut command = Command::new(binary);
        command
            .current_dir(&work)
            .env_clear()
            .env("HOME", &work)
            .env("PILOT_ENABLE_AMBIENT", "true")
            .env(
                "CA_TRUSTED_NODE_ACCOUNTS",
                format!("{}/{}", NODE_ACCOUNT.0, NODE_ACCOUNT.1),
            )
            .env("ISTIOD_CUSTOM_HOST", "localhost,127.0.0.1")
            .env("POD_NAMESPACE", "istio-system")
            .env("POD_NAME", "istiod-test")
            .env("CLUSTER_ID", CLUSTER_ID)
            .env("ENABLE_LEADER_ELECTION", "false")
            .env("VALIDATION_WEBHOOK_CONFIG_NAME", "")
            .env("INJECT_ENABLED", "false")
            .env("PILOT_ENABLE_GATEWAY_API_DEPLOYMENT_CONTROLLER", "false")
            .env("AMBIENT_ENABLE_STATUS", "false")
            .arg("discovery")
            .arg(format!("--kubeconfig={}", api.kubeconfig().display()))
            .arg(format!("--httpAddr={http}"))
            .arg(format!("--grpcAddr={plaintext}"))
            .arg(format!("--secureGRPCAddr={secure}"))
            .arg(format!("--monitoringAddr={monitoring}"))
            .arg("--httpsAddr=")
            .arg("--ctrlz_port=0");
        let process = spawn(&mut command, &log);
        let mut istiod = Self {
            process,
            dir,
            log,
            http,
            plaintext,
            secure,
            monitoring,
            root_pem: String::new(),
        };
        istiod.wait_ready(started).await;
        istiod.root_pem = istiod.wait_root(api, started).await;
        istiod
    }

    async fn wait_ready(&mut self, started: Instant) {
        loop {
            let http = self.http;
            let ready = tokio::task::spawn_blocking(move || {
                std::net::TcpStream::connect_timeout(&http, Duration::from_millis(200))
                    .is_ok()
                    .then(|| crate::http_get(http, "/ready").0)
            })
            .await
            .ok()
            .flatten();
            if ready == Some(200) {
                return;
            }
            if let Ok(Some(status)) = self.process.0.try_wait() {
                panic!("istiod exited ({status}):\n{}", tail(&self.log));
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "istiod not ready after {READY_TIMEOUT:?}:\n{}",
                tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn wait_root(&self, api: &ApiServer, started: Instant) -> String {
        let maps: Api<ConfigMap> = Api::namespaced(api.client(), "istio-system");
        loop {
            if let Ok(map) = maps.get("istio-ca-root-cert").await
                && let Some(root) = map.data.and_then(|d| d.get("root-cert.pem").cloned())
            {
                return root;
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "istiod published no istio-ca-root-cert:\n{}",
                tail(&self.log)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// xDS and the CA over TLS (istiod's 15012): verify with [`Istiod::root_pem`] and
    /// [`SERVER_NAME`] (or the IP: the certificate names `127.0.0.1` too).
    pub fn secure_addr(&self) -> SocketAddr {
        self.secure
    }

    /// Plaintext xDS (istiod's 15010; it authenticates no one there).
    pub fn plaintext_addr(&self) -> SocketAddr {
        self.plaintext
    }

    /// The HTTP port: `/ready`, and istiod's debug endpoints (`/debug/...`).
    pub fn http_addr(&self) -> SocketAddr {
        self.http
    }

    /// Prometheus metrics (istiod's 15014).
    pub fn monitoring_addr(&self) -> SocketAddr {
        self.monitoring
    }

    /// The mesh root, PEM, as istiod publishes it in `istio-ca-root-cert`.
    pub fn root_pem(&self) -> &str {
        &self.root_pem
    }

    /// The process id, to measure it.
    pub fn pid(&self) -> u32 {
        self.process.0.id()
    }

    /// The end of its log.
    pub fn log_tail(&self) -> String {
        tail(&self.log)
    }
}

impl Drop for Istiod {
    fn drop(&mut self) {
        let _ = self.process.0.kill();
        let _ = self.process.0.wait();
        if std::thread::panicking() {
            eprintln!("istiod's folder is kept: {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
