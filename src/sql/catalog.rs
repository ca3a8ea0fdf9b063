//! Catalog wrappers that turn every Parquet `ListingTable` registered in a session into a
//! [`LakeTable`], so `register_parquet` (which goes straight to the schema, not through a
//! table factory) gives one too.

use std::sync::Arc;

use async_trait::async_trait;
use datafusion::catalog::{CatalogProvider, CatalogProviderList, SchemaProvider, TableProvider};
use datafusion::error::Result;

use crate::table::{LakeTable, ScanCaches};

/// A catalog list whose catalogs are [`LakeCatalog`]s.
#[derive(Debug)]
pub(crate) struct LakeCatalogList {
    pub(crate) inner: Arc<dyn CatalogProviderList>,
    pub(crate) lake: ScanCaches,
}

impl CatalogProviderList for LakeCatalogList {
    fn register_catalog(
        &self,
        name: String,
        catalog: Arc<dyn CatalogProvider>,
    ) -> Option<Arc<dyn CatalogProvider>> {
        self.inner.register_catalog(name, catalog)
    }

    fn catalog_names(&self) -> Vec<String> {
        self.inner.catalog_names()
    }

    fn catalog(&self, name: &str) -> Option<Arc<dyn CatalogProvider>> {
        let inner = self.inner.catalog(name)?;
        Some(Arc::new(LakeCatalog {
            inner,
            lake: self.lake.clone(),
        }))
    }
}

/// A catalog whose schemas are [`LakeSchema`]s.
#[derive(Debug)]
struct LakeCatalog {
    inner: Arc<dyn CatalogProvider>,
    lake: ScanCaches,
}

impl CatalogProvider for LakeCatalog {
    fn schema_names(&self) -> Vec<String> {
        self.inner.schema_names()
    }

    fn schema(&self, name: &str) -> Option<Arc<dyn SchemaProvider>> {
        let inner = self.inner.schema(name)?;
        Some(Arc::new(LakeSchema {
            inner,
            lake: self.lake.clone(),
        }))
    }

    fn register_schema(
        &self,
        name: &str,
        schema: Arc<dyn SchemaProvider>,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.inner.register_schema(name, schema)
    }

    fn deregister_schema(
        &self,
        name: &str,
        cascade: bool,
    ) -> Result<Option<Arc<dyn SchemaProvider>>> {
        self.inner.deregister_schema(name, cascade)
    }
}

/// A schema that stores Parquet listing tables as [`LakeTable`]s.
#[derive(Debug)]
struct LakeSchema {
    inner: Arc<dyn SchemaProvider>,
    lake: ScanCaches,
}

#[async_trait]
impl SchemaProvider for LakeSchema {
    fn owner_name(&self) -> Option<&str> {
        self.inner.owner_name()
    }

    fn table_names(&self) -> Vec<String> {
        self.inner.table_names()
    }

    async fn table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.table(name).await
    }

    fn register_table(
        &self,
        name: String,
        table: Arc<dyn TableProvider>,
    ) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner
            .register_table(name, LakeTable::wrap_if_parquet(table, &self.lake))
    }

    fn deregister_table(&self, name: &str) -> Result<Option<Arc<dyn TableProvider>>> {
        self.inner.deregister_table(name)
    }

    fn table_exist(&self, name: &str) -> bool {
        self.inner.table_exist(name)
    }
}
