//! What a scan will read, worked out from its final physical plan: the files in the order its
//! partitions take them, the columns it projects, and for a large file the byte ranges of the
//! column chunks DataFusion will ask for once its own row-group pruning has run.
//!
//! The plan only predicts; DataFusion still decides. A wrong guess costs wasted bytes (which
//! the figures report), never wrong rows: a read that no prefetch covers goes to the store.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::datatypes::SchemaRef;
use bytes::Bytes;
use datafusion::common::config::ConfigOptions;
use datafusion::datasource::listing::{FileRange, PartitionedFile};
use datafusion::datasource::physical_plan::parquet::{
    BloomFilterStatistics, apply_file_schema_type_coercions,
};
use datafusion::datasource::physical_plan::parquet::{
    PagePruningAccessPlanFilter, ParquetAccessPlan, ParquetFileMetrics, RowGroupAccess,
    RowGroupAccessPlanFilter,
};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::physical_expr::PhysicalExprSimplifier;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapterFactory,
};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::PhysicalExpr;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use object_store::{OBJECT_STORE_COALESCE_DEFAULT, ObjectMeta};
use parquet::arrow::arrow_reader::{RowSelection, RowSelector};
use parquet::arrow::{parquet_column, parquet_to_arrow_schema};
use parquet::basic::Type as PhysicalType;
use parquet::bloom_filter::Sbbf;
use parquet::file::metadata::ParquetMetaData;
use parquet::schema::types::TypePtr;

use crate::index::footer::{bloom_range, chunk_range};

/// The bloom filter of (row group, leaf column), if the caches hold it: what a file's pieces
/// are pruned by.
pub(crate) type Blooms<'a> = dyn Fn(usize, usize) -> Option<Bytes> + 'a;

/// One bloom filter DataFusion's opener reads: its row group, its leaf column, its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BloomSpan {
    pub row_group: usize,
    pub column: usize,
    pub range: Range<u64>,
}

/// The scan's predicate as one file schema prunes with it: row groups by statistics, the
/// file's arrow schema, and pages by the page index.
type Pruning = (
    Arc<PruningPredicate>,
    SchemaRef,
    Arc<PagePruningAccessPlanFilter>,
);

/// One file of a scan, as a partition will open it (a large file may be split by byte range
/// across partitions and so appear more than once).
#[derive(Debug, Clone)]
pub(crate) struct ScanFile {
    pub meta: ObjectMeta,
    pub range: Option<FileRange>,
}

/// Whole column chunks of one row group this close together are fetched as one request, as
/// object_store coalesces the ranges DataFusion asks for in one call: a prefetch then costs
/// the requests and bytes the reader's own reads would have, only earlier. Row groups are
/// never merged, so bytes of a pruned row group are never fetched.
const CHUNK_GAP: u64 = OBJECT_STORE_COALESCE_DEFAULT;

/// Pages of one row group are fetched as one request when the bytes between them (pages the
/// reader skips, columns it does not read) come to at most 1 / `WASTE_SHARE` of it, or the
/// gap is under [`PAGE_GAP`]. Merging as object_store does would fetch most of the pages a
/// narrow filter skips; requests run side by side, so a few more cost little time.
const WASTE_SHARE: u64 = 20;
/// A gap between pages too small to be worth a request of its own.
const PAGE_GAP: u64 = 4 << 10;

/// What one Parquet scan reads.
#[derive(Debug)]
pub(crate) struct ScanPlan {
    /// Files in the order the partitions are expected to open them.
    pub files: Vec<ScanFile>,
    /// Table columns the scan reads (projection and predicate); `None` means all.
    columns: Option<HashSet<String>>,
    predicate: Option<Arc<dyn PhysicalExpr>>,
    /// The table's schema without partition columns, which the predicate is written against.
    file_schema: SchemaRef,
    /// Rows the scan stops after, when DataFusion pushed a limit into it.
    pub limit: Option<usize>,
    /// Whether the scan must keep its files' row order (then no limit prunes row groups).
    preserve_order: bool,
    /// Whether the reader prunes pages by the page index.
    page_index: bool,
    /// Whether filters are pushed into the reader, which then reads rows past a limit.
    pushdown_filters: bool,
    /// Whether the reader prunes row groups by bloom filters.
    bloom_filters: bool,
    /// Whether the query may stop reading this scan early (a limit above it, with nothing
    /// between that reads all its input first): the prefetcher then fetches ahead only as
    /// far as the readers have shown they read.
    pub stops_early: bool,
    /// DataFusion's row-group pruning wants a metrics sink; these figures are not shown.
    metrics: ParquetFileMetrics,
    /// The pruning of the last file schema seen, by its root type.
    pruning: Mutex<Option<(TypePtr, Option<Pruning>)>>,
}

