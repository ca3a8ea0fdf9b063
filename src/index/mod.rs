//! Index-node caching: deserialized Parquet footers (with their page index) and bloom
//! filters, decoded once per object version and shared, immutable, by every scan.
//!
//! One size-weighted cache holds every entry. Concurrent misses for one key make one load: the
//! first caller's load runs as a task of its own, which everyone who asks meanwhile joins. A
//! failed load is not kept, and its error is its store identity's alone: a waiter of the same
//! identity gets it, a waiter of another loads again with its own store. A load that panics is
//! an error, not a poisoned key; a load whose every waiter has gone (its query was cancelled)
//! is aborted, so it holds nothing of that query. Only versions whose bytes can be told apart
//! are kept ([`ObjectVersion::pins_bytes`]): a footer read at a version known by its time
//! alone is returned, never cached.
//!
//! [`footer`] fetches and checks footers: what a load of a footer runs; `schemas` gives the
//! footers of one schema one copy of it (the weigher still counts it in each footer's
//! `memory_size`, so the bound errs high).

pub mod footer;
mod schemas;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use datafusion::datasource::physical_plan::parquet::metadata::CachedParquetMetaData;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use moka::sync::Cache;
use parquet::file::metadata::ParquetMetaData;
use tokio::task::AbortHandle;

use crate::config::IndexConfig;
use crate::object::{ByObject, ObjectId, ObjectVersion, StoreIdentity};
use crate::stats::{CacheCounters, IndexStats, settle};

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum IndexKey {
    /// The footer of one object version.
    Footer(ObjectVersion),
    /// The bloom filter of one column chunk: (row group, column).
    Bloom(ObjectVersion, usize, usize),
}

impl IndexKey {
    fn object(&self) -> &ObjectVersion {
        match self {
            Self::Footer(o) | Self::Bloom(o, _, _) => o,
        }
    }
}

#[derive(Debug, Clone)]
enum IndexEntry {
    Footer(Arc<ParquetMetaData>),
    /// Bloom filter bytes (header and bitset), in a buffer of their own; `None` records that
    /// the chunk has none.
    Bloom(Option<Bytes>),
}

impl IndexEntry {
    /// Heap bytes the entry holds, the weight it counts against the capacity.
    fn weight(&self) -> usize {
        let body = match self {
            Self::Footer(m) => m.memory_size(),
            Self::Bloom(b) => b.as_ref().map_or(0, Bytes::len),
        };
        body + 64
    }
}

type LoadResult = std::result::Result<IndexEntry, Arc<DataFusionError>>;

/// A load under way and who waits for it.
struct Loading {
    id: u64,
    /// The identity whose store the load reads: its error is that identity's alone.
    identity: StoreIdentity,
    shared: Shared<BoxFuture<'static, LoadResult>>,
    waiters: usize,
    abort: Option<AbortHandle>,
}

/// The shared cache of deserialized Parquet index structures. Cheap to clone.
///
/// Users reach it through a `LakeCache`:
///
/// ```
/// let lake = datafusion_lakecache::LakeCache::builder().build().unwrap();
/// assert_eq!(lake.stats().index.bytes, 0);
/// ```
#[derive(Clone)]
pub struct IndexCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for IndexCache {
    // Not derived: moka's `Debug` prints every entry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexCache")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: IndexConfig,
    entries: Cache<IndexKey, IndexEntry>,
    /// The keys `entries` holds, by object: what forgetting an object drops.
    keys: Arc<ByObject<IndexKey>>,
    loading: Mutex<HashMap<IndexKey, Loading>>,
    next_load: AtomicU64,
    counters: Arc<CacheCounters>,
    /// The share of `counters` that concerns bloom filters.
    blooms: Arc<CacheCounters>,
    footer_loads: AtomicU64,
    bloom_loads: AtomicU64,
    rejected: AtomicU64,
    /// Loads that failed for another identity and were made again by a waiter.
    reloads: AtomicU64,
    /// Footers loaded (or proven) for a listing before it ended.
    warmed: AtomicU64,
    /// Footers served to DataFusion's planning.
    planning_hits: AtomicU64,
}

