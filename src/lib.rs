//! Make Apache DataFusion fast over data lakes: many Parquet files on object stores (S3, GCS,
//! Azure, HTTP) or local disks, read again and again by SQL.
//!
//! One [`LakeCache`] per process holds the shared caches; [`LakeCache::install`] makes a
//! session use them. DataFusion's Parquet scans then run as before (projection, pruning and
//! filter pushdown unchanged) while HEAD and LIST requests and local file opens come from the
//! handle cache ([`handle`]), and footers, page indexes and bloom filters from the index cache
//! ([`index`]) through [`LakeTable`].
//!
//! ```
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//! use datafusion_lakecache::LakeCache;
//!
//! let lake = LakeCache::builder().handle_capacity(10_000).build().unwrap();
//! let state = lake
//!     .install(SessionStateBuilder::new().with_default_features())
//!     .unwrap()
//!     .build();
//! let ctx = SessionContext::new_with_state(state);
//! // ctx.register_object_store(...), ctx.register_parquet(...) and SQL as usual;
//! // lake.stats() and `SELECT * FROM lakecache_stats()` show the caches' figures.
//! ```
//!
//! Modules: [`config`] (every setting), [`handle`], [`index`], [`prefetch`], [`range`],
//! [`table`], [`sql`] (`install`, `lakecache_stats()`), [`stats`] (each cache's figures),
//! [`query`] (one query's figures, for `EXPLAIN ANALYZE`), and [`testkit`] (stores that count, delay or
//! fail requests, and a seeded lake generator, for tests and benchmarks).

pub mod config;
pub mod handle;
pub mod index;
pub mod prefetch;
pub mod query;
pub mod range;
pub mod sql;
pub mod stats;
pub mod table;
pub mod testkit;

use std::sync::Arc;
use std::time::Duration;

use datafusion::error::Result;
use datafusion::execution::cache::cache_manager::CacheManagerConfig;

pub use config::{HandleConfig, IndexConfig, PrefetchConfig, RangeConfig};
pub use handle::{CachingObjectStore, HandleCache, HandleStats, ObjectChanged};
pub use index::{IndexCache, IndexStats};
pub use prefetch::{PrefetchStats, Prefetcher};
pub use range::{RangeCache, RangeStats};
pub use stats::CacheStats;
pub use table::{LakeScanRule, LakeTable, LakeTableFactory};

/// How every cache names a store: the scheme, host and port of its URL (`s3://bucket`,
/// `file://`), whatever path or trailing slash the URL was written with.
pub fn store_key(store_url: &url::Url) -> Arc<str> {
    // Built from its parts: `memory://` and `memory:` (no authority) must name one store.
    let host = store_url.host_str().unwrap_or_default();
    match store_url.port() {
        Some(port) => format!("{}://{host}:{port}", store_url.scheme()),
        None => format!("{}://{host}", store_url.scheme()),
    }
    .into()
}

/// The shared state of the crate: one per process, cheap to clone, shared by every session
/// and query. Built with [`LakeCache::builder`].
#[derive(Debug, Clone)]
pub struct LakeCache {
    handles: HandleCache,
    index: IndexCache,
    ranges: RangeCache,
    prefetch: Arc<PrefetchConfig>,
    prefetch_counters: Arc<prefetch::PrefetchCounters>,
}

impl LakeCache {
    /// A builder with every setting at its default.
    pub fn builder() -> LakeCacheBuilder {
        LakeCacheBuilder::default()
    }

    /// The handle cache: object metadata, listings and local file descriptors.
    pub fn handles(&self) -> &HandleCache {
        &self.handles
    }

    /// The index cache: Parquet footers, page indexes and bloom filters.
    pub fn index(&self) -> &IndexCache {
        &self.index
    }

    /// The range cache: bytes of remote objects, in memory and on local disk.
    pub fn ranges(&self) -> &RangeCache {
        &self.ranges
    }