impl ScanPlan {
    /// The plan of the scan `config` over `source`, as a session with `options` runs it.
    pub fn new(config: &FileScanConfig, source: &ParquetSource, options: &ConfigOptions) -> Self {
        // The same order DataFusion's FileStream uses: one shared queue (with the source's
        // reordering) when partitions may steal work, else each partition's own group, which
        // run side by side.
        let shared = !config.preserve_order
            && config.output_partitioning.is_none()
            && options.execution.enable_file_stream_work_stealing;
        let files: Vec<PartitionedFile> = if shared {
            let flat = config
                .file_groups
                .iter()
                .flat_map(|g| g.iter().cloned())
                .collect();
            source.reorder_files(flat)
        } else {
            let longest = config.file_groups.iter().map(|g| g.len()).max();
            (0..longest.unwrap_or(0))
                .flat_map(|i| {
                    config
                        .file_groups
                        .iter()
                        .filter_map(move |g| g.files().get(i))
                })
                .cloned()
                .collect()
        };
        let predicate = source.filter();
        let columns = source.projection().map(|projection| {
            let mut names: HashSet<String> = projection
                .expr_iter()
                .flat_map(|e| collect_columns(&e))
                .map(|c| c.name().to_string())
                .collect();
            if let Some(p) = &predicate {
                names.extend(collect_columns(p).into_iter().map(|c| c.name().to_string()));
            }
            names
        });
        Self {
            files: files
                .into_iter()
                .map(|f| ScanFile {
                    meta: f.object_meta,
                    range: f.range,
                })
                .collect(),
            columns,
            predicate,
            file_schema: Arc::clone(source.table_schema().file_schema()),
            limit: config.limit,
            preserve_order: config.preserve_order,
            page_index: source.table_parquet_options().global.enable_page_index,
            pushdown_filters: source.table_parquet_options().global.pushdown_filters,
            bloom_filters: source.table_parquet_options().global.bloom_filter_on_read,
            stops_early: config.limit.is_some(),
            metrics: ParquetFileMetrics::new(0, "prefetch plan", &ExecutionPlanMetricsSet::new()),
            pruning: Mutex::new(None),
        }
    }

