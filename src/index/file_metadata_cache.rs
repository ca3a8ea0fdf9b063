//! The [`IndexCache`] as DataFusion's `FileMetadataCache`, so DataFusion's own Parquet reader
//! (planning, a plain `ListingTable`, a Ballista executor) keeps its footers in the same
//! bounded, observable cache. DataFusion keys these entries by path alone; they live beside
//! the version-keyed entries, under the same byte budget, and are never served to this
//! crate's readers. (The store layer checks them against known versions before DataFusion
//! gets one: `crate::store::CheckedCache`.)

use std::time::Duration;

use datafusion::common::{HashMap, TableReference};
use datafusion::execution::cache::cache_manager::CachedFileMetadataEntry;
use datafusion::execution::cache::{Cache, CacheEntryInfo};
use object_store::path::Path;

use super::IndexCache;

impl Cache<Path, CachedFileMetadataEntry> for IndexCache {
    fn get(&self, key: &Path) -> Option<CachedFileMetadataEntry> {
        self.datafusion_get(key)
    }

    fn put(&self, key: &Path, value: CachedFileMetadataEntry) -> Option<CachedFileMetadataEntry> {
        let old = self.datafusion_remove(key);
        self.datafusion_put(key, value);
        old
    }

    fn remove(&self, k: &Path) -> Option<CachedFileMetadataEntry> {
        self.datafusion_remove(k)
    }

    fn contains_key(&self, k: &Path) -> bool {
        self.datafusion_peek(k).is_some()
    }

    fn len(&self) -> usize {
        self.inner.entries.run_pending_tasks();
        self.inner.entries.entry_count() as usize
    }

    fn clear(&self) {
        IndexCache::clear(self)
    }

    fn name(&self) -> String {
        "lakecache index cache".to_string()
    }

    fn cache_limit(&self) -> usize {
        self.datafusion_limit() as usize
    }

    /// The byte budget is set by `lakecache.index.capacity` when the cache is built; a limit
    /// from DataFusion (`datafusion.runtime.metadata_cache_limit`) is remembered and reported,
    /// and 0 stops DataFusion's own reader from adding entries.
    fn update_cache_limit(&self, limit: usize) {
        self.set_datafusion_limit(limit as u64);
    }

    fn cache_ttl(&self) -> Option<Duration> {
        None
    }

    fn update_cache_ttl(&self, _ttl: Option<Duration>) {}

    fn drop_table_entries(&self, _table_ref: &TableReference) -> datafusion::error::Result<()> {
        Ok(())
    }

    fn list_entries(&self) -> HashMap<Path, CacheEntryInfo<CachedFileMetadataEntry>> {
        self.datafusion_entries()
            .into_iter()
            .map(|(path, e)| {
                let size_bytes = e.file_metadata.memory_size();
                let info = CacheEntryInfo {
                    value: e,
                    size_bytes,
                    hits: 0,
                    expires: None,
                };
                (path, info)
            })
            .collect()
    }
}
