//! [`LakeReaderFactory`] and [`LakeReader`]: DataFusion's Parquet reader, with footers, page
//! indexes and bloom filters served from the [`IndexCache`].
//!
//! The reader wraps the one DataFusion would have used, so data ranges, metrics and every
//! decision about what to read stay DataFusion's. Only three things change:
//! - `get_metadata` returns the footer *with* its page index from the cache (DataFusion 55's
//!   opener asks for the footer alone, then loads the page index again on every query);
//! - `get_bytes` of a bloom filter's exact span is served from the cache;
//! - data ranges a scan's [`Prefetcher`] has downloaded (or is downloading) come from it, and
//!   the rest go to the inner reader in one call, never range by range.

use std::collections::HashMap;
use std::future::Future;
use std::ops::Range;
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::ParquetFileReaderFactory;
use datafusion::error::DataFusionError;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder};
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaData, ParquetMetaDataReader};
use url::Url;

use crate::index::{IndexCache, ObjectVersion};
use crate::prefetch::{FileLease, Prefetcher};
use crate::query::ScanFigures;

/// Creates [`LakeReader`]s around the readers of an inner factory (normally DataFusion's
/// `CachedParquetFileReaderFactory`).
#[derive(Debug)]
pub struct LakeReaderFactory {
    inner: Arc<dyn ParquetFileReaderFactory>,
    store: Arc<dyn ObjectStore>,
    store_url: Url,
    index: IndexCache,
    prefetcher: Option<Prefetcher>,
    /// The scan's cache figures, registered in its metrics set by the first reader.
    metrics: OnceLock<ReaderMetrics>,
}

/// One scan's index-cache and store figures, as `EXPLAIN ANALYZE` shows them on its
/// `DataSourceExec` (prefetching reports its own, `prefetch_*`).
#[derive(Debug, Clone)]
struct ReaderMetrics {
    footer_hits: Count,
    footer_misses: Count,
    bloom_hits: Count,
    bloom_misses: Count,
    /// Where the bytes readers read themselves (footers, bloom filters, data no prefetch
    /// covered) came from: the range cache's tiers or the store.
    reads: ScanFigures,
}

impl ReaderMetrics {
    fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let m = || MetricBuilder::new(metrics);
        Self {
            footer_hits: m().global_counter("index_footer_hits"),
            footer_misses: m().global_counter("index_footer_misses"),
            bloom_hits: m().global_counter("index_bloom_hits"),
            bloom_misses: m().global_counter("index_bloom_misses"),
            reads: ScanFigures::new(metrics),
        }
    }
}

/// Counts a cache lookup as a miss if its load ran, else as a hit.
fn hit_or_miss(loaded: &AtomicBool, hits: &Count, misses: &Count) {
    match loaded.load(Relaxed) {
        true => misses.add(1),
        false => hits.add(1),
    }
}

impl LakeReaderFactory {
    /// Wraps `inner`, whose files live in `store` at `store_url`, with `index`.
    pub fn new(
        inner: Arc<dyn ParquetFileReaderFactory>,
        store: Arc<dyn ObjectStore>,
        store_url: &Url,
        index: IndexCache,
    ) -> Self {
        Self {
            inner,
            store,
            store_url: store_url.clone(),
            index,
            prefetcher: None,
            metrics: OnceLock::new(),
        }
    }

    /// Its readers get their bytes from `prefetcher` where it has them.
    pub fn with_prefetcher(mut self, prefetcher: Option<Prefetcher>) -> Self {
        self.prefetcher = prefetcher;
        self
    }

    /// The store its readers read from.
    pub fn store(&self) -> Arc<dyn ObjectStore> {
        Arc::clone(&self.store)
    }
}

