//! Index-node caching: deserialized Parquet footers (with their page index once loaded) and
//! bloom filters, decoded once per object version and shared, immutable, by every scan.
//!
//! One size-weighted cache holds every entry. Concurrent misses for one key make one load:
//! the first caller's load is shared (through moka's atomic `entry().or_insert_with`) with
//! everyone who asks meanwhile, and a failed load is handed to all of them and not kept.

mod datafusion_cache;

use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use bytes::Bytes;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::cache::cache_manager::CachedFileMetadataEntry;
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};
use moka::sync::Cache;
use object_store::ObjectMeta;
use object_store::path::Path;
use parquet::file::metadata::ParquetMetaData;
use url::Url;

use crate::config::IndexConfig;
use crate::stats::{CacheCounters, CacheStats, settle};

/// One version of one object: store URL, path, size, and e_tag (or modification time).
/// Every index entry is keyed by it, so a replaced object is a miss, never stale metadata.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ObjectVersion {
    store: Arc<str>,
    path: Path,
    size: u64,
    tag: Arc<str>,
}

impl ObjectVersion {
    /// The version `meta` describes, of an object in the store at `store_url`.
    pub fn new(store_url: &Url, meta: &ObjectMeta) -> Self {
        Self::with_store_key(crate::store_key(store_url), meta)
    }

    /// The object's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The object's size in bytes.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The store key (scheme, host and port of the store's URL).
    pub(crate) fn store(&self) -> &Arc<str> {
        &self.store
    }

    /// A text naming this version exactly, stable across processes: what the disk tier
    /// writes into each entry and checks on reading it back.
    pub(crate) fn canonical(&self) -> String {
        format!("{}\n{}\n{}\n{}", self.store, self.path, self.size, self.tag)
    }

    /// The version `meta` describes, of an object in the store whose key is `store`.
    pub(crate) fn with_store_key(store: Arc<str>, meta: &ObjectMeta) -> Self {
        let tag = match (&meta.version, &meta.e_tag) {
            (Some(v), _) => format!("v:{v}"),
            (None, Some(e)) => format!("e:{e}"),
            (None, None) => format!("t:{}", meta.last_modified.timestamp_micros()),
        };
        Self {
            store,
            path: meta.location.clone(),
            size: meta.size,
            tag: tag.into(),
        }
    }

    fn same_object(&self, other: &Self) -> bool {
        self.path == other.path && self.store == other.store
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum IndexKey {
    /// The footer of one object version.
    Footer(ObjectVersion),
    /// The bloom filter of one column chunk: (row group, column).
    Bloom(ObjectVersion, usize, usize),
    /// An entry DataFusion's own reader put through the `FileMetadataCache` interface, keyed
    /// as DataFusion keys it (by path only; DataFusion validates size and modification time).
    DataFusion(Path),
}

impl IndexKey {
    fn object(&self) -> Option<&ObjectVersion> {
        match self {
            Self::Footer(o) | Self::Bloom(o, _, _) => Some(o),
            Self::DataFusion(_) => None,
        }
    }
}

#[derive(Debug, Clone)]
enum IndexEntry {
    Footer(Arc<ParquetMetaData>),
    /// Bloom filter bytes (header and bitset); `None` records that the chunk has none.
    Bloom(Option<Bytes>),
    DataFusion(CachedFileMetadataEntry),
}

impl IndexEntry {
    /// Heap bytes the entry holds, the weight it counts against the capacity.
    fn weight(&self) -> usize {
        let body = match self {
            Self::Footer(m) => m.memory_size(),
            Self::Bloom(b) => b.as_ref().map_or(0, Bytes::len),
            Self::DataFusion(e) => e.file_metadata.memory_size(),
        };
        body + 64
    }
}

type Load = Shared<BoxFuture<'static, std::result::Result<IndexEntry, Arc<DataFusionError>>>>;

/// Figures of an [`IndexCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct IndexStats {
    /// Lookups, evictions and entries.
    pub cache: CacheStats,
    /// Bytes held now.
    pub bytes: u64,
    /// Footers added: loads run by [`IndexCache::metadata`] (a fetch and decode, or the reuse
    /// of a footer DataFusion's planning decoded), and footers DataFusion's own reader put.
    /// Unchanged across warm queries.
    pub footer_loads: u64,
    /// Bloom-filter loads that ran.
    pub bloom_loads: u64,
    /// Entries not kept because they exceed the per-entry share of the capacity.
    pub rejected: u64,
    /// The bloom-filter entries alone (they share the capacity with footers): lookups,
    /// removals and entries.
    pub blooms: CacheStats,
    /// Bytes the bloom-filter entries hold.
    pub bloom_bytes: u64,
}

/// The shared cache of deserialized Parquet index structures. Cheap to clone.
///
/// ```
/// use datafusion_lakecache::{config::IndexConfig, index::IndexCache};
/// let cache = IndexCache::try_new(IndexConfig::default()).unwrap();
/// assert_eq!(cache.stats().bytes, 0);
/// ```
#[derive(Debug, Clone)]
pub struct IndexCache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: IndexConfig,
    entries: Cache<IndexKey, IndexEntry>,
    loading: Cache<IndexKey, Load>,
    /// The version of each object last loaded, to drop the entries of older versions.
    current: Cache<(Arc<str>, Path), ObjectVersion>,
    counters: Arc<CacheCounters>,
    /// The share of `counters` that concerns bloom filters.
    blooms: Arc<CacheCounters>,
    footer_loads: AtomicU64,
    bloom_loads: AtomicU64,
    rejected: AtomicU64,
    /// Limit DataFusion last asked for through `FileMetadataCache::update_cache_limit`.
    datafusion_limit: AtomicU64,
}

