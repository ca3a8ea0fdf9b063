//! [`ScanCaches`]: what a scan needs of a `LakeCache`, and how a Parquet scan of a plan is
//! given its [`LakeReaderFactory`] (and, in an installed session, its prefetcher).

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::datasource::physical_plan::{
    FileScanConfig, FileScanConfigBuilder, ParquetFileReaderFactory, ParquetSource,
};
use datafusion::datasource::source::DataSourceExec;
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions, replace_children_if_necessary,
};

use super::LakeReaderFactory;
use super::prune::without_pruned_files;
use crate::config::{LakeOptions, Settings};
use crate::object::StoreKey;
use crate::prefetch::{PrefetchCounters, Prefetcher, ScanInputs, ScanPlan};
use crate::store::{Caches, StoreReads};

/// What scans need of a `LakeCache` (which hands it out with `AsRef`): its caches, its
/// settings, and its prefetch figures. Cheap to clone.
#[derive(Debug, Clone)]
pub struct ScanCaches {
    pub(crate) caches: Caches,
    pub(crate) settings: Arc<Settings>,
    pub(crate) counters: Arc<PrefetchCounters>,
    /// The table formats whose scans name their files from a log (registered by the layers
    /// above: Delta Lake's, with the `delta` feature).
    pub(crate) log_formats: Arc<[NamesFilesByLog]>,
}

/// Whether a plan node is a table format's scan whose files its log names, written once
/// (path and size name the bytes): the hook a table format registers with the scans.
pub(crate) type NamesFilesByLog = fn(&dyn ExecutionPlan) -> bool;

impl AsRef<ScanCaches> for ScanCaches {
    fn as_ref(&self) -> &ScanCaches {
        self
    }
}

impl AsRef<Caches> for ScanCaches {
    fn as_ref(&self) -> &Caches {
        &self.caches
    }
}

impl ScanCaches {
    /// The versioned reads of the store `runtime` has for `store_url`: the wrapper's own if it
    /// is a `CachingObjectStore`, else guarded reads over the store as it is.
    pub(crate) fn reads(
        &self,
        runtime: &RuntimeEnv,
        store_url: &ObjectStoreUrl,
    ) -> Result<StoreReads> {
        let store = runtime.object_store(store_url)?;
        Ok(self.caches.directory.find(&store).unwrap_or_else(|| {
            StoreReads::foreign(store, StoreKey::of(store_url.as_ref()), &self.caches)
        }))
    }

    /// Gives every Parquet scan of `plan` that uses one of DataFusion's own reader factories
    /// a [`LakeReaderFactory`]; with `prefetch`, each scan also gets its prefetcher, sized by
    /// the session's `options` and reserving in `runtime`'s memory pool.
    pub(crate) fn rewrite(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
        runtime: &Arc<RuntimeEnv>,
        prefetch: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let scan = |config: &FileScanConfig, source: &ParquetSource, above: Above| {
            // Reader factories are not `Any`; DataFusion's own are recognised by type name,
            // and a scan with none (a table format's, built by hand) gets DataFusion's default
            // when it opens a file. Another product's factory, and encrypted scans (whose
            // readers need decryption properties the footer loads do not use), are left as
            // they are.
            let ours = source.parquet_file_reader_factory().is_none_or(|current| {
                let name = type_name(current.as_ref());
                name == "CachedParquetFileReaderFactory"
                    || name == "DefaultParquetFileReaderFactory"
            });
            if !ours || encrypted(source) {
                return Ok(None);
            }
            let reads = self.reads(runtime, &config.object_store_url)?;
            let reads = match above.by_log {
                true => reads.named_by_log(),
                false => reads,
            };
            let planning = Some(runtime.cache_manager.get_file_metadata_cache());
            let prefetcher = match prefetch {
                true => self.prefetcher(config, source, options, runtime, &reads, above),
                false => None,
            };
            let index = self.caches.index.clone();
            let factory = LakeReaderFactory::new(reads, index, planning, prefetcher);
            Ok(Some(Arc::new(factory) as Arc<dyn ParquetFileReaderFactory>))
        };
        map_parquet_scans(plan, Above::default(), &self.log_formats, &scan)
    }

