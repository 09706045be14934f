//! A real Kubernetes API server for tests: etcd and kube-apiserver, built from their Go
//! modules by `test-support/kube/build.sh`, started on free loopback ports in a folder of
//! their own, with the CRDs the control plane reads installed.
//!
//! What the fixture sets up, as a cluster's control plane would:
//! - a serving CA of its own and a certificate for `127.0.0.1` and `localhost`;
//! - a ServiceAccount signing key and issuer, so TokenRequest mints tokens that TokenReview
//!   checks, optionally bound to a Pod;
//! - an admin bearer token (group `system:masters`) and RBAC authorization for everyone else;
//! - the Gateway API standard channel's CRDs and Istio's, read from the Go module cache.
//!
//! There is no kubelet and no controller-manager: a test creates Pods and patches their status
//! (IP, Ready) itself, and creates the ServiceAccounts it mints tokens for (the ServiceAccount
//! admission plugin is off, since nothing creates a namespace's `default` account).
//!
//! Where the programs are not built, [`ApiServer::start_or_skip`] says so and the test
//! passes without running, unless `MESHKIT_REQUIRE_KUBE` is set (CI sets it), where it
//! panics.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::client::ConfigExt as _;
use rustls::crypto::CryptoProvider;
use serde_json::Value;
use tower::ServiceBuilder;

use crate::{KillOnDrop, free_port};

/// The environment variable that makes a missing API server a failure instead of a skip.
pub const REQUIRE_ENV: &str = "MESHKIT_REQUIRE_KUBE";

/// The environment variable naming the folder `build.sh` wrote (default: `target/kube` of
/// the workspace).
pub const DIR_ENV: &str = "MESHKIT_KUBE_DIR";

/// The ServiceAccount token issuer the API server signs with.
pub const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// How long start-up may take before the fixture gives up: the first start of a freshly
/// built kube-apiserver on a loaded two-core machine takes several seconds.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// What `build.sh` made: the two programs and where the CRDs are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// The etcd program.
    pub etcd: PathBuf,
    /// The kube-apiserver program.
    pub kube_apiserver: PathBuf,
    /// CRD files, and folders of them, to install.
    pub crds: Vec<PathBuf>,
    /// istiod (`pilot-discovery`), when it was built ([`crate::istiod`]).
    pub pilot_discovery: Option<PathBuf>,
}

impl Binaries {
    /// The programs and CRD sources in [`DIR_ENV`], or in `target/kube` of the workspace.
    ///
    /// # Errors
    ///
    /// Why they cannot be used, with the command that builds them.
    pub fn locate() -> Result<Self, String> {
        let dir = std::env::var_os(DIR_ENV).map_or_else(
            || Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/kube"),
            PathBuf::from,
        );
        let etcd = dir.join("bin/etcd");
        let kube_apiserver = dir.join("bin/kube-apiserver");
        let crds_list = dir.join("crds");
        for path in [&etcd, &kube_apiserver, &crds_list] {
            if !path.is_file() {
                return Err(format!(
                    "{} is missing: build the API server with test-support/kube/build.sh",
                    path.display()
                ));
            }
        }
        let crds = std::fs::read_to_string(&crds_list)
            .map_err(|e| format!("reading {}: {e}", crds_list.display()))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(PathBuf::from)
            .collect();
        let pilot_discovery = Some(dir.join("bin/pilot-discovery")).filter(|p| p.is_file());
        Ok(Self {
            etcd,
            kube_apiserver,
            crds,
            pilot_discovery,
        })
    }
}

