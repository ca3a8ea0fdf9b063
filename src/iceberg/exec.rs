//! [`IcebergScanExec`]: the node above an Iceberg table's Parquet scan. It marks for the
//! caches that the files below are named by manifests (immutable; path and size name the
//! bytes, so no HEAD is sent), shows the table and snapshot in `EXPLAIN`, and passes
//! everything else (batches, partitions, statistics, filters) through.

use std::fmt;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Statistics, internal_err};
use datafusion::error::Result;
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
