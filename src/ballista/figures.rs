//! The cluster's figures, read from the client in one query:
//!
//! ```sql
//! SELECT process, cache, metric, value FROM lakecache_cluster_metrics();
//! ```
//!
//! A row per (process, cache, metric), with `lakecache_metrics()`'s caches and metrics: the
//! scheduler's own (`process = 'scheduler'`, the listings and footers it read to plan), its
//! placement figures (`cache = 'placement'`: tasks on their preferred executor, tasks that
//! waited, tasks elsewhere, tasks that read no file), and each executor's lifetime figures
//! under its name.
//!
//! How they travel, through Ballista's own paths (it has no call of its own for a product's
//! figures):
//!
//! - The client's [`ClusterMetricsFunction`] (`LakeBallista::cluster_metrics`, registered
//!   with `register_udtf`) makes a [`ClusterMetricsTable`], which the logical codec carries
//!   to the scheduler as a tag alone.
//! - On the scheduler, its scan ([`ClusterMetricsExec`]) is planned with the scheduler's
//!   rows written into the plan, and one partition per executor the affinity policy counts
//!   alive. Without an [`AffinityPolicy`] reported to the scheduler's `LakeBallista`
//!   (`LakeBallista::report_placement`), no executor is asked: only the policy binds a
//!   partition to the executor it names.
//! - The policy binds each executor's partition to that executor, waiting for a free slot as
//!   long as it is alive (these tasks count in no placement figure). There the partition
//!   reads the executor's `LakeCache`. An executor gone in between answers nothing: another
//!   executor running its partition gives no rows, so no process is counted twice. An
//!   executor must know its name (`LakeBallista::executor` sets it): one that does not
//!   answers nothing.

use std::fmt;
use std::io::Cursor;
use std::sync::{Arc, Mutex, Weak};

use arrow::array::{ArrayRef, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{internal_datafusion_err, plan_datafusion_err, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    ArrowSource, FileGroup, FileScanConfig, FileScanConfigBuilder,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::TaskContext;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::logical_expr::Expr;
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::memory::MemoryStream;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PhysicalExpr, PlanProperties, SendableRecordBatchStream,
};

use super::AffinityPolicy;
use crate::lake::LakeCache;

/// The SQL name of the function.
pub const FUNCTION: &str = "lakecache_cluster_metrics";

/// What the scheduler's rows are named by.
const SCHEDULER: &str = "scheduler";

/// One process's figures, as its `LakeBallista` and codecs share them.
#[derive(Debug)]
pub(crate) struct ProcessFigures {
    lake: LakeCache,
    /// The executor this process is (`None`: a client or the scheduler, or an executor not
    /// told its name).
    name: Mutex<Option<String>>,
    /// The scheduler's placement, once reported.
    placement: Mutex<Weak<AffinityPolicy>>,
}

impl ProcessFigures {
    pub(crate) fn new(lake: LakeCache) -> Self {
        Self {
            lake,
            name: Mutex::default(),
            placement: Mutex::new(Weak::new()),
        }
    }

    pub(crate) fn set_name(&self, name: &str) {
        *lock(&self.name) = Some(name.to_string());
    }

    pub(crate) fn set_placement(&self, policy: &Arc<AffinityPolicy>) {
        *lock(&self.placement) = Arc::downgrade(policy);
    }

    fn name(&self) -> Option<String> {
        lock(&self.name).clone()
    }

    fn placement(&self) -> Option<Arc<AffinityPolicy>> {
        lock(&self.placement).upgrade()
    }

    /// This process's cache figures, as `process`'s rows.
    fn rows(&self, process: &str) -> Result<RecordBatch> {
        let rows: Vec<(&str, &str, u64)> = self.lake.stats().rows();
        batch(process, &rows)
    }

    /// The rows the scheduler writes into the plan: its caches' and its placement's.
    fn scheduler_rows(&self) -> Result<RecordBatch> {
        let mut rows = self.lake.stats().rows();
        if let Some(policy) = self.placement() {
            let p = policy.stats();
            rows.extend([
                ("placement", "preferred", p.preferred),
                ("placement", "waited", p.waited),
                ("placement", "elsewhere", p.elsewhere),
                ("placement", "not_scans", p.not_scans),
            ]);
        }
        batch(SCHEDULER, &rows)
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("process", DataType::Utf8, false),
        Field::new("cache", DataType::Utf8, false),
        Field::new("metric", DataType::Utf8, false),
        Field::new("value", DataType::UInt64, false),
    ]))
}

