//! [`LakeReaderFactory`] and [`LakeReader`]: the Parquet reader of every scan this crate
//! rewrites. DataFusion still decides what to read (projection, pruning, pushdown); the reader
//! decides where the bytes come from:
//! - `get_metadata` returns the footer *with* its page index from the index cache (DataFusion
//!   55's opener asks for the footer alone, then loads the page index again on every query);
//! - `get_bytes` of a bloom filter's exact span is served from the index cache;
//! - every other read is "lease, else read": bytes the scan's prefetcher holds (or is
//!   downloading), else a versioned read of the version the scan planned with.
//!
//! DataFusion's own scan metrics are kept as its reader keeps them: every byte the decoder
//! asks for counts in `bytes_scanned` (and `scan_efficiency_ratio`), wherever it came from;
//! where it came from is in the scan's [`ScanMetrics`].

use std::collections::HashMap;
use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Mutex, OnceLock};

use bytes::Bytes;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::ParquetFileReaderFactory;
use datafusion::datasource::physical_plan::parquet::ParquetFileMetrics;
use datafusion::error::DataFusionError;
use datafusion::execution::cache::cache_manager::FileMetadataCache;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use futures::FutureExt;
use futures::future::BoxFuture;
use object_store::path::Path;
use parquet::arrow::arrow_reader::ArrowReaderOptions;
use parquet::arrow::async_reader::AsyncFileReader;
use parquet::errors::{ParquetError, Result};
use parquet::file::metadata::ParquetMetaData;

use crate::index::IndexCache;
use crate::index::footer::{bloom_range, load_footer};
use crate::metrics::ScanMetrics;
use crate::object::ObjectVersion;
use crate::prefetch::{FileLease, Prefetcher};
use crate::store::StoreReads;

/// Creates the [`LakeReader`]s of one scan.
#[derive(Debug)]
pub(crate) struct LakeReaderFactory {
    reads: StoreReads,
    index: IndexCache,
    /// The session's own footer cache, which DataFusion's planning filled.
    planning: Option<Arc<FileMetadataCache>>,
    /// Given with the factory, or once the final plan is known (see
    /// [`AwaitingPlan`](super::awaiting::AwaitingPlan)): before any reader is created.
    prefetcher: OnceLock<Prefetcher>,
    /// The scan's figures, registered in its metrics set by the first reader.
    metrics: OnceLock<ScanMetrics>,
    /// The version each file of the scan was pinned to by its first reader.
    pins: Pins,
}

/// The version each file of one scan reads at, once its first reader pinned it: DataFusion
/// opens a file with more than one reader (the footer's, then another for bloom filters and
/// data), and a file split across partitions with one per part. A version a listing named by
/// size and time alone is completed with what the handle cache recorded when each reader is
/// made, which a rewrite may change in between; every reader of the scan takes the first
/// one's, so the footer and every byte of the file are of one version.
#[derive(Debug, Clone, Default)]
struct Pins(Arc<Mutex<HashMap<Path, ObjectVersion>>>);

impl Pins {
    /// The version the scan pinned `planned`'s file to, if a reader did.
    fn of(&self, planned: &ObjectVersion) -> Option<ObjectVersion> {
        let pins = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pins.get(planned.path()).cloned()
    }

    /// Pins the file to `version` unless a reader pinned it already; the version the scan
    /// reads it at.
    fn settle(&self, version: ObjectVersion) -> ObjectVersion {
        let mut pins = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pins.entry(version.path().clone())
            .or_insert(version)
            .clone()
    }
}

impl LakeReaderFactory {
    /// Readers of `reads`' store, with footers and bloom filters in `index` (or, provably of
    /// the same version, decoded by the session's planning into `planning`), and bytes from
    /// `prefetcher` where it has them.
    pub(crate) fn new(
        reads: StoreReads,
        index: IndexCache,
        planning: Option<Arc<FileMetadataCache>>,
        prefetcher: Option<Prefetcher>,
    ) -> Self {
        Self {
            reads,
            index,
            planning,
            prefetcher: prefetcher.map(OnceLock::from).unwrap_or_default(),
            metrics: OnceLock::new(),
            pins: Pins::default(),
        }
    }

    /// The store reads the readers read through.
    pub(crate) fn reads(&self) -> &StoreReads {
        &self.reads
    }

