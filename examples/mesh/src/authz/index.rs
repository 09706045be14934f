//! The policies of one bucket (a scope and an action), indexed by what a connection must
//! carry for each of them to match.
//!
//! Most policies name who may connect: a principal, a service account, a namespace. A
//! condition that a match sets must hold for the match to hold, so each rule can be given a
//! set of keys (an exact principal, a namespace prefix, a port...) one of which every
//! connection it matches hits. A decision then reads only the policies under the keys its
//! connection hits, and those that no key guards (a rule of IP blocks only, a rule without
//! clauses), instead of every policy of the bucket.
//!
//! For a match, the key set is that of one positive condition it sets (the most selective:
//! service accounts and exact principals first, ports and presence last). A match with no
//! condition never matches and needs no key. A clause needs every one of its matches keyed,
//! and a rule one keyed clause (a rule holds only when all of its clauses do, so any of them
//! will do; the most selective is taken). A policy is the union of its rules' keys; a policy
//! without rules has no key and is never read.

use std::collections::HashSet;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use super::compiled::Compiled;
use super::{Clause, Facts, Match, Policy, Rule, ServiceAccount, StringMatch};

type Map<K, V> = hashbrown::HashMap<K, V, foldhash::fast::RandomState>;

/// A policy in a list of the index: the lists hold the policies themselves, so that reading
/// one costs no lookup.
type Slot = Arc<Compiled>;

#[derive(Debug, Clone, Default)]
pub(super) struct Index {
    /// The policies, with the keys they are listed under.
    entries: Vec<Entry>,
    dry_runs: usize,
    /// Policies that every connection may match.
    always: Vec<Slot>,
    principals: Strings,
    namespaces: Strings,
    accounts: Map<(Box<str>, Box<str>), Vec<Slot>>,
    ports: Map<u16, Vec<Slot>>,
}

#[derive(Debug, Clone)]
struct Entry {
    compiled: Arc<Compiled>,
    gate: Gate,
}

/// What a connection must hit for a policy to be read.
#[derive(Debug, Clone)]
enum Gate {
    /// Nothing: the policy is read for every connection.
    Always,
    /// One of these (none: the policy never matches).
    Keys(Box<[Key]>),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Key {
    Principal(StringMatch),
    Namespace(StringMatch),
    Account(ServiceAccount),
    Port(u16),
}

/// Lists of slots by a string pattern: exact values, prefixes, suffixes and presence.
#[derive(Debug, Clone, Default)]
struct Strings {
    exact: Map<Box<str>, Vec<Slot>>,
    prefixes: Affixes,
    suffixes: Affixes,
    present: Vec<Slot>,
}

/// Prefixes (or suffixes) by value, and the distinct lengths they have, so that a value is
/// probed once per length rather than once per pattern.
#[derive(Debug, Clone, Default)]
struct Affixes {
    by_value: Map<Box<str>, Vec<Slot>>,
    /// Each length, ascending, with the number of patterns of that length.
    lengths: Vec<(usize, usize)>,
}

// === impl Index ===

impl Index {
    /// How many policies the index holds.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    /// How many of them are dry runs.
    pub(super) fn dry_runs(&self) -> usize {
        self.dry_runs
    }

    /// Every policy, in no particular order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Arc<Compiled>> {
        self.entries.iter().map(|e| &e.compiled)
    }

    pub(super) fn insert(&mut self, compiled: &Arc<Compiled>) {
        let gate = gate(&compiled.policy);
        match &gate {
            Gate::Always => self.always.push(compiled.clone()),
            Gate::Keys(keys) => {
                for key in keys {
                    self.add(key, compiled);
                }
            }
        }
        self.dry_runs += usize::from(compiled.policy.dry_run);
        self.entries.push(Entry {
            compiled: compiled.clone(),
            gate,
        });
    }

    /// Removes `compiled` if the index holds it.
    pub(super) fn remove(&mut self, compiled: &Arc<Compiled>) {
        let Some(at) = self
            .entries
            .iter()
            .position(|e| Arc::ptr_eq(&e.compiled, compiled))
        else {
            return;
        };
        let entry = self.entries.swap_remove(at);
        match &entry.gate {
            Gate::Always => self.always.retain(|s| !Arc::ptr_eq(s, compiled)),
            Gate::Keys(keys) => {
                for key in keys {
                    self.drop_key(key, compiled);
                }
            }
        }
        self.dry_runs -= usize::from(compiled.policy.dry_run);
    }

