//! [`CheckedCache`]: DataFusion's own caches, checked against the versions the handle cache
//! knows.
//!
//! DataFusion keys its footer and statistics caches by path (and table) alone and checks an
//! entry only by size and modification time, which S3 gives to the second. Two stores
//! holding the same path, or a same-size rewrite within a second, would then get each other's
//! footer, and statistics that prune files or answer `count(*)`. So an entry is served only
//! while
//! - no store the handle cache knows shows its path at another version, and
//! - its version names its bytes (a content digest), or a single store of those the cache
//!   serves (the session's, or every store for a runtime of one's own) has shown the path:
//!   an e_tag that is a counter or a time tells versions apart only within one store, so
//!   two stores showing the same such e_tag may hold different bytes.
//!
//! Otherwise it is dropped, and DataFusion reads it again. One wrapper does this for every
//! path-keyed cache DataFusion consults.
//!
//! Planning looks up every file of a table on every plan, so an entry keeps the mark of its
//! last check: the handle cache's count of recordings of its path's slice, and the count of
//! the session's changes of stores. While neither has moved, the check would say what it
//! said, and is not run again (only a recording, or a store registered, can turn its "no"
//! into a "yes").

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::{HashMap, TableReference};
use datafusion::execution::cache::cache_manager::{
    CacheManagerConfig, CachedFileMetadata, CachedFileMetadataEntry, DEFAULT_METADATA_CACHE_LIMIT,
};
use datafusion::execution::cache::{Cache, CacheEntryInfo, CacheKey, CacheValue, TableScopedPath};
use object_store::ObjectMeta;
use object_store::path::Path;

use super::clock::ClockCache;
use super::{Caches, SessionStores};

/// DataFusion's footer and statistics caches, one of each, checked against the versions
/// `caches` know; `scope` is the stores of the session they serve (`None`: a runtime of
/// one's own, whose sessions may use any store); the statistics cache holds
/// `statistics_bytes` (`lakecache.index.datafusion_statistics`).
pub(crate) fn datafusion_caches(
    caches: &Caches,
    scope: Option<SessionStores>,
    statistics_bytes: u64,
) -> CacheManagerConfig {
    // Bounded as DataFusion's own, looked up without its exact LRU order's cost (see
    // `clock.rs`): planning looks up every file's statistics on every plan.
    let footers: ClockCache<Path, CachedFileMetadataEntry> =
        ClockCache::new(DEFAULT_METADATA_CACHE_LIMIT, "DefaultFileMetadataCache");
    let statistics_bytes = usize::try_from(statistics_bytes).unwrap_or(usize::MAX);
    let statistics: ClockCache<TableScopedPath, CachedFileMetadata> =
        ClockCache::new(statistics_bytes, "DefaultFileStatisticsCache");
    let footers = CheckedCache::new(Arc::new(footers), caches, scope.clone());
    let statistics = CheckedCache::new(Arc::new(statistics), caches, scope)
        .saying_when_full("lakecache.index.datafusion_statistics");
    CacheManagerConfig::default()
        .with_file_metadata_cache(Some(Arc::new(footers)))
        .with_file_statistics_cache(Some(Arc::new(statistics)))
        // The runtime sets the cache's limit from this when it is built.
        .with_file_statistics_cache_limit(statistics_bytes)
}

/// A key of a DataFusion cache: it names an object's path.
pub trait PathKey {
    /// The object's path.
    fn object_path(&self) -> &Path;
}

impl PathKey for Path {
    fn object_path(&self) -> &Path {
        self
    }
}

impl PathKey for TableScopedPath {
    fn object_path(&self) -> &Path {
        &self.path
    }
}

/// A value of a DataFusion cache: it records the metadata it was made for.
pub trait MadeFor {
    /// The object's metadata when the value was made.
    fn made_for(&self) -> &ObjectMeta;
}

impl MadeFor for CachedFileMetadataEntry {
    fn made_for(&self) -> &ObjectMeta {
        &self.meta
    }
}

impl MadeFor for CachedFileMetadata {
    fn made_for(&self) -> &ObjectMeta {
        &self.meta
    }
}

/// A DataFusion cache whose entries are checked against the handle cache; see the module
/// docs.
pub struct CheckedCache<K, V> {
    inner: Arc<ClockCache<K, V>>,
    caches: Caches,
    /// The stores whose entries these are, if known (an installed session's).
    scope: Option<SessionStores>,
    /// The setting that bounds `inner`, named in the log the first time an entry is evicted
    /// for room (or refused as larger than the whole cache).
    bounded_by: Option<&'static str>,
}

/// Whether a DataFusion cache has said it is full, once per process.
static SAID_FULL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

