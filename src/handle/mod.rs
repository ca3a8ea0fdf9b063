//! Handle caching: object metadata from HEAD, GET and LIST, cached listings, and open local
//! file descriptors, so repeated scans stop paying a round trip (or an `open`) per file.
//!
//! [`HandleCache`] holds the state and is shared by every [`CachingObjectStore`] built over it;
//! the store wrapper decides when to consult and when to invalidate it.

mod files;
mod store;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use moka::sync::Cache;
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta};

pub use files::max_open_files_allowed;
pub use store::{CachingObjectStore, ObjectChanged};

use crate::config::HandleConfig;
use crate::stats::{CacheCounters, CacheStats, settle};
use files::OpenFiles;

/// Figures of a [`HandleCache`], from [`HandleCache::stats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HandleStats {
    /// Object metadata (HEAD) lookups.
    pub metadata: CacheStats,
    /// Listing (LIST) lookups.
    pub listings: CacheStats,
    /// Local file-descriptor lookups.
    pub files: CacheStats,
    /// Local file descriptors open now, held by the cache or by reads in progress.
    pub open_files: u64,
    /// Times a response showed a different version than the one cached.
    pub version_changes: u64,
}

/// Identity of an object: the store it lives in and its path there.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ObjectKey {
    pub(crate) store: Arc<str>,
    pub(crate) path: Path,
}

/// Which kind of listing a cached result answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ListKind {
    Recursive,
    Delimited,
    After(Path),
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ListKey {
    pub(crate) store: Arc<str>,
    pub(crate) prefix: Option<Path>,
    pub(crate) kind: ListKind,
}

/// A cached listing. Immutable once built; shared by every reader.
#[derive(Debug)]
pub(crate) struct Listing {
    pub(crate) objects: Vec<ObjectMeta>,
    pub(crate) common_prefixes: Vec<Path>,
}

impl Listing {
    pub(crate) fn to_list_result(&self) -> ListResult {
        ListResult {
            objects: self.objects.clone(),
            common_prefixes: self.common_prefixes.clone(),
        }
    }
}

/// Process-wide cache of object handles: metadata, listings and local file descriptors.
///
/// Cheap to clone; clones share the same entries. Bounded by [`HandleConfig::capacity`]
/// entries with a TTL and an optional idle timeout, and safe to use from concurrent queries.
///
/// ```
/// use datafusion_lakecache::{config::HandleConfig, handle::HandleCache};
/// let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
/// assert_eq!(cache.stats().metadata.entries, 0);
/// ```
#[derive(Debug, Clone)]
pub struct HandleCache {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    config: HandleConfig,
    metas: Cache<ObjectKey, ObjectMeta>,
    meta_counters: Arc<CacheCounters>,
    lists: Cache<ListKey, Arc<Listing>>,
    list_counters: Arc<CacheCounters>,
    files: OpenFiles,
    version_changes: AtomicU64,
    /// Bumped by every invalidation; a listing that started before one is not cached.
    epoch: AtomicU64,
}

