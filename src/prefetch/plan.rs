//! What a scan will read, worked out from its final physical plan: the files in the order its
//! partitions take them, the columns it projects, and for a large file the byte ranges of the
//! column chunks DataFusion will ask for once its own row-group pruning has run.
//!
//! The plan only predicts; DataFusion still decides. A wrong guess costs wasted bytes (which
//! the figures report), never wrong rows: a read that no prefetch covers goes to the store.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::config::ConfigOptions;
use datafusion::datasource::listing::{FileRange, PartitionedFile};
use datafusion::datasource::physical_plan::parquet::{
    ParquetAccessPlan, ParquetFileMetrics, RowGroupAccessPlanFilter,
};
use datafusion::datasource::physical_plan::{FileScanConfig, FileSource, ParquetSource};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr_adapter::{
    DefaultPhysicalExprAdapterFactory, PhysicalExprAdapterFactory,
};
use datafusion::physical_optimizer::pruning::{PruningPredicate, PruningPredicateBuilder};
use datafusion::physical_plan::PhysicalExpr;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use object_store::{OBJECT_STORE_COALESCE_DEFAULT, ObjectMeta};
use parquet::arrow::parquet_to_arrow_schema;
use parquet::file::metadata::ParquetMetaData;

use crate::index::footer::chunk_range;

/// One file of a scan, as a partition will open it (a large file may be split by byte range
/// across partitions and so appear more than once).
#[derive(Debug, Clone)]
pub(crate) struct ScanFile {
    pub meta: ObjectMeta,
    pub range: Option<FileRange>,
}

/// Chunks of one row group this close together are fetched as one request, as object_store
/// coalesces the ranges DataFusion asks for in one call: a prefetch then costs the requests
/// and bytes the reader's own reads would have, only earlier. Row groups are never merged,
/// so bytes of a pruned row group are never fetched.
const GAP: u64 = OBJECT_STORE_COALESCE_DEFAULT;

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
    /// DataFusion's row-group pruning wants a metrics sink; these figures are not shown.
    metrics: ParquetFileMetrics,
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
            metrics: ParquetFileMetrics::new(0, "prefetch plan", &ExecutionPlanMetricsSet::new()),
        }
    }

    /// The ranges of `file` DataFusion is expected to read, in file order, each at most
    /// `split` bytes long.
    ///
    /// Applies the file's byte range, the projection and DataFusion's own row-group pruning
    /// by statistics. Chunks of a row group closer than [`GAP`] are merged, and ranges longer
    /// than `split` cut into requests that run side by side.
    pub fn pieces(
        &self,
        file: &ScanFile,
        metadata: &ParquetMetaData,
        split: u64,
    ) -> Vec<Range<u64>> {
        let row_groups = metadata.row_groups();
        let mut access =
            RowGroupAccessPlanFilter::new(ParquetAccessPlan::new_all(row_groups.len()));
        if let Some(range) = &file.range {
            access.prune_by_range(row_groups, range);
        }
        let schema = metadata.file_metadata().schema_descr();
        if let Some((predicate, arrow)) = self.pruning_predicate(metadata) {
            access.prune_by_statistics(&arrow, schema, row_groups, &predicate, &self.metrics);
        }
        let wanted: Vec<bool> = (0..schema.num_columns())
            .map(|leaf| {
                let root = schema.get_column_root(leaf).name();
                self.columns.as_ref().is_none_or(|c| c.contains(root))
            })
            .collect();
        let mut merged: Vec<Range<u64>> = Vec::new();
        for rg in access.row_group_indexes() {
            let mut chunks: Vec<Range<u64>> = row_groups[rg]
                .columns()
                .iter()
                .enumerate()
                .filter(|(leaf, _)| wanted.get(*leaf).copied().unwrap_or(true))
                // Checked, not `byte_range()`, which asserts on a footer's negative offsets.
                .filter_map(|(_, chunk)| chunk_range(chunk))
                .collect();
            chunks.sort_by_key(|r| r.start);
            let first = merged.len();
            for range in chunks {
                match merged[first..].last_mut() {
                    Some(last) if range.start <= last.end.saturating_add(GAP) => {
                        last.end = last.end.max(range.end)
                    }
                    _ => merged.push(range),
                }
            }
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

    /// The scan's predicate as DataFusion prunes row groups of this file with it, or `None`
    /// if there is none or it cannot be applied here (then no row group is ruled out).
    fn pruning_predicate(
        &self,
        metadata: &ParquetMetaData,
    ) -> Option<(Arc<PruningPredicate>, SchemaRef)> {
        let predicate = self.predicate.as_ref()?;
        let physical = parquet_to_arrow_schema(metadata.file_metadata().schema_descr(), None)
            .ok()
            .map(Arc::new)?;
        let adapter = DefaultPhysicalExprAdapterFactory
            .create(Arc::clone(&self.file_schema), Arc::clone(&physical))
            .ok()?;
        let predicate = adapter.rewrite(Arc::clone(predicate)).ok()?;
        let pruning = PruningPredicateBuilder::new()
            .with_file_schema(Arc::clone(&physical))
            .build(predicate)?;
        Some((pruning, physical))
    }
}