fn batch(process: &str, rows: &[(&str, &str, u64)]) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(rows.iter().map(|_| process))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.1))),
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(|r| r.2))),
    ];
    Ok(RecordBatch::try_new(schema(), columns)?)
}

/// `lakecache_cluster_metrics()`, for a client session; see the module docs.
#[derive(Debug)]
pub struct ClusterMetricsFunction {
    figures: Arc<ProcessFigures>,
}

impl ClusterMetricsFunction {
    pub(crate) fn new(figures: Arc<ProcessFigures>) -> Self {
        Self { figures }
    }
}

impl TableFunctionImpl for ClusterMetricsFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        if !args.exprs().is_empty() {
            return plan_err!("{FUNCTION}() takes no arguments");
        }
        Ok(Arc::new(ClusterMetricsTable::new(Arc::clone(
            &self.figures,
        ))))
    }
}

/// The table `lakecache_cluster_metrics()` returns; scanned on the scheduler.
#[derive(Debug)]
pub struct ClusterMetricsTable {
    figures: Arc<ProcessFigures>,
}

impl ClusterMetricsTable {
    pub(crate) fn new(figures: Arc<ProcessFigures>) -> Self {
        Self { figures }
    }
}

#[async_trait]
impl TableProvider for ClusterMetricsTable {
    fn schema(&self) -> SchemaRef {
        schema()
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        _state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let executors = self
            .figures
            .placement()
            .map(|policy| policy.executors_alive())
            .unwrap_or_default();
        let scan = Arc::new(ClusterMetricsExec::planned(
            self.figures.scheduler_rows()?,
            executors,
            Some(Arc::clone(&self.figures)),
        )?);
        match projection {
            None => Ok(scan),
            Some(columns) => {
                let schema = schema();
                let exprs = columns
                    .iter()
                    .map(|&i| {
                        let field = schema.field(i);
                        let column: Arc<dyn PhysicalExpr> = Arc::new(
                            datafusion::physical_expr::expressions::Column::new(field.name(), i),
                        );
                        (column, field.name().to_string())
                    })
                    .collect::<Vec<_>>();
                Ok(Arc::new(ProjectionExec::try_new(exprs, scan)?))
            }
        }
    }
}

/// The scan of `lakecache_cluster_metrics()`: the partition whose entry is 0 gives the
/// scheduler's rows, written into the plan; the one whose entry is `i` gives the rows of
/// executor `i - 1`, read where it runs. See the module docs.
///
/// A task's plan is restricted to its partitions, renumbered, and Ballista restricts only
/// the nodes it knows: so the entries ride as the files of a child scan that is never
/// executed (a `DataSourceExec`, which it restricts), one file per partition.
pub struct ClusterMetricsExec {
    scheduler: RecordBatch,
    executors: Vec<String>,
    /// One file per partition, named by its entry.
    entries: Arc<dyn ExecutionPlan>,
    /// The figures of the process the plan is in (`None`: decoded without them).
    here: Option<Arc<ProcessFigures>>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for ClusterMetricsExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterMetricsExec")
            .field("executors", &self.executors)
            .finish_non_exhaustive()
    }
}

impl ClusterMetricsExec {
    fn planned(
        scheduler: RecordBatch,
        executors: Vec<String>,
        here: Option<Arc<ProcessFigures>>,
    ) -> Result<Self> {
        let groups = (0..=executors.len())
            .map(|entry| {
                let file = PartitionedFile::new(entry.to_string(), 0);
                FileGroup::new(vec![file])
            })
            .collect();
        let entries = DataSourceExec::from_data_source(
            FileScanConfigBuilder::new(
                ObjectStoreUrl::parse("lakecache-figures://cluster")?,
                Arc::new(ArrowSource::new_stream_file_source(Arc::new(
                    Schema::empty(),
                ))),
            )
            .with_file_groups(groups)
            .build(),
        );
        Ok(Self::new(scheduler, executors, entries, here))
    }

