//! Watches: typed event streams with bounded memory, where the newest state of each resource
//! wins and a slow watcher never blocks anyone.

use std::collections::{HashMap, VecDeque};
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll};

use futures::Stream;
use tokio::sync::mpsc;

use crate::protocol::{Event, RemovalReason};
use crate::resource::Resource;

/// What a watcher sees.
#[derive(Debug)]
#[non_exhaustive]
pub enum WatchEvent<T> {
    /// The resource was added or changed.
    Updated {
        /// Its name.
        name: String,
        /// Its version.
        version: String,
        /// The new value.
        resource: Arc<T>,
    },
    /// The resource is gone: deleted by the server, never there, or its TTL expired.
    Removed {
        /// Its name.
        name: String,
        /// Why.
        reason: RemovalReason,
    },
    /// The server sent an invalid version of the resource, which the client rejected (and
    /// NACKed); the last good value stays. The protocol core's
    /// [`Event::Rejected`](crate::protocol::Event::Rejected), typed.
    Rejected {
        /// The resource's name, if it could be decoded far enough to know it.
        name: Option<String>,
        /// Why it was rejected.
        error: String,
    },
    /// Wildcard watches only: the server's whole state of the type has arrived (every event
    /// of it was delivered before this one; none, when the server has no resource of the
    /// type). Once per watch. A program that must not act on a partial view (a node proxy
    /// enforcing authorization policies) waits for it.
    Synced,
}

/// A stream of [`WatchEvent`]s for one resource or, for a wildcard watch, for every resource of
/// a type. Dropping it ends the subscription once no other watch needs it.
///
/// Memory is bounded: at most one pending event per resource name; when the watcher falls
/// behind, a newer event for a name replaces the pending one (newest state wins). The stream
/// ends when the client's driver stops.
pub struct Watch<T> {
    shared: Arc<Mailbox>,
    wake: mpsc::Receiver<()>,
    on_drop: Option<Box<dyn FnOnce() + Send + Sync>>,
    _type: PhantomData<fn() -> T>,
}

/// The driver's end of a watch.
pub(crate) struct Sink {
    shared: Arc<Mailbox>,
    wake: mpsc::Sender<()>,
}

type Mailbox = Mutex<Pending>;

/// Pending events, coalesced per name (`None`: errors that name no resource), and whether
/// [`WatchEvent::Synced`] is due once they are read.
#[derive(Default)]
struct Pending {
    by_name: HashMap<Option<String>, Event>,
    order: VecDeque<Option<String>>,
    synced: Option<Event>,
}

// === impl WatchEvent ===

impl<T> WatchEvent<T> {
    /// The name of the resource concerned, if known.
    pub fn name(&self) -> Option<&str> {
        match self {
            WatchEvent::Updated { name, .. } | WatchEvent::Removed { name, .. } => Some(name),
            WatchEvent::Rejected { name, .. } => name.as_deref(),
            WatchEvent::Synced => None,
        }
    }
}

impl<T> Clone for WatchEvent<T> {
    fn clone(&self) -> Self {
        match self {
            WatchEvent::Updated {
                name,
                version,
                resource,
            } => WatchEvent::Updated {
                name: name.clone(),
                version: version.clone(),
                resource: Arc::clone(resource),
            },
            WatchEvent::Removed { name, reason } => WatchEvent::Removed {
                name: name.clone(),
                reason: *reason,
            },
            WatchEvent::Rejected { name, error } => WatchEvent::Rejected {
                name: name.clone(),
                error: error.clone(),
            },
            WatchEvent::Synced => WatchEvent::Synced,
        }
    }
}

// === impl Watch ===

pub(crate) fn channel<T: Resource>(on_drop: Box<dyn FnOnce() + Send + Sync>) -> (Sink, Watch<T>) {
    let shared = Arc::new(Mutex::new(Pending::default()));
    // Capacity one: the channel only says "look at the mailbox"; a full channel already does.
    let (tx, rx) = mpsc::channel(1);
    (
        Sink {
            shared: Arc::clone(&shared),
            wake: tx,
        },
        Watch {
            shared,
            wake: rx,
            on_drop: Some(on_drop),
            _type: PhantomData,
        },
    )
}

impl<T: Resource> Watch<T> {
    /// The next event; `None` once the client's driver has stopped and everything pending was
    /// read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is removed from the mailbox only when this returns it.
    pub async fn next(&mut self) -> Option<WatchEvent<T>> {
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Option<WatchEvent<T>>> {
        loop {
            while let Some(ev) = pop(&self.shared) {
                if let Some(ev) = convert::<T>(ev) {
                    return Poll::Ready(Some(ev));
                }
            }
            match self.wake.poll_recv(cx) {
                Poll::Ready(Some(())) => continue,
                Poll::Ready(None) => {
                    // The driver is gone; deliver what it left, then end.
                    return Poll::Ready(pop(&self.shared).and_then(convert::<T>));
                }
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<T: Resource> Stream for Watch<T> {
    type Item = WatchEvent<T>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_event(cx)
    }
}

impl<T> Unpin for Watch<T> {}

impl<T> Drop for Watch<T> {
    fn drop(&mut self) {
        if let Some(f) = self.on_drop.take() {
            f();
        }
    }
}

impl<T> std::fmt::Debug for Watch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let pending = lock(&self.shared).order.len();
        f.debug_struct("Watch")
            .field("type", &std::any::type_name::<T>())
            .field("pending", &pending)
            .finish()
    }
}

fn lock(m: &Mailbox) -> MutexGuard<'_, Pending> {
    // A panic while holding this lock leaves coalesced events, which stay consistent.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn pop(m: &Mailbox) -> Option<Event> {
    let mut p = lock(m);
    match p.order.pop_front() {
        Some(key) => p.by_name.remove(&key),
        // Synced comes after the events it vouches for.
        None => p.synced.take(),
    }
}

fn convert<T: Resource>(ev: Event) -> Option<WatchEvent<T>> {
    Some(match ev {
        Event::Updated {
            name,
            version,
            resource,
            ..
        } => WatchEvent::Updated {
            name,
            version,
            resource: resource.downcast::<T>().ok()?,
        },
        Event::Removed { name, reason, .. } => WatchEvent::Removed { name, reason },
        Event::Rejected { name, error, .. } => WatchEvent::Rejected { name, error },
        Event::Synced { .. } => WatchEvent::Synced,
    })
}

// === impl Sink ===

impl Sink {
    /// Queues an event without ever waiting; returns false once the watch is gone.
    pub(crate) fn deliver(&self, ev: &Event) -> bool {
        if self.wake.is_closed() {
            return false;
        }
        {
            let mut p = lock(&self.shared);
            if matches!(ev, Event::Synced { .. }) {
                p.synced = Some(ev.clone());
            } else {
                let key = ev.name().map(str::to_owned);
                if p.by_name.insert(key.clone(), ev.clone()).is_none() {
                    p.order.push_back(key);
                }
            }
        }
        // Full means a wake-up is already pending, which is all we need.
        let _ = self.wake.try_send(());
        true
    }
}
