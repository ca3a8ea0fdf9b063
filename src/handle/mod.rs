//! Handle caching: object metadata from HEAD, GET and LIST, cached listings, and open local
//! file descriptors, so repeated scans stop paying a round trip (or an `open`) per file.
//!
//! [`HandleCache`] holds the state and is shared by every `CachingObjectStore` built over it;
//! the store layer decides when to consult and when to invalidate it. Versions are compared
//! by the one rule of [`ObjectVersion::matches`].

mod files;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::sync::Cache;
use object_store::path::Path;
use object_store::{ListResult, ObjectMeta};

pub use files::max_open_files_allowed;
pub(crate) use files::{OpenFile, OpenFiles};

use crate::config::HandleConfig;
use crate::object::{ObjectId, ObjectVersion, StoreKey};
use crate::stats::{CacheCounters, HandleStats, settle};

/// Which kind of listing a cached result answers.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ListKind {
    Recursive,
    Delimited,
    After(Path),
}

/// One listing request of one store.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct ListKey {
    pub(crate) store: StoreKey,
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

/// Which stores hold metadata of each path, so entries keyed by path alone (DataFusion's) can
/// be checked against every version the caches know of it.
type PathIndex = Arc<Mutex<HashMap<Path, Vec<StoreKey>>>>;

/// Process-wide cache of object handles: metadata, listings and local file descriptors.
///
/// Cheap to clone; clones share the same entries. Bounded by [`HandleConfig::capacity`]
/// entries with a TTL and an optional idle timeout, and safe to use from concurrent queries.
///
/// Users reach it through a `LakeCache`:
///
/// ```
/// let lake = datafusion_lakecache::LakeCache::builder().handle_capacity(100).build().unwrap();
/// assert_eq!(lake.stats().handles.metadata.entries, 0);
/// ```
#[derive(Clone)]
pub struct HandleCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for HandleCache {
    // Not derived: moka's `Debug` prints every entry.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandleCache")
            .field("config", &self.inner.config)
            .finish_non_exhaustive()
    }
}

struct Inner {
    config: HandleConfig,
    metas: Cache<ObjectId, ObjectMeta>,
    meta_counters: Arc<CacheCounters>,
    lists: Cache<ListKey, Arc<Listing>>,
    list_counters: Arc<CacheCounters>,
    paths: PathIndex,
    files: OpenFiles,
    version_changes: AtomicU64,
    /// Bumped by every invalidation; a listing that started before one records nothing.
    epoch: AtomicU64,
}

