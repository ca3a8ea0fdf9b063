//! Delta Lake tables on a cluster (features `ballista` and `delta`).
//!
//! delta-rs plans a Delta scan as a `DeltaScanExec` over Parquet scans: its fields are
//! private and no codec carries it (delta-rs 1.1's `DeltaPhysicalCodec` encodes only the
//! retired `DeltaScan` exec). What does cross the wire is delta-rs's table provider, which it
//! serializes whole (the snapshot it read, its scan settings). So the scan crosses as a
//! question, not an answer:
//!
//! - The client's `DeltaScanNext` crosses to the scheduler as delta-rs serializes it
//!   ([`LakeLogicalCodec`](super::codec::LakeLogicalCodec)) and becomes a
//!   [`ClusterDeltaTable`] there. Its scan plans the query with delta-rs, reading the log
//!   through the scheduler's caches, and splits the files that plan reads into file groups.
//! - The plan holds a [`ClusterDeltaScanExec`]: the table, the scan's projection, filters and
//!   limit, and, as its one child, a scan of its file groups that is never executed. That
//!   child is a plain `DataSourceExec`, so Ballista restricts it to each task's partitions and
//!   the affinity policy places each task by its files, as for any Parquet scan.
//! - On an executor, partition `p` plans the same scan with delta-rs restricted to the files
//!   of its group `p` (`with_file_paths`), through the executor's caches, and runs it. delta-rs
//!   itself applies deletion vectors, column mapping and partition values, so a cluster reads
//!   a table as delta-rs reads it in one process.

use std::fmt;
use std::io::Cursor;
use std::sync::Arc;

use arrow::datatypes::{Schema, SchemaRef};
use arrow::ipc::reader::StreamReader;
use arrow::ipc::writer::StreamWriter;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::common::{Statistics, internal_datafusion_err, plan_err};
use datafusion::datasource::TableType;
use datafusion::datasource::listing::PartitionedFile;
use datafusion::datasource::physical_plan::{
    ArrowSource, FileGroup, FileScanConfig, FileScanConfigBuilder,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::{SessionStateBuilder, TaskContext};
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PhysicalExpr, PlanProperties, ReplaceChildrenOptions, SendableRecordBatchStream,
    StatisticsArgs, StatisticsContext,
};
use datafusion_proto::bytes::Serializeable;
use deltalake_core::delta_datafusion::DeltaScanNext;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};

use crate::table::ScanCaches;

/// A Delta table on the scheduler: delta-rs's provider, whose scans become
/// [`ClusterDeltaScanExec`]s; see the module docs.
#[derive(Debug)]
pub struct ClusterDeltaTable {
    table: DeltaScanNext,
    /// `table` as delta-rs serializes it (with the snapshot's files, for planning).
    encoded: Arc<str>,
    /// `table` without its snapshot's files ([`without_files`]): what each task carries.
    for_tasks: Arc<str>,
}

impl ClusterDeltaTable {
    /// The table delta-rs serialized as `encoded` (a `DeltaScanNext`).
    pub(crate) fn decode(encoded: &[u8]) -> Result<Self> {
        let encoded = std::str::from_utf8(encoded)
            .map_err(|e| DataFusionError::Plan(format!("a Delta table's encoding: {e}")))?;
        Ok(Self {
            table: decode_table(encoded)?,
            encoded: Arc::from(encoded),
            for_tasks: Arc::from(without_files(encoded)),
        })
    }

    /// delta-rs's encoding of `table`, if it is a Delta table (delta-rs's provider or one of
    /// these).
    pub(crate) fn encode(table: &dyn TableProvider) -> Option<Result<Vec<u8>>> {
        if let Some(cluster) = table.downcast_ref::<ClusterDeltaTable>() {
            return Some(Ok(cluster.encoded.as_bytes().to_vec()));
        }
        let delta = table.downcast_ref::<DeltaScanNext>()?;
        Some(
            serde_json::to_vec(delta)
                .map_err(|e| DataFusionError::Plan(format!("encoding a Delta table: {e}"))),
        )
    }
}

fn decode_table(encoded: &str) -> Result<DeltaScanNext> {
    serde_json::from_str(encoded)
        .map_err(|e| DataFusionError::Plan(format!("decoding a Delta table: {e}")))
}

