//! Delta Lake tables (deltalake-core) read through the caches, with the `delta` feature.
//!
//! A Delta table registered in an installed session needs nothing from delta-rs to be cached:
//!
//! - its scans resolve the table's store from the session's registry, which hands out a
//!   [`CachingObjectStore`](crate::CachingObjectStore): handle, index and range caching for
//!   data files, deletion vectors, checkpoints and commits read at scan time;
//! - the query planner `install()` gives the session recognises delta-rs's `DeltaScanExec`
//!   in the final plan (this module registers that hook) and gives the Parquet scans below it
//!   readers whose file versions come from the log (path and size of each `add`
//!   action; Delta never rewrites a data file in place), so a scan needs no HEAD, and the
//!   prefetcher keeps downloads in flight as for any other scan. A scan of a table with
//!   deletion vectors checks that its Parquet inputs are the ones it planned; it keeps them,
//!   and its files are read through the store wrapper (one HEAD per file per handle TTL);
//! - the store wrapper serves a table log as the protocol allows: the `_delta_log/` listing
//!   and `_last_checkpoint` always from the store (a new commit is seen by the next snapshot
//!   load), commits, checkpoints and checksum files, written once, from the caches.
//!
//! Snapshot loading goes through the table's log store, which delta-rs builds from its own
//! object store, not the session's registry: [`table_builder`] makes a `DeltaTableBuilder`
//! whose log store reads through the same caches.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//! use datafusion_lakecache::LakeCache;
//! use object_store::local::LocalFileSystem;
//! use url::Url;
//!
//! let lake = LakeCache::builder().build()?;
//! let ctx = SessionContext::new_with_state(lake.install(SessionStateBuilder::new())?.build());
//! let url = Url::parse("file:///data/sales/")?;
//! let table = datafusion_lakecache::delta::table_builder(&lake, &url, Arc::new(LocalFileSystem::new()))?
//!     .load()
//!     .await?;
//! ctx.register_table("sales", table.table_provider().await?)?;
//! ctx.sql("SELECT count(*) FROM sales").await?.show().await?;
//! # Ok(())
//! # }
//! ```

use std::sync::{Arc, Once};

use datafusion::physical_plan::ExecutionPlan;
use deltalake_core::delta_datafusion::DeltaScanExec;
use deltalake_core::logstore::{
    LogStore, LogStoreFactory, ObjectStoreRef, StorageConfig, default_logstore, logstore_factories,
};
use deltalake_core::{DeltaResult, DeltaTableBuilder, DeltaTableError};
use object_store::ObjectStore;
use url::Url;

use crate::store::{Caches, cached_store, store_root};

/// A `DeltaTableBuilder` for the table at `table_url` whose log store reads through the
/// caches of `lake`: `store` is the store of the URL's root (the bucket, or `file:///`), as
/// a session would register it; a [`CachingObjectStore`](crate::CachingObjectStore) is used
/// as it is.
///
/// For `s3://`, `gs://` and `az://` URLs delta-rs needs the log store of that scheme
/// registered (`deltalake_aws::register_handlers` and the like, or
/// [`register_default_log_stores`]), as it does without the caches.
pub fn table_builder(
    lake: &impl AsRef<Caches>,
    table_url: &Url,
    store: Arc<dyn ObjectStore>,
) -> DeltaResult<DeltaTableBuilder> {
    let caches: &Caches = lake.as_ref();
    let root = store_root(table_url)
        .ok_or_else(|| DeltaTableError::InvalidTableLocation(table_url.to_string()))?;
    let store = cached_store(store, &root, caches);
    Ok(DeltaTableBuilder::from_url(table_url.clone())?
        .with_storage_backend(store, table_url.clone()))
}

/// The cloud schemes [`register_default_log_stores`] gives a log store.
const CLOUD_SCHEMES: [&str; 8] = ["s3", "s3a", "gs", "az", "adl", "azure", "abfs", "abfss"];

/// Registers delta-rs's default log store for `s3://`, `gs://` and the Azure schemes, once
/// per process, for each that has none yet: what a reader of such tables needs when it does
/// not link `deltalake-aws` and the like (the Python module does not). The default log store
/// commits with put-if-absent; a writer to a store without it wants its scheme's crate, whose
/// registration, made first, is kept.
pub fn register_default_log_stores() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for scheme in CLOUD_SCHEMES {
            let Ok(url) = Url::parse(&format!("{scheme}://")) else {
                continue;
            };
            if !logstore_factories().contains_key(&url) {
                logstore_factories().insert(url, Arc::new(DefaultLogStores));
            }
        }
    });
}

/// delta-rs's default log store, for the schemes whose crates register their own.
struct DefaultLogStores;

impl LogStoreFactory for DefaultLogStores {
    fn with_options(
        &self,
        prefixed_store: ObjectStoreRef,
        root_store: ObjectStoreRef,
        location: &Url,
        options: &StorageConfig,
    ) -> DeltaResult<Arc<dyn LogStore>> {
        Ok(default_logstore(
            prefixed_store,
            root_store,
            location,
            options,
        ))
    }
}

/// Whether `plan` is delta-rs's scan of a Delta table.
pub(crate) fn is_delta_scan(plan: &dyn ExecutionPlan) -> bool {
    plan.downcast_ref::<DeltaScanExec>().is_some()
}
