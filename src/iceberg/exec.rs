//! [`IcebergScanExec`]: the node above an Iceberg table's Parquet scan. It marks for the
//! caches that the files below are named by manifests (immutable; path and size name the
//! bytes, so no HEAD is sent), shows the table and snapshot in `EXPLAIN`, drops the rows
//! equality deletes delete (with the columns read for them only), and passes everything else
//! (partitions, statistics, filters) through.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use parquet::arrow::arrow_reader::{RowSelection, RowSelector};

use super::equality::EqualityFilter;
use super::field_ids::FieldIdAdapterFactory;
use super::wire::{Decoder, Encoder, bad};
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{ScalarValue, Statistics, internal_err, plan_err};
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::parquet::ParquetRowSelection;
use datafusion::datasource::physical_plan::{FileGroup, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::Partitioning;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::StreamExt;

/// The node above an Iceberg table's Parquet scan; see the module docs.
#[derive(Debug)]
pub struct IcebergScanExec {
    table: String,
    snapshot: i64,
    files: usize,
    input: Arc<dyn ExecutionPlan>,
    equality: Option<Arc<EqualityFilter>>,
    properties: Arc<PlanProperties>,
}

impl IcebergScanExec {
    /// The scan `input` of `files` files of snapshot `snapshot` of `table`, whose rows
    /// `equality` filters when its files have equality deletes.
    pub(crate) fn new(
        table: String,
        snapshot: i64,
        files: usize,
        input: Arc<dyn ExecutionPlan>,
        equality: Option<Arc<EqualityFilter>>,
    ) -> Self {
        let properties = match &equality {
            None => Arc::clone(input.properties()),
            // Fewer columns and fewer rows than the scan: no ordering or partitioning by its
            // columns is promised.
            Some(filter) => {
                let schema = input.schema();
                let kept: Vec<_> = schema
                    .fields()
                    .iter()
                    .take(filter.width())
                    .cloned()
                    .collect();
                let schema = Arc::new(arrow::datatypes::Schema::new_with_metadata(
                    kept,
                    schema.metadata().clone(),
                ));
                let partitions = input.properties().output_partitioning().partition_count();
                Arc::new(PlanProperties::new(
                    EquivalenceProperties::new(schema),
                    Partitioning::UnknownPartitioning(partitions),
                    EmissionType::Incremental,
                    Boundedness::Bounded,
                ))
            }
        };
        Self {
            table,
            snapshot,
            files,
            input,
            equality,
            properties,
        }
    }

    /// This node over another input (the same scan, regrouped or decoded).
    fn with_input(&self, input: Arc<dyn ExecutionPlan>) -> Self {
        Self::new(
            self.table.clone(),
            self.snapshot,
            self.files,
            input,
            self.equality.clone(),
        )
    }

    /// The table's URL.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The snapshot scanned.
    pub fn snapshot_id(&self) -> i64 {
        self.snapshot
    }

    /// This node as bytes: how it crosses to another process, where a plan codec sends its
    /// input as DataFusion encodes a Parquet scan. That encoding carries neither the scan's
    /// expression adapter nor its files' row selections (the rows position deletes leave),
    /// so the selections travel here, by file, and so does the equality deletes' filter.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Encoder::default();
        out.u64(self.snapshot as u64);
        out.u64(self.files as u64);
        out.text(&self.table);
        let selected: Vec<(String, &RowSelection)> = scan_files(&self.input)
            .filter_map(|f| {
                let selection = f.extension::<ParquetRowSelection>()?;
                Some((f.object_meta.location.to_string(), selection.selection()))
            })
            .collect();
        out.usize(selected.len());
        for (path, selection) in selected {
            out.text(&path);
            let selectors: Vec<RowSelector> = selection.iter().copied().collect();
            out.usize(selectors.len());
            for s in selectors {
                out.usize(s.row_count);
                out.byte(u8::from(s.skip));
            }
        }
        match &self.equality {
            None => out.byte(0),
            Some(filter) => {
                // Only the keys of the delete files the encoded files have.
                let used: HashSet<u32> = scan_files(&self.input)
                    .filter_map(|f| match f.partition_values.last() {
                        Some(ScalarValue::UInt32(Some(group))) => Some(*group),
                        _ => None,
                    })
                    .collect();
                out.byte(1);
                filter.restricted_to(&used).encode(&mut out);
            }
        }
        out.0
    }

    /// The node [`IcebergScanExec::encode`] gave `buf` for, over `input`, the Parquet scan it
    /// had, decoded: the scan is given back the adapter that matches columns by field id and
    /// its files' row selections.
    pub fn decode(buf: &[u8], input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let mut d = Decoder(buf);
        let snapshot = d.u64()? as i64;
        let files = d.usize()?;
        let table = d.text()?;
        let mut selections = HashMap::new();
        // A path is at least its length; a selector its count and its kind.
        for _ in 0..d.count(8)? {
            let path = d.text()?;
            let mut selectors = Vec::new();
            for _ in 0..d.count(9)? {
                let count = d.usize()?;
                selectors.push(match d.byte()? {
                    0 => RowSelector::select(count),
                    _ => RowSelector::skip(count),
                });
            }
            selections.insert(path, RowSelection::from(selectors));
        }
        let equality = match d.byte()? {
            0 => None,
            _ => {
                let filter = EqualityFilter::decode(&mut d)?;
                if !filter.fits(input.schema().fields().len()) {
                    return Err(bad());
                }
                Some(Arc::new(filter))
            }
        };
        if !d.is_done() {
            return Err(bad());
        }
        let Some((config, _)) = input
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        else {
            return plan_err!("IcebergScanExec of {table}: its input is not a Parquet scan");
        };
        let groups = config
            .file_groups
            .iter()
            .map(|group| {
                FileGroup::new(
                    group
                        .iter()
                        .map(|f| match selections.get(f.object_meta.location.as_ref()) {
                            Some(s) => f
                                .clone()
                                .with_extension(ParquetRowSelection::new(s.clone())),
                            None => f.clone(),
                        })
                        .collect(),
                )
            })
            .collect();
        let config = FileScanConfigBuilder::from(config.clone())
            .with_file_groups(groups)
            .with_expr_adapter(Some(Arc::new(FieldIdAdapterFactory)))
            .build();
        Ok(Self::new(
            table,
            snapshot,
            files,
            DataSourceExec::from_data_source(config),
            equality,
        ))
    }
}