    fn new(
        scheduler: RecordBatch,
        executors: Vec<String>,
        entries: Arc<dyn ExecutionPlan>,
        here: Option<Arc<ProcessFigures>>,
    ) -> Self {
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(schema()),
            Partitioning::UnknownPartitioning(entries.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            scheduler,
            executors,
            entries,
            here,
            properties,
        }
    }

    /// The entry of partition `p`: 0 for the scheduler, `i` for executor `i - 1`.
    fn entry(&self, p: usize) -> Result<usize> {
        let entry = self
            .entries
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            .and_then(|config| config.file_groups.get(p))
            .and_then(|group| group.iter().next())
            .and_then(|file| file.object_meta.location.as_ref().parse().ok());
        entry.ok_or_else(|| internal_datafusion_err!("{FUNCTION} has no partition {p}"))
    }

    /// The executor partition `p` must run on, if it is one's.
    pub(crate) fn executor_of(&self, p: usize) -> Option<&str> {
        let entry = self.entry(p).ok()?;
        entry
            .checked_sub(1)
            .and_then(|i| self.executors.get(i))
            .map(String::as_str)
    }

    /// This scan as the physical codec writes it (its child is encoded apart): the
    /// executors' names, then the scheduler's rows as an Arrow IPC stream.
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        let mut buf = Vec::new();
        put_len(&mut buf, self.executors.len())?;
        for name in &self.executors {
            put_len(&mut buf, name.len())?;
            buf.extend_from_slice(name.as_bytes());
        }
        let mut writer = StreamWriter::try_new(&mut buf, &self.scheduler.schema())?;
        writer.write(&self.scheduler)?;
        writer.finish()?;
        drop(writer);
        Ok(buf)
    }

    /// The scan `buf` encodes, over its decoded child, in a process whose figures are
    /// `here`.
    pub(crate) fn decode(
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        here: Option<Arc<ProcessFigures>>,
    ) -> Result<Self> {
        Self::decode_parts(buf, inputs, here)
            .map_err(|e| plan_datafusion_err!("{FUNCTION}: a plan the codec cannot read: {e}"))
    }

    fn decode_parts(
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        here: Option<Arc<ProcessFigures>>,
    ) -> Result<Self> {
        let [entries] = inputs else {
            return plan_err!("its scan has one child, not {}", inputs.len());
        };
        let mut rest = buf;
        let count = take_len(&mut rest)?;
        let mut executors = Vec::new();
        for _ in 0..count {
            let len = take_len(&mut rest)?;
            if rest.len() < len {
                return plan_err!("an executor's name is cut short");
            }
            let (name, tail) = rest.split_at(len);
            executors.push(String::from_utf8_lossy(name).into_owned());
            rest = tail;
        }
        let mut reader = StreamReader::try_new(Cursor::new(rest), None)?;
        let scheduler = match reader.next() {
            Some(batch) => batch?,
            None => return plan_err!("the scheduler's rows are missing"),
        };
        if scheduler.schema() != schema() {
            return plan_err!("the scheduler's rows have another schema");
        }
        Ok(Self::new(scheduler, executors, Arc::clone(entries), here))
    }

    /// The rows of partition `p`.
    fn rows(&self, p: usize) -> Result<RecordBatch> {
        if self.entry(p)? == 0 {
            return Ok(self.scheduler.clone());
        }
        let asked = self.executor_of(p).ok_or_else(|| {
            internal_datafusion_err!("{FUNCTION}: partition {p} names no executor")
        })?;
        let here = self.here.as_ref().ok_or_else(|| {
            internal_datafusion_err!(
                "{FUNCTION}: executor {asked} decoded the plan with a codec not made by its \
                 LakeBallista"
            )
        })?;
        match here.name() {
            Some(name) if name == asked => here.rows(asked),
            // Run elsewhere (the executor asked for left), or on an executor not told its
            // name, which cannot tell: no rows, rather than one executor's twice.
            _ => Ok(RecordBatch::new_empty(schema())),
        }
    }
}

