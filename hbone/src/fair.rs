//! Fair shares of a listener's connection places among the sources that use them.
//!
//! A listener with a cap on open connections can be filled by one client, or by a few, and
//! then serves nobody else. [`FairSlots`] gives each connection a place on three rules:
//!
//! 1. **A source's share.** One source (an IPv4 address, or an IPv6 /64: [`source_key`])
//!    holds at most `per_source` places; one more from it is refused.
//! 2. **The cap.** While fewer than `max` places are held, a connection gets one.
//! 3. **Eviction when full.** When all `max` are held, a connection from a source that holds
//!    fewer places than the source holding the most (by two or more) takes one of that
//!    source's places: the least recently active of its connections is closed
//!    ([`Slot::is_evicted`]; [`Evictable`] fails its reads and writes). Otherwise it is
//!    refused.
//!
//! So however many sources try to fill the cap, each one that asks keeps at least
//! `max / sources` places (max-min fairness), and no source can keep another out by holding
//! connections open and idle. [`FairSlots::stats`] counts the refusals and evictions for
//! metrics.
//!
//! ```
//! use meshkit_hbone::fair::{FairSlots, Refusal};
//!
//! let slots = FairSlots::new(4, 3);
//! let a = "10.0.0.1".parse().unwrap();
//! let b = "10.0.0.2".parse().unwrap();
//! let held: Vec<_> = (0..3).map(|_| slots.admit(a).unwrap()).collect();
//! // Past its share.
//! assert_eq!(slots.admit(a).unwrap_err(), Refusal::SourceShare);
//! let _b1 = slots.admit(b).unwrap();
//! // Full: b holds 1 and a holds 3, so b takes one of a's places.
//! let _b2 = slots.admit(b).unwrap();
//! assert_eq!(held.iter().filter(|s| s.is_evicted()).count(), 1);
//! // Now a holds 2 and b holds 2: a third from b is refused.
//! assert_eq!(slots.admit(b).unwrap_err(), Refusal::Full);
//! ```

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Instant;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The source `ip` counts for: an IPv4 address (an IPv4-mapped IPv6 address as its IPv4
/// address), or an IPv6 /64 (one host commonly holds a whole /64, so counting single IPv6
/// addresses would bound nothing).
pub fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

/// A listener's connection places, shared fairly among sources (see the [module](self)).
/// Clones share the places.
#[derive(Debug, Clone)]
pub struct FairSlots {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    max: usize,
    per_source: usize,
    table: Mutex<Table>,
    stats: FairStats,
    /// What activity times count from.
    epoch: Instant,
}

#[derive(Debug, Default)]
struct Table {
    held: usize,
    by_source: HashMap<IpAddr, Vec<Arc<SlotState>>>,
}

/// Why [`FairSlots::admit`] refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Its source holds its share already.
    SourceShare,
    /// Every place is held, and no source holds more than this one's would.
    Full,
}

/// What [`FairSlots`] did, counted since it was made.
#[derive(Debug, Default)]
pub struct FairStats {
    refused_share: AtomicU64,
    refused_full: AtomicU64,
    evicted: AtomicU64,
}

/// One connection's place in a [`FairSlots`], given back when dropped.
#[derive(Debug)]
pub struct Slot {
    slots: FairSlots,
    source: IpAddr,
    state: Arc<SlotState>,
}

#[derive(Debug, Default)]
struct SlotState {
    evicted: AtomicBool,
    /// Milliseconds from the epoch to the latest read or write.
    active: AtomicU64,
    /// Woken when the place is taken away.
    waker: Mutex<Option<Waker>>,
}

/// A connection that holds a [`Slot`]: its reads and writes record activity, and fail with
/// `ConnectionAborted` once the place is taken for another source's connection, so that the
/// task serving it ends.
#[derive(Debug)]
pub struct Evictable<IO> {
    io: IO,
    slot: Slot,
}

// === impl FairSlots ===

impl FairSlots {
    /// `max` places in all, at most `per_source` for one source (both at least 1).
    pub fn new(max: usize, per_source: usize) -> Self {
        Self {
            inner: Arc::new(Inner {
                max: max.max(1),
                per_source: per_source.max(1),
                table: Mutex::new(Table::default()),
                stats: FairStats::default(),
                epoch: Instant::now(),
            }),
        }
    }

    /// Whether [`admit`](Self::admit) would give `ip` a place now, without taking one or
    /// evicting anyone (and without counting a refusal). A caller that must take places in
    /// two tallies checks the second first, so that a connection never evicts another and is
    /// then refused by the second. Places only come back between the two calls (other tasks
    /// drop theirs), so a place this admits is still there for `admit` from the same task.
    ///
    /// # Errors
    ///
    /// As [`admit`](Self::admit).
    pub fn check(&self, ip: IpAddr) -> Result<(), Refusal> {
        let table = self.inner.table.lock().unwrap_or_else(|e| e.into_inner());
        self.victim(&table, source_key(ip)).map(drop)
    }