    /// Gives the scan its prefetcher, once the final plan sized it; `false` if it had one.
    pub(crate) fn bind_prefetcher(&self, prefetcher: Prefetcher) -> bool {
        self.prefetcher.set(prefetcher).is_ok()
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
        let scan = self
            .metrics
            .get_or_init(|| ScanMetrics::new(metrics))
            .clone();
        let meta = &file.object_meta;
        let planned = self.reads.version_of(meta, Some(&scan));
        let version = self.pins.of(&planned).unwrap_or(planned);
        let lease = self
            .prefetcher
            .get()
            .and_then(|p| p.open(&version, &scan))
            .map(Arc::new);
        let file_metrics =
            ParquetFileMetrics::new(partition_index, meta.location.as_ref(), metrics);
        Ok(Box::new(LakeReader {
            file_metrics,
            bytes: FileBytes {
                reads: self.reads.clone(),
                version,
                lease,
                scan,
            },
            index: self.index.clone(),
            planning: self.planning.clone(),
            pins: self.pins.clone(),
            metadata_size_hint,
            metadata: None,
            bloom_spans: None,
        }))
    }
}

/// The one way a reader's bytes come: lease, else read.
#[derive(Clone)]
struct FileBytes {
    reads: StoreReads,
    version: ObjectVersion,
    /// This file's share of the scan's prefetching, if any.
    lease: Option<Arc<FileLease>>,
    scan: ScanMetrics,
}

impl FileBytes {
    /// `ranges` of the planned version: from the prefetcher where it has them, the rest in
    /// one versioned read. `data` marks reads of column data (see `FileLease::read_all`).
    async fn get(&self, ranges: Vec<Range<u64>>, data: bool) -> object_store::Result<Vec<Bytes>> {
        let found = match &self.lease {
            Some(lease) => lease.read_all(&self.version, &ranges, data).await,
            None => vec![None; ranges.len()],
        };
        let missing: Vec<Range<u64>> = ranges
            .iter()
            .zip(&found)
            .filter(|(_, f)| f.is_none())
            .map(|(r, _)| r.clone())
            .collect();
        let mut fetched = self
            .reads
            .read(&self.version, &missing, Some(&self.scan))
            .await?
            .into_iter();
        Ok(found
            .into_iter()
            .map(|f| f.or_else(|| fetched.next()).unwrap_or_default())
            .collect())
    }

    async fn get_one(&self, range: Range<u64>) -> object_store::Result<Bytes> {
        Ok(self
            .get(vec![range], false)
            .await?
            .pop()
            .unwrap_or_default())
    }
}

/// An [`AsyncFileReader`] whose index structures come from the index cache and whose bytes
/// are of one object version.
pub(crate) struct LakeReader {
    file_metrics: ParquetFileMetrics,
    bytes: FileBytes,
    index: IndexCache,
    planning: Option<Arc<FileMetadataCache>>,
    /// The versions the scan's files are read at.
    pins: Pins,
    metadata_size_hint: Option<usize>,
    /// The footer, once known, to recognise bloom-filter reads.
    metadata: Option<Arc<ParquetMetaData>>,
    /// Bloom-filter spans of `metadata`, start -> (end, row group, column); built on the
    /// first `get_bytes`, so a lookup is one map probe rather than a walk of every chunk.
    bloom_spans: Option<HashMap<u64, (u64, usize, usize)>>,
}

impl LakeReader {
    /// The (row group, column) whose bloom filter spans exactly `range`, if any.
    fn bloom_filter_at(&mut self, range: &Range<u64>) -> Option<(usize, usize)> {
        if self.bloom_spans.is_none() {
            let metadata = self.metadata.as_ref()?;
            let mut spans = HashMap::new();
            for (rg, row_group) in metadata.row_groups().iter().enumerate() {
                for (col, c) in row_group.columns().iter().enumerate() {
                    if let Some(span) = bloom_range(c) {
                        spans.insert(span.start, (span.end, rg, col));
                    }
                }
            }
            self.bloom_spans = Some(spans);
        }
        let &(end, rg, col) = self.bloom_spans.as_ref()?.get(&range.start)?;
        (end == range.end).then_some((rg, col))
    }

    fn scanned(&self, bytes: u64) {
        self.file_metrics.bytes_scanned.add(bytes as usize);
    }
}