    /// The first policy, among those the connection of `facts` could match, for which
    /// `hit` holds. A policy under several keys the connection hits may be offered more
    /// than once.
    pub(super) fn find(
        &self,
        facts: &Facts<'_>,
        mut hit: impl FnMut(&Compiled) -> bool,
    ) -> Option<&Arc<Compiled>> {
        if self.entries.is_empty() {
            return None;
        }
        let hit = &mut hit;
        self.first(&self.always, hit)
            .or_else(|| {
                let principal = facts.principal?;
                self.principals.probe(principal, |l| self.first(l, hit))
            })
            .or_else(|| {
                self.namespaces
                    .probe(facts.namespace, |l| self.first(l, hit))
            })
            .or_else(|| {
                let (namespace, name) = facts.service_account?;
                let list = self.accounts.get(&AccountKey(namespace, name))?;
                self.first(list, hit)
            })
            .or_else(|| {
                let list = self.ports.get(&facts.destination.port())?;
                self.first(list, hit)
            })
    }

    fn first<'a>(
        &self,
        slots: &'a [Slot],
        hit: &mut impl FnMut(&Compiled) -> bool,
    ) -> Option<&'a Arc<Compiled>> {
        slots.iter().find(|c| hit(c))
    }

    fn add(&mut self, key: &Key, slot: &Slot) {
        match key {
            Key::Principal(p) => self.principals.add(p, slot),
            Key::Namespace(p) => self.namespaces.add(p, slot),
            Key::Account(a) => self
                .accounts
                .entry((a.namespace.as_str().into(), a.name.as_str().into()))
                .or_default()
                .push(slot.clone()),
            Key::Port(port) => self.ports.entry(*port).or_default().push(slot.clone()),
        }
    }

    fn drop_key(&mut self, key: &Key, slot: &Slot) {
        match key {
            Key::Principal(p) => self.principals.drop_key(p, slot),
            Key::Namespace(p) => self.namespaces.drop_key(p, slot),
            Key::Account(a) => {
                drop_from(&mut self.accounts, &AccountKey(&a.namespace, &a.name), slot);
            }
            Key::Port(port) => {
                drop_from(&mut self.ports, port, slot);
            }
        }
    }
}

/// Removes `slot` from the list under `key`, and the list when it is left empty; whether
/// there was a list.
fn drop_from<K, Q>(map: &mut Map<K, Vec<Slot>>, key: &Q, slot: &Slot) -> bool
where
    K: Hash + Eq,
    Q: Hash + hashbrown::Equivalent<K> + ?Sized,
{
    let Some(list) = map.get_mut(key) else {
        return false;
    };
    list.retain(|s| !Arc::ptr_eq(s, slot));
    if list.is_empty() {
        map.remove(key);
    }
    true
}

/// A borrowed service account, to look one up without building its key.
struct AccountKey<'a>(&'a str, &'a str);

impl Hash for AccountKey<'_> {
    // As the tuple `(Box<str>, Box<str>)` hashes.
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl hashbrown::Equivalent<(Box<str>, Box<str>)> for AccountKey<'_> {
    fn equivalent(&self, key: &(Box<str>, Box<str>)) -> bool {
        *key.0 == *self.0 && *key.1 == *self.1
    }
}

// === impl Strings ===

impl Strings {
    fn add(&mut self, pattern: &StringMatch, slot: &Slot) {
        match pattern {
            StringMatch::Exact(v) => self
                .exact
                .entry(v.as_str().into())
                .or_default()
                .push(slot.clone()),
            StringMatch::Prefix(v) => self.prefixes.add(v, slot),
            StringMatch::Suffix(v) => self.suffixes.add(v, slot),
            StringMatch::Presence => self.present.push(slot.clone()),
        }
    }

    fn drop_key(&mut self, pattern: &StringMatch, slot: &Slot) {
        match pattern {
            StringMatch::Exact(v) => {
                drop_from(&mut self.exact, v.as_str(), slot);
            }
            StringMatch::Prefix(v) => self.prefixes.drop_key(v, slot),
            StringMatch::Suffix(v) => self.suffixes.drop_key(v, slot),
            StringMatch::Presence => self.present.retain(|s| !Arc::ptr_eq(s, slot)),
        }
    }