impl IndexCache {
    /// Builds a cache after validating `config`.
    pub fn try_new(config: IndexConfig) -> Result<Self> {
        config.validate()?;
        let counters = Arc::new(CacheCounters::default());
        let blooms = Arc::new(CacheCounters::default());
        let entries = Cache::builder()
            .max_capacity(config.capacity_bytes)
            .weigher(|_, v: &IndexEntry| u32::try_from(v.weight()).unwrap_or(u32::MAX))
            .support_invalidation_closures()
            .eviction_listener({
                let (c, b) = (Arc::clone(&counters), Arc::clone(&blooms));
                move |key: Arc<IndexKey>, _, cause| {
                    c.removed(cause);
                    if matches!(*key, IndexKey::Bloom(..)) {
                        b.removed(cause);
                    }
                }
            })
            .build();
        Ok(Self {
            inner: Arc::new(Inner {
                datafusion_limit: AtomicU64::new(config.capacity_bytes),
                config,
                entries,
                loading: Cache::new(100_000),
                // Bounded by count (~200 bytes each); an object that falls out is only
                // missed by the old-version cleanup, and its stale entries age out anyway.
                current: Cache::new(100_000),
                counters,
                blooms,
                footer_loads: AtomicU64::new(0),
                bloom_loads: AtomicU64::new(0),
                rejected: AtomicU64::new(0),
            }),
        })
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &IndexConfig {
        &self.inner.config
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
            cache: i.counters.snapshot(i.entries.entry_count()),
            bytes: i.entries.weighted_size(),
            footer_loads: i.footer_loads.load(Relaxed),
            bloom_loads: i.bloom_loads.load(Relaxed),
            rejected: i.rejected.load(Relaxed),
            blooms: i.blooms.snapshot(bloom_entries),
            bloom_bytes,
        }
    }

    /// Drops every entry.
    pub fn clear(&self) {
        self.inner.entries.invalidate_all();
        self.inner.current.invalidate_all();
        self.inner.entries.run_pending_tasks();
    }

    /// Drops every entry of one object, whatever its version.
    pub fn invalidate(&self, store_url: &Url, path: &Path) {
        let store = crate::store_key(store_url);
        self.inner
            .current
            .invalidate(&(Arc::clone(&store), path.clone()));
        self.inner
            .entries
            .invalidate(&IndexKey::DataFusion(path.clone()));
        let path = path.clone();
        // Predicates are applied lazily by moka; lookups already skip matching entries.
        let _ = self.inner.entries.invalidate_entries_if(move |k, _| {
            k.object()
                .is_some_and(|o| o.path == path && o.store == store)
        });
    }