    /// The ranges of `file` DataFusion is expected to read, in file order, each at most
    /// `split` bytes long.
    ///
    /// Mirrors the access plan DataFusion's opener builds ([`Self::access_plan`]) and what
    /// parquet's reader then fetches of it: for a row group it scans whole, the projected
    /// column chunks; for one it scans a row selection of (page pruning, a limit), the
    /// dictionary page and the data pages holding selected rows, found in the offset index.
    /// Ranges of a row group are merged as object_store would ([`CHUNK_GAP`]), pages only
    /// where that wastes little ([`WASTE_SHARE`]), and
    /// ranges longer than `split` cut into requests that run side by side.
    pub fn pieces(
        &self,
        file: &ScanFile,
        metadata: &ParquetMetaData,
        split: u64,
        blooms: &Blooms<'_>,
    ) -> Vec<Range<u64>> {
        let row_groups = metadata.row_groups();
        let schema = metadata.file_metadata().schema_descr();
        let wanted: Vec<usize> = (0..schema.num_columns())
            .filter(|&leaf| {
                let root = schema.get_column_root(leaf).name();
                self.columns.as_ref().is_none_or(|c| c.contains(root))
            })
            .collect();
        let offsets = metadata.offset_index();
        let mut left = self.row_limit();
        let mut merged: Vec<Range<u64>> = Vec::new();
        for (rg, access) in self
            .access_plan(file, metadata, blooms)
            .into_inner()
            .into_iter()
            .enumerate()
        {
            let rows = row_groups[rg].num_rows().max(0) as usize;
            let mut selection = match access {
                RowGroupAccess::Skip => continue,
                RowGroupAccess::Scan => None,
                RowGroupAccess::Selection(selection) => Some(selection),
            };
            if let Some(left) = left.as_mut() {
                // The reader stops after the limit's rows: those of the first row groups.
                if *left == 0 {
                    break;
                }
                let selected = selection.as_ref().map_or(rows, |s| s.row_count());
                if selected > *left {
                    selection = Some(first_rows(selection.as_ref(), rows, *left));
                }
                *left -= selected.min(*left);
            }
            let mut ranges: Vec<Range<u64>> = Vec::new();
            for &leaf in &wanted {
                // Checked, not `byte_range()`, which asserts on a footer's negative offsets.
                let Some(chunk) = row_groups[rg].columns().get(leaf).and_then(chunk_range) else {
                    continue;
                };
                let pages = offsets
                    .and_then(|o| o.get(rg))
                    .and_then(|o| o.get(leaf))
                    .map(|o| o.page_locations());
                match (&selection, pages) {
                    (Some(selection), Some(pages)) if !pages.is_empty() => {
                        // As parquet's reader does: the dictionary page, if the first data page
                        // does not start the chunk, then the pages of selected rows.
                        let first = u64::try_from(pages[0].offset).unwrap_or(chunk.start);
                        if first > chunk.start {
                            ranges.push(chunk.start..first.min(chunk.end));
                        }
                        ranges.extend(selection.scan_ranges(pages));
                    }
                    _ => ranges.push(chunk),
                }
            }
            ranges.sort_by_key(|r| r.start);
            let gap = if selection.is_some() {
                PAGE_GAP
            } else {
                CHUNK_GAP
            };
            merged.extend(merge_close(ranges, gap));
        }
        merged.sort_by_key(|r| r.start);
        let mut pieces = Vec::new();
        for range in merged {
            let mut start = range.start;
            while start < range.end {
                let end = range.end.min(start.saturating_add(split));
                pieces.push(start..end);
                start = end;
            }
        }
        pieces
    }

    /// The bloom filters DataFusion's opener reads of `file` before it reads data: those of
    /// the predicate's `=` and `IN` columns, in the row groups its byte range and
    /// statistics keep. Empty when the scan has no such predicate or reads no bloom filters.
    pub fn bloom_spans(&self, file: &ScanFile, metadata: &ParquetMetaData) -> Vec<BloomSpan> {
        let Some((predicate, arrow, _)) = self.pruning_predicate(metadata) else {
            return Vec::new();
        };
        let columns = self.bloom_columns(&predicate, &arrow, metadata);
        if columns.is_empty() {
            return Vec::new();
        }
        let plan = self
            .statistics_plan(file, metadata, Some((&predicate, &arrow)))
            .build();
        let row_groups = metadata.row_groups();
        let mut spans = Vec::new();
        for rg in (0..row_groups.len()).filter(|&rg| plan.should_scan(rg)) {
            for &(_, leaf, _, _) in &columns {
                let span = row_groups[rg].columns().get(leaf).and_then(bloom_range);
                if let Some(range) = span {
                    spans.push(BloomSpan {
                        row_group: rg,
                        column: leaf,
                        range,
                    });
                }
            }
        }
        spans
    }

    /// The predicate's columns a bloom filter can rule values out of: (name, leaf column,
    /// physical type, type length), as the opener finds them.
    fn bloom_columns(
        &self,
        predicate: &PruningPredicate,
        arrow: &SchemaRef,
        metadata: &ParquetMetaData,
    ) -> Vec<(String, usize, PhysicalType, i32)> {
        if !self.bloom_filters {
            return Vec::new();
        }
        let schema = metadata.file_metadata().schema_descr();
        predicate
            .literal_columns()
            .into_iter()
            .filter_map(|name| {
                let (leaf, _) = parquet_column(schema, arrow, &name)?;
                let column = schema.column(leaf);
                Some((name, leaf, column.physical_type(), column.type_length()))
            })
            .collect()
    }