/// A running etcd and kube-apiserver; both are stopped and their folder removed on drop.
pub struct ApiServer {
    // Fields drop in order: the API server stops before its storage.
    apiserver: KillOnDrop,
    etcd: KillOnDrop,
    /// How kube-apiserver is started, to start it again.
    command: Command,
    apiserver_log: PathBuf,
    /// kube-apiserver processes started so far.
    starts: u32,
    dir: PathBuf,
    url: String,
    ca_pem: String,
    admin_token: String,
    kubeconfig: PathBuf,
    client: kube::Client,
    ready_after: Duration,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiServer")
            .field("url", &self.url)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl ApiServer {
    /// Starts one for the test named `test`, or returns `None` after saying why when the
    /// programs are not built and [`REQUIRE_ENV`] is not set.
    ///
    /// # Panics
    ///
    /// When the programs are missing and [`REQUIRE_ENV`] is set, or when they are there but
    /// do not start (with the end of their logs).
    pub async fn start_or_skip(test: &str) -> Option<Self> {
        match Binaries::locate() {
            Ok(binaries) => Some(Self::start(&binaries).await),
            Err(why) if std::env::var_os(REQUIRE_ENV).is_some() => {
                panic!("{test}: {REQUIRE_ENV} is set and there is no API server: {why}")
            }
            Err(why) => {
                eprintln!("{test}: skipped, no Kubernetes API server: {why}");
                None
            }
        }
    }

    /// Starts etcd and kube-apiserver from `binaries`, waits until `/readyz` answers 200,
    /// and installs and waits for the CRDs.
    ///
    /// # Panics
    ///
    /// When either program does not start, with the end of its log.
    pub async fn start(binaries: &Binaries) -> Self {
        let started = Instant::now();
        let dir = scratch_dir();
        let pki = Pki::write(&dir);

        let etcd_port = free_port();
        let etcd_peer_port = free_port();
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");
        let etcd = spawn(
            Command::new(&binaries.etcd)
                .arg(format!("--data-dir={}", dir.join("etcd").display()))
                .arg(format!("--listen-client-urls={etcd_url}"))
                .arg(format!("--advertise-client-urls={etcd_url}"))
                .arg(format!("--listen-peer-urls={peer_url}"))
                .arg(format!("--initial-advertise-peer-urls={peer_url}"))
                .arg(format!("--initial-cluster=default={peer_url}"))
                // A test's data is thrown away: no fsync, and a small log.
                .args(["--unsafe-no-fsync", "--log-level=warn"]),
            &dir.join("etcd.log"),
        );

        let port = free_port();
        let url = format!("https://127.0.0.1:{port}");
        let mut command = Command::new(&binaries.kube_apiserver);
        command
            .arg(format!("--etcd-servers={etcd_url}"))
            .args(["--bind-address=127.0.0.1", "--advertise-address=127.0.0.1"])
            .arg(format!("--secure-port={port}"))
            .arg(format!("--cert-dir={}", dir.join("certs").display()))
            .arg(format!("--tls-cert-file={}", pki.serving_cert.display()))
            .arg(format!(
                "--tls-private-key-file={}",
                pki.serving_key.display()
            ))
            .arg(format!("--token-auth-file={}", pki.tokens.display()))
            .arg(format!("--service-account-issuer={ISSUER}"))
            .arg(format!(
                "--service-account-key-file={}",
                pki.sa_public_key.display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                pki.sa_key.display()
            ))
            .args([
                "--authorization-mode=RBAC",
                "--service-cluster-ip-range=10.96.0.0/16",
                "--allow-privileged=true",
                // Nothing creates a namespace's `default` ServiceAccount without a
                // controller-manager; Pods name the accounts the tests create.
                "--disable-admission-plugins=ServiceAccount",
                // The `kubernetes` Service's endpoint would be the loopback address,
                // which the reconciler refuses.
                "--endpoint-reconciler-type=none",
                "--v=0",
            ]);
        let apiserver_log = dir.join("kube-apiserver.log");
        let apiserver = spawn(&mut command, &apiserver_log);

        let kubeconfig = dir.join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            kubeconfig_yaml(&url, &pki.ca_pem, &pki.admin_token),
        )
        .expect("write the kubeconfig");
        let client = client_for(&url, &pki.ca_pem, &pki.admin_token);

        let mut server = Self {
            apiserver,
            etcd,
            command,
            apiserver_log,
            starts: 1,
            dir,
            url,
            ca_pem: pki.ca_pem,
            admin_token: pki.admin_token,
            kubeconfig,
            client,
            ready_after: Duration::ZERO,
        };
        server.wait_ready(started).await;
        server.ready_after = started.elapsed();
        server.install_crds(&binaries.crds).await;
        server
    }

