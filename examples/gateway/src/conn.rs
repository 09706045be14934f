//! One client connection: the HTTP version told within a bound, hyper serving it under the
//! gateway's limits, the connection closed once it stays without a request in flight, and
//! ended when a write to it stalls for the write-stall timeout (the client stopped reading).
//! Each request is observed here (span, trace context, metrics, access log: see
//! [`Observation`]); a drain shuts the connection down gracefully (HTTP/2 GOAWAY, HTTP/1.1
//! closed after the answer in flight: hyper's graceful shutdown makes that answer say
//! `connection: close` when its head is still to be written).

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::task::AtomicWaker;
use hyper::body::{Body as HttpBody, Frame, Incoming, SizeHint};
use hyper::server::conn::{http1, http2};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};
use tracing::Instrument;

use crate::Shared;
use crate::observe::Observation;
use crate::proxy::Body;
use crate::stack::{self, Stack};

/// What an HTTP/2 client sends first (RFC 9113, 3.4); anything else is HTTP/1.
const H2_PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// How long a connection closed for idleness may take to finish (its GOAWAY, a last
/// flush) before it is dropped: a peer that does not read cannot hold it.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The HTTP/1 read buffer is at most this large, or the largest head if that is more.
const HTTP1_MAX_BUFFER: usize = 64 * 1024;

/// Serves one client connection (TLS already terminated) until it ends, the client
/// breaks a bound, it stays idle for `settings.idle_timeout`, or the gateway drains.
pub(crate) async fn serve<IO>(shared: &Arc<Shared>, stack: Stack, mut io: IO, client: stack::Client)
where
    IO: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let settings = &shared.settings;
    let mut preface = [0u8; 24];
    let sniffed = match tokio::time::timeout(settings.sniff_timeout, sniff(&mut io, &mut preface))
        .await
    {
        Ok(Ok(0)) => return,
        Ok(Ok(n)) => n,
        Ok(Err(e)) => {
            tracing::debug!(client = %client.addr, error = %e, "client connection failed before a request");
            return;
        }
        Err(_) => {
            tracing::debug!(client = %client.addr, "client sent no request in time; closed");
            return;
        }
    };
    let h2 = sniffed == H2_PREFACE.len() && preface == *H2_PREFACE;
    let io = TokioIo::new(WriteStall::new(
        Prefixed {
            prefix: preface,
            start: 0,
            end: sniffed,
            io,
        },
        settings.write_stall_timeout,
    ));

    let activity = Arc::new(Activity::new());
    let in_flight = activity.clone();
    let observer = shared.clone();
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        req.extensions_mut().insert(client);
        let guard = InFlight::new(in_flight.clone());
        // Dropped with this future if the client leaves before the answer: recorded then.
        let mut observation = Observation::start(&observer, client.addr, &mut req);
        let span = observation.span().clone();
        let answer = tower::ServiceExt::oneshot(stack.clone(), req).instrument(span);
        async move {
            let mut resp = answer.await?;
            observation.answered(&mut resp);
            Ok::<_, Infallible>(resp.map(|body| Tracked {
                body,
                observation,
                _in_flight: guard,
            }))
        }
    });
    let drain = shared.drain.subscribe();

    let result = if h2 {
        let mut builder = http2::Builder::new(TokioExecutor::new());
        builder
            .timer(TokioTimer::new())
            .keep_alive_interval(settings.http2_keepalive_interval)
            .keep_alive_timeout(settings.http2_keepalive_timeout)
            .max_concurrent_streams(settings.http2_max_concurrent_streams)
            .max_header_list_size(u32::try_from(settings.max_header_bytes).unwrap_or(u32::MAX));
        let conn = builder.serve_connection(io, service);
        until_idle(
            conn,
            |c| c.graceful_shutdown(),
            &activity,
            settings.idle_timeout,
            drain,
        )
        .await
    } else {
        let mut builder = http1::Builder::new();
        // A client that does not finish its request head in time is dropped (slowloris).
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(settings.header_read_timeout)
            .max_header_size(settings.max_header_bytes)
            .max_buf_size(settings.max_header_bytes.max(HTTP1_MAX_BUFFER));
        let conn = builder.serve_connection(io, service);
        until_idle(
            conn,
            |c| c.graceful_shutdown(),
            &activity,
            settings.idle_timeout,
            drain,
        )
        .await
    };
    if let Err(e) = result {
        tracing::debug!(client = %client.addr, error = %e, "client connection ended with an error");
    }
}