/// The files of the Parquet scan `plan` is.
fn scan_files(plan: &Arc<dyn ExecutionPlan>) -> impl Iterator<Item = &PartitionedFile> {
    plan.downcast_ref::<DataSourceExec>()
        .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        .into_iter()
        .flat_map(|(config, _)| config.file_groups.iter().flat_map(|g| g.iter()))
}

impl DisplayAs for IcebergScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergScanExec: table={}, snapshot={}, files={}",
            self.table, self.snapshot, self.files
        )?;
        match &self.equality {
            Some(filter) => write!(f, ", equality_delete_files={}", filter.delete_files()),
            None => Ok(()),
        }
    }
}

impl ExecutionPlan for IcebergScanExec {
    fn name(&self) -> &str {
        "IcebergScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn with_new_children(
        self: Arc<Self>,
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.len() != 1 {
            return internal_err!("IcebergScanExec has one input, given {}", children.len());
        }
        Ok(Arc::new(self.with_input(children.remove(0))))
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        config: &ConfigOptions,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(self
            .input
            .repartitioned(target_partitions, config)?
            .map(|input| Arc::new(self.with_input(input)) as _))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let stream = self.input.execute(partition, context)?;
        let Some(filter) = &self.equality else {
            return Ok(stream);
        };
        let filter = Arc::clone(filter);
        let filtered = stream.map(move |batch| filter.apply(batch?));
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            self.schema(),
            filtered,
        )))
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let Some(stats) = input_stats.first() else {
            return internal_err!("IcebergScanExec has one input");
        };
        let Some(filter) = &self.equality else {
            return Ok(Arc::clone(stats));
        };
        // Deleted rows are counted below: at most what the scan reads.
        let mut stats = stats.as_ref().clone().to_inexact();
        stats.column_statistics.truncate(filter.width());
        Ok(Arc::new(stats))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        Ok(FilterPushdownPropagation::if_all(child_pushdown_result))
    }
}

/// Whether `plan` is an Iceberg table's scan (the hook the caches' planner is given).
pub(crate) fn is_iceberg_scan(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<IcebergScanExec>().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::table_schema::TableSchema;
    use datafusion::execution::object_store::ObjectStoreUrl;

    fn scan(files: Vec<PartitionedFile>) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("id", DataType::Int64, true)]));
        let source = ParquetSource::new(TableSchema::from(schema));
        let url = ObjectStoreUrl::parse("s3://bucket").unwrap();
        let config = FileScanConfigBuilder::new(url, Arc::new(source))
            .with_file_groups(vec![FileGroup::new(files)])
            .build();
        DataSourceExec::from_data_source(config)
    }

    #[test]
    fn the_rows_deletes_leave_cross_the_wire_with_the_node() {
        let selection = RowSelection::from(vec![
            RowSelector::select(3),
            RowSelector::skip(2),
            RowSelector::select(5),
        ]);
        let deleted = PartitionedFile::new("t/data/a.parquet", 100)
            .with_extension(ParquetRowSelection::new(selection.clone()));
        let whole = PartitionedFile::new("t/data/b.parquet", 100);
        let node = IcebergScanExec::new(
            "s3://bucket/t".into(),
            7,
            2,
            scan(vec![deleted, whole]),
            None,
        );
        let bytes = node.encode();

        // What DataFusion's encoding gives the other side: the files without extensions.
        let plain = vec![
            PartitionedFile::new("t/data/a.parquet", 100),
            PartitionedFile::new("t/data/b.parquet", 100),
        ];
        let decoded = IcebergScanExec::decode(&bytes, scan(plain)).unwrap();
        assert_eq!(
            (decoded.table(), decoded.snapshot_id()),
            ("s3://bucket/t", 7)
        );
        let files: Vec<_> = scan_files(&decoded.input).collect();
        let got = files[0]
            .extension::<ParquetRowSelection>()
            .map(|s| s.selection());
        assert_eq!(got, Some(&selection));
        assert!(files[1].extension::<ParquetRowSelection>().is_none());
        let (config, _) = decoded
            .input
            .downcast_ref::<DataSourceExec>()
            .and_then(|e| e.downcast_to_file_source::<ParquetSource>())
            .unwrap();
        assert!(config.expr_adapter_factory.is_some());
        assert!(IcebergScanExec::decode(&bytes[..bytes.len() - 1], scan(vec![])).is_err());
    }
}
