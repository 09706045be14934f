//! `hbone-connect` -> `hbone-serve` as two processes on loopback, as users run them: bytes
//! through, one log line per tunnel with the verified peer, clean stop on SIGTERM, and errors a
//! person can act on.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use meshkit_identity::test_util::TestCa;
use meshkit_identity::{TrustDomain, certs_to_pem, private_key_to_pem};
use meshkit_test_support::{
    KillOnDrop as Proc, assert_reset_after_prefix, free_port, output_within, pattern, read_exactly,
    read_until_end, reset, wait_port,
};

/// Bound on a program that must exit: far above what it needs.
const EXIT_WITHIN: Duration = Duration::from_secs(20);

const CLIENT: &str = "spiffe://cluster.local/ns/default/sa/client";
const SERVER: &str = "spiffe://cluster.local/ns/default/sa/server";

fn wait_log(path: &Path, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if std::fs::read_to_string(path).is_ok_and(|log| log.contains(needle)) {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("{} never said {needle:?}", path.display());
}

fn pki(dir: &Path) {
    let ca = TestCa::new(TrustDomain::new("cluster.local").unwrap());
    std::fs::write(dir.join("ca.crt"), ca.root_pem()).unwrap();
    for (name, id) in [("client", CLIENT), ("server", SERVER)] {
        let (chain, key) = ca.sign_params(&TestCa::leaf_params(&id.parse().unwrap()));
        std::fs::write(dir.join(format!("{name}.crt")), certs_to_pem(&chain)).unwrap();
        std::fs::write(dir.join(format!("{name}.key")), private_key_to_pem(&key)).unwrap();
    }
}

fn echo_backend() -> SocketAddr {
    echo_backend_on("127.0.0.1")
}

fn echo_backend_on(ip: &str) -> SocketAddr {
    let listener = TcpListener::bind((ip, 0)).unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for sock in listener.incoming() {
            let Ok(mut sock) = sock else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 65536];
                loop {
                    match sock.read(&mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(n) => {
                            if sock.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                    }
                }
                let _ = sock.shutdown(std::net::Shutdown::Write);
            });
        }
    });
    addr
}

/// `hbone-serve`'s flags for a server on 127.0.0.1:`hbone_port` with the PKI in `dir`,
/// admitting CLIENT.
fn serve_args(dir: &Path, hbone_port: u16) -> Vec<String> {
    let d = |f: &str| dir.join(f).display().to_string();
    vec![
        "--listen".into(),
        format!("127.0.0.1:{hbone_port}"),
        "--cert".into(),
        d("server.crt"),
        "--key".into(),
        d("server.key"),
        "--ca".into(),
        d("ca.crt"),
        "--allow-id".into(),
        CLIENT.into(),
    ]
}

/// `hbone-connect`'s flags for `listen` (LOCAL=TARGET) through `upstream`, as CLIENT with the
/// PKI in `dir`, expecting SERVER.
fn connect_args(dir: &Path, listen: String, upstream: String) -> Vec<String> {
    let d = |f: &str| dir.join(f).display().to_string();
    vec![
        "--listen".into(),
        listen,
        "--upstream".into(),
        upstream,
        "--cert".into(),
        d("client.crt"),
        "--key".into(),
        d("client.key"),
        "--ca".into(),
        d("ca.crt"),
        "--server-id".into(),
        SERVER.into(),
    ]
}

