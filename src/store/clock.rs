//! [`ClockCache`]: DataFusion's path-keyed caches (footers, statistics) as an installed
//! session keeps them.
//!
//! DataFusion's `DefaultCache` keeps an exact least-recently-used order: every lookup takes
//! the cache's one lock, takes the entry out and puts it back (a new list node and two copies
//! of its key) and counts the hit in a second map. Planning a table looks up every file's
//! statistics on every plan, so at a million files those lookups were a fifth of a warm plan
//! (docs/benchmarks.md, "Scale"). Here a lookup is one probe of one of 16 shards, and marks
//! the entry used; eviction is CLOCK (second chance) over each shard's insertion order. The
//! rest is `DefaultCache`'s: a bound in bytes (key and value, as they weigh themselves), an
//! optional time to live stamped at insertion, and no entry of size 0 or larger than the
//! bound.

use std::collections::VecDeque;
use std::hash::Hasher;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use datafusion::common::instant::Instant;
use datafusion::common::{HashMap, TableReference};
use datafusion::execution::cache::{Cache, CacheEntryInfo, CacheKey, CacheValue};
use twox_hash::XxHash64;

const SHARDS: usize = 16;

/// A byte-bounded cache for DataFusion's path-keyed caches; see the module docs.
pub(crate) struct ClockCache<K, V> {
    shards: [Mutex<Shard<K, V>>; SHARDS],
    limit: AtomicUsize,
    /// Bytes of the entries held (key and value), and their number.
    used: AtomicUsize,
    entries: AtomicUsize,
    /// The shard the next eviction looks in.
    hand: AtomicUsize,
    ttl: Mutex<Option<Duration>>,
    name: String,
}

struct Shard<K, V> {
    map: HashMap<Arc<K>, Slot<V>>,
    /// The keys in the order they were put: the clock's hand takes them from the front. A key
    /// removed or put again since stays until the hand passes it (or the ring is compacted).
    ring: VecDeque<Arc<K>>,
}

impl<K: CacheKey, V> Shard<K, V> {
    /// Drops the ring's keys of entries removed or put again since.
    fn compact(&mut self) {
        let Shard { map, ring } = self;
        ring.retain(|k| {
            map.get_key_value(&**k)
                .is_some_and(|(h, _)| Arc::ptr_eq(h, k))
        });
    }
}

struct Slot<V> {
    value: V,
    /// The key's and the value's bytes, as weighed when put.
    size: usize,
    /// Looked up since the hand last passed: kept one more round.
    used: bool,
    hits: usize,
    expires: Option<Instant>,
    /// What the caller of [`ClockCache::get_if`] keeps with the entry; 0 when put.
    mark: u64,
}

impl<K: CacheKey, V: CacheValue> ClockCache<K, V> {
    /// A cache named `name` that holds at most `limit` bytes.
    pub(crate) fn new(limit: usize, name: &str) -> Self {
        Self {
            shards: std::array::from_fn(|_| {
                Mutex::new(Shard {
                    map: HashMap::default(),
                    ring: VecDeque::new(),
                })
            }),
            limit: AtomicUsize::new(limit),
            used: AtomicUsize::new(0),
            entries: AtomicUsize::new(0),
            hand: AtomicUsize::new(0),
            ttl: Mutex::new(None),
            name: name.to_string(),
        }
    }

    fn shard_of(key: &K) -> usize {
        let mut hasher = XxHash64::with_seed(0);
        key.hash(&mut hasher);
        hasher.finish() as usize % SHARDS
    }

    fn lock(&self, shard: usize) -> MutexGuard<'_, Shard<K, V>> {
        self.shards[shard].lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes `key`'s entry out of `shard`, with the figures.
    fn take(&self, shard: &mut Shard<K, V>, key: &K) -> Option<V> {
        let (_, slot) = shard.map.remove_entry(key)?;
        self.used.fetch_sub(slot.size, Relaxed);
        self.entries.fetch_sub(1, Relaxed);
        Some(slot.value)
    }

    /// Evicts until the entries fit the bound: one entry from each shard in turn, so that
    /// the shards are passed as one clock would pass them all.
    fn evict(&self) {
        // Shards in a row that had nothing to evict: a second round finds the entries the
        // first one cleared the marks of.
        let mut idle = 0;
        while self.used.load(Relaxed) > self.limit.load(Relaxed) && idle < 2 * SHARDS {
            let mut shard = self.lock(self.hand.fetch_add(1, Relaxed) % SHARDS);
            match self.evict_one(&mut shard) {
                true => idle = 0,
                false => idle += 1,
            }
        }
    }