    /// The range cache to use for objects of the store at `store_url`, if any: not for local
    /// files, and not when the handle cache is off (the range cache keys ranges by the
    /// object versions it learns there).
    pub(crate) fn range_cache_for(&self, store_url: &url::Url) -> Option<RangeCache> {
        (self.ranges.applies_to(store_url) && self.handles.config().enabled)
            .then(|| self.ranges.clone())
    }

    /// The settings scans prefetch with.
    pub fn prefetch_config(&self) -> &PrefetchConfig {
        &self.prefetch
    }

    pub(crate) fn prefetch_counters(&self) -> Arc<prefetch::PrefetchCounters> {
        Arc::clone(&self.prefetch_counters)
    }

    /// DataFusion's cache configuration with the [`IndexCache`] as its `FileMetadataCache`,
    /// so DataFusion's own Parquet reader (planning, plain `ListingTable`s) shares it, and
    /// with listings kept no longer than the handle cache's listing TTL.
    ///
    /// ```
    /// # use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    /// # use datafusion_lakecache::LakeCache;
    /// let lake = LakeCache::builder().build().unwrap();
    /// let runtime = RuntimeEnvBuilder::new()
    ///     .with_cache_manager(lake.cache_manager_config())
    ///     .build_arc()
    ///     .unwrap();
    /// ```
    pub fn cache_manager_config(&self) -> CacheManagerConfig {
        let list_ttl = self.handles.config().list_ttl;
        CacheManagerConfig::default()
            .with_file_metadata_cache(Some(Arc::new(self.index.clone())))
            .with_metadata_cache_limit(self.index.config().capacity_bytes as usize)
            .with_list_files_cache_ttl((!list_ttl.is_zero()).then_some(list_ttl))
    }

    /// A snapshot of every cache's figures.
    pub fn stats(&self) -> LakeStats {
        LakeStats {
            handles: self.handles.stats(),
            index: self.index.stats(),
            ranges: self.ranges.stats(),
            prefetch: self.prefetch_counters.snapshot(),
        }
    }

    /// Drops everything cached about one object: its metadata, descriptor, listings that hold
    /// it, and its footer and bloom filters in every version. `store_url` names the store as
    /// it was registered (for example `s3://bucket`).
    pub fn invalidate(&self, store_url: &url::Url, path: &object_store::path::Path) {
        self.handles.invalidate_object(store_url, path);
        self.index.invalidate(store_url, path);
        self.ranges.invalidate(store_url, path);
    }

    /// Drops every cached entry.
    pub fn clear(&self) {
        self.handles.clear();
        self.index.clear();
        self.ranges.clear();
    }
}

/// Figures of every cache of a [`LakeCache`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LakeStats {
    /// The handle cache.
    pub handles: HandleStats,
    /// The index cache.
    pub index: IndexStats,
    /// The range cache.
    pub ranges: RangeStats,
    /// Prefetching, over every scan so far.
    pub prefetch: PrefetchStats,
}