/// `encoded` (delta-rs 1.1's serialization of a `DeltaScanNext`) with a lazy snapshot: the
/// table's version, protocol, metadata and log segment, without the files delta-rs read from
/// the log. An eager snapshot carries every file of the table with its statistics (as an
/// Arrow IPC file written out as a JSON array of numbers), so a task of a million-file table
/// would carry gigabytes; without them, a task carries kilobytes and its executor reads the
/// log segment it names (no LIST) through its own caches, once per file after the first task.
/// The rows are the same: the scan reads the same version's files either way.
///
/// A serialization of another shape is returned as it is (a slower task, never other rows).
fn without_files(encoded: &str) -> String {
    let Ok(mut table) = serde_json::from_str::<serde_json::Value>(encoded) else {
        return encoded.to_string();
    };
    let Some(snapshot) = table.get_mut("snapshot") else {
        return encoded.to_string();
    };
    // `{"EagerSnapshot": [snapshot]}` or `{"Snapshot": snapshot}`; a snapshot is a sequence
    // whose tenth element is its materialized files, or null.
    let lazy = match snapshot {
        serde_json::Value::Object(wrapper) => match wrapper.remove("EagerSnapshot") {
            Some(serde_json::Value::Array(mut eager)) if !eager.is_empty() => {
                Some(eager.swap_remove(0))
            }
            Some(_) => None,
            None => wrapper.remove("Snapshot"),
        },
        _ => None,
    };
    let Some(serde_json::Value::Array(mut fields)) = lazy else {
        return encoded.to_string();
    };
    if fields.len() != 10 {
        return encoded.to_string();
    }
    fields[9] = serde_json::Value::Null;
    *snapshot = serde_json::json!({ "Snapshot": fields });
    serde_json::to_string(&table).unwrap_or_else(|_| encoded.to_string())
}

#[async_trait]
impl TableProvider for ClusterDeltaTable {
    fn schema(&self) -> SchemaRef {
        self.table.schema()
    }

    fn table_type(&self) -> TableType {
        self.table.table_type()
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.table.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<Statistics> {
        self.table.statistics()
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.table.scan(state, projection, filters, limit).await?;
        let spec = ScanSpec {
            table: Arc::clone(&self.for_tasks),
            projection: projection.cloned(),
            filters: filters.to_vec(),
            limit,
            schema: plan.schema(),
            whole: false,
        };
        let statistics = StatisticsContext::new()
            .compute(plan.as_ref(), &StatisticsArgs::new())
            .ok();
        let files = files_read_by(&plan)?;
        let (spec, files) = match files {
            // Nothing read from files (a count from the log's statistics, an empty table):
            // one partition plans the whole scan.
            None => (
                ScanSpec {
                    whole: true,
                    ..spec
                },
                FilesOf::none(),
            ),
            Some(files) => (spec, files),
        };
        let groups = files.groups(state.config().target_partitions());
        let carrier = DataSourceExec::from_data_source(
            FileScanConfigBuilder::new(
                files.store.clone(),
                // A stream source is never cut into byte ranges by the planner.
                Arc::new(ArrowSource::new_stream_file_source(Arc::new(
                    Schema::empty(),
                ))),
            )
            .with_file_groups(groups)
            .build(),
        );
        Ok(Arc::new(ClusterDeltaScanExec::new(
            spec, carrier, None, statistics,
        )))
    }
}

/// The files a delta-rs plan reads, all in one store.
struct FilesOf {
    store: ObjectStoreUrl,
    files: Vec<PartitionedFile>,
}

impl FilesOf {
    fn none() -> Self {
        Self {
            store: ObjectStoreUrl::local_filesystem(),
            files: Vec::new(),
        }
    }

