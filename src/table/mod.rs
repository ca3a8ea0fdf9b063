//! [`LakeTable`]: DataFusion's `ListingTable` over Parquet, with its scans reading footers,
//! page indexes and bloom filters from the shared [`IndexCache`](crate::index::IndexCache).
//!
//! Schema, partition columns, statistics, filter pushdown and the plan itself are the
//! `ListingTable`'s: after it plans a scan, [`LakeTable`] only puts a [`LakeReaderFactory`]
//! into each `ParquetSource`, so projection and every kind of pruning stay as DataFusion does
//! them. (DataFusion's `ParquetFormat` overwrites any reader factory set before planning,
//! which is why the swap happens afterwards.)

mod factory;
mod reader;
mod rule;

use std::borrow::Cow;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use async_trait::async_trait;
use datafusion::catalog::{ScanArgs, ScanResult, Session, TableProvider};
use datafusion::common::Constraints;
use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::file_format::parquet::ParquetFormat;
use datafusion::datasource::listing::{
    ListingOptions, ListingTable, ListingTableConfig, ListingTableUrl,
};
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::logical_expr::dml::InsertOp;
use datafusion::logical_expr::{Expr, LogicalPlan, TableProviderFilterPushDown, TableType};
use datafusion::physical_plan::ExecutionPlan;

pub use factory::LakeTableFactory;
pub use reader::{LakeReader, LakeReaderFactory, load_footer, load_footer_with};
pub use rule::{Installed, LakeScanRule};

use crate::LakeCache;

/// A Parquet `ListingTable` whose scans use the lake caches.
#[derive(Debug)]
pub struct LakeTable {
    inner: Arc<ListingTable>,
    lake: LakeCache,
}

impl LakeTable {
    /// Wraps a `ListingTable`. Scans of files in any other format than Parquet pass through
    /// unchanged.
    pub fn new(inner: Arc<ListingTable>, lake: &LakeCache) -> Self {
        Self {
            inner,
            lake: lake.clone(),
        }
    }

    /// A table over the Parquet files at `table_url` (a directory ending in `/`, or a file),
    /// with the schema inferred as `register_parquet` does.
    pub async fn try_new(state: &dyn Session, table_url: &str, lake: &LakeCache) -> Result<Self> {
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
        lake: &LakeCache,
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
        lake: &LakeCache,
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

    /// Puts a [`LakeReaderFactory`] into every Parquet scan of `plan`, unless the session was
    /// installed, where [`LakeScanRule`] does it (with prefetching) on the final plan.
    fn with_lake_readers(
        &self,
        state: &dyn Session,
        plan: Arc<dyn ExecutionPlan>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if state.config().get_extension::<rule::Installed>().is_some() {
            return Ok(plan);
        }
        let index = self.lake.index();
        map_parquet_scans(plan, |config, source| {
            let Some(inner) = source.parquet_file_reader_factory() else {
                return Ok(None);
            };
            if rule::encrypted(source) {
                return Ok(None);
            }
            let store_url = &config.object_store_url;
            let store = state.runtime_env().object_store(store_url)?;
            let factory =
                LakeReaderFactory::new(Arc::clone(inner), store, store_url.as_ref(), index.clone());
            Ok(Some(Arc::new(factory)))
        })
    }
}

/// Rebuilds every Parquet scan of `plan` whose reader factory `f` replaces (`Some`), leaving
/// the rest of the scan (projection, predicate, files) as it was.
pub(crate) fn map_parquet_scans(
    plan: Arc<dyn ExecutionPlan>,
    f: impl Fn(&FileScanConfig, &ParquetSource) -> Result<Option<Arc<dyn ParquetFileReaderFactory>>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    plan.transform_up(|node| {
        let Some((config, source)) = node
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        else {
            return Ok(Transformed::no(node));
        };
        let Some(factory) = f(config, source)? else {
            return Ok(Transformed::no(node));
        };
        let source = source.clone().with_parquet_file_reader_factory(factory);
        let config = FileScanConfigBuilder::from(config.clone())
            .with_source(Arc::new(source))
            .build();
        Ok(Transformed::yes(
            DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>
        ))
    })
    .map(|t| t.data)
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