impl<K: CacheKey + 'static, V: CacheValue + 'static> std::fmt::Debug for CheckedCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CheckedCache({})", self.inner.name())
    }
}

impl<K, V> CheckedCache<K, V> {
    /// `inner`, checked against what `caches` know, for the stores of `scope` (every store
    /// if `None`).
    pub(crate) fn new(
        inner: Arc<ClockCache<K, V>>,
        caches: &Caches,
        scope: Option<SessionStores>,
    ) -> Self {
        Self {
            inner,
            caches: caches.clone(),
            scope,
            bounded_by: None,
        }
    }

    /// Logs once, naming `setting`, when the cache has no room for what is put into it.
    pub(crate) fn saying_when_full(mut self, setting: &'static str) -> Self {
        self.bounded_by = Some(setting);
        self
    }
}

impl<K, V> Cache<K, V> for CheckedCache<K, V>
where
    K: CacheKey + PathKey + 'static,
    V: CacheValue + MadeFor + 'static,
{
    fn get(&self, key: &K) -> Option<V> {
        let handles = &self.caches.handles;
        let path = key.object_path();
        self.inner.get_if(key, |value, mark| {
            // Both counts before the check: what changes while it runs shows in the next.
            let changes = self.scope.as_ref().map_or(0, SessionStores::changes);
            // Plus one: 0 is the mark of an entry never checked.
            let now = handles
                .recordings_of(path)
                .wrapping_add(changes)
                .wrapping_add(1);
            if *mark == now {
                return true;
            }
            let scope = self.scope.as_ref().map(SessionStores::identities);
            if handles.contradicts(path, value.made_for(), scope.as_deref()) {
                return false;
            }
            *mark = now;
            true
        })
    }

    fn put(&self, key: &K, value: V) -> Option<V> {
        let Some(setting) = self.bounded_by else {
            return self.inner.put(key, value);
        };
        let before = self.inner.len();
        let old = self.inner.put(key, value);
        // A new key that did not add an entry pushed another out, or did not fit at all
        // (an entry removed meanwhile by another caller can make this say so early: it is
        // a hint for sizing, said once).
        if old.is_none()
            && self.inner.len() <= before
            && !SAID_FULL.swap(true, std::sync::atomic::Ordering::Relaxed)
        {
            log::warn!(
                "{} is full ({} bytes): planning makes statistics again for the files it \
                 evicts, a cost per file on every plan; raise {setting} to hold a table's files",
                self.inner.name(),
                self.inner.cache_limit(),
            );
        }
        old
    }

    fn remove(&self, k: &K) -> Option<V> {
        self.inner.remove(k)
    }

    fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    fn len(&self) -> usize {
        self.inner.len()
    }

    fn clear(&self) {
        self.inner.clear()
    }

    fn name(&self) -> String {
        self.inner.name()
    }

    fn cache_limit(&self) -> usize {
        self.inner.cache_limit()
    }

    fn update_cache_limit(&self, limit: usize) {
        self.inner.update_cache_limit(limit)
    }

    fn cache_ttl(&self) -> Option<Duration> {
        self.inner.cache_ttl()
    }

    fn update_cache_ttl(&self, ttl: Option<Duration>) {
        self.inner.update_cache_ttl(ttl)
    }

    fn drop_table_entries(&self, table_ref: &TableReference) -> datafusion::error::Result<()> {
        self.inner.drop_table_entries(table_ref)
    }

    fn list_entries(&self) -> HashMap<K, CacheEntryInfo<V>> {
        self.inner.list_entries()
    }
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone, Utc};
    use object_store::memory::InMemory;
    use url::Url;

    use super::*;
    use crate::object::{StoreIdentity, StoreKey};
    use crate::{CachingObjectStore, LakeCache};

    /// A value made for an object's metadata.
    #[derive(Clone, Debug)]
    struct Made(ObjectMeta);

    impl CacheValue for Made {
        fn size(&self) -> usize {
            100
        }
    }

    impl MadeFor for Made {
        fn made_for(&self) -> &ObjectMeta {
            &self.0
        }
    }

    /// `t/f0` at an e_tag that is a counter: two stores may show it for other bytes.
    fn counter() -> ObjectMeta {
        ObjectMeta {
            location: Path::from("t/f0"),
            last_modified: Utc.timestamp_opt(1_700_000_000, 0).unwrap(),
            size: 10,
            e_tag: Some("0".to_string()),
            version: None,
        }
    }

    /// A store of `lake` at `url`, and its identity.
    fn wrapper(lake: &LakeCache, url: &str) -> (Arc<dyn object_store::ObjectStore>, StoreIdentity) {
        let store = CachingObjectStore::new(InMemory::new(), &Url::parse(url).unwrap(), lake);
        let identity = store.identity().clone();
        (Arc::new(store), identity)
    }

    fn key(url: &str) -> StoreKey {
        StoreKey::of(&Url::parse(url).unwrap())
    }

    /// A lake where store one has shown `t/f0` at [`counter`], the count of recordings of
    /// the path's slice having `parity`, and a checked cache holding an entry made for it.
    fn shown_by_one(parity: u64) -> (LakeCache, CheckedCache<Path, Made>) {
        let lake = LakeCache::builder().build().unwrap();
        let caches: &Caches = lake.as_ref();
        let handles = &caches.handles;
        let one = StoreIdentity::named("one");
        let path = Path::from("t/f0");
        handles.record(&one, &key("memory://one"), &counter(), handles.epoch());
        // Recordings of other paths: of other slices, and of the path's own until its count
        // has the parity wanted (one path in 4,096 falls in its slice).
        let mut i = 0;
        while i < 100 || handles.recordings_of(&path) % 2 != parity {
            assert!(i < 1_000_000, "no path of {i} fell in the slice of {path}");
            let mut other = counter();
            other.location = Path::from(format!("t/g{i}"));
            handles.record(&one, &key("memory://one"), &other, handles.epoch());
            i += 1;
        }
        let checked = CheckedCache::new(Arc::new(ClockCache::new(1 << 20, "t")), caches, None);
        checked.put(&path, Made(counter()));
        for _ in 0..3 {
            assert!(checked.get(&path).is_some(), "one store has shown the path");
        }
        (lake, checked)
    }

    // Each from an even and from an odd count of the slice's recordings: the mark tells every
    // count from the next.

    #[test]
    fn an_entry_that_agreed_is_checked_again_once_its_path_is_recorded() {
        for parity in [0, 1] {
            let (lake, checked) = shown_by_one(parity);
            let handles = &AsRef::<Caches>::as_ref(&lake).handles;
            // A second store shows the same counter: the entry may be either one's bytes.
            let two = StoreIdentity::named("two");
            handles.record(&two, &key("memory://two"), &counter(), handles.epoch());
            assert!(
                checked.get(&Path::from("t/f0")).is_none(),
                "parity {parity}"
            );
            assert_eq!(checked.len(), 0, "the entry is dropped");
        }
    }

    #[test]
    fn an_entry_that_agreed_is_checked_again_once_its_store_shows_another_version() {
        for parity in [0, 1] {
            let (lake, checked) = shown_by_one(parity);
            let handles = &AsRef::<Caches>::as_ref(&lake).handles;
            // Rewritten within the same second, at the same size: only the e_tag tells.
            let rewritten = ObjectMeta {
                e_tag: Some("1".to_string()),
                ..counter()
            };
            let one = StoreIdentity::named("one");
            handles.record(&one, &key("memory://one"), &rewritten, handles.epoch());
            assert!(
                checked.get(&Path::from("t/f0")).is_none(),
                "parity {parity}"
            );
        }
    }

    #[test]
    fn a_value_put_over_one_that_agreed_is_checked() {
        let (_lake, checked) = shown_by_one(0);
        // Made for a version no store has shown: nothing was recorded since the mark.
        let other = ObjectMeta {
            e_tag: Some("9".to_string()),
            ..counter()
        };
        checked.put(&Path::from("t/f0"), Made(other));
        assert!(checked.get(&Path::from("t/f0")).is_none());
    }

    #[test]
    fn an_entry_that_agreed_is_checked_again_once_the_session_registers_a_store() {
        let lake = LakeCache::builder().build().unwrap();
        let caches: &Caches = lake.as_ref();
        let handles = &caches.handles;
        let (store_one, one) = wrapper(&lake, "memory://one");
        let (store_two, two) = wrapper(&lake, "memory://two");
        handles.record(&one, &key("memory://one"), &counter(), handles.epoch());
        handles.record(&two, &key("memory://two"), &counter(), handles.epoch());
        let session = SessionStores::default();
        session.insert(key("memory://one"), store_one, &caches.directory);
        let inner = Arc::new(ClockCache::new(1 << 20, "t"));
        let checked = CheckedCache::new(inner, caches, Some(session.clone()));
        let path = Path::from("t/f0");
        checked.put(&path, Made(counter()));
        for _ in 0..3 {
            assert!(
                checked.get(&path).is_some(),
                "the session has one of the two stores"
            );
        }
        session.insert(key("memory://two"), store_two, &caches.directory);
        assert!(checked.get(&path).is_none(), "the session has both stores");
    }
}