    /// The source whose place a connection from `source` would take: `None` below the cap.
    fn victim(&self, table: &Table, source: IpAddr) -> Result<Option<IpAddr>, Refusal> {
        let inner = &*self.inner;
        let mine = table.by_source.get(&source).map_or(0, Vec::len);
        if mine >= inner.per_source {
            return Err(Refusal::SourceShare);
        }
        if table.held < inner.max {
            return Ok(None);
        }
        table
            .by_source
            .iter()
            .max_by_key(|(_, held)| held.len())
            .filter(|(_, held)| held.len() > mine + 1)
            .map(|(source, _)| Some(*source))
            .ok_or(Refusal::Full)
    }

    /// A place for a connection from `ip`, or why not (see the [module](self)).
    ///
    /// # Errors
    ///
    /// [`Refusal::SourceShare`] when its source holds its share; [`Refusal::Full`] when every
    /// place is held and no source holds two more than its source.
    pub fn admit(&self, ip: IpAddr) -> Result<Slot, Refusal> {
        let source = source_key(ip);
        let inner = &*self.inner;
        let mut table = inner.table.lock().unwrap_or_else(|e| e.into_inner());
        let victim = match self.victim(&table, source) {
            Ok(victim) => victim,
            Err(refusal) => {
                let counter = match refusal {
                    Refusal::SourceShare => &inner.stats.refused_share,
                    Refusal::Full => &inner.stats.refused_full,
                };
                counter.fetch_add(1, Ordering::Relaxed);
                return Err(refusal);
            }
        };
        if let Some(largest) = victim {
            let held = table
                .by_source
                .get_mut(&largest)
                .expect("the largest holder");
            let quietest = (0..held.len())
                .min_by_key(|i| held[*i].active.load(Ordering::Relaxed))
                .expect("a source holds at least one place");
            let victim = held.swap_remove(quietest);
            table.held -= 1;
            victim.evict();
            inner.stats.evicted.fetch_add(1, Ordering::Relaxed);
        }
        let state = Arc::new(SlotState::default());
        state.active.store(self.now(), Ordering::Relaxed);
        table
            .by_source
            .entry(source)
            .or_default()
            .push(Arc::clone(&state));
        table.held += 1;
        Ok(Slot {
            slots: self.clone(),
            source,
            state,
        })
    }

    /// Places held now.
    pub fn held(&self) -> usize {
        self.inner
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .held
    }

    /// The refusals and evictions so far.
    pub fn stats(&self) -> &FairStats {
        &self.inner.stats
    }

    fn now(&self) -> u64 {
        u64::try_from(self.inner.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }
}

// === impl FairStats ===

impl FairStats {
    /// Connections refused because their source held its share.
    pub fn refused_share(&self) -> u64 {
        self.refused_share.load(Ordering::Relaxed)
    }

    /// Connections refused because every place was held fairly.
    pub fn refused_full(&self) -> u64 {
        self.refused_full.load(Ordering::Relaxed)
    }

    /// Connections closed to give their place to a source holding fewer.
    pub fn evicted(&self) -> u64 {
        self.evicted.load(Ordering::Relaxed)
    }
}

// === impl Slot ===

impl Slot {
    /// Whether the place was taken for another source's connection: the connection must end.
    pub fn is_evicted(&self) -> bool {
        self.state.evicted.load(Ordering::Acquire)
    }

    /// Records activity on the connection now (reads and writes through [`Evictable`] do).
    pub fn touch(&self) {
        self.state.active.store(self.slots.now(), Ordering::Relaxed);
    }

    /// `io`, holding this place: see [`Evictable`].
    pub fn hold<IO>(self, io: IO) -> Evictable<IO> {
        Evictable { io, slot: self }
    }