fn temp_dir(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("meshkit-tools-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn spawn(bin: &str, args: &[String], log: &Path) -> Proc {
    Proc(
        Command::new(bin)
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .unwrap(),
    )
}

fn terminate(p: &mut Proc) -> std::process::ExitStatus {
    let pid = p.0.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if let Some(status) = p.0.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn connect_and_serve_tunnel_bytes_log_peers_and_stop_on_sigterm() {
    let dir = temp_dir("pair");
    pki(&dir);
    let backend = echo_backend();
    let (hbone_port, local_port) = (free_port(), free_port());

    let mut serve = spawn(
        env!("CARGO_BIN_EXE_hbone-serve"),
        &serve_args(&dir, hbone_port),
        &dir.join("serve.log"),
    );
    wait_port(hbone_port, Duration::from_secs(20));
    let mut connect = spawn(
        env!("CARGO_BIN_EXE_hbone-connect"),
        &connect_args(
            &dir,
            format!("127.0.0.1:{local_port}={backend}"),
            format!("127.0.0.1:{hbone_port}"),
        ),
        &dir.join("connect.log"),
    );
    // Wait for its log line rather than probing the port: a probe would be a tunnel too.
    wait_log(&dir.join("connect.log"), "hbone-connect listening");

    for round in 0..3 {
        let mut sock = TcpStream::connect(("127.0.0.1", local_port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let payload: Vec<u8> = (0..100_000u32).map(|i| (i + round) as u8).collect();
        sock.write_all(&payload).unwrap();
        sock.shutdown(std::net::Shutdown::Write).unwrap();
        let (back, end) = read_until_end(&mut sock);
        end.expect("a clean end");
        assert_eq!(back, payload);
    }

    assert!(terminate(&mut connect).success());
    assert!(terminate(&mut serve).success());
    let serve_log = std::fs::read_to_string(dir.join("serve.log")).unwrap();
    let connect_log = std::fs::read_to_string(dir.join("connect.log")).unwrap();
    let tunnels = serve_log
        .lines()
        .filter(|l| l.contains("tunnel") && l.contains(CLIENT))
        .count();
    assert_eq!(
        tunnels, 3,
        "one line per tunnel with the peer:\n{serve_log}"
    );
    assert_eq!(
        connect_log
            .lines()
            .filter(|l| l.contains("tunnel") && l.contains(SERVER))
            .count(),
        3,
        "{connect_log}"
    );
    assert!(serve_log.contains("hbone-serve stopped"), "{serve_log}");
}

#[test]
fn errors_name_what_to_fix() {
    let dir = temp_dir("errors");
    pki(&dir);
    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_hbone-serve"))
            .args([
                "--cert",
                "/nonexistent/server.crt",
                "--key",
                "k",
                "--ca",
                "c",
            ])
            .args(["--allow-id", CLIENT]),
        EXIT_WITHIN,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot read certificate file /nonexistent/server.crt"),
        "{err}"
    );

    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_hbone-connect"))
            .args([
                "--listen",
                "127.0.0.1:1=127.0.0.1:2",
                "--upstream",
                "127.0.0.1:3",
            ])
            .args(["--cert", &dir.join("client.crt").display().to_string()])
            .args(["--key", &dir.join("client.key").display().to_string()])
            .args(["--ca", &dir.join("ca.crt").display().to_string()])
            .args(["--server-id", "spiffe://Cluster.local/x"]),
        EXIT_WITHIN,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--server-id") && err.contains("trust domain"),
        "{err}"
    );

    let out = output_within(
        Command::new(env!("CARGO_BIN_EXE_hbone-connect")).args(["--listen", "nonsense"]),
        EXIT_WITHIN,
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected LISTEN=TARGET"));
}

/// Accept errors (here: out of file descriptors) are the moment's, not the listener's:
/// `hbone-connect` logs them, backs off and keeps listening instead of exiting.
#[test]
fn connect_survives_accept_errors() {
    let dir = temp_dir("emfile");
    pki(&dir);
    // An HBONE "server" that never answers: the kernel completes TCP connects to it from its
    // backlog, and every tunnel waits in the TLS handshake, holding its client's socket.
    let silent = TcpListener::bind("127.0.0.1:0").expect("silent listener");
    let upstream = silent.local_addr().expect("silent address");
    let local_port = free_port();
    let log = dir.join("connect.log");
    let mut connect = Proc(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 48 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_hbone-connect"))
            .args(connect_args(
                &dir,
                format!("127.0.0.1:{local_port}=127.0.0.1:9"),
                upstream.to_string(),
            ))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start hbone-connect"),
    );
    wait_port(local_port, Duration::from_secs(20));
    // Twice as many connections as the program has descriptors.
    let held: Vec<TcpStream> = (0..96)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", local_port)).ok())
        .collect();
    assert!(held.len() > 48, "only {} connections made", held.len());
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text().contains("accept failed") {
        assert!(
            connect.0.try_wait().expect("poll").is_none(),
            "hbone-connect exited after accept errors:\n{}",
            text()
        );
        assert!(
            Instant::now() < deadline,
            "no accept error logged:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    // Still running, and still listening: a new connection is accepted (it is not refused).
    assert!(
        connect.0.try_wait().expect("poll").is_none(),
        "hbone-connect exited after accept errors:\n{}",
        text()
    );
    TcpStream::connect(("127.0.0.1", local_port)).expect("hbone-connect still listens");
    drop(silent);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hbone-serve` forwards only to its own host by default: an admitted client asking for
/// another address (here another loopback address, as it could ask for the CA's port) gets
/// 403 and no bytes; `--allow-target` widens it.
#[test]
fn serve_forwards_only_to_allowed_targets() {
    let dir = temp_dir("targets");
    pki(&dir);
    let elsewhere = echo_backend_on("127.0.0.2");
    for (round, widen) in [false, true].into_iter().enumerate() {
        let (hbone_port, local_port) = (free_port(), free_port());
        let mut args = serve_args(&dir, hbone_port);
        if widen {
            args.extend(["--allow-target".into(), "127.0.0.2".into()]);
        }
        let serve_log = dir.join(format!("serve-{round}.log"));
        let mut serve = spawn(env!("CARGO_BIN_EXE_hbone-serve"), &args, &serve_log);
        wait_port(hbone_port, Duration::from_secs(20));
        let connect_log = dir.join(format!("connect-{round}.log"));
        let mut connect = spawn(
            env!("CARGO_BIN_EXE_hbone-connect"),
            &connect_args(
                &dir,
                format!("127.0.0.1:{local_port}={elsewhere}"),
                format!("127.0.0.1:{hbone_port}"),
            ),
            &connect_log,
        );
        wait_log(&connect_log, "hbone-connect listening");
        let mut sock = TcpStream::connect(("127.0.0.1", local_port)).unwrap();
        sock.set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        sock.write_all(b"ping").unwrap();
        sock.shutdown(std::net::Shutdown::Write).unwrap();
        let (back, end) = read_until_end(&mut sock);
        assert!(terminate(&mut connect).success());
        assert!(terminate(&mut serve).success());
        let log = std::fs::read_to_string(&serve_log).unwrap();
        if widen {
            assert_eq!(back, b"ping", "allowed target: the bytes come back\n{log}");
            assert!(end.is_ok(), "allowed target: a clean end: {end:?}");
        } else {
            assert!(back.is_empty(), "refused target, yet bytes came back");
            // The CONNECT was refused: hbone-connect resets the connection (an empty answer
            // must not read as a complete one).
            assert_eq!(
                end.as_ref().map_err(std::io::Error::kind).err(),
                Some(std::io::ErrorKind::ConnectionReset),
                "refused target: {end:?}"
            );
            assert!(log.contains("target not allowed"), "{log}");
            let connect_text = std::fs::read_to_string(&connect_log).unwrap();
            assert!(connect_text.contains("403"), "{connect_text}");
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `hbone-serve` on a free port forwarding (by `--allow-target`) to `target`, and
/// `hbone-connect` listening on a free local port that tunnels there; returns the processes
/// and the local port once both are ready.
fn start_pair(dir: &Path, name: &str, target: SocketAddr) -> (Proc, Proc, u16) {
    let (hbone_port, local_port) = (free_port(), free_port());
    let mut args = serve_args(dir, hbone_port);
    args.extend(["--allow-target".into(), target.ip().to_string()]);
    let serve = spawn(
        env!("CARGO_BIN_EXE_hbone-serve"),
        &args,
        &dir.join(format!("{name}-serve.log")),
    );
    wait_port(hbone_port, Duration::from_secs(20));
    let connect_log = dir.join(format!("{name}-connect.log"));
    let connect = spawn(
        env!("CARGO_BIN_EXE_hbone-connect"),
        &connect_args(
            dir,
            format!("127.0.0.1:{local_port}={target}"),
            format!("127.0.0.1:{hbone_port}"),
        ),
        &connect_log,
    );
    wait_log(&connect_log, "hbone-connect listening");
    (serve, connect, local_port)
}

/// A reset on either application's socket reaches the other application through both tools
/// as a reset, after a prefix of what was sent; never as a clean end (RFC 9113 section 8.5).
#[test]
fn resets_cross_both_tools_as_resets() {
    const SENT: usize = 1024 * 1024;
    let dir = temp_dir("resets");
    pki(&dir);
    let backend = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = backend.local_addr().unwrap();
    let (_serve, _connect, local_port) = start_pair(&dir, "resets", target);

    // The application behind hbone-serve sends 1 MiB of a longer answer, then resets.
    let mut client = TcpStream::connect(("127.0.0.1", local_port)).unwrap();
    let (mut app, _) = backend.accept().unwrap();
    app.write_all(&pattern(SENT)).unwrap();
    read_exactly(&mut client, SENT);
    reset(app);
    let (got, end) = read_until_end(&mut client);
    assert_reset_after_prefix(&got, &end, 0);

    // The client sends 1 MiB, then resets: the application behind hbone-serve sees a reset.
    let mut client = TcpStream::connect(("127.0.0.1", local_port)).unwrap();
    let (mut app, _) = backend.accept().unwrap();
    client.write_all(&pattern(SENT)).unwrap();
    read_exactly(&mut app, SENT);
    reset(client);
    let (got, end) = read_until_end(&mut app);
    assert_reset_after_prefix(&got, &end, 0);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The HBONE server's accept loop outlives accept errors too (here: out of file descriptors,
/// from silent sockets that never start TLS): `hbone-serve` logs them, keeps listening, and
/// serves the next honest client once descriptors are free again.
#[test]
fn serve_survives_accept_errors() {
    let dir = temp_dir("serve-emfile");
    pki(&dir);
    let backend = echo_backend();
    let (hbone_port, local_port) = (free_port(), free_port());
    let log = dir.join("serve.log");
    let _serve = Proc(
        Command::new("sh")
            .arg("-c")
            .arg("ulimit -n 48 && exec \"$0\" \"$@\"")
            .arg(env!("CARGO_BIN_EXE_hbone-serve"))
            .args(serve_args(&dir, hbone_port))
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("start hbone-serve"),
    );
    wait_port(hbone_port, Duration::from_secs(20));
    // Silent sockets from several loopback sources (a per-source limit must not be what
    // closes them), twice as many as the program has descriptors.
    let held: Vec<TcpStream> = (0..96u8)
        .filter_map(|i| {
            let sock =
                socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).ok()?;
            sock.bind(&SocketAddr::from(([127, 0, 1, 1 + i % 8], 0)).into())
                .ok()?;
            sock.connect(&SocketAddr::from(([127, 0, 0, 1], hbone_port)).into())
                .ok()?;
            Some(sock.into())
        })
        .collect();
    assert!(held.len() > 48, "only {} connections made", held.len());
    let text = || std::fs::read_to_string(&log).unwrap_or_default();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !text().contains("accept failed") {
        assert!(
            Instant::now() < deadline,
            "no accept error logged:\n{}",
            text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    // An honest client is served afterwards, by the same listener.
    let mut connect = spawn(
        env!("CARGO_BIN_EXE_hbone-connect"),
        &connect_args(
            &dir,
            format!("127.0.0.1:{local_port}={backend}"),
            format!("127.0.0.1:{hbone_port}"),
        ),
        &dir.join("connect.log"),
    );
    wait_log(&dir.join("connect.log"), "hbone-connect listening");
    let mut sock = TcpStream::connect(("127.0.0.1", local_port)).unwrap();
    sock.write_all(b"still serving").unwrap();
    sock.shutdown(std::net::Shutdown::Write).unwrap();
    let (back, end) = read_until_end(&mut sock);
    assert!(end.is_ok(), "{end:?}\n{}", text());
    assert_eq!(back, b"still serving");
    assert!(terminate(&mut connect).success());
    let _ = std::fs::remove_dir_all(&dir);
}
