//! [`ScanCaches`]: what a scan needs of a `LakeCache`, and how a Parquet scan of a plan is
//! given its [`LakeReaderFactory`] (and, in an installed session, its prefetcher).

use std::any::Any;
use std::cell::RefCell;
use std::collections::HashSet;
use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::internal_datafusion_err;
use datafusion::datasource::physical_plan::{FileScanConfig, FileScanConfigBuilder, ParquetSource};
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreUrl;
use datafusion::execution::runtime_env::RuntimeEnv;
use datafusion::physical_plan::execution_plan::EmissionType;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ReplaceChildrenOptions, replace_children_if_necessary,
};

use super::LakeReaderFactory;
use super::awaiting::{AwaitingPlan, address};
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
    /// Readers installed sessions' tables gave their scans, until the final plan.
    pub(crate) awaiting: AwaitingPlan,
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
    /// the session's `options` and reserving in `runtime`'s memory pool. A scan whose reader
    /// its table gave it ([`ScanCaches::awaiting_final_plan`]) keeps it, and the plan is left
    /// as it is unless files are pruned. A scan whose reader is already the crate's and not
    /// awaiting (a plan passed twice) is left as it is too.
    pub(crate) fn rewrite(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
        runtime: &Arc<RuntimeEnv>,
        prefetch: bool,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        // The readers this pass bound: a second scan sharing one gets its own.
        let bound = RefCell::new(HashSet::new());
        let scan = |config: &FileScanConfig, source: &ParquetSource, above: Above| {
            let given = source.parquet_file_reader_factory();
            let awaited = given.and_then(|f| self.awaiting.take(f));
            if let Some(factory) = &awaited {
                bound.borrow_mut().insert(address(factory));
                // Below a table format's scan the reads are named by its log: a new reader.
                if !above.by_log {
                    let prefetcher = match prefetch {
                        true => self.prefetcher(
                            config,
                            source,
                            options,
                            runtime,
                            factory.reads(),
                            above,
                        ),
                        false => None,
                    };
                    if let Some(prefetcher) = prefetcher {
                        let first = factory.bind_prefetcher(prefetcher);
                        debug_assert!(first, "a reader awaiting its plan has no prefetcher");
                    }
                    return Ok(Reader::Kept);
                }
            }
            let shared = given.is_some_and(|f| bound.borrow().contains(&address(f)));
            if awaited.is_none() && !shared && !self.replaces(source) {
                return Ok(Reader::Left);
            }
            let reads = self.reads(runtime, &config.object_store_url)?;
            let reads = match above.by_log {
                true => reads.named_by_log(),
                false => reads,
            };
            let prefetcher = match prefetch {
                true => self.prefetcher(config, source, options, runtime, &reads, above),
                false => None,
            };
            Ok(Reader::New(self.factory(runtime, reads, prefetcher)))
        };
        map_parquet_scans(plan, Above::default(), &self.log_formats, true, &scan)
    }

    /// Gives every Parquet scan of `plan`, planned by a table of an installed session, a
    /// [`LakeReaderFactory`] whose prefetcher the session's query planner binds once the
    /// final plan is known (see [`AwaitingPlan`]). Files are pruned then too.
    pub(crate) fn awaiting_final_plan(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        runtime: &Arc<RuntimeEnv>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let scan = |config: &FileScanConfig, source: &ParquetSource, _: Above| {
            if !self.replaces(source) {
                return Ok(Reader::Left);
            }
            let reads = self.reads(runtime, &config.object_store_url)?;
            let factory = self.factory(runtime, reads, None);
            self.awaiting.add(&factory);
            Ok(Reader::New(factory))
        };
        map_parquet_scans(plan, Above::default(), &self.log_formats, false, &scan)
    }

    /// Whether the scan's reader is one this crate replaces: DataFusion's own (recognised by
    /// type name, as reader factories are not `Any`) or none (a table format's scan, built by
    /// hand, gets DataFusion's default when it opens a file). Another product's factory, and
    /// encrypted scans (whose readers need decryption properties the footer loads do not
    /// use), are left as they are.
    fn replaces(&self, source: &ParquetSource) -> bool {
        let ours = source.parquet_file_reader_factory().is_none_or(|current| {
            let name = type_name(current.as_ref());
            name == "CachedParquetFileReaderFactory" || name == "DefaultParquetFileReaderFactory"
        });
        ours && !encrypted(source)
    }

    fn factory(
        &self,
        runtime: &RuntimeEnv,
        reads: StoreReads,
        prefetcher: Option<Prefetcher>,
    ) -> Arc<LakeReaderFactory> {
        let planning = Some(runtime.cache_manager.get_file_metadata_cache());
        let index = self.caches.index.clone();
        Arc::new(LakeReaderFactory::new(reads, index, planning, prefetcher))
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

/// What a scan's rewrite does with its reader.
pub(crate) enum Reader {
    /// Not the crate's to replace: the scan is left as it is.
    Left,
    /// The scan's reader stays (it is the crate's, now bound to this plan).
    Kept,
    /// The scan is given this reader.
    New(Arc<LakeReaderFactory>),
}

/// What gives a Parquet scan its reader: its config, its source, and where it sits.
type ScanRewrite<'a> = dyn Fn(&FileScanConfig, &ParquetSource, Above) -> Result<Reader> + 'a;

/// Rebuilds every Parquet scan of `plan` whose reader `f` replaces, or that keeps its reader
/// while, with `prune`, its predicate rules out some of its files; the rest of the scan
/// (projection, predicate, files) stays as it was. Nodes above scans left as they are are
/// left as they are too. Below a table
/// format's scan (one of `log_formats`) the files are the log's; if that scan refuses its
/// rebuilt inputs (Delta's with deletion vectors checks that they are the ones it planned),
/// it keeps them, and its reads still go through the store wrapper's caches.
fn map_parquet_scans(
    plan: Arc<dyn ExecutionPlan>,
    above: Above,
    log_formats: &[NamesFilesByLog],
    prune: bool,
    f: &ScanRewrite<'_>,
) -> Result<Arc<dyn ExecutionPlan>> {
    if let Some((config, source)) = plan
        .downcast_ref::<DataSourceExec>()
        .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
    {
        // Files the predicate rules out by their statistics never reach the opener (in scans
        // of many files; see `prune`).
        let pruned = match prune {
            true => without_pruned_files(config, source),
            false => None,
        };
        // A pruned scan's config is copied, every file with it: the pruning has just walked
        // every file's statistics, and in the final plan the scan is held by its parent.
        let pruned = pruned.map(|groups| {
            let mut config = config.clone();
            config.file_groups = groups;
            config
        });
        let source = match f(pruned.as_ref().unwrap_or(config), source, above)? {
            Reader::Left => return Ok(plan),
            Reader::Kept if pruned.is_none() => return Ok(plan),
            Reader::Kept => source.clone(),
            Reader::New(factory) => source
                .clone()
                .with_parquet_file_reader_factory(factory as _),
        };
        let config = match pruned {
            Some(config) => config,
            None => into_config(plan)?,
        };
        let config = FileScanConfigBuilder::from(config)
            .with_source(Arc::new(source))
            .build();
        return Ok(DataSourceExec::from_data_source(config) as Arc<dyn ExecutionPlan>);
    }
    let below = above.below(plan.as_ref(), log_formats);
    let children = plan
        .children()
        .into_iter()
        .map(|child| map_parquet_scans(Arc::clone(child), below, log_formats, prune, f))
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

/// The config of `scan` (a `DataSourceExec` over a `FileScanConfig`), moved out when nothing
/// else holds the scan, as when its table has just planned it; copied otherwise. A copy
/// copies every file of the scan: a cost per file on every plan of a large table.
fn into_config(scan: Arc<dyn ExecutionPlan>) -> Result<FileScanConfig> {
    let not_a_file_scan = || internal_datafusion_err!("a Parquet scan without a file scan config");
    let scan: Arc<dyn Any + Send + Sync> = scan;
    let exec = Arc::unwrap_or_clone(
        scan.downcast::<DataSourceExec>()
            .map_err(|_| not_a_file_scan())?,
    );
    let source: Arc<dyn DataSource> = Arc::clone(exec.data_source());
    let source: Arc<dyn Any + Send + Sync> = source;
    drop(exec);
    let config = source
        .downcast::<FileScanConfig>()
        .map_err(|_| not_a_file_scan())?;
    Ok(Arc::unwrap_or_clone(config))
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

#[cfg(test)]
mod tests {
    use datafusion::catalog::TableProvider;
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::union::UnionExec;
    use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};
    use datafusion::prelude::{ParquetReadOptions, SessionContext};
    use object_store::memory::InMemory;
    use object_store::path::Path;

    use super::*;
    use crate::LakeCache;
    use crate::testkit::lake::{LakeSpec, write_lake};

    /// An installed session over a lake of `files` files as table `t`, and its caches.
    async fn installed(files: usize) -> (LakeCache, SessionContext) {
        let lake = LakeCache::builder().build().unwrap();
        let store = Arc::new(InMemory::new());
        let spec = LakeSpec::small_files(files);
        write_lake(store.as_ref(), &Path::from("lake"), &spec)
            .await
            .unwrap();
        let state = lake
            .install(SessionStateBuilder::new().with_default_features())
            .unwrap()
            .build();
        let ctx = SessionContext::new_with_state(state);
        let url = url::Url::parse("memory://").unwrap();
        ctx.register_object_store(&url, store);
        ctx.register_parquet("t", "memory:///lake/", ParquetReadOptions::default())
            .await
            .unwrap();
        (lake, ctx)
    }

    /// DataFusion's physical plan of `sql`, before the installed session's query planner
    /// finishes it.
    async fn planned(ctx: &SessionContext, sql: &str) -> Arc<dyn ExecutionPlan> {
        let state = ctx.state();
        let logical = state.create_logical_plan(sql).await.unwrap();
        let logical = state.optimize(&logical).unwrap();
        DefaultPhysicalPlanner::default()
            .create_physical_plan(&logical, &state)
            .await
            .unwrap()
    }

    /// The readers (their addresses) and file counts of the plan's Parquet scans, in the
    /// plan's order.
    fn scans_of(plan: &Arc<dyn ExecutionPlan>) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        if let Some((config, source)) = plan
            .downcast_ref::<DataSourceExec>()
            .and_then(|exec| exec.downcast_to_file_source::<ParquetSource>())
        {
            let reader = address(source.parquet_file_reader_factory().unwrap());
            let files = config.file_groups.iter().map(|g| g.len()).sum();
            found.push((reader, files));
        }
        for child in plan.children() {
            found.extend(scans_of(child));
        }
        found
    }

    fn rows(batches: &[datafusion::arrow::record_batch::RecordBatch]) -> i64 {
        let column = batches[0].column(0);
        column
            .as_any()
            .downcast_ref::<datafusion::arrow::array::Int64Array>()
            .unwrap()
            .value(0)
    }

    /// The final plan of a query over an installed session's table: the scan's reader is the
    /// one its table gave it, and the query planner's pass binds its prefetcher and leaves
    /// every node as DataFusion built it (no property of the plan is computed again).
    #[tokio::test]
    async fn a_scan_given_its_reader_by_its_table_keeps_it_and_the_plan_is_left_as_it_is() {
        let (lake, ctx) = installed(2).await;
        let planned = planned(&ctx, "SELECT count(*) FROM t WHERE id >= 0").await;
        let state = ctx.state();
        let scans: &ScanCaches = lake.as_ref();
        let (options, runtime) = (state.config_options(), state.runtime_env());
        let finished = scans
            .rewrite(Arc::clone(&planned), options, runtime, true)
            .unwrap();
        assert!(
            Arc::ptr_eq(&finished, &planned),
            "the plan is left as it is"
        );

        let before = lake.stats().prefetch.scans;
        let batches = collect(Arc::clone(&finished), ctx.task_ctx())
            .await
            .unwrap();
        assert_eq!(rows(&batches), 10_000);
        assert_eq!(
            lake.stats().prefetch.scans,
            before + 1,
            "the scan ran with the prefetcher the final plan bound"
        );

        // A plan finished once is left as it is by a second pass: its reader is complete.
        let again = scans
            .rewrite(Arc::clone(&finished), options, runtime, true)
            .unwrap();
        assert!(Arc::ptr_eq(&again, &finished));
    }

    /// A scan whose predicate rules out some of its files is rebuilt without them, with the
    /// reader its table gave it, and the query answers as before.
    #[tokio::test]
    async fn a_scan_whose_files_are_pruned_keeps_its_reader() {
        // Ids are contiguous per file (5,000 each): `id < 10000` keeps 2 of the 8 files.
        let (lake, ctx) = installed(8).await;
        let planned = planned(&ctx, "SELECT count(*) FROM t WHERE id < 10000").await;
        let [(given, 8)] = scans_of(&planned)[..] else {
            panic!("one scan of 8 files: {:?}", scans_of(&planned).len());
        };
        let state = ctx.state();
        let scans: &ScanCaches = lake.as_ref();
        let finished = scans
            .rewrite(
                Arc::clone(&planned),
                state.config_options(),
                state.runtime_env(),
                true,
            )
            .unwrap();
        let [(kept, 2)] = scans_of(&finished)[..] else {
            panic!("the scan keeps 2 files");
        };
        assert_eq!(kept, given, "the table's reader is kept");

        let before = lake.stats().prefetch.scans;
        let batches = collect(finished, ctx.task_ctx()).await.unwrap();
        assert_eq!(rows(&batches), 10_000);
        assert_eq!(lake.stats().prefetch.scans, before + 1);
    }

    /// Two scans of one plan sharing the reader their table gave one of them: the first
    /// keeps it, the second gets one of its own (a reader's prefetcher sizes one scan).
    #[tokio::test]
    async fn a_second_scan_sharing_a_reader_gets_its_own() {
        let (lake, ctx) = installed(2).await;
        let scan = planned(&ctx, "SELECT id FROM t").await;
        let [(given, _)] = scans_of(&scan)[..] else {
            panic!("one scan");
        };
        let plan = UnionExec::try_new(vec![Arc::clone(&scan), scan]).unwrap();
        let state = ctx.state();
        let scans: &ScanCaches = lake.as_ref();
        let finished = scans
            .rewrite(plan, state.config_options(), state.runtime_env(), true)
            .unwrap();
        let readers: Vec<usize> = scans_of(&finished).iter().map(|s| s.0).collect();
        assert_eq!(readers.len(), 2);
        assert_eq!(readers[0], given, "the first scan keeps it");
        assert_ne!(readers[1], readers[0], "the second gets its own");

        let batches = collect(finished, ctx.task_ctx()).await.unwrap();
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(total, 20_000);
    }

    /// Where the first Parquet scan of `plan` keeps its files' paths: the same buffers after
    /// a rewrite if the files were moved, other buffers if they were copied.
    fn path_buffers(plan: &Arc<dyn ExecutionPlan>) -> Vec<*const u8> {
        let exec = plan.downcast_ref::<DataSourceExec>().expect("a scan");
        let (config, _) = exec.downcast_to_file_source::<ParquetSource>().unwrap();
        let files = config.file_groups.iter().flat_map(|g| g.iter());
        files
            .map(|f| f.object_meta.location.as_ref().as_ptr())
            .collect()
    }

    /// A table's scan, given its reader right after the table planned it, keeps its files
    /// where they are: a copy would cost a copy of every file on every plan. A scan held
    /// elsewhere as well is copied, and the copy held elsewhere is left as it was.
    #[tokio::test]
    async fn a_scan_its_table_just_planned_is_given_its_reader_without_copying_its_files() {
        let (lake, ctx) = installed(4).await;
        let table = ctx.table_provider("t").await.unwrap();
        let table = table.downcast_ref::<super::super::LakeTable>().unwrap();
        let state = ctx.state();
        let scans: &ScanCaches = lake.as_ref();
        let scan = || table.listing_table().scan(&state, None, &[], None);

        let planned = scan().await.unwrap();
        let [(datafusions, 4)] = scans_of(&planned)[..] else {
            panic!("one scan of 4 files");
        };
        let files = path_buffers(&planned);
        let given = scans
            .awaiting_final_plan(planned, state.runtime_env())
            .unwrap();
        let [(reader, 4)] = scans_of(&given)[..] else {
            panic!("one scan of 4 files");
        };
        assert_ne!(reader, datafusions, "the scan has the crate's reader");
        assert_eq!(path_buffers(&given), files, "its files were moved");

        let planned = scan().await.unwrap();
        let held = Arc::clone(&planned);
        let given = scans
            .awaiting_final_plan(planned, state.runtime_env())
            .unwrap();
        assert_ne!(path_buffers(&given), path_buffers(&held), "copied");
        assert_ne!(scans_of(&given)[0].0, scans_of(&held)[0].0);
        let batches = collect(held, ctx.task_ctx()).await.unwrap();
        let total: usize = batches.iter().map(|b| b.num_rows()).sum();
        assert_eq!(
            total, 20_000,
            "the scan held elsewhere still reads every file"
        );
    }
}
