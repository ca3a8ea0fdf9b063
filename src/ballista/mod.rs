//! The caches on a Ballista cluster (feature `ballista`): [`LakeBallista`] gives each process
//! of a cluster (client, scheduler, executor) what it needs to use one [`LakeCache`].
//!
//! - Each executor process keeps one `LakeCache`: its runtime producer hands every session
//!   the same runtime, whose object stores are wrapped in `CachingObjectStore`s (handle and
//!   range caching, an optional disk tier; one identity per store, so what a store has shown
//!   it can read holds for every session) and DataFusion's footer cache one of the process's
//!   own. Ballista makes a runtime per session (and a memory pool per task) from it, keeping
//!   both.
//! - A Parquet scan arrives at an executor as a protobuf plan, restricted to the task's file
//!   groups, and is decoded with DataFusion's own reader. The physical codec
//!   ([`codec::LakePhysicalCodec`]) gives it the lake reader and its prefetcher as it decodes,
//!   sized by the task's settings and reserving in the task's memory pool.
//! - `lakecache.*` settings travel from the client to each task only if every hop knows them:
//!   [`LakeBallista::config`] registers them, for the client, the scheduler and the executors.
//! - A [`LakeTable`](crate::LakeTable) registered on the client crosses to the scheduler as
//!   the `ListingTable` it wraps ([`codec::LakeLogicalCodec`]).
//!
//! ```no_run
//! # async fn run() -> datafusion::error::Result<()> {
//! use std::sync::Arc;
//! use ballista_executor::executor_process::{ExecutorProcessConfig, start_executor_process};
//! use datafusion::execution::object_store::DefaultObjectStoreRegistry;
//! use datafusion_lakecache::LakeCache;
//! use datafusion_lakecache::ballista::LakeBallista;
//!
//! let lake = LakeCache::builder().range_disk("/var/cache/lakecache", 100 << 30).build()?;
//! let stores = Arc::new(DefaultObjectStoreRegistry::new());
//! let setup = LakeBallista::new(lake, stores)?;
//! let config = setup.executor(ExecutorProcessConfig::default());
//! start_executor_process(Arc::new(config))
//!     .await
//!     .map_err(|e| datafusion::error::DataFusionError::External(Box::new(e)))?;
//! # Ok(())
//! # }
//! ```

pub mod affinity;
pub mod codec;
#[cfg(feature = "delta")]
pub mod delta;
pub mod figures;
mod groups;

use std::sync::Arc;

use ballista_core::extension::{
    SessionConfigExt, ballista_aggregate_functions, ballista_scalar_functions,
    ballista_window_functions,
};
use ballista_core::serde::BallistaCodec;
use ballista_core::{ConfigProducer, RuntimeProducer};
use ballista_executor::executor_process::ExecutorProcessConfig;
use datafusion::error::Result;
use datafusion::execution::object_store::ObjectStoreRegistry;
use datafusion::execution::runtime_env::{RuntimeEnv, RuntimeEnvBuilder};
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::prelude::SessionConfig;

use crate::config::LakeOptions;
use crate::lake::LakeCache;
use crate::sql::LakeObjectStoreRegistry;
use crate::store::Caches;
pub use affinity::{AffinityPolicy, PlacementStats};
use codec::{LakeLogicalCodec, LakePhysicalCodec};
use figures::{ClusterMetricsFunction, ProcessFigures};

/// What builds a scheduler's session state from the settings a client sent (Ballista's
/// `SessionBuilder`).
pub type SessionBuilder = Arc<dyn Fn(SessionConfig) -> Result<SessionState> + Send + Sync>;

/// One [`LakeCache`] set up for the Ballista processes of one machine; see the module docs.
/// Cheap to clone: clones share the cache and the runtime.
#[derive(Debug, Clone)]
pub struct LakeBallista {
    lake: LakeCache,
    /// Every store the process hands out, wrapped once.
    registry: Arc<LakeObjectStoreRegistry>,
    runtime: Arc<RuntimeEnv>,
    figures: Arc<ProcessFigures>,
}

impl LakeBallista {
    /// The set-up of `lake` over the object stores of `stores` (the registry a process would
    /// use without the caches: where its S3 credentials come from). Every store it hands out
    /// is wrapped once, so what a store has shown it can read holds for every session.
    pub fn new(lake: LakeCache, stores: Arc<dyn ObjectStoreRegistry>) -> Result<Self> {
        let caches = AsRef::<Caches>::as_ref(&lake);
        let registry = Arc::new(LakeObjectStoreRegistry::new(stores, caches));
        let runtime = runtime_over(&registry, &lake)?;
        let figures = Arc::new(ProcessFigures::new(lake.clone()));
        Ok(Self {
            lake,
            registry,
            runtime,
            figures,
        })
    }