    /// Evicts the first entry of `shard`'s ring not looked up since the hand last passed it,
    /// clearing the marks of those passed; `false` if one round found none.
    fn evict_one(&self, shard: &mut Shard<K, V>) -> bool {
        for _ in 0..shard.ring.len() {
            let Some(key) = shard.ring.pop_front() else {
                break;
            };
            let Some((held, slot)) = shard.map.get_key_value_mut(&*key) else {
                continue;
            };
            if !Arc::ptr_eq(held, &key) {
                // Removed and put again since: its own key is further on.
                continue;
            }
            if std::mem::replace(&mut slot.used, false) {
                shard.ring.push_back(key);
                continue;
            }
            self.take(shard, &key);
            return true;
        }
        false
    }

    /// `key`'s value if `serve`, given it and the mark kept with it (0 when it was put),
    /// says so; `serve` may set the mark. A value refused is removed under the same lock, so
    /// a value put meanwhile is never taken for it.
    pub(crate) fn get_if(&self, key: &K, serve: impl FnOnce(&V, &mut u64) -> bool) -> Option<V> {
        let mut shard = self.lock(Self::shard_of(key));
        let slot = shard.map.get_mut(key)?;
        if slot.expires.is_some_and(|at| Instant::now() > at) || !serve(&slot.value, &mut slot.mark)
        {
            self.take(&mut shard, key);
            return None;
        }
        slot.used = true;
        slot.hits += 1;
        Some(slot.value.clone())
    }
}

impl<K: CacheKey + 'static, V: CacheValue + 'static> Cache<K, V> for ClockCache<K, V> {
    fn get(&self, key: &K) -> Option<V> {
        self.get_if(key, |_, _| true)
    }

    fn put(&self, key: &K, value: V) -> Option<V> {
        let value_size = value.size();
        if value_size == 0 {
            return None;
        }
        let size = key.size() + value_size;
        let which = Self::shard_of(key);
        if size > self.limit.load(Relaxed) {
            // Not kept, nor the entry it was to replace.
            return self.remove(key);
        }
        let ttl = *self.ttl.lock().unwrap_or_else(|e| e.into_inner());
        let expires = ttl.map(|ttl| Instant::now() + ttl);
        let old = {
            let mut shard = self.lock(which);
            let old = self.take(&mut shard, key);
            let key = Arc::new(key.clone());
            let slot = Slot {
                value,
                size,
                used: false,
                hits: 0,
                expires,
                mark: 0,
            };
            shard.map.insert(Arc::clone(&key), slot);
            shard.ring.push_back(key);
            self.used.fetch_add(size, Relaxed);
            self.entries.fetch_add(1, Relaxed);
            // Keys removed or put again pile up in the ring until the hand passes them:
            // dropped once they are as many as the live ones.
            if shard.ring.len() > 2 * shard.map.len() + 16 {
                shard.compact();
            }
            old
        };
        self.evict();
        old
    }

    fn remove(&self, k: &K) -> Option<V> {
        let mut shard = self.lock(Self::shard_of(k));
        self.take(&mut shard, k)
    }

    fn contains_key(&self, k: &K) -> bool {
        let shard = self.lock(Self::shard_of(k));
        shard
            .map
            .get(k)
            .is_some_and(|slot| slot.expires.is_none_or(|at| Instant::now() <= at))
    }

    fn len(&self) -> usize {
        self.entries.load(Relaxed)
    }

    fn clear(&self) {
        for i in 0..SHARDS {
            let mut shard = self.lock(i);
            for (_, slot) in shard.map.drain() {
                self.used.fetch_sub(slot.size, Relaxed);
                self.entries.fetch_sub(1, Relaxed);
            }
            shard.ring.clear();
        }
    }

    fn name(&self) -> String {
        self.name.clone()
    }

    fn cache_limit(&self) -> usize {
        self.limit.load(Relaxed)
    }

    fn update_cache_limit(&self, limit: usize) {
        self.limit.store(limit, Relaxed);
        self.evict();
    }

