//! Counting what is open (streams, connections) against the limits of a
//! [`ServerConfig`](crate::ServerConfig), with a permit that gives its place back when dropped.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use futures::Stream;

/// How many of something are open; clones share the count.
#[derive(Debug, Clone, Default)]
pub(crate) struct Gauge(Arc<AtomicUsize>);

/// One place of a [`Gauge`], given back on drop.
#[derive(Debug)]
pub(crate) struct Permit(Arc<AtomicUsize>);

/// A stream that holds a [`Permit`] for as long as it lives.
pub(crate) struct Holding<S> {
    inner: S,
    _permit: Permit,
}

// === impl Gauge ===

impl Gauge {
    /// A place, unless `max` are taken already.
    pub(crate) fn try_acquire(&self, max: usize) -> Option<Permit> {
        self.0
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < max).then_some(n + 1)
            })
            .ok()
            .map(|_| Permit(Arc::clone(&self.0)))
    }
}

// === impl Permit ===

impl Permit {
    /// `stream`, holding this permit until it is dropped.
    pub(crate) fn hold<S>(self, stream: S) -> Holding<S> {
        Holding {
            inner: stream,
            _permit: self,
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

// === impl Holding ===

impl<S: Stream + Unpin> Stream for Holding<S> {
    type Item = S::Item;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<S::Item>> {
        Pin::new(&mut self.inner).poll_next(cx)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_given_back() {
        let g = Gauge::default();
        let a = g.try_acquire(2).expect("first");
        let _b = g.try_acquire(2).expect("second");
        assert!(g.try_acquire(2).is_none());
        drop(a);
        assert!(g.clone().try_acquire(2).is_some());
    }
}
