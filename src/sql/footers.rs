//! [`SessionFooters`]: an installed session's `FileMetadataCache` (DataFusion's footer cache,
//! which its planning consults: schema inference, statistics), answered from the shared index
//! cache for the files the session's own stores have shown they can read.
//!
//! DataFusion keys the cache by path alone, with no store. So a footer is taken from the
//! index cache only when exactly one of the session's registered stores recorded a version of
//! that path and has proven it (a HEAD or GET it answered); DataFusion then checks the entry
//! against its own listing's size and time, as for any entry. Anything else is the session's
//! own cache, as DataFusion fills it ([`CheckedCache`](crate::store::CheckedCache)).

use std::sync::Arc;
use std::time::Duration;

use datafusion::common::{HashMap as DfHashMap, TableReference};
use datafusion::datasource::physical_plan::parquet::metadata::CachedParquetMetaData;
use datafusion::execution::cache::cache_manager::{CachedFileMetadataEntry, FileMetadataCache};
use datafusion::execution::cache::{Cache, CacheEntryInfo};
use object_store::path::Path;

use crate::store::{Caches, SessionStores};

/// See the module docs.
pub(crate) struct SessionFooters {
    own: Arc<FileMetadataCache>,
    stores: SessionStores,
    caches: Caches,
}

impl std::fmt::Debug for SessionFooters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SessionFooters({})", self.own.name())
    }
}

impl SessionFooters {
    /// The session's own cache `own`, with footers of `stores` from `caches`.
    pub(crate) fn new(own: Arc<FileMetadataCache>, stores: SessionStores, caches: &Caches) -> Self {
        Self {
            own,
            stores,
            caches: caches.clone(),
        }
    }

    /// The footer of `path` the index cache holds for the one session store that proved a
    /// version of it.
    fn shared(&self, path: &Path) -> Option<CachedFileMetadataEntry> {
        let mut found = None;
        for reads in self.stores.reads() {
            let Some((meta, footer)) = reads.cached_footer(path) else {
                continue;
            };
            if found.is_some() {
                // Two of the session's stores hold this path: DataFusion's key cannot say
                // which it means.
                return None;
            }
            let file_metadata = Arc::new(CachedParquetMetaData::new(footer));
            found = Some(CachedFileMetadataEntry {
                meta,
                file_metadata,
            });
        }
        found
    }
}

impl Cache<Path, CachedFileMetadataEntry> for SessionFooters {
    fn get(&self, key: &Path) -> Option<CachedFileMetadataEntry> {
        self.own.get(key).or_else(|| {
            let shared = self.shared(key)?;
            self.caches.index.note_planning_hit();
            Some(shared)
        })
    }

    fn put(&self, key: &Path, value: CachedFileMetadataEntry) -> Option<CachedFileMetadataEntry> {
        self.own.put(key, value)
    }

    fn remove(&self, k: &Path) -> Option<CachedFileMetadataEntry> {
        self.own.remove(k)
    }

    fn contains_key(&self, k: &Path) -> bool {
        // Not `get`: a question is not a footer served to planning.
        self.own.contains_key(k) || self.shared(k).is_some()
    }

    fn len(&self) -> usize {
        self.own.len()
    }

    fn clear(&self) {
        self.own.clear()
    }

    fn name(&self) -> String {
        self.own.name()
    }

    fn cache_limit(&self) -> usize {
        self.own.cache_limit()
    }

    fn update_cache_limit(&self, limit: usize) {
        self.own.update_cache_limit(limit)
    }

    fn cache_ttl(&self) -> Option<Duration> {
        self.own.cache_ttl()
    }

    fn update_cache_ttl(&self, ttl: Option<Duration>) {
        self.own.update_cache_ttl(ttl)
    }

    fn drop_table_entries(&self, table_ref: &TableReference) -> datafusion::error::Result<()> {
        self.own.drop_table_entries(table_ref)
    }

    fn list_entries(&self) -> DfHashMap<Path, CacheEntryInfo<CachedFileMetadataEntry>> {
        self.own.list_entries()
    }
}
