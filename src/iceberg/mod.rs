//! Iceberg tables read through the caches, with the `iceberg` feature.
//!
//! The iceberg crate (its core) reads a table's metadata file, manifest lists and manifests,
//! and plans a snapshot's files with the query's filters (manifest, partition and file
//! pruning); DataFusion's own Parquet scan reads the data files, with row-group, page-index
//! and bloom-filter pruning and filter pushdown as for any Parquet table:
//!
//! - the library reads through a `Storage` over the session's store (`storage.rs`), so
//!   metadata files, manifest lists and manifests go through the handle, index and range
//!   caches; all are written once, so a warm planning sends no request;
//! - a table opened by its directory finds its newest metadata file again at each scan
//!   (the highest-numbered metadata file, as Iceberg's own Hadoop catalog finds it),
//!   through the listing the
//!   handle cache keeps for `list_ttl`: a new snapshot is seen within it;
//! - the scan's files come with their sizes and row counts from the manifests, and the node
//!   above the scan ([`IcebergScanExec`]) tells the caches that manifests name them: a data
//!   file is never rewritten in place, so its path and size name its bytes, no HEAD is sent,
//!   and its bytes are kept across sessions and on the disk tier;
//! - a file's columns are matched to the table's by field id, not by name
//!   (`field_ids.rs`): renamed, dropped, re-added and reordered columns and the type
//!   promotions the spec allows read right.
//!
//! - position deletes (merge-on-read, format v2) become a row selection of each data file
//!   (`deletes.rs`), applied by the Parquet scan; equality deletes become sets of keys each
//!   data file's rows are checked against above the scan (`equality.rs`).
//!
//! What is not read yet is refused with an error naming the table and the file: data files
//! other than Parquet, and deletion vectors (format v3).
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
//! let url = Url::parse("file:///data/warehouse/db.db/sales/")?;
//! let table = datafusion_lakecache::iceberg::table_builder(&lake, &url, Arc::new(LocalFileSystem::new()))?
//!     .load()
//!     .await?;
//! ctx.register_table("sales", Arc::new(table))?;
//! ctx.sql("SELECT count(*) FROM sales").await?.show().await?;
//! // In SQL, with the session `install()` made:
//! ctx.sql("CREATE EXTERNAL TABLE s STORED AS ICEBERG LOCATION 'file:///data/warehouse/db.db/sales/' \
//!          OPTIONS ('iceberg.snapshot_id' '3051729675574597004')")
//!     .await?;
//! # Ok(())
//! # }
//! ```

mod deletes;
mod equality;
mod exec;
mod factory;
mod field_ids;
mod locate;
mod predicate;
mod schema;
mod storage;
mod table;
mod wire;

use std::sync::Arc;

use datafusion::error::{DataFusionError, Result};
use object_store::ObjectStore;
use url::Url;

pub use exec::IcebergScanExec;
pub(crate) use exec::is_iceberg_scan;
pub use factory::{IcebergOptions, IcebergTableFactory};
pub use table::{IcebergTable, IcebergTableBuilder, SnapshotChoice};

use crate::store::{Caches, cached_store, store_root};

/// The builder of the Iceberg table at `table_url` (its directory, or one of its
/// `*.metadata.json` files) read through the caches of `lake`: `store` is the store of the
/// URL's root (the bucket, or `file:///`), as a session would register it; a
/// [`CachingObjectStore`](crate::CachingObjectStore) is used as it is.
pub fn table_builder(
    lake: &impl AsRef<Caches>,
    table_url: &Url,
    store: Arc<dyn ObjectStore>,
) -> Result<IcebergTableBuilder> {
    let caches: &Caches = lake.as_ref();
    let root = root_of(table_url)?;
    let store = cached_store(store, &root, caches);
    Ok(IcebergTableBuilder::new(table_url.clone(), root, store))
}

/// The iceberg crate's storage over `store`, the store of `root` (`s3://bucket/`,
/// `file:///`), for a catalog or writer of the iceberg crate to write a table with the
/// store a session reads it with (`MemoryCatalogBuilder::with_storage_factory`, say).
pub fn storage_factory(
    root: Url,
    store: Arc<dyn ObjectStore>,
) -> Arc<dyn ::iceberg::io::StorageFactory> {
    storage::StoreStorage::new(root, store).factory()
}

/// The URL of the store root `table_url` is in: its scheme, host and port.
fn root_of(table_url: &Url) -> Result<Url> {
    store_root(table_url).ok_or_else(|| {
        DataFusionError::Plan(format!("{table_url} is not the URL of an Iceberg table"))
    })
}
