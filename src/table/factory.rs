//! [`LakeTableFactory`]: `CREATE EXTERNAL TABLE ... STORED AS PARQUET` gives a [`LakeTable`].

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{Session, TableProvider, TableProviderFactory};
use datafusion::datasource::listing_table_factory::ListingTableFactory;
use datafusion::error::Result;
use datafusion::logical_expr::CreateExternalTable;

use super::{LakeTable, ScanCaches};

/// Builds tables as DataFusion's `ListingTableFactory` does, then wraps Parquet ones in a
/// [`LakeTable`]. Register it for `PARQUET`:
///
/// ```
/// # use std::sync::Arc;
/// # use datafusion::execution::SessionStateBuilder;
/// # use datafusion_lakecache::{LakeCache, LakeTableFactory};
/// let lake = LakeCache::builder().build().unwrap();
/// let state = SessionStateBuilder::new()
///     .with_default_features()
///     .with_table_factory("PARQUET".into(), Arc::new(LakeTableFactory::new(&lake)))
///     .build();
/// ```
#[derive(Debug)]
pub struct LakeTableFactory {
    inner: ListingTableFactory,
    scans: ScanCaches,
}

impl LakeTableFactory {
    /// A factory whose tables use the caches of `lake`.
    pub fn new(lake: &impl AsRef<ScanCaches>) -> Self {
        Self {
            inner: ListingTableFactory::new(),
            scans: lake.as_ref().clone(),
        }
    }
}

#[async_trait]
impl TableProviderFactory for LakeTableFactory {
    async fn create(
        &self,
        state: &dyn Session,
        cmd: &CreateExternalTable,
    ) -> Result<Arc<dyn TableProvider>> {
        let table = self.inner.create(state, cmd).await?;
        Ok(LakeTable::wrap_if_parquet(table, &self.scans))
    }
}