    /// Calls `f` with each list whose pattern `value` matches, until it returns `Some`.
    fn probe<'a, R>(
        &'a self,
        value: &str,
        mut f: impl FnMut(&'a [Slot]) -> Option<R>,
    ) -> Option<R> {
        if let Some(r) = self.exact.get(value).and_then(|l| f(l)) {
            return Some(r);
        }
        if !value.is_empty()
            && let Some(r) = f(&self.present)
        {
            return Some(r);
        }
        let prefix = |len| value.get(..len);
        let suffix = |len| value.len().checked_sub(len).and_then(|at| value.get(at..));
        self.prefixes
            .probe(value.len(), prefix, &mut f)
            .or_else(|| self.suffixes.probe(value.len(), suffix, &mut f))
    }
}

// === impl Affixes ===

impl Affixes {
    fn add(&mut self, value: &str, slot: &Slot) {
        let list = self.by_value.entry(value.into()).or_default();
        if list.is_empty() {
            match self.lengths.binary_search_by_key(&value.len(), |&(l, _)| l) {
                Ok(i) => self.lengths[i].1 += 1,
                Err(i) => self.lengths.insert(i, (value.len(), 1)),
            }
        }
        list.push(slot.clone());
    }

    fn drop_key(&mut self, value: &str, slot: &Slot) {
        let Some(list) = self.by_value.get_mut(value) else {
            return;
        };
        list.retain(|s| !Arc::ptr_eq(s, slot));
        if !list.is_empty() {
            return;
        }
        self.by_value.remove(value);
        if let Ok(i) = self.lengths.binary_search_by_key(&value.len(), |&(l, _)| l) {
            self.lengths[i].1 -= 1;
            if self.lengths[i].1 == 0 {
                self.lengths.remove(i);
            }
        }
    }