    fn prefetcher(
        &self,
        config: &FileScanConfig,
        source: &ParquetSource,
        options: &ConfigOptions,
        runtime: &Arc<RuntimeEnv>,
        reads: &StoreReads,
        above: Above,
    ) -> Option<Prefetcher> {
        let settings = options
            .extensions
            .get::<LakeOptions>()
            .map_or(&self.settings.prefetch, |o| &o.settings.prefetch);
        if reads.reads_local_files() && !settings.local_files {
            return None;
        }
        let inputs = ScanInputs {
            reads: reads.clone(),
            index: self.caches.index.clone(),
            planning: Some(runtime.cache_manager.get_file_metadata_cache()),
            pool: Arc::clone(&runtime.memory_pool),
            counters: Arc::clone(&self.counters),
            settings: settings.clone(),
            metadata_size_hint: options.execution.parquet.metadata_size_hint,
        };
        let plan = ScanPlan::new(config, source, options).stopping_early(above.stops_early);
        Prefetcher::try_new(plan, inputs)
    }
}

/// Where a scan sits in its plan, as far as its reads are concerned.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Above {
    /// A table log names the scan's files (a table format's scan is above it).
    pub by_log: bool,
    /// The query may stop reading the scan early: a limit is above it with nothing between
    /// that reads all its input before it emits (a sort, an aggregate).
    pub stops_early: bool,
}

impl Above {
    /// What the children of `node` have above them; `log_formats` tell which nodes are a
    /// table format's scans whose files a log names.
    fn below(self, node: &dyn ExecutionPlan, log_formats: &[NamesFilesByLog]) -> Self {
        let stops_early = match node.properties().emission_type {
            // It reads every row of its input whatever is above it.
            EmissionType::Final => false,
            EmissionType::Incremental | EmissionType::Both => {
                self.stops_early || node.fetch().is_some()
            }
        };
        Self {
            by_log: self.by_log || log_formats.iter().any(|named| named(node)),
            stops_early,
        }
    }
}

/// What gives a Parquet scan its reader factory: its config, its source, and where it sits
/// (`Some` replaces the factory).
type ScanRewrite<'a> = dyn Fn(&FileScanConfig, &ParquetSource, Above) -> Result<Option<Arc<dyn ParquetFileReaderFactory>>>
    + 'a;

/// Rebuilds every Parquet scan of `plan` whose reader factory `f` replaces, leaving the rest
/// of the scan (projection, predicate, files) as it was. Below a table format's scan
/// (one of `log_formats`) the files are the log's; if that scan refuses its rebuilt
/// inputs (Delta's with deletion vectors checks that they are the ones it planned), it keeps
/// them, and its reads still go through the store wrapper's caches.
fn map_parquet_scans(
    plan: Arc<dyn ExecutionPlan>,
    above: Above,
    log_formats: &[NamesFilesByLog],
    f: &ScanRewrite<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some((config, source)) = plan
        .downcast_ref::<DataSourceExec>()
        .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
    {
        // Files the predicate rules out by their statistics never reach the opener (in scans
        // of many files; see `prune`).
        let mut config = config.clone();
        if let Some(groups) = without_pruned_files(&config, source) {
            config.file_groups = groups;
        }
        let Some(factory) = f(&config, source, above)? else {
            return Ok(plan);
        };
        let source = source.clone().with_parquet_file_reader_factory(factory);
        let config = FileScanConfigBuilder::from(config)
            .with_source(Arc::new(source))
            .build();
        return Ok(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>);
    }
    let below = above.below(plan.as_ref(), log_formats);
    let children = plan
        .children()
        .into_iter()
        .map(|child| map_parquet_scans(Arc::clone(child), below, log_formats, f))
        .collect::<Result<Vec<_>>>()?;
    if !above.by_log && below.by_log {
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        return match Arc::clone(&plan).replace_children(children, options) {
            Ok(rebuilt) => Ok(rebuilt),
            Err(e) => {
                log::debug!("{} keeps its own Parquet scans: {e}", plan.name());
                Ok(plan)
            }
        };
    }
    replace_children_if_necessary(plan, children)
}

/// Whether the scan reads encrypted Parquet.
fn encrypted(source: &ParquetSource) -> bool {
    let crypto = &source.table_parquet_options().crypto;
    crypto.file_decryption.is_some() || crypto.factory_id.is_some()
}

/// The name a value's `Debug` output starts with (its type, for derived `Debug`), read without
/// formatting the rest: a factory's `Debug` can print a whole cache.
fn type_name(value: &dyn std::fmt::Debug) -> String {
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