    /// At most `n` groups of about equal bytes: a file each while there are at most `n`.
    fn groups(&self, n: usize) -> Vec<FileGroup> {
        if self.files.is_empty() {
            return vec![FileGroup::new(Vec::new())];
        }
        crate::table::balanced(self.files.clone(), n)
    }
}

/// The whole files `plan`'s Parquet scans read, or `None` if it has no scan of files.
fn files_read_by(plan: &Arc<dyn ExecutionPlan>) -> Result<Option<FilesOf>> {
    let mut found: Option<FilesOf> = None;
    let mut seen = std::collections::HashSet::new();
    let mut other_store = None;
    plan.apply(|node| {
        if let Some(scan) = node.downcast_ref::<DataSourceExec>()
            && let Some(config) = scan.data_source().downcast_ref::<FileScanConfig>()
        {
            let of = found.get_or_insert_with(|| FilesOf {
                store: config.object_store_url.clone(),
                files: Vec::new(),
            });
            if of.store != config.object_store_url {
                other_store = Some(config.object_store_url.clone());
                return Ok(TreeNodeRecursion::Stop);
            }
            for file in config.file_groups.iter().flat_map(|g| g.iter()) {
                if seen.insert(file.object_meta.location.clone()) {
                    let mut whole = file.clone();
                    whole.range = None;
                    of.files.push(whole);
                }
            }
        }
        Ok(TreeNodeRecursion::Continue)
    })?;
    if let Some(other) = other_store {
        return plan_err!(
            "a Delta table whose files are in more than one store ({} and {other}) cannot run on a cluster",
            found.map(|f| f.store.to_string()).unwrap_or_default()
        );
    }
    Ok(found)
}

/// What an executor plans a part of a Delta scan from.
#[derive(Debug, Clone)]
struct ScanSpec {
    /// The table, as delta-rs serializes it.
    table: Arc<str>,
    projection: Option<Vec<usize>>,
    filters: Vec<Expr>,
    limit: Option<usize>,
    /// The scan's output schema, as delta-rs planned it on the scheduler.
    schema: SchemaRef,
    /// The scan reads no file: partition 0 plans it whole.
    whole: bool,
}

/// [`ScanSpec`] on the wire: the filters as datafusion-proto bytes, the schema as an Arrow
/// IPC stream with no batch.
#[derive(Serialize, Deserialize)]
struct WireSpec {
    table: String,
    projection: Option<Vec<usize>>,
    filters: Vec<Vec<u8>>,
    limit: Option<usize>,
    schema: Vec<u8>,
    whole: bool,
}

impl ScanSpec {
    fn encode(&self) -> Result<Vec<u8>> {
        let mut schema = Vec::new();
        StreamWriter::try_new(&mut schema, &self.schema)?.finish()?;
        let wire = WireSpec {
            table: self.table.to_string(),
            projection: self.projection.clone(),
            filters: self
                .filters
                .iter()
                .map(|f| Ok(f.to_bytes()?.to_vec()))
                .collect::<Result<_>>()?,
            limit: self.limit,
            schema,
            whole: self.whole,
        };
        serde_json::to_vec(&wire)
            .map_err(|e| internal_datafusion_err!("encoding a Delta scan: {e}"))
    }

    fn decode(buf: &[u8], ctx: &TaskContext) -> Result<Self> {
        let wire: WireSpec = serde_json::from_slice(buf)
            .map_err(|e| internal_datafusion_err!("decoding a Delta scan: {e}"))?;
        Ok(Self {
            table: Arc::from(wire.table),
            projection: wire.projection,
            filters: wire
                .filters
                .iter()
                .map(|f| Expr::from_bytes_with_ctx(f, ctx))
                .collect::<Result<_>>()?,
            limit: wire.limit,
            schema: StreamReader::try_new(Cursor::new(wire.schema), None)?.schema(),
            whole: wire.whole,
        })
    }
}

/// A Delta scan on a cluster: each partition plans and runs delta-rs's scan of the files of
/// the same partition of its child, which is never executed; see the module docs.
pub struct ClusterDeltaScanExec {
    spec: ScanSpec,
    /// The scan's file groups, as a scan Ballista can restrict to a task's partitions.
    files: Arc<dyn ExecutionPlan>,
    /// The executor's caches (set when an executor decodes the plan).
    scans: Option<ScanCaches>,
    /// delta-rs's statistics of the whole scan (on the scheduler, for planning).
    statistics: Option<Arc<Statistics>>,
    properties: Arc<PlanProperties>,
}

impl fmt::Debug for ClusterDeltaScanExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterDeltaScanExec")
            .field("projection", &self.spec.projection)
            .field("filters", &self.spec.filters)
            .field("limit", &self.spec.limit)
            .finish_non_exhaustive()
    }
}

