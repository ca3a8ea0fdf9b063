//! Making a DataFusion session use the lake caches: the pieces `LakeCache::install` puts
//! into a `SessionStateBuilder`.
//!
//! - `registry.rs`: every object store of the runtime wrapped in a `CachingObjectStore`;
//! - `footers.rs`: the session's `FileMetadataCache` (DataFusion's footer cache), which answers
//!   a miss from the shared index cache for files the session's own stores have proven;
//! - `catalog.rs`: `register_parquet` (which goes straight to a schema) gives a `LakeTable`;
//! - `stats_function.rs`: `lakecache_stats()`, `lakecache_metrics()`, and `lakecache_clear()`
//!   when `lakecache.sql.clear` is on;
//! - `manage.rs`: `lakecache_warm()`, `lakecache_entries()` and `lakecache_invalidate()` when
//!   `lakecache.sql.manage` is on, each over what the session's own stores have shown.

mod catalog;
mod footers;
mod manage;
mod registry;
mod stats_function;

use std::sync::Arc;

use datafusion::catalog::{MemoryCatalogProviderList, TableFunction};
use datafusion::error::Result;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};

pub(crate) use stats_function::{Clearing, StatsSource};
use stats_function::{LakeStatsFunction, StatsTable};

use crate::config::{Installed, LakeOptions};
use crate::store::datafusion_caches;
use crate::table::{LakeQueryPlanner, LakeTableFactory, ScanCaches};
use catalog::LakeCatalogList;
use footers::SessionFooters;
use manage::{Manage, ManageFunction};
pub(crate) use registry::LakeObjectStoreRegistry;

/// Makes the session built from `builder` use `scans`; see `LakeCache::install`.
pub(crate) fn install(
    mut builder: SessionStateBuilder,
    scans: &ScanCaches,
    source: Arc<dyn StatsSource>,
) -> Result<SessionStateBuilder> {
    let runtime = match builder.runtime_env().take() {
        Some(runtime) => runtime,
        None => Arc::new(RuntimeEnv::default()),
    };
    let registry =
        LakeObjectStoreRegistry::new(Arc::clone(&runtime.object_store_registry), &scans.caches);
    // DataFusion's own footer and statistics caches, the session's, checked against the
    // versions its stores have shown; its planning takes footers from the shared index cache
    // for the files the session's own stores proved. Its listing cache is off: the store
    // wrapper caches listings, and drops them when a version changes.
    let registry_stores = registry.stores();
    let mut cache_manager = datafusion_caches(
        &scans.caches,
        Some(registry.stores()),
        scans.settings.index.datafusion_statistics_bytes,
    )
    .with_list_files_cache_limit(0);
    if let Some(own) = cache_manager.file_metadata_cache.take() {
        let footers = SessionFooters::new(own, registry.stores(), &scans.caches);
        cache_manager = cache_manager.with_file_metadata_cache(Some(Arc::new(footers)));
    }
    let runtime = RuntimeEnvBuilder::from_runtime_env(&runtime)
        .with_cache_manager(cache_manager)
        .with_object_store_registry(Arc::new(registry))
        .build_arc()?;
    let catalogs = match builder.catalog_list().take() {
        Some(list) => list,
        None => Arc::new(MemoryCatalogProviderList::new()),
    };
    let functions = builder
        .table_functions()
        .get_or_insert_with(Default::default);
    let clear = scans.settings.sql.clear.then_some(StatsTable::Clear);
    for table in [StatsTable::PerCache, StatsTable::PerMetric]
        .into_iter()
        .chain(clear)
    {
        let function = LakeStatsFunction::of(Arc::clone(&source), table);
        let function = Arc::new(TableFunction::new(table.name().into(), Arc::new(function)));
        functions.insert(table.name().to_string(), function);
    }
    if scans.settings.sql.manage {
        for which in Manage::ALL {
            let function = ManageFunction::new(which, &scans.caches, registry_stores.clone());
            let function = Arc::new(TableFunction::new(which.name().into(), Arc::new(function)));
            functions.insert(which.name().to_string(), function);
        }
    }
    let planner = LakeQueryPlanner::new(builder.query_planner().take(), scans.clone());
    let config = builder.config().take().unwrap_or_default();
    let options = LakeOptions::new(scans.settings.as_ref().clone());
    let config = config
        .with_extension(Arc::new(Installed))
        .with_option_extension(options);
    builder = builder.with_config(config);
    #[cfg(feature = "iceberg")]
    {
        let options = match builder.config() {
            Some(config) => config.options().clone(),
            None => Default::default(),
        };
        builder
            .table_options()
            .get_or_insert_with(|| {
                datafusion::common::config::TableOptions::default_from_session_config(&options)
            })
            .extensions
            .insert(crate::iceberg::IcebergOptions::default());
        builder = builder.with_table_factory(
            "ICEBERG".into(),
            Arc::new(crate::iceberg::IcebergTableFactory),
        );
    }
    Ok(builder
        .with_query_planner(Arc::new(planner))
        .with_runtime_env(runtime)
        .with_catalog_list(Arc::new(LakeCatalogList {
            inner: catalogs,
            lake: scans.clone(),
        }))
        .with_table_factory("PARQUET".into(), Arc::new(LakeTableFactory::new(scans))))
}