    /// Row groups `file`'s byte range and the predicate's statistics keep.
    fn statistics_plan(
        &self,
        file: &ScanFile,
        metadata: &ParquetMetaData,
        pruning: Option<(&PruningPredicate, &SchemaRef)>,
    ) -> RowGroupAccessPlanFilter {
        let row_groups = metadata.row_groups();
        let mut access =
            RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(row_groups.len()));
        if let Some(range) = &file.range {
            access.prune_by_range(row_groups, range);
        }
        if let Some((predicate, arrow)) = pruning {
            let schema = metadata.file_metadata().schema_descr();
            access.prune_by_statistics(arrow, schema, row_groups, predicate, &self.metrics);
        }
        access
    }

    /// The row groups and row selections DataFusion's opener will read of `file`, in its
    /// order: its byte range, row-group pruning by statistics, then by the bloom filters
    /// `blooms` holds (a row group whose filters are not there is kept: fetched in vain at
    /// worst, never missed), pruning by the limit over fully matched row groups, then page
    /// pruning by the page index.
    fn access_plan(
        &self,
        file: &ScanFile,
        metadata: &ParquetMetaData,
        blooms: &Blooms<'_>,
    ) -> ParquetAccessPlan {
        let row_groups = metadata.row_groups();
        let schema = metadata.file_metadata().schema_descr();
        let pruning = self.pruning_predicate(metadata);
        let mut access = self.statistics_plan(
            file,
            metadata,
            pruning.as_ref().map(|(p, a, _)| (p.as_ref(), a)),
        );
        if let Some((predicate, arrow, _)) = &pruning {
            let columns = self.bloom_columns(predicate, arrow, metadata);
            if !columns.is_empty() {
                let filters: Vec<BloomFilterStatistics> = (0..row_groups.len())
                    .map(|rg| {
                        let mut filters = BloomFilterStatistics::with_capacity(columns.len());
                        for (name, leaf, ty, len) in &columns {
                            let sbbf =
                                blooms(rg, *leaf).and_then(|bytes| Sbbf::from_bytes(&bytes).ok());
                            if let Some(sbbf) = sbbf {
                                filters.insert(name.clone(), sbbf, *ty, *len);
                            }
                        }
                        filters
                    })
                    .collect();
                access.prune_by_bloom_filters(predicate, &self.metrics, &filters);
            }
        }
        if let (Some(limit), false) = (self.limit, self.preserve_order) {
            access.prune_by_limit(limit, row_groups, &self.metrics);
        }
        let plan = access.build();
        match &pruning {
            Some((_, arrow, pages)) if self.page_index && !plan.is_empty() => {
                pages.prune_plan_with_page_index(plan, arrow, schema, metadata, &self.metrics)
            }
            _ => plan,
        }
    }

    /// The rows each reader stops after, when they can be counted before filtering: the
    /// scan's limit, unless filters are pushed into the reader (it then counts rows that
    /// pass them, which no footer tells).
    fn row_limit(&self) -> Option<usize> {
        match (self.limit, &self.predicate) {
            (Some(_), Some(_)) if self.pushdown_filters => None,
            (limit, _) => limit,
        }
    }

    /// The plan of a scan the query may stop reading early (`true`), or surely reads to its
    /// end as far as its plan tells (`false`). A limit pushed into the scan always counts.
    pub fn stopping_early(self, stops_early: bool) -> Self {
        Self {
            stops_early: stops_early || self.limit.is_some(),
            ..self
        }
    }

    /// The scan's predicate as DataFusion prunes this file with it ([`Pruning`]); `None` if
    /// there is none or it cannot be
    /// applied here (then no row group is ruled out).
    ///
    /// Built once per file schema: the files of a table mostly share one, and building it
    /// for each of thousands of files a lookup prunes would cost more than the lookup.
    fn pruning_predicate(&self, metadata: &ParquetMetaData) -> Option<Pruning> {
        let predicate = self.predicate.as_ref()?;
        let root = metadata.file_metadata().schema_descr().root_schema_ptr();
        let mut last = self.pruning.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((seen, pruning)) = last.as_ref()
            && **seen == *root
        {
            return pruning.clone();
        }
        let built = (|| {
            // The file's schema as the opener reads it: strings as the table's view types.
            let file =
                parquet_to_arrow_schema(metadata.file_metadata().schema_descr(), None).ok()?;
            let physical = Arc::new(
                apply_file_schema_type_coercions(&self.file_schema, &file).unwrap_or(file),
            );
            let adapter = DefaultPhysicalExprAdapterFactory
                .create(Arc::clone(&self.file_schema), Arc::clone(&physical))
                .ok()?;
            let predicate = adapter.rewrite(Arc::clone(predicate)).ok()?;
            let predicate = PhysicalExprSimplifier::new(&physical)
                .simplify(predicate)
                .ok()?;
            let pruning = PruningPredicateBuilder::new()
                .with_file_schema(Arc::clone(&physical))
                .build(Arc::clone(&predicate))?;
            let pages = Arc::new(PagePruningAccessPlanFilter::new(
                &predicate,
                Arc::clone(&physical),
            ));
            Some((pruning, physical, pages))
        })();
        *last = Some((root, built.clone()));
        built
    }
}