    fn cache_ttl(&self) -> Option<Duration> {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn update_cache_ttl(&self, ttl: Option<Duration>) {
        *self.ttl.lock().unwrap_or_else(|e| e.into_inner()) = ttl;
    }

    fn drop_table_entries(&self, table_ref: &TableReference) -> datafusion::error::Result<()> {
        for i in 0..SHARDS {
            let mut shard = self.lock(i);
            let dropped: Vec<Arc<K>> = shard
                .map
                .keys()
                .filter(|k| k.table_ref() == Some(table_ref))
                .cloned()
                .collect();
            for k in dropped {
                self.take(&mut shard, &k);
            }
            shard.compact();
        }
        Ok(())
    }

    fn list_entries(&self) -> HashMap<K, CacheEntryInfo<V>> {
        let mut all = HashMap::default();
        for i in 0..SHARDS {
            let shard = self.lock(i);
            for (k, slot) in &shard.map {
                let info = CacheEntryInfo {
                    value: slot.value.clone(),
                    size_bytes: slot.size - k.size(),
                    hits: slot.hits,
                    expires: slot.expires,
                };
                all.insert(K::clone(k), info);
            }
        }
        all
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::cache::TableScopedPath;
    use object_store::path::Path;

    use super::*;

    /// A value that weighs what it says.
    #[derive(Clone, Debug, PartialEq)]
    struct Weighs(usize);

    impl CacheValue for Weighs {
        fn size(&self) -> usize {
            self.0
        }
    }

    fn key(table: Option<&str>, path: &str) -> TableScopedPath {
        TableScopedPath {
            table: table.map(TableReference::bare),
            path: Path::from(path),
        }
    }

    fn cache(limit: usize) -> ClockCache<TableScopedPath, Weighs> {
        ClockCache::new(limit, "test")
    }

    #[test]
    fn entries_past_the_bound_are_evicted_and_one_looked_up_gets_a_second_chance() {
        let k = |i: usize| key(None, &format!("f{i:02}"));
        let each = k(0).size() + 100;
        let c = cache(each * 20);
        for i in 0..20 {
            c.put(&k(i), Weighs(100));
        }
        assert_eq!(c.len(), 20);
        // Every entry of one shard looked up: the next entries evicted are others.
        let shard = ClockCache::<TableScopedPath, Weighs>::shard_of(&k(0));
        let looked_up: Vec<usize> = (0..20)
            .filter(|&i| ClockCache::<TableScopedPath, Weighs>::shard_of(&k(i)) == shard)
            .collect();
        assert!(
            !looked_up.is_empty() && looked_up.len() < 10,
            "{looked_up:?}"
        );
        for &i in &looked_up {
            assert_eq!(c.get(&k(i)), Some(Weighs(100)));
        }
        for i in 20..30 {
            c.put(&k(i), Weighs(100));
        }
        assert!(c.used.load(Relaxed) <= each * 20, "within the bound");
        assert_eq!(c.len(), 20);
        for &i in &looked_up {
            assert!(c.contains_key(&k(i)), "f{i:02} was looked up, and kept");
        }
        // What the entries weigh is what they were put with.
        let listed = c.list_entries();
        assert_eq!(listed.len(), 20);
        assert!(listed.values().all(|e| e.size_bytes == 100));
    }

    #[test]
    fn an_entry_of_nothing_or_larger_than_the_bound_is_not_kept_nor_the_one_it_replaces() {
        let c = cache(1_000);
        let a = key(None, "a");
        assert!(c.put(&a, Weighs(0)).is_none());
        assert!(!c.contains_key(&a));
        c.put(&a, Weighs(10));
        assert_eq!(c.put(&a, Weighs(5_000)), Some(Weighs(10)));
        assert!(!c.contains_key(&a));
        assert_eq!((c.len(), c.used.load(Relaxed)), (0, 0));
    }

    #[test]
    fn entries_put_again_weigh_once_and_the_ring_stays_bounded() {
        let c = cache(1 << 20);
        let a = key(None, "a");
        for i in 1..=1_000 {
            c.put(&a, Weighs(i));
            if i % 2 == 0 {
                c.remove(&a);
            }
        }
        assert_eq!(c.len(), 0);
        assert_eq!(c.used.load(Relaxed), 0);
        c.put(&a, Weighs(7));
        assert_eq!(c.used.load(Relaxed), a.size() + 7);
        let ring: usize = (0..SHARDS).map(|i| c.lock(i).ring.len()).sum();
        assert!(ring <= 2 + 16, "{ring} keys in the ring for one entry");
    }

    #[test]
    fn a_time_to_live_expires_entries_put_after_it_is_set() {
        let c = cache(1 << 20);
        c.put(&key(None, "before"), Weighs(1));
        c.update_cache_ttl(Some(Duration::from_millis(1)));
        c.put(&key(None, "after"), Weighs(1));
        std::thread::sleep(Duration::from_millis(20));
        assert!(c.get(&key(None, "before")).is_some());
        assert!(c.get(&key(None, "after")).is_none());
        assert_eq!(c.len(), 1);
    }

    #[test]
    fn dropping_a_tables_entries_leaves_the_others_and_a_lower_bound_evicts() {
        let c = cache(1 << 20);
        for i in 0..10 {
            c.put(&key(Some("t"), &format!("{i}")), Weighs(10));
            c.put(&key(Some("u"), &format!("{i}")), Weighs(10));
        }
        c.drop_table_entries(&TableReference::bare("t")).unwrap();
        assert_eq!(c.len(), 10);
        let ring: usize = (0..SHARDS).map(|i| c.lock(i).ring.len()).sum();
        assert_eq!(ring, 10, "the dropped entries' keys leave the ring");
        assert!(
            c.list_entries()
                .keys()
                .all(|k| k.table_ref() == Some(&"u".into()))
        );
        let one = key(Some("u"), "0").size() + 10;
        c.update_cache_limit(one * 3);
        assert_eq!((c.cache_limit(), c.len()), (one * 3, 3));
        c.clear();
        assert_eq!((c.len(), c.used.load(Relaxed)), (0, 0));
    }
}