impl IndexCache {
    /// The bytes (as weighed against the capacity) of the footer and of the bloom filters
    /// each cached version holds.
    pub(crate) fn bytes_by_version(&self) -> HashMap<ObjectVersion, (u64, u64)> {
        let mut out: HashMap<ObjectVersion, (u64, u64)> = HashMap::new();
        for (key, entry) in self.inner.entries.iter() {
            let bytes = entry.weight() as u64;
            let held = out.entry(key.object().clone()).or_default();
            match key.as_ref() {
                IndexKey::Footer(_) => held.0 += bytes,
                IndexKey::Bloom(..) => held.1 += bytes,
            }
        }
        out
    }

    /// Builds a cache after validating `config`.
    pub fn try_new(config: IndexConfig) -> Result<Self> {
        let counters = Arc::new(CacheCounters::default());
        let blooms = Arc::new(CacheCounters::default());
        let keys: Arc<ByObject<IndexKey>> = Arc::default();
        let entries = Cache::builder()
            .max_capacity(config.capacity_bytes)
            .weigher(|_, v: &IndexEntry| u32::try_from(v.weight()).unwrap_or(u32::MAX))
            .eviction_listener({
                let (c, b, keys) = (
                    Arc::clone(&counters),
                    Arc::clone(&blooms),
                    Arc::clone(&keys),
                );
                move |key: Arc<IndexKey>, _, cause| {
                    c.removed(cause);
                    keys.removed(key.object().id(), &key);
                    if matches!(*key, IndexKey::Bloom(..)) {
                        b.removed(cause);
                    }
                }
            })
            .build();
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                entries,
                keys,
                loading: Mutex::default(),
                next_load: AtomicU64::new(0),
                counters,
                blooms,
                footer_loads: AtomicU64::new(0),
                bloom_loads: AtomicU64::new(0),
                rejected: AtomicU64::new(0),
                reloads: AtomicU64::new(0),
                warmed: AtomicU64::new(0),
                planning_hits: AtomicU64::new(0),
            }),
        })
    }

    /// The bytes of footers, page indexes and bloom filters the cache keeps at most.
    pub(crate) fn capacity_bytes(&self) -> u64 {
        self.inner.config.capacity_bytes
    }

    /// The bytes the cache can take before it evicts anything (once pending maintenance ran).
    pub(crate) fn free_bytes(&self) -> u64 {
        let i = &self.inner;
        settle(&i.entries, i.config.capacity_bytes);
        i.config
            .capacity_bytes
            .saturating_sub(i.entries.weighted_size())
    }

    /// Footer lookups so far (hits and misses), read without cache maintenance.
    pub(crate) fn footer_lookups(&self) -> u64 {
        let i = &self.inner;
        i.counters.lookups().saturating_sub(i.blooms.lookups())
    }

    /// A snapshot of the figures.
    pub fn stats(&self) -> IndexStats {
        let i = &self.inner;
        settle(&i.entries, i.config.capacity_bytes);
        let (mut bloom_entries, mut bloom_bytes) = (0, 0);
        for (key, entry) in i.entries.iter() {
            if matches!(*key, IndexKey::Bloom(..)) {
                bloom_entries += 1;
                bloom_bytes += entry.weight() as u64;
            }
        }
        IndexStats {
            footers: i.counters.snapshot(i.entries.entry_count()),
            bytes: i.entries.weighted_size(),
            footer_loads: i.footer_loads.load(Relaxed),
            bloom_loads: i.bloom_loads.load(Relaxed),
            rejected: i.rejected.load(Relaxed),
            bloom_filters: i.blooms.snapshot(bloom_entries),
            bloom_bytes,
            loads_in_flight: lock(&i.loading).len() as u64,
            reloads: i.reloads.load(Relaxed),
            warmed: i.warmed.load(Relaxed),
            planning_hits: i.planning_hits.load(Relaxed),
        }
    }

    /// Loads running now.
    #[cfg(test)]
    fn loads_in_flight(&self) -> usize {
        lock(&self.inner.loading).len()
    }

    /// Drops every entry.
    pub fn clear(&self) {
        self.inner.entries.invalidate_all();
        self.inner.entries.run_pending_tasks();
    }

    /// Drops every entry of one object, whatever its version.
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        self.invalidate_where(id, |_| true);
    }

    /// Drops the entries of the versions of one object that are `identity`'s alone.
    pub(crate) fn invalidate_owned(&self, id: &ObjectId, identity: &StoreIdentity) {
        self.invalidate_where(id, |k| k.object().owner() == Some(identity));
    }

    /// Drops the entries of one version of an object.
    pub(crate) fn invalidate_version(&self, version: &ObjectVersion) {
        self.invalidate_where(version.id(), |k| k.object() == version);
    }

    /// Drops the entries of object `id` whose keys `which` picks.
    fn invalidate_where(&self, id: &ObjectId, which: impl Fn(&IndexKey) -> bool) {
        for key in self.inner.keys.keys(id) {
            if which(&key) {
                self.inner.entries.invalidate(&key);
            }
        }
    }

    /// The footer of `version`, from the cache or from `load` (run once however many callers
    /// ask at the same time), and whether it was found rather than loaded by this caller.
    /// `load` reads through a store of `identity`. The metadata it returns should hold the
    /// page index.
    pub async fn metadata<F>(
        &self,
        version: &ObjectVersion,
        identity: &StoreIdentity,
        load: F,
    ) -> Result<(Arc<ParquetMetaData>, bool)>
    where
        F: Future<Output = Result<Arc<ParquetMetaData>>> + Send + 'static,
    {
        let loads = Arc::clone(&self.inner);
        let load = async move {
            loads.footer_loads.fetch_add(1, Relaxed);
            load.await.map(IndexEntry::Footer)
        };
        match self
            .get_or_load(IndexKey::Footer(version.clone()), identity, load)
            .await?
        {
            (IndexEntry::Footer(m), hit) => Ok((m, hit)),
            _ => Err(mixed_up()),
        }
    }

    /// The footer DataFusion's planning decoded for `version` (read from `planning`, the
    /// session's own `FileMetadataCache`, by a store of `identity`), if it is provably that
    /// version's: the entry was made for the same size and the same content digest, and
    /// holds the page index. Scans then need not read it again.
    ///
    /// DataFusion keys the entry by path alone: any store of the session at that path may
    /// have made it. So only a validator that names the bytes themselves (an e_tag that is a
    /// digest) proves it: a counter or a time (the in-memory store's e_tags, Azure's, some
    /// S3-compatible servers'), a version id or a log-named size tells versions apart only
    /// within one store, and two stores may show the same one for other bytes.
    pub fn planned_footer(
        planning: &FileMetadataCache,
        version: &ObjectVersion,
        identity: &StoreIdentity,
    ) -> Option<Arc<ParquetMetaData>> {
        if !version.validator().names_content() {
            return None;
        }
        let entry = planning.get(version.path())?;
        let made_for = version.reseen(identity, &entry.meta);
        if &made_for != version {
            return None;
        }
        let footer = entry
            .file_metadata
            .as_any()
            .downcast_ref::<CachedParquetMetaData>()?
            .parquet_metadata();
        (footer.column_index().is_some() && footer.offset_index().is_some())
            .then(|| Arc::clone(footer))
    }

    /// Keeps `footer` as `version`'s, read by a load outside the single flight (a version a
    /// listing named by size and time, pinned by the load's first response).
    pub(crate) fn keep_footer(&self, version: &ObjectVersion, footer: Arc<ParquetMetaData>) {
        let key = IndexKey::Footer(version.clone());
        if self.inner.entries.get(&key).is_none() {
            self.inner.footer_loads.fetch_add(1, Relaxed);
            self.admit(&key, IndexEntry::Footer(footer));
        }
    }

    /// The bloom filter of (row group, column) of `version` if the cache holds it (`Some(None)`:
    /// the chunk has none), without loading it or counting a lookup.
    pub(crate) fn cached_bloom(
        &self,
        version: &ObjectVersion,
        row_group: usize,
        column: usize,
    ) -> Option<Option<Bytes>> {
        let key = IndexKey::Bloom(version.clone(), row_group, column);
        match self.inner.entries.get(&key)? {
            IndexEntry::Bloom(b) => Some(b),
            IndexEntry::Footer(_) => None,
        }
    }

    /// Keeps `filter` as the bloom filter of (row group, column) of `version`, read outside
    /// the single flight (a prefetch of a scan's bloom filters, in one request), in a buffer
    /// of its own.
    pub(crate) fn keep_bloom(
        &self,
        version: &ObjectVersion,
        row_group: usize,
        column: usize,
        filter: &Bytes,
    ) {
        let key = IndexKey::Bloom(version.clone(), row_group, column);
        if self.inner.entries.get(&key).is_none() {
            self.inner.bloom_loads.fetch_add(1, Relaxed);
            let entry = IndexEntry::Bloom(Some(Bytes::copy_from_slice(filter)));
            self.admit(&key, entry);
        }
    }

    /// Counts a footer loaded (or proven) for a listing before it ended.
    pub(crate) fn note_warmed(&self) {
        self.inner.warmed.fetch_add(1, Relaxed);
    }

    /// Counts a footer served to DataFusion's planning on a miss of its own footer cache.
    pub(crate) fn note_planning_hit(&self) {
        self.inner.planning_hits.fetch_add(1, Relaxed);
    }

    /// The cached footer of `version`, if present, without loading it.
    pub fn cached_metadata(&self, version: &ObjectVersion) -> Option<Arc<ParquetMetaData>> {
        match self.inner.entries.get(&IndexKey::Footer(version.clone()))? {
            IndexEntry::Footer(m) => Some(m),
            _ => None,
        }
    }

    /// The bloom filter bytes of (row group, column) of `version`, or `None` if that column
    /// chunk has none; from the cache or from `load` (reading through a store of
    /// `identity`), run once per key. The second value says whether it was found rather than
    /// loaded by this caller.
    pub async fn bloom_filter<F>(
        &self,
        version: &ObjectVersion,
        identity: &StoreIdentity,
        row_group: usize,
        column: usize,
        load: F,
    ) -> Result<(Option<Bytes>, bool)>
    where
        F: Future<Output = Result<Option<Bytes>>> + Send + 'static,
    {
        let loads = Arc::clone(&self.inner);
        let load = async move {
            loads.bloom_loads.fetch_add(1, Relaxed);
            // A buffer of its own: a slice would keep the whole download it came from alive,
            // counted as only the slice's length.
            let filter = load.await?;
            Ok(IndexEntry::Bloom(
                filter.map(|b| Bytes::copy_from_slice(&b)),
            ))
        };
        let key = IndexKey::Bloom(version.clone(), row_group, column);
        match self.get_or_load(key, identity, load).await? {
            (IndexEntry::Bloom(b), hit) => Ok((b, hit)),
            _ => Err(mixed_up()),
        }
    }

    async fn get_or_load<F>(
        &self,
        key: IndexKey,
        identity: &StoreIdentity,
        load: F,
    ) -> Result<(IndexEntry, bool)>
    where
        F: Future<Output = Result<IndexEntry>> + Send + 'static,
    {
        let bloom = matches!(key, IndexKey::Bloom(..));
        let mut load = Some(load);
        // At most once per identity whose load failed: a waiter whose load failed on another
        // identity's error loads again, with its own store.
        loop {
            if let Some(hit) = self.inner.entries.get(&key) {
                self.count(bloom, true);
                return Ok((hit, true));
            }
            let (shared, id, loader, fresh) = {
                let mut loading = lock(&self.inner.loading);
                match loading.get_mut(&key) {
                    Some(l) => {
                        l.waiters += 1;
                        (l.shared.clone(), l.id, l.identity.clone(), false)
                    }
                    None => {
                        // A load that just finished may have admitted the entry between the
                        // miss above and taking the lock: take it rather than load again.
                        if let Some(hit) = self.inner.entries.get(&key) {
                            drop(loading);
                            self.count(bloom, true);
                            return Ok((hit, true));
                        }
                        let Some(load) = load.take() else {
                            return Err(DataFusionError::Internal(
                                "an index load ran twice for one caller".into(),
                            ));
                        };
                        let id = self.inner.next_load.fetch_add(1, Relaxed);
                        let (shared, abort) = self.start(key.clone(), id, load);
                        let entry = Loading {
                            id,
                            identity: identity.clone(),
                            shared: shared.clone(),
                            waiters: 1,
                            abort,
                        };
                        loading.insert(key.clone(), entry);
                        (shared, id, identity.clone(), true)
                    }
                }
            };
            self.count(bloom, !fresh);
            let waiter = Waiter {
                cache: self.clone(),
                key: key.clone(),
                id,
            };
            let result = shared.await;
            drop(waiter);
            match result {
                Ok(entry) => return Ok((entry, !fresh)),
                Err(e) if fresh || &loader == identity => return Err(DataFusionError::Shared(e)),
                Err(_) => {
                    self.inner.reloads.fetch_add(1, Relaxed);
                    continue;
                }
            }
        }
    }

    fn count(&self, bloom: bool, hit: bool) {
        let counters = [
            Some(&self.inner.counters),
            bloom.then_some(&self.inner.blooms),
        ];
        for c in counters.into_iter().flatten() {
            match hit {
                true => c.hit(),
                false => c.miss(),
            }
        }
    }

    /// Starts the load of `key` as a task of its own (inline outside a Tokio runtime).
    fn start<F>(
        &self,
        key: IndexKey,
        id: u64,
        load: F,
    ) -> (Shared<BoxFuture<'static, LoadResult>>, Option<AbortHandle>)
    where
        F: Future<Output = Result<IndexEntry>> + Send + 'static,
    {
        let this = self.clone();
        let task = async move {
            let done = Done {
                cache: this.clone(),
                key: key.clone(),
                id,
            };
            let loaded = load.await;
            if let Ok(entry) = &loaded {
                this.admit(&key, entry.clone());
            }
            drop(done);
            loaded.map_err(Arc::new)
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let handle = runtime.spawn(task);
                let abort = handle.abort_handle();
                let joined = handle.map(|joined| {
                    joined.unwrap_or_else(|e| {
                        let why = if e.is_panic() {
                            "panicked"
                        } else {
                            "was cancelled"
                        };
                        Err(Arc::new(DataFusionError::Execution(format!(
                            "loading a Parquet index entry {why}"
                        ))))
                    })
                });
                (joined.boxed().shared(), Some(abort))
            }
            Err(_) => (task.boxed().shared(), None),
        }
    }

    /// Removes the load `id` of `key` from the single-flight map, if it is still there.
    fn forget_load(&self, key: &IndexKey, id: u64) -> Option<Loading> {
        let mut loading = lock(&self.inner.loading);
        match loading.get(key) {
            Some(l) if l.id == id => loading.remove(key),
            _ => None,
        }
    }

    /// Keeps `entry` unless it is larger than the per-entry share of the capacity, or of a
    /// version whose bytes cannot be told apart from another's (known by its time alone).
    fn admit(&self, key: &IndexKey, entry: IndexEntry) {
        let i = &self.inner;
        if !i.config.enabled || !key.object().pins_bytes() {
            return;
        }
        if entry.weight() as u64 > i.config.max_entry_bytes() {
            i.rejected.fetch_add(1, Relaxed);
            return;
        }
        i.keys.added(key.object().id(), key);
        i.entries.insert(key.clone(), entry);
    }
}

fn mixed_up() -> DataFusionError {
    DataFusionError::Internal("an index entry of another kind under this key".into())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// One caller waiting for a load: the last to go aborts a load nobody waits for.
struct Waiter {
    cache: IndexCache,
    key: IndexKey,
    id: u64,
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let mut loading = lock(&self.cache.inner.loading);
        let Some(l) = loading.get_mut(&self.key).filter(|l| l.id == self.id) else {
            return;
        };
        l.waiters -= 1;
        if l.waiters == 0
            && let Some(l) = loading.remove(&self.key)
            && let Some(abort) = l.abort
        {
            abort.abort();
        }
    }
}

/// Held by a running load: however it ends (done, failed, panicked, aborted), it leaves the
/// single-flight map.
struct Done {
    cache: IndexCache,
    key: IndexKey,
    id: u64,
}

impl Drop for Done {
    fn drop(&mut self) {
        self.cache.forget_load(&self.key, self.id);
    }
}

#[cfg(test)]
mod tests;
