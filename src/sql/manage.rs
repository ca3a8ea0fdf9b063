//! The table functions that manage the caches from SQL, registered where the embedder asks
//! for them (`lakecache.sql.manage`, `LakeCacheBuilder::sql_manage(true)`; off by default,
//! as they act on caches every session shares). Each covers only what the calling session's
//! own stores have shown (a HEAD or a GET they answered):
//!
//! - `lakecache_warm('table' [, 'a, b'])` reads the table's columns (all, or those named)
//!   once through the caches, so that its footers and bytes are cached, within the caches'
//!   bounds, before users arrive; a row says what it read and from where;
//! - `lakecache_entries()` lists, per object version the session's stores have shown, the
//!   bytes each cache holds of it;
//! - `lakecache_invalidate('url')` drops what the caches hold of the versions the session's
//!   store has shown at that object (at every object below a URL ending in `/`), and that
//!   store's listings there, so the next query asks the store.
//!
//! ```sql
//! SELECT * FROM lakecache_warm('sales', 'region, amount');
//! SELECT object, memory_bytes, disk_bytes FROM lakecache_entries() ORDER BY object;
//! SELECT * FROM lakecache_invalidate('s3://bucket/sales/2026-12-03.parquet');
//! ```
//!
//! Each acts when the query runs, not when it is planned: `EXPLAIN` warms or drops nothing.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use arrow::array::{ArrayRef, BooleanArray, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use async_trait::async_trait;
use datafusion::catalog::streaming::StreamingTable;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::ScalarValue;
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionState;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::Expr;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties};
use datafusion::prelude::SessionContext;
use futures::StreamExt;
use object_store::path::Path;
use url::Url;

use crate::handle::Seen;
use crate::object::{ObjectVersion, StoreIdentity, StoreKey};
use crate::store::{Caches, StoreReads};

use crate::store::SessionStores;

/// Which of the management functions a [`ManageFunction`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Manage {
    /// `lakecache_warm('table' [, 'columns'])`.
    Warm,
    /// `lakecache_entries()`.
    Entries,
    /// `lakecache_invalidate('url')`.
    Invalidate,
}

impl Manage {
    /// Every management function.
    pub(crate) const ALL: [Manage; 3] = [Manage::Warm, Manage::Entries, Manage::Invalidate];

    /// The SQL name of the function.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Manage::Warm => "lakecache_warm",
            Manage::Entries => "lakecache_entries",
            Manage::Invalidate => "lakecache_invalidate",
        }
    }

    fn usage(self) -> &'static str {
        match self {
            Manage::Warm => "lakecache_warm('table') or lakecache_warm('table', 'column, ...')",
            Manage::Entries => "lakecache_entries() takes no argument",
            Manage::Invalidate => {
                "lakecache_invalidate('url of an object, or of a folder ending in /')"
            }
        }
    }
}

/// One management function over the caches of one session's stores.
#[derive(Debug)]
pub(crate) struct ManageFunction {
    which: Manage,
    caches: Caches,
    stores: SessionStores,
}

impl ManageFunction {
    /// The function `which` over `caches`, for the session whose stores are `stores`.
    pub(crate) fn new(which: Manage, caches: &Caches, stores: SessionStores) -> Self {
        Self {
            which,
            caches: caches.clone(),
            stores,
        }
    }
}

/// The string literals of a call's arguments, or an error saying how to call it.
fn strings(which: Manage, args: &[Expr]) -> Result<Vec<String>> {
    args.iter()
        .map(|arg| match arg {
            Expr::Literal(ScalarValue::Utf8(Some(s)), _) => Ok(s.clone()),
            _ => Err(DataFusionError::Plan(format!(
                "{}: expected {}",
                which.name(),
                which.usage()
            ))),
        })
        .collect()
}

impl TableFunctionImpl for ManageFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let strings = strings(self.which, args.exprs())?;
        let wrong = || DataFusionError::Plan(format!("expected {}", self.which.usage()));
        let action = match (self.which, strings.as_slice()) {
            (Manage::Warm, [table]) => Action::Warm(table.clone(), None),
            (Manage::Warm, [table, columns]) => {
                let columns: Vec<String> = columns
                    .split(',')
                    .map(|c| c.trim().to_string())
                    .filter(|c| !c.is_empty())
                    .collect();
                if columns.is_empty() {
                    return Err(wrong());
                }
                Action::Warm(table.clone(), Some(columns))
            }
            (Manage::Entries, []) => Action::Entries,
            (Manage::Invalidate, [url]) => {
                let parsed = Url::parse(url).map_err(|e| {
                    DataFusionError::Plan(format!(
                        "lakecache_invalidate: '{url}' is not a URL ({e}); expected {}",
                        self.which.usage()
                    ))
                })?;
                Action::Invalidate(parsed)
            }
            _ => return Err(wrong()),
        };
        Ok(Arc::new(ManageTable {
            action,
            caches: self.caches.clone(),
            stores: self.stores.clone(),
        }))
    }
}

/// What a call asked for.
#[derive(Debug, Clone)]
enum Action {
    Warm(String, Option<Vec<String>>),
    Entries,
    Invalidate(Url),
}

