#![doc = include_str!("../docs/crate.md")]
#![warn(missing_docs)]

// The layers, bottom to top (docs/architecture.md; tests/layers.rs checks them): `object`
// (what an object and a version are); `config`, `stats` and `metrics`; the caches `handle`,
// `index`, `range`; `store` (the one versioned read, and `CachingObjectStore`); `prefetch`;
// `table` (`LakeTable`, the reader, the query planner) and `iceberg` (Iceberg tables planned
// by the iceberg crate, scanned by DataFusion); `sql` (what `install` puts into a
// session); `delta` (Delta Lake's log store, and the hook that marks its scans); `lake`
// (`LakeCache`); `ballista` (a `LakeCache` per process of a Ballista cluster) and
// `metrics_export` (its figures through the `metrics` facade).

#[cfg(feature = "ballista")]
pub mod ballista;
pub mod config;
#[cfg(feature = "delta")]
pub mod delta;
mod few_map;
#[cfg(feature = "fuzz")]
pub mod fuzz;
mod handle;
#[cfg(feature = "iceberg")]
pub mod iceberg;
mod index;
mod lake;
mod metrics;
#[cfg(feature = "metrics")]
pub mod metrics_export;
mod object;
mod prefetch;
mod range;
mod sql;
pub mod stats;
mod store;
mod table;
#[cfg(feature = "testkit")]
pub mod testkit;

pub use config::{
    HandleConfig, IndexConfig, PrefetchConfig, RangeConfig, Settings, SqlConfig, StoreConfig,
};
pub use lake::{LakeCache, LakeCacheBuilder};
pub use object::{StoreIdentity, VersionChanged};
pub use stats::{
    Activity, CacheStats, HandleStats, IndexStats, LakeStats, PrefetchStats, RangeStats, StoreStats,
};
pub use store::CachingObjectStore;
pub use table::{LakeTable, LakeTableFactory, StandaloneTable};

/// The Rust blocks of the README and the guides under `docs/`, compiled by `cargo test --doc`
/// as those of the crate's page are. Every doc with a Rust block is listed here (or is the
/// crate's page); tests/docs.rs fails on one that is not, and on a block marked `ignore` with
/// no reason.
#[cfg(doctest)]
mod guides {
    #[doc = include_str!("../README.md")]
    struct Readme;
    #[cfg(feature = "delta")]
    #[doc = include_str!("../docs/delta.md")]
    struct Delta;
    #[cfg(feature = "ballista")]
    #[doc = include_str!("../docs/distributed.md")]
    struct Distributed;
    #[cfg(feature = "iceberg")]
    #[doc = include_str!("../docs/iceberg.md")]
    struct Iceberg;
    #[doc = include_str!("../docs/tuning.md")]
    struct Tuning;
}