impl HandleCache {
    /// Builds a cache after validating `config`.
    pub fn try_new(config: HandleConfig) -> datafusion::error::Result<Self> {
        let meta_counters = Arc::new(CacheCounters::default());
        let paths: PathIndex = Arc::default();
        let metas = with_expiry(
            Cache::builder().max_capacity(config.capacity),
            config.ttl,
            config.idle_timeout,
        )
        .eviction_listener({
            let (c, paths) = (Arc::clone(&meta_counters), Arc::clone(&paths));
            move |key: Arc<ObjectId>, _, cause| {
                c.removed(cause);
                if cause != RemovalCause::Replaced {
                    unindex(&paths, &key);
                }
            }
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
                paths,
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
        self.inner.epoch.fetch_add(1, Relaxed);
        self.inner.metas.invalidate_all();
        self.inner.lists.invalidate_all();
        self.inner.files.clear();
        self.inner.metas.run_pending_tasks();
        self.inner.lists.run_pending_tasks();
    }

    pub(crate) fn files(&self) -> &OpenFiles {
        &self.inner.files
    }

    /// The cached metadata of `id`, counted as a lookup; a miss without looking when the
    /// asker may not be served it (its store has not shown it can read the object).
    pub(crate) fn meta(&self, id: &ObjectId, allowed: bool) -> Option<ObjectMeta> {
        let found = allowed.then(|| self.inner.metas.get(id)).flatten();
        match &found {
            Some(_) => self.inner.meta_counters.hit(),
            None => self.inner.meta_counters.miss(),
        }
        found
    }

    /// The cached metadata of `id`, if any, without counting a lookup.
    pub(crate) fn peek(&self, id: &ObjectId) -> Option<ObjectMeta> {
        self.inner.metas.get(id)
    }

    /// Records metadata a response or a listing showed. The same version as the cached one
    /// keeps the entry (completed with a strong e_tag it lacked); another version replaces it,
    /// is counted, and drops the listings that still hold the old one. Returns the replaced
    /// version's metadata, whose other entries the caller drops.
    pub(crate) fn record(&self, store: &StoreKey, meta: &ObjectMeta) -> Option<ObjectMeta> {
        if !self.inner.config.enabled {
            return None;
        }
        let id = ObjectId {
            store: store.clone(),
            path: meta.location.clone(),
        };
        match self.inner.metas.get(&id) {
            Some(cached) if ObjectVersion::new(store.clone(), &cached).matches(meta) => {
                let seen = ObjectVersion::new(store.clone(), meta);
                if !ObjectVersion::new(store.clone(), &cached).pins_bytes() && seen.pins_bytes() {
                    // Learn the validator a listing left out: reads of the object can then be
                    // guarded by it (and its bytes kept).
                    self.inner.metas.insert(id, meta.clone());
                }
                None
            }
            Some(old) => {
                self.inner.version_changes.fetch_add(1, Relaxed);
                self.inner.metas.insert(id, meta.clone());
                self.invalidate_listings(store, &meta.location);
                Some(old)
            }
            None => {
                self.index_path(&id);
                self.inner.metas.insert(id, meta.clone());
                None
            }
        }
    }

    /// [`HandleCache::record`] for an object a listing that began at `epoch` showed: nothing
    /// is recorded if an invalidation came since, as it may be of a write the listing missed.
    pub(crate) fn record_listed(
        &self,
        store: &StoreKey,
        meta: &ObjectMeta,
        epoch: u64,
    ) -> Option<ObjectMeta> {
        if self.epoch() != epoch {
            return None;
        }
        self.record(store, meta)
    }

    /// Counts a response that showed another version than a reader asked for.
    pub(crate) fn count_version_change(&self) {
        self.inner.version_changes.fetch_add(1, Relaxed);
    }

    /// The cached listing `key`, counted as a lookup; a miss without looking when the asker
    /// may not be served it (its store has not listed that prefix itself).
    pub(crate) fn listing(&self, key: &ListKey, allowed: bool) -> Option<Arc<Listing>> {
        let found = allowed.then(|| self.inner.lists.get(key)).flatten();
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
    /// that caused it.
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
    pub(crate) fn invalidate(&self, id: &ObjectId) {
        self.inner.metas.invalidate(id);
        self.invalidate_listings(&id.store, &id.path);
    }

    fn invalidate_listings(&self, store: &StoreKey, path: &Path) {
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

    /// The version `meta` (a plan's view of an object of `store`) names, completed with what
    /// the cache knows of that same version (a strong e_tag a listing left out), and whether
    /// the cache held it.
    pub(crate) fn version_of(&self, store: &StoreKey, meta: &ObjectMeta) -> (ObjectVersion, bool) {
        let seen = ObjectVersion::new(store.clone(), meta);
        let id = seen.id().clone();
        match self.inner.metas.get(&id) {
            Some(cached) if seen.matches(&cached) => {
                let known = ObjectVersion::new(store.clone(), &cached);
                let better = !seen.pins_bytes() && known.pins_bytes();
                (if better { known } else { seen }, true)
            }
            _ => (seen, false),
        }
    }

    /// `version` (known by its size and time alone) with the strong validator the cache holds
    /// for that same version, if it holds one.
    pub(crate) fn complete(&self, version: &ObjectVersion) -> Option<ObjectVersion> {
        let cached = self.peek(version.id())?;
        let known = ObjectVersion::new(version.store().clone(), &cached);
        (known.pins_bytes() && version.matches(&cached)).then_some(known)
    }

    /// Whether some store's cached metadata shows `path` at a version `meta` is not: then an
    /// entry keyed by path alone and made for `meta` may be another version's.
    pub(crate) fn contradicts(&self, path: &Path, meta: &ObjectMeta) -> bool {
        let stores = lock(&self.inner.paths)
            .get(path)
            .cloned()
            .unwrap_or_default();
        stores.into_iter().any(|store| {
            let id = ObjectId {
                store: store.clone(),
                path: path.clone(),
            };
            self.peek(&id)
                .is_some_and(|cached| !ObjectVersion::new(store, &cached).matches(meta))
        })
    }

    fn index_path(&self, id: &ObjectId) {
        let mut paths = lock(&self.inner.paths);
        let stores = paths.entry(id.path.clone()).or_default();
        if !stores.contains(&id.store) {
            stores.push(id.store.clone());
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn unindex(paths: &PathIndex, id: &ObjectId) {
    let mut paths = lock(paths);
    if let Some(stores) = paths.get_mut(&id.path) {
        stores.retain(|s| s != &id.store);
        if stores.is_empty() {
            paths.remove(&id.path);
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
mod tests;