    /// Calls `f` with the list of each pattern that `part(length)`, the part of a value of
    /// `len` bytes that a pattern of that length would cover, equals.
    fn probe<'a, 'v, R>(
        &'a self,
        len: usize,
        part: impl Fn(usize) -> Option<&'v str>,
        f: &mut impl FnMut(&'a [Slot]) -> Option<R>,
    ) -> Option<R> {
        self.lengths
            .iter()
            .take_while(|&&(l, _)| l <= len)
            .filter_map(|&(l, _)| self.by_value.get(part(l)?))
            .find_map(|list| f(list))
    }
}

// === the keys of a policy ===

/// How selective a key set is: lower reads fewer policies.
type Rank = u8;

fn gate(policy: &Policy) -> Gate {
    let mut keys = HashSet::new();
    for rule in &policy.rules {
        match rule_keys(rule) {
            Some((_, k)) => keys.extend(k),
            None => return Gate::Always,
        }
    }
    Gate::Keys(keys.into_iter().collect())
}

/// The keys one of which every connection that `rule` matches hits; `None` when no clause
/// gives such keys.
fn rule_keys(rule: &Rule) -> Option<(Rank, Vec<Key>)> {
    rule.clauses
        .iter()
        .filter_map(clause_keys)
        .min_by_key(|(rank, keys)| (*rank, keys.len()))
}

fn clause_keys(clause: &Clause) -> Option<(Rank, Vec<Key>)> {
    // A clause without matches holds for every connection.
    if clause.matches.is_empty() {
        return None;
    }
    let mut rank = 0;
    let mut keys = Vec::new();
    // A match without conditions never holds, and needs no key.
    for m in clause.matches.iter().filter(|m| !m.is_empty()) {
        let (r, k) = match_keys(m)?;
        rank = rank.max(r);
        keys.extend(k);
    }
    Some((rank, keys))
}

/// The most selective positive condition of `m` that a key can stand for.
fn match_keys(m: &Match) -> Option<(Rank, Vec<Key>)> {
    let accounts = (!m.service_accounts.is_empty()).then(|| {
        let keys = m.service_accounts.iter().cloned().map(Key::Account);
        (0, keys.collect())
    });
    let ports = (!m.destination_ports.is_empty()).then(|| {
        (
            3,
            m.destination_ports.iter().copied().map(Key::Port).collect(),
        )
    });
    [
        accounts,
        strings(&m.principals, Key::Principal, 0),
        strings(&m.namespaces, Key::Namespace, 1),
        ports,
    ]
    .into_iter()
    .flatten()
    .min_by_key(|(rank, keys): &(Rank, Vec<Key>)| (*rank, keys.len()))
}

fn strings(
    patterns: &[StringMatch],
    key: fn(StringMatch) -> Key,
    exact: Rank,
) -> Option<(Rank, Vec<Key>)> {
    let rank = patterns
        .iter()
        .map(|p| match p {
            StringMatch::Exact(_) => exact,
            StringMatch::Prefix(_) | StringMatch::Suffix(_) => 2,
            StringMatch::Presence => 4,
        })
        .max()?;
    Some((rank, patterns.iter().cloned().map(key).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::authz::{Action, Scope};

    fn policy(rules: Vec<Rule>) -> Policy {
        Policy {
            name: "p".into(),
            namespace: "shop".into(),
            scope: Scope::Namespace,
            action: Action::Allow,
            rules,
            dry_run: false,
        }
    }

    fn keys(p: &Policy) -> Option<Vec<Key>> {
        match gate(p) {
            Gate::Always => None,
            Gate::Keys(keys) => Some(keys.into_vec()),
        }
    }

    #[test]
    fn a_rule_takes_its_most_selective_clause_and_a_match_its_most_selective_condition() {
        let by_port = Match {
            destination_ports: vec![8080],
            ..Match::default()
        };
        let by_principal = Match {
            principals: vec![StringMatch::Exact("td/ns/a/sa/b".into())],
            destination_ports: vec![8080],
            ..Match::default()
        };
        let rule = Rule {
            clauses: vec![
                Clause {
                    matches: vec![by_port],
                },
                Clause {
                    matches: vec![by_principal, Match::default()],
                },
            ],
        };
        assert_eq!(
            keys(&policy(vec![rule])),
            Some(vec![Key::Principal(StringMatch::Exact(
                "td/ns/a/sa/b".into()
            ))])
        );
    }

    #[test]
    fn what_no_key_can_stand_for_is_read_for_every_connection() {
        let by_ip = Match {
            source_ips: vec!["10.0.0.0/8".parse().unwrap()],
            ..Match::default()
        };
        let negative = Match {
            not_principals: vec![StringMatch::Presence],
            ..Match::default()
        };
        for rule in [Rule::default(), Rule::of([by_ip]), Rule::of([negative])] {
            assert!(keys(&policy(vec![rule])).is_none());
        }
        // One unkeyed match leaves its clause unkeyed.
        let rule = Rule::of([
            Match {
                namespaces: vec![StringMatch::Exact("ops".into())],
                ..Match::default()
            },
            Match {
                not_destination_ports: vec![22],
                ..Match::default()
            },
        ]);
        assert!(keys(&policy(vec![rule])).is_none());
        // A policy without rules is never read.
        assert_eq!(keys(&policy(vec![])), Some(vec![]));
    }

    #[test]
    fn prefixes_and_suffixes_are_probed_once_per_length_on_character_boundaries() {
        let named = |name: &str| {
            let p = Policy {
                name: name.into(),
                ..policy(vec![])
            };
            Arc::new(Compiled::new(Arc::new(p)))
        };
        let [one, two, three, four] = ["1", "2", "3", "4"].map(named);
        let mut strings = Strings::default();
        strings.add(&StringMatch::Prefix("té".into()), &one);
        strings.add(&StringMatch::Prefix("tx".into()), &two);
        strings.add(&StringMatch::Suffix("/sa/web".into()), &three);
        strings.add(&StringMatch::Prefix(String::new()), &four);
        let hits = |value: &str| {
            let mut seen = Vec::new();
            strings.probe(value, |l| {
                seen.extend(l.iter().map(|c| c.policy.name.clone()));
                None::<()>
            });
            seen.sort_unstable();
            seen
        };
        assert_eq!(hits("tést"), ["1", "4"]);
        // Two bytes of "aé" end inside "é": no probe at that length, and no panic.
        assert_eq!(hits("aé"), ["4"]);
        assert_eq!(hits("ns/shop/sa/web"), ["3", "4"]);
        assert_eq!(hits(""), ["4"]);
        strings.drop_key(&StringMatch::Prefix("té".into()), &one);
        strings.drop_key(&StringMatch::Prefix("tx".into()), &two);
        assert_eq!(strings.prefixes.lengths, [(0, 1)]);
    }
}
