//! Shares of a capacity: how many places each source (or caller) holds at once, so that no
//! one of them takes every place of a global cap (the CA's calls; connections are shared with
//! `meshkit_hbone::fair`).

use std::collections::HashMap;
use std::hash::Hash;
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
}