    /// The cache this set-up uses: its figures are this process's.
    pub fn lake(&self) -> &LakeCache {
        &self.lake
    }

    /// The runtime every session of this process gets: the caching store registry and
    /// DataFusion's own footer and statistics caches (`LakeCache::cache_manager_config`).
    pub fn runtime(&self) -> Arc<RuntimeEnv> {
        Arc::clone(&self.runtime)
    }

    /// Ballista's session configuration with the `lakecache.*` settings registered (at the
    /// values this `LakeCache` was built with) and the codecs below. File-stream work
    /// stealing is off, as Ballista asks: a task's partitions are its own.
    ///
    /// The same for the client (`SessionContext::remote_with_state`), the scheduler and the
    /// executors: a `lakecache.*` key a hop does not know is dropped there.
    pub fn config(&self) -> SessionConfig {
        let options = LakeOptions::new(self.lake.settings().clone());
        ballista_config()
            .with_option_extension(options)
            .with_ballista_logical_extension_codec(self.logical_codec())
            .with_ballista_physical_extension_codec(self.physical_codec())
    }

    /// [`LakeBallista::config`] as Ballista's `ConfigProducer`.
    pub fn config_producer(&self) -> ConfigProducer {
        let this = self.clone();
        Arc::new(move || this.config())
    }

    /// Hands every session this process's runtime (Ballista's `RuntimeProducer`), so every
    /// session of an executor shares its caches.
    pub fn runtime_producer(&self) -> RuntimeProducer {
        let runtime = self.runtime();
        Arc::new(move |_| Ok(Arc::clone(&runtime)))
    }

    /// The scheduler's sessions: Ballista's defaults, each over a runtime of its own (as
    /// Ballista makes one per session) with this process's wrapped stores, so the listings
    /// and footers the scheduler reads to plan are cached too. DataFusion's footer and
    /// statistics caches, keyed by path (and table name) alone, are each session's: a client's
    /// table `t` never plans with another client's statistics of a file at the same path.
    pub fn session_builder(&self) -> SessionBuilder {
        let (registry, lake) = (Arc::clone(&self.registry), self.lake.clone());
        session_builder(move || runtime_over(&registry, &lake))
    }

    /// Ballista's logical codec, which also carries [`LakeTable`](crate::LakeTable)s and
    /// [`lakecache_cluster_metrics()`](figures).
    pub fn logical_codec(&self) -> Arc<LakeLogicalCodec> {
        Arc::new(LakeLogicalCodec::new(&self.lake).with_figures_of(self))
    }

    /// Ballista's physical codec, which gives every Parquet scan it decodes the caches'
    /// reader and a prefetcher.
    pub fn physical_codec(&self) -> Arc<LakePhysicalCodec> {
        Arc::new(LakePhysicalCodec::new(&self.lake).with_figures_of(self))
    }

    /// `lakecache_cluster_metrics()`, for a client session on the cluster: every process's
    /// figures in one query ([`figures`] says how they travel).
    ///
    /// ```no_run
    /// # async fn run(setup: datafusion_lakecache::ballista::LakeBallista,
    /// #     ctx: datafusion::prelude::SessionContext) -> datafusion::error::Result<()> {
    /// use datafusion_lakecache::ballista::figures::FUNCTION;
    /// ctx.register_udtf(FUNCTION, setup.cluster_metrics());
    /// ctx.sql("SELECT process, value FROM lakecache_cluster_metrics() \
    ///          WHERE cache = 'range.memory' AND metric = 'hits'")
    ///     .await?
    ///     .show()
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn cluster_metrics(&self) -> Arc<ClusterMetricsFunction> {
        Arc::new(ClusterMetricsFunction::new(Arc::clone(&self.figures)))
    }

    /// Names this process as the executor `name` in `lakecache_cluster_metrics()`:
    /// [`LakeBallista::executor`] does it with the executor's id. An executor's rows are
    /// given only by the executor they name.
    pub fn name_executor(&self, name: &str) {
        self.figures.set_name(name);
    }