/// The table a call returns; it acts when its scan runs.
#[derive(Debug)]
struct ManageTable {
    action: Action,
    caches: Caches,
    stores: SessionStores,
}

impl ManageTable {
    fn schema_of(action: &Action) -> SchemaRef {
        let u64_field = |name: &str| Field::new(name, DataType::UInt64, false);
        let fields = match action {
            Action::Warm(..) => vec![
                Field::new("table", DataType::Utf8, false),
                u64_field("rows"),
                u64_field("elapsed_ms"),
                u64_field("bytes_from_store"),
                u64_field("bytes_prefetched"),
                u64_field("bytes_from_memory"),
                u64_field("bytes_from_disk"),
            ],
            Action::Entries => vec![
                Field::new("object", DataType::Utf8, false),
                Field::new("version", DataType::Utf8, false),
                u64_field("size"),
                u64_field("footer_bytes"),
                u64_field("bloom_filter_bytes"),
                u64_field("memory_bytes"),
                u64_field("disk_bytes"),
            ],
            Action::Invalidate(_) => vec![
                Field::new("object", DataType::Utf8, false),
                Field::new("version", DataType::Utf8, false),
                Field::new("had_bytes", DataType::Boolean, false),
            ],
        };
        Arc::new(Schema::new(fields))
    }
}

#[async_trait]
impl TableProvider for ManageTable {
    fn schema(&self) -> SchemaRef {
        Self::schema_of(&self.action)
    }

    fn table_type(&self) -> TableType {
        TableType::Temporary
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let schema = self.schema();
        let stream: Arc<dyn PartitionStream> = match &self.action {
            Action::Warm(table, columns) => {
                let plan = warm_plan(state, table, columns.as_deref()).await?;
                Arc::new(Run {
                    schema: Arc::clone(&schema),
                    job: Job::Warm(table.clone(), plan),
                })
            }
            Action::Entries | Action::Invalidate(_) => Arc::new(Run {
                schema: Arc::clone(&schema),
                job: Job::Caches(
                    self.action.clone(),
                    self.caches.clone(),
                    self.stores.clone(),
                ),
            }),
        };
        StreamingTable::try_new(schema, vec![stream])?
            .scan(state, projection, filters, limit)
            .await
    }
}

/// The plan that reads `columns` (every column if `None`) of `table` whole, as the session
/// would plan it: through its caches and prefetching.
async fn warm_plan(
    state: &dyn Session,
    table: &str,
    columns: Option<&[String]>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let state = state
        .as_any()
        .downcast_ref::<SessionState>()
        .ok_or_else(|| {
            DataFusionError::Plan("lakecache_warm needs a DataFusion SessionState".to_string())
        })?;
    let ctx = SessionContext::new_with_state(state.clone());
    let mut frame = ctx.table(table).await.map_err(|e| {
        DataFusionError::Plan(format!("lakecache_warm: no table '{table}' to warm ({e})"))
    })?;
    if let Some(columns) = columns {
        let names: Vec<&str> = columns.iter().map(String::as_str).collect();
        frame = frame.select_columns(&names).map_err(|e| {
            DataFusionError::Plan(format!(
                "lakecache_warm: table '{table}' has not every column of {names:?} ({e})"
            ))
        })?;
    }
    frame.create_physical_plan().await
}

/// What a [`Run`] does when executed.
#[derive(Debug)]
enum Job {
    Warm(String, Arc<dyn ExecutionPlan>),
    Caches(Action, Caches, SessionStores),
}

/// One partition that does its job when executed, and yields its one batch of rows.
#[derive(Debug)]
struct Run {
    schema: SchemaRef,
    job: Job,
}

impl PartitionStream for Run {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let schema = Arc::clone(&self.schema);
        let batch = match &self.job {
            Job::Warm(table, plan) => {
                let (table, plan) = (table.clone(), Arc::clone(plan));
                let schema = Arc::clone(&schema);
                futures::stream::once(async move { warm(&table, plan, ctx, schema).await }).boxed()
            }
            Job::Caches(action, caches, stores) => {
                let reads = stores.reads();
                let result = match action {
                    Action::Entries => entries(caches, &reads, Arc::clone(&schema)),
                    Action::Invalidate(url) => invalidate(caches, &reads, url, Arc::clone(&schema)),
                    Action::Warm(..) => Err(DataFusionError::Internal(
                        "lakecache_warm runs as a plan".to_string(),
                    )),
                };
                futures::stream::once(async move { result }).boxed()
            }
        };
        Box::pin(RecordBatchStreamAdapter::new(schema, batch))
    }
}