impl ParquetFileReaderFactory for LakeReaderFactory {
    fn create_reader(
        &self,
        partition_index: usize,
        file: PartitionedFile,
        metadata_size_hint: Option<usize>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> datafusion::error::Result<Box<dyn AsyncFileReader + Send>> {
        let object = ObjectVersion::new(&self.store_url, &file.object_meta);
        let meta = file.object_meta.clone();
        let lease = self
            .prefetcher
            .as_ref()
            .and_then(|p| p.open(&meta, metrics))
            .map(Arc::new);
        let figures = self
            .metrics
            .get_or_init(|| ReaderMetrics::new(metrics))
            .clone();
        let inner = self
            .inner
            .create_reader(partition_index, file, metadata_size_hint, metrics)?;
        Ok(Box::new(LakeReader {
            figures,
            inner,
            store: Arc::clone(&self.store),
            index: self.index.clone(),
            metadata: self.index.cached_metadata(&object),
            bloom_spans: None,
            object,
            meta,
            metadata_size_hint,
            lease,
        }))
    }
}

/// An [`AsyncFileReader`] whose index structures come from the [`IndexCache`].
pub struct LakeReader {
    figures: ReaderMetrics,
    inner: Box<dyn AsyncFileReader + Send>,
    store: Arc<dyn ObjectStore>,
    index: IndexCache,
    object: ObjectVersion,
    meta: ObjectMeta,
    metadata_size_hint: Option<usize>,
    /// The footer, once known, to recognise bloom-filter reads.
    metadata: Option<Arc<ParquetMetaData>>,
    /// Bloom-filter spans of `metadata`, start -> (end, row group, column); built on the
    /// first `get_bytes`, so a lookup is one map probe rather than a walk of every chunk.
    bloom_spans: Option<HashMap<u64, (u64, usize, usize)>>,
    /// This file's share of the scan's prefetching, if any.
    lease: Option<Arc<FileLease>>,
}

impl LakeReader {
    /// The (row group, column) whose bloom filter spans exactly `range`, if any.
    fn bloom_filter_at(&mut self, range: &Range<u64>) -> Option<(usize, usize)> {
        if self.bloom_spans.is_none() {
            let metadata = self.metadata.as_ref()?;
            let mut spans = HashMap::new();
            for (rg, row_group) in metadata.row_groups().iter().enumerate() {
                for (col, c) in row_group.columns().iter().enumerate() {
                    let offset = c.bloom_filter_offset().and_then(|o| u64::try_from(o).ok());
                    let length = c.bloom_filter_length().and_then(|l| u64::try_from(l).ok());
                    if let (Some(offset), Some(length)) = (offset, length) {
                        spans.insert(offset, (offset + length, rg, col));
                    }
                }
            }
            self.bloom_spans = Some(spans);
        }
        let &(end, rg, col) = self.bloom_spans.as_ref()?.get(&range.start)?;
        (end == range.end).then_some((rg, col))
    }
}

/// Fetches and decodes the footer of `meta` with its page index; errors name the file.
///
/// Reads the last `metadata_size_hint` bytes (the whole file if smaller) in one request, then
/// only the missing bytes before them if the footer or page index reaches further back. Every length read from the
/// file is checked against the file's size before anything is fetched or allocated.
pub async fn load_footer(
    store: Arc<dyn ObjectStore>,
    meta: ObjectMeta,
    metadata_size_hint: Option<usize>,
) -> datafusion::error::Result<Arc<ParquetMetaData>> {
    let path = meta.location.clone();
    let read = move |range: Range<u64>| {
        let (store, path) = (Arc::clone(&store), path.clone());
        async move { store.get_range(&path, range).await }
    };
    load_footer_with(meta, metadata_size_hint, read).await
}

/// [`load_footer`] with the bytes coming from `read` (for example a prefetched whole file).
pub async fn load_footer_with<F, Fut>(
    meta: ObjectMeta,
    metadata_size_hint: Option<usize>,
    read: F,
) -> datafusion::error::Result<Arc<ParquetMetaData>>
where
    F: Fn(Range<u64>) -> Fut,
    Fut: Future<Output = object_store::Result<Bytes>>,
{
    let size = meta.size;
    let fail = |why: String| {
        DataFusionError::Execution(format!(
            "reading the Parquet footer of {}: {why}",
            meta.location
        ))
    };
    if size < 12 {
        return Err(fail(format!(
            "{size} bytes is too small for a Parquet file"
        )));
    }
    let mut suffix = (metadata_size_hint.unwrap_or(0) as u64).clamp(8, size);
    let mut reader = ParquetMetaDataReader::new().with_page_index_policy(PageIndexPolicy::Optional);
    let mut bytes = read(size - suffix..size).await?;
    loop {
        let result = if reader.has_metadata() {
            reader.read_page_indexes_sized(&bytes, size)
        } else {
            reader.try_parse_sized(&bytes, size)
        };
        match result {
            Ok(()) => break,
            Err(ParquetError::NeedMoreData(needed))
                if (needed as u64) > suffix && (needed as u64) <= size =>
            {
                // Fetch only what lies before the bytes already here.
                let needed = needed as u64;
                let before = read(size - needed..size - suffix).await?;
                let mut joined = Vec::with_capacity(needed as usize);
                joined.extend_from_slice(&before);
                joined.extend_from_slice(&bytes);
                bytes = joined.into();
                suffix = needed;
            }
            Err(ParquetError::NeedMoreData(needed)) => {
                return Err(fail(format!(
                    "it asks for {needed} bytes from its end but has {size}"
                )));
            }
            Err(e) => return Err(fail(e.to_string())),
        }
    }
    reader
        .finish()
        .map(Arc::new)
        .map_err(|e| fail(e.to_string()))
}

fn external(e: DataFusionError) -> ParquetError {
    ParquetError::External(Box::new(e))
}

/// Reads ranges of one file: from the scan's prefetched bytes where they are, else from
/// the store.
#[derive(Clone)]
struct FileBytes {
    store: Arc<dyn ObjectStore>,
    path: object_store::path::Path,
    lease: Option<Arc<FileLease>>,
    reads: ScanFigures,
}

impl FileBytes {
    async fn get(&self, range: Range<u64>) -> object_store::Result<Bytes> {
        if let Some(lease) = &self.lease
            && let Some(bytes) = lease.read(range.clone()).await
        {
            return Ok(bytes);
        }
        self.reads
            .scope(self.store.get_range(&self.path, range))
            .await
    }
}

impl LakeReader {
    fn file_bytes(&self) -> FileBytes {
        FileBytes {
            store: Arc::clone(&self.store),
            path: self.meta.location.clone(),
            lease: self.lease.clone(),
            reads: self.figures.reads.clone(),
        }
    }