impl ClusterDeltaScanExec {
    fn new(
        spec: ScanSpec,
        files: Arc<dyn ExecutionPlan>,
        scans: Option<ScanCaches>,
        statistics: Option<Arc<Statistics>>,
    ) -> Self {
        let partitions = files.output_partitioning().partition_count();
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&spec.schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Self {
            spec,
            files,
            scans,
            statistics,
            properties,
        }
    }

    /// This scan as the physical codec writes it (its child is encoded apart).
    pub(crate) fn encode(&self) -> Result<Vec<u8>> {
        self.spec.encode()
    }

    /// The scan `buf` encodes, over its decoded child `files`, reading through `scans`.
    pub(crate) fn decode(
        buf: &[u8],
        files: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        scans: &ScanCaches,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [files] = files else {
            return plan_err!("a Delta scan has one child, not {}", files.len());
        };
        let spec = ScanSpec::decode(buf, ctx)?;
        Ok(Arc::new(Self::new(
            spec,
            Arc::clone(files),
            Some(scans.clone()),
            None,
        )))
    }

    /// The URLs of the whole files of partition `p` (a file cut into byte ranges is read by
    /// the partition holding its first byte).
    fn files_of(&self, p: usize) -> Result<Vec<String>> {
        let config = self
            .files
            .downcast_ref::<DataSourceExec>()
            .and_then(|scan| scan.data_source().downcast_ref::<FileScanConfig>())
            .ok_or_else(|| internal_datafusion_err!("a Delta scan's child is not a file scan"))?;
        let group = config
            .file_groups
            .get(p)
            .ok_or_else(|| internal_datafusion_err!("a Delta scan has no partition {p}"))?;
        let mut urls = Vec::new();
        for file in group.iter() {
            if file.range.as_ref().is_some_and(|r| r.start > 0) {
                continue;
            }
            // The location is decoded (`Path::from_url_path`): its segments are encoded
            // again, as delta-rs's file URLs are (a `%` in a partition value becomes `%25`).
            let mut url = AsRef::<url::Url>::as_ref(&config.object_store_url).clone();
            url.path_segments_mut()
                .map_err(|()| {
                    internal_datafusion_err!("{} is not a base URL", config.object_store_url)
                })?
                .clear()
                .extend(file.object_meta.location.as_ref().split('/'));
            urls.push(url.to_string());
        }
        Ok(urls)
    }
}

