//! Shares of a capacity: how many places each source (or caller) holds at once, so that no
//! one of them takes every place of a global cap.
//!
//! A source is an IPv4 address, or an IPv6 /64 (one host usually has a whole /64 to pick
//! addresses from).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::{Arc, Mutex};

/// The places held per key; clones share the counts.
#[derive(Debug)]
pub(crate) struct Tally<K>(Arc<Mutex<HashMap<K, usize>>>);

/// One place of a [`Tally`], given back when dropped.
#[derive(Debug)]
pub(crate) struct Held<K: Hash + Eq> {
    tally: Tally<K>,
    key: K,
}

impl<K> Clone for Tally<K> {
    fn clone(&self) -> Self {
        Self(Arc::clone(&self.0))
    }
}

impl<K> Default for Tally<K> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<K: Hash + Eq + Clone> Tally<K> {
    /// A place for `key`, unless it already holds `max`.
    pub(crate) fn take(&self, key: K, max: usize) -> Option<Held<K>> {
        let mut counts = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let count = counts.entry(key.clone()).or_insert(0);
        if *count >= max {
            return None;
        }
        *count += 1;
        Some(Held {
            tally: self.clone(),
            key,
        })
    }
}

impl<K: Hash + Eq> Held<K> {
    /// The key this place is held for.
    pub(crate) fn key(&self) -> &K {
        &self.key
    }
}

impl<K: Hash + Eq> Drop for Held<K> {
    fn drop(&mut self) {
        let mut counts = self.tally.0.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(count) = counts.get_mut(&self.key) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.key);
            }
        }
    }
}

/// The source `ip` counts for: an IPv4 address (an IPv4-mapped IPv6 address as IPv4), or an
/// IPv6 /64.
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => IpAddr::V6(Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        v4 => v4,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn places_are_counted_per_key_and_given_back() {
        let tally = Tally::default();
        let a = tally.take("a", 2).unwrap();
        let _a2 = tally.take("a", 2).unwrap();
        assert!(tally.take("a", 2).is_none());
        let _b = tally.take("b", 2).unwrap();
        drop(a);
        assert!(tally.take("a", 2).is_some());
        assert_eq!(*tally.0.lock().unwrap().get("b").unwrap(), 1);
    }

    #[test]
    fn a_source_is_an_ipv4_address_or_an_ipv6_prefix() {
        let key = |s: &str| source_key(s.parse().unwrap());
        assert_eq!(key("10.0.0.1"), key("::ffff:10.0.0.1"));
        assert_ne!(key("10.0.0.1"), key("10.0.0.2"));
        assert_eq!(key("2001:db8::1"), key("2001:db8::ffff:1"));
        assert_ne!(key("2001:db8::1"), key("2001:db8:0:1::1"));
    }
}