    /// Reads `ranges` through the inner reader, counting where the bytes came from.
    async fn read_inner(&mut self, ranges: Vec<Range<u64>>) -> Result<Vec<Bytes>> {
        let reads = self.figures.reads.clone();
        reads.scope(self.inner.get_byte_ranges(ranges)).await
    }
}

impl AsyncFileReader for LakeReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        let Some((row_group, column)) = self.bloom_filter_at(&range) else {
            let lease = self.lease.clone();
            return async move {
                if let Some(lease) = lease
                    && let Some(bytes) = lease.read(range.clone()).await
                {
                    return Ok(bytes);
                }
                let reads = self.figures.reads.clone();
                reads.scope(self.inner.get_bytes(range)).await
            }
            .boxed();
        };
        let file = self.file_bytes();
        let span = range.clone();
        let loaded = Arc::new(AtomicBool::new(false));
        let load = {
            let loaded = Arc::clone(&loaded);
            async move {
                loaded.store(true, Relaxed);
                Ok(Some(file.get(span).await?))
            }
        };
        async move {
            let bytes = self
                .index
                .bloom_filter(&self.object, row_group, column, load)
                .await
                .map_err(external)?;
            let f = &self.figures;
            hit_or_miss(&loaded, &f.bloom_hits, &f.bloom_misses);
            bytes.ok_or_else(|| ParquetError::General(format!("no bloom filter at {range:?}")))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        let Some(lease) = self.lease.clone() else {
            return self.read_inner(ranges).boxed();
        };
        async move {
            let mut found: Vec<Option<Bytes>> = Vec::with_capacity(ranges.len());
            for range in &ranges {
                found.push(lease.read(range.clone()).await);
            }
            let missing: Vec<Range<u64>> = ranges
                .iter()
                .zip(&found)
                .filter(|(_, f)| f.is_none())
                .map(|(r, _)| r.clone())
                .collect();
            let mut fetched = if missing.is_empty() {
                Vec::new()
            } else {
                self.read_inner(missing).await?
            }
            .into_iter();
            found
                .into_iter()
                .map(|f| match f {
                    Some(bytes) => Ok(bytes),
                    None => fetched.next().ok_or_else(|| {
                        ParquetError::General("the inner reader returned too few ranges".into())
                    }),
                })
                .collect()
        }
        .boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        let planned = self.index.datafusion_footer(&self.meta);
        let file = self.file_bytes();
        let (meta, hint) = (self.meta.clone(), self.metadata_size_hint);
        let loaded = Arc::new(AtomicBool::new(false));
        let fetched = Arc::clone(&loaded);
        let load = async move {
            match planned {
                Some(footer) => Ok(footer),
                None => {
                    fetched.store(true, Relaxed);
                    let read = move |range: Range<u64>| {
                        let file = file.clone();
                        async move { file.get(range).await }
                    };
                    load_footer_with(meta, hint, read).await
                }
            }
        };
        async move {
            let metadata = self
                .index
                .metadata(&self.object, load)
                .await
                .map_err(external)?;
            let f = &self.figures;
            hit_or_miss(&loaded, &f.footer_hits, &f.footer_misses);
            if let Some(lease) = &self.lease {
                lease.footer_known(&metadata);
            }
            self.metadata = Some(Arc::clone(&metadata));
            self.bloom_spans = None;
            Ok(metadata)
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::CountingStore;
    use crate::testkit::lake::{LakeSpec, file_bytes};
    use object_store::memory::InMemory;
    use object_store::path::Path;
    use object_store::{GetRange, PutPayload};

    #[tokio::test]
    async fn a_footer_beyond_the_hint_is_completed_without_refetching() {
        let bytes = file_bytes(&LakeSpec::small_files(1).with_row_groups_of(500), 0).unwrap();
        let path = Path::from("f.parquet");
        let store = Arc::new(CountingStore::new(InMemory::new()));
        store
            .put(&path, PutPayload::from(bytes.clone()))
            .await
            .unwrap();
        store.reset();
        let meta = store.head(&path).await.unwrap();
        let footer = load_footer(store.clone(), meta, Some(1024)).await.unwrap();
        assert_eq!(footer.num_row_groups(), 10);
        assert!(footer.column_index().is_some() && footer.offset_index().is_some());
        let fetched: Vec<Range<u64>> = store
            .gets()
            .into_iter()
            .map(|(_, r)| match r {
                Some(GetRange::Bounded(r)) => r,
                other => panic!("unexpected range {other:?}"),
            })
            .collect();
        assert!(
            fetched.len() >= 2,
            "the footer is larger than 1 KiB: {fetched:?}"
        );
        for pair in fetched.windows(2) {
            assert_eq!(
                pair[1].end, pair[0].start,
                "each read ends where the last began: {fetched:?}"
            );
        }
    }
}