fn external(e: DataFusionError) -> ParquetError {
    ParquetError::External(Box::new(e))
}

fn store_error(e: object_store::Error) -> ParquetError {
    ParquetError::External(Box::new(e))
}

impl AsyncFileReader for LakeReader {
    fn get_bytes(&mut self, range: Range<u64>) -> BoxFuture<'_, Result<Bytes>> {
        self.scanned(range.end.saturating_sub(range.start));
        let Some((row_group, column)) = self.bloom_filter_at(&range) else {
            let bytes = self.bytes.clone();
            return async move { bytes.get_one(range).await.map_err(store_error) }.boxed();
        };
        let file = self.bytes.clone();
        let span = range.clone();
        let load = async move { Ok(Some(file.get_one(span).await?)) };
        async move {
            let (bytes, hit) = self
                .index
                .bloom_filter(
                    &self.bytes.version,
                    self.bytes.reads.identity(),
                    row_group,
                    column,
                    load,
                )
                .await
                .map_err(external)?;
            // Nothing cached is served before this store has shown it can read the file (a
            // load read through it, which proves it).
            let file = &self.bytes;
            if hit {
                file.reads.prove(&file.version).await.map_err(store_error)?;
            }
            self.bytes.scan.index_lookup(true, hit);
            bytes.ok_or_else(|| ParquetError::General(format!("no bloom filter at {range:?}")))
        }
        .boxed()
    }

    fn get_byte_ranges(&mut self, ranges: Vec<Range<u64>>) -> BoxFuture<'_, Result<Vec<Bytes>>> {
        let total: u64 = ranges.iter().map(|r| r.end.saturating_sub(r.start)).sum();
        self.scanned(total);
        let bytes = self.bytes.clone();
        async move { bytes.get(ranges, true).await.map_err(store_error) }.boxed()
    }

    fn get_metadata<'a>(
        &'a mut self,
        _options: Option<&'a ArrowReaderOptions>,
    ) -> BoxFuture<'a, Result<Arc<ParquetMetaData>>> {
        async move {
            // A version a listing named by size and time alone is pinned to its e_tag first:
            // the footer and every later read then come from one version, and the footer is
            // kept.
            let pinned = self.bytes.reads.pinned(&self.bytes.version).await;
            self.bytes.version = self.pins.settle(pinned.map_err(store_error)?);
            let file = self.bytes.clone();
            let hint = self.metadata_size_hint;
            let planning = self.planning.clone();
            let read_here = Arc::new(AtomicBool::new(false));
            let load = {
                let read_here = Arc::clone(&read_here);
                async move {
                    // On a miss only: the footer DataFusion's planning decoded, if it is of
                    // this very version.
                    let planned = planning.as_ref().and_then(|p| {
                        IndexCache::planned_footer(p.as_ref(), &file.version, file.reads.identity())
                    });
                    if let Some(footer) = planned {
                        return Ok(footer);
                    }
                    read_here.store(true, Relaxed);
                    let read = |range: Range<u64>| {
                        let file = file.clone();
                        async move { file.get_one(range).await }
                    };
                    load_footer(&file.version, hint, read).await
                }
            };
            let (metadata, hit) = self
                .index
                .metadata(&self.bytes.version, self.bytes.reads.identity(), load)
                .await
                .map_err(external)?;
            // Nothing cached is served before this store has shown it can read the file: a
            // footer read through it proves it, one from a cache needs a proof.
            let file = &self.bytes;
            if !read_here.load(Relaxed) {
                file.reads.prove(&file.version).await.map_err(store_error)?;
            }
            self.bytes.scan.index_lookup(false, hit);
            if let Some(lease) = &self.bytes.lease {
                lease.footer_known(&metadata);
            }
            self.metadata = Some(Arc::clone(&metadata));
            self.bloom_spans = None;
            Ok(metadata)
        }
        .boxed()
    }
}

impl Drop for LakeReader {
    fn drop(&mut self) {
        // As DataFusion's own reader reports it: bytes asked for against the file's size.
        let m = &self.file_metrics;
        m.scan_efficiency_ratio.add_part(m.bytes_scanned.value());
        m.scan_efficiency_ratio
            .set_total(self.bytes.version.size() as usize);
    }
}
