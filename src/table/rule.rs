//! [`LakeScanRule`]: gives every Parquet scan of a session's final plan its [`Prefetcher`].
//!
//! A scan's prefetcher needs what only the final plan knows: the predicate DataFusion pushes
//! into the scan during physical optimization, the projection after projection pushdown, and
//! the file groups after large files were split across partitions. So it is attached by a
//! physical optimizer rule that runs after DataFusion's own, which [`LakeCache::install`]
//! adds. The rule also puts a [`LakeReaderFactory`] into Parquet scans that are not
//! [`LakeTable`](super::LakeTable)s (a plain `ListingTable`, another product's provider),
//! provided they use one of DataFusion's own reader factories.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::datasource::physical_plan::ParquetSource;
use datafusion::error::Result;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;

use super::{LakeReaderFactory, map_parquet_scans};
use crate::LakeCache;
use crate::prefetch::Prefetcher;
use crate::sql::LakeOptions;

/// The physical optimizer rule [`LakeCache::install`] adds; see the module docs.
#[derive(Debug)]
pub struct LakeScanRule {
    lake: LakeCache,
    runtime: Arc<RuntimeEnv>,
}

impl LakeScanRule {
    /// A rule whose scans read through `lake`, with the object stores and memory pool of
    /// `runtime` (the session's).
    pub fn new(lake: &LakeCache, runtime: Arc<RuntimeEnv>) -> Self {
        Self {
            lake: lake.clone(),
            runtime,
        }
    }
}

impl PhysicalOptimizerRule for LakeScanRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        map_parquet_scans(plan, |config, source| {
            let Some(current) = source.parquet_file_reader_factory() else {
                return Ok(None);
            };
            let store_url = &config.object_store_url;
            if encrypted(source) {
                return Ok(None);
            }
            // Reader factories are not `Any`; DataFusion's own are recognised by type name.
            let name = type_name(current.as_ref());
            if name != "CachedParquetFileReaderFactory" && name != "DefaultParquetFileReaderFactory"
            {
                return Ok(None);
            }
            let factory = LakeReaderFactory::new(
                Arc::clone(current),
                self.runtime.object_store(store_url)?,
                store_url.as_ref(),
                self.lake.index().clone(),
            );
            let prefetcher = Prefetcher::try_new(
                config,
                source,
                options,
                factory.store(),
                store_url.as_ref(),
                &self.lake,
                Arc::clone(&self.runtime.memory_pool),
                options
                    .extensions
                    .get::<LakeOptions>()
                    .map_or(self.lake.prefetch_config(), |o| &o.prefetch),
            );
            Ok(Some(Arc::new(factory.with_prefetcher(prefetcher))))
        })
    }

    fn name(&self) -> &str {
        "lakecache_scan"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// Whether the scan reads encrypted Parquet: its readers need the decryption properties
/// DataFusion passes to its own reader, which the index cache's footer loads do not use, so
/// such scans are left as DataFusion plans them.
pub(crate) fn encrypted(source: &ParquetSource) -> bool {
    let crypto = &source.table_parquet_options().crypto;
    crypto.file_decryption.is_some() || crypto.factory_id.is_some()
}

/// The name a value's `Debug` output starts with (its type, for derived `Debug`), read without
/// formatting the rest: a factory's `Debug` can print a whole cache.
pub(crate) fn type_name(value: &dyn std::fmt::Debug) -> String {
    struct Head(String);
    impl std::fmt::Write for Head {
        fn write_str(&mut self, s: &str) -> std::fmt::Result {
            for c in s.chars() {
                if !(c.is_alphanumeric() || c == '_') {
                    return Err(std::fmt::Error);
                }
                self.0.push(c);
            }
            Ok(())
        }
    }
    let mut head = Head(String::new());
    let _ = std::fmt::write(&mut head, format_args!("{value:?}"));
    head.0
}

/// Marks a session built by [`LakeCache::install`], whose final plans [`LakeScanRule`]
/// rewrites; [`LakeTable`](super::LakeTable) then leaves its scans to the rule.
#[derive(Debug, Default)]
pub struct Installed;