    /// Completes when the place is taken for another source's connection, for a connection
    /// that is not read and written through [`Evictable`]. Only one task may wait on a place
    /// (this future or an [`Evictable`]'s reads and writes): a second takes the first's
    /// wake-up.
    pub async fn evicted(&self) {
        std::future::poll_fn(|cx| match self.state.check(cx) {
            Ok(()) => Poll::Pending,
            Err(_) => Poll::Ready(()),
        })
        .await;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if self.is_evicted() {
            // Its place was given away when it was evicted.
            return;
        }
        let mut table = self
            .slots
            .inner
            .table
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let Some(held) = table.by_source.get_mut(&self.source) else {
            return;
        };
        let before = held.len();
        held.retain(|s| !Arc::ptr_eq(s, &self.state));
        let removed = before - held.len();
        if held.is_empty() {
            table.by_source.remove(&self.source);
        }
        table.held -= removed;
    }
}

// === impl SlotState ===

impl SlotState {
    fn evict(&self) {
        self.evicted.store(true, Ordering::Release);
        let waker = self.waker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// `Err` once evicted; otherwise registers `cx` to be woken by an eviction.
    fn check(&self, cx: &Context<'_>) -> io::Result<()> {
        if !self.evicted.load(Ordering::Acquire) {
            let mut waker = self.waker.lock().unwrap_or_else(|e| e.into_inner());
            match &*waker {
                Some(w) if w.will_wake(cx.waker()) => {}
                _ => *waker = Some(cx.waker().clone()),
            }
            drop(waker);
            // An eviction between the first load and the registration has taken no waker.
            if !self.evicted.load(Ordering::Acquire) {
                return Ok(());
            }
        }
        Err(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            "connection closed to give its place to a client of another source",
        ))
    }
}

// === impl Evictable ===

impl<IO> Evictable<IO> {
    /// The connection's place.
    pub fn slot(&self) -> &Slot {
        &self.slot
    }

    /// The connection.
    pub fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Evictable<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.slot.state.check(cx)?;
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.slot.touch();
        }
        polled
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Evictable<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.slot.state.check(cx)?;
        let polled = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.slot.touch();
        }
        polled
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.slot.state.check(cx)?;
        let polled = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.slot.touch();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_prefix() {
        assert_eq!(
            source_key(ip("10.0.0.1")),
            source_key(ip("::ffff:10.0.0.1"))
        );
        assert_ne!(source_key(ip("10.0.0.1")), source_key(ip("10.0.0.2")));
        assert_eq!(
            source_key(ip("2001:db8::1")),
            source_key(ip("2001:db8::ffff:1"))
        );
        assert_ne!(
            source_key(ip("2001:db8::1")),
            source_key(ip("2001:db8:0:1::1"))
        );
    }

    #[test]
    fn many_sources_filling_the_cap_each_keep_a_fair_part() {
        let slots = FairSlots::new(12, 12);
        let mut held = Vec::new();
        // One source fills the cap...
        for _ in 0..12 {
            held.push(slots.admit(ip("10.0.0.1")).unwrap());
        }
        // ...then three more sources ask for as many as they can get.
        for round in 0..12 {
            for s in ["10.0.0.2", "10.0.0.3", "10.0.0.4"] {
                if let Ok(slot) = slots.admit(ip(s)) {
                    held.push(slot);
                }
            }
            assert!(slots.held() <= 12, "round {round}");
        }
        held.retain(|s| !s.is_evicted());
        assert_eq!(held.len(), 12);
        assert_eq!(slots.held(), 12);
        let mut per_source: HashMap<IpAddr, usize> = HashMap::new();
        for s in &held {
            *per_source.entry(s.source).or_default() += 1;
        }
        assert!(per_source.values().all(|n| *n == 3), "{per_source:?}");
        assert_eq!(slots.stats().evicted(), 9);
        drop(held);
        assert_eq!(slots.held(), 0);
    }

    #[test]
    fn the_least_recently_active_connection_of_the_largest_source_goes() {
        let slots = FairSlots::new(3, 3);
        let a: Vec<Slot> = (0..3)
            .map(|_| slots.admit(ip("10.0.0.1")).unwrap())
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(5));
        a[0].touch();
        a[2].touch();
        let _b = slots.admit(ip("10.0.0.2")).unwrap();
        assert!(!a[0].is_evicted() && a[1].is_evicted() && !a[2].is_evicted());
    }

    #[tokio::test]
    async fn an_evicted_connection_fails_its_pending_read() {
        use tokio::io::AsyncReadExt;
        let slots = FairSlots::new(2, 2);
        let (near, _far) = tokio::io::duplex(64);
        let busy = slots.admit(ip("10.0.0.1")).unwrap();
        let mut idle = slots.admit(ip("10.0.0.1")).unwrap().hold(near);
        std::thread::sleep(std::time::Duration::from_millis(5));
        busy.touch();
        let reading = tokio::spawn(async move {
            let mut buf = [0u8; 8];
            idle.read(&mut buf).await
        });
        tokio::task::yield_now().await;
        // Full, and 10.0.0.1 holds two more than 10.0.0.2: its idle connection goes.
        let _b = slots.admit(ip("10.0.0.2")).unwrap();
        let err = tokio::time::timeout(std::time::Duration::from_secs(5), reading)
            .await
            .expect("woken by the eviction")
            .unwrap()
            .unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert!(!busy.is_evicted());
        // Now each holds one: a second from 10.0.0.2 is refused.
        assert_eq!(slots.admit(ip("10.0.0.2")).unwrap_err(), Refusal::Full);
    }
}
