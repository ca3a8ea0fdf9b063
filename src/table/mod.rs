//! The table layer: where DataFusion's plans meet the caches.
//!
//! - [`LakeTable`]: DataFusion's `ListingTable` over Parquet. Schema, partition columns,
//!   statistics, filter pushdown and the plan itself are the `ListingTable`'s: after it plans
//!   a scan, [`LakeTable`] only puts a `LakeReaderFactory` into each `ParquetSource`, so
//!   projection and every kind of pruning stay as DataFusion does them. (DataFusion's
//!   `ParquetFormat` overwrites any reader factory set before planning, which is why the swap
//!   happens afterwards.)
//! - `reader.rs`: `LakeReader`, the Parquet reader: footers and bloom filters from the index
//!   cache, every other byte by "lease, else read".
//! - `planner.rs`: the query planner of installed sessions, which gives every Parquet scan
//!   of the final plan its prefetcher (and its reader, if its table gave it none).
//! - `scans.rs`: [`ScanCaches`], what scans need of a `LakeCache`.
//! - `awaiting.rs`: [`AwaitingPlan`](awaiting::AwaitingPlan), the readers an installed
//!   session's tables gave their scans, found again in the final plan.
//! - `prune.rs`: files a scan's predicate rules out by their statistics, dropped from the
//!   final plan (DataFusion would create each one's reader and then skip it).
//! - `factory.rs`: [`LakeTableFactory`] for `CREATE EXTERNAL TABLE ... STORED AS PARQUET`.

mod awaiting;
mod factory;
mod file_groups;
mod planner;
mod prune;
mod reader;
mod scans;
mod standalone;

use std::borrow::Cow;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::common::Constraints;
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::error::Result;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

pub use factory::LakeTableFactory;
pub(crate) use file_groups::balanced;
pub(crate) use planner::LakeQueryPlanner;
use reader::LakeReaderFactory;
pub(crate) use scans::NamesFilesByLog;
pub use scans::ScanCaches;
pub use standalone::StandaloneTable;

use crate::config::Installed;

/// A Parquet `ListingTable` whose scans use the lake caches.
#[derive(Debug)]
pub struct LakeTable {
    inner: Arc<ListingTable>,
    scans: ScanCaches,
}

impl LakeTable {
    /// Wraps a `ListingTable` with the caches of `lake` (a `LakeCache`). Scans of files in
    /// any other format than Parquet pass through unchanged.
    pub fn new(inner: Arc<ListingTable>, lake: &impl AsRef<ScanCaches>) -> Self {
        Self {
            inner,
            scans: lake.as_ref().clone(),
        }
    }

    /// A table over the Parquet files at `table_url` (a directory ending in `/`, or a file),
    /// with the schema inferred as `register_parquet` does.
    pub async fn try_new(
        state: &dyn Session,
        table_url: &str,
        lake: &impl AsRef<ScanCaches>,
    ) -> Result<Self> {
        let format = ParquetFormat::default().with_options(state.default_table_options().parquet);
        let options = ListingOptions::new(Arc::new(format)).with_file_extension(".parquet");
        Self::try_new_with_options(state, table_url, options, lake).await
    }

    /// Like [`LakeTable::try_new`], with listing options of one's own: partition columns,
    /// file extension, sort order (for example from `ParquetReadOptions::to_listing_options`).
    pub async fn try_new_with_options(
        state: &dyn Session,
        table_url: &str,
        options: ListingOptions,
        lake: &impl AsRef<ScanCaches>,
    ) -> Result<Self> {
        let url = ListingTableUrl::parse(table_url)?;
        let schema = options.infer_schema(state, &url).await?;
        let config = ListingTableConfig::new(url)
            .with_listing_options(options)
            .with_schema(schema);
        let statistics = state.runtime_env().cache_manager.get_file_statistic_cache();
        let table = ListingTable::try_new(config)?.with_cache(statistics);
        Ok(Self::new(Arc::new(table), lake))
    }

    /// `table` as a [`LakeTable`] if it is a Parquet `ListingTable`, else unchanged.
    pub fn wrap_if_parquet(
        table: Arc<dyn TableProvider>,
        lake: &impl AsRef<ScanCaches>,
    ) -> Arc<dyn TableProvider> {
        let is_parquet = table
            .downcast_ref::<ListingTable>()
            .is_some_and(|t| t.options().format.get_ext() == "parquet");
        if !is_parquet {
            return table;
        }
        let any: Arc<dyn std::any::Any + Send + Sync> = table;
        match any.downcast::<ListingTable>() {
            Ok(listing) => Arc::new(Self::new(listing, lake)),
            Err(_) => unreachable!("checked to be a ListingTable above"),
        }
    }

    /// The wrapped `ListingTable`.
    pub fn listing_table(&self) -> &Arc<ListingTable> {
        &self.inner
    }

    /// Gives every Parquet scan of `plan` its lake reader. In an installed session the query
    /// planner gives it its prefetcher on the final plan (and prunes its files then).
    fn with_lake_readers(
        &self,
        state: &dyn Session,
        plan: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if state.config().get_extension::<Installed>().is_some() {
            return self.scans.awaiting_final_plan(plan, state.runtime_env());
        }
        self.scans
            .rewrite(plan, state.config_options(), state.runtime_env(), false)
    }
}

#[async_trait]
impl TableProvider for LakeTable {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }

    fn constraints(&self) -> Option<&Constraints> {
        self.inner.constraints()
    }

    fn table_type(&self) -> TableType {
        self.inner.table_type()
    }

    fn get_table_definition(&self) -> Option<&str> {
        self.inner.get_table_definition()
    }

    fn get_logical_plan(&'_ self) -> Option<Cow<'_, LogicalPlan>> {
        self.inner.get_logical_plan()
    }

    fn get_column_default(&self, column: &str) -> Option<&Expr> {
        self.inner.get_column_default(column)
    }

    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        filters: &[Expr],
        limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let plan = self.inner.scan(state, projection, filters, limit).await?;
        self.with_lake_readers(state, plan)
    }

    async fn scan_with_args<'a>(
        &self,
        state: &dyn Session,
        args: ScanArgs<'a>,
    ) -> Result<ScanResult> {
        let plan = self.inner.scan_with_args(state, args).await?.into_inner();
        Ok(ScanResult::new(self.with_lake_readers(state, plan)?))
    }

    fn supports_filters_pushdown(
        &self,
        filters: &[&Expr],
    ) -> Result<Vec<TableProviderFilterPushDown>> {
        self.inner.supports_filters_pushdown(filters)
    }

    fn statistics(&self) -> Option<datafusion::common::Statistics> {
        self.inner.statistics()
    }

    async fn insert_into(
        &self,
        state: &dyn Session,
        input: Arc<dyn ExecutionPlan>,
        insert_op: InsertOp,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.inner.insert_into(state, input, insert_op).await
    }
}