impl LakeStats {
    /// Every figure as (cache, metric, value), the rows of `lakecache_stats()`.
    pub fn rows(&self) -> Vec<(&'static str, &'static str, u64)> {
        let mut rows = Vec::new();
        let h = &self.handles;
        for (cache, s) in [
            ("handle.metadata", h.metadata),
            ("handle.listings", h.listings),
            ("handle.files", h.files),
            ("index", self.index.cache),
            ("index.bloom", self.index.blooms),
            ("range.memory", self.ranges.memory),
            ("range.disk", self.ranges.disk),
        ] {
            rows.extend([
                (cache, "hits", s.hits),
                (cache, "misses", s.misses),
                (cache, "evictions", s.evictions),
                (cache, "expirations", s.expirations),
                (cache, "invalidations", s.invalidations),
                (cache, "entries", s.entries),
            ]);
        }
        rows.extend([
            ("handle.files", "open_now", h.open_files),
            ("handle.metadata", "version_changes", h.version_changes),
            ("index", "bytes", self.index.bytes),
            ("index", "footer_loads", self.index.footer_loads),
            ("index", "bloom_loads", self.index.bloom_loads),
            ("index", "rejected", self.index.rejected),
            ("index.bloom", "bytes", self.index.bloom_bytes),
        ]);
        let r = &self.ranges;
        rows.extend([
            ("range.memory", "bytes", r.memory_bytes),
            ("range.memory", "capacity", r.memory_capacity),
            ("range.memory", "bytes_served", r.bytes_from_memory),
            ("range.disk", "bytes", r.disk_bytes),
            ("range.disk", "capacity", r.disk_capacity),
            ("range.disk", "bytes_served", r.bytes_from_disk),
            ("range.disk", "corrupt", r.disk_corrupt),
            ("range.disk", "writes", r.disk_writes),
            ("range.disk", "write_errors", r.disk_write_errors),
            ("range.disk", "skipped", r.disk_skipped),
            ("range", "bytes_from_store", r.bytes_from_store),
            ("range", "too_large", r.too_large),
        ]);
        let p = &self.prefetch;
        rows.extend([
            ("prefetch", "scans", p.scans),
            ("prefetch", "requests", p.requests),
            ("prefetch", "bytes_fetched", p.bytes_fetched),
            ("prefetch", "bytes_used", p.bytes_used),
            ("prefetch", "bytes_wasted", p.bytes_wasted),
            ("prefetch", "cancelled", p.cancelled),
            ("prefetch", "failed", p.failed),
            ("prefetch", "memory_denied", p.memory_denied),
            ("prefetch", "wait_ms", p.wait_ms),
            ("prefetch", "peak_in_flight", p.peak_in_flight),
            ("prefetch", "reserved_bytes", p.reserved_bytes),
            ("prefetch", "peak_reserved_bytes", p.peak_reserved_bytes),
        ]);
        rows
    }
}

/// Builds a [`LakeCache`]; [`LakeCacheBuilder::build`] validates every setting.
#[derive(Debug, Clone, Default)]
pub struct LakeCacheBuilder {
    handle: HandleConfig,
    index: IndexConfig,
    prefetch: PrefetchConfig,
    range: RangeConfig,
    error: Option<String>,
}

impl LakeCacheBuilder {
    /// Whether object metadata, listings and local descriptors are cached (default on). Off,
    /// the range cache keeps nothing either: it learns object versions from this cache.
    pub fn handle_cache(mut self, enabled: bool) -> Self {
        self.handle.enabled = enabled;
        self
    }

    /// Whether decoded footers, page indexes and bloom filters are kept (default on).
    pub fn index_cache(mut self, enabled: bool) -> Self {
        self.index.enabled = enabled;
        self
    }

    /// Maximum number of cached object metadata entries (default 10,000; must be > 0).
    pub fn handle_capacity(mut self, entries: u64) -> Self {
        self.handle.capacity = entries;
        self
    }

    /// How long cached metadata stays valid (default 10 min; `Duration::ZERO` = no expiry).
    pub fn handle_ttl(mut self, ttl: Duration) -> Self {
        self.handle.ttl = ttl;
        self
    }

