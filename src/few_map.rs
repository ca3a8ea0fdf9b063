//! [`FewMap`]: a map that mostly holds one entry, kept inline; a hash map past a handful.
//!
//! The caches keep small maps per object (the identities that showed it, the index entries
//! of it). At a million objects a hash map each is a million allocations of four buckets
//! or more, for one entry apiece; kept inline, the one entry costs its own bytes alone.

use std::collections::HashMap;
use std::hash::Hash;

use smallvec::SmallVec;

/// Entries a [`FewMap`] keeps inline and searches in turn, before it takes a hash map.
const FEW: usize = 8;

/// A map of a few entries searched in turn, a hash map once it holds more than [`FEW`]: one
/// key of many is still found in one probe.
#[derive(Debug)]
pub(crate) enum FewMap<K, V> {
    Few(SmallVec<[(K, V); 1]>),
    Many(HashMap<K, V>),
}

impl<K, V> Default for FewMap<K, V> {
    fn default() -> Self {
        Self::Few(SmallVec::new())
    }
}

impl<K: Hash + Eq, V> FewMap<K, V> {
    pub(crate) fn len(&self) -> usize {
        match self {
            Self::Few(few) => few.len(),
            Self::Many(many) => many.len(),
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(crate) fn get(&self, key: &K) -> Option<&V> {
        match self {
            Self::Few(few) => few.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            Self::Many(many) => many.get(key),
        }
    }

    pub(crate) fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        match self {
            Self::Few(few) => few.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            Self::Many(many) => many.get_mut(key),
        }
    }

    pub(crate) fn remove(&mut self, key: &K) -> Option<V> {
        match self {
            Self::Few(few) => {
                let at = few.iter().position(|(k, _)| k == key)?;
                Some(few.swap_remove(at).1)
            }
            Self::Many(many) => many.remove(key),
        }
    }

    /// Every entry, in no particular order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&K, &V)> {
        let (few, many) = match self {
            Self::Few(few) => (Some(few), None),
            Self::Many(many) => (None, Some(many)),
        };
        let few = few.into_iter().flatten().map(|(k, v)| (k, v));
        few.chain(many.into_iter().flatten())
    }

    /// Every key, in no particular order.
    pub(crate) fn keys(&self) -> impl Iterator<Item = &K> {
        self.iter().map(|(k, _)| k)
    }
}

impl<K: Hash + Eq + Clone, V: Default> FewMap<K, V> {
    /// The value of `key`, made with `V::default()` if there is none.
    pub(crate) fn get_or_default(&mut self, key: &K) -> &mut V {
        if let Self::Few(few) = self
            && few.len() >= FEW
            && !few.iter().any(|(k, _)| k == key)
        {
            *self = Self::Many(std::mem::take(few).into_iter().collect());
        }
        match self {
            Self::Few(few) => {
                let at = match few.iter().position(|(k, _)| k == key) {
                    Some(at) => at,
                    None => {
                        few.push((key.clone(), V::default()));
                        few.len() - 1
                    }
                };
                &mut few[at].1
            }
            Self::Many(many) => many.entry(key.clone()).or_default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_stays_inline_and_many_go_to_a_map_that_finds_each() {
        let mut map: FewMap<u32, u32> = FewMap::default();
        *map.get_or_default(&7) += 1;
        *map.get_or_default(&7) += 1;
        assert!(matches!(&map, FewMap::Few(few) if few.len() == 1 && !few.spilled()));
        assert_eq!(map.get(&7), Some(&2));
        for k in 0..100 {
            *map.get_or_default(&k) += 1;
        }
        assert!(
            matches!(map, FewMap::Many(_)),
            "past {FEW} entries, a hash map"
        );
        assert_eq!(map.len(), 100);
        assert_eq!(
            map.get(&7),
            Some(&3),
            "what the inline list held moved with it"
        );
        assert_eq!(map.remove(&7), Some(3));
        assert_eq!(map.get(&7), None);
        let mut keys: Vec<u32> = map.keys().copied().collect();
        keys.sort();
        assert_eq!(keys, (0..100).filter(|k| *k != 7).collect::<Vec<_>>());
    }

    #[test]
    fn removals_from_the_inline_list_leave_the_others() {
        let mut map: FewMap<&str, u32> = FewMap::default();
        for (i, k) in ["a", "b", "c"].into_iter().enumerate() {
            *map.get_or_default(&k) = i as u32;
        }
        assert_eq!(map.remove(&"a"), Some(0));
        assert_eq!(map.remove(&"a"), None);
        assert_eq!((map.get(&"b"), map.get(&"c")), (Some(&1), Some(&2)));
        *map.get_mut(&"c").unwrap() = 9;
        assert_eq!(map.iter().map(|(_, v)| *v).sum::<u32>(), 10);
        map.remove(&"b");
        map.remove(&"c");
        assert!(map.is_empty());
    }
}