    /// A client with the admin token (group `system:masters`).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// A client that presents `token` (a ServiceAccount's, say) instead of the admin's.
    pub fn client_with_token(&self, token: &str) -> kube::Client {
        client_for(&self.url, &self.ca_pem, token)
    }

    /// The API server's address, `https://127.0.0.1:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The serving CA's certificate (PEM).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The admin bearer token.
    pub fn admin_token(&self) -> &str {
        &self.admin_token
    }

    /// A kubeconfig file for the admin, for programs started with `--kubeconfig`.
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// How long the API server took from the start of etcd to its first ready `/readyz`.
    pub fn ready_after(&self) -> Duration {
        self.ready_after
    }

    /// The operating system's ids of the kube-apiserver and etcd processes (to read their
    /// memory, say).
    pub fn pids(&self) -> (u32, u32) {
        (self.apiserver.0.id(), self.etcd.0.id())
    }

    /// Stops kube-apiserver (SIGKILL, as a crash or a lost node would) and starts it again on
    /// the same port over the same etcd, then waits until it is ready: its watch cache starts
    /// anew, so a watch resumed from before answers 410 Gone.
    ///
    /// # Panics
    ///
    /// When it does not come back, with the end of its log.
    pub async fn restart(&mut self) {
        let _ = self.apiserver.0.kill();
        let _ = self.apiserver.0.wait();
        self.starts += 1;
        self.apiserver_log = self.dir.join(format!("kube-apiserver.{}.log", self.starts));
        self.apiserver = spawn(&mut self.command, &self.apiserver_log);
        let started = Instant::now();
        self.wait_ready(started).await;
    }

    /// The address kube-apiserver listens on.
    pub fn addr(&self) -> std::net::SocketAddr {
        self.url
            .trim_start_matches("https://")
            .parse()
            .expect("the URL is https://IP:PORT")
    }

    /// A client of the API server at `url` instead (a relay in front of it, say; its
    /// serving certificate names `127.0.0.1`), presenting `token`.
    pub fn client_at(&self, url: &str, token: &str) -> kube::Client {
        client_for(url, &self.ca_pem, token)
    }

