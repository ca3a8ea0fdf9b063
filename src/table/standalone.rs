//! [`StandaloneTable`]: a table that plans and runs its scans in a runtime of its own, for
//! hosts whose sessions cannot reach the caches' stores.
//!
//! A table handed across `datafusion-ffi` (to datafusion-python, say) is scanned with the
//! host's session rebuilt on the library's side: DataFusion's default runtime, with no
//! `s3://` store, no memory limit and none of the `lakecache.*` settings, and its plan is
//! executed with a task context over that default runtime too. So the table carries an
//! installed session of its own ([`LakeCache::install`](crate::LakeCache::install), over a
//! runtime whose registry holds the table's store): its scan plans with that session (taking
//! the host's `datafusion.*` settings), gives every Parquet scan the caches' reader and a
//! prefetcher reserving in that runtime's memory pool, and runs the plan with that runtime
//! whatever task context it is handed. With a tokio handle, planning runs on that runtime:
//! the library's object stores need its reactor, which a host polling the scan does not
//! provide.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DFSchema, Statistics, internal_datafusion_err};
use datafusion::datasource::TableType;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::{SessionState, SessionStateBuilder, TaskContext};
use datafusion::logical_expr::expr_rewriter::unnormalize_col;
use datafusion::logical_expr::utils::conjunction;
use datafusion::logical_expr::{Expr, TableProviderFilterPushDown};
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PhysicalExpr, PlanProperties,
    SendableRecordBatchStream,
};
use datafusion::prelude::SessionConfig;

use super::ScanCaches;

/// A table whose scans plan and run in a session of its own; see the module docs.
///
/// ```
/// # async fn run() -> datafusion::error::Result<()> {
/// use std::sync::Arc;
/// use datafusion::execution::SessionStateBuilder;
/// use datafusion::prelude::SessionContext;
/// use datafusion_lakecache::{LakeCache, LakeTable, StandaloneTable};
///
/// let lake = LakeCache::builder().build()?;
/// // The table's own session: the caches installed over a runtime that has its store.
/// let own = lake.install(SessionStateBuilder::new().with_default_features())?.build();
/// let dir = tempfile::tempdir()?;
/// # datafusion_lakecache::testkit::lake::write_lake(
/// #     &object_store::local::LocalFileSystem::new(),
/// #     &object_store::path::Path::from_absolute_path(dir.path())?,
/// #     &datafusion_lakecache::testkit::lake::LakeSpec::small_files(2),
/// # ).await?;
/// let url = format!("{}/", dir.path().display());
/// let table = LakeTable::try_new(&own, &url, &lake).await?;
/// let table = StandaloneTable::new(Arc::new(table), own, &lake);
/// // A host session with nothing of the caches.
/// let host = SessionContext::new();
/// host.register_table("t", Arc::new(table))?;
/// host.sql("SELECT count(*) FROM t").await?.show().await?;
/// # Ok(())
/// # }
/// ```
pub struct StandaloneTable {
    table: Arc<dyn TableProvider>,
    state: SessionState,
    scans: ScanCaches,
    tokio: Option<tokio::runtime::Handle>,
}

impl fmt::Debug for StandaloneTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandaloneTable")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

impl StandaloneTable {
    /// `table`, scanned with `state` (a session installed with `lake`, whose runtime has the
    /// table's store) whatever session a host scans it with.
    pub fn new(
        table: Arc<dyn TableProvider>,
        state: SessionState,
        lake: &impl AsRef<ScanCaches>,
    ) -> Self {
        Self {
            table,
            state,
            scans: lake.as_ref().clone(),
            tokio: None,
        }
    }

    /// Plans on the tokio runtime of `handle` (the one the table's stores run on).
    pub fn with_tokio(mut self, handle: tokio::runtime::Handle) -> Self {
        self.tokio = Some(handle);
        self
    }

    /// The table's own session, with the `datafusion.*` settings of `host` over its own.
    fn session_for(&self, host: &dyn Session) -> SessionState {
        let mut config: SessionConfig = self.state.config().clone();
        for entry in host.config_options().entries() {
            if let Some(value) = entry.value
                && entry.key.starts_with("datafusion.")
            {
                // A key this DataFusion does not know (another version's) is left as it is.
                let _ = config.options_mut().set(&entry.key, &value);
            }
        }
        SessionStateBuilder::new_from_existing(self.state.clone())
            .with_config(config)
            .build()
    }
}