impl HandleCache {
    /// Builds a cache after validating `config`.
    pub fn try_new(config: HandleConfig) -> datafusion::error::Result<Self> {
        config.validate()?;
        let meta_counters = Arc::new(CacheCounters::default());
        let metas = with_expiry(
            Cache::builder().max_capacity(config.capacity),
            config.ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let c = Arc::clone(&meta_counters);
            move |_, _, cause| c.removed(cause)
        })
        .build();
        // Listings weigh one per object, so a few huge prefixes cannot hold more metadata
        // than the handle capacity allows.
        let list_counters = Arc::new(CacheCounters::default());
        let lists = with_expiry(
            Cache::builder()
                .max_capacity(config.capacity)
                .weigher(|_, l: &Arc<Listing>| {
                    let n = l.objects.len() + l.common_prefixes.len() + 1;
                    u32::try_from(n).unwrap_or(u32::MAX)
                }),
            config.list_ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let c = Arc::clone(&list_counters);
            move |_, _, cause| c.removed(cause)
        })
        .build();
        let files = OpenFiles::new(&config);
        Ok(Self {
            inner: Arc::new(Inner {
                config,
                metas,
                meta_counters,
                lists,
                list_counters,
                files,
                version_changes: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
            }),
        })
    }

    /// The settings this cache was built with.
    pub fn config(&self) -> &HandleConfig {
        &self.inner.config
    }

    /// A snapshot of the figures.
    pub fn stats(&self) -> HandleStats {
        let i = &self.inner;
        settle(&i.metas, i.config.capacity);
        settle(&i.lists, i.config.capacity);
        HandleStats {
            metadata: i.meta_counters.snapshot(i.metas.entry_count()),
            listings: i.list_counters.snapshot(i.lists.entry_count()),
            files: i.files.stats(),
            open_files: i.files.open_now(),
            version_changes: i.version_changes.load(Relaxed),
        }
    }

    /// Drops every entry and closes every cached descriptor.
    pub fn clear(&self) {
        self.inner.metas.invalidate_all();
        self.inner.lists.invalidate_all();
        self.inner.files.clear();
        self.inner.metas.run_pending_tasks();
        self.inner.lists.run_pending_tasks();
    }

    /// Drops the metadata of one object of the store at `store_url`, and the listings that
    /// hold it. A descriptor of a local file is dropped by the store wrapper that opened it,
    /// or at the latest when it is next used and found changed.
    pub fn invalidate_object(&self, store_url: &url::Url, path: &Path) {
        self.invalidate(&crate::store_key(store_url), path);
    }

    pub(crate) fn files(&self) -> &OpenFiles {
        &self.inner.files
    }

    pub(crate) fn meta(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        let found = self.inner.metas.get(key);
        match &found {
            Some(_) => self.inner.meta_counters.hit(),
            None => self.inner.meta_counters.miss(),
        }
        found
    }

    /// The cached metadata of `key`, if any, without counting a lookup.
    pub(crate) fn peek_meta(&self, key: &ObjectKey) -> Option<ObjectMeta> {
        self.inner.metas.get(key)
    }

    /// Records metadata a response showed. A version different from the cached one replaces it
    /// and drops the listings that still hold the old one.
    pub(crate) fn record(&self, store: &Arc<str>, meta: &ObjectMeta) {
        if !self.inner.config.enabled {
            return;
        }
        let key = ObjectKey {
            store: Arc::clone(store),
            path: meta.location.clone(),
        };
        match self.inner.metas.get(&key) {
            Some(cached) if same_version(&cached, meta) => {
                if cached.e_tag.is_none() && meta.e_tag.is_some() {
                    // Learn the e_tag a listing left out: reads of the object can then be
                    // guarded by it (and its ranges cached).
                    self.inner.metas.insert(key, meta.clone());
                }
            }
            Some(_) => {
                self.inner.version_changes.fetch_add(1, Relaxed);
                self.inner.metas.insert(key, meta.clone());
                self.invalidate_listings(store, &meta.location);
            }
            None => self.inner.metas.insert(key, meta.clone()),
        }
    }

    pub(crate) fn listing(&self, key: &ListKey) -> Option<Arc<Listing>> {
        let found = self.inner.lists.get(key);
        match &found {
            Some(_) => self.inner.list_counters.hit(),
            None => self.inner.list_counters.miss(),
        }
        found
    }

    /// The current invalidation epoch; pass it to [`HandleCache::record_listing`].
    pub(crate) fn epoch(&self) -> u64 {
        self.inner.epoch.load(Relaxed)
    }

    /// Caches a complete listing. A listing with more objects than the capacity is not kept,
    /// nor one that started (at `epoch`) before an invalidation: it may have missed the write
    /// that caused it. The metadata of its objects is recorded by the caller as it streams.
    pub(crate) fn record_listing(&self, key: ListKey, listing: Listing, epoch: u64) {
        if self.epoch() != epoch || !self.inner.config.enabled {
            return;
        }
        if self.listing_fits(listing.objects.len()) {
            self.inner.lists.insert(key, Arc::new(listing));
        }
    }

    /// Whether a listing still being collected is small enough to be cached.
    pub(crate) fn listing_fits(&self, objects: usize) -> bool {
        (objects as u64) < self.inner.config.capacity
    }

    /// Drops the metadata of one object and every cached listing that may contain it.
    pub(crate) fn invalidate(&self, store: &Arc<str>, path: &Path) {
        self.inner.metas.invalidate(&ObjectKey {
            store: Arc::clone(store),
            path: path.clone(),
        });
        self.invalidate_listings(store, path);
    }

    fn invalidate_listings(&self, store: &Arc<str>, path: &Path) {
        self.inner.epoch.fetch_add(1, Relaxed);
        let stale: Vec<Arc<ListKey>> = self
            .inner
            .lists
            .iter()
            .filter(|(k, _)| &k.store == store && covers(k.prefix.as_ref(), path))
            .map(|(k, _)| k)
            .collect();
        for key in stale {
            self.inner.lists.invalidate(key.as_ref());
        }
    }
}

/// Whether a listing of `prefix` can contain `path` (object_store prefixes match whole
/// path segments).
fn covers(prefix: Option<&Path>, path: &Path) -> bool {
    match prefix {
        None => true,
        Some(p) => path.prefix_match(p).is_some(),
    }
}

/// Whether two observations of one object show the same version. With e_tags on both sides
/// the e_tag decides; otherwise the modification time. Sizes must always agree. Listings and
/// HEADs report modification times at different precisions on some stores (milliseconds
/// against whole seconds), so when only one side has an e_tag the times need only agree
/// within a second.
pub(crate) fn same_version(a: &ObjectMeta, b: &ObjectMeta) -> bool {
    if a.size != b.size || a.version != b.version {
        return false;
    }
    match (&a.e_tag, &b.e_tag) {
        (Some(x), Some(y)) => x == y,
        (None, None) => a.last_modified == b.last_modified,
        // A listing without e_tags (millisecond times) against a HEAD or GET (whole seconds).
        _ => (a.last_modified - b.last_modified).abs() < chrono::TimeDelta::seconds(1),
    }
}

