//! [`IcebergScanExec`]: the node above an Iceberg table's Parquet scan. It marks for the
//! caches that the files below are named by manifests (immutable; path and size name the
//! bytes, so no HEAD is sent), shows the table and snapshot in `EXPLAIN`, and passes
//! everything else (batches, partitions, statistics, filters) through.

use std::fmt;
use std::sync::Arc;

use super::field_ids::FieldIdAdapterFactory;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Statistics, internal_err, plan_err};
use datafusion::datasource::physical_plan::{FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

/// The node above an Iceberg table's Parquet scan; see the module docs.
#[derive(Debug)]
pub struct IcebergScanExec {
    table: String,
    snapshot: i64,
    files: usize,
    input: Arc<dyn ExecutionPlan>,
}

impl IcebergScanExec {
    /// The scan `input` of `files` files of snapshot `snapshot` of `table`.
    pub(crate) fn new(
        table: String,
        snapshot: i64,
        files: usize,
        input: Arc<dyn ExecutionPlan>,
    ) -> Self {
        Self {
            table,
            snapshot,
            files,
            input,
        }
    }

    /// The table's URL.
    pub fn table(&self) -> &str {
        &self.table
    }

    /// The snapshot scanned.
    pub fn snapshot_id(&self) -> i64 {
        self.snapshot
    }

    /// This node without its input, as bytes: how it crosses to another process (a plan
    /// codec sends its input as DataFusion encodes a Parquet scan).
    pub fn encode(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 + self.table.len());
        buf.extend_from_slice(&self.snapshot.to_le_bytes());
        buf.extend_from_slice(&(self.files as u64).to_le_bytes());
        buf.extend_from_slice(self.table.as_bytes());
        buf
    }

    /// The node [`IcebergScanExec::encode`] gave `buf` for, over `input`, the Parquet scan it
    /// had, decoded. DataFusion's encoding of a scan does not carry its expression adapter,
    /// so the scan is given back the one that matches columns by field id.
    pub fn decode(buf: &[u8], input: Arc<dyn ExecutionPlan>) -> Result<Self> {
        let bad = || DataFusionError::Plan("not an encoded IcebergScanExec".to_string());
        let (snapshot, rest) = buf.split_first_chunk::<8>().ok_or_else(bad)?;
        let (files, table) = rest.split_first_chunk::<8>().ok_or_else(bad)?;
        let table = std::str::from_utf8(table).map_err(|_| bad())?;
        let Some((config, _)) = input
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        else {
            return plan_err!("IcebergScanExec of {table}: its input is not a Parquet scan");
        };
        let config = FileScanConfigBuilder::from(config.clone())
            .with_expr_adapter(Some(Arc::new(FieldIdAdapterFactory)))
            .build();
        Ok(Self::new(
            table.to_string(),
            i64::from_le_bytes(*snapshot),
            usize::try_from(u64::from_le_bytes(*files)).map_err(|_| bad())?,
            DataSourceExec::from_data_source(config),
        ))
    }
}

impl DisplayAs for IcebergScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "IcebergScanExec: table={}, snapshot={}, files={}",
            self.table, self.snapshot, self.files
        )
    }
}

impl ExecutionPlan for IcebergScanExec {
    fn name(&self) -> &str {
        "IcebergScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
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
        Ok(Arc::new(Self {
            table: self.table.clone(),
            snapshot: self.snapshot,
            files: self.files,
            input: children.remove(0),
        }))
    }

    fn repartitioned(
        &self,
        target_partitions: usize,
        config: &ConfigOptions,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        Ok(self
            .input
            .repartitioned(target_partitions, config)?
            .map(|input| {
                Arc::new(Self {
                    table: self.table.clone(),
                    snapshot: self.snapshot,
                    files: self.files,
                    input,
                }) as _
            }))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.input.execute(partition, context)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        match input_stats.first() {
            Some(stats) => Ok(Arc::clone(stats)),
            None => internal_err!("IcebergScanExec has one input"),
        }
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