    /// Drop entries unused for this long (default: no idle timeout).
    pub fn handle_idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.handle.idle_timeout = idle;
        self
    }

    /// How long a cached listing stays valid (default 60 s).
    pub fn list_ttl(mut self, ttl: Duration) -> Self {
        self.handle.list_ttl = ttl;
        self
    }

    /// Maximum local file descriptors kept open (default 1,000; 0 turns it off; never more
    /// than half the soft `ulimit -n`).
    pub fn max_open_files(mut self, files: usize) -> Self {
        self.handle.max_open_files = files;
        self
    }

    /// Bytes of deserialized Parquet footers, page indexes and bloom filters kept (default
    /// 256 MiB).
    pub fn index_capacity_bytes(mut self, bytes: u64) -> Self {
        self.index.capacity_bytes = bytes;
        self
    }

    /// Whether scans prefetch at all (default on).
    pub fn prefetch(mut self, enabled: bool) -> Self {
        self.prefetch.enabled = enabled;
        self
    }

    /// Most downloads one scan keeps in flight (default 64).
    pub fn prefetch_max_in_flight(mut self, downloads: usize) -> Self {
        self.prefetch.max_in_flight = downloads;
        self
    }

    /// The smallest byte budget of a scan's prefetches (default 32 MiB); the budget grows to
    /// four times this with the downloads in flight and the ranges seen.
    pub fn prefetch_buffer_bytes(mut self, bytes: u64) -> Self {
        self.prefetch.buffer_bytes = bytes;
        self
    }

    /// The largest byte budget of a scan's prefetches (default 256 MiB).
    pub fn prefetch_max_bytes(mut self, bytes: u64) -> Self {
        self.prefetch.max_bytes = bytes;
        self
    }

    /// Bytes of remote objects kept in memory (default 1 GiB).
    pub fn range_memory_bytes(mut self, bytes: u64) -> Self {
        self.range.memory_bytes = bytes;
        self
    }

    /// Keeps bytes of remote objects on local disk too, in `dir`, up to `bytes` (default:
    /// no disk tier). Entries a previous process left in `dir` are reused for the same
    /// object versions.
    pub fn range_disk(mut self, dir: impl Into<std::path::PathBuf>, bytes: u64) -> Self {
        self.range.disk_dir = Some(dir.into());
        self.range.disk_bytes = bytes;
        self
    }

    /// Whether bytes of remote objects are kept at all (default on).
    pub fn range_cache(mut self, enabled: bool) -> Self {
        self.range.enabled = enabled;
        self
    }

    /// Sets a setting from its `lakecache.*` key and a string value, as SQL `SET` does.
    /// A bad value is reported by [`LakeCacheBuilder::build`].
    pub fn set(mut self, key: &str, value: &str) -> Self {
        let result = if key.starts_with("lakecache.index.") {
            self.index.set(key, value)
        } else if key.starts_with("lakecache.prefetch.") {
            self.prefetch.set(key, value)
        } else if key.starts_with("lakecache.range.") {
            self.range.set(key, value)
        } else {
            self.handle.set(key, value)
        };
        if self.error.is_none()
            && let Err(e) = result
        {
            self.error = Some(match e {
                datafusion::error::DataFusionError::Configuration(m) => m,
                other => other.to_string(),
            });
        }
        self
    }

    /// Validates the settings and builds the caches.
    pub fn build(self) -> Result<LakeCache> {
        if let Some(e) = self.error {
            return Err(datafusion::error::DataFusionError::Configuration(e));
        }
        self.prefetch.validate()?;
        Ok(LakeCache {
            handles: HandleCache::try_new(self.handle)?,
            index: IndexCache::try_new(self.index)?,
            ranges: RangeCache::try_new(self.range)?,
            prefetch: Arc::new(self.prefetch),
            prefetch_counters: Arc::default(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_store_is_named_by_scheme_host_and_port_alone() {
        for (a, b) in [
            ("memory://", "memory:"),
            ("s3://bucket", "s3://bucket/some/path/"),
            ("http://host:8080/x", "http://host:8080"),
            ("file:///", "file://"),
        ] {
            let key = |u: &str| store_key(&url::Url::parse(u).unwrap());
            assert_eq!(key(a), key(b), "{a} and {b}");
        }
        let key = |u: &str| store_key(&url::Url::parse(u).unwrap());
        assert_ne!(key("s3://a"), key("s3://b"));
        assert_ne!(key("http://h:1"), key("http://h:2"));
    }

    #[test]
    fn builder_refuses_bad_settings_with_their_name() {
        let err = LakeCache::builder().handle_capacity(0).build().unwrap_err();
        assert!(
            err.to_string().contains("lakecache.handle.capacity"),
            "{err}"
        );
        let err = LakeCache::builder()
            .set("lakecache.handle.ttl", "-1s")
            .build()
            .unwrap_err();
        assert!(err.to_string().contains("lakecache.handle.ttl"), "{err}");
        let lake = LakeCache::builder()
            .set("lakecache.handle.ttl", "0")
            .build()
            .unwrap();
        assert_eq!(lake.handles().config().ttl, Duration::ZERO);
    }
}