impl HandleCache {
    /// What the cache knows of the version `meta` describes: its cached metadata if that is
    /// the same version (it may carry an e_tag `meta` lacks), else `meta` itself.
    pub(crate) fn best_meta(&self, store: &Arc<str>, meta: &ObjectMeta) -> ObjectMeta {
        let key = ObjectKey {
            store: Arc::clone(store),
            path: meta.location.clone(),
        };
        match self.inner.metas.get(&key) {
            Some(cached) if same_version(&cached, meta) => cached,
            _ => meta.clone(),
        }
    }
}

fn with_expiry<K, V, C>(
    builder: moka::sync::CacheBuilder<K, V, C>,
    ttl: Duration,
    idle: Option<Duration>,
) -> moka::sync::CacheBuilder<K, V, C> {
    let builder = if ttl.is_zero() {
        builder
    } else {
        builder.time_to_live(ttl)
    };
    match idle {
        Some(idle) => builder.time_to_idle(idle),
        None => builder,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::{TimeZone, Utc};

    fn meta(path: &str, size: u64, e_tag: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            location: Path::from(path),
            last_modified: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            size,
            e_tag: e_tag.map(str::to_string),
            version: None,
        }
    }

    #[test]
    fn capacity_bounds_the_metadata_entries() {
        let cache = HandleCache::try_new(HandleConfig {
            capacity: 10,
            ..HandleConfig::default()
        })
        .unwrap();
        let store: Arc<str> = "mem://".into();
        for i in 0..100 {
            let m = meta(&format!("f{i}"), i, Some("e"));
            cache.record(&store, &m);
            // Touch it again so frequency-based admission lets later keys in.
            cache.meta(&ObjectKey {
                store: Arc::clone(&store),
                path: m.location.clone(),
            });
        }
        let stats = cache.stats();
        assert!(stats.metadata.entries <= 10, "{stats:?}");
        assert!(stats.metadata.evictions > 0, "{stats:?}");
    }

    #[test]
    fn a_new_version_replaces_the_entry_and_drops_listings() {
        let cache = HandleCache::try_new(HandleConfig::default()).unwrap();
        let store: Arc<str> = "mem://".into();
        let key = ListKey {
            store: Arc::clone(&store),
            prefix: Some(Path::from("dir")),
            kind: ListKind::Recursive,
        };
        let other = ListKey {
            prefix: Some(Path::from("dirx")),
            ..key.clone()
        };
        let old = meta("dir/a", 10, Some("v1"));
        cache.record(&store, &old);
        for k in [&key, &other] {
            cache.record_listing(
                k.clone(),
                Listing {
                    objects: vec![old.clone()],
                    common_prefixes: vec![],
                },
                cache.epoch(),
            );
        }
        cache.record(&store, &meta("dir/a", 12, Some("v2")));
        let k = ObjectKey {
            store: Arc::clone(&store),
            path: Path::from("dir/a"),
        };
        assert_eq!(cache.meta(&k).unwrap().size, 12);
        assert!(
            cache.listing(&key).is_none(),
            "listing of the parent dropped"
        );
        assert!(cache.listing(&other).is_some(), "unrelated prefix kept");
        assert_eq!(cache.stats().version_changes, 1);
    }

    #[test]
    fn ttl_zero_never_expires_and_the_idle_timeout_does() {
        let key = |path: &str| ObjectKey {
            store: "mem://".into(),
            path: Path::from(path),
        };
        let forever = HandleCache::try_new(HandleConfig {
            ttl: Duration::ZERO,
            ..HandleConfig::default()
        })
        .unwrap();
        let idle = HandleCache::try_new(HandleConfig {
            ttl: Duration::ZERO,
            idle_timeout: Some(Duration::from_millis(60)),
            ..HandleConfig::default()
        })
        .unwrap();
        for cache in [&forever, &idle] {
            cache.record(&"mem://".into(), &meta("a", 1, Some("e")));
        }
        std::thread::sleep(Duration::from_millis(150));
        assert!(forever.meta(&key("a")).is_some());
        assert!(idle.meta(&key("a")).is_none());
        assert_eq!(idle.stats().metadata.expirations, 1);
        assert_eq!(forever.stats().metadata.expirations, 0);
    }

    #[test]
    fn versions_compare_by_e_tag_then_time() {
        let a = meta("a", 1, Some("x"));
        let mut b = a.clone();
        b.last_modified = Utc.timestamp_opt(1_700_000_001, 0).unwrap();
        assert!(same_version(&a, &b), "same e_tag, coarser time");
        b.e_tag = Some("y".into());
        assert!(!same_version(&a, &b));
        let (mut c, mut d) = (a.clone(), b.clone());
        c.e_tag = None;
        d.e_tag = None;
        assert!(!same_version(&c, &d));
    }
}
