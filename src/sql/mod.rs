//! Making a DataFusion session use the lake caches: [`LakeCache::install`].

mod catalog;
mod options;
mod registry;
mod stats_function;

use std::sync::Arc;

use datafusion::catalog::{MemoryCatalogProviderList, TableFunction};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};

pub use options::LakeOptions;
pub use registry::LakeObjectStoreRegistry;
pub use stats_function::{LakeStatsFunction, StatsTable};

use crate::{LakeCache, LakeTableFactory};
use catalog::LakeCatalogList;

impl LakeCache {
    /// Makes the session built from `builder` use this cache:
    /// - every object store of its runtime is wrapped in a
    ///   [`CachingObjectStore`](crate::CachingObjectStore) (handle caching);
    /// - the [`IndexCache`](crate::IndexCache) is DataFusion's `FileMetadataCache`, and
    ///   DataFusion's listings last no longer than the listing TTL;
    /// - `CREATE EXTERNAL TABLE ... STORED AS PARQUET` and `register_parquet` give
    ///   [`LakeTable`](crate::LakeTable)s;
    /// - the `lakecache.*` settings are registered ([`LakeOptions`]): `SET` and `SHOW ALL`;
    /// - every Parquet scan of the final plan prefetches ahead of its readers
    ///   ([`LakeScanRule`](crate::LakeScanRule), [`Prefetcher`](crate::Prefetcher));
    /// - `SELECT * FROM lakecache_stats()` lists every cache's figures (a row per cache),
    ///   `lakecache_metrics()` every figure (a row per metric), and `lakecache_clear()`
    ///   empties the caches.
    ///
    /// Sessions installed from clones of one `LakeCache` share its caches. Call it after
    /// `with_default_features`, which would replace the table factory. A runtime already set
    /// on `builder` keeps its memory pool, disk manager and object stores; its cache manager
    /// configuration is replaced by [`LakeCache::cache_manager_config`].
    ///
    /// ```
    /// # use datafusion::execution::SessionStateBuilder;
    /// # use datafusion::prelude::SessionContext;
    /// # use datafusion_lakecache::LakeCache;
    /// let lake = LakeCache::builder().build().unwrap();
    /// let state = lake
    ///     .install(SessionStateBuilder::new().with_default_features())
    ///     .unwrap()
    ///     .build();
    /// let ctx = SessionContext::new_with_state(state);
    /// ```
    pub fn install(&self, mut builder: SessionStateBuilder) -> Result<SessionStateBuilder> {
        let runtime = match builder.runtime_env().take() {
            Some(runtime) => runtime,
            None => Arc::new(RuntimeEnv::default()),
        };
        let registry =
            LakeObjectStoreRegistry::new(Arc::clone(&runtime.object_store_registry), self);
        let runtime = RuntimeEnvBuilder::from_runtime_env(&runtime)
            .with_cache_manager(self.cache_manager_config())
            .with_object_store_registry(Arc::new(registry))
            .build_arc()?;
        let catalogs = match builder.catalog_list().take() {
            Some(list) => list,
            None => Arc::new(MemoryCatalogProviderList::new()),
        };
        let functions = builder
            .table_functions()
            .get_or_insert_with(Default::default);
        for table in [
            StatsTable::PerCache,
            StatsTable::PerMetric,
            StatsTable::Clear,
        ] {
            let function = LakeStatsFunction::of(self, table);
            let function = Arc::new(TableFunction::new(table.name().into(), Arc::new(function)));
            functions.insert(table.name().to_string(), function);
        }
        let scans = Arc::new(crate::LakeScanRule::new(self, Arc::clone(&runtime)));
        let config = builder.config().take().unwrap_or_default();
        let config = config
            .with_extension(Arc::new(crate::table::Installed))
            .with_option_extension(LakeOptions::new(self));
        builder = builder.with_config(config);
        Ok(builder
            .with_physical_optimizer_rule(scans)
            .with_runtime_env(runtime)
            .with_catalog_list(Arc::new(LakeCatalogList {
                inner: catalogs,
                lake: self.clone(),
            }))
            .with_table_factory("PARQUET".into(), Arc::new(LakeTableFactory::new(self))))
    }
}