/// The first `n` rows `selection` selects of a row group of `rows` rows (`None`: all rows).
fn first_rows(selection: Option<&RowSelection>, rows: usize, n: usize) -> RowSelection {
    let all = [RowSelector::select(rows)];
    let selectors: Vec<RowSelector> = match selection {
        Some(s) => s.iter().copied().collect(),
        None => all.to_vec(),
    };
    let mut left = n;
    let mut out = Vec::with_capacity(selectors.len() + 1);
    let mut covered = 0;
    for selector in selectors {
        if left == 0 {
            break;
        }
        let take = if selector.skip {
            selector.row_count
        } else {
            selector.row_count.min(left)
        };
        if !selector.skip {
            left -= take;
        }
        covered += take;
        out.push(RowSelector {
            row_count: take,
            skip: selector.skip,
        });
    }
    if covered < rows {
        out.push(RowSelector::skip(rows - covered));
    }
    RowSelection::from(out)
}

/// `ranges` (sorted by start) merged where the gap is at most `gap`, or the bytes between
/// them stay within 1 / [`WASTE_SHARE`] of the merged request.
fn merge_close(ranges: Vec<Range<u64>>, gap_bytes: u64) -> Vec<Range<u64>> {
    // Each merged range with the bytes of gaps it holds.
    let mut merged: Vec<(Range<u64>, u64)> = Vec::with_capacity(ranges.len());
    for range in ranges {
        if let Some((last, waste)) = merged.last_mut() {
            let gap = range.start.saturating_sub(last.end);
            let span = range.end.max(last.end) - last.start;
            if gap <= gap_bytes || (*waste + gap).saturating_mul(WASTE_SHARE) <= span {
                last.end = last.end.max(range.end);
                *waste += gap;
                continue;
            }
        }
        merged.push((range, 0));
    }
    merged.into_iter().map(|(r, _)| r).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pages_merge_only_where_little_is_wasted() {
        // Two pages 10 bytes apart in 400: merged. 300 apart: two requests.
        assert_eq!(merge_close(vec![0..200, 210..400], 0), vec![0..400]);
        assert_eq!(
            merge_close(vec![0..100, 400..500], 0),
            vec![0..100, 400..500]
        );
        // The waste of earlier merges counts: the third gap would take it past 1 in 20.
        assert_eq!(
            merge_close(vec![0..100, 105..200, 205..300, 320..340], 0),
            vec![0..300, 320..340]
        );
        // Gaps up to the floor always merge (whole chunks, as object_store would).
        assert_eq!(merge_close(vec![0..10, 1000..1010], 1 << 20), vec![0..1010]);
    }

    #[test]
    fn a_limit_selects_the_first_rows_of_a_selection() {
        let rows = |s: &RowSelection| -> Vec<(bool, usize)> {
            s.iter().map(|r| (r.skip, r.row_count)).collect()
        };
        // All 100 rows, first 10: select 10, skip 90.
        assert_eq!(
            rows(&first_rows(None, 100, 10)),
            vec![(false, 10), (true, 90)]
        );
        // Skip 20, select 50, skip 30; first 10 selected: skip 20, select 10, skip the rest.
        let s = RowSelection::from(vec![
            RowSelector::skip(20),
            RowSelector::select(50),
            RowSelector::skip(30),
        ]);
        assert_eq!(
            rows(&first_rows(Some(&s), 100, 10)),
            vec![(true, 20), (false, 10), (true, 70)]
        );
        assert_eq!(first_rows(Some(&s), 100, 10).row_count(), 10);
    }
}