    /// Tells the scheduler's set-up the policy it places tasks with: its figures join the
    /// scheduler's in `lakecache_cluster_metrics()`, and the executors it counts alive are
    /// the ones asked for theirs.
    pub fn report_placement(&self, policy: &Arc<AffinityPolicy>) {
        self.figures.set_placement(policy);
    }

    /// Both codecs, as a scheduler or an executor started by hand takes them.
    pub fn codec(&self) -> BallistaCodec {
        BallistaCodec::new(self.logical_codec(), self.physical_codec())
    }

    /// `config` with this set-up's runtime producer, config producer and codecs: what
    /// `start_executor_process` needs to run an executor with the caches.
    pub fn executor(&self, mut config: ExecutorProcessConfig) -> ExecutorProcessConfig {
        self.name_executor(&config.executor_id);
        config.override_runtime_producer = Some(self.runtime_producer());
        config.override_config_producer = Some(self.config_producer());
        config.override_logical_codec = Some(self.logical_codec());
        config.override_physical_codec = Some(self.physical_codec());
        config
    }

    /// `config` with this set-up's session builder, config producer and codecs: what a
    /// scheduler needs to keep the `lakecache.*` settings and plan with cached listings.
    pub fn scheduler(
        &self,
        config: ballista_scheduler::config::SchedulerConfig,
    ) -> ballista_scheduler::config::SchedulerConfig {
        let mut config = config
            .with_override_config_producer(self.config_producer())
            .with_override_session_builder(self.session_builder());
        config.override_logical_codec = Some(self.logical_codec());
        config.override_physical_codec = Some(self.physical_codec());
        config
    }
}

/// A runtime over `registry` with DataFusion's caches as `lake` configures them for a
/// runtime of one's own.
fn runtime_over(
    registry: &Arc<LakeObjectStoreRegistry>,
    lake: &LakeCache,
) -> Result<Arc<RuntimeEnv>> {
    RuntimeEnvBuilder::new()
        .with_object_store_registry(Arc::clone(registry) as Arc<dyn ObjectStoreRegistry>)
        .with_cache_manager(lake.cache_manager_config())
        .build_arc()
}

/// Ballista's default scheduler sessions, each over the runtime `runtime` makes for it.
pub(crate) fn session_builder(
    runtime: impl Fn() -> Result<Arc<RuntimeEnv>> + Send + Sync + 'static,
) -> SessionBuilder {
    Arc::new(move |config| {
        Ok(SessionStateBuilder::new()
            .with_default_features()
            .with_config(config)
            .with_runtime_env(runtime()?)
            .with_optimizer_rules(ballista_core::optimizer::ballista_default_optimizer_rules())
            .with_scalar_functions(ballista_scalar_functions())
            .with_aggregate_functions(ballista_aggregate_functions())
            .with_window_functions(ballista_window_functions())
            .build())
    })
}

/// Ballista's session configuration as a cluster should run it: file-stream work stealing
/// off (Ballista's docs ask for it; a task's partitions are its own).
pub(crate) fn ballista_config() -> SessionConfig {
    let mut config = SessionConfig::new_with_ballista();
    config
        .options_mut()
        .execution
        .enable_file_stream_work_stealing = false;
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::execution::object_store::DefaultObjectStoreRegistry;

    #[test]
    fn each_scheduler_session_has_datafusions_path_keyed_caches_of_its_own() {
        // DataFusion keys its footer and statistics caches by path (and table name) alone:
        // shared by every client's session, one client's table `t` would plan with another's
        // statistics of a file at the same path. Each session gets its own, as in plain
        // Ballista, over the process's one set of wrapped stores.
        let lake = LakeCache::builder().build().unwrap();
        let setup = LakeBallista::new(lake, Arc::new(DefaultObjectStoreRegistry::new())).unwrap();
        let sessions = setup.session_builder();
        let (a, b) = (
            sessions(setup.config()).unwrap(),
            sessions(setup.config()).unwrap(),
        );
        let (a, b) = (a.runtime_env(), b.runtime_env());
        let footers = |r: &Arc<RuntimeEnv>| r.cache_manager.get_file_metadata_cache();
        assert!(!Arc::ptr_eq(&footers(a), &footers(b)));
        let statistics = |r: &Arc<RuntimeEnv>| r.cache_manager.get_file_statistic_cache().unwrap();
        assert!(!Arc::ptr_eq(&statistics(a), &statistics(b)));
        assert!(Arc::ptr_eq(
            &a.object_store_registry,
            &b.object_store_registry
        ));
    }
}