    /// The footer of `object`, from the cache or from `load` (run once however many callers
    /// ask at the same time). The metadata `load` returns should hold the page index.
    pub async fn metadata<F>(&self, object: &ObjectVersion, load: F) -> Result<Arc<ParquetMetaData>>
    where
        F: Future<Output = Result<Arc<ParquetMetaData>>> + Send + 'static,
    {
        let loads = Arc::clone(&self.inner);
        let load = async move {
            loads.footer_loads.fetch_add(1, Relaxed);
            load.await.map(IndexEntry::Footer)
        };
        match self
            .get_or_load(IndexKey::Footer(object.clone()), load)
            .await?
        {
            IndexEntry::Footer(m) => Ok(m),
            _ => unreachable!("footer keys hold footers"),
        }
    }

    /// The cached footer of `object`, if present, without loading it.
    pub fn cached_metadata(&self, object: &ObjectVersion) -> Option<Arc<ParquetMetaData>> {
        match self.inner.entries.get(&IndexKey::Footer(object.clone()))? {
            IndexEntry::Footer(m) => Some(m),
            _ => None,
        }
    }

    /// The bloom filter bytes of (row group, column) of `object`, or `None` if that column
    /// chunk has none; from the cache or from `load`, run once per key.
    pub async fn bloom_filter<F>(
        &self,
        object: &ObjectVersion,
        row_group: usize,
        column: usize,
        load: F,
    ) -> Result<Option<Bytes>>
    where
        F: Future<Output = Result<Option<Bytes>>> + Send + 'static,
    {
        let loads = Arc::clone(&self.inner);
        let load = async move {
            loads.bloom_loads.fetch_add(1, Relaxed);
            load.await.map(IndexEntry::Bloom)
        };
        let key = IndexKey::Bloom(object.clone(), row_group, column);
        match self.get_or_load(key, load).await? {
            IndexEntry::Bloom(b) => Ok(b),
            _ => unreachable!("bloom keys hold bloom filters"),
        }
    }

    async fn get_or_load<F>(&self, key: IndexKey, load: F) -> Result<IndexEntry>
    where
        F: Future<Output = Result<IndexEntry>> + Send + 'static,
    {
        let bloom = matches!(key, IndexKey::Bloom(..));
        if let Some(hit) = self.inner.entries.get(&key) {
            self.inner.counters.hit();
            if bloom {
                self.inner.blooms.hit();
            }
            return Ok(hit);
        }
        self.inner.counters.miss();
        if bloom {
            self.inner.blooms.miss();
        }
        let shared = self
            .inner
            .loading
            .entry(key.clone())
            .or_insert_with(|| {
                let this = self.clone();
                let key = key.clone();
                async move {
                    // A load that just finished may have admitted the entry between this
                    // caller's miss and its joining: take it rather than load again.
                    if let Some(hit) = this.inner.entries.get(&key) {
                        this.inner.loading.invalidate(&key);
                        return Ok(hit);
                    }
                    let loaded = load.await;
                    if let Ok(entry) = &loaded {
                        this.admit(&key, entry.clone());
                    }
                    this.inner.loading.invalidate(&key);
                    loaded.map_err(Arc::new)
                }
                .boxed()
                .shared()
            })
            .into_value();
        shared.await.map_err(DataFusionError::Shared)
    }

    /// Keeps `entry` unless it is larger than the per-entry share of the capacity, and drops
    /// the entries of older versions of the same object.
    fn admit(&self, key: &IndexKey, entry: IndexEntry) {
        let i = &self.inner;
        if !i.config.enabled {
            return;
        }
        if entry.weight() as u64 > i.config.max_entry_bytes() {
            i.rejected.fetch_add(1, Relaxed);
            return;
        }
        if let Some(object) = key.object() {
            let id = (Arc::clone(&object.store), object.path.clone());
            if let Some(old) = i.current.get(&id)
                && &old != object
            {
                let object = object.clone();
                let _ = i.entries.invalidate_entries_if(move |k, _| {
                    k.object()
                        .is_some_and(|o| o.same_object(&object) && o != &object)
                });
            }
            i.current.insert(id, object.clone());
        }
        i.entries.insert(key.clone(), entry);
    }
}

#[cfg(test)]
mod tests;
