//! The [`IndexCache`] as DataFusion's `FileMetadataCache`, so DataFusion's own Parquet reader
//! (a plain `ListingTable`, or a Ballista executor) keeps its footers in the same bounded,
//! observable cache.
//!
//! DataFusion keys these entries by path alone and checks size and modification time itself;
//! they live beside the version-keyed entries, under the same byte budget.

use std::time::Duration;

use datafusion::common::{HashMap, TableReference};
use datafusion::datasource::physical_plan::parquet::metadata::CachedParquetMetaData;
use datafusion::execution::cache::cache_manager::CachedFileMetadataEntry;
use datafusion::execution::cache::{Cache, CacheEntryInfo};
use object_store::ObjectMeta;
use object_store::path::Path;
use parquet::file::metadata::ParquetMetaData;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::{IndexCache, IndexEntry, IndexKey};

impl IndexCache {
    /// The footer DataFusion's own reader cached for `meta`, if it is still valid for it and
    /// holds the page index: what planning already read need not be fetched again.
    pub(crate) fn datafusion_footer(&self, meta: &ObjectMeta) -> Option<Arc<ParquetMetaData>> {
        let entry = self.datafusion_entry(&meta.location)?;
        if !entry.is_valid_for(meta) {
            return None;
        }
        let footer = entry
            .file_metadata
            .as_any()
            .downcast_ref::<CachedParquetMetaData>()?;
        let footer = footer.parquet_metadata();
        (footer.column_index().is_some() && footer.offset_index().is_some())
            .then(|| Arc::clone(footer))
    }

    fn datafusion_entry(&self, k: &Path) -> Option<CachedFileMetadataEntry> {
        match self.inner.entries.get(&IndexKey::DataFusion(k.clone()))? {
            IndexEntry::DataFusion(e) => Some(e),
            _ => None,
        }
    }
}

impl Cache<Path, CachedFileMetadataEntry> for IndexCache {
    fn get(&self, key: &Path) -> Option<CachedFileMetadataEntry> {
        let found = self.datafusion_entry(key);
        match &found {
            Some(_) => self.inner.counters.hit(),
            None => self.inner.counters.miss(),
        }
        found
    }

    fn put(&self, key: &Path, value: CachedFileMetadataEntry) -> Option<CachedFileMetadataEntry> {
        // DataFusion's `metadata_cache_limit = 0` means: do not cache its metadata.
        if self.inner.datafusion_limit.load(Relaxed) == 0 {
            return None;
        }
        let old = self.datafusion_entry(key);
        self.inner.footer_loads.fetch_add(1, Relaxed);
        self.admit(
            &IndexKey::DataFusion(key.clone()),
            IndexEntry::DataFusion(value),
        );
        old
    }

    fn remove(&self, k: &Path) -> Option<CachedFileMetadataEntry> {
        match self
            .inner
            .entries
            .remove(&IndexKey::DataFusion(k.clone()))?
        {
            IndexEntry::DataFusion(e) => Some(e),
            _ => None,
        }
    }

    fn contains_key(&self, k: &Path) -> bool {
        self.inner
            .entries
            .contains_key(&IndexKey::DataFusion(k.clone()))
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
        self.inner.datafusion_limit.load(Relaxed) as usize
    }

    /// The byte budget is set by `lakecache.index.capacity` when the cache is built; a limit
    /// from DataFusion (`datafusion.runtime.metadata_cache_limit`) is remembered and reported,
    /// and 0 stops DataFusion's own reader from adding entries.
    fn update_cache_limit(&self, limit: usize) {
        self.inner.datafusion_limit.store(limit as u64, Relaxed);
    }

    fn cache_ttl(&self) -> Option<Duration> {
        None
    }

    fn update_cache_ttl(&self, _ttl: Option<Duration>) {}

    fn drop_table_entries(&self, _table_ref: &TableReference) -> datafusion::error::Result<()> {
        Ok(())
    }

    fn list_entries(&self) -> HashMap<Path, CacheEntryInfo<CachedFileMetadataEntry>> {
        self.inner
            .entries
            .iter()
            .filter_map(|(k, v)| match (k.as_ref(), v) {
                (IndexKey::DataFusion(path), IndexEntry::DataFusion(e)) => {
                    let size_bytes = e.file_metadata.memory_size();
                    let info = CacheEntryInfo {
                        value: e,
                        size_bytes,
                        hits: 0,
                        expires: None,
                    };
                    Some((path.clone(), info))
                }
                _ => None,
            })
            .collect()
    }
}