#[async_trait]
impl TableProvider for StandaloneTable {
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
        // Every filter is taken (and the host still applies those not exact): the scan
        // pushes them into its Parquet readers itself, since the host's optimizer cannot
        // reach below it.
        let inner = self.table.supports_filters_pushdown(filters)?;
        Ok(inner
            .into_iter()
            .map(|p| match p {
                TableProviderFilterPushDown::Exact => TableProviderFilterPushDown::Exact,
                _ => TableProviderFilterPushDown::Inexact,
            })
            .collect())
    }

    fn statistics(&self) -> Option<Statistics> {
        self.table.statistics()
    }

    async fn scan(
        &self,
        host: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let state = self.session_for(host);
        let (table, scans) = (Arc::clone(&self.table), self.scans.clone());
        let (projection, filters) = (projection.cloned(), filters.to_vec());
        let planned = async move {
            // The inner table gets the filters it takes; those it applies exactly the host
            // dropped, and with them, maybe, their columns from the projection: the filter
            // below is made of the others alone.
            let offered: Vec<&Expr> = filters.iter().collect();
            let pushdown = table.supports_filters_pushdown(&offered)?;
            let (mut inner, mut ours) = (Vec::new(), Vec::new());
            for (filter, how) in filters.into_iter().zip(pushdown) {
                match how {
                    TableProviderFilterPushDown::Exact => inner.push(filter),
                    TableProviderFilterPushDown::Inexact => {
                        inner.push(filter.clone());
                        ours.push(filter);
                    }
                    TableProviderFilterPushDown::Unsupported => ours.push(filter),
                }
            }
            let mut plan = table
                .scan(&state, projection.as_ref(), &inner, limit)
                .await?;
            // What the host's optimizer would do with the filters, had it seen the scan: a
            // filter above it, pushed into the Parquet readers (row-group, page-index and
            // bloom-filter pruning, late materialisation) by the table's own optimizer rules.
            if let Some(predicate) = conjunction(ours.into_iter().map(unnormalize_col)) {
                let schema = DFSchema::try_from(plan.schema().as_ref().clone())?;
                let predicate = state.create_physical_expr(predicate, &schema)?;
                plan = Arc::new(FilterExec::try_new(predicate, plan)?);
                for rule in state.physical_optimizers() {
                    plan = rule.optimize(plan, state.config_options())?;
                }
            }
            // The session is installed, so the table left binding its scans' prefetchers to
            // the query planner, which a host does not run: they are bound here.
            let plan = scans.rewrite(plan, state.config_options(), state.runtime_env(), true)?;
            Ok(Arc::new(OwnRuntimeExec::new(plan, &state)) as Arc<dyn ExecutionPlan>)
        };
        match &self.tokio {
            Some(handle) => handle
                .spawn(planned)
                .await
                .map_err(|e| DataFusionError::External(Box::new(e)))?,
            None => planned.await,
        }
    }
}

/// Runs its input with the table's own runtime and settings, whatever task context it is
/// handed.
struct OwnRuntimeExec {
    input: Arc<dyn ExecutionPlan>,
    state: SessionState,
}

impl fmt::Debug for OwnRuntimeExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OwnRuntimeExec").finish_non_exhaustive()
    }
}

impl OwnRuntimeExec {
    fn new(input: Arc<dyn ExecutionPlan>, state: &SessionState) -> Self {
        Self {
            input,
            state: state.clone(),
        }
    }
}

impl DisplayAs for OwnRuntimeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "OwnRuntimeExec: ")?;
        let inner = datafusion::physical_plan::displayable(self.input.as_ref()).one_line();
        write!(f, "{inner}")
    }
}

impl ExecutionPlan for OwnRuntimeExec {
    fn name(&self) -> &str {
        "OwnRuntimeExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }

    // A leaf to the host: its optimizer would otherwise rebuild the scan below (pushing a
    // projection into it, say) into a plan that runs without this node, over the host's
    // runtime, which has none of the table's stores.
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        match children.is_empty() {
            true => Ok(self),
            false => Err(internal_datafusion_err!(
                "OwnRuntimeExec has no children, not {}",
                children.len()
            )),
        }
    }

    fn metrics(&self) -> Option<MetricsSet> {
        self.input.metrics()
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
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let own = TaskContext::new(
            ctx.task_id(),
            ctx.session_id(),
            self.state.config().clone(),
            ctx.scalar_functions().clone(),
            ctx.higher_order_functions().clone(),
            ctx.aggregate_functions().clone(),
            ctx.window_functions().clone(),
            Arc::clone(self.state.runtime_env()),
        );
        self.input.execute(partition, Arc::new(own))
    }
}
