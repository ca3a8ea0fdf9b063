//! Files a scan's predicate rules out by their statistics, dropped when the scan is planned.
//!
//! DataFusion 55 prunes a file by its statistics only as its opener reaches it: for each file
//! of the scan it creates the file's reader and metrics, builds a pruning predicate for that
//! file alone and evaluates it, then skips the file. A lookup of one file in 400 pays that
//! 400 times per query, which on a warm lake is most of the query's time (and more than the
//! reads it makes). The statistics the opener prunes by are in the plan already (the
//! `PartitionedFile::statistics` the listing table collected), so here the predicate is
//! evaluated once for all of a scan's files, with DataFusion's own `PruningPredicate`, and
//! the files it proves empty leave the plan. The opener's pruning still runs for the files
//! that stay (its dynamic filters may prune more as the query runs).
//!
//! Only what the opener would prune goes: the scan's own predicate (the one its opener
//! prunes with), files whose statistics show no row can match. A predicate on partition
//! columns is left to the listing table, which prunes partitions exactly; a file without
//! statistics stays. The number of file groups (the scan's partitions) does not change, and
//! the scan's statistics stay an upper bound (a scan with a predicate reports them inexact).
//!
//! A scan of fewer than [`MIN_FILES`] files is left to the opener: it builds and evaluates the
//! same predicate for each file anyway, and with few files building it once more here costs
//! more than it could save (the prefetcher keeps to the row groups the statistics keep either
//! way).

use std::sync::Arc;

use datafusion::common::pruning::PrunableStatistics;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfig, FileSource, ParquetSource};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_optimizer::pruning::PruningPredicateBuilder;

/// Scans of fewer files than this are not pruned at planning. With one or two files the
/// pruning here repeats the opener's, for nothing: the installed session planned TPC-H's 22
/// queries (tables of one or two files) 1.08x slower than vanilla DataFusion with it, 1.05x
/// without (`cargo bench --bench tpch -- --runs 41 --plans-only 1`). Where between two and
/// many files it starts to pay was not measured; eight is a judgment, low enough that a
/// table of a few dozen files keeps its pruning at planning.
const MIN_FILES: usize = 8;

/// The file groups of `config` without the files `source`'s predicate rules out by their
/// statistics, or `None` if none is ruled out (or nothing can be told).
pub(crate) fn without_pruned_files(
    config: &FileScanConfig,
    source: &ParquetSource,
) -> Option<Vec<FileGroup>> {
    let predicate = source.filter()?;
    if config.file_groups.iter().map(FileGroup::len).sum::<usize>() < MIN_FILES {
        return None;
    }
    let partition_cols = config.table_partition_cols();
    if collect_columns(&predicate)
        .iter()
        .any(|c| partition_cols.iter().any(|f| f.name() == c.name()))
    {
        return None;
    }
    let schema = Arc::clone(config.file_schema());
    let in_list = source.table_parquet_options().global.max_in_list_size;
    let pruning = PruningPredicateBuilder::new()
        .with_file_schema(Arc::clone(&schema))
        .with_max_in_list_size(in_list)
        .build(predicate)?;
    // One evaluation over every file with statistics: a container per file.
    let with_stats: Vec<_> = config
        .file_groups
        .iter()
        .flat_map(|g| g.iter())
        .filter(|f| f.has_statistics())
        .filter_map(|f| f.statistics.clone())
        .collect();
    if with_stats.is_empty() {
        return None;
    }
    let keep = pruning
        .prune(&PrunableStatistics::new(with_stats, schema))
        .ok()?;
    if keep.iter().all(|k| *k) {
        return None;
    }
    let mut keep = keep.into_iter();
    let groups = config
        .file_groups
        .iter()
        .map(|group| {
            let files = group
                .iter()
                .filter(|f| !f.has_statistics() || keep.next() != Some(false))
                .cloned()
                .collect();
            FileGroup::new(files)
        })
        .collect();
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::common::stats::Precision;
    use datafusion::common::{ColumnStatistics, ScalarValue, Statistics};
    use datafusion::datasource::listing::PartitionedFile;
    use datafusion::datasource::physical_plan::FileScanConfigBuilder;
    use datafusion::execution::object_store::ObjectStoreUrl;
    use datafusion::logical_expr::Operator;
    use datafusion::physical_expr::expressions::{binary, col, lit};

    /// A scan of `files` files, file `i` holding ids `i * 10 ..= i * 10 + 9`, in two groups,
    /// with the predicate `id < 10` (which only file 0 can match).
    fn scan(files: usize) -> (FileScanConfig, ParquetSource) {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, false)]));
        let predicate = binary(
            col("id", &schema).unwrap(),
            Operator::Lt,
            lit(10i64),
            &schema,
        )
        .unwrap();
        let source = ParquetSource::new(Arc::clone(&schema)).with_predicate(predicate);
        let file = |i: usize| {
            let bounds = ColumnStatistics::new_unknown()
                .with_min_value(Precision::Exact(ScalarValue::Int64(Some(i as i64 * 10))))
                .with_max_value(Precision::Exact(ScalarValue::Int64(Some(
                    i as i64 * 10 + 9,
                ))))
                .with_null_count(Precision::Exact(0));
            let mut statistics = Statistics::new_unknown(&schema);
            statistics.num_rows = Precision::Exact(10);
            statistics.column_statistics = vec![bounds];
            PartitionedFile::new(format!("lake/f{i}.parquet"), 100)
                .with_statistics(Arc::new(statistics))
        };
        let groups = vec![
            FileGroup::new((0..files).step_by(2).map(file).collect()),
            FileGroup::new((1..files).step_by(2).map(file).collect()),
        ];
        let config = FileScanConfigBuilder::new(
            ObjectStoreUrl::parse("s3://lake").unwrap(),
            Arc::new(source.clone()),
        )
        .with_file_groups(groups)
        .build();
        (config, source)
    }

    #[test]
    fn a_scan_of_many_files_drops_those_its_statistics_rule_out_keeping_its_groups() {
        let (config, source) = scan(MIN_FILES);
        let groups = without_pruned_files(&config, &source).expect("files ruled out");
        assert_eq!(groups.len(), 2, "as many groups as before");
        let left: Vec<String> = groups
            .iter()
            .flat_map(|g| g.iter())
            .map(|f| f.object_meta.location.to_string())
            .collect();
        assert_eq!(left, ["lake/f0.parquet"]);
    }

    #[test]
    fn a_scan_of_few_files_is_left_to_the_opener() {
        let (config, source) = scan(MIN_FILES - 1);
        assert!(without_pruned_files(&config, &source).is_none());
    }
}