impl DisplayAs for ClusterDeltaScanExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "ClusterDeltaScanExec")?;
        if let Some(limit) = self.spec.limit {
            write!(f, ": limit={limit}")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for ClusterDeltaScanExec {
    fn name(&self) -> &str {
        "ClusterDeltaScanExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.files]
    }

    // Each group's files are planned whole (the child is a stream source, which the
    // planner does not cut into byte ranges either).
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![false]
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [files] = <[_; 1]>::try_from(children)
            .map_err(|c| internal_datafusion_err!("a Delta scan has one child, not {}", c.len()))?;
        Ok(Arc::new(Self::new(
            self.spec.clone(),
            files,
            self.scans.clone(),
            self.statistics.clone(),
        )))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        match (args.partition(), &self.statistics) {
            (None, Some(statistics)) => Ok(Arc::clone(statistics)),
            _ => Ok(Arc::new(Statistics::new_unknown(&self.spec.schema))),
        }
    }

    fn execute(
        &self,
        partition: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let urls = self.files_of(partition)?;
        let spec = self.spec.clone();
        let scans = self.scans.clone();
        let schema = Arc::clone(&spec.schema);
        let planned = async move {
            if urls.is_empty() && !(spec.whole && partition == 0) {
                let empty = futures::stream::empty().boxed();
                return Ok(Box::pin(RecordBatchStreamAdapter::new(spec.schema, empty))
                    as SendableRecordBatchStream);
            }
            // One partition, as the task has one slot: its files are read one after the
            // other, the prefetcher keeping downloads in flight.
            let state = SessionStateBuilder::new()
                .with_default_features()
                .with_config(ctx.session_config().clone().with_target_partitions(1))
                .with_runtime_env(ctx.runtime_env())
                .build();
            let mut table = decode_table(&spec.table)?;
            if !spec.whole {
                table = table.with_file_paths(urls);
            }
            let mut plan = table
                .scan(&state, spec.projection.as_ref(), &spec.filters, spec.limit)
                .await?;
            if let Some(scans) = &scans {
                plan = scans.rewrite(
                    plan,
                    ctx.session_config().options(),
                    &ctx.runtime_env(),
                    true,
                )?;
            }
            if plan.schema().fields() != spec.schema.fields() {
                return plan_err!(
                    "a Delta scan planned on an executor returns {:?}, not the scheduler's {:?}",
                    plan.schema(),
                    spec.schema
                );
            }
            if plan.output_partitioning().partition_count() > 1 {
                plan = Arc::new(CoalescePartitionsExec::new(plan));
            }
            plan.execute(0, ctx)
        };
        let stream = futures::stream::once(planned).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::datatypes::{DataType, Field};
    use datafusion::logical_expr::{col, lit};

    #[test]
    fn a_scan_spec_crosses_the_wire_whole() {
        let spec = ScanSpec {
            table: Arc::from("{\"any\": \"json\"}"),
            projection: Some(vec![2, 0]),
            filters: vec![col("id").gt(lit(5_i64)), col("name").is_null()],
            limit: Some(10),
            schema: Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int64, false),
                Field::new("name", DataType::Utf8, true),
            ])),
            whole: true,
        };
        let ctx = TaskContext::default();
        let back = ScanSpec::decode(&spec.encode().unwrap(), &ctx).unwrap();
        assert_eq!(back.table, spec.table);
        assert_eq!(back.projection, spec.projection);
        assert_eq!(back.filters, spec.filters);
        assert_eq!(back.limit, spec.limit);
        assert_eq!(back.schema, spec.schema);
        assert!(back.whole);
        assert!(ScanSpec::decode(b"{\"table\": 1}", &ctx).is_err());
    }

    /// A Delta table of `commits` commits of a file each in `dir`, and delta-rs's provider
    /// of it as the client serializes it.
    async fn delta_table(dir: &std::path::Path, commits: usize) -> String {
        use crate::testkit::{delta::delta_batch, lake::LakeSpec};
        use deltalake_core::DeltaTableBuilder;
        use deltalake_core::protocol::SaveMode;
        let url = url::Url::from_directory_path(dir).unwrap();
        let spec = LakeSpec::small_files(commits);
        let mut table = DeltaTableBuilder::from_url(url).unwrap().build().unwrap();
        for i in 0..commits {
            table = table
                .write(vec![delta_batch(&spec, i)])
                .with_save_mode(SaveMode::Append)
                .await
                .unwrap();
        }
        let provider = table.table_provider().await.unwrap();
        let encoded = ClusterDeltaTable::encode(provider.as_ref())
            .unwrap()
            .unwrap();
        String::from_utf8(encoded).unwrap()
    }

    async fn rows_of(table: DeltaScanNext) -> String {
        let ctx = datafusion::prelude::SessionContext::new();
        ctx.register_table("t", Arc::new(table)).unwrap();
        let batches = ctx
            .sql("SELECT * FROM t ORDER BY id")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        arrow::util::pretty::pretty_format_batches(&batches)
            .unwrap()
            .to_string()
    }

    #[tokio::test]
    async fn a_task_carries_the_table_without_its_files_and_reads_the_same_rows() {
        let (small, large) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (small, large) = (
            delta_table(small.path(), 2).await,
            delta_table(large.path(), 12).await,
        );
        let (lean_small, lean_large) = (without_files(&small), without_files(&large));
        // The lean form names the log segment (a file per commit) and no data file.
        let value: serde_json::Value = serde_json::from_str(&lean_large).unwrap();
        assert!(value["snapshot"]["Snapshot"][9].is_null(), "{value}");
        let per_commit = |a: &str, b: &str| (b.len() - a.len()) / 10;
        let (eager, lean) = (
            per_commit(&small, &large),
            per_commit(&lean_small, &lean_large),
        );
        assert!(
            lean * 4 < eager,
            "a task's table grows by {lean} bytes per file, the whole table's by {eager}"
        );
        assert_eq!(
            rows_of(decode_table(&lean_large).unwrap()).await,
            rows_of(decode_table(&large).unwrap()).await
        );
        // Of another shape: carried as it is.
        assert_eq!(without_files("{\"snapshot\": 1}"), "{\"snapshot\": 1}");
        assert_eq!(without_files("not json"), "not json");
    }
}
