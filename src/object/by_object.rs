//! [`ByObject`]: the keys a cache holds, by the object they concern, so that forgetting an
//! object drops exactly its entries.
//!
//! moka's `invalidate_entries_if` keeps each predicate until its sweep has visited every
//! entry, and evaluates every pending predicate on every lookup meanwhile: 100,000 writes
//! through the wrapper (each forgetting its object) made every footer and proof lookup
//! milliseconds long. With the keys of each object at hand, forgetting it is one removal
//! per key it has, and lookups pay nothing.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Mutex, MutexGuard};

use super::ObjectId;
use crate::few_map::FewMap;

/// The keys of one object, each with how many insertions of it the cache has not yet
/// reported removed. Mostly one (its footer): kept inline.
type Keys<K> = FewMap<K, u32>;

/// Shards of the map, each behind its own lock: caches of every session update it.
const SHARDS: usize = 16;

/// Keys by object. Each insertion of a key into the cache counts once and each removal
/// notification (replaced, expired, evicted, invalidated) once: a key recorded again over
/// an entry moka has not swept yet stays listed while the cache holds it.
pub(crate) struct ByObject<K> {
    shards: [Mutex<HashMap<ObjectId, Keys<K>>>; SHARDS],
    hasher: RandomState,
}

impl<K> Default for ByObject<K> {
    fn default() -> Self {
        Self {
            shards: std::array::from_fn(|_| Mutex::default()),
            hasher: RandomState::new(),
        }
    }
}

impl<K: Hash + Eq + Clone> ByObject<K> {
    fn shard(&self, id: &ObjectId) -> MutexGuard<'_, HashMap<ObjectId, Keys<K>>> {
        let at = self.hasher.hash_one(id) as usize % SHARDS;
        self.shards[at].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `key`, of object `id`, goes into the cache.
    pub(crate) fn added(&self, id: &ObjectId, key: &K) {
        let mut shard = self.shard(id);
        *shard.entry(id.clone()).or_default().get_or_default(key) += 1;
    }

    /// An entry under `key` left the cache.
    pub(crate) fn removed(&self, id: &ObjectId, key: &K) {
        let mut shard = self.shard(id);
        let Some(keys) = shard.get_mut(id) else {
            return;
        };
        if let Some(count) = keys.get_mut(key) {
            *count -= 1;
            if *count == 0 {
                keys.remove(key);
            }
        }
        if keys.is_empty() {
            shard.remove(id);
        }
    }

    /// The keys the cache holds of object `id`.
    pub(crate) fn keys(&self, id: &ObjectId) -> Vec<K> {
        let shard = self.shard(id);
        shard
            .get(id)
            .map(|keys| keys.keys().cloned().collect())
            .unwrap_or_default()
    }

    /// Objects listed now (for tests of the bookkeeping).
    #[cfg(test)]
    pub(crate) fn objects(&self) -> usize {
        self.shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|e| e.into_inner()).len())
            .sum()
    }
}

impl<K> std::fmt::Debug for ByObject<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ByObject")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::object::StoreKey;
    use object_store::path::Path;

    fn id(path: &str) -> ObjectId {
        ObjectId {
            store: StoreKey::of(&url::Url::parse("s3://b").unwrap()),
            path: Path::from(path),
        }
    }

    #[test]
    fn a_key_added_twice_stays_until_removed_twice() {
        let keys: ByObject<u32> = ByObject::default();
        keys.added(&id("a"), &1);
        keys.added(&id("a"), &1);
        keys.added(&id("a"), &2);
        keys.removed(&id("a"), &1);
        let mut held = keys.keys(&id("a"));
        held.sort();
        assert_eq!(held, [1, 2]);
        keys.removed(&id("a"), &1);
        keys.removed(&id("a"), &2);
        assert!(keys.keys(&id("a")).is_empty());
        assert_eq!(keys.objects(), 0, "an object with no key goes");
        keys.removed(&id("b"), &7);
        assert_eq!(keys.objects(), 0, "a removal of nothing listed is nothing");
    }
}