/// Reads until the bytes so far stop matching the HTTP/2 preface or match all of it; the
/// number read (0: the peer closed without sending anything).
async fn sniff<IO: AsyncRead + Unpin>(io: &mut IO, buf: &mut [u8; 24]) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() && buf[..n] == H2_PREFACE[..n] {
        let read = io.read(&mut buf[n..]).await?;
        if read == 0 {
            break;
        }
        n += read;
    }
    Ok(n)
}

/// Runs `conn` until it ends; once it has had no request in flight for `timeout`, shuts it
/// down with `shutdown` and gives it [`SHUTDOWN_GRACE`] to finish. When the gateway drains,
/// shuts it down the same way and lets it finish its requests in flight: the serve loop
/// closes it at the drain's deadline.
async fn until_idle<C, E>(
    conn: C,
    shutdown: impl FnOnce(Pin<&mut C>),
    activity: &Activity,
    timeout: Duration,
    mut drain: watch::Receiver<Option<tokio::time::Instant>>,
) -> Result<(), E>
where
    C: Future<Output = Result<(), E>>,
{
    let mut conn = std::pin::pin!(conn);
    // Polled only when the drain channel woke it: the connection's task wakes several times
    // per request, and this branch would otherwise poll the channel each time.
    let draining = WhenWoken::new(async move {
        if drain.wait_for(Option::is_some).await.is_err() {
            std::future::pending::<()>().await;
        }
    });
    let drained = tokio::select! {
        result = conn.as_mut() => return result,
        () = activity.idle_for(timeout) => false,
        () = draining => true,
    };
    shutdown(conn.as_mut());
    if drained {
        tracing::debug!(
            "gateway draining; closing the client connection once its requests are answered"
        );
        return conn.await;
    }
    tracing::debug!("client connection idle; closing");
    tokio::time::timeout(SHUTDOWN_GRACE, conn)
        .await
        .unwrap_or(Ok(()))
}

/// A future polled again only after it woke itself (and once at the start). Beside a busy
/// future in a `select!`, a branch that waits for something rare costs an atomic swap when the
/// task wakes for another branch, instead of a poll of its own.
struct WhenWoken<F> {
    inner: Pin<Box<F>>,
    relay: Arc<Relay>,
    /// The waker `inner` is polled with: it marks `relay` woken and wakes the task.
    waker: Waker,
}

/// Whether [`WhenWoken`]'s future woke, and the task to wake when it does.
struct Relay {
    woken: AtomicBool,
    task: AtomicWaker,
}

impl<F: Future> WhenWoken<F> {
    fn new(inner: F) -> Self {
        let relay = Arc::new(Relay {
            woken: AtomicBool::new(true),
            task: AtomicWaker::new(),
        });
        Self {
            inner: Box::pin(inner),
            waker: Waker::from(relay.clone()),
            relay,
        }
    }
}

impl<F: Future> Future for WhenWoken<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        // Registered before the flag is read: a wake-up in between still reaches the task.
        this.relay.task.register(cx.waker());
        if !this.relay.woken.swap(false, Ordering::AcqRel) {
            return Poll::Pending;
        }
        this.inner
            .as_mut()
            .poll(&mut Context::from_waker(&this.waker))
    }
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.woken.store(true, Ordering::Release);
        self.task.wake();
    }
}

/// Requests in flight on one connection, and when the last one ended. Counted with atomics
/// and read by a timer that wakes once per idle period: a request costs no wake-up and no
/// timer of its own.
struct Activity {
    in_flight: AtomicUsize,
    /// When the connection last became idle, in nanoseconds since `base`.
    idle_since: AtomicU64,
    base: tokio::time::Instant,
}

impl Activity {
    fn new() -> Self {
        Self {
            in_flight: AtomicUsize::new(0),
            idle_since: AtomicU64::new(0),
            base: tokio::time::Instant::now(),
        }
    }

    fn start(&self) {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
    }