    /// The ServiceAccount `namespace/name`, created when it does not exist.
    ///
    /// # Panics
    ///
    /// When the API server refuses it.
    pub async fn ensure_service_account(&self, namespace: &str, name: &str) {
        let api: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let account = ServiceAccount {
            metadata: kube::api::ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &account).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(e) => panic!("creating ServiceAccount {namespace}/{name}: {e}"),
        }
    }

    /// Creates or updates every object of `yaml` (documents of any kind the API server
    /// serves) by server-side apply, then sets the `status` a document carries, as a kubelet
    /// or controller would (field manager `other-controller`).
    ///
    /// # Panics
    ///
    /// When a document is refused.
    pub async fn apply(&self, yaml: &str) {
        let documents: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("test YAML");
        let documents: Vec<Value> = documents.into_iter().filter(|d| !d.is_null()).collect();
        if let Err(e) = self.apply_documents(&documents, false).await {
            panic!("applying: {e}");
        }
    }

    /// Applies `documents` as [`ApiServer::apply`] does, or as a dry run (nothing stored,
    /// everything validated and admitted, no status set) when `dry_run`. Returns how many,
    /// or the error of the first refused.
    ///
    /// # Errors
    ///
    /// A kind the API server does not serve, or a document it refuses.
    pub async fn apply_documents(
        &self,
        documents: &[Value],
        dry_run: bool,
    ) -> Result<usize, String> {
        use kube::api::{DynamicObject, GroupVersionKind, Patch, PatchParams};
        use kube::discovery::{Discovery, Scope};
        let discovery = Discovery::new(self.client())
            .run()
            .await
            .map_err(|e| format!("discovery: {e}"))?;
        for document in documents {
            let api_version = document["apiVersion"].as_str().unwrap_or_default();
            let kind = document["kind"].as_str().unwrap_or_default();
            let name = document["metadata"]["name"].as_str().unwrap_or_default();
            let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
            let (resource, capabilities) = discovery
                .resolve_gvk(&GroupVersionKind::gvk(group, version, kind))
                .ok_or_else(|| format!("{api_version} {kind} is not served"))?;
            let objects: Api<DynamicObject> = if capabilities.scope == Scope::Namespaced {
                let ns = document["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or("default");
                Api::namespaced_with(self.client(), ns, &resource)
            } else {
                Api::all_with(self.client(), &resource)
            };
            let mut params = PatchParams::apply("meshkit-test").force();
            params.dry_run = dry_run;
            objects
                .patch(name, &params, &Patch::Apply(document))
                .await
                .map_err(|e| format!("{kind} {name}: {e}"))?;
            if let Some(status) = document.get("status").filter(|_| !dry_run) {
                let params = PatchParams {
                    field_manager: Some("other-controller".into()),
                    ..PatchParams::default()
                };
                objects
                    .patch_status(
                        name,
                        &params,
                        &Patch::Merge(serde_json::json!({ "status": status })),
                    )
                    .await
                    .map_err(|e| format!("the status of {kind} {name}: {e}"))?;
            }
        }
        Ok(documents.len())
    }

    /// Mints a token for the ServiceAccount `namespace/name` with TokenRequest, for
    /// `audiences`, valid for an hour, bound to `pod` (a Pod of that namespace) when given.
    ///
    /// # Panics
    ///
    /// When the API server refuses it (the account or the Pod does not exist, say).
    pub async fn service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
        pod: Option<&Pod>,
    ) -> String {
        let api: Api<ServiceAccount> = Api::namespaced(self.client(), namespace);
        let request = TokenRequest {
            spec: Some(TokenRequestSpec {
                audiences: Some(audiences.iter().map(|a| (*a).to_owned()).collect()),
                expiration_seconds: Some(3600),
                bound_object_ref: pod.map(|pod| BoundObjectReference {
                    api_version: Some("v1".into()),
                    kind: Some("Pod".into()),
                    name: pod.metadata.name.clone(),
                    uid: pod.metadata.uid.clone(),
                }),
                ..Default::default()
            }),
            ..Default::default()
        };
        let answer = api
            .create_token_request(name, &PostParams::default(), &request)
            .await
            .unwrap_or_else(|e| panic!("TokenRequest for {namespace}/{name}: {e}"));
        answer
            .status
            .and_then(|status| status.token)
            .expect("a TokenRequest answer carries the token")
    }

    /// A token for the ServiceAccount `namespace/name` and `audiences` as TokenRequest mints
    /// it, signed with the API server's own key, but issued two hours ago and expired an hour
    /// ago: TokenRequest cannot mint one (its shortest lifetime is ten minutes).
    ///
    /// # Panics
    ///
    /// When the API server refuses the TokenRequest it starts from.
    pub async fn expired_service_account_token(
        &self,
        namespace: &str,
        name: &str,
        audiences: &[&str],
    ) -> String {
        use ring::signature::{ECDSA_P256_SHA256_FIXED_SIGNING, EcdsaKeyPair};
        use rustls_pki_types::pem::PemObject as _;
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let fresh = self
            .service_account_token(namespace, name, audiences, None)
            .await;
        let mut parts = fresh.split('.');
        let header = parts.next().expect("a JWT header");
        let claims = b64
            .decode(parts.next().expect("JWT claims"))
            .expect("base64url claims");
        let mut claims: Value = serde_json::from_slice(&claims).expect("JSON claims");
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs();
        claims["iat"] = (now - 7200).into();
        claims["nbf"] = (now - 7200).into();
        claims["exp"] = (now - 3600).into();
        let signing_input = format!(
            "{header}.{}",
            b64.encode(serde_json::to_vec(&claims).expect("JSON"))
        );
        let key = rustls_pki_types::PrivatePkcs8KeyDer::from_pem_file(
            self.dir.join("service-account.key"),
        )
        .expect("the ServiceAccount signing key");
        let rng = ring::rand::SystemRandom::new();
        let pair = EcdsaKeyPair::from_pkcs8(
            &ECDSA_P256_SHA256_FIXED_SIGNING,
            key.secret_pkcs8_der(),
            &rng,
        )
        .expect("a P-256 key");
        let signature = pair
            .sign(&rng, signing_input.as_bytes())
            .expect("a signature");
        format!("{signing_input}.{}", b64.encode(signature.as_ref()))
    }

    async fn wait_ready(&mut self, started: Instant) {
        loop {
            let request = http::Request::get("/readyz")
                .body(Vec::new())
                .expect("a request");
            if self.client.request_text(request).await.is_ok() {
                return;
            }
            for (name, child) in [
                ("kube-apiserver", &mut self.apiserver.0),
                ("etcd", &mut self.etcd.0),
            ] {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!(
                        "{name} exited ({status}):\n{}\netcd:\n{}",
                        tail(&self.apiserver_log),
                        tail(&self.dir.join("etcd.log"))
                    );
                }
            }
            assert!(
                started.elapsed() < READY_TIMEOUT,
                "kube-apiserver not ready after {READY_TIMEOUT:?}:\n{}\netcd:\n{}",
                tail(&self.apiserver_log),
                tail(&self.dir.join("etcd.log"))
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Creates every CustomResourceDefinition in `sources` (files, or folders of `*.yaml`
    /// files; other kinds of documents are left out) and waits until each is Established.
    async fn install_crds(&self, sources: &[PathBuf]) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client());
        let mut names = Vec::new();
        for crd in sources.iter().flat_map(|source| read_crds(source)) {
            let name = crd.metadata.name.clone().expect("a CRD has a name");
            api.create(&PostParams::default(), &crd)
                .await
                .unwrap_or_else(|e| panic!("creating CRD {name}: {e}"));
            names.push(name);
        }
        let deadline = Instant::now() + READY_TIMEOUT;
        for name in names {
            loop {
                let crd = api.get(&name).await.expect("read back a CRD");
                let established = crd
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                if established {
                    break;
                }
                assert!(Instant::now() < deadline, "CRD {name} not Established");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        // Both stopped before their folder goes: etcd writes into it until it exits.
        for child in [&mut self.apiserver.0, &mut self.etcd.0] {
            let _ = child.kill();
            let _ = child.wait();
        }
        // A failed test keeps the logs to read.
        if std::thread::panicking() {
            eprintln!("the API server's folder is kept: {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A folder for one API server under the system's temporary folder.
pub(crate) fn scratch_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "meshkit-kube-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create the API server's folder");
    // The signing key and the admin token are in it: the user's alone.
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))
        .expect("make the API server's folder private");
    dir
}

/// The API server's credentials, written into its folder.
struct Pki {
    ca_pem: String,
    serving_cert: PathBuf,
    serving_key: PathBuf,
    sa_key: PathBuf,
    sa_public_key: PathBuf,
    tokens: PathBuf,
    admin_token: String,
}

impl Pki {
    fn write(dir: &Path) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).expect("CA parameters");
        ca.distinguished_name
            .push(DnType::CommonName, "meshkit test kube-apiserver CA");
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().expect("a CA key");
        let ca_pem = ca.self_signed(&ca_key).expect("the CA certificate").pem();
        let issuer = Issuer::new(ca, ca_key);

        let mut serving = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".into()])
            .expect("serving parameters");
        serving
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        let serving_key = KeyPair::generate().expect("a serving key");
        let serving_pem = serving
            .signed_by(&serving_key, &issuer)
            .expect("the serving certificate")
            .pem();

        let sa_key = KeyPair::generate().expect("a ServiceAccount signing key");
        let admin_token = random_token();

        let files = Self {
            ca_pem,
            serving_cert: dir.join("serving.crt"),
            serving_key: dir.join("serving.key"),
            sa_key: dir.join("service-account.key"),
            sa_public_key: dir.join("service-account.pub"),
            tokens: dir.join("tokens.csv"),
            admin_token,
        };
        std::fs::write(&files.serving_cert, serving_pem).expect("write serving.crt");
        std::fs::write(&files.serving_key, serving_key.serialize_pem()).expect("write serving.key");
        std::fs::write(&files.sa_key, sa_key.serialize_pem()).expect("write the SA key");
        std::fs::write(&files.sa_public_key, sa_key.public_key_pem()).expect("write the SA key");
        // token,user,uid,"groups"
        std::fs::write(
            &files.tokens,
            format!(
                "{},meshkit-admin,meshkit-admin,\"system:masters\"\n",
                files.admin_token
            ),
        )
        .expect("write tokens.csv");
        files
    }
}