fn put_len(buf: &mut Vec<u8>, len: usize) -> Result<()> {
    let len = u32::try_from(len).map_err(|_| internal_datafusion_err!("{FUNCTION}: too long"))?;
    buf.extend_from_slice(&len.to_le_bytes());
    Ok(())
}

fn take_len(rest: &mut &[u8]) -> Result<usize> {
    let Some((head, tail)) = rest.split_first_chunk::<4>() else {
        return plan_err!("the plan is cut short");
    };
    *rest = tail;
    Ok(u32::from_le_bytes(*head) as usize)
}

impl DisplayAs for ClusterMetricsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "ClusterMetricsExec: executors=[{}]",
            self.executors.join(", ")
        )
    }
}

impl ExecutionPlan for ClusterMetricsExec {
    fn name(&self) -> &str {
        "ClusterMetricsExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.entries]
    }

    // The entries are never read: their partitions stay as they are.
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [entries] = <[_; 1]>::try_from(children).map_err(|c| {
            internal_datafusion_err!("{FUNCTION}'s scan has one child, not {}", c.len())
        })?;
        Ok(Arc::new(Self::new(
            self.scheduler.clone(),
            self.executors.clone(),
            entries,
            self.here.clone(),
        )))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn execute(
        &self,
        partition: usize,
        _ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let rows = self.rows(partition)?;
        Ok(Box::pin(MemoryStream::try_new(vec![rows], schema(), None)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures(name: Option<&str>) -> Arc<ProcessFigures> {
        let figures = ProcessFigures::new(LakeCache::builder().build().unwrap());
        if let Some(name) = name {
            figures.set_name(name);
        }
        Arc::new(figures)
    }

    fn processes(batch: &RecordBatch) -> Vec<String> {
        let column = batch.column(0).as_any().downcast_ref::<StringArray>();
        let mut names: Vec<String> = column
            .unwrap()
            .iter()
            .map(|n| n.unwrap().to_string())
            .collect();
        names.dedup();
        names
    }

    #[test]
    fn a_scan_crosses_the_wire_and_each_executor_answers_only_its_own_partition() {
        let scheduler = figures(None);
        let executors = vec!["executor-0".to_string(), "executor-1".to_string()];
        let planned = ClusterMetricsExec::planned(
            scheduler.scheduler_rows().unwrap(),
            executors.clone(),
            Some(scheduler),
        )
        .unwrap();
        let wire = planned.encode().unwrap();
        let entries = [Arc::clone(&planned.entries)];
        let on_1 =
            ClusterMetricsExec::decode(&wire, &entries, Some(figures(Some("executor-1")))).unwrap();
        assert_eq!(on_1.executors, executors);
        assert_eq!(on_1.executor_of(0), None);
        assert_eq!(on_1.executor_of(2), Some("executor-1"));
        assert_eq!(processes(&on_1.rows(0).unwrap()), ["scheduler"]);
        assert_eq!(processes(&on_1.rows(2).unwrap()), ["executor-1"]);
        // Partition 1 is executor-0's: run on executor-1, it answers nothing.
        assert_eq!(on_1.rows(1).unwrap().num_rows(), 0);
        assert!(on_1.rows(3).is_err());
        // A task's plan restricted to partition 2 (renumbered 0) still answers as entry 2.
        let restricted = ballista_scheduler::state::task_builder::restrict_plan_to_partitions(
            Arc::new(on_1),
            &[2],
        )
        .unwrap();
        let restricted = restricted.downcast_ref::<ClusterMetricsExec>().unwrap();
        assert_eq!(processes(&restricted.rows(0).unwrap()), ["executor-1"]);
        // An executor not told its name cannot tell whether it was the one asked: nothing.
        let unnamed = ClusterMetricsExec::decode(&wire, &entries, Some(figures(None))).unwrap();
        assert_eq!(unnamed.rows(1).unwrap().num_rows(), 0);
        // A cut plan is refused, naming the function.
        let err = ClusterMetricsExec::decode(&wire[..wire.len() / 2], &entries, None).unwrap_err();
        assert!(err.to_string().contains(FUNCTION), "{err}");
    }
}
