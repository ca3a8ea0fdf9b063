//! Make Apache DataFusion fast over data lakes: many Parquet files on object stores (S3, GCS,
//! Azure, HTTP) or local disks, read again and again by SQL.
//!
//! One [`LakeCache`] per process holds the shared caches; [`LakeCache::install`] makes a
//! session use them. DataFusion's Parquet scans then run as before (projection, pruning and
//! filter pushdown unchanged) while HEAD and LIST requests and local file opens come from the
//! handle cache, footers, page indexes and bloom filters from the index cache, bytes from the
//! range cache, and each scan keeps its downloads in flight ahead of its readers.
//!
//! ```
//! use datafusion::execution::SessionStateBuilder;
//! use datafusion::prelude::SessionContext;
//! use datafusion_lakecache::LakeCache;
//!
//! let lake = LakeCache::builder().handle_capacity(10_000).build().unwrap();
//! let state = lake
//!     .install(SessionStateBuilder::new().with_default_features())
//!     .unwrap()
//!     .build();
//! let ctx = SessionContext::new_with_state(state);
//! // ctx.register_object_store(...), ctx.register_parquet(...) and SQL as usual;
//! // lake.stats() and `SELECT * FROM lakecache_stats()` show the caches' figures.
//! ```
//!
//! The layers, bottom to top (`docs/architecture.md`): [`object`] (what an object and a
//! version are); [`config`] and [`stats`]; the caches [`handle`], [`index`], [`range`];
//! [`store`] (the one versioned read, and [`CachingObjectStore`]); `prefetch`; [`table`]
//! ([`LakeTable`], the reader, the query planner); `sql` (what `install` puts into a
//! session); and [`LakeCache`] on top. [`testkit`] has stores that count, delay or fail
//! requests, and a seeded lake generator, for tests and benchmarks.

pub mod config;
#[doc(hidden)]
pub mod fuzz;
pub mod handle;
pub mod index;
mod lake;
pub(crate) mod metrics;
pub mod object;
pub(crate) mod prefetch;
pub mod range;
pub(crate) mod sql;
pub mod stats;
pub mod store;
pub mod table;
pub mod testkit;

pub use config::{HandleConfig, IndexConfig, PrefetchConfig, RangeConfig, Settings, SqlConfig};
pub use handle::HandleCache;
pub use index::IndexCache;
pub use lake::{LakeCache, LakeCacheBuilder};
pub use object::{ObjectVersion, VersionChanged};
pub use range::RangeCache;
pub use stats::{CacheStats, HandleStats, IndexStats, LakeStats, PrefetchStats, RangeStats};
pub use store::CachingObjectStore;
pub use table::{LakeTable, LakeTableFactory};