/// Runs `plan` to its end, keeping nothing of its rows, and says what it read from where.
async fn warm(
    table: &str,
    plan: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let started = Instant::now();
    let mut rows = 0u64;
    let partitions = plan.output_partitioning().partition_count();
    let mut streams = Vec::with_capacity(partitions);
    for partition in 0..partitions {
        streams.push(plan.execute(partition, Arc::clone(&ctx))?);
    }
    let mut all = futures::stream::select_all(streams);
    while let Some(batch) = all.next().await {
        rows += batch?.num_rows() as u64;
    }
    let mut figures = [0u64; 4];
    let names = [
        "bytes_from_store",
        "prefetch_bytes",
        "bytes_from_memory",
        "bytes_from_disk",
    ];
    sum_metrics(plan.as_ref(), &names, &mut figures);
    let elapsed = started.elapsed().as_millis() as u64;
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from(vec![table.to_string()])),
        Arc::new(UInt64Array::from(vec![rows])),
        Arc::new(UInt64Array::from(vec![elapsed])),
    ];
    for figure in figures {
        columns.push(Arc::new(UInt64Array::from(vec![figure])));
    }
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// Adds the values of the metrics `names` of `plan` and its children into `into`.
fn sum_metrics(plan: &dyn ExecutionPlan, names: &[&str], into: &mut [u64]) {
    if let Some(metrics) = plan.metrics() {
        for (name, total) in names.iter().zip(into.iter_mut()) {
            *total += metrics.sum_by_name(name).map_or(0, |v| v.as_usize() as u64);
        }
    }
    for child in plan.children() {
        sum_metrics(child.as_ref(), names, into);
    }
}

/// The versions the session's stores have proven, with the identity of each.
fn proven(caches: &Caches, reads: &[StoreReads]) -> Vec<(StoreIdentity, ObjectVersion)> {
    let identities: Vec<StoreIdentity> = reads.iter().map(|r| r.identity().clone()).collect();
    let mut proven = caches.handles.proven_by(&identities);
    // A version two of the session's stores proved is one entry.
    let mut seen = HashSet::new();
    proven.retain(|(_, v)| seen.insert(v.clone()));
    proven.sort_by_cached_key(|(_, v)| v.canonical());
    proven
}

/// The URL of an object.
fn url_of(version: &ObjectVersion) -> String {
    format!("{}/{}", version.store(), version.path())
}

/// One row of `lakecache_entries()`.
struct Entry {
    object: String,
    version: String,
    size: u64,
    footer: u64,
    blooms: u64,
    memory: u64,
    disk: u64,
}

/// `lakecache_entries()`: a row per version the session's stores have proven.
fn entries(caches: &Caches, reads: &[StoreReads], schema: SchemaRef) -> Result<RecordBatch> {
    let index = caches.index.bytes_by_version();
    let rows: Vec<Entry> = proven(caches, reads)
        .into_iter()
        .map(|(_, version)| {
            let (footer, blooms) = index.get(&version).copied().unwrap_or_default();
            let (memory, disk) = caches.ranges.bytes_of(&version);
            Entry {
                object: url_of(&version),
                version: version.validator().to_string(),
                size: version.size(),
                footer,
                blooms,
                memory,
                disk,
            }
        })
        .collect();
    let u64s = |f: fn(&Entry) -> u64| -> ArrayRef {
        Arc::new(UInt64Array::from_iter_values(rows.iter().map(f)))
    };
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.object.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.version.as_str()),
        )),
        u64s(|r| r.size),
        u64s(|r| r.footer),
        u64s(|r| r.blooms),
        u64s(|r| r.memory),
        u64s(|r| r.disk),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}

/// `lakecache_invalidate(url)`: drops the versions the session's store at `url` has proven
/// there, and its listings there.
fn invalidate(
    caches: &Caches,
    reads: &[StoreReads],
    url: &Url,
    schema: SchemaRef,
) -> Result<RecordBatch> {
    let store = StoreKey::of(url);
    let Some(reads) = reads.iter().find(|r| r.store_key() == &store) else {
        return Err(DataFusionError::Plan(format!(
            "lakecache_invalidate: this session has no store registered for {store}"
        )));
    };
    let path = Path::from_url_path(url.path())?;
    let folder = url.path().ends_with('/');
    let under = |version: &ObjectVersion| {
        version.store() == &store
            && match folder {
                true => version.path().prefix_match(&path).is_some(),
                false => version.path() == &path,
            }
    };
    let identity = reads.identity().clone();
    let dropped: Vec<ObjectVersion> = caches
        .handles
        .proven_by(std::slice::from_ref(&identity))
        .into_iter()
        .map(|(_, version)| version)
        .filter(|v| under(v))
        .collect();
    let mut rows = Vec::new();
    for version in &dropped {
        let (memory, disk) = caches.ranges.bytes_of(version);
        caches.forget_version(version);
        caches.handles.invalidate_seen(&Seen {
            identity: identity.clone(),
            id: version.id().clone(),
        });
        rows.push((
            url_of(version),
            version.validator().to_string(),
            memory + disk > 0,
        ));
    }
    caches
        .handles
        .invalidate_listings_under(Some(&identity), &store, &path);
    let columns: Vec<ArrayRef> = vec![
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.0.as_str()),
        )),
        Arc::new(StringArray::from_iter_values(
            rows.iter().map(|r| r.1.as_str()),
        )),
        Arc::new(BooleanArray::from(
            rows.iter().map(|r| r.2).collect::<Vec<_>>(),
        )),
    ];
    Ok(RecordBatch::try_new(schema, columns)?)
}