/// 32 random bytes as hex, from the ring provider's random source.
fn random_token() -> String {
    let mut bytes = [0u8; 32];
    rustls::crypto::ring::default_provider()
        .secure_random
        .fill(&mut bytes)
        .expect("random bytes");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn kubeconfig_yaml(url: &str, ca_pem: &str, token: &str) -> String {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem);
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: meshkit-test\n  cluster:\n    server: \
         {url}\n    certificate-authority-data: {ca}\nusers:\n- name: meshkit-admin\n  user:\n    \
         token: {token}\ncontexts:\n- name: meshkit-test\n  context:\n    cluster: meshkit-test\n    \
         user: meshkit-admin\ncurrent-context: meshkit-test\n"
    )
}

/// A kube client for `url` that trusts `ca_pem` and sends `token`, over rustls with the ring
/// provider passed in (never the process default).
fn client_for(url: &str, ca_pem: &str, token: &str) -> kube::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = kube::Config::new(url.parse().expect("the API server's URL"));
    config.auth_info.token = Some(token.to_owned().into());
    client_with_provider(&config, ca_pem, provider)
}

fn client_with_provider(
    config: &kube::Config,
    ca_pem: &str,
    provider: Arc<CryptoProvider>,
) -> kube::Client {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots
            .add(cert.expect("a PEM certificate"))
            .expect("a usable CA certificate");
    }
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("the provider's protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_only()
        .enable_http1()
        .wrap_connector(http);
    let hyper = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build::<_, kube::client::Body>(https);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer().expect("the token's auth layer"))
        .map_err(tower::BoxError::from)
        .service(hyper);
    kube::Client::new(service, "default")
}

/// The CustomResourceDefinitions in a file, or in the `*.yaml` files of a folder.
fn read_crds(source: &Path) -> Vec<CustomResourceDefinition> {
    let files = if source.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(source)
            .unwrap_or_else(|e| panic!("reading {}: {e}", source.display()))
            .map(|entry| entry.expect("a folder entry").path())
            .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
            .collect();
        files.sort();
        files
    } else {
        vec![source.to_owned()]
    };
    let mut crds = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file)
            .unwrap_or_else(|e| panic!("reading {}: {e}", file.display()));
        let documents: Vec<Value> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("parsing {}: {e}", file.display()));
        for doc in documents {
            if doc.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition") {
                crds.push(
                    serde_json::from_value(doc)
                        .unwrap_or_else(|e| panic!("a CRD in {}: {e}", file.display())),
                );
            }
        }
    }
    crds
}

pub(crate) fn spawn(command: &mut Command, log: &Path) -> KillOnDrop {
    let file = std::fs::File::create(log).expect("create a log file");
    let child = command
        .stdin(Stdio::null())
        .stdout(file.try_clone().expect("the log file again"))
        .stderr(file)
        .spawn()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    KillOnDrop(child)
}

/// The last 40 lines of a log file.
pub fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}