    fn end(&self) {
        let since = u64::try_from(self.base.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.idle_since.store(since, Ordering::Release);
        self.in_flight.fetch_sub(1, Ordering::AcqRel);
    }

    /// Returns once no request has been in flight for `timeout`.
    async fn idle_for(&self, timeout: Duration) {
        loop {
            let at = if self.in_flight.load(Ordering::Acquire) > 0 {
                tokio::time::Instant::now() + timeout
            } else {
                let since = Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
                self.base + since + timeout
            };
            tokio::time::sleep_until(at).await;
            let since = Duration::from_nanos(self.idle_since.load(Ordering::Acquire));
            if self.in_flight.load(Ordering::Acquire) == 0 && self.base.elapsed() >= since + timeout
            {
                return;
            }
        }
    }
}

/// Counts one request in flight on its connection, from its head until its answer's body
/// has been sent (or dropped).
struct InFlight(Arc<Activity>);

impl InFlight {
    fn new(activity: Arc<Activity>) -> Self {
        activity.start();
        Self(activity)
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// An answer's body that keeps its request counted as in flight, and observed: its bytes, its
/// end. Dropping it (the answer sent, or abandoned) records the request.
struct Tracked {
    body: Body,
    observation: Observation,
    _in_flight: InFlight,
}

impl HttpBody for Tracked {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.body).poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.observation.sent(data.len());
                }
                if this.body.is_end_stream() {
                    this.observation.ended();
                }
            }
            Poll::Ready(Some(Err(_))) => this.observation.body_failed(),
            Poll::Ready(None) => this.observation.ended(),
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Tracked {
    fn drop(&mut self) {
        // An answer with no body to send (or whose end hyper saw without polling) is whole.
        if self.body.is_end_stream() {
            self.observation.ended();
        }
    }
}

/// The connection, with the bytes the sniff read put back in front.
struct Prefixed<IO> {
    prefix: [u8; 24],
    start: usize,
    end: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Prefixed<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.start < this.end {
            let n = buf.remaining().min(this.end - this.start);
            buf.put_slice(&this.prefix[this.start..this.start + n]);
            this.start += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Prefixed<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// The connection hyper serves, with its writes bounded in time: a write, flush or shutdown
/// that has to wait (the peer's receive window and the socket's send buffer are full) starts
/// a timer, any of them that makes progress stops it, and once it fires the waiting call
/// fails with [`io::ErrorKind::TimedOut`], which ends the connection (hyper drops what it
/// was serving, the backend connection of an unfinished answer with it).
///
/// Cheap on the way that does not wait: one branch per call. The timer is allocated the
/// first time a write waits and reset, not reallocated, for every later stall.
struct WriteStall<IO> {
    io: IO,
    timeout: Duration,
    /// The timer, once a write has had to wait.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether `timer` counts the current stall (else it is left over from an earlier one).
    stalled: bool,
}

impl<IO> WriteStall<IO> {
    fn new(io: IO, timeout: Duration) -> Self {
        Self {
            io,
            timeout,
            timer: None,
            stalled: false,
        }
    }

    /// What a call to the connection's write side returned, seen by the stall timer:
    /// `progress` when it moved bytes on (or finished), a timeout once a wait has lasted
    /// too long.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        poll: Poll<io::Result<T>>,
        progress: impl FnOnce(&T) -> bool,
    ) -> Poll<io::Result<T>> {
        match poll {
            Poll::Ready(Ok(value)) => {
                if progress(&value) {
                    self.stalled = false;
                }
                Poll::Ready(Ok(value))
            }
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
            Poll::Pending => {
                let timer = match &mut self.timer {
                    Some(timer) => {
                        if !self.stalled {
                            timer.as_mut().reset(Instant::now() + self.timeout);
                        }
                        timer
                    }
                    None => self
                        .timer
                        .insert(Box::pin(tokio::time::sleep(self.timeout))),
                };
                self.stalled = true;
                // Polled now, so that the timer wakes the connection even if the socket
                // never does.
                match timer.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        "client stopped reading: write stalled",
                    ))),
                    Poll::Pending => Poll::Pending,
                }
            }
        }
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteStall<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteStall<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write(cx, buf);
        this.watch(cx, poll, |&n| n > 0)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.watch(cx, poll, |&n| n > 0)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_flush(cx);
        this.watch(cx, poll, |()| true)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let poll = Pin::new(&mut this.io).poll_shutdown(cx);
        this.watch(cx, poll, |()| true)
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// A pending future that counts its polls.
    fn counted(polls: &Rc<Cell<usize>>) -> impl Future<Output = ()> + use<> {
        let polls = polls.clone();
        std::future::poll_fn(move |_| {
            polls.set(polls.get() + 1);
            Poll::<()>::Pending
        })
    }

    #[test]
    fn a_future_when_woken_is_polled_once_until_it_wakes() {
        let polls = Rc::new(Cell::new(0));
        let mut w = WhenWoken::new(counted(&polls));
        let mut cx = Context::from_waker(Waker::noop());
        for _ in 0..5 {
            assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        }
        assert_eq!(polls.get(), 1, "polled again without a wake-up of its own");
        w.waker.wake_by_ref();
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        assert_eq!(polls.get(), 2, "not polled after its wake-up");
    }

    #[tokio::test]
    async fn a_future_when_woken_completes_when_its_event_arrives() {
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut w = WhenWoken::new(rx);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(Pin::new(&mut w).poll(&mut cx).is_pending());
        tx.send(7).expect("receiver alive");
        let got = tokio::time::timeout(Duration::from_secs(5), w).await;
        assert_eq!(got.expect("woken").expect("sent"), 7);
    }
}
