//! The send budget of one HTTP/2 connection: how many bytes its tunnels may have handed to h2
//! that h2 has not yet written towards the socket, all streams together.
//!
//! h2 bounds what it buffers per stream (`max_send_buffer`), not per connection: a peer that
//! opens 2,000 streams with large windows and then stops reading its socket would otherwise
//! leave 2,000 × 1 MiB queued in one connection. Each [`SendHalf`](crate::SendHalf) claims
//! budget before it hands data to h2, and the connection's I/O wrapper
//! ([`Frames`](crate::io::Frames)) gives it back as it sees each stream's DATA payload go to
//! TLS. Data h2 will never write is given back when the stream's RST_STREAM goes by, read
//! or written (h2 drops what it held for a stream at the reset, whoever sent it).

use std::collections::HashMap;
use std::sync::Mutex;
use std::task::{Context, Poll, Waker};

/// One connection's budget; shared by its tunnels and its I/O wrapper.
#[derive(Debug)]
pub(crate) struct SendBudget {
    limit: usize,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Bytes claimed and not yet written, all streams.
    in_flight: usize,
    /// Per stream: bytes claimed and not yet written, and whether its sending half still exists.
    streams: HashMap<u32, Account>,
    /// Tunnels waiting for budget.
    waiters: Vec<Waker>,
    /// The connection has ended: nothing more is counted, claims succeed at once (h2 then
    /// refuses the data with the connection's error).
    closed: bool,
}

#[derive(Debug)]
struct Account {
    unwritten: usize,
    open: bool,
}

// === impl SendBudget ===

impl SendBudget {
    pub(crate) fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Claims up to `want` bytes (more than zero) for `stream`; pending, with the task to be
    /// woken, while the connection's budget is spent.
    pub(crate) fn poll_claim(&self, cx: &mut Context<'_>, stream: u32, want: usize) -> Poll<usize> {
        let mut state = self.lock();
        if state.closed {
            return Poll::Ready(want);
        }
        let room = self.limit.saturating_sub(state.in_flight);
        if room == 0 {
            if !state.waiters.iter().any(|w| w.will_wake(cx.waker())) {
                state.waiters.push(cx.waker().clone());
            }
            return Poll::Pending;
        }
        let n = want.min(room);
        state.in_flight += n;
        state
            .streams
            .entry(stream)
            .or_insert(Account {
                unwritten: 0,
                open: true,
            })
            .unwritten += n;
        Poll::Ready(n)
    }

    /// Gives back `n` bytes claimed for `stream` that were not handed to h2.
    pub(crate) fn unclaim(&self, stream: u32, n: usize) {
        self.release(stream, n);
    }

    /// `n` payload bytes of `stream` were written towards the socket.
    pub(crate) fn written(&self, stream: u32, n: usize) {
        self.release(stream, n);
    }

    fn release(&self, stream: u32, n: usize) {
        let waiters = {
            let mut state = self.lock();
            let Some(account) = state.streams.get_mut(&stream) else {
                return;
            };
            let n = n.min(account.unwritten);
            account.unwritten -= n;
            let gone = account.unwritten == 0 && !account.open;
            if gone {
                state.streams.remove(&stream);
            }
            state.in_flight -= n;
            if n == 0 {
                return;
            }
            std::mem::take(&mut state.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// `stream` was reset: what h2 still held of it will never be written.
    pub(crate) fn discard(&self, stream: u32) {
        let waiters = {
            let mut state = self.lock();
            let Some(account) = state.streams.remove(&stream) else {
                return;
            };
            state.in_flight -= account.unwritten;
            std::mem::take(&mut state.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// The sending half of `stream` is gone. What it handed to h2 stays counted until it is
    /// written or the stream's reset goes by: h2 writes it (after END_STREAM, or while the
    /// receiving half lives) or drops it at the reset it then sends.
    pub(crate) fn close(&self, stream: u32) {
        let mut state = self.lock();
        let closed = state.closed;
        if let Some(account) = state.streams.get_mut(&stream) {
            if account.unwritten == 0 || closed {
                state.streams.remove(&stream);
            } else {
                account.open = false;
            }
        }
    }

    /// The connection has ended: every waiting tunnel is woken (its next send fails with the
    /// connection's error), and nothing is counted any more.
    pub(crate) fn shut_down(&self) {
        let waiters = {
            let mut state = self.lock();
            state.closed = true;
            state.in_flight = 0;
            state.streams.clear();
            std::mem::take(&mut state.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }

    /// Bytes claimed and not yet written.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.lock().in_flight
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[test]
    fn claims_stop_at_the_limit_and_resume_as_data_is_written() {
        let budget = SendBudget::new(100);
        let mut cx = Context::from_waker(Waker::noop());
        assert_eq!(budget.poll_claim(&mut cx, 1, 60), Poll::Ready(60));
        assert_eq!(budget.poll_claim(&mut cx, 3, 60), Poll::Ready(40));
        assert_eq!(budget.poll_claim(&mut cx, 5, 1), Poll::Pending);
        budget.written(1, 50);
        assert_eq!(budget.poll_claim(&mut cx, 5, 80), Poll::Ready(50));
        assert_eq!(budget.in_flight(), 100);
    }

    #[test]
    fn resets_give_back_what_was_never_written_and_closes_wait_for_it() {
        let budget = SendBudget::new(100);
        let mut cx = Context::from_waker(Waker::noop());
        let _ = budget.poll_claim(&mut cx, 1, 30);
        let _ = budget.poll_claim(&mut cx, 3, 30);
        let _ = budget.poll_claim(&mut cx, 5, 30);
        budget.discard(1);
        assert_eq!(budget.in_flight(), 60);
        // Closed: counted until written or reset, then forgotten.
        budget.close(3);
        budget.close(5);
        assert_eq!(budget.in_flight(), 60);
        budget.written(5, 30);
        budget.discard(3);
        assert_eq!(budget.in_flight(), 0);
        // Writes of unknown or forgotten streams change nothing.
        budget.written(7, 10);
        budget.written(5, 10);
        assert_eq!(budget.in_flight(), 0);
    }

    #[test]
    fn the_end_of_the_connection_wakes_waiters_and_stops_counting() {
        use std::sync::Arc;
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::task::Wake;

        struct Flag(AtomicBool);
        impl Wake for Flag {
            fn wake(self: Arc<Self>) {
                self.0.store(true, Ordering::SeqCst);
            }
        }
        let budget = SendBudget::new(10);
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        assert_eq!(budget.poll_claim(&mut cx, 1, 10), Poll::Ready(10));
        assert_eq!(budget.poll_claim(&mut cx, 3, 5), Poll::Pending);
        budget.shut_down();
        assert!(
            flag.0.load(Ordering::SeqCst),
            "a waiting tunnel was not woken"
        );
        assert_eq!(budget.poll_claim(&mut cx, 3, 5), Poll::Ready(5));
        assert_eq!(budget.in_flight(), 0);
    }
}
